"""GPU energy from dcgm-exporter's energy counter, through a real Prometheus, priced as a line of its own.

Class: a counter that restarts from zero (driver or exporter restart) read
as a plain difference gives a negative or a giant energy. Invariant: the kWh
of an attempt are the counter's rise between consecutive scrape-step
instants of its run (the value each instant sees under the lookback, as for
observed time), every drop counted from zero, never negative; only the
energy drawn between a reset and the last scrape before it is lost. The
figures of adjacent windows (UTC days) add up to the run's exactly.
Clusters whose exporter reports no energy answer null (not measured), never
0; an unknown electricity price leaves the energy cost null, never $0, and
the energy cost is never part of the GPU cost.

Each GPU draws a constant power, so its counter at each scrape is power x
time since its last reset; expected figures are computed here from the
scrapes by that rule (the API shows kWh to 6 decimals).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
from datetime import UTC
from decimal import Decimal

import pytest

from costs.collection import collect_attempt, utc_days
from costs.models import ElectricityPrice, UtilizationRollup
from jobs.models import JobState
from quotas.models import Team
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job_row
from tests.support.personas import make_persona
from tests.support.prometheus import start_prometheus

pytestmark = pytest.mark.django_db
STEP = 30  # seconds between scrapes
DAY0 = dt.datetime(2026, 6, 1, tzinfo=UTC)
BOOT = DAY0 - dt.timedelta(days=10)
PRICE = Decimal("0.1234")  # USD per kWh of the metered cluster
J_PER_KWH = 3.6e6


@dataclasses.dataclass
class Gpu:
    watts: float
    resets: list  # unix seconds at which the counter restarts from 0


@dataclasses.dataclass
class Run:
    name: str  # object name job-<name>-1; also the team slug
    cluster: str
    start: dt.datetime
    end: dt.datetime
    gpus: list
    energy: bool = True  # the exporter reports DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION

    def scrapes(self) -> list[float]:
        t = (int(self.start.timestamp()) // STEP - 2) * STEP + 11  # at second 11 / 41, from before the start
        out = []
        while t < self.end.timestamp() + 3 * STEP:
            out.append(float(t))
            t += STEP
        return out

    def counter_mj(self, gpu: Gpu, t: float) -> float:
        booted = max([BOOT.timestamp(), *(r for r in gpu.resets if r <= t)])
        return gpu.watts * 1000 * (t - booted)

    def expected_kwh(self, lo: dt.datetime | None = None, hi: dt.datetime | None = None) -> float:
        """The energy inside the run and ``[lo, hi)``: at each multiple ``p`` of the scrape interval there, the
        counter at the latest scrape at or before ``p`` less the one at or before ``p - STEP`` (scrapes are 30 s
        apart, well inside the 5-minute lookback), or the former alone where it dropped (a reset)."""
        a, b = max(self.start, lo or self.start).timestamp(), min(self.end, hi or self.end).timestamp()
        scrapes = self.scrapes()
        millijoules = 0.0
        for gpu in self.gpus:
            p = math.ceil(a / STEP) * STEP
            while p < b:
                now, before = (float(f"{self.counter_mj(gpu, max(t for t in scrapes if t <= at)):.0f}")  # as exported
                               for at in (p, p - STEP))
                millijoules += now - before if now >= before else now
                p += STEP
        return millijoules / 1000 / J_PER_KWH


def generated_runs(seed: int = 7) -> list[Run]:
    """Runs on the metered cluster with 0-2 counter resets per GPU at random times (one across midnight), one on a
    metered cluster without an electricity price, one on a cluster whose exporter reports no energy."""
    rng = random.Random(seed)
    runs = []
    for n in range(4):
        start = DAY0 + dt.timedelta(hours=rng.uniform(1, 20), seconds=0.5)
        if n == 0:
            start = DAY0 + dt.timedelta(hours=22, minutes=17, seconds=3)  # across midnight
        end = start + dt.timedelta(hours=rng.uniform(1, 5) if n else 3)
        gpus = [Gpu(rng.uniform(100, 700), sorted(rng.uniform(start.timestamp() + 600, end.timestamp() - 600)
                                                  for _ in range(rng.choice((1, 1, 2)) if n < 3 else 0)))
                for _ in range(rng.choice((1, 2)))]
        runs.append(Run(f"metered{n}", "metered", start, end, gpus))
    runs.append(Run("unpriced", "unpriced", DAY0 + dt.timedelta(hours=3), DAY0 + dt.timedelta(hours=5),
                    [Gpu(400.0, [(DAY0 + dt.timedelta(hours=4, seconds=7)).timestamp()])]))
    runs.append(Run("unmetered", "unmetered", DAY0 + dt.timedelta(hours=3), DAY0 + dt.timedelta(hours=5),
                    [Gpu(400.0, [])], energy=False))
    return runs


def openmetrics(runs: list[Run]) -> str:
    util, energy = [], []
    for run in runs:
        for g, gpu in enumerate(run.gpus):
            labels = (f'{{gpu="{g}",UUID="GPU-{run.name}-{g}",Hostname="node-{run.name}",container="main",'
                      f'namespace="cp-{run.name}",pod="job-{run.name}-1-0-abcde",cluster="{run.cluster}"}}')
            for t in run.scrapes():
                util.append(f"DCGM_FI_DEV_GPU_UTIL{labels} 50 {t:.3f}")
                if run.energy:
                    energy.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{labels} {run.counter_mj(gpu, t):.0f} {t:.3f}")
    return "\n".join(["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", *util,
                      "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter", *energy, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def energy_prometheus(tmp_path_factory):
    runs = generated_runs()
    proc, url = start_prometheus(tmp_path_factory.mktemp("energy"), openmetrics(runs))
    yield url, runs
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def collected(energy_prometheus, settings, catalog):
    """Every run as an attempt with ledger entries (its GPU cost), collected from Prometheus; the metered cluster
    has an electricity price, the others none."""
    url, runs = energy_prometheus
    settings.COSTS_PROMETHEUS_URL = url
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = STEP
    staff = make_persona("finance", staff=True)
    clusters = {name: make_cluster(name, "onprem", "dc1", catalog["H100-80GB"])
                for name in ("metered", "unpriced", "unmetered")}
    ElectricityPrice.objects.create(cluster=clusters["metered"][0], usd_per_kwh=PRICE, effective_from=BOOT,
                                    source="the data centre's tariff")
    attempts = {}
    for run in runs:
        cluster, pool = clusters[run.cluster]
        team = Team.objects.create(slug=run.name, name=run.name)
        job = make_job_row(team, staff.user, catalog["H100-80GB"], name=run.name, gpus_per_node=len(run.gpus),
                           state=JobState.SUCCEEDED)
        attempt = make_attempt(job, cluster, pool, gpus=len(run.gpus), started_at=run.start, ended_at=run.end,
                               state=JobState.SUCCEEDED, object_name=f"job-{run.name}-1")
        for _, lo, hi in utc_days(run.start, run.end):  # the GPU cost, one entry per UTC day of the run
            make_cost_entry(attempt, lo, hi - lo, "5.00")
        collect_attempt(attempt, run.start, run.end)
        attempts[run.name] = attempt
    return {"staff": staff, "runs": {r.name: r for r in runs}, "attempts": attempts}


def costs(collected, **params) -> dict:
    response = collected["staff"].client.get("/api/v1/costs/", params)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_counter_reset_mid_job_gives_the_energy_drawn_never_a_negative_or_a_jump(collected):
    runs = collected["runs"]
    # The class: the counter drops at each reset, so its last value minus its first is negative for such a GPU.
    reset = next(r for r in runs.values() if any(g.resets for g in r.gpus) and r.energy)
    gpu = next(g for g in reset.gpus if g.resets)
    assert reset.counter_mj(gpu, reset.end.timestamp()) < reset.counter_mj(gpu, reset.start.timestamp())
    for row in UtilizationRollup.objects.exclude(energy_kwh=None):
        assert row.energy_kwh >= 0
    by_job = {r["job_name"]: r for r in costs(collected, group_by="job")["results"]}
    for name, run in runs.items():
        if run.energy:
            assert by_job[name]["energy_kwh"] == pytest.approx(run.expected_kwh(), abs=1e-6), name
            # The GPU cost alone: energy is never folded into it.
            assert by_job[name]["cost_usd"] == f"{5 * len(utc_days(run.start, run.end))}.00"
    assert sum(len(g.resets) for r in runs.values() for g in r.gpus) >= 4


def test_energy_per_team_and_day_and_its_cost_at_the_clusters_price(collected):
    runs = collected["runs"]
    metered = [r for r in runs.values() if r.cluster == "metered"]
    by_day = {r["day"]: r for r in costs(collected, group_by="day")["results"]}
    for day in (DAY0, DAY0 + dt.timedelta(days=1)):
        want = sum(r.expected_kwh(day, day + dt.timedelta(days=1)) for r in runs.values() if r.energy)
        assert by_day[day.date().isoformat()]["energy_kwh"] == pytest.approx(want, abs=1e-6)
    by_team = {r["team"]: r for r in costs(collected, group_by="team")["results"]}
    for run in metered:
        row = by_team[run.name]
        assert Decimal(row["energy_cost_usd"]) == pytest.approx(Decimal(repr(run.expected_kwh())) * PRICE,
                                                                abs=Decimal("0.011"))
        assert row["energy_unpriced_kwh"] == 0
    total = costs(collected)["total"]
    assert total["cost_usd"] == f"{sum(5 * len(utc_days(r.start, r.end)) for r in runs.values())}.00"
    assert Decimal(total["energy_cost_usd"]) == pytest.approx(
        sum(Decimal(repr(r.expected_kwh())) * PRICE for r in metered), abs=Decimal("0.02"))
    assert total["energy_unpriced_kwh"] == pytest.approx(runs["unpriced"].expected_kwh(), abs=1e-6)


def test_no_energy_series_is_not_measured_and_no_price_is_unknown_never_zero(collected):
    by_team = {r["team"]: r for r in costs(collected, group_by="team")["results"]}
    assert {k: by_team["unmetered"][k] for k in ("energy_kwh", "energy_cost_usd", "energy_unpriced_kwh")} == \
        dict.fromkeys(("energy_kwh", "energy_cost_usd", "energy_unpriced_kwh"))
    assert UtilizationRollup.objects.get(attempt=collected["attempts"]["unmetered"]).energy_kwh is None
    unpriced = by_team["unpriced"]
    assert unpriced["energy_kwh"] == pytest.approx(collected["runs"]["unpriced"].expected_kwh(), abs=1e-6)
    assert unpriced["energy_cost_usd"] is None and unpriced["energy_unpriced_kwh"] == unpriced["energy_kwh"]
