"""The end record an attempt leaves on its cluster says the end the attempt was billed to, however late that end
was learned.

Class of failure: an end recorded on the cluster before the pods' real stop. The end record (a ConfigMap written
before the first DELETE of an attempt's objects, ADR 0011) took the end known then (a cancel's instant); the pods
ran out their termination grace and the attempt's end moved to their stop on the cluster's evidence (ADR 0021),
but the record kept the earlier end, so a database restored from a backup ended the attempt there and billed less
than its pods held. Invariant: the record's end follows the attempt's end, only forward, and a repeated or late
delivery of the update writes nothing.

On ``live_clusters`` (``tests/support/clusters.py``) with the control plane's clock frozen by ``time_machine``;
the emulated API server answers a PUT whose ``resourceVersion`` is stale with 409 Conflict, as Kubernetes does.
Expected ends are the scenario's own times.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
import time_machine

from jobs import tasks as job_tasks
from jobs.lifecycle import cancel_job
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from runners.kubernetes.client import ApiError, client_for
from runners.kubernetes.manifests import END_RECORD_LABEL
from runners.kubernetes.runner import KubernetesBackend
from tests.support.clusters import load
from tests.support.kubernetes import Fault

START = dt.datetime(2026, 3, 9, 4, 0, tzinfo=dt.UTC)
GRACE = 30.0
S = dt.timedelta(seconds=1)


@pytest.fixture
def clock():
    """The control plane's (and the emulated cluster's) wall clock, frozen at ``START``."""
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def record(emulator, attempt) -> dict:
    """The end record of ``attempt`` on ``emulator`` (the one ConfigMap of its uid)."""
    (found,) = [o for o in emulator.objects("ConfigMap")
                if o["metadata"]["labels"].get(END_RECORD_LABEL) == str(attempt.uid)]
    return found


def recorded_end(emulator, attempt) -> dt.datetime:
    return dt.datetime.fromisoformat(record(emulator, attempt)["data"]["ended_at"])


def cancel_after_an_hour(clock, world) -> tuple[JobAttempt, object, dt.datetime]:
    """A 2-GPU attempt running an hour, cancelled: its DELETE accepted, its pods Terminating for ``GRACE`` seconds.
    Returns the attempt, its emulator and the cancel's instant."""
    attempt = world.running("gcp-usc1", gpus=2, max_runtime=86400)
    emulator = world.emulator(attempt)
    emulator.termination_grace = GRACE
    clock.shift(3600)
    cancelled = START + dt.timedelta(hours=1)
    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert job_tasks.cancel_job_objects(attempt.job_id) is False  # the DELETE accepted, the pods Terminating
    assert recorded_end(emulator, attempt) == cancelled  # written before the DELETE, with the end known then
    return attempt, emulator, cancelled


def cancelled_after_its_grace(clock, world) -> tuple[JobAttempt, object, dt.datetime]:
    """``cancel_after_an_hour``, then reconcile looking every 10 s until the cancel finished once the pods were
    gone. Returns the attempt (loaded), its emulator and the cancel's instant."""
    attempt, emulator, cancelled = cancel_after_an_hour(clock, world)
    for second in (10, 20, 30, 40):
        clock.move_to(cancelled + second * S)
        emulator.step(now=time.time())
        reconcile_cluster(attempt.cluster)
    assert Job.objects.get(pk=attempt.job_id).state == JobState.CANCELLED
    return load(attempt.pk), emulator, cancelled


def test_the_end_record_follows_an_end_that_moved_past_the_record_and_a_restore_reads_it(clock, live_clusters):
    """The cancel's end moved past the record's (looks saw the pods run out their grace before the cancel finished,
    the last at 20 s); the update task moves the record to it; the recovery after a restore (``Backend.inventory``) reads that end; the
    task delivered again, and late, writes nothing (the record's resourceVersion stays)."""
    attempt, emulator, cancelled = cancelled_after_its_grace(clock, live_clusters)
    ended = attempt.ended_at
    assert ended == cancelled + 20 * S  # the last look that saw its pods hold their GPUs: the end moved there
    assert recorded_end(emulator, attempt) == cancelled

    assert job_tasks.record_attempt_end(attempt.pk) is True
    assert recorded_end(emulator, attempt) == ended
    (found,) = [i for i in KubernetesBackend().inventory(attempt.cluster) if i["uid"] == str(attempt.uid)]
    assert found["observation"].ended_at == ended  # what a restored database ends and bills the attempt at

    version = record(emulator, attempt)["metadata"]["resourceVersion"]
    assert job_tasks.record_attempt_end(attempt.pk) is False  # delivered again
    clock.shift(600)
    assert job_tasks.record_attempt_end(attempt.pk) is False  # and late
    assert record(emulator, attempt)["metadata"]["resourceVersion"] == version
    assert recorded_end(emulator, attempt) == ended


def test_a_recorded_end_never_moves_back(clock, live_clusters):
    """An attempt row whose end is earlier than its record's (a database restored from an older backup that
    learned an end of its own) leaves the record as it is."""
    attempt, emulator, cancelled = cancelled_after_its_grace(clock, live_clusters)
    assert job_tasks.record_attempt_end(attempt.pk) is True
    later = recorded_end(emulator, attempt)
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=cancelled + S)
    assert job_tasks.record_attempt_end(attempt.pk) is False
    assert recorded_end(emulator, attempt) == later


