"""Capacity, allocated and unallocated GPU-hours of a fleet whose nodes join, leave and are cordoned.

Class of failure: the fleet's idle has no figure (only the jobs' own GPU-hours exist, so a cluster of 64 GPU-hours
where one 8 GPU-hour job ran shows nothing of the 56 left unallocated). Invariants, per row of every grouping and
in total: capacity = allocated + unallocated exactly (GPU-seconds); capacity is what node sync observed (each
sighting counts until the next one of the same node within ``NODE_INVENTORY_MAX_GAP_SECONDS``, in the earlier
sighting's state; a longer gap is not capacity); unallocated cost is capacity's cost at the pool's price less the
ledger's; a capacity whose price is unknown is never $0.

The fleet goes through the platform's own node sync (``runners.kubernetes.sync.apply_pools``, what the periodic
sync writes after listing a cluster's Nodes) at simulated instants; expected values come from the generated
sightings alone.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from decimal import Decimal

import pytest
import time_machine
from django.conf import settings

from costs.capacity import (
    GROUPS,
    Resolution,
    _allocation_rows,
    _capacity_rows,
    _cuts,
    capacity_report,
    capacity_reports,
    with_rounding,
)
from costs.models import CostEntry, Price
from costs.rollups import totals_mismatches
from costs.spend import edge_outside, window_parts
from runners.base import NodeInfo, PoolCapacity
from runners.kubernetes.sync import apply_pools
from runners.models import Cluster, NodePool
from tests.support.factories import make_attempt, make_cost_entry, make_job

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 3, 2, 22, 30, tzinfo=dt.UTC)  # the run crosses a UTC midnight
SYNC = dt.timedelta(seconds=60)
PRICES = {"on-demand": Decimal("6.88"), "spot": Decimal("2.20")}  # the seeded catalog, aws us-east-1 H100


def generate(seed: int, syncs: int = 150, nodes: int = 6) -> dict[int, dict[str, tuple[str, int, bool]]]:
    """Sightings: sync index -> {node name: (capacity type, GPUs, schedulable)}. Nodes join and leave at drawn
    syncs, are cordoned for drawn stretches, and one stretch of syncs is missed entirely (the cluster unreachable for
    longer than the gap); single syncs do not run now and then (within the gap). A sync that runs lists every node
    present then, as a Node LIST does."""
    rng = random.Random(seed)
    seen: dict[int, dict] = defaultdict(dict)
    outage = set(range(rng.randrange(40, 90), rng.randrange(95, 110)))
    outage |= {i for i in range(syncs) if rng.random() < 0.05}  # a sync that did not run (within the gap)
    for n in range(nodes):
        ctype = "spot" if n % 3 == 2 else "on-demand"
        gpus = rng.choice([4, 8])
        join, leave = rng.randrange(0, 60), rng.randrange(80, syncs + 1)
        cordon_from = rng.randrange(join, leave)
        cordon_to = cordon_from + rng.randrange(0, 20)
        for i in range(join, leave):
            if i in outage:
                continue
            seen[i][f"node-{n}"] = (ctype, gpus, not cordon_from <= i < cordon_to)
    return {i: seen.get(i, {}) for i in range(syncs) if i not in outage}


def expected(sightings: dict) -> dict[str, dict]:
    """Per node: capacity and cordoned GPU-seconds, each sighting counting until the same node's next sighting if
    that is within the gap, in the earlier sighting's state; and GPU-seconds per UTC day."""
    gap = dt.timedelta(seconds=settings.NODE_INVENTORY_MAX_GAP_SECONDS)
    per_node: dict[str, list] = defaultdict(list)
    for i in sorted(sightings):
        for name, state in sightings[i].items():
            per_node[name].append((T0 + i * SYNC, state))
    out = {}
    for name, seq in per_node.items():
        figures = {"capacity": Decimal(0), "cordoned": Decimal(0), "days": defaultdict(Decimal), "type": seq[0][1][0]}
        for (t, (_ctype, gpus, schedulable)), (u, _next) in zip(seq, seq[1:], strict=False):
            if u - t > gap:
                continue
            seconds = Decimal(int((u - t).total_seconds()))
            figures["capacity"] += gpus * seconds
            if not schedulable:
                figures["cordoned"] += gpus * seconds
            midnight = dt.datetime.combine(u.date(), dt.time(), dt.UTC)
            if t < midnight:  # the interval crosses midnight
                figures["days"][t.date()] += gpus * Decimal(int((midnight - t).total_seconds()))
                figures["days"][u.date()] += gpus * Decimal(int((u - midnight).total_seconds()))
            else:
                figures["days"][t.date()] += gpus * seconds
        out[name] = figures
    return out


