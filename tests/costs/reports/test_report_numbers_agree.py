"""Numbers that agree: rows and totals each their exact sums rounded once, the difference stated, a report's budget is its own period's, unknown cost shown.

Expected values are worked out here from the ledger rows the tests write.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal

import pytest

from costs.models import CostEntry
from costs.reports.build import build_report_data, generate_report
from jobs.models import JobState
from quotas.models import Budget
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job_row

pytestmark = pytest.mark.django_db
D = Decimal
DAY = dt.datetime(2025, 11, 30, tzinfo=UTC)
CENT = D("0.01")


def job_on(team, user, cluster, pool, name, *, started, ended, estimate="0", state=JobState.SUCCEEDED):
    job = make_job_row(team, user, pool.accelerator, name=name, spec={}, state=state, estimated_cost_usd=D(estimate))
    return make_attempt(job, cluster, pool, gpus=1, started_at=started, ended_at=ended, state=state)


def test_report_rows_and_totals_are_rounded_once_and_the_difference_is_stated(teams, owner, catalog):
    alpha = teams[0]
    clusters = [make_cluster(f"c{n}", "aws", "us-east-1", catalog["H100-80GB"]) for n in range(3)]
    entries = []
    for n in range(12):  # 12 jobs on 3 clusters at $1.005 each: every row alone would round down
        cluster, pool = clusters[n % 3]
        attempt = job_on(alpha, owner.user, cluster, pool, f"j{n}", started=DAY, ended=DAY + dt.timedelta(hours=1))
        entries.append(make_cost_entry(attempt, DAY + dt.timedelta(minutes=n), dt.timedelta(minutes=10), D("1.005")))
    data = build_report_data(alpha, DAY, DAY + dt.timedelta(days=1))
    exact = sum((e.amount_usd for e in entries), D(0))
    assert data["totals"]["cost_usd"] == str(exact.quantize(CENT, ROUND_HALF_EVEN)) == "12.06"
    assert [r["cost_usd"] for r in data["by_cluster"]] == ["4.02", "4.02", "4.02"]  # 4 x 1.005 = 4.020 each
    assert len(data["top_jobs"]) == 11 and data["top_jobs"][-1]["job_name"] == "other jobs (2)"
    # Each job its own figure (1.005 -> 1.00 half to even, as in the API), not re-rounded to add up.
    assert [j["cost_usd"] for j in data["top_jobs"]] == ["1.00"] * 10 + ["2.01"]
    assert data["rounding_difference_usd"] == {"by_accelerator": "0.00", "by_cluster": "0.00", "by_day": "0.00",
                                               "top_jobs": "0.05"}
    report = generate_report(alpha, DAY, DAY + dt.timedelta(days=1))[0]
    assert "the topjobs rows miss the total by $0.05 (rounding)" in report.html
    assert "rounding_difference,top_jobs,usd,0.05" in report.csv.splitlines()


def test_a_report_shows_the_budget_of_its_own_period_as_it_stood_at_the_periods_end(teams, owner, catalog):
    """November's daily report, generated in December while a December job runs: November's money only."""
    alpha = teams[0]
    cluster, pool = make_cluster("eks", "aws", "us-east-1", catalog["H100-80GB"])
    Budget.objects.create(team=alpha, amount_usd=D("1000.00"), action="block")
    nov = job_on(alpha, owner.user, cluster, pool, "nov", started=DAY - dt.timedelta(days=2),
                 ended=DAY - dt.timedelta(days=2) + dt.timedelta(hours=2))
    make_cost_entry(nov, nov.started_at, dt.timedelta(hours=2), D("13.76"))
    on_30th = job_on(alpha, owner.user, cluster, pool, "30th", started=DAY + dt.timedelta(hours=1),
                     ended=DAY + dt.timedelta(hours=2))
    make_cost_entry(on_30th, on_30th.started_at, dt.timedelta(hours=1), D("6.88"))
    december = job_on(alpha, owner.user, cluster, pool, "dec", started=DAY + dt.timedelta(days=1, hours=3),
                      ended=None, estimate="500", state=JobState.RUNNING)
    make_cost_entry(december, december.started_at, dt.timedelta(hours=5), D("34.40"))
    data = build_report_data(alpha, DAY, DAY + dt.timedelta(days=1))
    (budget,) = data["budgets"]
    assert budget["period_start"] == dt.datetime(2025, 11, 1, tzinfo=UTC).isoformat()
    assert budget["spent_usd"] == "20.64"  # 13.76 + 6.88: December's 34.40 is not November's
    assert budget["committed_usd"] == "0.00"  # nothing ran at the end of November 30
    assert budget["remaining_usd"] == "979.36"


def test_the_report_says_cost_unknown_since_when_for_how_many_gpu_hours(teams, owner, catalog):
    alpha = teams[0]
    cluster, pool = make_cluster("no-price", "aws", "eu-south-9", catalog["H100-80GB"])
    attempt = job_on(alpha, owner.user, cluster, pool, "unpriced", started=DAY + dt.timedelta(hours=4), ended=None,
                     state=JobState.RUNNING)
    CostEntry.objects.create(attempt=attempt, job=attempt.job, team=alpha, cluster=cluster, accelerator=pool.accelerator,
                             interval_start=DAY + dt.timedelta(hours=4), interval_end=DAY + dt.timedelta(hours=7),
                             gpu_milli=1000, usd_per_gpu_hour=None, amount_usd=None)
    report, _ = generate_report(alpha, DAY, DAY + dt.timedelta(days=1))
    unknown = report.data["cost_unknown"]
    assert unknown["since"] == (DAY + dt.timedelta(hours=4)).isoformat() and unknown["gpu_hours"] == 3.0
    assert "cost unknown since 2025-11-30 04:00 UTC for 3.00 GPU-hours: no price for no-price/" in report.html
    assert "cost_unknown,alpha,gpu_hours,3.0" in report.csv.splitlines()
    # Nothing of the period is priced: its total is unknown (null), never $0.00, with the hours beside it.
    assert report.data["totals"]["cost_usd"] is None and report.data["totals"]["unpriced_gpu_hours"] == 3.0
    assert "total,alpha,cost_usd,unknown" in report.csv.splitlines()
    assert "total,alpha,unpriced_gpu_hours,3.0" in report.csv.splitlines()
