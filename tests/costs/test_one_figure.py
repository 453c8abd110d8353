"""One figure per thing (ADR 0024): a job's cost is the same everywhere, tables follow one rule, the worst-case
estimate bounds the bill, the burn rate is what runs now, and utilization shows the allocation without Prometheus.

Classes and invariants:
- one thing, two figures (a row re-rounded to make a table add up): every figure is its exact Decimal sum
  rounded once, half to even, to cents (an amount above 0 below half a cent to two significant digits, never 0.00); a table's total is its exact sum rounded once and the table states the
  difference when its rows miss it;
- a worst case below the bill: an attempt is billed at most its max runtime, so billed <= estimate;
- a rate of the past shown as the rate now: the burn rate is the running attempts' GPUs x price;
- allocation read from DCGM samples only: allocated GPU-hours come from the ledger.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from costs.aggregation import present_sums
from costs.ledger import accrue_attempt, hour_floor
from costs.models import CostEntry
from costs.reports.build import generate_report
from jobs.models import JobState
from jobs.scheduling.core.rules import estimate_cost
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import signed_in

CENT = Decimal("0.01")


def cents(amount: Decimal) -> str:
    """Cents, half to even; an amount above 0 that would read ``0.00`` keeps two significant digits (Python's
    ``g`` format, the context's half-even rounding)."""
    rounded = amount.quantize(CENT, ROUND_HALF_EVEN)
    if rounded or not amount:
        return str(rounded)
    return format(Decimal(format(amount, ".2g")).normalize(), "f")


def test_a_cost_below_a_cent_is_never_shown_as_zero():
    from core.money import usd_cents

    assert usd_cents(Decimal("0.000039")) == "0.000039"  # a CPU-only job of a few seconds
    assert usd_cents(Decimal("0.0000395")) == "0.00004"
    assert usd_cents(Decimal("0.0049")) == "0.0049" and usd_cents(Decimal("0.0051")) == "0.01"
    assert usd_cents(Decimal("0")) == "0.00" and usd_cents(Decimal("12.345")) == "12.34"


amounts = st.decimals(min_value=0, max_value=100, places=9, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(amounts, min_size=0, max_size=12))
def test_rows_and_total_are_each_rounded_once_and_the_difference_is_stated(costs):
    sums = {(job, f"job-{job}"): [Decimal(3600), cost, Decimal(0), Decimal(0)] for job, cost in enumerate(costs, 1)}
    rows, total = present_sums(sums, "job")
    assert [r["cost_usd"] for r in rows] == [cents(c) for c in costs]
    assert total["cost_usd"] == cents(sum(costs, Decimal(0)))
    shown = sum((Decimal(r["cost_usd"]) for r in rows), Decimal(0))
    # The difference is itself stated to cents: what amounts below a cent shown exactly miss is no difference.
    assert Decimal(total["rounding_difference_usd"]) == (Decimal(total["cost_usd"]) - shown).quantize(CENT)
    assert abs(Decimal(total["rounding_difference_usd"])) <= CENT * len(costs) / 2


def three_jobs(teams, owner, catalog) -> tuple[list, dt.datetime]:
    """Three jobs of alpha that each cost exactly $1.005 (1 GPU x 10 min at $6.03/GPU-h): alone each shows $1.00
    (half to even), together $3.02; re-rounding the rows to add up would show one of them as $1.01."""
    cluster, pool = make_cluster("eks", "aws", "eu-test-1", catalog["H100-80GB"], price="6.03")
    cluster.last_contact_at = timezone.now()
    cluster.save(update_fields=["last_contact_at"])
    t0 = hour_floor(timezone.now()) - dt.timedelta(hours=2)
    jobs = []
    for n in range(3):
        job = make_job_row(teams[0], owner.user, catalog["H100-80GB"], name=f"j{n}", state=JobState.SUCCEEDED)
        start = t0 + dt.timedelta(minutes=11 * n)
        attempt = make_attempt(job, cluster, pool, started_at=start, ended_at=start + dt.timedelta(minutes=10),
                               state=JobState.SUCCEEDED)
        accrue_attempt(attempt.pk)
        jobs.append(job)
    assert [sum(CostEntry.objects.filter(job=j).values_list("amount_usd", flat=True)) for j in jobs] == \
        [Decimal("1.005")] * 3
    return jobs, t0


@pytest.mark.django_db
def test_one_jobs_cost_is_the_same_figure_in_every_answer(teams, owner, catalog):
    jobs, t0 = three_jobs(teams, owner, catalog)
    start, end = (t0 - dt.timedelta(days=1)).date().isoformat(), (t0 + dt.timedelta(days=1)).date().isoformat()
    api = owner.client.get("/api/v1/costs/", {"group_by": "job"}).json()
    assert [r["cost_usd"] for r in api["results"]] == ["1.00"] * 3
    assert api["total"]["cost_usd"] == "3.02" and api["total"]["rounding_difference_usd"] == "0.02"
    web = signed_in(owner)
    csv = web.get("/costs.csv", {"group_by": "job", "start": start, "end": end}).content.decode().splitlines()
    assert [line.split(",")[3] for line in csv[1:4]] == ["1.00"] * 3
    assert csv[-1].startswith("rounding_difference") and csv[-1].split(",")[3] == "0.02"
    page = web.get("/costs/", {"group_by": "job", "start": start, "end": end}).content.decode()
    assert page.count("$1.00") >= 3 and "$1.01" not in page and 'id="costs-rounding"' in page
    report, _ = generate_report(teams[0], t0 - dt.timedelta(hours=1), t0 + dt.timedelta(hours=2))
    assert [j["cost_usd"] for j in report.data["top_jobs"]] == ["1.00"] * 3
    assert report.data["rounding_difference_usd"]["top_jobs"] == "0.02"
    for job in jobs:
        detail = owner.client.get(f"/api/v1/jobs/{job.pk}/").json()
        assert detail["accrued_cost_usd"] == "1.00" and detail["efficiency"]["cost_usd"] == "1.00"
        assert '<span class="money">$1.00</span>' in web.get(f"/jobs/{job.pk}/").content.decode()


@pytest.mark.django_db
def test_the_worst_case_estimate_bounds_what_a_short_job_is_billed(teams, owner, catalog):
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"])  # $6.88 per GPU-hour
    price = Decimal("6.88")
    t0 = hour_floor(timezone.now()) - dt.timedelta(hours=1)
    job = make_job_row(teams[0], owner.user, catalog["H100-80GB"], name="short", max_runtime=20,
                       state=JobState.FAILED, estimated_cost_usd=estimate_cost(1, 20, price))
    # Billed from the objects' creation; the pods stopped 24.8 s later (deadline counted from later, grace).
    attempt = make_attempt(job, cluster, pool, started_at=t0, ended_at=t0 + dt.timedelta(seconds=24.8),
                           state=JobState.FAILED)
    accrue_attempt(attempt.pk)
    billed = sum(CostEntry.objects.filter(job=job).values_list("amount_usd", flat=True))
    seconds = sum((e.interval_end - e.interval_start).total_seconds() for e in CostEntry.objects.filter(job=job))
    assert seconds == 20 and billed == (price * 20 / 3600).quantize(Decimal("1e-9"), ROUND_HALF_EVEN)
    assert billed <= job.estimated_cost_usd
    attempt.refresh_from_db()
    assert attempt.accrued_until == attempt.ended_at  # final: not due again
    assert accrue_attempt(attempt.pk) == 0


@pytest.mark.django_db
def test_an_inference_attempt_is_billed_up_to_its_max_runtime_like_a_training_one(teams, owner, catalog):
    """Every runner stops an attempt at its max runtime (a Kubernetes Deployment by reconcile's next look): one
    whose objects went 50 s after a 20 s max runtime is billed the 20 s its estimate counts."""
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"])
    t0 = hour_floor(timezone.now()) - dt.timedelta(hours=1)
    job = make_job_row(teams[0], owner.user, catalog["H100-80GB"], name="serve", kind="inference", max_runtime=20,
                       state=JobState.FAILED)
    attempt = make_attempt(job, cluster, pool, started_at=t0, ended_at=t0 + dt.timedelta(seconds=70),
                           state=JobState.FAILED)
    accrue_attempt(attempt.pk)
    seconds = sum((e.interval_end - e.interval_start).total_seconds() for e in CostEntry.objects.filter(job=job))
    assert seconds == 20


@pytest.mark.django_db
def test_the_burn_rate_is_what_the_running_gpus_cost_per_hour(teams, owner, catalog, budget_factory):
    budget_factory(teams[0], "1000.00", action="alert")
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"])  # $6.88 per GPU-hour
    now = timezone.now()
    for name, gpus, ended in (("two", 2, None), ("one", 1, None), ("done", 4, now - dt.timedelta(minutes=5))):
        job = make_job_row(teams[0], owner.user, catalog["H100-80GB"], name=name, gpus_per_node=gpus,
                           state=JobState.RUNNING if ended is None else JobState.SUCCEEDED)
        make_attempt(job, cluster, pool, started_at=now - dt.timedelta(minutes=30), ended_at=ended)
    (status,) = owner.client.get("/api/v1/budget-status/").json()
    assert status["burn_rate_usd_per_hour"] == "20.64"  # 3 running GPUs x $6.88
    assert status["burn_rate_unpriced_gpus"] == 0


@pytest.mark.django_db
def test_utilization_shows_the_allocated_gpu_hours_without_prometheus(teams, owner, catalog):
    jobs, _ = three_jobs(teams, owner, catalog)
    costs = {r["job"]: r["gpu_hours"] for r in owner.client.get("/api/v1/costs/", {"group_by": "job"}).json()["results"]}
    util = owner.client.get("/api/v1/utilization/", {"group_by": "job"}).json()
    assert {r["job"]: r["gpu_hours"] for r in util["results"]} == costs == {j.pk: round(10 / 60, 6) for j in jobs}
    for row in util["results"]:
        assert row["unobserved_gpu_hours"] == row["gpu_hours"] and row["avg_gpu_util_percent"] is None
        assert row["idle_gpu_hours"] is None  # no samples: no data, never 0
    assert util["total"]["gpu_hours"] == round(3 * 10 / 60, 6)
    page = signed_in(owner).get(f"/jobs/{jobs[0].pk}/").content.decode()
    assert "<td>#1</td><td>0.17</td>" in page  # the attempt's allocation on its page
