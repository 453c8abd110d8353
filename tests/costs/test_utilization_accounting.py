"""Observed, idle and unobserved GPU-hours read through a real Prometheus, on every DCGM label shape.

The scenarios (``tests/support/dcgm_shapes.py``) list every scrape; expected
values are counted from those scrapes inside each attempt's run: samples,
and the instants (one per scrape interval) at which a sample at most the
lookback old exists (``tests.support.lookback``), times the scrape
interval. The platform answers through the rollups and the API.
"""

from __future__ import annotations

import datetime as dt

import pytest

from costs import prometheus
from costs.collection import (
    collect_attempt,
    collect_ended,
    collection_target,
    detect_cluster_shape,
    refresh_running,
)
from costs.models import ClusterMetrics, UtilizationRollup
from jobs.models import JobState
from quotas.models import Team
from runners.models import Cluster
from tests.support import dcgm_shapes as S
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import make_persona, signed_in

pytestmark = pytest.mark.django_db
HOUR = 3600


@pytest.fixture
def dcgm(settings, dcgm_prometheus, dcgm_scenarios, catalog):
    """One cluster, team and attempt per scenario, the clusters reading the shared DCGM Prometheus."""
    settings.COSTS_PROMETHEUS_URL = dcgm_prometheus
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = S.STEP
    settings.COSTS_IDLE_UTIL_PERCENT = S.IDLE_PERCENT
    settings.COSTS_QUERY_LOOKBACK_DELTA_SECONDS = S.LOOKBACK
    staff = make_persona("auditor", staff=True)
    attempts = {}
    for name, s in dcgm_scenarios.items():
        team = Team.objects.create(slug=name, name=name)
        cluster, pool = make_cluster(name, "aws", "us-east-1", catalog["H100-80GB"])
        job = make_job_row(team, staff.user, catalog["H100-80GB"], name=name, gpus_per_node=s.gpus,
                           state=JobState.SUCCEEDED)
        attempt = make_attempt(job, cluster, pool, gpus=s.gpus, started_at=s.start, ended_at=s.end,
                               state=JobState.SUCCEEDED, object_name=s.object_name)
        if s.gpu_uuids:
            attempt.runner_state = {"gpu_uuids": list(s.gpu_uuids)}
            attempt.save(update_fields=["runner_state"])
        attempts[name] = attempt
    return {"attempts": attempts, "staff": staff, "scenarios": dcgm_scenarios}


def rollups(attempt):
    return list(UtilizationRollup.objects.filter(attempt=attempt).order_by("day"))


def totals(rows) -> dict:
    return {"allocated": sum(r.gpu_seconds for r in rows) / HOUR,
            "observed": sum(r.observed_gpu_seconds for r in rows) / HOUR,
            "idle": sum(r.idle_gpu_seconds or 0 for r in rows) / HOUR,
            "unobserved": sum(r.unobserved_gpu_seconds for r in rows) / HOUR,
            "samples": sum(r.samples for r in rows)}


def expected(s: S.Scenario) -> dict:
    inside = s.inside()
    allocated = s.gpus * (s.end - s.start).total_seconds() / HOUR
    observed, idle = (seconds / HOUR for seconds in s.instants())
    return {"allocated": allocated, "observed": observed, "idle": idle, "unobserved": allocated - observed,
            "samples": len(inside)}


@pytest.mark.parametrize("name,shape,metric", [
    ("midnight", "pod", prometheus.UTIL_PERCENT),
    ("exported", "exported_pod", prometheus.GR_ENGINE_ACTIVE),
    ("wholehost", "host", prometheus.UTIL_PERCENT),
    ("partialhost", "host", prometheus.UTIL_PERCENT),
])
def test_each_label_shape_is_detected_from_the_series_and_attributes_the_attempt(dcgm, name, shape, metric):
    s, attempt = dcgm["scenarios"][name], dcgm["attempts"][name]
    row = detect_cluster_shape(attempt.cluster, s.end)
    assert (row.detected_shape, row.util_metric, row.host_label) == (shape, metric, s.host_label)
    collect_attempt(attempt, s.start, s.end)
    got = totals(rollups(attempt))
    assert got == pytest.approx(expected(s))
    inside = s.inside()
    assert sum(r.util_sum for r in rollups(attempt)) == pytest.approx(sum(inside), abs=1e-6 * len(inside))
    assert {r.util_metric for r in rollups(attempt)} == {metric}
    assert {r.label_shape for r in rollups(attempt)} == {shape}


