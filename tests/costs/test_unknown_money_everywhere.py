"""Unknown money everywhere: no money figure reads as $0 where its price is unknown, and every one carries the hours
it leaves out (class: a cost nobody knows shown as a cost of 0; OpenCost shows missing prices as $0 too).

Invariant: every money figure of the API, the web UI, the CLI, the CSVs and the reports has the GPU-hours (and
vCPU-hours) without a price beside it, totals included; a figure none of which is priced is null / "unknown".

The scenario: a 1-GPU job priced all along, and a 4-GPU job whose only price row (a cluster override) is removed
an hour into its run, so 3 of its hours (12 GPU-hours) have no price. Then every GET route the API router serves
(read from the router, so a new one is walked too) is asked and each answer walked.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal

import pytest
from django.utils import timezone

from costs.ledger import accrue_attempt, hour_floor
from costs.models import Price, UtilizationRollup
from costs.reports.build import generate_report
from jobs.models import JobState
from tests.contracts.routes import ROUTES
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import signed_in

UNPRICED_GPU_HOURS = 12.0  # 4 GPUs x the 3 hours after the price row went


def money_keys(d: dict) -> list[str]:
    """The keys of ``d`` that hold a money figure derived from prices (a budget's own amount and prices are not)."""
    return [k for k in d if k.endswith("_usd") and k not in ("amount_usd", "rounding_difference_usd")]


def unpriced_hours(d: dict) -> float:
    return sum(float(v or 0) for k, v in d.items() if "unpriced" in k and k.endswith("_hours"))


def build(teams, owner, catalog, budget_factory) -> dict:
    """The scenario (see the module docstring); ``{"priced", "moving", "attempt", "report"}``."""
    alpha, h100 = teams[0], catalog["H100-80GB"]
    budget_factory(alpha, "1000.00", action="alert")
    t0 = hour_floor(timezone.now()) - dt.timedelta(hours=4)
    aws, aws_pool = make_cluster("aws-use1", "aws", "us-east-1", h100)
    moving, moving_pool = make_cluster("moving", "aws", "eu-nowhere-1", h100, price="2.00")  # its only price row
    for cluster in (aws, moving):
        cluster.last_contact_at = timezone.now()
        cluster.save(update_fields=["last_contact_at"])
    priced = make_job_row(alpha, owner.user, h100, name="priced-job", state=JobState.RUNNING, max_runtime=86400,
                          estimated_cost_usd=Decimal("6.88"))
    lost = make_job_row(alpha, owner.user, h100, name="moving-job", gpus_per_node=4, state=JobState.RUNNING,
                        max_runtime=86400, estimated_cost_usd=Decimal("192.00"))  # admitted at $2.00/GPU-h
    a_priced = make_attempt(priced, aws, aws_pool, started_at=t0)
    a_lost = make_attempt(lost, moving, moving_pool, started_at=t0)
    for attempt in (a_priced, a_lost):
        accrue_attempt(attempt.pk, t0 + dt.timedelta(hours=1))
    Price.objects.filter(cluster=moving).delete()  # the price disappears while the attempt runs
    for attempt in (a_priced, a_lost):
        accrue_attempt(attempt.pk, t0 + dt.timedelta(hours=4))
    day = (t0 + dt.timedelta(hours=3)).date()  # DCGM saw the moving job half idle on the day of its unpriced hours
    seconds = 4 * 3600.0
    UtilizationRollup.objects.create(attempt=a_lost, job=lost, team=alpha, cluster=moving, accelerator=h100, day=day,
                                     gpu_seconds=seconds, samples=100, expected_samples=100, util_sum=2500,
                                     avg_gpu_util_percent=25, idle_gpu_seconds=seconds / 2,
                                     observed_gpu_seconds=seconds, util_metric="DCGM_FI_DEV_GPU_UTIL")
    report, _ = generate_report(alpha, t0 - dt.timedelta(hours=1), t0 + dt.timedelta(hours=5))
    return {"priced": priced, "moving": lost, "attempt": a_lost, "report": report, "t0": t0}


def concerns_moving(d: dict, world: dict) -> bool:
    """Whether ``d`` is a figure of the moving job alone (its row, its attempt, its cluster)."""
    return (d.get("job") == world["moving"].pk or d.get("cluster") == "moving" or d.get("name") == "moving-job"
            or d.get("attempt") == world["attempt"].pk)


def walk(value, found: list[dict]) -> None:
    if isinstance(value, dict):
        found.append(value)
        for v in value.values():
            walk(v, found)
    elif isinstance(value, list):
        for v in value:
            walk(v, found)


def check_answer(url: str, body, world: dict) -> list[str]:
    """Where ``body`` breaks the invariant, in words."""
    dicts: list[dict] = []
    walk(body, dicts)
    out = []
    for d in dicts:
        keys = money_keys(d)
        if not keys:
            continue
        if not any("unpriced" in k for k in d):
            out.append(f"{url}: {keys} without the unpriced hours beside them: {sorted(d)}")
        if concerns_moving(d, world):
            if unpriced_hours(d) <= 0:
                out.append(f"{url}: a figure of the moving job says no hour is unpriced: {d}")
            out += [f"{url}: {k} of the moving job is 0.00" for k in keys if d[k] == "0.00"]
    return out


@pytest.fixture
def world(teams, owner, catalog, budget_factory):
    return build(teams, owner, catalog, budget_factory)


LOOKUPS = {"jobs": lambda w: w["moving"].pk, "reports": lambda w: w["report"].pk,
           "budget-status": lambda w: w["moving"].team.budgets.first().pk}


@pytest.mark.django_db
def test_every_money_figure_of_every_get_route_carries_its_unpriced_hours(world, owner):
    problems, walked = [], []
    for route in ROUTES:
        if route.method != "get" or not route.served or route.action == "logs":  # logs hold no money
            continue
        if route.detail and route.prefix not in LOOKUPS:
            continue  # fleet and catalog objects: their figures are prices, no ledger money
        url = route.url(LOOKUPS[route.prefix](world) if route.detail else None)
        queries = [{"group_by": g} for g in ("team", "job", "cluster", "attempt", "day")] if route.prefix in (
            "costs", "utilization") else [{}]
        for query in queries:
            if route.prefix == "costs":
                query = {**query, "with_utilization": "true"}
            r = owner.client.get(url, query)
            assert r.status_code == 200, (url, r.status_code)
            body = json.loads(r.content) if r["Content-Type"].startswith("application/json") else r.content.decode()
            walked.append(url)
            problems += check_answer(url, body, world) if not isinstance(body, str) else check_csv(url, body, world)
    assert {"/api/v1/costs/", "/api/v1/utilization/", "/api/v1/budget-status/", "/api/v1/jobs/"} <= set(walked)
    assert problems == []
    total = owner.client.get("/api/v1/costs/", {"group_by": "team"}).json()["total"]
    assert total["unpriced_gpu_hours"] == UNPRICED_GPU_HOURS and total["cost_usd"] == "35.52"  # 1 GPU x 4 h x $6.88 + 4 GPUs x 1 h x $2.00
    by_job = {r["job_name"]: r for r in owner.client.get("/api/v1/costs/", {"group_by": "job"}).json()["results"]}
    assert by_job["moving-job"]["cost_usd"] == "8.00" and by_job["moving-job"]["unpriced_gpu_hours"] == 12.0
    util = owner.client.get("/api/v1/utilization/", {"group_by": "job"}).json()["results"]
    (moving,) = [r for r in util if r["job_name"] == "moving-job"]
    assert moving["idle_unpriced_gpu_hours"] > 0 and moving["idle_cost_usd"] != "0.00"


def check_csv(url: str, text: str, world: dict) -> list[str]:
    """A long-form report CSV: every USD line is followed by its unpriced hours; the total carries 12 GPU-hours;
    no line of the moving job's reads 0.00."""
    lines = list(csv.reader(io.StringIO(text)))[1:]  # values may hold commas (a sentence), quoted
    metrics: dict[tuple, set] = {}
    for section, item, metric, _ in lines:
        metrics.setdefault((section, item), set()).add(metric)
    out = []
    for section, item, metric, value in lines:
        if metric.endswith("_usd") and metric != "amount_usd":
            if not any("unpriced" in m for m in metrics[(section, item)]):
                out.append(f"{url}: {section},{item},{metric} without its unpriced hours")
            if f":{world['moving'].pk}:" in item and value == "0.00":
                out.append(f"{url}: {section},{item},{metric} is 0.00")
    if ["total", "alpha", "unpriced_gpu_hours", str(UNPRICED_GPU_HOURS)] not in lines:
        out.append(f"{url}: the total line has no unpriced GPU-hours")
    return out


@pytest.mark.django_db
def test_the_web_pages_and_csvs_show_the_unpriced_hours_never_0_00(world, owner):
    web = signed_in(owner)
    start = (world["t0"] - dt.timedelta(days=1)).date().isoformat()
    end = (world["t0"] + dt.timedelta(days=2)).date().isoformat()
    lines = web.get("/costs.csv", {"group_by": "job", "start": start, "end": end}).content.decode().splitlines()
    rows = {line.split(",")[1]: line.split(",") for line in lines[1:]}
    assert rows["moving-job"][3:] == ["8.00", "12.0", "0.0"] and lines[-1].split(",")[-2] == "12.0"
    page = web.get("/costs/", {"group_by": "job", "start": start, "end": end}).content.decode()
    assert "$8.00 + 12.00 GPU-h without a price" in page
    job_page = web.get(f"/jobs/{world['moving'].pk}/").content.decode()
    assert "$8.00 + 12.00 GPU-h without a price" in job_page
    assert "GPU-h without a price" in web.get("/").content.decode()  # the dashboard's total and budget
    report_csv = web.get(f"/reports/{world['report'].pk}.csv").content.decode()
    assert check_csv("report csv", report_csv, world) == []
    assert "12.00 GPU-h without a price" in world["report"].html


def test_a_figure_none_of_which_is_priced_is_unknown_not_zero():
    from core.money import shown_usd

    assert shown_usd(Decimal(0), 12.0) is None and shown_usd(None) is None
    assert shown_usd(Decimal(0)) == "0.00" and shown_usd(Decimal("8.005"), 12.0) == "8.00"