def sync_fleet(cluster: Cluster, sightings: dict) -> None:
    """Apply each sync's discovery at its instant, as the periodic node sync would."""
    for i in sorted(sightings):
        pools = defaultdict(list)
        for name, (ctype, gpus, schedulable) in sorted(sightings[i].items()):
            pools[ctype].append(NodeInfo(name=name, gpus=gpus, cpu_milli=96000, memory_mib=1 << 20,
                                         unschedulable=not schedulable, schedulable=schedulable))
        found = [PoolCapacity(name=f"h100-{ctype}", accelerator="H100-80GB", capacity_type=ctype,
                              nodes=sum(n.schedulable for n in nodes), gpus_per_node=max(n.gpus for n in nodes),
                              node_list=tuple(nodes)) for ctype, nodes in pools.items()]
        with time_machine.travel(T0 + i * SYNC, tick=False):
            apply_pools(cluster, found)


@pytest.fixture
def fleet(catalog):
    cluster = Cluster.objects.create(name="aws-use1", provider="aws", region="us-east-1", backend="kubernetes")
    return cluster


def allocate(cluster, teams, user, h100, plan) -> dict[str, Decimal]:
    """Ledger rows for ``plan``: ``(team index, node names, GPUs per node, start sync, end sync)``; returns the
    allocated GPU-seconds per node, computed from the plan."""
    on_demand, _ = NodePool.objects.get_or_create(cluster=cluster, name="h100-on-demand", defaults={
        "accelerator": h100, "capacity_type": "on-demand", "nodes": 0, "gpus_per_node": 8})
    per_node: dict[str, Decimal] = defaultdict(Decimal)
    for k, (team_index, nodes, per, first, last) in enumerate(plan):
        team = teams[team_index]
        job = make_job(team, user, h100, name=f"j{k}", gpus_per_node=per, nodes=len(nodes))
        attempt = make_attempt(job, cluster, on_demand, started_at=T0 + first * SYNC)
        attempt.placement = {"nodes": list(nodes), "gpus_per_node": per}
        attempt.save(update_fields=["placement"])
        lo, hi = T0 + first * SYNC, T0 + last * SYNC
        while lo < hi:  # the ledger cuts entries at every UTC hour
            cut = min(hi, (lo + dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0))
            gpu_hours = Decimal(attempt.gpus) * Decimal(int((cut - lo).total_seconds())) / 3600
            make_cost_entry(attempt, lo, cut - lo, gpu_hours * PRICES["on-demand"], usd_per_gpu_hour="6.88")
            lo = cut
        for node in nodes:
            per_node[node] += per * Decimal((last - first) * 60)
    return per_node


