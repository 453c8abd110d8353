"""An attempt's end is set once: no second (or late) delivery of a task moves it; billing follows pods that run on
past the end (a termination grace) only by the cluster's evidence, the same evidence giving the same end.

Class of failure: an end moved by a repeated delivery (after a preemption the delete task was delivered twice while
the objects were still terminating, and the second DELETE moved the end to its own time: 43 s billed twice over).
Invariant: once an attempt ended, its end moves only to a time the cluster reported (its owner's deletion accepted,
a look that saw its pods hold their GPUs, their containers' own finish), and every task that can touch an ended
attempt, delivered again and late, leaves its end and its ledger as they were.

On ``live_clusters`` (``tests/support/clusters.py``) with the control plane's clock frozen by ``time_machine``;
the emulated cluster keeps deleted pods Terminating for their grace (``ClusterEmulator.termination_grace``), their
``deletionTimestamp`` the grace's deadline as the API server sets it. Expected ends are the scenario's own times.
"""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal

import pytest
import time_machine

from costs import tasks as cost_tasks
from costs.models import CostEntry
from jobs import tasks as job_tasks
from jobs.lifecycle import preempt_attempt
from jobs.models import Job, JobAttempt
from jobs.reconcile import reconcile_cluster
from tests.support.clusters import load

START = dt.datetime(2026, 3, 9, 4, 0, tzinfo=dt.UTC)
GRACE = 60.0
S = dt.timedelta(seconds=1)

#: Every task that can touch an ended attempt, as a delivery of it (its body, called as a worker would).
TASKS = {
    "delete_attempt_objects": lambda a: job_tasks.delete_attempt_objects(a.pk),
    "dispatch_attempt": lambda a: job_tasks.dispatch_attempt(a.pk),
    "cancel_job_objects": lambda a: job_tasks.cancel_job_objects(a.job_id),
    "reconcile": lambda a: reconcile_cluster(a.cluster),
    "accrue_attempt": lambda a: cost_tasks.accrue_attempt_task(a.pk),
    "accrue_running_costs": lambda a: cost_tasks.accrue_running_costs(),
}


@pytest.fixture
def clock():
    """The control plane's (and the emulated cluster's) wall clock, frozen at ``START``; ``clock.shift`` moves it."""
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def end(attempt) -> dt.datetime:
    return JobAttempt.objects.get(pk=attempt.pk).ended_at


def ledger(attempt) -> tuple:
    """The attempt's ledger entries (interval, milli-GPUs, USD) and its job's accrued cost."""
    rows = tuple(CostEntry.objects.filter(attempt_id=attempt.pk).order_by("interval_start")
                 .values_list("interval_start", "interval_end", "gpu_milli", "amount_usd"))
    return rows, Job.objects.get(pk=attempt.job_id).accrued_cost_usd


@pytest.mark.parametrize("exits_after", [3, None], ids=["stops-on-sigterm", "runs-out-its-grace"])
def test_no_delivery_moves_an_ended_attempts_end_and_billing_follows_the_pods_by_the_clusters_evidence(
        clock, live_clusters, exits_after):
    """A 2-GPU attempt runs an hour and is preempted (its end: then). The delete task's DELETE is accepted 2 s
    later; its pods, Terminating, either stop 3 s after the preemption (their containers' finishedAt) or run out
    their 60 s grace. The delete task is delivered again at 30 s and 45 s, reconcile looks at 20 s and 40 s.
    The end is the pods' own stop (3 s) or the last look that saw them hold their GPUs (40 s); then every task
    that can touch the attempt, delivered again ten minutes late, changes neither the end nor the ledger."""
    world = live_clusters
    attempt = world.running("gcp-usc1", preemptible=True, gpus=2, max_runtime=86400)
    emulator = world.emulator(attempt)
    emulator.termination_grace = GRACE
    clock.shift(3600)
    preempted = START + dt.timedelta(hours=1)
    preempt_attempt(Job.objects.get(pk=attempt.job_id), attempt, reason="preempted for a job within its quota")
    assert end(attempt) == preempted

    clock.shift(2)
    assert job_tasks.delete_attempt_objects(attempt.pk) is False  # accepted; the pods are Terminating
    assert end(attempt) == preempted + 2 * S  # they ran until their owner's deletion was accepted
    (pod,) = emulator.pods(attempt.pk)
    if exits_after is not None:
        clock.shift(exits_after - 2)
        emulator.finish_pod(pod["metadata"]["name"], 143, now=time.time())  # SIGTERM handled: they stop early

    for second in (20, 30, 40, 45):
        clock.move_to(preempted + second * S)
        before = end(attempt)
        if second in (20, 40):
            reconcile_cluster(attempt.cluster)  # a look: the cluster's evidence of the pods' state now
        else:
            job_tasks.delete_attempt_objects(attempt.pk)  # delivered again while the objects are terminating
            assert end(attempt) == before, f"the delete task delivered again at {second} s moved the end"
    expected = preempted + (exits_after * S if exits_after is not None else 40 * S)
    assert end(attempt) == expected

    clock.move_to(preempted + (GRACE + 2) * S)
    emulator.step(now=time.time())  # the grace is over: the pods and their owner are gone
    assert not emulator.pods(attempt.pk)
    for deliver in TASKS.values():  # every task once more, after the pods stopped
        deliver(load(attempt.pk))
    assert end(attempt) == expected
    settled = ledger(attempt)
    billed = sum((Decimal(g) / 1000 * Decimal((hi - lo).total_seconds()) for lo, hi, g, _ in settled[0]), Decimal(0))
    assert billed == 2 * Decimal((expected - START).total_seconds())

    clock.shift(600)
    for name, deliver in TASKS.items():  # and again, ten minutes late
        deliver(load(attempt.pk))
        assert (end(attempt), ledger(attempt)) == (expected, settled), f"{name} delivered late changed the attempt"
