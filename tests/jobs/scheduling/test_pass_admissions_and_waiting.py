"""What a scheduling pass writes for the jobs it admits and the jobs that wait, and that it reads every change.

An admitted job gets one attempt named after it and one ADMITTED event; a waiting job gets one ``waiting``
event, its reason and its positions (shown by the API), not one event per pass; a pass sees every change made
to the queue since the last one, though it caches the rows of waiting jobs.
"""

from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.lifecycle import end_attempt, recover_or_fail
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending, try_admit
from quotas.models import Team
from tests.support.factories import fresh, run
from tests.support.states import state_events

S = JobState
D = Decimal

pytestmark = pytest.mark.django_db


def test_a_waiting_job_gets_one_waiting_event_not_one_per_pass(cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    queue_job(alpha, 8)
    waiting = queue_job(alpha, 8)
    for _ in range(3):
        schedule_pending()
    assert fresh(waiting).state == S.QUEUED
    assert JobEvent.objects.filter(job=waiting, kind="waiting").count() == 1


def test_a_burst_of_waiting_jobs_gets_one_event_each_and_a_job_that_changed_meanwhile_none(
        cluster_factory, quota_factory, h100, queue_job):
    """Waiting events are written in bulk, but only for jobs still in the state the pass read (compare and set)."""
    from jobs.scheduling.core import FairShareScheduler
    from jobs.scheduling.passes import run_pass
    from jobs.scheduling.snapshot import load_snapshot

    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    teams = [Team.objects.create(slug=f"t{i}", name=f"T{i}", queueing_strategy="StrictFIFO") for i in range(12)]
    heads = []
    for team in teams:
        quota_factory(team, h100, nominal=1)
        queue_job(team, 1)  # admitted: the team's quota is then full
        heads.append(queue_job(team, 1))  # waits for quota, at the head of its team's queue
        queue_job(team, 1)  # waits behind it (StrictFIFO: reason "priority", no event)
    now = timezone.now()
    loaded = load_snapshot(now)
    decisions = FairShareScheduler(loaded.snapshot).full_pass()
    cancelled = heads[7]
    Job.objects.filter(pk=cancelled.pk).update(state=S.CANCELLED)  # cancelled between the read and the write

    run_pass(loaded, decisions, now)

    for job in heads:
        events = JobEvent.objects.filter(job=job, kind="waiting")
        if job == cancelled:
            assert not events.exists() and fresh(job).queue_info == {}
        else:
            assert events.count() == 1 and fresh(job).queue_info["reason"] == "quota"
            assert (events.get().from_state, events.get().to_state) == (S.QUEUED, S.QUEUED)
    assert JobEvent.objects.filter(kind="waiting").count() == len(heads) - 1


def test_a_pass_sees_every_change_to_the_queue_since_the_last_one(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    """Passes re-read only rows whose version changed: a new job, a changed priority, a job gone, all seen."""
    cluster_factory("big", "aws", "us-east-1", h100, nodes=1, price="6.88")  # room for one 8-GPU job
    quota_factory(alpha, h100, nominal=16)
    running = queue_job(alpha, 8)
    first, second = queue_job(alpha, 8), queue_job(alpha, 8)
    schedule_pending()  # admits `running`; caches the two waiting rows
    assert fresh(running).state == S.ADMITTED
    gone, urgent = queue_job(alpha, 8, priority=900), queue_job(alpha, 8)
    Job.objects.filter(pk=gone.pk).update(state=S.CANCELLED)  # left the queue behind the cache's back
    Job.objects.filter(pk=urgent.pk).update(priority=1000)  # changed behind the cache's back
    Job.objects.filter(pk=second.pk).update(priority=950)
    job, attempt = run(running)
    end_attempt(job, attempt, S.SUCCEEDED, reason="done", end_reason="succeeded")

    schedule_pending()

    assert fresh(urgent).state == S.ADMITTED  # highest priority now, though cached at the default one
    assert fresh(gone).state == S.CANCELLED and not fresh(gone).attempts.exists()
    assert fresh(second).queue_info["position"]["team"] == 1  # 950 before first's 500
    assert fresh(first).queue_info["position"]["team"] == 2


def test_a_priority_change_and_a_cancel_between_passes_are_seen(cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("one", "aws", "us-east-1", h100, nodes=1, price="4.00")  # room for one 8-GPU job
    quota_factory(alpha, h100, nominal=64)
    blocker = queue_job(alpha, 8)
    schedule_pending()
    run(blocker)
    first, second, third = queue_job(alpha, 8), queue_job(alpha, 8), queue_job(alpha, 8)
    schedule_pending()  # all three cached as waiting
    Job.objects.filter(pk=third.pk).update(priority=900)
    Job.objects.filter(pk=first.pk).update(state=S.CANCELLED)
    JobAttempt.objects.filter(job=blocker).update(ended_at=timezone.now())
    Job.objects.filter(pk=blocker.pk).update(state=S.SUCCEEDED)
    result = schedule_pending()
    assert result.admitted == [third.pk]
    assert fresh(first).state == S.CANCELLED and fresh(second).state == S.QUEUED


def test_an_admitted_job_has_one_attempt_named_after_it_and_an_admitted_event(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster, pool = cluster_factory("mid", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=16)
    job = queue_job(alpha, 8, nodes=2)

    schedule_pending()

    job = fresh(job)
    assert job.state == S.ADMITTED and job.admitted_at is not None
    attempts = list(job.attempts.all())
    assert len(attempts) == 1
    attempt = attempts[0]
    assert attempt.number == 1
    assert attempt.object_name == f"job-{job.pk}-1-{attempt.uid.hex[:8]}"
    assert attempt.gpus == 16
    assert (attempt.cluster_id, attempt.node_pool_id) == (cluster.pk, pool.pk)
    assert attempt.started_at is None and attempt.ended_at is None
    assert job.current_attempt_id == attempt.pk
    events = list(JobEvent.objects.filter(job=job, kind="state"))
    assert [(e.from_state, e.to_state, e.attempt_id) for e in events] == [("QUEUED", "ADMITTED", attempt.pk)]
    # 16 GPUs x 1 h x 6.88
    assert job.estimated_cost_usd == D(16) * D("6.88")


def test_admission_clears_the_queue_reason(cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("mid", "aws", "us-east-1", h100, nodes=1, price="6.88")
    quota_factory(alpha, h100, nominal=16)
    first = queue_job(alpha, 8)
    second = queue_job(alpha, 8)
    schedule_pending()
    assert fresh(second).queue_info["reason"] == "capacity"
    job, attempt = run(first)
    end_attempt(job, attempt, S.SUCCEEDED, reason="done", end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
    schedule_pending()
    second = fresh(second)
    assert second.state == S.ADMITTED and second.queue_info == {}


def test_a_recovering_job_is_admitted_again_with_a_second_attempt(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("mid", "aws", "us-east-1", h100, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    job = queue_job(alpha, 8, max_retries=1)
    schedule_pending()
    job, attempt = run(job)
    recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.PREEMPTED)
    assert fresh(job).state == S.RECOVERING

    schedule_pending()

    job = fresh(job)
    assert job.state == S.ADMITTED
    assert [a.object_name for a in job.attempts.order_by("number")] == [
        f"job-{job.pk}-{a.number}-{a.uid.hex[:8]}" for a in job.attempts.order_by("number")]
    assert [a.number for a in job.attempts.order_by("number")] == [1, 2]
    assert job.current_attempt.number == 2 and job.current_attempt.ended_at is None
    assert JobAttempt.objects.get(job=job, number=1).ended_at is not None
    assert state_events(job) == [("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "RUNNING"),
                                 ("RUNNING", "RECOVERING"), ("RECOVERING", "ADMITTED")]


def test_try_admit_keeps_its_contract(cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    a, b = queue_job(alpha, 8), queue_job(alpha, 8)
    assert try_admit(a.pk) == "admitted"
    assert try_admit(a.pk) == "skipped"
    assert try_admit(b.pk) == "waiting"
    assert try_admit(queue_job(alpha, 16, nodes=2).pk) == "rejected"


def test_the_api_shows_why_a_job_waits_and_its_positions(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job, teammate):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    quota_factory(beta, h100, nominal=8)
    Team.objects.filter(pk=alpha.pk).update(queueing_strategy="StrictFIFO")  # a2 keeps its place behind a1
    owner = teammate  # a member of alpha reads the queue
    running = queue_job(alpha, 8)
    a1, b1, a2 = queue_job(alpha, 8), queue_job(beta, 8), queue_job(alpha, 4)
    schedule_pending()
    assert fresh(running).state == S.ADMITTED
    body = owner.client.get(f"/api/v1/jobs/{a2.pk}/").json()
    # a1 waits on alpha's quota (8 of 8 used); a2 waits behind it; beta's b1 waits for capacity (the pool is full)
    assert body["queue_info"]["reason"] == "priority" and body["queue_info"]["behind_job_id"] == a1.pk
    assert body["position"] == {"team": 2, "overall": 3}
    first = owner.client.get(f"/api/v1/jobs/{a1.pk}/").json()
    assert first["queue_info"]["reason"] == "quota" and first["position"] == {"team": 1, "overall": 1}
    assert (first["queue_info"]["used_gpus"], first["queue_info"]["nominal_gpus"]) == (8, 8)
    assert fresh(b1).queue_info["reason"] == "capacity" and fresh(b1).queue_info["position"] == {"team": 1, "overall": 2}
    assert owner.client.get(f"/api/v1/jobs/{running.pk}/").json()["position"] is None
