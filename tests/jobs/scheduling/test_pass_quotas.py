"""Quotas in the scheduling pass against the database: nominal plus borrowing, per-job caps, per-cluster quotas
(checked again under the lock when the pass commits), quotas lowered below use, and jobs that can never fit
rejected even behind a job that waits.

Prices are cluster overrides picked here (USD per GPU-hour).
"""

import threading

import pytest
from django.utils import timezone

from jobs.lifecycle import recover_or_fail
from jobs.models import JobAttempt, JobState
from jobs.scheduling.passes import schedule_pending
from quotas.models import Quota
from tests.support.factories import fresh, run
from tests.support.states import state_events

S = JobState

pytestmark = pytest.mark.django_db


def live_attempt(job):
    return JobAttempt.objects.get(job=job, ended_at__isnull=True)


def test_it_admits_within_nominal_plus_borrowing_and_queues_the_rest_with_the_numbers(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, gpus_per_node=8, price="6.88")  # 32 GPUs
    quota_factory(alpha, h100, nominal=8, borrowing=4)  # limit 12
    quota_factory(beta, h100, nominal=8)  # idle: the cohort lends alpha the 4 it borrows
    a = queue_job(alpha, 8)
    b = queue_job(alpha, 4)
    c = queue_job(alpha, 1)

    result = schedule_pending()

    assert result.admitted == [a.pk, b.pk] and result.waiting == 1
    assert fresh(a).state == S.ADMITTED and fresh(b).state == S.ADMITTED
    c = fresh(c)
    assert c.state == S.QUEUED
    info = c.queue_info
    assert info["reason"] == "quota"
    assert (info["request_gpus"], info["used_gpus"], info["nominal_gpus"], info["borrowing_limit_gpus"]) == (1, 12, 8, 4)
    assert not c.attempts.exists()


def test_a_per_cluster_quota_caps_the_team_there_and_the_rest_goes_elsewhere(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cheap, _ = cluster_factory("cheap", "aws", "us-east-1", h100, nodes=2, price="4.00")
    dear, _ = cluster_factory("dear", "gcp", "us-central1", h100, nodes=2, price="6.00")
    quota_factory(alpha, h100, nominal=64)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=cheap, nominal_gpus=8)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=dear, nominal_gpus=4, borrowing_limit_gpus=4)
    a, b, c = queue_job(alpha, 8), queue_job(alpha, 8), queue_job(alpha, 8)

    schedule_pending()

    assert live_attempt(a).cluster == cheap and live_attempt(b).cluster == dear
    c = fresh(c)
    assert c.state == S.QUEUED and c.queue_info["reason"] == "quota"
    assert "cheap" in c.queue_info["message"] and "dear" in c.queue_info["message"]