@pytest.mark.parametrize("seed", range(4))
def test_capacity_is_allocated_plus_unallocated_on_a_generated_fleet(fleet, teams, user, h100, seed):
    sightings = generate(seed)
    sync_fleet(fleet, sightings)
    want = expected(sightings)
    on_demand_nodes = sorted(n for n, f in want.items() if f["type"] == "on-demand")
    # two jobs on nodes present from sync 60 to 80 in every draw (join < 60 <= 80 <= leave), one over the outage
    plan = [(0, on_demand_nodes[:1], 2, 60, 75), (1, on_demand_nodes[-1:], 1, 62, 80)]
    allocated = allocate(fleet, teams, user, h100, plan)
    start, end = T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=4)

    rows, total = capacity_report("node", start, end)
    by_node = {r["node"]: r for r in rows}
    assert set(by_node) == {n for n, f in want.items() if f["capacity"]}
    for name, row in by_node.items():
        assert row["capacity_gpu_seconds"] == want[name]["capacity"], name
        assert row["cordoned_gpu_seconds"] == want[name]["cordoned"], name
        assert row["allocated_gpu_seconds"] == allocated.get(name, 0), name
        assert row["capacity_gpu_seconds"] == row["allocated_gpu_seconds"] + row["unallocated_gpu_seconds"]

    capacity = sum(f["capacity"] for f in want.values())
    assert total["capacity_gpu_seconds"] == capacity
    assert total["allocated_gpu_seconds"] == sum(allocated.values())
    assert total["unallocated_gpu_seconds"] == capacity - sum(allocated.values())
    priced = sum(f["capacity"] * PRICES[f["type"]] for f in want.values()) / 3600
    billed = sum(CostEntry.objects.values_list("amount_usd", flat=True))  # the ledger's own amounts
    assert abs(billed - sum(allocated.values()) * PRICES["on-demand"] / 3600) < Decimal("1e-8")
    assert total["unallocated_cost_usd"] == (priced - billed).quantize(Decimal("0.000000001"))

    # whole UTC days read the attempt-day rollups the ledger keeps, partial days the entries: a window of whole days
    # and one cut inside the first and the last day give the same figures, and the rollups agree with the ledger
    assert totals_mismatches() == []
    days = (dt.datetime.combine(T0.date(), dt.time(), dt.UTC), dt.datetime.combine(T0.date(), dt.time(), dt.UTC)
            + dt.timedelta(days=2))
    assert capacity_report("node", *days) == (rows, total)

    # every grouping adds up to the same total, row by row
    for group_by in GROUPS[:-1]:
        rows, again = capacity_report(group_by, start, end)
        assert again == total, group_by
        for field in ("capacity_gpu_seconds", "cordoned_gpu_seconds", "allocated_gpu_seconds"):
            assert sum(r[field] for r in rows) == total[field], (group_by, field)
        for r in rows:
            assert r["capacity_gpu_seconds"] == r["allocated_gpu_seconds"] + r["unallocated_gpu_seconds"]
    days = {r["day"]: r["capacity_gpu_seconds"] for r in capacity_report("day", start, end)[0]}
    want_days = defaultdict(Decimal)
    for f in want.values():
        for day, seconds in f["days"].items():
            want_days[day.isoformat()] += seconds
    assert days == {d: s for d, s in want_days.items() if s}


def observed(sightings: dict, lo: dt.datetime, hi: dt.datetime):
    """Each node's observed stretches clipped to ``[lo, hi)``: ``(node, start, end, (capacity type, GPUs,
    schedulable))``, a sighting counting until the same node's next one within the gap, in the earlier state."""
    gap = dt.timedelta(seconds=settings.NODE_INVENTORY_MAX_GAP_SECONDS)
    per_node: dict[str, list] = defaultdict(list)
    for i in sorted(sightings):
        for name, state in sightings[i].items():
            per_node[name].append((T0 + i * SYNC, state))
    for name, seq in per_node.items():
        for (t, state), (u, _next) in zip(seq, seq[1:], strict=False):
            a, b = max(t, lo), min(u, hi)
            if u - t <= gap and a < b:
                yield name, a, b, state


def seconds(a: dt.datetime, b: dt.datetime) -> Decimal:
    return Decimal(int((b - a).total_seconds())) if b > a else Decimal(0)


