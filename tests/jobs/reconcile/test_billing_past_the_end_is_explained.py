"""A job billed after the instant it was asked to end, or after its recorded end, says so on its timeline.

Class of failure: billing past a job's end without a word. The ledger bills an attempt on the cluster's evidence
(docs/adr/0021): pods that run out a termination grace after a cancel, or that a cluster which could not be asked
still ran, are billed until the last instant the cluster showed them holding their GPUs, later than the job's
end. The figures were right, but nothing on the job's page said why the bill ran past the cancel. Invariant: every
move of an attempt's end writes one ``billed_past_end`` event (old end, new end, seconds, evidence) in the same
transaction; a cancel billed past its request says until when on its CANCELLED line; a repeated delivery that moves
nothing writes nothing.

On ``live_clusters`` (``tests/support/clusters.py``) with the control plane's clock frozen by ``time_machine``.
Expected times are the scenario's own instants.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
import time_machine

from jobs import tasks as job_tasks
from jobs.lifecycle import cancel_job
from jobs.models import Job, JobEvent, JobState
from jobs.reconcile import reconcile_cluster
from tests.support.clusters import load
from tests.support.kubernetes import Fault

START = dt.datetime(2026, 3, 9, 4, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)


@pytest.fixture
def clock():
    """The control plane's (and the emulated cluster's) wall clock, frozen at ``START``."""
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def moves(attempt) -> list[JobEvent]:
    return list(JobEvent.objects.filter(attempt_id=attempt.pk, kind="billed_past_end").order_by("id"))


def test_a_cancel_billed_through_its_termination_grace_says_until_when(clock, live_clusters):
    """Cancelled after an hour; its pods run out a 30 s grace, seen by looks at 10 and 20 s; the cancel finishes at
    40 s. The attempt is billed to 20 s, and the CANCELLED line says so: 20 s after the cancel was requested."""
    attempt = live_clusters.running("gcp-usc1", gpus=2, max_runtime=86400)
    emulator = live_clusters.emulator(attempt)
    emulator.termination_grace = 30.0
    clock.shift(3600)
    asked = START + dt.timedelta(hours=1)
    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert job_tasks.cancel_job_objects(attempt.job_id) is False
    for second in (10, 20, 30, 40):
        clock.move_to(asked + second * S)
        emulator.step(now=time.time())
        reconcile_cluster(attempt.cluster)
    assert Job.objects.get(pk=attempt.job_id).state == JobState.CANCELLED
    assert load(attempt.pk).ended_at == asked + 20 * S
    (line,) = JobEvent.objects.filter(job_id=attempt.job_id, to_state=JobState.CANCELLED)
    assert "billed until 2026-03-09 05:00:20 UTC, 20 s after the cancel was requested" in line.reason


def test_a_cancel_that_ends_at_its_request_adds_nothing(clock, live_clusters):
    """Pods that stop at once (no grace): the attempt ends at the cancel and the CANCELLED line has no billing
    words."""
    attempt = live_clusters.running("gcp-usc1", gpus=1, max_runtime=86400)
    clock.shift(600)
    cancel_job(Job.objects.get(pk=attempt.job_id))
    job_tasks.cancel_job_objects(attempt.job_id)
    clock.shift(10)
    reconcile_cluster(attempt.cluster)
    job_tasks.cancel_job_objects(attempt.job_id)
    assert Job.objects.get(pk=attempt.job_id).state == JobState.CANCELLED
    (line,) = JobEvent.objects.filter(job_id=attempt.job_id, to_state=JobState.CANCELLED)
    assert "billed until" not in line.reason
    assert moves(attempt) == []


def test_pods_an_unreachable_cluster_still_ran_move_the_end_once_per_look_with_an_event(clock, live_clusters):
    """Cancelled while its cluster answers nothing: the attempt ends at the cluster's last contact with deletion
    pending. The cluster answers again 5 minutes later with the pods still running: reconcile deletes them and
    bills to that look, writing one ``billed_past_end`` event from the old end to the look; the same look
    delivered again moves nothing and writes nothing."""
    attempt = live_clusters.running("gcp-usc1", gpus=2, max_runtime=86400)
    emulator = live_clusters.emulator(attempt)
    emulator.termination_grace = 30.0
    clock.shift(600)
    reconcile_cluster(attempt.cluster)  # the last contact: START + 600 s
    contact = START + 600 * S
    emulator.inject(Fault(503, count=None))
    clock.shift(60)
    cancel_job(Job.objects.get(pk=attempt.job_id))
    job_tasks.cancel_job_objects(attempt.job_id)
    first = load(attempt.pk)
    assert Job.objects.get(pk=first.job_id).state == JobState.CANCELLED
    assert first.ended_at == contact
    emulator.faults.clear()

    clock.shift(300)
    look = START + 960 * S
    emulator.step(now=time.time())
    reconcile_cluster(attempt.cluster)
    assert load(attempt.pk).ended_at == look
    (event,) = moves(attempt)
    assert event.data == {"from": contact.isoformat(), "to": look.isoformat(), "seconds": 360.0}
    assert "360 s past its recorded end" in event.reason

    reconcile_cluster(attempt.cluster)  # the same instant again: the end stays, nothing is written
    assert load(attempt.pk).ended_at == look
    assert len(moves(attempt)) == 1


def test_the_simulators_invariant_sees_a_move_without_its_event(clock, live_clusters):
    """``billed_past_end_explained`` (the simulator's) holds after the scenario above and fails once the event
    is gone: it can fail."""
    from tests.support.simulation.invariants import billed_past_end_explained

    attempt = live_clusters.running("gcp-usc1", gpus=1, max_runtime=86400)
    emulator = live_clusters.emulator(attempt)
    clock.shift(600)
    reconcile_cluster(attempt.cluster)
    emulator.inject(Fault(503, count=None))
    clock.shift(60)
    cancel_job(Job.objects.get(pk=attempt.job_id))
    job_tasks.cancel_job_objects(attempt.job_id)
    emulator.faults.clear()
    clock.shift(300)
    reconcile_cluster(attempt.cluster)
    assert billed_past_end_explained(None) == []
    JobEvent.objects.filter(attempt_id=attempt.pk, kind="billed_past_end").delete()
    violations = billed_past_end_explained(None)
    assert any(f"attempt {attempt.pk} " in v and "no billed_past_end" in v for v in violations), violations
