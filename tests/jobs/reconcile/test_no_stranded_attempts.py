"""No attempt is stranded: reconcile looks at ADMITTED attempts too; objects found are adopted and billed from
their creation; an attempt without objects past ``DISPATCH_DEADLINE_SECONDS`` is dispatched again once, then
released (quota and committed money back at once) and placed on another cluster, with an event saying why.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.lifecycle import cancel_job, dispatch, finish_cancel
from jobs.models import Job, JobAttempt, JobState, committed_usd
from jobs.scheduling.passes import try_admit
from jobs.scheduling.snapshot import team_used_gpus
from runners.base import TransientDispatchError, backend_for
from tests.support.clusters import ledger_gpu_seconds, load, state
from tests.support.kubernetes import Fault

S = JobState


def past_deadline(attempt: JobAttempt, settings) -> None:
    """Move the attempt's admission (and any re-dispatch) back beyond the dispatch deadline."""
    back = timezone.now() - dt.timedelta(seconds=settings.DISPATCH_DEADLINE_SECONDS + 1)
    row = JobAttempt.objects.get(pk=attempt.pk)
    state_ = dict(row.runner_state or {})
    if "redispatched_at" in state_:
        state_["redispatched_at"] = back.isoformat()
    JobAttempt.objects.filter(pk=attempt.pk).update(created_at=back, runner_state=state_)


def test_an_admitted_job_on_a_cluster_that_went_down_is_released_and_placed_elsewhere(live_clusters, settings):
    world = live_clusters
    attempt = world.admit(cluster=None, nodes=1, gpus=8)
    assert attempt.cluster.name == "gcp-usc1"  # the cheaper
    team, acc = attempt.job.team_id, attempt.job.accelerator_id
    assert team_used_gpus(team, acc) == 8 and committed_usd(team) > 0
    world.emulators["gcp-usc1"].stop()
    with pytest.raises(TransientDispatchError):
        dispatch(attempt.pk)

    world.reconcile("gcp-usc1")
    assert state(attempt) == S.ADMITTED  # within the deadline: the dispatch task's own retries may still land

    past_deadline(attempt, settings)
    world.reconcile("gcp-usc1")

    ended = load(attempt.pk)
    assert state(attempt) == S.RECOVERING and ended.end_reason == "NotDispatched"
    assert team_used_gpus(team, acc) == 0 and committed_usd(team) == 0  # quota and committed money back at once
    event = Job.objects.get(pk=attempt.job_id).events.filter(to_state=S.RECOVERING).get()
    assert "not dispatched within 300 s on gcp-usc1" in event.reason and "does not answer" in event.reason
    assert ended.started_at is None and ledger_gpu_seconds(attempt.pk) == 0  # never created objects: $0
    assert try_admit(attempt.job_id) == "admitted"
    second = load(Job.objects.get(pk=attempt.job_id).current_attempt_id)
    assert second.cluster.name == "aws-use1" and second.number == 2
    assert dispatch(second.pk) == "dispatched"
    world.emulators["gcp-usc1"].start()
    assert dispatch(attempt.pk) == "skipped"  # a late retry of the first dispatch creates nothing
    assert world.emulators["gcp-usc1"].objects("Job") == []


def test_a_cluster_refusing_every_create_gets_one_redispatch_then_the_job_moves(live_clusters, settings):
    world = live_clusters
    attempt = world.admit(cluster=None, nodes=1, gpus=8)
    gcp = world.emulators["gcp-usc1"]
    gcp.inject(Fault(503, method="POST", path="/jobs", count=None))
    with pytest.raises(TransientDispatchError):
        dispatch(attempt.pk)

    past_deadline(attempt, settings)
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.ADMITTED
    retry = Job.objects.get(pk=attempt.job_id).events.filter(kind="dispatch_retry").get()
    assert "dispatching again" in retry.reason

    past_deadline(attempt, settings)
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RECOVERING and load(attempt.pk).end_reason == "NotDispatched"
    assert try_admit(attempt.job_id) == "admitted"
    assert load(Job.objects.get(pk=attempt.job_id).current_attempt_id).cluster.name == "aws-use1"


