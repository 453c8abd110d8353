"""A serving job's figures: the pass keeps each interval's increase of the endpoint's counters (a restart counted from
zero), percentiles follow Prometheus' histogram_quantile (promtool evaluates the same buckets), and the API, the
job's page and the weekly report show rates, error rate, replicas over time and GPU-hours and USD per million
requests from the ledger, pro rata inside the window, with an unknown price shown as unknown.

The ledger and the samples are written here by hand, beside a pass's own write of the samples from an exposition."""

from __future__ import annotations

import datetime as dt
import random
import subprocess
from datetime import UTC
from decimal import Decimal

import pytest

from costs.models import CostEntry
from costs.reports.build import generate_report
from costs.reports.render import render_csv
from jobs.models import JobState, ServingSample, ServingScale
from jobs.serving_figures import histogram_quantile, service_figures
from serving.autoscaler import record_sample
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job_row
from tests.support.personas import signed_in

T = dt.datetime(2026, 11, 30, 9, tzinfo=UTC)
M = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)


def exposition(requests: int, errors: int, tokens: int, buckets: dict[str, int], ready: int = 1) -> str:
    """The endpoint's counters as its /metrics writes them (Prometheus text format), written out here."""
    lines = ["# TYPE controlplane_endpoint_requests counter", f"controlplane_endpoint_requests_total {requests}",
             "# TYPE controlplane_endpoint_errors counter", f"controlplane_endpoint_errors_total {errors}",
             "# TYPE controlplane_endpoint_generated_tokens counter",
             f"controlplane_endpoint_generated_tokens_total {tokens}",
             "# TYPE controlplane_endpoint_ready_replicas gauge", f"controlplane_endpoint_ready_replicas {ready}",
             "# TYPE controlplane_endpoint_request_duration_seconds histogram"]
    lines += [f'controlplane_endpoint_request_duration_seconds_bucket{{le="{le}"}} {n}' for le, n in buckets.items()]
    lines += [f"controlplane_endpoint_request_duration_seconds_count {requests}",
              "controlplane_endpoint_request_duration_seconds_sum 1.5"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def served(teams, owner, catalog):
    """A RUNNING serving job of alpha on one attempt since T: ledger 1 GPU over [T, T+1h) for $6.88, 3 GPUs over
    [T+1h, T+2h) for $20.64; samples every 30 minutes from T+15m (requests 100, 200, 300, 400)."""
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"])
    job = make_job_row(teams[0], owner.user, catalog["H100-80GB"], name="serve-gpt", kind="inference",
                       state=JobState.RUNNING, max_runtime=None)
    attempt = make_attempt(job, cluster, pool, gpus=1, started_at=T)
    make_cost_entry(attempt, T, H, Decimal("6.88"), gpus=1)
    make_cost_entry(attempt, T + H, H, Decimal("20.64"), gpus=3)
    rows = [(15, 100, 0, 2400, 1, {"0.1": 60, "0.5": 90, "+Inf": 100}),
            (45, 200, 2, 4800, 1, {"0.1": 100, "0.5": 180, "+Inf": 200}),
            (75, 300, 1, 7200, 3, {"0.1": 150, "0.5": 290, "+Inf": 300}),
            (105, 400, 0, 9600, 3, {"0.1": 300, "0.5": 396, "+Inf": 400})]
    for minutes, requests, errors, tokens, replicas, buckets in rows:
        ServingSample.objects.create(job=job, at=T + minutes * M, seconds=1800, requests=requests, errors=errors,
                                     tokens=tokens, latency_buckets=buckets, replicas=replicas, ready_replicas=replicas)
    return job


def unpriced_serving_job(teams, owner, catalog):
    """A serving job of alpha on a cluster without a price: 2 GPUs over [T, T+1h) of unknown cost, 50 requests."""
    cluster, pool = make_cluster("moved", "aws", "eu-nowhere-1", catalog["H100-80GB"])
    dark = make_job_row(teams[0], owner.user, catalog["H100-80GB"], name="dark", kind="inference",
                        state=JobState.RUNNING, max_runtime=None)
    attempt = make_attempt(dark, cluster, pool, gpus=2, started_at=T)
    CostEntry.objects.create(attempt=attempt, job=dark, team=dark.team, cluster=cluster, accelerator=pool.accelerator,
                             interval_start=T, interval_end=T + H, gpu_milli=2000, usd_per_gpu_hour=None, amount_usd=None)
    ServingSample.objects.create(job=dark, at=T + H, seconds=3600, requests=50, tokens=0, replicas=2,
                                 latency_buckets={"0.1": 50, "+Inf": 50})
    return dark


@pytest.mark.django_db
def test_the_pass_keeps_each_intervals_increase_and_counts_a_restarted_endpoint_from_zero(served):
    ServingSample.objects.filter(job=served).delete()
    state = ServingScale.objects.create(job=served)
    served.refresh_from_db()
    readings = [  # (minutes after T, requests, errors, tokens, buckets)
        (10, 10, 1, 240, {"0.1": 4, "1.0": 9, "+Inf": 10}),
        (20, 25, 1, 600, {"0.1": 10, "1.0": 24, "+Inf": 25}),
        (30, 5, 0, 120, {"0.1": 5, "1.0": 5, "+Inf": 5}),  # the endpoint restarted: its counters start again
    ]
    for minutes, requests, errors, tokens, buckets in readings:
        kept = record_sample(state, served, exposition(requests, errors, tokens, buckets, ready=2), T + minutes * M)
        state.sample = {**state.sample, **kept}
    samples = list(ServingSample.objects.filter(job=served).order_by("at"))
    assert [(s.requests, s.errors, s.tokens) for s in samples] == [(10, 1, 240), (15, 0, 360), (5, 0, 120)]
    assert [s.latency_buckets for s in samples] == [{"0.1": 4, "1.0": 9, "+Inf": 10}, {"0.1": 6, "1.0": 15, "+Inf": 15},
                                                    {"0.1": 5, "1.0": 5, "+Inf": 5}]
    assert [s.seconds for s in samples] == [600, 600, 600]  # the first from the attempt's start
    assert {(s.replicas, s.ready_replicas) for s in samples} == {(1, 2)}


def test_histogram_quantile_interpolates_inside_the_bucket_that_holds_the_rank():
    buckets = {"0.1": 2, "0.25": 7, "0.5": 9, "+Inf": 10}
    # p50: rank 5 falls in (0.1, 0.25], which holds ranks 3..7: 0.1 + 0.15 x (5 - 2) / 5
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.19)
    assert histogram_quantile(0.99, buckets) == 0.5  # rank 9.9 is in +Inf: the highest finite bound
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.05)  # rank 1 of 2 in (0, 0.1]
    assert histogram_quantile(0.5, {"0.1": 0, "+Inf": 0}) is None
    with pytest.raises(ValueError):
        histogram_quantile(1.5, buckets)