def test_exported_labels_name_the_workload_while_pod_names_the_exporter(dcgm):
    """The smallest case: exported_pod="job-...-7b9be", pod="nvidia-dcgm-exporter-x7k2p"; read by pod it is empty."""
    s, attempt = dcgm["scenarios"]["exported"], dcgm["attempts"]["exported"]
    collect_attempt(attempt, s.start, s.end)
    assert totals(rollups(attempt))["samples"] == len(s.inside()) > 0
    ClusterMetrics.objects.filter(cluster=attempt.cluster).update(shape_override="pod")  # an operator's override wins
    collect_attempt(attempt, s.start, s.end)
    [rollup] = rollups(attempt)
    assert (rollup.samples, rollup.observed_gpu_seconds, rollup.idle_gpu_seconds, rollup.avg_gpu_util_percent) == \
        (0, 0, None, None)
    assert rollup.unobserved_gpu_seconds == pytest.approx(s.gpus * (s.end - s.start).total_seconds())


def test_a_partial_node_without_recorded_gpu_uuids_is_unobserved_not_guessed(dcgm):
    s, attempt = dcgm["scenarios"]["partialhost"], dcgm["attempts"]["partialhost"]
    attempt.runner_state = {}
    attempt.save(update_fields=["runner_state"])
    collect_attempt(attempt, s.start, s.end)
    [rollup] = rollups(attempt)
    assert rollup.samples == 0 and rollup.idle_gpu_seconds is None and rollup.label_shape == ""


def test_a_gap_stays_unobserved_and_midnight_changes_nothing(dcgm):
    """1 GPU for 14 h: 1 h at 100 %, 10 h without samples, 3 h at 0 %, scraped at second 7 of each minute from
    37 s after the start: 64 min observed busy (the last sample before the gap stands for the 5-minute lookback),
    178.5 min observed idle (from the first instant that sees a sample to the end), the rest unobserved."""
    got = {}
    for name in ("midnight", "daytime"):
        s, attempt = dcgm["scenarios"][name], dcgm["attempts"][name]
        collect_attempt(attempt, S.DAY0, S.DAY0 + dt.timedelta(days=2))
        got[name] = totals(rollups(attempt))
        assert got[name] == pytest.approx(expected(s))
    assert len(rollups(dcgm["attempts"]["midnight"])) == 2 and len(rollups(dcgm["attempts"]["daytime"])) == 1
    assert got["midnight"] == pytest.approx(got["daytime"])
    assert got["midnight"]["idle"] == pytest.approx(178.5 / 60)
    assert got["midnight"]["unobserved"] == pytest.approx(14 - (64 + 178.5) / 60)


def test_the_series_lingering_after_the_pod_ended_does_not_count(dcgm):
    s, attempt = dcgm["scenarios"]["daytime"], dcgm["attempts"]["daytime"]
    after = [t for t, _ in s.scrapes[0] if t >= s.end.timestamp()]
    assert after, "the scenario must keep scraping the GPU after the end"
    collect_attempt(attempt, s.start, s.end + dt.timedelta(hours=1))
    assert totals(rollups(attempt))["samples"] == len(s.inside())


def test_samples_exactly_on_the_boundaries_count_at_the_start_and_not_at_the_end(dcgm):
    s, attempt = dcgm["scenarios"]["boundary"], dcgm["attempts"]["boundary"]
    stamps = [t for t, _ in s.scrapes[0]]
    assert s.start.timestamp() in stamps and s.end.timestamp() in stamps
    collect_attempt(attempt, s.start, s.end)
    [rollup] = rollups(attempt)
    inside = s.inside()
    assert rollup.samples == len(inside) == 60
    # 0 % on the start and one minute before the end; the 0 % sample on the end itself is outside the run.
    assert rollup.idle_gpu_seconds == s.instants()[1] == 2 * S.STEP
    # This Prometheus (2.x) reads range selectors closed; the probe says so.
    assert prometheus.range_left_open(prometheus.source_for(attempt.cluster)) is False


