"""Cost and utilization of a synthetic three-cluster fleet read back through a real Prometheus.

Expected numbers come from the generator's own jobs and samples (``tests/support/synthetic_fleet.py``):
GPU-hours and cost by hand with Decimal, utilization as the plain mean of
the samples scraped inside each job's run. The platform answers through
the ledger, the rollups, the API and PromQL.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.core.management import call_command

from costs import prometheus
from costs.ledgercheck import check_ledger
from costs.models import DailyCostRollup, UtilizationRollup
from tests.support import lookback
from tests.support import synthetic_fleet as F

pytestmark = pytest.mark.django_db
DAY = dt.timedelta(days=1)
LOOKBACK = 300  # the default COSTS_QUERY_LOOKBACK_DELTA_SECONDS


def instants(job: F.JobSpec, lo: dt.datetime, hi: dt.datetime, step: float = F.STEP) -> tuple[float, float]:
    """(observed, idle) GPU-seconds of ``job``'s GPUs inside its run and ``[lo, hi)`` (``tests.support.lookback``)."""
    a, b = max(lo, job.start).timestamp(), min(hi, job.end).timestamp()
    counts = [lookback.instants([(t, u) for t, u, _ in series], a, b, step, LOOKBACK, F.IDLE_PERCENT)
              for series in job.samples.values()]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def days():
    return [F.T0 + d * DAY for d in range(F.DAYS)]


def get(client, path, **params):
    response = client.get(path, params)
    assert response.status_code == 200, response.content
    return response.json()


def test_costs_per_team_and_day_match_the_generator_to_the_cent(synthetic_fleet, fleet_db):
    client = fleet_db["staff"].client
    for lo in days():
        body = get(client, "/api/v1/costs/", group_by="team", start=lo.isoformat(), end=(lo + DAY).isoformat())
        got = {row["team"]: row["cost_usd"] for row in body["results"]}
        expected = {team: F.Fleet.cents(sum((synthetic_fleet.cost(j, lo, lo + DAY)
                                             for j in synthetic_fleet.jobs if j.team == team), Decimal(0)))
                    for team in F.TEAMS}
        assert got == expected
        hours = {row["team"]: row["gpu_hours"] for row in body["results"]}
        for team in F.TEAMS:
            assert hours[team] == pytest.approx(sum(synthetic_fleet.gpu_hours(j, lo, lo + DAY)
                                                    for j in synthetic_fleet.jobs if j.team == team), abs=1e-5)


def test_the_price_change_applies_from_its_time_on_only(synthetic_fleet, fleet_db):
    aws = [j for j in synthetic_fleet.jobs if j.cluster == "aws-east"]
    change = F.CLUSTERS[0].prices[1][0]
    straddling = [j for j in aws if j.start < change < j.end]
    assert straddling, "the generator must put a job across the price change"
    body = get(fleet_db["staff"].client, "/api/v1/costs/", group_by="cluster")
    got = {row["cluster"]: row["cost_usd"] for row in body["results"]}
    expected_aws = sum((j.gpus * Decimal((min(j.end, change) - j.start).total_seconds() if j.start < change else 0)
                        * Decimal("6.88") / 3600
                        + j.gpus * Decimal((j.end - max(j.start, change)).total_seconds() if j.end > change else 0)
                        * Decimal("5.50") / 3600 for j in aws), Decimal(0))
    assert got["aws-east"] == F.Fleet.cents(expected_aws)
    spot = sum((Decimal(j.gpus) * Decimal((j.end - j.start).total_seconds()) * Decimal("1.9035") / 3600
                for j in synthetic_fleet.jobs if j.cluster == "gcp-central"), Decimal(0))
    assert got["gcp-central"] == F.Fleet.cents(spot)


def test_daily_rollups_rebuilt_from_the_ledger_sum_to_the_same_cents(synthetic_fleet, fleet_db):
    call_command("rebuild_rollups")
    call_command("rebuild_rollups")  # rebuilding twice changes nothing
    for lo in days():
        for team in F.TEAMS:
            rows = DailyCostRollup.objects.filter(day=lo.date(), team__slug=team)
            total = sum((r.cost_usd for r in rows), Decimal(0))
            expected = sum((synthetic_fleet.cost(j, lo, lo + DAY) for j in synthetic_fleet.jobs if j.team == team),
                           Decimal(0))
            assert F.Fleet.cents(total) == F.Fleet.cents(expected)
            hours = sum(float(r.gpu_seconds) for r in rows) / 3600
            assert hours == pytest.approx(sum(synthetic_fleet.gpu_hours(j, lo, lo + DAY)
                                              for j in synthetic_fleet.jobs if j.team == team))