def test_histogram_quantile_agrees_with_prometheus_on_random_buckets(tmp_path):
    rng = random.Random(41)
    bounds = ["0.005", "0.05", "0.1", "0.5", "1", "2.5", "10", "+Inf"]
    series, tests = [], []
    for case in range(12):
        counts, running = {}, 0
        for le in bounds:
            running += rng.choice([0, 0, 1, 3, 17, 40])
            counts[le] = running + (1 if le == "+Inf" else 0)
        for le, count in counts.items():
            series.append(f"  - series: 'lat_bucket{{case=\"{case}\",le=\"{le}\"}}'\n    values: '{count}'")
        for q in (0.5, 0.9, 0.99):
            ours = histogram_quantile(q, counts)
            tests.append(f"  - expr: histogram_quantile({q}, lat_bucket{{case=\"{case}\"}})\n    eval_time: 0m\n"
                         f"    exp_samples:\n      - labels: '{{case=\"{case}\"}}'\n        value: {ours!r}")
    (tmp_path / "empty.yml").write_text("groups: []\n")
    (tmp_path / "test.yml").write_text(
        "rule_files: [empty.yml]\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n"
        + "\n".join(series) + "\n  promql_expr_test:\n" + "\n".join(tests) + "\n")
    done = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.django_db
def test_the_figures_over_a_window_read_the_samples_and_the_ledger_pro_rata(served):
    figures = service_figures(served, T + 30 * M, T + 2 * H)  # samples at 45, 75, 105 minutes
    assert (figures["requests"], figures["errors"], figures["tokens"]) == (900, 3, 21600)
    assert figures["seconds"] == 5400 and figures["requests_per_second"] == round(900 / 5400, 3)
    assert figures["error_rate_percent"] == round(100 * 3 / 900, 4)
    # ledger inside [T+30m, T+2h): half of the first hour at 1 GPU, the second hour at 3 GPUs
    assert figures["gpu_hours"] == 3.5 and figures["unpriced_gpu_hours"] == 0
    assert figures["usd"] == "24.08"  # 6.88 / 2 + 20.64
    assert figures["gpu_hours_per_million_requests"] == round(3.5e6 / 900, 6)
    assert figures["usd_per_million_requests"] == "26755.56"  # 24.08e6 / 900 = 26,755.555...
    assert figures["usd_per_million_tokens"] == "1114.81"  # 24.08e6 / 21,600 = 1,114.814...
    # buckets summed: 0.1 -> 550, 0.5 -> 866, +Inf -> 900; p50 rank 450 in (0, 0.1]: 0.1 x 450 / 550
    assert figures["latency_p50_ms"] == round(1000 * 0.1 * 450 / 550, 3)
    # p99: rank 891 in (0.5, +Inf]: the highest finite bound
    assert figures["latency_p99_ms"] == 500
    assert figures["replicas"] == [[(T + 45 * M).isoformat(), 1], [(T + 75 * M).isoformat(), 3]]


