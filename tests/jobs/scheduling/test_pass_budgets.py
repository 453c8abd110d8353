"""Money budgets in the scheduling pass: a block budget keeps jobs that do not fit waiting and rejects one over its
whole amount; spent (ledger) and committed (running estimates) money both count; alert budgets never block.

Prices are cluster overrides picked here, so every estimate is worked out with Decimal arithmetic.
"""

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from costs.ledger import accrue_attempt
from jobs.lifecycle import cancel_job, end_attempt
from jobs.models import JobAttempt, JobState
from jobs.scheduling.passes import schedule_pending
from quotas.models import Budget, Team
from tests.support.factories import fresh, run
from tests.support.states import state_events

S = JobState
D = Decimal

pytestmark = pytest.mark.django_db


def test_a_block_budget_keeps_the_job_that_does_not_fit_queued(
        cluster_factory, quota_factory, budget_factory, h100, alpha, queue_job):
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=4, price="4.20")
    quota_factory(alpha, h100, nominal=32)
    budget_factory(alpha, "100.00", action="block")
    jobs = [queue_job(alpha, 8) for _ in range(3)]  # 8 GPUs x 1 h x 4.20 = 33.60 each

    result = schedule_pending()

    assert result.admitted == [jobs[0].pk, jobs[1].pk]
    third = fresh(jobs[2])
    assert third.state == S.QUEUED
    info = third.queue_info
    assert info["reason"] == "budget"
    assert D(info["estimate_usd"]) == D(8) * D("4.20")  # 33.60
    assert D(info["committed_usd"]) == 2 * D(8) * D("4.20")  # 67.20
    assert D(info["remaining_usd"]) == D("100.00") - 2 * D(8) * D("4.20")  # 32.80
    assert D(info["amount_usd"]) == D("100.00")


def test_an_estimate_over_the_whole_block_budget_is_rejected(
        cluster_factory, quota_factory, budget_factory, h100, alpha, queue_job):
    cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    budget_factory(alpha, "30.00", action="block")
    job = queue_job(alpha, 8)  # 33.60 > 30.00
    assert schedule_pending().rejected == 1
    job = fresh(job)
    assert job.state == S.REJECTED and not job.attempts.exists()
    assert state_events(job) == [("QUEUED", "REJECTED")]
    assert job.estimated_cost_usd == D(8) * D("4.20")  # the estimate the budget refused, kept on the job


def test_an_alert_budget_admits_over_its_amount(cluster_factory, quota_factory, budget_factory, h100, alpha, queue_job):
    cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    budget_factory(alpha, "10.00", action="alert")
    job = queue_job(alpha, 8)
    schedule_pending()
    assert fresh(job).state == S.ADMITTED


def test_a_job_that_would_fit_the_budget_at_the_cheapest_price_waits_instead_of_being_rejected(
        cluster_factory, quota_factory, budget_factory, h100, alpha, beta, queue_job):
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=1, price="4.20")
    cluster_factory("dear", "azure", "eastus", h100, nodes=1, price="12.29")
    quota_factory(alpha, h100, nominal=8)
    quota_factory(beta, h100, nominal=8)
    budget_factory(alpha, "50.00", action="block")
    squatter = queue_job(beta, 8)  # takes the cheap cluster
    schedule_pending()
    assert fresh(squatter).current_attempt.cluster.name == "cheap"

    job = queue_job(alpha, 8)  # dear: 8 x 12.29 = 98.32 > 50 (all that is free); cheap: 33.60 <= 50
    schedule_pending()
    job = fresh(job)
    assert job.state == S.QUEUED and job.queue_info["reason"] == "budget"
    assert D(job.queue_info["estimate_usd"]) == D(8) * D("12.29")

    squatter = fresh(squatter)
    end_attempt(squatter, squatter.current_attempt, S.FAILED, reason="x", end_reason=JobAttempt.EndReason.DISPATCH_ERROR)
    schedule_pending()
    job = fresh(job)
    assert job.state == S.ADMITTED and job.current_attempt.cluster.name == "cheap"
    assert job.estimated_cost_usd == D(8) * D("4.20")


def test_money_spent_in_the_ledger_and_committed_by_running_jobs_both_count(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=3, price="4.20")
    quota_factory(alpha, h100, nominal=24)
    now = timezone.now()
    Budget.objects.create(team=alpha, period="custom", starts_at=now - dt.timedelta(days=1),
                          ends_at=now + dt.timedelta(days=1), amount_usd=D("100.00"), action="block")
    first = queue_job(alpha, 8)  # estimate 8 x 1 h x 4.20 = 33.60
    schedule_pending()
    job, attempt = run(first)
    t0 = now - dt.timedelta(hours=1)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=t0)
    accrue_attempt(attempt.pk, until=t0 + dt.timedelta(minutes=30))  # 8 x 0.5 h x 4.20 = 16.80 spent
    # remaining = 100 - 16.80 spent - (33.60 - 16.80) committed = 66.40
    two_hours = queue_job(alpha, 8, max_runtime=7200)  # 8 x 2 x 4.20 = 67.20 > 66.40: waits (not over the whole 100)
    schedule_pending()
    two_hours = fresh(two_hours)
    assert two_hours.state == S.QUEUED and two_hours.queue_info["reason"] == "budget"
    assert D(two_hours.queue_info["spent_usd"]) == D("16.80")
    assert D(two_hours.queue_info["committed_usd"]) == D("16.80")
    assert D(two_hours.queue_info["remaining_usd"]) == D("66.40")

    Team.objects.filter(pk=alpha.pk).update(queueing_strategy="StrictFIFO")
    ninety_minutes = queue_job(alpha, 8, max_runtime=5400)  # 8 x 1.5 x 4.20 = 50.40 <= 66.40
    schedule_pending()
    # under StrictFIFO a team's own jobs keep their order, so it waits behind two_hours although it would fit
    ninety = fresh(ninety_minutes)
    assert ninety.state == S.QUEUED and ninety.queue_info["reason"] == "priority"
    assert ninety.queue_info["behind_job_id"] == two_hours.pk
    cancel_job(fresh(two_hours))
    schedule_pending()
    assert fresh(ninety_minutes).state == S.ADMITTED
    # under BestEffortFIFO (the default) a job the budget allows passes one it does not
    Team.objects.filter(pk=alpha.pk).update(queueing_strategy="BestEffortFIFO")
    too_long, fits = queue_job(alpha, 8, max_runtime=7200), queue_job(alpha, 1, max_runtime=3600)
    schedule_pending()
    assert (fresh(too_long).state, fresh(fits).state) == (S.QUEUED, S.ADMITTED)