CHANGE = T0 + dt.timedelta(minutes=97)  # a price override from 00:07 on the second day, inside both WINDOWS
MIDNIGHT = dt.datetime.combine(T0.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
#: One window inside two hours across a midnight, cutting entries at both ends; one with whole UTC days inside.
WINDOWS = [(T0 + dt.timedelta(minutes=55, seconds=30), T0 + dt.timedelta(minutes=125, seconds=15)),
           (T0 - dt.timedelta(days=1, minutes=10), MIDNIGHT + dt.timedelta(days=1, minutes=20))]


def used_generated_fleet(fleet, teams, user, h100, seed: int) -> tuple[dict, list]:
    """The generated fleet of ``seed`` synced, an on-demand price override from ``CHANGE``, and the ledger of three
    attempts: on three nodes, on two nodes with a remainder (5 GPUs: 3 on the first node named, 2 on the second) and
    on no recorded node. Returns ``(sightings, plan)``, the plan as ``(team index, node names, GPUs, start sync, end
    sync, {node: its GPUs of the attempt})``."""
    sightings = generate(seed)
    sync_fleet(fleet, sightings)
    Price.objects.create(provider="aws", region="us-east-1", accelerator=h100, capacity_type="on-demand",
                         cluster=fleet, usd_per_gpu_hour=Decimal("5.50"), effective_from=CHANGE)
    on_demand_nodes = sorted(n for n, f in expected(sightings).items() if f["type"] == "on-demand")
    pool, _ = NodePool.objects.get_or_create(cluster=fleet, name="h100-on-demand", defaults={
        "accelerator": h100, "capacity_type": "on-demand", "nodes": 0, "gpus_per_node": 8})
    plan = [(0, on_demand_nodes[:3], 24, 60, 78, {n: 8 for n in on_demand_nodes[:3]}),
            (1, [on_demand_nodes[0], on_demand_nodes[-1]], 5, 55, 120, {on_demand_nodes[0]: 3, on_demand_nodes[-1]: 2}),
            (0, [], 2, 50, 140, {"(no node recorded)": 2})]
    for k, (team_index, nodes, gpus, first, last, _shares) in enumerate(plan):
        job = make_job(teams[team_index], user, h100, name=f"j{k}", gpus_per_node=gpus, nodes=1)
        attempt = make_attempt(job, fleet, pool, gpus=gpus, started_at=T0 + first * SYNC)
        attempt.placement = {"nodes": nodes, "gpus_per_node": gpus // max(len(nodes), 1)}
        attempt.save(update_fields=["placement"])
        lo, hi = T0 + first * SYNC, T0 + last * SYNC
        while lo < hi:  # the ledger cuts entries at every UTC hour
            cut = min(hi, (lo + dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0))
            make_cost_entry(attempt, lo, cut - lo, gpus * seconds(lo, cut) * PRICES["on-demand"] / 3600)
            lo = cut
    return sightings, plan


@pytest.mark.parametrize("seed", range(3))
def test_the_figures_equal_the_spans_and_the_ledger_summed_here(fleet, teams, user, h100, seed):
    """The figures as the database sums them (spans clipped per piece of the window, the ledger's attempt-day rollups
    for whole days and its entries clipped at the window's edges, each attempt split over its placement's nodes)
    against the same figures summed here from the generated sightings, the plan and the ledger's entries: two
    windows (one inside two hours across a MIDNIGHT, cutting entries at both ends; one with a whole UTC day between
    its edges), a price override that starts inside them, attempts on three nodes, on two nodes with a remainder
    (5 GPUs: 3 on the first node named, 2 on the second) and on no recorded node; every grouping read together
    (``capacity_reports``, as the Capacity page reads its table and chart) equals each read alone."""
    sightings, plan = used_generated_fleet(fleet, teams, user, h100, seed)
    for lo, hi in WINDOWS:
        capacity, cordoned, cost = defaultdict(Decimal), defaultdict(Decimal), Decimal(0)
        per_day = defaultdict(Decimal)
        for name, a, b, (ctype, gpus, schedulable) in observed(sightings, lo, hi):
            capacity[name] += gpus * seconds(a, b)
            cordoned[name] += 0 if schedulable else gpus * seconds(a, b)
            for day_lo, day_hi in ((a, min(b, MIDNIGHT)), (max(a, MIDNIGHT), b)):
                per_day[day_lo.date().isoformat()] += gpus * seconds(day_lo, day_hi)
            if ctype == "spot":
                cost += gpus * seconds(a, b) * PRICES["spot"] / 3600
            else:
                cost += gpus * (seconds(a, min(b, CHANGE)) * PRICES["on-demand"]
                                + seconds(max(a, CHANGE), b) * Decimal("5.50")) / 3600
        allocated, per_team, allocated_per_day = defaultdict(Decimal), defaultdict(Decimal), defaultdict(Decimal)
        for team_index, _nodes, gpus, first, last, shares in plan:
            a, b = max(lo, T0 + first * SYNC), min(hi, T0 + last * SYNC)
            held = seconds(a, b)
            per_team[teams[team_index].slug] += gpus * held
            for day_lo, day_hi in ((a, min(b, MIDNIGHT)), (max(a, MIDNIGHT), b)):
                allocated_per_day[day_lo.date().isoformat()] += gpus * seconds(day_lo, day_hi)
            for node, share in shares.items():
                allocated[node] += share * held
        billed = sum((e.amount_usd * seconds(max(lo, e.interval_start), min(hi, e.interval_end))
                      / seconds(e.interval_start, e.interval_end) for e in CostEntry.objects.all()), Decimal(0))

        together = capacity_reports(GROUPS, lo, hi)
        for group_by in GROUPS:
            assert together[group_by] == capacity_report(group_by, lo, hi), group_by
        rows, total = together["node"]
        by_node = {r["node"]: r for r in rows}
        assert set(by_node) == {n for n, s in capacity.items() if s} | {n for n, s in allocated.items() if s}
        for name, row in by_node.items():
            assert (row["capacity_gpu_seconds"], row["cordoned_gpu_seconds"], row["allocated_gpu_seconds"]) == (
                capacity[name], cordoned[name], allocated[name]), name
            assert row["capacity_gpu_seconds"] == row["allocated_gpu_seconds"] + row["unallocated_gpu_seconds"]
        for _group_by, (_rows, whole) in together.items():
            assert whole["capacity_gpu_seconds"] == sum(capacity.values())
            assert whole["allocated_gpu_seconds"] == sum(allocated.values())
            assert abs(whole["capacity_cost_usd"] - cost) <= Decimal("1e-9")
            assert abs(whole["allocated_cost_usd"] - billed) <= Decimal("1e-9")
            assert abs(whole["unallocated_cost_usd"] - (cost - billed)) <= Decimal("1e-9")
        days = {d for d in (*per_day, *allocated_per_day) if per_day[d] or allocated_per_day[d]}
        assert {r["day"]: (r["capacity_gpu_seconds"], r["allocated_gpu_seconds"]) for r in together["day"][0]} == {
            d: (per_day[d], allocated_per_day[d]) for d in days}
        team_rows = together["team"][0]
        assert {r["team"]: r["allocated_gpu_hours"] for r in team_rows if r["team"] != "__idle__"} == {
            t: (s / 3600).quantize(Decimal("0.000001")) for t, s in per_team.items() if s}
        idle_hours = (sum(capacity.values()) - sum(allocated.values())) / 3600
        assert abs(sum(r["shared_idle_gpu_hours"] for r in team_rows) - idle_hours) <= Decimal("0.00001")


@pytest.mark.parametrize("seed", range(2))
def test_the_database_and_python_sum_the_same_rows(fleet, teams, user, h100, seed):
    """The database's sums (PostgreSQL) and the same rows summed in Python (what other databases, the demo's SQLite,
    read) agree row for row at every resolution, with and without teams: GPU-seconds exactly, USD to 1e-18 (the
    edge entries' prorated amounts divide at different precisions). Needs PostgreSQL, which ``make test`` uses."""
    used_generated_fleet(fleet, teams, user, h100, seed)
    resolutions = [Resolution(by_node, by_day) for by_node in (False, True) for by_day in (False, True)]

    def keyed(rows, width):
        return {tuple(int(v) if isinstance(v, Decimal) else v for v in r[:width]): r[width:] for r in rows}

    for lo, hi in WINDOWS:
        for res in resolutions:
            cuts = _cuts(lo, hi, res.by_day, list(Price.objects.all()))
            assert keyed(_capacity_rows(lo, hi, None, res, cuts, in_database=True), 6) == keyed(
                _capacity_rows(lo, hi, None, res, cuts, in_database=False), 6), res
            for by_team in (False, True):
                here = keyed(_allocation_rows(lo, hi, None, res, by_team, in_database=False), 9)
                sql = keyed(_allocation_rows(lo, hi, None, res, by_team, in_database=True, edges="entries"), 9)
                # The edge days read as their rollups less the entries reaching outside the window: the same sums.
                assert keyed(_allocation_rows(lo, hi, None, res, by_team, in_database=True, edges="rollups"),
                             9) == sql, (res, by_team)
                assert set(sql) == set(here), (res, by_team)
                for key, (gpu_s, usd, unpriced) in sql.items():
                    assert (gpu_s, unpriced) == (here[key][0], here[key][2]), (res, by_team, key)
                    assert abs(usd - here[key][1]) <= Decimal("1e-18"), (res, by_team, key)


def test_the_fleet_of_64_gpu_hours_with_one_8_gpu_hour_job(fleet, teams, user, h100):
    """Two 8-GPU nodes seen for 4 hours (64 GPU-hours); one job of 8 GPUs ran 1 hour: 56 GPU-hours unallocated,
    at 6.88 USD per GPU-hour 385.28 USD; shared to the one team that used the cluster, as OpenCost's shareIdle."""
    sightings = {i: {"node-a": ("on-demand", 8, True), "node-b": ("on-demand", 8, True)} for i in range(241)}
    sync_fleet(fleet, sightings)
    allocate(fleet, teams, user, h100, [(0, ["node-a"], 8, 60, 120)])
    rows, total = capacity_report("cluster", T0, T0 + dt.timedelta(hours=4))
    assert total["capacity_gpu_hours"] == Decimal(64)
    assert total["allocated_gpu_hours"] == Decimal(8)
    assert total["unallocated_gpu_hours"] == Decimal(56)
    assert total["unallocated_cost_usd"] == Decimal("385.28")
    assert total["capacity_cost_usd"] == Decimal(64) * Decimal("6.88")
    teams_rows, _ = capacity_report("team", T0, T0 + dt.timedelta(hours=4))
    assert [(r["team"], r["allocated_gpu_hours"], r["shared_idle_gpu_hours"], r["total_cost_usd"])
            for r in teams_rows] == [(teams[0].slug, Decimal(8), Decimal(56), Decimal("440.32"))]


def test_unpriced_capacity_is_unknown_not_zero(catalog, teams, user):
    """A cluster in a region the catalog has no price for: capacity counted, its cost None, every GPU-hour of it
    counted as unpriced."""
    cluster = Cluster.objects.create(name="onprem", provider="onprem", region="lab", backend="kubernetes")
    assert not Price.objects.filter(provider="onprem").exists()
    sync_fleet(cluster, {i: {"node-a": ("on-demand", 8, True)} for i in range(61)})
    rows, total = capacity_report("cluster", T0, T0 + dt.timedelta(hours=2))
    assert total["capacity_gpu_hours"] == Decimal(8)
    assert total["capacity_cost_usd"] is None and total["unallocated_cost_usd"] is None
    assert total["unpriced_unallocated_gpu_hours"] == Decimal(8)


def test_a_gap_longer_than_the_setting_is_not_capacity(fleet, settings):
    settings.NODE_INVENTORY_MAX_GAP_SECONDS = 120
    sightings = {i: {"node-a": ("on-demand", 8, True)} for i in [0, 1, 3, 6, 7]}  # gaps of 60, 120, 180, 60 s
    sync_fleet(fleet, sightings)
    _, total = capacity_report("cluster", T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=1))
    assert total["capacity_gpu_seconds"] == 8 * Decimal(60 + 120 + 60)


def test_a_second_delivery_of_one_sync_counts_nothing_twice(fleet):
    sightings = {i: {"node-a": ("on-demand", 8, i not in (3, 4))} for i in range(8)}
    for i in sorted(sightings):
        sync_fleet(fleet, {i: sightings[i]})
        sync_fleet(fleet, {i: sightings[i]})  # the same sync delivered again
    _, total = capacity_report("cluster", T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=1))
    assert total["capacity_gpu_seconds"] == 8 * Decimal(7 * 60)
    assert total["cordoned_gpu_seconds"] == 8 * Decimal(2 * 60)