@pytest.mark.django_db
def test_the_window_ends_where_the_ledger_has_accrued_the_job(served):
    CostEntry.objects.filter(job=served, interval_start=T + H).delete()  # accrued only up to T+1h
    figures = service_figures(served, T, T + 2 * H)
    assert figures["window_end"] == (T + H).isoformat()
    assert figures["requests"] == 300 and figures["gpu_hours"] == 1.0  # the samples at 15 and 45 minutes


@pytest.mark.django_db
def test_the_api_and_the_page_show_the_last_hour_served_and_an_unknown_price_as_unknown(served, owner, catalog,
                                                                                        teams):
    answer = owner.client.get(f"/api/v1/jobs/{served.pk}/").json()["serving"]["figures"]
    # the last hour up to the last sample (T+105m): the samples at 75 and 105 minutes; ledger from T+45m
    assert answer["requests"] == 700 and answer["errors"] == 1
    assert answer["gpu_hours"] == pytest.approx(0.25 + 0.75 * 3, abs=1e-6)
    assert answer["usd_per_million_requests"] == "24571.43"  # (6.88 / 4 + 20.64 x 3 / 4) x 1e6 / 700
    page = signed_in(owner).get(f"/jobs/{served.pk}/").content.decode()
    assert "Per million requests" in page and "$24571.43" in page and "700 requests" in page

    dark = unpriced_serving_job(teams, owner, catalog)
    unknown = owner.client.get(f"/api/v1/jobs/{dark.pk}/").json()["serving"]["figures"]
    assert unknown["usd"] is None and unknown["usd_per_million_requests"] is None
    assert unknown["unpriced_gpu_hours"] == 2.0 and unknown["gpu_hours_per_million_requests"] == 2e6 / 50 * 1.0
    page = signed_in(owner).get(f"/jobs/{dark.pk}/").content.decode()
    said = page[page.index('id="job-serving-per-million"'):]
    assert said.split("</dd>")[0].endswith("unknown, 40000.00 GPU-h (2.00 GPU-h without a price)")


@pytest.mark.django_db
def test_the_weekly_report_lists_serving_jobs_with_usd_per_million_requests(served, teams):
    report, _ = generate_report(teams[0], T, T + 2 * H)
    [row] = report.data["serving"]
    assert (row["job"], row["requests"], row["cost_usd"]) == (served.pk, 1000, "27.52")
    assert row["usd_per_million_requests"] == "27520.00" and row["gpu_hours"] == 4.0
    csv = render_csv(report.data).splitlines()
    assert f"serving,{served.pk}:serve-gpt,usd_per_million_requests,27520.00" in csv
