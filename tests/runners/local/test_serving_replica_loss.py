"""A serving replica of the demo's model that dies under load is replaced in its booked slot while the other one
serves: no failed request, a new process ready again, the attempt still RUNNING and billed at the same GPUs once;
a replica that keeps dying uses up the job's retry budget and ends the attempt as before."""

from __future__ import annotations

import signal
import subprocess

from django.utils import timezone

from costs.ledger import accrue_attempt
from costs.models import CostEntry
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.reconcile import reconcile_cluster
from runners.local.layout import read_json
from runners.local.runner import attempt_dir
from tests.support.local_runner import wait_until

from . import test_autoscaled_serving as serving
from .test_autoscaled_serving import Load, endpoint_metric

checkpoint = serving.checkpoint  # the fixtures of the demo's model served on the local runner
serving_job = serving.serving_job


def child_pid(attempt: JobAttempt, node: int) -> int:
    """The pid of the server process of pod ``node`` once its supervisor started it."""
    record = wait_until(lambda: read_json(attempt_dir(attempt) / f"node-{node}.pid"), 30, f"pod {node} to start")
    return record["child"]["pid"]


def kill(pid: int) -> None:
    subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(pid)], check=True)


def replaced(attempt: JobAttempt, count: int) -> bool:
    """Reconcile the attempt's cluster once; whether the attempt has ``count`` ``replica_replaced`` events."""
    reconcile_cluster(attempt.cluster)
    return JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_replaced").count() >= count


def test_a_replica_killed_under_load_is_replaced_with_no_failed_request_and_the_attempt_runs_on(serving_job):
    attempt = serving_job(2, max_retries=1)
    endpoint = attempt.runner_state["endpoint"]
    old_addresses = list(attempt.runner_state["replicas"])
    killed = child_pid(attempt, 1)

    load = Load(endpoint, clients=3)
    wait_until(lambda: len(load.answers) >= 10, 30, "answers under load")
    kill(killed)
    wait_until(lambda: replaced(attempt, 1), 30, "the lost replica to be replaced")
    wait_until(lambda: endpoint_metric(attempt, "controlplane_endpoint_ready_replicas") == 2, 90,
               "2 ready replicas again")
    after = len(load.answers)
    wait_until(lambda: len(load.answers) >= after + 30, 60, "answers after the replacement")
    load.stop()

    assert load.errors == [] and {status for status, _ in load.answers} == {200}
    assert endpoint_metric(attempt, "controlplane_endpoint_failed_requests_total") == 0
    # a new process on a new port serves in the lost one's place, and gets requests
    meta = read_json(attempt_dir(attempt) / "attempt.json")
    assert meta["nodes"] == 3 and meta["retired"] == [1]
    assert child_pid(attempt, 2) != killed
    state = JobAttempt.objects.get(pk=attempt.pk).runner_state
    new = [a for a in state["replicas"] if a not in old_addresses]
    assert state["replicas"][0] == old_addresses[0] and len(new) == 1 and len(state["replicas"]) == 2
    assert new[0] in {replica for _, replica in load.answers[after:]}

    job = Job.objects.get(pk=attempt.job_id)
    rattempt = JobAttempt.objects.get(pk=attempt.pk)
    assert job.state == JobState.RUNNING and rattempt.ended_at is None and job.current_attempt_id == attempt.pk
    event = JobEvent.objects.get(attempt_id=attempt.pk, kind="replica_replaced")
    assert event.data["replica"] == "1" and event.data["end_reason"] == "OOMKilled"  # what SIGKILL is read as
    assert event.data["used"] == 1 and event.data["max_retries"] == 1

    # the same booked slot: nothing admitted or released, billed at 2 GPUs without a gap or an overlap
    assert rattempt.gpus == 2 and rattempt.placement == attempt.placement
    assert not JobEvent.objects.filter(job_id=job.pk, kind="scale").exists()
    now = timezone.now()
    accrue_attempt(attempt.pk, now)
    entries = list(CostEntry.objects.filter(attempt_id=attempt.pk).order_by("interval_start"))
    assert entries and {e.gpus for e in entries} == {2}
    assert all(a.interval_end == b.interval_start for a, b in zip(entries, entries[1:], strict=False))
    assert entries[0].interval_start == rattempt.started_at


def test_a_replica_that_keeps_dying_uses_up_the_budget_and_ends_the_attempt(serving_job):
    attempt = serving_job(2, max_retries=1)
    kill(child_pid(attempt, 1))
    wait_until(lambda: replaced(attempt, 1), 30, "the first loss to be replaced")
    kill(child_pid(attempt, 2))  # the replacement dies too: 1 replacement in the window is all max_retries gives

    def ended():
        reconcile_cluster(attempt.cluster)
        return JobAttempt.objects.get(pk=attempt.pk).ended_at is not None
    wait_until(ended, 30, "the attempt to end")

    rattempt = JobAttempt.objects.get(pk=attempt.pk)
    assert rattempt.end_reason == "OOMKilled" and "1 replica replacement(s) in the last 600 s used" in rattempt.message
    assert JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_replaced").count() == 1
    # the end of the attempt follows the rule of a serving attempt that failed: a new attempt while retries allow
    job = Job.objects.get(pk=attempt.job_id)
    assert job.state == JobState.RECOVERING
    assert JobEvent.objects.filter(job=job, kind="state", to_state=JobState.RECOVERING,
                                   reason__contains="retry 1 of 1").exists()