@pytest.mark.parametrize("group_by,start,end", [("pod", T0, T0 + SYNC), ("node", T0, T0)])
def test_bad_queries_raise(db, group_by, start, end):
    with pytest.raises(ValueError):
        capacity_report(group_by, start, end)


def test_rows_that_miss_the_total_by_rounding_say_by_how_much(fleet):
    """Three 1-GPU nodes seen for 7 minutes: each costs 420 s x 6.88 USD per GPU-hour = 0.80266... (0.80 shown),
    the three 2.408 (2.41 shown), so the rows miss the total by 0.01 and the total says so."""
    sync_fleet(fleet, {i: {f"n{k}": ("on-demand", 1, True) for k in range(3)} for i in range(8)})
    rows, total = capacity_report("node", T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=1))
    shown, whole = with_rounding(rows, total)
    per_node = Decimal(420) * PRICES["on-demand"] / 3600
    cent = Decimal("0.01")
    assert [r["capacity_cost_usd"] for r in shown] == [str(per_node.quantize(cent))] * 3 == ["0.80"] * 3
    assert whole["capacity_cost_usd"] == str((3 * per_node).quantize(cent)) == "2.41"
    assert whole["rounding_difference_usd"] == {"capacity_cost_usd": "0.01", "unallocated_cost_usd": "0.01"}


