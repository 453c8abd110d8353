"""Budgets: spent, committed, remaining and forecast from the ledger; thresholds firing once; block stopping admission.

Money is worked out here by hand (GPUs x hours x price) at fixed instants.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone
from prometheus_client import REGISTRY

from costs.budgets import budget_status, check_budget, check_budgets
from costs.ledger import accrue_attempt
from costs.models import BudgetAlert
from jobs.models import Job, JobState
from jobs.scheduling.passes import try_admit
from tests.support.factories import make_attempt, make_job_row

D = Decimal
pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(cluster_factory, h100):
    return cluster_factory("eks", "aws", "us-east-1", h100, price="5.00", nodes=4)[1]


@pytest.fixture
def spend(teams, user, pool, h100):
    """``spend(gpus, start, end, state=SUCCEEDED, estimate=0)``: a job of team alpha that ran and was accrued."""
    def make(gpus, start, end, *, state=JobState.SUCCEEDED, estimate="0", team=None):
        job = make_job_row(team or teams[0], user, h100, name="j", spec={}, gpus_per_node=gpus, max_runtime=30 * 86400,
                           state=state, estimated_cost_usd=D(estimate))
        attempt = make_attempt(job, pool.cluster, pool, gpus=gpus, usd_per_gpu_hour=D("5.00"), started_at=start,
                               ended_at=end, state=state)
        accrue_attempt(attempt.pk, until=end)
        return job
    return make


def alerts_counter(budget, threshold: int) -> float:
    labels = {"team": budget.team.slug, "budget": str(budget.pk), "threshold": str(threshold)}
    return REGISTRY.get_sample_value("controlplane_budget_alerts_total", labels) or 0.0


def test_each_threshold_fires_once_per_period_with_a_mail_to_the_admins(teams, owner, teammate, spend, budget_factory):
    owner.user.email = "owner@example.com"
    owner.user.save()
    teammate.user.email = "member@example.com"
    teammate.user.save()
    budget = budget_factory(teams[0], "1000", action="alert")
    at = dt.datetime(2026, 3, 20, 12, tzinfo=UTC)
    spend(4, dt.datetime(2026, 3, 2, tzinfo=UTC), dt.datetime(2026, 3, 3, 6, tzinfo=UTC))  # 4 x 30 h x $5 = $600
    fired = check_budget(budget, at)
    assert [a.threshold_percent for a in fired] == [50] and fired[0].spent_usd == D(600)
    assert check_budget(budget, at) == [] and check_budgets(at) == 0  # again: nothing new
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["owner@example.com"]
    assert "50%" in mail.outbox[0].subject
    before = alerts_counter(budget, 80)

    spend(4, dt.datetime(2026, 3, 5, tzinfo=UTC), dt.datetime(2026, 3, 5, 22, tzinfo=UTC))  # + $440 = $1,040
    assert sorted(a.threshold_percent for a in check_budget(budget, at)) == [80, 100]
    assert check_budget(budget, at + dt.timedelta(days=5)) == []
    assert BudgetAlert.objects.filter(budget=budget).count() == 3 and len(mail.outbox) == 3
    assert alerts_counter(budget, 80) == before + 1

    april = dt.datetime(2026, 4, 10, tzinfo=UTC)  # a new period starts from zero
    assert check_budget(budget, april) == []
    spend(8, dt.datetime(2026, 4, 1, tzinfo=UTC), dt.datetime(2026, 4, 1, 13, tzinfo=UTC))  # $520
    assert [a.threshold_percent for a in check_budget(budget, april)] == [50]
    assert BudgetAlert.objects.filter(budget=budget, period_start=dt.datetime(2026, 4, 1, tzinfo=UTC)).count() == 1


def test_forecast_is_spent_plus_committed_plus_the_median_daily_spend_over_the_days_left(teams, spend, budget_factory,
                                                                                       settings):
    settings.COSTS_FORECAST_WINDOW_DAYS = 7
    budget = budget_factory(teams[0], "10000", action="alert")
    at = dt.datetime(2026, 3, 21, tzinfo=UTC)  # 11 days before April
    spend(2, dt.datetime(2026, 3, 18, tzinfo=UTC), at)  # 2 GPUs x 72 h x $5 = $720: $240 on each of 3 of 7 days
    status = budget_status(budget, at)
    assert status.spent_usd == D(720) and status.committed_usd == 0
    # Days 03-14..03-20: four without spend, three at $240: the median is $0.
    assert status.basis.rate_usd_per_day == 0 and status.forecast_usd == D(720)
    spend(2, dt.datetime(2026, 3, 14, tzinfo=UTC), dt.datetime(2026, 3, 16, tzinfo=UTC))  # 2 more days at $240
    status = budget_status(budget, at)
    assert status.basis.rate_usd_per_day == D(240) and status.burn_rate_usd_per_hour == 0  # nothing runs at `at`
    assert status.forecast_usd == D(720 + 480) + D(240) * 11
    assert status.remaining_usd == D(10000) - D(1200)

    # A running job: its committed money is added, and its own spend stays out of the rate.
    spend(1, dt.datetime(2026, 3, 20, 23, tzinfo=UTC), at, state=JobState.RUNNING, estimate="4000")  # +$5
    status = budget_status(budget, at)
    assert status.spent_usd == D(1205) and status.committed_usd == D(3995)
    assert status.basis.rate_usd_per_day == D(240)
    assert status.forecast_usd == D(1205) + D(3995) + D(240) * 11
    assert status.remaining_usd == D(10000) - D(1205) - D(3995)
    assert "median daily spend" in status.basis.method


def test_a_block_budget_spent_stops_admission_and_an_alert_budget_does_not(teams, user, spend, budget_factory,
                                                                           quota_factory, h100, pool):
    quota_factory(teams[0], h100, nominal=16)
    now = dt.datetime(2026, 3, 20, 12, tzinfo=UTC)
    spend(4, dt.datetime(2026, 3, 2, tzinfo=UTC), dt.datetime(2026, 3, 2, 19, tzinfo=UTC))  # $380
    budget = budget_factory(teams[0], "400", action="block")

    def submit(hours):
        return make_job_row(teams[0], user, h100, name="next", max_runtime=hours * 3600)

    big = submit(5)  # 1 GPU x 5 h x $5 = $25 > $20 left
    assert try_admit(big.pk, now=now) == "waiting"
    assert Job.objects.get(pk=big.pk).state == JobState.QUEUED
    small = submit(4)  # $20 fits exactly
    assert try_admit(small.pk, now=now) == "admitted"
    budget.action = "alert"
    budget.save()
    assert try_admit(big.pk, now=now) == "admitted"


def test_budget_status_api_shows_the_money_of_the_current_period_to_members_only(teams, owner, outsider, spend,
                                                                                  budget_factory):
    budget = budget_factory(teams[0], "1000", action="block")
    now = timezone.now()
    start = max(budget.window(now)[0], now - dt.timedelta(hours=2))
    spend(2, start, start + dt.timedelta(minutes=30))  # 2 GPUs x 0.5 h x $5 = $5
    spend(1, start, start + dt.timedelta(minutes=30), state=JobState.RUNNING, estimate="12.50")  # +$2.50 spent
    [row] = owner.client.get("/api/v1/budget-status/").json()
    assert (row["id"], row["team"], row["amount_usd"]) == (budget.pk, "alpha", "1000.00")
    assert (row["spent_usd"], row["committed_usd"], row["remaining_usd"]) == ("7.50", "10.00", "982.50")
    assert owner.client.get(f"/api/v1/budget-status/{budget.pk}/").json()["spent_usd"] == "7.50"
    assert outsider.client.get("/api/v1/budget-status/").json() == []
    assert outsider.client.get(f"/api/v1/budget-status/{budget.pk}/").status_code == 404


def test_the_periodic_task_fires_the_thresholds_reached_now_once(teams, owner, spend, budget_factory):
    from costs.tasks import check_budgets as check_budgets_task

    owner.user.email = "owner@example.com"
    owner.user.save()
    budget = budget_factory(teams[0], "10", action="alert")
    now = timezone.now()
    start = max(budget.window(now)[0], now - dt.timedelta(hours=2))
    spend(1, start, start + dt.timedelta(minutes=72))  # 1 GPU x 1.2 h x $5 = $6: 60 % of $10
    assert check_budgets_task.apply().get() == 1
    assert check_budgets_task.apply().get() == 0
    assert list(BudgetAlert.objects.filter(budget=budget).values_list("threshold_percent", flat=True)) == [50]
    assert len(mail.outbox) == 1
