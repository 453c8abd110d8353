"""The reports' training-efficiency section on a fixed data set: GPU-hours and cost by MFU band, low-MFU and idle
cost, MFU per team, the most expensive jobs with tokens and USD per million tokens (expected numbers worked out
here from the ledger lines, the reported throughputs and the catalog peaks: H100 989, A100 312 TFLOP/s)."""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import Decimal

import pytest

from costs.models import UtilizationRollup
from costs.reports.build import build_report_data, generate_report
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job, make_workload_metrics

pytestmark = pytest.mark.django_db
DAY = dt.datetime(2026, 3, 10, tzinfo=UTC)
PERIOD = (DAY, DAY + dt.timedelta(days=1))

MFU_BIG = round(100 * 1.2e5 * 43.2e9 / (8 * 989e12), 4)  # 65.5207 %
MFU_SMALL = round(100 * 5e3 * 1e9 / (4 * 312e12), 4)  # 0.4006 %
MFU_MID = round(100 * 4e4 * 1.2e10 / (2 * 989e12), 4)  # 24.2669 %


def bill(attempt, start, hours, price):
    make_cost_entry(attempt, start, dt.timedelta(hours=hours), attempt.gpus * Decimal(str(hours)) * Decimal(price),
                    usd_per_gpu_hour=price)


@pytest.fixture
def fleet(teams, owner, catalog):
    """big (8 H100, MFU 65.5 %, 1.2e9 tokens, billed 2 h in the period and 1 h the day before), small (4 A100,
    MFU 0.4 %, 2.7e7 tokens, 1.5 h), silent (1 H100, no reports, 1 h) of alpha; mid (2 H100 of beta, MFU 24.3 %,
    no token count, 3 h)."""
    alpha, beta = teams
    h100, a100 = catalog["H100-80GB"], catalog["A100-80GB"]
    aws, aws_pool = make_cluster("aws-h100", "aws", "us-east-1", h100)
    gcp, gcp_pool = make_cluster("gcp-a100", "gcp", "us-central1", a100)
    jobs = {name: make_job(team, owner.user, acc, name=name, gpus_per_node=gpus) for name, team, acc, gpus in
            [("big", alpha, h100, 8), ("small", alpha, a100, 4), ("silent", alpha, h100, 1), ("mid", beta, h100, 2)]}
    attempts = {name: make_attempt(job, gcp if name == "small" else aws, gcp_pool if name == "small" else aws_pool,
                                   state="SUCCEEDED") for name, job in jobs.items()}
    bill(attempts["big"], DAY + dt.timedelta(hours=10), 2, "6.88")  # 110.08
    bill(attempts["big"], DAY - dt.timedelta(hours=14), 1, "6.88")  # the day before: 55.04
    bill(attempts["small"], DAY + dt.timedelta(hours=13), 1.5, "3.00")  # 18.00
    bill(attempts["silent"], DAY + dt.timedelta(hours=1), 1, "6.88")  # 6.88
    bill(attempts["mid"], DAY + dt.timedelta(hours=2), 3, "6.88")  # 41.28
    make_workload_metrics(attempts["big"], "config flops_per_token=43200000000\n"
                                           "final step=1000 tokens_per_s=120000 tokens=1200000000\n")
    make_workload_metrics(attempts["small"], "config flops_per_token=1000000000\n"
                                             "final step=90 tokens_per_s=5000 tokens=27000000\n")
    make_workload_metrics(attempts["mid"], "config flops_per_token=12000000000\nstep=10 tokens_per_s=40000\n")
    UtilizationRollup.objects.create(
        attempt=attempts["big"], job=jobs["big"], team=alpha, cluster=aws, accelerator=h100, day=DAY.date(),
        gpu_seconds=16 * 3600, samples=480, expected_samples=480, util_sum=480 * 40.0, avg_gpu_util_percent=40.0,
        observed_gpu_seconds=16 * 3600, idle_gpu_seconds=4 * 3600)
    return jobs


PRICED = {"unpriced_gpu_hours": 0.0, "unpriced_vcpu_hours": 0.0}  # every hour of the fleet has a price


def test_gpu_hours_and_cost_by_mfu_band_low_mfu_and_idle(fleet):
    section = build_report_data(None, *PERIOD)["training_efficiency"]
    assert section["by_mfu_band"] == [
        {"band": "0-10 %", "gpu_hours": 6.0, "cost_usd": "18.00", **PRICED, "attempts": 1},
        {"band": "10-20 %", "gpu_hours": 0.0, "cost_usd": "0.00", **PRICED, "attempts": 0},
        {"band": "20-35 %", "gpu_hours": 6.0, "cost_usd": "41.28", **PRICED, "attempts": 1},
        {"band": "35-50 %", "gpu_hours": 0.0, "cost_usd": "0.00", **PRICED, "attempts": 0},
        {"band": ">= 50 %", "gpu_hours": 16.0, "cost_usd": "110.08", **PRICED, "attempts": 1},
        {"band": "unknown", "gpu_hours": 1.0, "cost_usd": "6.88", **PRICED, "attempts": 1},
    ]
    assert section["low_mfu"] == {"below_percent": 20.0, "gpu_hours": 6.0, "cost_usd": "18.00", **PRICED}
    assert section["idle"] == {"gpu_hours": 4.0, "cost_usd": "27.52", **PRICED}  # a quarter of big's 110.08
    assert section["mfu_percent"] == round((16 * MFU_BIG + 6 * MFU_SMALL + 6 * MFU_MID) / 28, 4)
    assert section["by_team"] == [
        {"team": "alpha", "gpu_hours": 23.0, "mfu_percent": round((16 * MFU_BIG + 6 * MFU_SMALL) / 22, 4)},
        {"team": "beta", "gpu_hours": 6.0, "mfu_percent": MFU_MID}]


def test_the_most_expensive_jobs_with_their_tokens_and_usd_per_million_tokens(fleet):
    top = build_report_data(None, *PERIOD)["training_efficiency"]["top_jobs"]
    # big: 16 of its 24 billed GPU-hours are in the period, so 2/3 of its 1.2e9 tokens: 8e8, at 110.08 USD.
    assert [(j["job_name"], j["cost_usd"], j["tokens"], j["usd_per_million_tokens"], j["mfu_percent"]) for j in top] == [
        ("big", "110.08", 800_000_000, "0.137600", MFU_BIG),
        ("mid", "41.28", None, None, MFU_MID),
        ("small", "18.00", 27_000_000, "0.666667", MFU_SMALL),
        ("silent", "6.88", None, None, None)]


def test_the_jobs_with_the_lowest_mfu_come_first_among_those_with_one(fleet):
    lowest = build_report_data(None, *PERIOD)["training_efficiency"]["lowest_mfu_jobs"]
    assert [(j["job_name"], j["mfu_percent"], j["cost_usd"]) for j in lowest] == [
        ("small", MFU_SMALL, "18.00"), ("mid", MFU_MID, "41.28"), ("big", MFU_BIG, "110.08")]  # silent has none


def test_the_section_is_in_the_html_and_the_csv(fleet, teams):
    report, _ = generate_report(teams[0], *PERIOD)
    assert "Training efficiency" in report.html and "USD per million tokens" in report.html
    lines = report.csv.splitlines()
    big = fleet["big"].pk
    for line in ["mfu_band,>= 50 %,cost_usd,110.08", "low_mfu,below 20 %,cost_usd,18.00",
                 f"efficiency_job,1:{big}:big,usd_per_million_tokens,0.137600",
                 f"lowest_mfu_job,1:{fleet['small'].pk}:small,mfu_percent,{MFU_SMALL}"]:
        assert line in lines, line