def test_a_cluster_without_node_inventory_has_unknown_capacity_not_a_negative_one(fleet, catalog, teams, user, h100):
    """Billed on a cluster whose nodes no sync ever listed: allocated as billed, capacity and unallocated unknown
    (None) for its row, and the fleet's identity holds with that allocation set apart."""
    sync_fleet(fleet, {i: {"node-a": ("on-demand", 8, True)} for i in range(61)})  # 8 GPU-h of capacity
    dark = Cluster.objects.create(name="dark", provider="aws", region="us-east-1", backend="kubernetes")
    allocate(dark, teams, user, h100, [(0, ["x"], 2, 0, 30)])  # 1 GPU-h billed, no inventory
    rows, total = capacity_report("cluster", T0 - dt.timedelta(hours=1), T0 + dt.timedelta(hours=2))
    by_name = {r["cluster"]: r for r in rows}
    assert by_name["dark"]["allocated_gpu_hours"] == Decimal(1)
    assert by_name["dark"]["capacity_gpu_hours"] is None and by_name["dark"]["unallocated_cost_usd"] is None
    assert by_name["aws-use1"]["unallocated_gpu_hours"] == Decimal(8)
    assert total["uninventoried_allocated_gpu_hours"] == Decimal(1)
    assert total["capacity_gpu_seconds"] == (total["allocated_gpu_seconds"] - total["uninventoried_allocated_gpu_seconds"]
                                             + total["unallocated_gpu_seconds"])


