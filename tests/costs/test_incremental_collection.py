"""The periodic utilization collection reads only what each attempt-day row lacks, grouped per cluster, and seals.

Class: a periodic pass that re-reads the whole lookback for every attempt
and day costs Prometheus each sample about 200 times a day. Invariants:
after any sequence of passes (repeated, or the same reads delivered twice)
a row holds exactly what one read of ``[day part start, covered_until)``
holds (samples, utilization, memory, observed and idle instants); once its
day's part has settled the row is sealed, equal to one read of the whole
part in every field, energy included; a pass over pod-labelled clusters whose
rows share a watermark asks each cluster one query, whatever the number of
attempts. Expected values come from plain ``read_usage`` calls over the
same interval and from the generators' own samples; queries are counted on
the wire (``tests.support.counting_proxy``).
"""

from __future__ import annotations

import datetime as dt
import random
from datetime import UTC

import pytest

from costs import prometheus
from costs.collection import (
    DAY,
    apply_reads,
    collect_utilization,
    collection_target,
    day_part,
    lookback_start,
    pass_pieces,
    periodic_pass,
    read_pieces,
    seal_after,
    utc_days,
)
from costs.models import UtilizationRollup
from jobs.models import JobState
from quotas.models import Team
from tests.costs.test_utilization_accounting import dcgm  # noqa: F401 (the DCGM scenarios as attempts)
from tests.support import dcgm_shapes as S
from tests.support import synthetic_fleet as F
from tests.support.counting_proxy import CountingProxy
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import make_persona
from tests.support.prometheus import start_prometheus

pytestmark = pytest.mark.django_db
REL = 1e-9
SUMS = ("samples", "util_sum", "memory_samples", "memory_sum", "prof_samples", "observed_gpu_seconds",
        "idle_gpu_seconds")


def whole_read(attempt, lo: dt.datetime, hi: dt.datetime) -> prometheus.WindowUsage:
    """One plain read of ``attempt``'s series over ``[lo, hi)``, as a pass that re-read everything would make."""
    from costs.collection import _Sources, attempt_matchers

    source, client, shape = _Sources().get(attempt.cluster, hi)
    matchers = attempt_matchers(attempt, shape, source, lo, hi, client)
    return prometheus.NO_USAGE if matchers is None else prometheus.read_usage(source, matchers, lo, hi, client=client)


def figures(usage: prometheus.WindowUsage, gpu_seconds: float) -> dict:
    return {"samples": usage.samples, "util_sum": usage.util_sum, "memory_samples": usage.memory_samples,
            "memory_sum": usage.memory_sum, "prof_samples": usage.prof_samples,
            "observed_gpu_seconds": min(gpu_seconds, usage.observed_seconds),
            "idle_gpu_seconds": None if usage.idle is None else min(gpu_seconds, usage.idle)}


def same(got: dict, want: dict) -> bool:
    """Equal keys, each value None on both sides or equal to ``REL`` (relative; 1e-9 absolute near 0)."""
    return got.keys() == want.keys() and all(
        got[k] is None and want[k] is None or None not in (got[k], want[k]) and got[k] == pytest.approx(want[k], rel=REL,
                                                                                                     abs=1e-9)
        for k in got)


def stored(row) -> dict:
    return {name: getattr(row, name) for name in SUMS}


def snapshot() -> list[tuple]:
    return list(UtilizationRollup.objects.order_by("attempt_id", "day").values_list(
        "attempt_id", "day", "covered_until", "sealed", *SUMS, "energy_kwh", "gpu_seconds"))


def check_rows(attempts: dict) -> tuple[int, int]:
    """Every row against one read of what it covers: a sealed row, its whole part, every field; another,
    ``[part start, covered_until)``, its sums. Returns (sealed, not sealed) rows checked."""
    sealed = open_rows = 0
    for row in UtilizationRollup.objects.filter(attempt__in=list(attempts)):
        attempt = attempts[row.attempt_id]
        lo, part_end = day_part(attempt, row.day)
        assert row.covered_until is not None and lo < row.covered_until <= part_end
        gpu_seconds = attempt.gpus * (row.covered_until - lo).total_seconds()
        assert row.gpu_seconds == pytest.approx(gpu_seconds, rel=REL)
        usage = whole_read(attempt, lo, row.covered_until)
        assert same(stored(row), figures(usage, gpu_seconds)), (row.attempt_id, row.day, stored(row), usage)
        if row.sealed:
            assert row.covered_until == part_end
            assert row.util_metric == usage.util_metric
            got = {"util": row.avg_gpu_util_percent, "memory": row.avg_memory_used_mib, "kwh": row.energy_kwh}
            want = {"util": usage.avg_util_percent, "memory": usage.avg_memory_mib, "kwh": usage.energy_kwh}
            assert same(got, want), (row.attempt_id, row.day, got, want)
            sealed += 1
        else:
            open_rows += 1
    return sealed, open_rows


