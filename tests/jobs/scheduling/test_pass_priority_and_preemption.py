"""Priority and preemption in the scheduling pass against the database: higher priority first, submission order
among equals; a team within its nominal quota preempts borrowed work (the newest first) and the victim waits
without looping; preemptions do not use up a job's retries, losses do."""

import pytest

from jobs.lifecycle import preempt_attempt, recover_or_fail
from jobs.models import JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.scheduling.snapshot import team_used_gpus
from quotas.models import Team
from tests.support.factories import fresh, run

S = JobState
pytestmark = pytest.mark.django_db


# --- preemption through the pass ---------------------------------------------------------------

def test_a_team_within_nominal_preempts_the_newest_borrowing_job_and_the_victim_waits(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job, django_capture_on_commit_callbacks):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="4.20")  # 16 GPUs
    quota_factory(alpha, h100, nominal=8, borrowing=8)
    quota_factory(beta, h100, nominal=8)
    first, second = queue_job(alpha, 8, preemptible=True), queue_job(alpha, 8, preemptible=True)
    assert schedule_pending().admitted == [first.pk, second.pk]  # the second borrows beta's idle 8
    run(first), run(second)
    wanted = queue_job(beta, 8)

    with django_capture_on_commit_callbacks() as callbacks:
        result = schedule_pending()

    assert result.admitted == [wanted.pk]
    victim = fresh(second)
    assert victim.state == S.RECOVERING
    ended = JobAttempt.objects.get(job=victim)
    assert ended.end_reason == JobAttempt.EndReason.PREEMPTED and ended.ended_at is not None
    assert fresh(first).state == S.RUNNING
    assert (team_used_gpus(alpha.pk, h100.pk), team_used_gpus(beta.pk, h100.pk)) == (8, 8)
    admitted_event = JobEvent.objects.get(job=wanted, to_state=S.ADMITTED)
    assert admitted_event.data["preempted_job_ids"] == [second.pk]
    assert len(callbacks) >= 2  # the victim's object deletion and the preemptor's dispatch, after commit

    # no loop: the victim waits behind beta's job, which runs within its nominal and is never preempted
    for _ in range(3):
        assert schedule_pending().admitted == []
    victim = fresh(second)
    assert victim.state == S.RECOVERING and victim.queue_info["reason"] == "quota"
    assert fresh(wanted).state == S.ADMITTED


def test_a_borrowing_team_waits_without_preempting(cluster_factory, quota_factory, h100, alpha, beta, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=8, borrowing=8)
    quota_factory(beta, h100, nominal=4, borrowing=8)
    quota_factory(Team.objects.create(slug="gamma", name="Gamma"), h100, nominal=4)
    hog = queue_job(alpha, 8, nodes=2, preemptible=True)
    schedule_pending()
    run(hog)
    job = queue_job(beta, 8)  # 8 > beta's nominal 4: it would borrow, so it may not preempt
    assert schedule_pending().admitted == []
    assert fresh(hog).state == S.RUNNING and fresh(job).state == S.QUEUED


# --- priority ------------------------------------------------------------------------------------------------------

def test_a_high_priority_job_submitted_later_is_admitted_first_when_only_one_fits(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    normal = queue_job(alpha, 8, priority=500)
    high = queue_job(alpha, 8, priority=1000)
    assert normal.created_at < high.created_at
    result = schedule_pending()
    assert result.admitted == [high.pk]
    assert fresh(high).state == S.ADMITTED and fresh(normal).state == S.QUEUED


def test_equal_priority_goes_in_submission_order(cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    jobs = [queue_job(alpha, 8) for _ in range(3)]
    assert schedule_pending().admitted == [jobs[0].pk]


def test_preemptions_do_not_use_up_retries_but_losses_do(cluster_factory, quota_factory, h100, alpha, queue_job):

    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    job = queue_job(alpha, 4, max_retries=1)

    schedule_pending()
    job, attempt = run(job)
    preempt_attempt(job, attempt, reason="preempted for a team within its nominal quota")
    schedule_pending()
    job, attempt = run(job)
    assert attempt.number == 2
    recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.NODE_LOST)
    assert fresh(job).state == S.RECOVERING  # the preemption did not count: one retry was left

    schedule_pending()
    job, attempt = run(job)
    assert attempt.number == 3
    recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.NODE_LOST)
    assert fresh(job).state == S.FAILED  # the one retry went to the loss of attempt 2


def test_reclaim_within_nominal_takes_a_lenders_last_borrowed_job_even_below_its_nominal(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job):
    # a 12-GPU pool (2 nodes x 6); alpha, beta, gamma nominal 4 each, alpha may borrow 8 and runs two preemptible
    # 6-GPU jobs; beta then gamma ask 4 each. Each job of alpha is taken while alpha holds more than its nominal
    # (12, then 6), so both go and alpha ends at 0; gamma does not wait with 2 GPUs idle.
    gamma = Team.objects.create(slug="gamma", name="Gamma")
    cluster_factory("twelve", "aws", "us-east-1", h100, nodes=2, gpus_per_node=6, price="4.20")
    quota_factory(alpha, h100, nominal=4, borrowing=8)
    quota_factory(beta, h100, nominal=4)
    quota_factory(gamma, h100, nominal=4)
    first, second = queue_job(alpha, 6, preemptible=True), queue_job(alpha, 6, preemptible=True)
    assert schedule_pending().admitted == [first.pk, second.pk]
    run(first), run(second)
    b, c = queue_job(beta, 4), queue_job(gamma, 4)
    result = schedule_pending()
    assert sorted(result.admitted) == sorted([b.pk, c.pk])
    assert (fresh(first).state, fresh(second).state) == (S.RECOVERING, S.RECOVERING)
    assert [team_used_gpus(t.pk, h100.pk) for t in (alpha, beta, gamma)] == [0, 4, 4]