def test_a_staff_cordon_is_cordoned_capacity_from_the_cordon_to_the_uncordon(fleet, staff):
    """node-a (8 GPUs) seen every minute for an hour; staff cordon it in the platform (Kubernetes still schedules on
    it) 20 s after the 10th sync and lift the cordon 40 s after the 25th: 8 GPUs x 920 s are cordoned capacity."""
    from runners import health
    from runners.models import Node

    node = {"node-a": ("on-demand", 8, True)}
    cordoned_at, uncordoned_at = T0 + 10 * SYNC + dt.timedelta(seconds=20), T0 + 25 * SYNC + dt.timedelta(seconds=40)
    sync_fleet(fleet, {i: node for i in range(0, 11)})
    with time_machine.travel(cordoned_at, tick=False):
        health.cordon(Node.objects.get(cluster=fleet, name="node-a"), staff.user, "reseat GPU 3")
    sync_fleet(fleet, {i: node for i in range(11, 26)})
    with time_machine.travel(uncordoned_at, tick=False):
        health.uncordon(Node.objects.get(cluster=fleet, name="node-a"), staff.user)
    sync_fleet(fleet, {i: node for i in range(26, 61)})
    rows, total = capacity_report("node", T0, T0 + dt.timedelta(hours=1))
    want = 8 * Decimal((uncordoned_at - cordoned_at).total_seconds())
    assert (total["capacity_gpu_seconds"], total["cordoned_gpu_seconds"]) == (8 * Decimal(3600), want)
    assert [(r["node"], r["cordoned_gpu_seconds"]) for r in rows] == [("node-a", want)]