def test_objects_created_by_a_dispatch_that_never_finished_are_adopted_and_billed_from_creation(live_clusters):
    """The backend created the objects but the dispatch died before recording it (its worker was killed)."""
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", nodes=2, gpus=2)
    backend_for(attempt.cluster).dispatch(attempt)  # objects exist, the job is still ADMITTED
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.ADMITTED  # just admitted: a dispatch in flight records its own objects
    JobAttempt.objects.filter(pk=attempt.pk).update(created_at=timezone.now() - dt.timedelta(seconds=11))
    (job_object,) = gcp.objects("Job", attempt.pk)
    created = dt.datetime.fromisoformat(job_object["metadata"]["creationTimestamp"].replace("Z", "+00:00"))

    world.reconcile("gcp-usc1")

    assert state(attempt) == S.RUNNING
    adopted = load(attempt.pk)
    assert adopted.started_at == created
    events = Job.objects.get(pk=attempt.job_id).events.filter(to_state=S.STARTING).get()
    assert "adopted" in events.reason
    for pod in gcp.pods(attempt.pk):
        gcp.finish_pod(pod["metadata"]["name"], 0)
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.SUCCEEDED
    assert abs(ledger_gpu_seconds(attempt.pk) - Decimal(str(gcp.pod_gpu_seconds(attempt.pk)))) < Decimal("0.01")


@pytest.mark.django_db(transaction=True)
def test_a_dispatch_that_loses_the_race_to_a_cancel_bills_its_objects_until_they_are_deleted(live_clusters):
    """The Job create is in flight while the job is cancelled: the objects land after the cancel. They are
    billed from their creation until reconcile deletes them as orphans, not $0."""
    import threading
    import time

    from django.db import connection

    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", nodes=1, gpus=4)
    gcp = world.emulators["gcp-usc1"]
    release = gcp.hold("POST", "/jobs")
    outcome = []
    worker = threading.Thread(target=lambda: (outcome.append(dispatch(attempt.pk)), connection.close()))
    worker.start()
    deadline = time.monotonic() + 10
    while gcp.held == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gcp.held == 1
    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert finish_cancel(attempt.job_id) is True  # nothing to delete yet: CANCELLED at once
    release.set()
    worker.join(10)
    assert outcome == ["raced"] and len(gcp.pods(attempt.pk)) == 1  # created after the cancel, running
    time.sleep(0.2)

    result = world.reconcile("gcp-usc1")

    assert result["orphans_deleted"] == 1 and gcp.pods(attempt.pk) == [] and state(attempt) == S.CANCELLED
    billed, ran = ledger_gpu_seconds(attempt.pk), Decimal(str(gcp.pod_gpu_seconds(attempt.pk)))
    assert ran > Decimal("0.8") and abs(billed - ran) < Decimal("0.1"), (billed, ran)


def test_a_preempted_attempt_is_billed_until_its_pods_are_deleted(live_clusters):
    import time

    from jobs.lifecycle import delete_ended_attempt, preempt_attempt

    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", nodes=2, gpus=2)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    preempt_attempt(Job.objects.get(pk=attempt.job_id), load(attempt.pk), reason="preempted for a test")
    time.sleep(0.3)  # the pods keep running until the deletion reaches the cluster

    assert delete_ended_attempt(attempt.pk) is True

    gcp = world.emulators["gcp-usc1"]
    billed, ran = ledger_gpu_seconds(attempt.pk), Decimal(str(gcp.pod_gpu_seconds(attempt.pk)))
    assert gcp.pods(attempt.pk) == [] and ran > Decimal("1.2")
    assert abs(billed - ran) < Decimal("0.05"), (billed, ran)
