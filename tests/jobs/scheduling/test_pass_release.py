"""GPUs held by an attempt go back to the team's quota and the pool when it ends, whatever the end."""

import pytest

from jobs.lifecycle import apply_observation, cancel_job, end_attempt, preempt_attempt, recover_or_fail
from jobs.models import JobAttempt, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.scheduling.snapshot import team_used_gpus
from runners.base import Observation
from tests.support.factories import fresh, run

S = JobState

pytestmark = pytest.mark.django_db


def test_an_ended_attempt_releases_its_gpus_to_the_next_waiting_job(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    first = queue_job(alpha, 8)
    second = queue_job(alpha, 8)
    schedule_pending()
    assert fresh(second).state == S.QUEUED and fresh(second).queue_info["used_gpus"] == 8

    job, attempt = run(first)
    schedule_pending()  # still running: nothing released
    assert fresh(second).state == S.QUEUED

    end_attempt(job, attempt, S.SUCCEEDED, reason="done", end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
    result = schedule_pending()
    assert result.admitted == [second.pk]
    assert fresh(second).state == S.ADMITTED


def test_an_ended_attempt_releases_cluster_capacity_too(cluster_factory, quota_factory, h100, alpha, beta, queue_job):
    _, pool = cluster_factory("small", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    quota_factory(beta, h100, nominal=8)
    first = queue_job(alpha, 8)
    other_team = queue_job(beta, 8)
    schedule_pending()
    assert fresh(other_team).queue_info["reason"] == "capacity"
    assert fresh(other_team).queue_info["free_gpus_by_pool"] == {str(pool.pk): 0}
    job = fresh(first)
    end_attempt(job, job.current_attempt, S.FAILED, reason="dispatch failed",
                end_reason=JobAttempt.EndReason.DISPATCH_ERROR)  # ADMITTED -> FAILED
    schedule_pending()
    assert fresh(other_team).state == S.ADMITTED
    assert fresh(other_team).current_attempt.node_pool_id == pool.pk


def test_quota_is_released_on_every_kind_of_end(cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=8, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=64)
    jobs = [queue_job(alpha, 8, max_retries=3) for _ in range(6)]
    schedule_pending()
    running = [run(j) for j in jobs]
    assert team_used_gpus(alpha.pk, h100.pk) == 48

    (j0, a0), (j1, a1), (j2, a2), (j3, a3), (j4, a4), (j5, a5) = running
    end_attempt(j0, a0, S.SUCCEEDED, reason="exit 0", end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
    assert team_used_gpus(alpha.pk, h100.pk) == 40
    apply_observation(j1, a1, Observation(phase="failed", end_reason="OOMKilled", exit_code=137))
    assert fresh(j1).state == S.FAILED and team_used_gpus(alpha.pk, h100.pk) == 32
    cancel_job(j2)  # RUNNING -> CANCELLING: GPUs held until the objects are gone
    assert team_used_gpus(alpha.pk, h100.pk) == 32
    end_attempt(fresh(j2), a2, S.CANCELLED, reason="objects deleted", end_reason=JobAttempt.EndReason.CANCELLED)
    assert team_used_gpus(alpha.pk, h100.pk) == 24
    preempt_attempt(j3, a3, reason="test")
    assert fresh(j3).state == S.RECOVERING and team_used_gpus(alpha.pk, h100.pk) == 16
    recover_or_fail(j4, a4, end_reason=JobAttempt.EndReason.EVICTED)
    assert fresh(j4).state == S.RECOVERING and team_used_gpus(alpha.pk, h100.pk) == 8
    apply_observation(j5, a5, Observation(phase="lost", end_reason="NodeLost"))
    assert fresh(j5).state == S.RECOVERING and team_used_gpus(alpha.pk, h100.pk) == 0
    assert not JobAttempt.objects.filter(job__team=alpha, ended_at__isnull=True).exists()
