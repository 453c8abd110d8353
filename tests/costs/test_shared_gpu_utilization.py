"""Utilization of shared GPUs through a real Prometheus (ADR 0040; docs/design.md, "Shared GPUs"): a GPU's time is
given out exactly once, whatever jobs share it.

A promtool-built Prometheus holds what dcgm-exporter reports of two GPUs: a time-sliced one, with a series per pod
sharing it (``ts-a-0`` ...), each carrying the GPU's own values, as dcgm-exporter maps a shared device to every pod
holding a replica of it; and a GPU cut into seven ``1g.10gb`` MIG devices, a series per device (``GPU_I_ID``)
labelled with the pod holding it (``mig-a-0`` ...), each with values of its own. Hypothesis chooses which pods run,
when, and at what share; the expected figures are counted here from the listed scrapes under Prometheus' lookback
(``tests.support.lookback``), never read from the code under test.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core.gpus import MIG_PROFILES, MILLI_PER_GPU
from core.namespaces import team_namespace
from costs.collection import collect_utilization
from costs.models import NodeUtilizationRollup, UtilizationRollup
from jobs.models import JobState
from quotas.models import Team
from tests.support import lookback
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import make_persona
from tests.support.prometheus import read_costs_from, serving

pytestmark = pytest.mark.django_db
STEP, LOOKBACK, IDLE = 60, 300, 5.0
T0 = dt.datetime(2026, 5, 11, 9, tzinfo=UTC)
SPAN_MINUTES = 180
CLUSTER, TEAM = "sharedgpu", "sharedgpu"
SLOTS = "abcdef"  # the time-sliced GPU's pods
INSTANCES = range(1, 8)  # the MIG GPU's 1g.10gb devices (seven on an H100-80GB)
MIG_SHARE = MIG_PROFILES["H100-80GB"]["1g.10gb"].memory_slices * MILLI_PER_GPU // 8  # 1/8 of the GPU: 125


def scrapes(values: list[float], gap: range = range(0)) -> list[tuple[float, float]]:
    """``[(unix seconds, percent)]`` at second 30 of each minute from 10 minutes before ``T0`` to 10 after the span,
    ``values`` cycled, no scrape in the minutes ``gap`` (after ``T0``)."""
    out, start = [], int(T0.timestamp()) - 600 + 30
    for i in range(SPAN_MINUTES + 20):
        if i - 10 not in gap:
            out.append((float(start + i * STEP), values[i % len(values)]))
    return out


SLICED = scrapes([0.0, 0.0, 30.0, 80.0, 2.0, 0.0, 100.0, 4.0, 50.0], gap=range(60, 72))
DEVICES = {k: scrapes([float((k * 13 + i * 7) % 11 * 10) for i in range(5)], gap=range(20 * k, 20 * k + 8))
           for k in INSTANCES}


def openmetrics(namespace: str) -> str:
    rows = []
    for slot in SLOTS:
        labels = (f'{{cluster="{CLUSTER}",gpu="0",UUID="GPU-ts",Hostname="node-ts",namespace="{namespace}",'
                  f'pod="ts-{slot}-0",container="main"}}')
        rows += [f"DCGM_FI_DEV_GPU_UTIL{labels} {v:g} {t:.0f}" for t, v in SLICED]
    for k, series in DEVICES.items():
        labels = (f'{{cluster="{CLUSTER}",gpu="0",UUID="GPU-mig",Hostname="node-mig",GPU_I_PROFILE="1g.10gb",'
                  f'GPU_I_ID="{k}",namespace="{namespace}",pod="mig-{"abcdefg"[k - 1]}-0",container="main"}}')
        rows += [f"DCGM_FI_DEV_GPU_UTIL{labels} {v:g} {t:.0f}" for t, v in series]
    return "\n".join(["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", *rows, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("shared-gpu"), openmetrics(team_namespace(TEAM))) as url:
        yield url


@pytest.fixture
def world(settings, prometheus_url, catalog):
    read_costs_from(settings, prometheus_url, step=STEP, idle_percent=IDLE, lookback=LOOKBACK)
    staff = make_persona("operator", staff=True)
    team = Team.objects.create(slug=TEAM, name="Shared GPU")
    cluster, pool = make_cluster(CLUSTER, "aws", "us-east-1", catalog["H100-80GB"], price="4.00")
    return {"staff": staff, "team": team, "cluster": cluster, "pool": pool}


@st.composite
def runs(draw, names: str, shares=None) -> list[tuple[str, int, dt.datetime, dt.datetime]]:
    """``[(pod slot, share milli-GPUs, start, end)]``: some of ``names`` run for a while inside the span, starts and
    ends anywhere (seconds too); ``shares`` None: shares drawn in steps of 10 milli-GPUs adding up to at most a
    GPU; else that share each."""
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    left, out = MILLI_PER_GPU, []
    for slot in chosen:
        if shares is None:
            if left < 10:
                break
            share = draw(st.integers(1, left // 10)) * 10
            left -= share
        else:
            share = shares
        start = T0 + dt.timedelta(seconds=draw(st.integers(0, (SPAN_MINUTES - 5) * 60)))
        length = dt.timedelta(seconds=draw(st.integers(60, SPAN_MINUTES * 60)))
        out.append((slot, share, start, min(start + length, T0 + dt.timedelta(minutes=SPAN_MINUTES))))
    return out


def gpu_time(series, lo: dt.datetime, hi: dt.datetime) -> tuple[float, float]:
    """``(observed, idle)`` GPU-seconds of one GPU's (or device's) listed scrapes in ``[lo, hi)``."""
    return lookback.instants(series, lo.timestamp(), hi.timestamp(), STEP, LOOKBACK, IDLE)


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sliced=runs(SLOTS), cut=runs("abcdefg", shares=MIG_SHARE))
def test_a_shared_gpus_time_is_given_out_exactly_once(world, sliced, cut):
    with transaction.atomic():
        attempts = {}
        for prefix, node, group, profile in (("ts", "node-ts", sliced, ""), ("mig", "node-mig", cut, "1g.10gb")):
            for slot, share, start, end in group:
                name = f"{prefix}-{slot}"
                job = make_job_row(world["team"], world["staff"].user, world["pool"].accelerator, name=name,
                                   gpus_per_node=1, state=JobState.SUCCEEDED, gpu_share_milli=share,
                                   mig_profile=profile)
                attempt = make_attempt(job, world["cluster"], world["pool"], gpus=1, started_at=start, ended_at=end,
                                       state=JobState.SUCCEEDED, object_name=name)
                attempt.placement = {"nodes": [node], "gpus_per_node": 1, "cpu_milli": 0, "memory_mib": 0,
                                     "share_milli": share, "mig_profile": profile}
                attempt.save(update_fields=["placement"])
                attempts[name] = (attempt, share, start, end)

        collect_utilization(T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=4))

        rows = {r.attempt.object_name: r for r in UtilizationRollup.objects.select_related("attempt")}
        assert set(rows) == set(attempts)
        given_sliced = [0.0, 0.0]
        for name, (attempt, share, start, end) in attempts.items():
            series = SLICED if name.startswith("ts-") else DEVICES["abcdefg".index(name[-1]) + 1]
            observed, idle = gpu_time(series, start, end)
            row = rows[name]
            # Each pod is given its share of the time of the GPU (or the one MIG device) it holds, no more.
            fraction = share / MILLI_PER_GPU
            assert row.gpu_seconds == pytest.approx(fraction * (end - start).total_seconds(), rel=1e-9)
            assert row.observed_gpu_seconds == pytest.approx(fraction * observed, rel=1e-9, abs=1e-6)
            assert (row.idle_gpu_seconds or 0.0) == pytest.approx(fraction * idle, rel=1e-9, abs=1e-6)
            nodes = NodeUtilizationRollup.objects.filter(attempt=attempt)
            assert {n.node for n in nodes} <= {"node-ts" if name.startswith("ts-") else "node-mig"}
            assert sum(n.observed_gpu_seconds for n in nodes) == pytest.approx(row.observed_gpu_seconds, rel=1e-9,
                                                                               abs=1e-6)
            if name.startswith("ts-"):
                given_sliced[0] += row.observed_gpu_seconds
                given_sliced[1] += row.idle_gpu_seconds or 0.0
        # The pods on the time-sliced GPU together are given at most its time, idle included: what is left is
        # unallocated, never counted twice; with every pod running all along, exactly its time at their shares.
        whole_observed, whole_idle = gpu_time(SLICED, T0, T0 + dt.timedelta(minutes=SPAN_MINUTES))
        assert given_sliced[0] <= whole_observed + 1e-6
        assert given_sliced[1] <= whole_idle + 1e-6
        transaction.set_rollback(True)


def test_every_pod_on_a_gpu_all_along_is_given_all_of_its_time_and_no_more(world):
    """Four pods on the time-sliced GPU for the whole span at 0.4 + 0.3 + 0.2 + 0.1: their observed and idle time
    add up to the GPU's own; nothing is left unallocated."""
    end = T0 + dt.timedelta(minutes=SPAN_MINUTES)
    for slot, share in zip("abcd", (400, 300, 200, 100), strict=True):
        job = make_job_row(world["team"], world["staff"].user, world["pool"].accelerator, name=f"ts-{slot}",
                           gpus_per_node=1, state=JobState.SUCCEEDED, gpu_share_milli=share)
        attempt = make_attempt(job, world["cluster"], world["pool"], gpus=1, started_at=T0, ended_at=end,
                               state=JobState.SUCCEEDED, object_name=f"ts-{slot}")
        attempt.placement = {"nodes": ["node-ts"], "gpus_per_node": 1, "share_milli": share}
        attempt.save(update_fields=["placement"])

    collect_utilization(T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=4))

    observed, idle = gpu_time(SLICED, T0, end)
    assert 0 < idle < observed < (end - T0).total_seconds()  # the data has idle, busy and a gap
    rows = UtilizationRollup.objects.all()
    assert sum(r.observed_gpu_seconds for r in rows) == pytest.approx(observed, rel=1e-9)
    assert sum(r.idle_gpu_seconds for r in rows) == pytest.approx(idle, rel=1e-9)
    assert sum(r.gpu_seconds for r in rows) == pytest.approx((end - T0).total_seconds(), rel=1e-9)