def test_the_locked_recheck_refuses_a_placement_a_new_per_cluster_quota_forbids(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    """The pass decided on a snapshot; a per-cluster quota created meanwhile is enforced when it commits."""
    from jobs.scheduling.core import FairShareScheduler
    from jobs.scheduling.passes import run_pass
    from jobs.scheduling.snapshot import load_snapshot

    cheap, _ = cluster_factory("cheap", "aws", "us-east-1", h100, nodes=2, price="4.00")
    quota_factory(alpha, h100, nominal=16)
    job = queue_job(alpha, 8)
    now = timezone.now()
    loaded = load_snapshot(now)
    decisions = FairShareScheduler(loaded.snapshot).full_pass()
    assert len(decisions.admissions) == 1
    Quota.objects.create(team=alpha, accelerator=h100, cluster=cheap, nominal_gpus=4)

    result = run_pass(loaded, decisions, now)

    assert result.admitted == [] and fresh(job).state == S.QUEUED
    assert fresh(job).queue_info["reason"] == "quota" and not job.attempts.exists()


def test_a_team_without_quota_for_the_accelerator_is_rejected(
        cluster_factory, quota_factory, catalog, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, price="6.88")
    quota_factory(alpha, catalog["A100-80GB"], nominal=64)  # quota, but for another accelerator
    job = queue_job(alpha, 1)
    result = schedule_pending()
    assert result.rejected == 1
    assert fresh(job).state == S.REJECTED
    assert state_events(job) == [("QUEUED", "REJECTED")]
    assert not job.attempts.exists()


def test_a_job_over_the_per_job_cap_is_rejected_and_one_at_the_cap_admitted(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=32, max_per_job=8)
    over = queue_job(alpha, 8, nodes=2)  # 16 GPUs
    at_cap = queue_job(alpha, 8)
    schedule_pending()
    assert fresh(over).state == S.REJECTED
    assert fresh(at_cap).state == S.ADMITTED


def test_a_job_over_the_per_job_cap_is_rejected_even_while_a_smaller_job_waits_for_quota(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8, max_per_job=4)
    first, second = queue_job(alpha, 4), queue_job(alpha, 4)  # 8 of 8 in use
    small = queue_job(alpha, 2)  # fits the cap, waits for quota
    over_cap = queue_job(alpha, 8)  # within the team's limit of 8 but over the cap of 4: can never run
    result = schedule_pending()
    assert result.admitted == [first.pk, second.pk]
    assert fresh(small).state == S.QUEUED and fresh(small).queue_info["reason"] == "quota"
    assert fresh(over_cap).state == S.REJECTED


def test_a_job_over_the_team_limit_is_rejected_even_while_a_smaller_job_waits_for_quota(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8, borrowing=4)
    first = queue_job(alpha, 8)
    small = queue_job(alpha, 8)  # 8 + 8 > 12: waits
    over_limit = queue_job(alpha, 8, nodes=2)  # 16 > 12: can never run
    schedule_pending()
    assert fresh(first).state == S.ADMITTED
    assert fresh(small).state == S.QUEUED
    assert fresh(over_limit).state == S.REJECTED


def test_a_quota_lowered_below_use_leaves_running_jobs_alone_but_stops_new_admissions(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota = quota_factory(alpha, h100, nominal=8, borrowing=4)
    quota_factory(beta, h100, nominal=8)  # idle: the cohort lends alpha the 4 it borrows
    a = queue_job(alpha, 8)
    b = queue_job(alpha, 4)
    schedule_pending()
    run(a)
    Quota.objects.filter(pk=quota.pk).update(nominal_gpus=4, borrowing_limit_gpus=0)
    small = queue_job(alpha, 1)
    too_big = queue_job(alpha, 8)  # over the new limit of 4: can never run now

    schedule_pending()

    assert fresh(a).state == S.RUNNING and fresh(b).state == S.ADMITTED
    assert JobAttempt.objects.filter(job__in=[a, b], ended_at__isnull=True).count() == 2
    small = fresh(small)
    assert small.state == S.QUEUED and small.queue_info["reason"] == "quota"
    assert (small.queue_info["used_gpus"], small.queue_info["nominal_gpus"], small.queue_info["borrowing_limit_gpus"]) == (12, 4, 0)
    assert fresh(too_big).state == S.REJECTED


# --- per-cluster quotas --------------------------------------------------------------------------------------------

def held_on(team, cluster):
    return sum(JobAttempt.objects.filter(job__team=team, cluster=cluster, ended_at__isnull=True)
               .values_list("gpus", flat=True))


def test_a_lowered_cluster_cap_leaves_running_work_and_stops_recovery_over_it(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    a_cluster, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=4, price="4.00")
    quota_factory(alpha, h100, nominal=64)
    cap = Quota.objects.create(team=alpha, accelerator=h100, cluster=a_cluster, nominal_gpus=16)
    j1, j2 = queue_job(alpha, 8, max_retries=2), queue_job(alpha, 8, max_retries=2)
    schedule_pending()
    (j1, at1), (j2, _) = run(j1), run(j2)
    assert held_on(alpha, a_cluster) == 16
    cap.nominal_gpus = 8
    cap.save()
    recover_or_fail(j1, at1, end_reason=JobAttempt.EndReason.PREEMPTED)
    j3 = queue_job(alpha, 8)
    schedule_pending()
    schedule_pending()
    assert fresh(j2).state == S.RUNNING  # left alone
    assert fresh(j1).state in (S.RECOVERING, S.FAILED) and fresh(j3).state == S.QUEUED
    assert held_on(alpha, a_cluster) == 8


def test_a_multi_node_job_counts_all_its_gpus_against_the_cluster_cap(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    capped, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=4, price="4.00")
    quota_factory(alpha, h100, nominal=64)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=capped, nominal_gpus=8, borrowing_limit_gpus=4)
    job = queue_job(alpha, 8, nodes=2)
    schedule_pending()
    assert fresh(job).state == S.QUEUED and held_on(alpha, capped) == 0


def test_preemption_never_takes_a_team_over_its_cluster_cap(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job):
    capped, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=2, price="4.00")  # 16 GPUs
    quota_factory(alpha, h100, nominal=16)
    quota_factory(beta, h100, nominal=0, borrowing=16)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=capped, nominal_gpus=8)
    low = [queue_job(beta, 8, priority=100, preemptible=True) for _ in range(2)]
    schedule_pending()
    for j in low:
        if fresh(j).state == S.ADMITTED:
            run(j)
    a1 = queue_job(alpha, 8, priority=1000)
    a2 = queue_job(alpha, 8, priority=1000)
    for _ in range(4):
        schedule_pending()
    assert held_on(alpha, capped) == 8  # one admitted by preempting beta, the other held back by the cap
    assert sorted([fresh(a1).state, fresh(a2).state]) == sorted([S.ADMITTED, S.QUEUED])


@pytest.mark.django_db(transaction=True)
def test_racing_passes_never_exceed_a_cluster_cap(cluster_factory, quota_factory, h100, alpha, queue_job):
    from django.db import connection
    capped, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=8, price="4.00")
    quota_factory(alpha, h100, nominal=64)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=capped, nominal_gpus=8)
    for _ in range(6):
        queue_job(alpha, 4)
    errors = []

    def one():
        try:
            schedule_pending()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert held_on(alpha, capped) == 8