def pass_twice(now: dt.datetime) -> None:
    """A pass at ``now``, then the same instant delivered again (nothing more is read or added)."""
    periodic_pass(now)
    before = snapshot()
    assert periodic_pass(now) == 0
    assert snapshot() == before


@pytest.mark.parametrize("seed", [1, 2])
def test_passes_at_random_instants_hold_what_one_read_holds_and_sealed_rows_hold_it_whole(
        synthetic_fleet, fleet_db, seed):
    UtilizationRollup.objects.all().delete()  # the fixture's whole-window collection: start from nothing
    attempts = {a.pk: a for a in fleet_db["attempts"].values()}
    jobs = {a.pk: job for job in synthetic_fleet.jobs for a in [fleet_db["attempts"][job.n]]}
    rng = random.Random(seed)
    first = F.T0 + DAY
    instants = sorted(first + dt.timedelta(seconds=rng.uniform(0, 1.5 * 86400)) for _ in range(9))
    for n, now in enumerate(instants):
        if n == 4:  # the same reads delivered twice, as by two workers running one pass concurrently
            reads = read_pieces(pass_pieces(now), now)
            assert apply_reads(reads) > 0
            before = snapshot()
            assert apply_reads(reads) == 0
            assert snapshot() == before
        pass_twice(now)
    last = instants[-1]
    sealed, open_rows = check_rows(attempts)
    assert open_rows > 0 and sealed > 0
    # Every attempt-day of the lookback is read up to the target (or its part's end).
    target = collection_target(last)
    for attempt in attempts.values():
        for day, lo, hi in utc_days(max(attempt.started_at, lookback_start(last)), min(attempt.ended_at, target)):
            row = UtilizationRollup.objects.get(attempt=attempt, day=day)
            assert row.covered_until == hi or row.sealed
            # The generator's own samples of the covered part (independent of PromQL).
            samples = synthetic_fleet.util_samples(jobs[attempt.pk], lo, row.covered_until)
            assert row.samples == len(samples)
            assert row.util_sum == pytest.approx(sum(samples), rel=REL)
    # A pass once every day of the lookback has settled seals them all: each equals one read of its part.
    seal_at = F.END + seal_after() + dt.timedelta(minutes=7)
    pass_twice(seal_at)
    sealed, open_rows = check_rows(attempts)
    days_in_lookback = {(a.pk, day) for a in attempts.values()
                        for day, _, _ in utc_days(max(a.started_at, lookback_start(seal_at)), a.ended_at)}
    assert days_in_lookback <= set(UtilizationRollup.objects.filter(sealed=True).values_list("attempt_id", "day"))


def test_every_label_shape_and_gap_adds_up_and_seals(dcgm, settings):  # noqa: F811 (the fixture imported above)
    """Exported labels, hosts (whole and partial), a gap across midnight, samples on the run's edges."""
    attempts = {a.pk: a for a in dcgm["attempts"].values()}
    rng = random.Random(3)
    now = S.DAY0 + dt.timedelta(hours=1)
    while now < S.DAY0 + 2 * DAY:
        pass_twice(now)
        now += dt.timedelta(seconds=rng.choice((60, 900, 900, 2700, 5400)) + rng.uniform(0, 59))
    check_rows(attempts)
    pass_twice(S.DAY0 + 2 * DAY + seal_after() + dt.timedelta(hours=9))
    sealed, open_rows = check_rows(attempts)
    assert open_rows == 0 and sealed == len(attempts) + 1  # the midnight scenario's run has 2 days
    for name, s in dcgm["scenarios"].items():
        rows = UtilizationRollup.objects.filter(attempt=dcgm["attempts"][name])
        assert sum(r.samples for r in rows) == len(s.inside())


# --- queries per pass: a fleet of attempts that all run through the day ------------------------------------------

QDAY = dt.datetime(2026, 7, 6, tzinfo=UTC)
QSTEP = 60
PODS = {"pods": 16, "exported": 4}  # cluster: attempts, each 2 GPUs, running from the day before to the day after


def pod_name(cluster: str, n: int) -> str:
    return f"job-{cluster}{n}-1-0-ab{n:03x}"


