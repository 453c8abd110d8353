"""Idle and observed GPU time follow Prometheus' lookback on DCGM series scraped late, through a real Prometheus.

Class: samples that arrive one to four scrape intervals late counted as
one interval each, so the time between them reads as unobserved although
every instant query over it sees a value (a duty cycle scraped at 57 s with
gaps of 114-285 s lost more than half its idle time that way). Invariant:
a sample counts until the next sample or until the lookback delta runs out,
whichever comes first; a longer gap is unobserved past the lookback. The
idle share of the observed time, the idle time and the coverage the API
answers agree with that rule computed from the listed samples
(``tests.support.lookback.continuous``) within 0.5 percentage points, for
several generated duty cycles (``tests.support.duty_cycle``).
"""

from __future__ import annotations

import itertools

import pytest

from costs.collection import collect_attempt
from jobs.models import JobState
from quotas.models import Team
from runners.models import Cluster
from tests.support import duty_cycle as D
from tests.support import lookback
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import make_persona
from tests.support.prometheus import start_prometheus

pytestmark = pytest.mark.django_db
SEEDS = (57, 58, 59)
LOOKBACK = 300.0
IDLE_PERCENT = 5.0


def pod(seed: int) -> str:
    return f"job-duty{seed}-1-0-abcde"


@pytest.fixture(scope="module")
def cycles(tmp_path_factory):
    """``(url, {seed: DutyCycle})``: one Prometheus holding one pod per seed."""
    cycles = {seed: D.generate(seed=seed) for seed in SEEDS}
    text = "".join(D.openmetrics(c, "cp-duty", pod(seed)).removesuffix("# EOF\n").replace(
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n", "") for seed, c in cycles.items())
    proc, url = start_prometheus(tmp_path_factory.mktemp("duty"), "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + text + "# EOF\n")
    yield url, cycles
    proc.terminate()
    proc.wait(timeout=30)


def test_the_shape_is_late_scrapes_and_one_outage_and_the_one_interval_rule_loses_idle_time(cycles):
    """The generated series have the production shape, and counting each sample for one interval (the rule this
    replaces) misses more than 10 points of the allocated time as idle."""
    for cycle in cycles[1].values():
        for series in cycle.scrapes.values():
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(series)]
            assert {round(g) for g in gaps if g < 3600} == {57, 114, 171, 228, 285}
            assert sum(g > D.SCRAPE for g in gaps) > 0.4 * len(gaps) and max(gaps) > 3 * 3600 - 300
        allocated = len(cycle.scrapes) * (cycle.end - cycle.start).total_seconds()
        lo, hi = cycle.start.timestamp(), cycle.end.timestamp()
        idle = sum(lookback.continuous(s, lo, hi, LOOKBACK, IDLE_PERCENT)[1] for s in cycle.scrapes.values())
        one_interval = sum(D.SCRAPE for s in cycle.scrapes.values() for t, v in s if lo <= t < hi and v < IDLE_PERCENT)
        assert (idle - one_interval) / allocated > 0.10


@pytest.mark.parametrize("seed", SEEDS)
def test_idle_share_and_coverage_agree_with_the_lookback_rule(cycles, settings, catalog, seed):
    url, generated = cycles
    cycle = generated[seed]
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = D.SCRAPE
    settings.COSTS_IDLE_UTIL_PERCENT = IDLE_PERCENT
    settings.COSTS_QUERY_LOOKBACK_DELTA_SECONDS = LOOKBACK
    staff = make_persona("auditor", staff=True)
    team = Team.objects.create(slug="duty", name="duty")
    cluster, node_pool = make_cluster("duty", "aws", "us-east-1", catalog["H100-80GB"])
    Cluster.objects.filter(pk=cluster.pk).update(prometheus_url=url)
    cluster.refresh_from_db()
    gpus = len(cycle.scrapes)
    job = make_job_row(team, staff.user, catalog["H100-80GB"], name="duty", gpus_per_node=gpus,
                       state=JobState.SUCCEEDED)
    attempt = make_attempt(job, cluster, node_pool, gpus=gpus, started_at=cycle.start, ended_at=cycle.end,
                           state=JobState.SUCCEEDED, object_name=f"job-duty{seed}-1")
    collect_attempt(attempt, cycle.start, cycle.end)
    [row] = staff.client.get("/api/v1/utilization/", {"group_by": "job"}).json()["results"]

    lo, hi = cycle.start.timestamp(), cycle.end.timestamp()
    observed, idle = (sum(figures) for figures in zip(*(lookback.continuous(s, lo, hi, LOOKBACK, IDLE_PERCENT)
                                                        for s in cycle.scrapes.values()), strict=True))
    allocated = gpus * (hi - lo)
    assert row["gpu_hours"] == pytest.approx(allocated / 3600)
    # Percentage points of the allocated time, then of the observed time.
    assert abs(row["idle_gpu_hours"] * 3600 - idle) / allocated * 100 <= 0.5
    assert abs(row["observed_gpu_hours"] * 3600 - observed) / allocated * 100 <= 0.5
    assert abs(row["idle_percent"] - 100 * idle / observed) <= 0.5
    assert abs(row["coverage_percent"] - 100 * observed / allocated) <= 0.5
    # The 3-hour outage stays unobserved beyond the lookback's 5 minutes.
    assert row["unobserved_gpu_hours"] == pytest.approx(gpus * (3 - LOOKBACK / 3600), abs=0.2)