def test_utilization_per_team_and_day_is_the_mean_of_samples_inside_each_run(synthetic_fleet, fleet_db):
    client = fleet_db["staff"].client
    for lo in days():
        body = get(client, "/api/v1/utilization/", group_by="team", start=lo.isoformat(), end=(lo + DAY).isoformat())
        got = {row["team"]: row for row in body["results"]}
        for team in F.TEAMS:
            samples = [u for j in synthetic_fleet.jobs if j.team == team
                       for u in synthetic_fleet.util_samples(j, lo, lo + DAY)]
            assert got[team]["avg_gpu_util_percent"] == pytest.approx(sum(samples) / len(samples), abs=0.5)
            assert got[team]["gpu_hours"] == pytest.approx(
                sum(synthetic_fleet.gpu_hours(j, lo, lo + DAY) for j in synthetic_fleet.jobs if j.team == team),
                abs=1e-5)


def test_utilization_per_cluster_reads_both_dcgm_metrics_and_both_prometheus_layouts(synthetic_fleet, fleet_db):
    body = get(fleet_db["staff"].client, "/api/v1/utilization/", group_by="cluster",
               start=F.T0.isoformat(), end=F.END.isoformat())
    got = {row["cluster"]: row for row in body["results"]}
    for spec in F.CLUSTERS:
        samples = [u for j in synthetic_fleet.jobs if j.cluster == spec.name
                   for u in synthetic_fleet.util_samples(j, F.T0, F.END)]
        assert got[spec.name]["avg_gpu_util_percent"] == pytest.approx(sum(samples) / len(samples), abs=0.5)
        jobs = [j for j in synthetic_fleet.jobs if j.cluster == spec.name]
        expected_coverage = (sum(instants(j, F.T0, F.END)[0] for j in jobs)
                             / sum(synthetic_fleet.gpu_hours(j, F.T0, F.END) * 3600 for j in jobs))
        assert got[spec.name]["coverage"] == pytest.approx(expected_coverage, abs=1e-4)
    assert got["gcp-central"]["coverage"] < 1  # the scrape gaps show


def test_a_job_whose_scrapes_all_went_missing_has_no_data_not_zero_percent(synthetic_fleet, fleet_db):
    job = synthetic_fleet.no_data_job
    assert synthetic_fleet.util_samples(job, F.T0, F.END) == []
    attempt = fleet_db["attempts"][job.n]
    body = get(fleet_db["staff"].client, "/api/v1/utilization/", group_by="job")
    row = next(r for r in body["results"] if r["job"] == attempt.job_id)
    assert row["avg_gpu_util_percent"] is None and row["coverage"] == 0
    assert row["gpu_hours"] == pytest.approx(synthetic_fleet.gpu_hours(job, F.T0, F.END))
    assert UtilizationRollup.objects.filter(attempt=attempt).get().samples == 0


def test_idle_gpu_hours_are_the_runs_of_idle_jobs_and_cost_their_share(synthetic_fleet, fleet_db):
    body = get(fleet_db["staff"].client, "/api/v1/utilization/", group_by="team")
    for row in body["results"]:
        idle_jobs = [j for j in synthetic_fleet.jobs
                     if j.team == row["team"] and j.idle and synthetic_fleet.util_samples(j, F.T0, F.END)]
        expected = sum(synthetic_fleet.gpu_hours(j, F.T0, F.END) for j in idle_jobs)
        # Busy jobs may see one pending-phase scrape at their very start; nothing else is idle.
        assert row["idle_gpu_hours"] == pytest.approx(expected, rel=0.01, abs=0.5)
        expected_usd = sum((synthetic_fleet.cost(j, F.T0, F.END) for j in idle_jobs), Decimal(0))
        assert Decimal(row["idle_cost_usd"]) == pytest.approx(expected_usd, rel=Decimal("0.01"), abs=Decimal("2"))


