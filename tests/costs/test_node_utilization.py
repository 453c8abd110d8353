"""GPU utilization per node and UTC day, read in the same pass as each attempt's, through a real Prometheus.

A promtool-built Prometheus holds dcgm-exporter series (``DCGM_FI_DEV_GPU_UTIL``,
pod labels and ``Hostname``) of two nodes: attempt A holds GPUs 0 and 1 of
each (4 GPUs, across a UTC midnight), attempt B GPU 2 of gpu-a, and GPU 3 of
gpu-a belongs to no pod and sits idle all along (unallocated: never counted
as idle). Series carry on a few minutes past each run, and one GPU has a
gap. Expected figures are counted here from the listed scrapes, clipped to
each attempt's run and UTC day: samples, their sum, and the observed and
idle instants under Prometheus' lookback (``tests.support.lookback``).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from datetime import UTC

import pytest

from costs.collection import collect_utilization, periodic_pass, seal_after
from costs.ledger import accrue_attempt
from costs.models import NodeUtilizationRollup, UtilizationRollup
from jobs.models import JobState
from quotas.models import Team
from runners.models import Node
from tests.support import lookback
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import make_persona
from tests.support.prometheus import read_costs_from, serving

pytestmark = pytest.mark.django_db
STEP, LOOKBACK, IDLE = 60, 300, 5.0
T0 = dt.datetime(2026, 4, 7, 22, tzinfo=UTC)
CLUSTER = "nodeutil"
NAMESPACE = "cp-nodeutil"
HOUR = 3600.0
# attempt: (object name, start, end, GPUs, nodes of its placement)
RUNS = {"A": ("train-a", T0, T0 + dt.timedelta(hours=3), 4, ["gpu-a", "gpu-b"]),
        "B": ("train-b", T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2, minutes=30), 1, ["gpu-a"])}
# (node, gpu): (attempt or None, utilization values cycled one per scrape, minutes after T0 without a scrape)
GPUS = {
    ("gpu-a", 0): ("A", [0.0, 50.0, 3.0, 80.0], ()),
    ("gpu-a", 1): ("A", [4.9, 5.0, 100.0], ()),
    ("gpu-b", 0): ("A", [90.0], ()),
    ("gpu-b", 1): ("A", [2.0, 60.0], range(100, 125)),
    ("gpu-a", 2): ("B", [1.0, 4.0, 70.0], ()),
    ("gpu-a", 3): (None, [0.0], ()),
}


def scrapes(attempt: str | None, values: list[float], skip) -> list[tuple[float, float]]:
    """``[(unix seconds, percent)]`` at second 45 of each minute: the run's from a minute before its start to three
    minutes past its end (the pod label outlives the run a little), for no attempt the whole fixture."""
    lo, hi = (T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=5)) if attempt is None else (
        RUNS[attempt][1] - dt.timedelta(minutes=1), RUNS[attempt][2] + dt.timedelta(minutes=3))
    out, t, i = [], int(lo.timestamp()) // STEP * STEP + 45, 0
    while t < hi.timestamp():
        if (t - int(T0.timestamp())) // STEP not in skip:
            out.append((float(t), values[i % len(values)]))
        i += 1
        t += STEP
    return out


SERIES = {key: scrapes(attempt, values, skip) for key, (attempt, values, skip) in GPUS.items()}


def openmetrics() -> str:
    rows = []
    for (node, gpu), (attempt, _, _) in GPUS.items():
        pod = f',namespace="{NAMESPACE}",pod="{RUNS[attempt][0]}-0-x{node[-1]}"' if attempt else ""
        labels = f'{{cluster="{CLUSTER}",gpu="{gpu}",UUID="GPU-{node}-{gpu}",Hostname="{node}"{pod}}}'
        rows += [f"DCGM_FI_DEV_GPU_UTIL{labels} {v:g} {t:.0f}" for t, v in SERIES[(node, gpu)]]
    return "\n".join(["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", *rows, "# EOF"]) + "\n"


def expected() -> dict[tuple[str, dt.date], dict]:
    """Per (node, UTC day): samples, their sum (percent), observed and idle GPU-seconds of the attempts' GPUs, each
    inside its attempt's run."""
    found: dict = defaultdict(lambda: dict.fromkeys(("samples", "util_sum", "observed", "idle"), 0.0))
    for (node, _gpu), (attempt, _, _) in GPUS.items():
        if attempt is None:
            continue
        _, start, end, _, _ = RUNS[attempt]
        midnight = dt.datetime.combine(start.date(), dt.time(), UTC) + dt.timedelta(days=1)
        for lo, hi in ((start, min(end, midnight)), (max(start, midnight), end)):
            if lo >= hi:
                continue
            inside = [v for t, v in SERIES[(node, _gpu)] if lo.timestamp() <= t < hi.timestamp()]
            observed, idle = lookback.instants(SERIES[(node, _gpu)], lo.timestamp(), hi.timestamp(), STEP, LOOKBACK,
                                               IDLE)
            s = found[(node, lo.date())]
            s["samples"] += len(inside)
            s["util_sum"] += sum(inside)
            s["observed"] += observed
            s["idle"] += idle
    return dict(found)


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("node-util"), openmetrics()) as url:
        yield url