#: Windows whose edge days hold entries cut by the window: at its start, at its end, at both ends of one entry (an
#: attempt's 00:00-00:50 entry of the second day), and one after an attempt's last entry of that day.
EDGE_WINDOWS = [(T0 + dt.timedelta(minutes=62), MIDNIGHT), (MIDNIGHT + dt.timedelta(minutes=10), MIDNIGHT +
                 dt.timedelta(minutes=40, seconds=30)), (MIDNIGHT + dt.timedelta(minutes=35), MIDNIGHT +
                 dt.timedelta(hours=2)), (T0 + dt.timedelta(minutes=49), T0 + dt.timedelta(minutes=61, seconds=7))]


def test_edge_days_read_from_their_rollups_less_the_entries_reaching_outside_give_the_same_allocation(
        fleet, teams, user, h100):
    """The allocation of windows whose edges cut entries, the edge days read as their attempt-day rollups less the
    entries reaching outside the window, equals the edges' entries clipped (exactly), the same rows summed in Python
    (USD to 1e-18) and, in GPU-seconds, each planned attempt's GPUs x its run's seconds inside the window."""
    _sightings, plan = used_generated_fleet(fleet, teams, user, h100, 0)
    resolutions = [Resolution(by_node, by_day) for by_node in (False, True) for by_day in (False, True)]

    def keyed(rows):
        return {tuple(int(v) if isinstance(v, Decimal) else v for v in r[:9]): r[9:] for r in rows}

    for lo, hi in EDGE_WINDOWS:
        assert all(edge_outside(a, b, hi, "rollups") for a, b in window_parts(lo, hi).edges)  # read from rollups
        planned = sum((gpus * seconds(max(lo, T0 + first * SYNC), min(hi, T0 + last * SYNC))
                       for _team, _nodes, gpus, first, last, _shares in plan), Decimal(0))
        for res in resolutions:
            for by_team in (False, True):
                rows = _allocation_rows(lo, hi, None, res, by_team, in_database=True, edges="rollups")
                assert keyed(rows) == keyed(_allocation_rows(lo, hi, None, res, by_team, in_database=True,
                                                             edges="entries")), (lo, res, by_team)
                here = keyed(_allocation_rows(lo, hi, None, res, by_team, in_database=False))
                assert set(keyed(rows)) == set(here), (lo, res, by_team)
                for key, (gpu_s, usd, unpriced) in keyed(rows).items():
                    assert (gpu_s, unpriced) == (here[key][0], here[key][2]), (lo, res, by_team, key)
                    assert abs(usd - here[key][1]) <= Decimal("1e-18"), (lo, res, by_team, key)
                share = {True: lambda r: r[9] * r[5] / r[6], False: lambda r: r[9]}[res.by_node]
                assert sum((share(r) for r in rows), Decimal(0)) == planned, (lo, res, by_team)