@pytest.mark.parametrize("left_open", [False, True])
def test_ranges_and_lookback_instants_read_exactly_the_window_under_both_selector_semantics(left_open):
    """Closed (2.x) selectors read [t - r, t], left-open (3.x) ones (t - r, t]: a plain range must read [start, end)
    in ms; the instants must be the window's start and every multiple of the step in it, once each, each reading
    (p - lookback, p] and standing for the time up to the next one (or the end)."""
    def covered(at_s: float, r_ms: int) -> set[int]:
        t = round(at_s * 1000)
        return set(range(t - r_ms + (1 if left_open else 0), t + 1))

    step_ms = S.STEP * 1000
    start = S.DAY0 + dt.timedelta(minutes=1, seconds=7, milliseconds=250)
    for end in (start + dt.timedelta(seconds=30), start + dt.timedelta(minutes=1), start + dt.timedelta(minutes=7, seconds=53),
                S.DAY0 + dt.timedelta(minutes=9)):
        lo, hi = round(start.timestamp() * 1000), round(end.timestamp() * 1000)
        at, r = prometheus.range_for(start, end, left_open)
        assert covered(at, int(r[:-2])) == set(range(lo, hi))
        want = sorted({lo} | {p for p in range(lo, hi) if p % step_ms == 0})
        want = {p: (want[i + 1] if i + 1 < len(want) else hi) - p for i, p in enumerate(want)}  # instant: its ms
        inner = prometheus.lookback_range_ms(S.LOOKBACK, left_open)
        for max_points in (prometheus.SUBQUERY_POINTS, 3, 1):  # one subquery, or several end to end
            pieces, edges = prometheus.lookback_instants(start, end, S.STEP, left_open, max_points)
            got = {round(t.timestamp() * 1000): round(seconds * 1000) for t, seconds in edges}
            for first, last, outer in pieces:
                points = sorted(p for p in covered(last.timestamp(), outer) if p % step_ms == 0)  # aligned to epoch
                assert points[0] == round(first.timestamp() * 1000) and len(points) <= max_points
                assert not set(points) & set(got)
                got.update(dict.fromkeys(points, step_ms))
            assert got == want and sum(got.values()) == hi - lo
            for p in got:
                assert covered(p / 1000, inner) == set(range(p - S.LOOKBACK * 1000 + 1, p + 1))


def test_a_short_cancelled_attempt_is_collected_once_when_it_ends(dcgm):
    s, attempt = dcgm["scenarios"]["boundary"], dcgm["attempts"]["boundary"]
    collect_ended(now=s.end + dt.timedelta(seconds=30))
    assert rollups(attempt) == []  # its last scrape may not be in Prometheus yet
    now = s.end + dt.timedelta(minutes=5)
    collect_ended(now=now)
    assert rollups(attempt)[0].samples == len(s.inside())
    assert collect_ended(now=now) == 0  # every attempt collected after its end: none read again


def test_a_running_job_is_read_live_and_cached_for_a_short_time(dcgm, settings):
    s, attempt = dcgm["scenarios"]["exported"], dcgm["attempts"]["exported"]
    attempt.ended_at = None
    attempt.save(update_fields=["ended_at"])
    halfway = s.start + dt.timedelta(hours=1)
    assert refresh_running([attempt], now=halfway) == 1
    [rollup] = rollups(attempt)
    # Read up to the settled target (scrapes of the last seconds may not be in yet), never read again.
    assert rollup.covered_until == collection_target(halfway) < halfway
    assert rollup.samples == len(s.inside(hi=collection_target(halfway)))
    settings.COSTS_LIVE_CACHE_SECONDS = 3600
    assert refresh_running([attempt], now=halfway) == 0  # fresh enough: the stored figures answer