@pytest.fixture
def fleet(settings, prometheus_url, catalog):
    read_costs_from(settings, prometheus_url, step=STEP, idle_percent=IDLE, lookback=LOOKBACK)
    staff = make_persona("operator", staff=True)
    team = Team.objects.create(slug="nodeutil", name="Node util")
    h100 = catalog["H100-80GB"]
    cluster, pool = make_cluster(CLUSTER, "aws", "us-east-1", h100, price="4.00")
    for name in ("gpu-a", "gpu-b"):
        Node.objects.create(cluster=cluster, node_pool=pool, name=name, gpus=4, cpu_milli=64_000,
                            memory_mib=512 * 1024, seen_at=T0)
    attempts = {}
    for key, (name, start, end, gpus, nodes) in RUNS.items():
        job = make_job_row(team, staff.user, h100, name=name, gpus_per_node=gpus // len(nodes), nodes=len(nodes),
                           max_runtime=86400, state=JobState.SUCCEEDED)
        attempt = make_attempt(job, cluster, pool, gpus=gpus, started_at=start, ended_at=end,
                               state=JobState.SUCCEEDED, object_name=name)
        attempt.placement = {"nodes": nodes, "gpus_per_node": gpus // len(nodes)}
        attempt.save(update_fields=["placement"])
        accrue_attempt(attempt.pk, until=end)
        attempts[key] = attempt
    return {"staff": staff, "team": team, "cluster": cluster, "attempts": attempts}


def stored() -> dict[tuple[str, dt.date], dict]:
    found: dict = defaultdict(lambda: dict.fromkeys(("samples", "util_sum", "observed", "idle"), 0.0))
    for r in NodeUtilizationRollup.objects.all():
        s = found[(r.node, r.day)]
        s["samples"] += r.samples
        s["util_sum"] += r.util_sum
        s["observed"] += r.observed_gpu_seconds
        s["idle"] += r.idle_gpu_seconds
    return dict(found)


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-6), key


DAY0, DAY2 = dt.datetime(2026, 4, 7, tzinfo=UTC), dt.datetime(2026, 4, 9, tzinfo=UTC)


def test_a_whole_read_splits_each_attempt_by_node_and_day_and_the_idle_gpu_of_no_attempt_counts_nowhere(fleet):
    collect_utilization(DAY0, DAY2)
    want = expected()
    assert {node for node, _ in want} == {"gpu-a", "gpu-b"}
    assert_same(stored(), want)
    # The node rows of an attempt-day add up to its attempt row: one read, split.
    for row in UtilizationRollup.objects.all():
        parts = NodeUtilizationRollup.objects.filter(attempt=row.attempt, day=row.day)
        assert sum(p.samples for p in parts) == row.samples
        assert sum(p.observed_gpu_seconds for p in parts) == pytest.approx(row.observed_gpu_seconds, rel=1e-9)
    # Collected again: replaced, not added.
    collect_utilization(DAY0, DAY2)
    assert_same(stored(), want)


def test_periodic_passes_repeated_hold_exactly_what_one_read_holds(fleet):
    want = expected()
    now = T0 - dt.timedelta(minutes=10)
    last = RUNS["A"][2] + seal_after() + dt.timedelta(hours=1)
    while now <= last:
        periodic_pass(now)
        periodic_pass(now)  # the same instant again: nothing is added twice
        now += dt.timedelta(minutes=15)
    assert UtilizationRollup.objects.filter(sealed=False).count() == 0
    assert_same(stored(), want)


def test_the_api_groups_by_node_and_members_see_only_their_teams(fleet, owner):
    collect_utilization(DAY0, DAY2)
    want = expected()
    answer = fleet["staff"].client.get("/api/v1/utilization/", {"group_by": "node", "start": DAY0.isoformat(),
                                                                "end": DAY2.isoformat()})
    assert answer.status_code == 200, answer.content
    rows = {r["node"]: r for r in answer.json()["results"]}
    assert set(rows) == {"gpu-a", "gpu-b"}
    allocated = {"gpu-a": 2 * 3 + 1 * 1.5, "gpu-b": 2 * 3}  # A: 2 GPUs on each node x 3 h; B: 1 GPU x 1.5 h
    for node, row in rows.items():
        s = [v for (n, _), v in want.items() if n == node]
        observed, idle = sum(v["observed"] for v in s) / HOUR, sum(v["idle"] for v in s) / HOUR
        samples, util_sum = sum(v["samples"] for v in s), sum(v["util_sum"] for v in s)
        assert row["cluster"] == CLUSTER
        assert row["node_id"] == Node.objects.get(name=node).pk
        assert row["gpu_hours"] == pytest.approx(allocated[node], abs=1e-6)
        assert row["observed_gpu_hours"] == pytest.approx(observed, abs=1e-6)
        assert row["idle_gpu_hours"] == pytest.approx(idle, abs=1e-6)
        assert row["unobserved_gpu_hours"] == pytest.approx(max(0.0, allocated[node] - observed), abs=1e-6)
        assert row["avg_gpu_util_percent"] == pytest.approx(util_sum / samples, abs=1e-3)
    # gpu-b's gap leaves some of its allocation unobserved, and no node counts more idle than it observed.
    assert rows["gpu-b"]["unobserved_gpu_hours"] > 0
    assert all(r["idle_gpu_hours"] <= r["observed_gpu_hours"] for r in rows.values())
    outsider = owner.client.get("/api/v1/utilization/", {"group_by": "node", "start": DAY0.isoformat(),
                                                         "end": DAY2.isoformat()}).json()
    assert outsider["results"] == [] and outsider["total"]["observed_gpu_hours"] == 0
    bad = fleet["staff"].client.get("/api/v1/utilization/", {"group_by": "node", "job": "1"})
    assert bad.status_code == 400 and "job" in bad.json()