def test_a_record_changed_between_its_read_and_its_write_is_read_again(clock, live_clusters):
    """The update is a compare-and-set on the record's resourceVersion: a writer in between (here a 409 Conflict
    on the first PUT) makes it read the record again and write on the version it read."""
    attempt, emulator, _ = cancelled_after_its_grace(clock, live_clusters)
    conflict = emulator.inject(Fault(409, "PUT", "/configmaps/", count=1))
    assert job_tasks.record_attempt_end(attempt.pk) is True
    assert conflict.count == 0
    assert recorded_end(emulator, attempt) == attempt.ended_at


def test_the_emulated_api_server_refuses_a_put_on_a_stale_resource_version(live_clusters):
    """As the API server: a PUT carrying the resourceVersion read answers 200 and gives a new version; one carrying
    an older version answers 409 Conflict and changes nothing; a PUT without one replaces unconditionally."""
    emulator = live_clusters.emulators["gcp-usc1"]
    cluster = live_clusters.clusters["gcp-usc1"]
    c = client_for(cluster)
    path = "/api/v1/namespaces/default/configmaps"
    emulator.handle("POST", "/api/v1/namespaces", {"metadata": {"name": "default"}})
    c.create(path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"a": "1"}})
    read = json.loads(c.replace(f"{path}/m", {**emulator.objects("ConfigMap")[-1], "data": {"a": "2"}}))
    stale = {**read, "metadata": {**read["metadata"], "resourceVersion": str(int(read["metadata"]["resourceVersion"]) - 1)},
             "data": {"a": "3"}}
    with pytest.raises(ApiError) as refused:
        c.replace(f"{path}/m", stale)
    assert refused.value.status == 409
    (kept,) = [o for o in emulator.objects("ConfigMap") if o["metadata"]["name"] == "m"]
    assert kept["data"] == {"a": "2"} and kept["metadata"]["uid"] == read["metadata"]["uid"]
    c.replace(f"{path}/m", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"a": "4"}})
    (kept,) = [o for o in emulator.objects("ConfigMap") if o["metadata"]["name"] == "m"]
    assert kept["data"] == {"a": "4"} and kept["metadata"]["uid"] == read["metadata"]["uid"]


def test_a_cancel_finished_after_an_outage_ends_at_the_evidence_not_when_it_finished(clock, live_clusters):
    """Class: an end set when a task ran. A cancel's DELETE is accepted while its pods run out a 30 s grace; the
    control plane is then down ten minutes, and the pass after it finds them gone: the attempt ends at the last
    look that saw them hold their GPUs (the cancel's own look), never at that pass, and its record says the same."""
    attempt, emulator, cancelled = cancel_after_an_hour(clock, live_clusters)
    clock.move_to(cancelled + 600 * S)
    emulator.step(now=time.time())  # the pods went at their grace's deadline, with nobody looking
    reconcile_cluster(attempt.cluster)
    assert Job.objects.get(pk=attempt.job_id).state == JobState.CANCELLED
    assert load(attempt.pk).ended_at == cancelled
    job_tasks.record_attempt_end(attempt.pk)
    assert recorded_end(emulator, attempt) == cancelled


def test_a_record_left_behind_while_its_cluster_did_not_answer_catches_up_at_the_next_sweep(clock, live_clusters):
    """Class: an end record left behind its attempt's end because the cluster did not answer through every retry
    of the update. Every PUT fails (503) while the update runs out of tries; once the cluster answers, the next
    sweep of its end records (``expire_end_records``, once per ``END_RECORD_SWEEP_SECONDS``) moves the record to
    the attempt's end, a restore reads that end, and a sweep after it moves nothing more."""
    from django.conf import settings

    from jobs import reconcile
    from jobs.lifecycle import record_end
    from runners.base import TransientDispatchError

    attempt, emulator, cancelled = cancelled_after_its_grace(clock, live_clusters)
    assert attempt.ended_at == cancelled + 20 * S
    down = emulator.inject(Fault(503, "PUT", "/configmaps/", count=100))
    with pytest.raises(TransientDispatchError):
        record_end(attempt.pk)  # one delivery; Celery's retries end the same way while the cluster fails
    assert recorded_end(emulator, attempt) == cancelled  # left behind

    reconcile.LAST_SWEEP.clear()
    reconcile.expire_end_records()  # still failing: nothing moves, and the cluster is swept again next time
    assert recorded_end(emulator, attempt) == cancelled and attempt.cluster_id not in reconcile.LAST_SWEEP
    down.count = 0  # the cluster answers again
    assert reconcile.expire_end_records() == 0  # nothing is old enough to delete
    assert recorded_end(emulator, attempt) == attempt.ended_at
    (found,) = [i for i in KubernetesBackend().inventory(attempt.cluster) if i["uid"] == str(attempt.uid)]
    assert found["observation"].ended_at == attempt.ended_at

    version = record(emulator, attempt)["metadata"]["resourceVersion"]
    clock.shift(settings.END_RECORD_SWEEP_SECONDS + 1)
    reconcile.LAST_SWEEP.clear()
    reconcile.expire_end_records()
    assert record(emulator, attempt)["metadata"]["resourceVersion"] == version  # at its end: nothing to move