def test_the_api_reports_null_not_zero_where_there_is_no_data(dcgm):
    for name in ("midnight", "partialhost"):
        s = dcgm["scenarios"][name]
        attempt = dcgm["attempts"][name]
        if name == "partialhost":
            attempt.runner_state = {}
            attempt.save(update_fields=["runner_state"])
        collect_attempt(attempt, s.start, s.end)
    body = dcgm["staff"].client.get("/api/v1/utilization/", {"group_by": "team"}).json()
    rows = {r["team"]: r for r in body["results"]}
    assert rows["partialhost"]["idle_gpu_hours"] is None and rows["partialhost"]["avg_gpu_util_percent"] is None
    assert rows["partialhost"]["observed_gpu_hours"] == 0 and rows["partialhost"]["unobserved_gpu_hours"] == 4.0
    want = expected(dcgm["scenarios"]["midnight"])
    assert rows["midnight"]["idle_gpu_hours"] == pytest.approx(want["idle"])
    assert rows["midnight"]["observed_gpu_hours"] == pytest.approx(want["observed"])
    assert rows["midnight"]["unobserved_gpu_hours"] == pytest.approx(want["unobserved"])
    total = body["total"]
    assert total["gpu_hours"] == pytest.approx(rows["midnight"]["gpu_hours"] + rows["partialhost"]["gpu_hours"])
    assert total["idle_gpu_hours"] == pytest.approx(want["idle"])


def test_the_cluster_page_shows_the_detected_shape_its_counter_and_an_override(dcgm):
    exported, wholehost = dcgm["attempts"]["exported"].cluster, dcgm["attempts"]["wholehost"].cluster
    detect_cluster_shape(exported, dcgm["scenarios"]["exported"].end)
    detect_cluster_shape(wholehost, dcgm["scenarios"]["wholehost"].end)
    ClusterMetrics.objects.filter(cluster=wholehost).update(shape_override="pod")
    page = signed_in(dcgm["staff"]).get("/clusters/").content.decode()
    assert ("series attributed by <strong>exported_namespace/exported_pod</strong>, detected" in page
            and "utilization read from DCGM_FI_PROF_GR_ENGINE_ACTIVE" in page)
    assert "series attributed by <strong>namespace/pod</strong>, set by an operator" in page
    assert "label shape not detected yet" in page  # the clusters whose series were not read


def test_every_attempt_has_its_four_figures_in_the_api_and_on_the_job_page(dcgm):
    s, attempt = dcgm["scenarios"]["midnight"], dcgm["attempts"]["midnight"]
    collect_attempt(attempt, s.start, s.end)
    want = expected(s)
    body = dcgm["staff"].client.get("/api/v1/utilization/", {"group_by": "attempt", "job": attempt.job_id}).json()
    (row,) = body["results"]
    assert (row["attempt"], row["attempt_number"], row["util_metric"]) == (attempt.pk, 1, prometheus.UTIL_PERCENT)
    got = (row["gpu_hours"], row["observed_gpu_hours"], row["idle_gpu_hours"], row["unobserved_gpu_hours"])
    assert got == pytest.approx((want["allocated"], want["observed"], want["idle"], want["unobserved"]))
    page = signed_in(dcgm["staff"]).get(f"/jobs/{attempt.job_id}/").content.decode()
    assert '<table id="job-usage">' in page
    assert "<td>#1</td><td>14.00</td><td>4.04</td><td>2.98</td><td>9.96</td>" in page  # 242.5, 178.5, 597.5 min


def test_a_running_jobs_page_answers_when_prometheus_does_not(dcgm, settings):
    from tests.support.net import free_port

    s, attempt = dcgm["scenarios"]["exported"], dcgm["attempts"]["exported"]
    attempt.ended_at = None
    attempt.save(update_fields=["ended_at"])
    Cluster.objects.filter(pk=attempt.cluster_id).update(prometheus_url=f"http://127.0.0.1:{free_port()}")
    attempt.cluster.refresh_from_db()
    assert refresh_running([attempt], now=s.start + dt.timedelta(hours=1)) == 0
    assert rollups(attempt) == []
    page = signed_in(dcgm["staff"]).get(f"/jobs/{attempt.job_id}/")
    assert page.status_code == 200 and 'id="job-util-empty"' in page.content.decode()