def query_fleet_openmetrics() -> str:
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    rng = random.Random(11)
    start, end = int((QDAY - DAY).timestamp()), int((QDAY + 2 * DAY).timestamp())
    for cluster, count in PODS.items():
        for n in range(count):
            for gpu in range(2):
                labels = {"gpu": gpu, "UUID": f"GPU-{cluster}-{n}-{gpu}", "Hostname": f"{cluster}-node-{n}",
                          "cluster": cluster}
                if cluster == "exported":
                    labels.update(namespace="gpu-operator", pod="nvidia-dcgm-exporter-q8x2z",
                                  exported_namespace=f"cp-{cluster}", exported_pod=pod_name(cluster, n))
                else:
                    labels.update(namespace=f"cp-{cluster}", pod=pod_name(cluster, n))
                text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines += [f"DCGM_FI_DEV_GPU_UTIL{{{text}}} {rng.randint(0, 100)} {t + 7}"
                          for t in range(start, end, QSTEP)]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def query_prometheus(tmp_path_factory):
    proc, url = start_prometheus(tmp_path_factory.mktemp("queries"), query_fleet_openmetrics())
    proxy = CountingProxy(url)
    yield proxy
    proxy.close()
    proc.terminate()
    proc.wait(timeout=30)


def test_a_pass_asks_each_pod_labelled_cluster_one_query_whatever_the_number_of_attempts(
        query_prometheus, settings, catalog):
    settings.COSTS_PROMETHEUS_URL = query_prometheus.url
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = QSTEP
    staff = make_persona("auditor", staff=True)
    for cluster_name, count in PODS.items():
        team = Team.objects.create(slug=cluster_name, name=cluster_name)
        cluster, pool = make_cluster(cluster_name, "aws", "us-east-1", catalog["H100-80GB"])
        for n in range(count):
            job = make_job_row(team, staff.user, catalog["H100-80GB"], name=f"{cluster_name}{n}", gpus_per_node=2)
            make_attempt(job, cluster, pool, gpus=2, started_at=QDAY - DAY + dt.timedelta(minutes=n, seconds=30),
                         state=JobState.RUNNING, object_name=f"job-{cluster_name}{n}-1")
    now = QDAY + dt.timedelta(hours=9, minutes=3)
    periodic_pass(now)  # the first: each attempt read from its start, the label shapes detected
    per_pass = []
    for _ in range(3):  # within the hour: the label shapes are not detected again
        now += dt.timedelta(minutes=15)
        query_prometheus.clear()
        written = periodic_pass(now)
        queries = query_prometheus.queries()
        per_pass.append(sorted(next(c for c in PODS if f'cluster="{c}"' in q) for q in queries))
        assert written == sum(PODS.values()) * 1  # every attempt's row of the day, one window each
        # Each a read of the window's GPU series (raw samples: a 15-minute window, prometheus.RAW_WINDOW).
        assert all(prometheus.UTIL_PERCENT in q and prometheus.ENERGY_MJ in q for q in queries)
    assert per_pass == [sorted(PODS)] * 3
    target = collection_target(now)
    assert set(UtilizationRollup.objects.filter(day=QDAY.date()).values_list("covered_until", flat=True)) == {target}
    # The same rows read as a whole-lookback pass did: a query per attempt and day (here 2 days each).
    query_prometheus.clear()
    collect_utilization(lookback_start(now), now)
    assert len([q for q in query_prometheus.queries() if "util_sum" in q]) == 2 * sum(PODS.values())


def test_an_attempt_without_running_time_in_the_window_is_passed_over_not_a_crash(query_prometheus, settings,
                                                                                  catalog):
    """Class: a pass crashed on an attempt whose run inside the window is empty (ended at its last contact, at
    or before its start: a cancel on an unreachable cluster). Invariant: such an attempt gets no row and every
    other attempt of the pass is still read."""
    settings.COSTS_PROMETHEUS_URL = query_prometheus.url
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = QSTEP
    staff = make_persona("auditor", staff=True)
    team = Team.objects.create(slug="c0", name="c0")
    cluster, pool = make_cluster("c0", "aws", "us-east-1", catalog["H100-80GB"])
    at = QDAY + dt.timedelta(hours=8)
    empty = make_attempt(make_job_row(team, staff.user, catalog["H100-80GB"], name="empty", gpus_per_node=2),
                         cluster, pool, gpus=2, started_at=at, ended_at=at - dt.timedelta(seconds=1),
                         state=JobState.CANCELLED, object_name="job-c0empty-1")
    running = make_attempt(make_job_row(team, staff.user, catalog["H100-80GB"], name="c00", gpus_per_node=2),
                           cluster, pool, gpus=2, started_at=QDAY - DAY + dt.timedelta(seconds=30),
                           state=JobState.RUNNING, object_name="job-c00-1")
    periodic_pass(QDAY + dt.timedelta(hours=9, minutes=3))
    assert not UtilizationRollup.objects.filter(attempt=empty).exists()
    assert UtilizationRollup.objects.filter(attempt=running, day=QDAY.date()).exists()
