"""The budget forecast over a synthetic month (steady use, one burst, one idle week) against the month's actual spend.

Every day but the idle week a 1-GPU job runs 02:00-22:00 at $5/GPU-hour ($100); on the 10th a 64-GPU burst
runs 4 h ($1,280) with a 6 h max runtime. The ledger is written hour by hour, as accrual does; each forecast
sees only what was known at its instant. The expected figures are worked out here from that schedule.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import Decimal

import pytest

from costs.forecast import forecast
from costs.ledger import post_entries
from costs.models import CostEntry
from costs.spend import ledger_usd
from jobs.models import JobState
from tests.support.factories import make_attempt, make_job_row

pytestmark = pytest.mark.django_db
D = Decimal
APRIL, MAY = dt.datetime(2026, 4, 1, tzinfo=UTC), dt.datetime(2026, 5, 1, tzinfo=UTC)
H = dt.timedelta(hours=1)
PRICE = D(5)
IDLE_WEEK = range(18, 25)  # April 18-24
BURST = (dt.datetime(2026, 4, 10, 10, tzinfo=UTC), 64, 4, 6)  # start, GPUs, hours run, max runtime hours


def ran(team, user, pool, start: dt.datetime, gpus: int, hours: int, max_hours: int):
    job = make_job_row(team, user, pool.accelerator, name="j", spec={}, gpus_per_node=gpus, max_runtime=max_hours * 3600,
                       state=JobState.SUCCEEDED, estimated_cost_usd=gpus * max_hours * PRICE)
    attempt = make_attempt(job, pool.cluster, pool, gpus=gpus, started_at=start, ended_at=start + hours * H,
                           state=JobState.SUCCEEDED)
    post_entries([
        CostEntry(attempt=attempt, job=job, team=team, cluster=pool.cluster, accelerator=pool.accelerator,
                  interval_start=start + i * H, interval_end=start + (i + 1) * H, gpu_milli=gpus * 1000, usd_per_gpu_hour=PRICE,
                  amount_usd=gpus * PRICE) for i in range(hours)])  # with their running totals, as accrual


@pytest.fixture
def month(teams, user, cluster_factory, h100, settings):
    settings.COSTS_FORECAST_WINDOW_DAYS = 7
    pool = cluster_factory("eks", "aws", "us-east-1", h100, price="5.00", nodes=8)[1]
    team = teams[0]
    day = dt.datetime(2026, 3, 25, tzinfo=UTC)  # a steady week of history before April
    while day < MAY:
        if not (day >= APRIL and day.day in IDLE_WEEK):
            ran(team, user, pool, day + 2 * H, 1, 20, 24)
        day += dt.timedelta(days=1)
    start, gpus, hours, max_hours = BURST
    ran(team, user, pool, start, gpus, hours, max_hours)
    actual = D(100) * (30 - len(IDLE_WEEK)) + gpus * hours * PRICE
    assert ledger_usd(team.pk, APRIL, MAY) == actual == D(3580)
    return team, actual


def forecast_at(team, at):
    return forecast(team.pk, MAY, at, ledger_usd(team.pk, APRIL, at))


def test_the_forecast_stays_near_the_months_actual_spend_through_a_burst_and_an_idle_week(month):
    team, actual = month
    start, _, hours, _ = BURST
    errors = {}
    at = APRIL
    while at < MAY:
        if not start <= at < start + hours * H:  # while the burst runs, its committed money is in (next test)
            errors[at] = (forecast_at(team, at).forecast_usd - actual) / actual
        at += H
    # Worst cases by hand: before the idle week the rate ($100/day) overshoots it by 7 x $100, and a running
    # day's job adds its committed money (at most its $120 estimate) beside today's $100 of rate: at most
    # $920 = +25.7 %; once four idle days are in the window the median is $0 and the forecast is what was
    # spent plus what runs: no less than -16.8 % ($2,980 of $3,580).
    assert max(errors.values()) <= D(920) / actual and min(errors.values()) >= D(-600) / actual
    last = forecast_at(team, MAY - H)  # everything is spent; the rate still adds its last hour
    assert last.spent_usd == actual and last.forecast_usd == actual + D(100) / 24


def test_a_burst_adds_its_own_cost_and_never_an_extrapolation_of_it(month):
    team, _ = month
    before, after = forecast_at(team, dt.datetime(2026, 4, 10, tzinfo=UTC)), forecast_at(team, dt.datetime(2026, 4, 11, tzinfo=UTC))
    # A day later: $1,280 of burst and the day's $100 spent, one day ($100) fewer to come; the rate is still $100.
    assert after.rate_usd_per_day == before.rate_usd_per_day == D(100)
    assert after.forecast_usd - before.forecast_usd == D(1280)
    start, gpus, hours, max_hours = BURST
    estimate = gpus * max_hours * PRICE
    for i in range(hours):  # while it runs, its committed money is what is left of its estimate, counted once
        f = forecast_at(team, start + i * H)
        steady_left = 24 * PRICE - (8 + i) * PRICE  # the day's job, running since 02:00, estimated for 24 h
        assert f.committed_usd == estimate - i * gpus * PRICE + steady_left
        assert f.rate_usd_per_day == D(100)  # the burst never enters the rate while it runs
        assert f.forecast_usd == f.spent_usd + f.committed_usd + D(100) * f.days_left


def test_the_forecast_states_its_method_and_inputs(month):
    team, _ = month
    f = forecast_at(team, dt.datetime(2026, 4, 5, 12, tzinfo=UTC))
    assert "median daily spend of the last 7 complete UTC days" in f.method
    assert [d for d, _ in f.daily_spend] == [dt.date(2026, 3, 29) + dt.timedelta(days=i) for i in range(7)]
    assert all(usd == D(100) for _, usd in f.daily_spend)
    assert f.days_left == D("25.5") and f.forecast_usd == f.spent_usd + f.committed_usd + D(100) * D("25.5")