def test_ledger_agrees_with_kube_state_metrics_except_where_a_pod_ran_outside_the_platform(synthetic_fleet, fleet_db):
    clusters = fleet_db["clusters"]
    for name in ("aws-east", "oci-ash"):
        check = check_ledger(clusters[name], F.T0, F.END)
        assert not check.flagged, (name, check.ledger_gpu_hours, check.metrics_gpu_hours)
        assert check.difference_percent < 0.1
    check = check_ledger(clusters["gcp-central"], F.T0, F.END)
    ledger = sum(synthetic_fleet.gpu_hours(j, F.T0, F.END) for j in synthetic_fleet.jobs if j.cluster == "gcp-central")
    rogue = synthetic_fleet.gpu_hours(synthetic_fleet.rogue, F.T0, F.END)
    assert check.flagged
    assert check.ledger_gpu_hours == pytest.approx(ledger)
    assert check.metrics_gpu_hours == pytest.approx(ledger + rogue, rel=0.001)


def test_long_windows_are_split_under_the_point_limit(synthetic_fleet, fleet_db, costs_settings):
    windows = prometheus.split_window(F.T0, F.END, step_seconds=15)
    assert len(windows) == 2  # 3 days of 15 s steps = 17,280 points
    assert all((b - a).total_seconds() / 15 <= prometheus.MAX_POINTS for a, b in windows)
    assert windows[0][0] == F.T0 and windows[-1][1] == F.END
    source = prometheus.source_for(fleet_db["clusters"]["aws-east"])
    whole = prometheus.allocated_gpu_hours(source, F.T0, F.END)
    by_day = sum(prometheus.allocated_gpu_hours(source, lo, lo + DAY) for lo in days())  # no sample lost or doubled
    ledger = sum(synthetic_fleet.gpu_hours(j, F.T0, F.END) for j in synthetic_fleet.jobs if j.cluster == "aws-east")
    assert whole == pytest.approx(ledger, rel=1e-3) and by_day == pytest.approx(whole, rel=1e-12)
    # The subqueries at 15 s over 3 days are cut in two queries; each scrape and each instant still count once.
    usage = prometheus.read_usage(source, 'namespace=~"cp-.*"', F.T0, F.END, step_seconds=15)
    aws = [j for j in synthetic_fleet.jobs if j.cluster == "aws-east"]
    scrapes = [u for j in aws for series in j.samples.values()
               for t, u, _ in series if F.T0.timestamp() <= t < F.END.timestamp()]
    assert usage.samples == len(scrapes)
    counts = [lookback.instants([(t, u) for t, u, _ in series], F.T0.timestamp(), F.END.timestamp(), 15, LOOKBACK,
                                F.IDLE_PERCENT) for j in aws for series in j.samples.values()]
    assert (usage.observed_seconds, usage.idle_seconds) == pytest.approx((sum(c[0] for c in counts),
                                                                          sum(c[1] for c in counts)))
    with pytest.raises(prometheus.NaiveDatetime):
        prometheus.split_window(dt.datetime(2026, 3, 2), F.END, 15)


def test_each_job_counts_only_the_samples_of_its_running_interval(synthetic_fleet, fleet_db):
    body = get(fleet_db["staff"].client, "/api/v1/utilization/", group_by="job")
    got = {row["job"]: row for row in body["results"]}
    for job in synthetic_fleet.jobs:
        samples = synthetic_fleet.util_samples(job, F.T0, F.END)
        row = got[fleet_db["attempts"][job.n].job_id]
        if samples:  # the GPUs idle at 0 % for a while after the end; those scrapes must not count
            assert row["avg_gpu_util_percent"] == pytest.approx(sum(samples) / len(samples), abs=0.5), job.object_name
            hours = synthetic_fleet.gpu_hours(job, F.T0, F.END)
            assert row["coverage"] == pytest.approx(instants(job, F.T0, F.END)[0] / (hours * 3600), abs=1e-4)


def test_the_costs_endpoint_carries_utilization_and_idle_money_next_to_cost(synthetic_fleet, fleet_db):
    costs = get(fleet_db["staff"].client, "/api/v1/costs/", group_by="team", start=F.T0.isoformat(), end=F.END.isoformat(),
                with_utilization="true")
    util = get(fleet_db["staff"].client, "/api/v1/utilization/", group_by="team", start=F.T0.isoformat(),
               end=F.END.isoformat())
    by_team = {row["team"]: row for row in util["results"]}
    for row in costs["results"]:
        for column in ("avg_gpu_util_percent", "idle_gpu_hours", "idle_cost_usd"):
            assert row[column] == by_team[row["team"]][column]
    assert costs["total"]["idle_cost_usd"] == util["total"]["idle_cost_usd"]
    plain = get(fleet_db["staff"].client, "/api/v1/costs/", group_by="team")
    assert "avg_gpu_util_percent" not in plain["results"][0]  # opt-in: the plain answer keeps its shape
