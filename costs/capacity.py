"""Capacity, allocated and unallocated GPU-hours of the fleet and their cost, as OpenCost has them.

- **Capacity**: allocatable GPUs x the time each node was present, from the node inventory over time
  (``runners.NodeSpan``: what node sync saw; time nobody observed is not capacity). Cordoned capacity (the node was
  not schedulable: cordoned, not Ready or tainted against the platform's pods) is part of capacity and shown apart.
- **Allocated**: the GPU-seconds and USD the ledger charged on that cluster, pool, node and day, read from the
  attempt-day rollups the ledger keeps (``AttemptDailyCost``) for whole UTC days and from the entries, clipped, at a
  window's edges; an attempt's GPUs are split over the nodes placement chose for it (``JobAttempt.placement``).
- **Unallocated** = capacity - allocated, in GPU-seconds and in USD at the pool's price in force at each instant
  (``costs.catalog``); GPU-seconds with no price in force are counted apart (``unpriced_*``), never as $0.
- **Idle inside allocation**: allocated GPU-seconds the GPUs spent idle, from the utilization rollups
  (``UtilizationRollup.idle_gpu_seconds``); None where nothing was measured.
- **Shared idle** (``group_by="team"``): each cluster-day's unallocated GPU-seconds and cost are shared to the teams
  in proportion to their allocated GPU-seconds on that cluster that day, as OpenCost's ``shareIdle`` does
  (https://opencost.io/docs/integrations/api/ , parameter ``shareIdle``); a cluster-day nobody used stays with
  the ``__idle__`` row, OpenCost's name for it.

Every figure is a sum over buckets (cluster, pool, node, UTC day, price), so each grouping adds up: per row and in
total, ``capacity_gpu_seconds == allocated_gpu_seconds - uninventoried_allocated_gpu_seconds +
unallocated_gpu_seconds`` exactly (Decimal seconds at microsecond resolution). ``uninventoried_*`` is the allocation
on clusters whose nodes no sync listed in the window (before a cluster's first node sync, or a runner without
one): it is billed, so it is allocated, but there is no capacity to hold it against; a row made only of it has
its capacity and unallocated figures None (unknown), never 0 or below.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from decimal import Decimal
from typing import NamedTuple

from django.db.models import Sum

from core.money import LEDGER_QUANTUM, rounding_difference, usd_cents
from jobs.models import JobAttempt
from quotas.models import Team
from runners.models import Accelerator, Cluster, NodeSpan

from .catalog import NoPrice, prices_by_pool, row_at
from .models import AttemptDailyCost, CostEntry, Price, UtilizationRollup
from .spend import exact_seconds, utc_midnight

#: The longest window one capacity query may cover, days: a bound on the server time of one answer.
MAX_WINDOW_DAYS = 93
GROUPS = ("cluster", "node_pool", "node", "accelerator", "day", "team")
IDLE_ROW = "__idle__"
HOUR = Decimal(3600)
ZERO = Decimal(0)


class PoolRef(NamedTuple):
    """What a price lookup needs of a node pool (``catalog.prices_by_pool``), kept on the spans themselves so a
    deleted pool's capacity is still priced: ``pk`` is a stable key, not a NodePool id."""

    pk: tuple
    cluster: Cluster
    cluster_id: int
    accelerator_id: int
    capacity_type: str
    accelerator: Accelerator


@dataclasses.dataclass
class Bucket:
    """Sums of one (cluster, pool, node, UTC day): GPU-seconds (Decimal) and USD (Decimal)."""

    capacity: Decimal = ZERO
    cordoned: Decimal = ZERO
    capacity_cost: Decimal = ZERO
    capacity_unpriced: Decimal = ZERO
    allocated: Decimal = ZERO
    allocated_cost: Decimal = ZERO
    allocated_unpriced: Decimal = ZERO
    # the part of ``allocated`` on clusters whose nodes no sync listed in the window (no inventory: no capacity)
    outside: Decimal = ZERO
    outside_cost: Decimal = ZERO
    outside_unpriced: Decimal = ZERO

    def add(self, other: Bucket) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def _days(lo: dt.datetime, hi: dt.datetime):
    """``[lo, hi)`` cut at UTC midnights: ``(day, piece_lo, piece_hi)``."""
    while lo < hi:
        day = lo.astimezone(dt.UTC).date()
        cut = min(hi, utc_midnight(day + dt.timedelta(days=1)))
        yield day, lo, cut
        lo = cut


def _priced_pieces(pool: PoolRef, rows: list[Price], lo: dt.datetime, hi: dt.datetime):
    """``[lo, hi)`` cut where the pool's price changes: ``(piece_lo, piece_hi, USD per GPU-hour or None)``."""
    cuts = sorted({lo, hi} | {r.effective_from for r in rows if lo < r.effective_from < hi})
    for a, b in zip(cuts, cuts[1:], strict=False):
        try:
            price = row_at(pool, a, rows).usd_per_gpu_hour
        except NoPrice:
            price = None
        yield a, b, price


def _pool_key(cluster_id: int, pool_name: str, accelerator_id: int, capacity_type: str) -> tuple:
    return (cluster_id, pool_name, accelerator_id, capacity_type)


def _capacity(buckets: dict, start: dt.datetime, end: dt.datetime, cluster_ids) -> set[int]:
    spans = NodeSpan.objects.filter(start__lt=end, end__gt=start).select_related("cluster", "accelerator")
    if cluster_ids is not None:
        spans = spans.filter(cluster_id__in=cluster_ids)
    spans = list(spans)
    refs = {}
    for s in spans:
        key = _pool_key(s.cluster_id, s.pool_name, s.accelerator_id, s.capacity_type)
        refs.setdefault(key, PoolRef(key, s.cluster, s.cluster_id, s.accelerator_id, s.capacity_type,
                                      s.accelerator))
    rows = Price.objects.filter(accelerator_id__in={r.accelerator_id for r in refs.values()})
    prices = prices_by_pool(list(refs.values()), rows)
    for s in spans:
        key = _pool_key(s.cluster_id, s.pool_name, s.accelerator_id, s.capacity_type)
        for day, lo, hi in _days(max(s.start, start), min(s.end, end)):
            bucket = buckets[(key, s.node_name, day)]
            for a, b, price in _priced_pieces(refs[key], prices[key], lo, hi):
                gpu_s = s.gpus * exact_seconds(b - a)
                bucket.capacity += gpu_s
                if not s.schedulable:
                    bucket.cordoned += gpu_s
                if price is None:
                    bucket.capacity_unpriced += gpu_s
                else:
                    bucket.capacity_cost += gpu_s * price / HOUR
    return {s.cluster_id for s in spans}


def _node_shares(placement: dict, gpus: int) -> list[tuple[str, int]]:
    """An attempt's GPUs per node of its placement (whole GPUs, the remainder on the first node); ``[("", gpus)]``
    when placement named no nodes."""
    names = [str(n) for n in (placement or {}).get("nodes") or []]
    if not names:
        return [("", gpus)]
    each, rest = divmod(gpus, len(names))
    shares: dict[str, int] = defaultdict(int)
    for i, name in enumerate(names):
        shares[name] += each + (rest if i == 0 else 0)
    return list(shares.items())


def _edge_sums(sums: dict, lo: dt.datetime, hi: dt.datetime, cluster_ids, pools: dict | None) -> None:
    """Add the GPU entries inside ``[lo, hi)`` (a part of one UTC day) to ``sums``, each clipped to it and its
    amount prorated by the seconds kept (entries never cross a UTC hour, ``spend.ENTRY_SPAN``). ``pools``: attempt
    id -> (pool name, capacity type) to key by pool instead of by attempt (filled here)."""
    entries = CostEntry.objects.filter(interval_start__lt=hi, interval_end__gt=lo, gpus__gt=0)
    if cluster_ids is not None:
        entries = entries.filter(cluster_id__in=cluster_ids)
    rows = list(entries.values_list("attempt_id", "cluster_id", "accelerator_id", "team_id", "gpus", "interval_start",
                                    "interval_end", "amount_usd"))
    if pools is not None:
        missing = {r[0] for r in rows} - set(pools)
        pools.update((pk, (name, ctype)) for pk, name, ctype in JobAttempt.objects.filter(pk__in=missing).values_list(
            "pk", "node_pool__name", "node_pool__capacity_type"))
    for attempt_id, cluster_id, acc_id, team_id, gpus, a, b, amount in rows:
        whole, kept = exact_seconds(b - a), exact_seconds(min(b, hi) - max(a, lo))
        owner = attempt_id if pools is None else pools[attempt_id]
        s = sums[(owner, a.astimezone(dt.UTC).date(), cluster_id, acc_id, team_id)]
        s[0] += gpus * kept
        if amount is None:
            s[2] += gpus * kept
        else:
            s[1] += amount * kept / whole


def _attempt_days(start: dt.datetime, end: dt.datetime, cluster_ids, by_node: bool = True) -> dict[tuple, list]:
    """The ledger's GPU allocation inside ``[start, end)`` per (owner, UTC day, cluster, accelerator, team):
    ``[GPU-seconds, USD (priced), GPU-seconds without a price]`` (Decimal); the owner is the attempt id
    (``by_node``: its placement splits it over nodes) or its pool's ``(name, capacity type)``. Whole UTC days come
    from the attempt-day rollups the ledger keeps (``AttemptDailyCost``; summed per pool, team and day by the
    database when not ``by_node``); the partial days at the window's edges from the entries, clipped."""
    sums: dict[tuple, list] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    pools = None if by_node else {}
    first = start.astimezone(dt.UTC).date()
    if utc_midnight(first) < start:
        first += dt.timedelta(days=1)
    last = end.astimezone(dt.UTC).date()  # whole days are [first, last)
    if first >= last:
        _edge_sums(sums, start, end, cluster_ids, pools)
        return sums
    if start < utc_midnight(first):
        _edge_sums(sums, start, utc_midnight(first), cluster_ids, pools)
    if utc_midnight(last) < end:
        _edge_sums(sums, utc_midnight(last), end, cluster_ids, pools)
    rows = AttemptDailyCost.objects.filter(day__gte=first, day__lt=last, gpu_seconds__gt=0)
    if cluster_ids is not None:
        rows = rows.filter(cluster_id__in=cluster_ids)
    owner = ("attempt_id",) if by_node else ("attempt__node_pool__name", "attempt__node_pool__capacity_type")
    keys = ("day", "cluster_id", "accelerator_id", "team_id")
    for row in rows.values(*owner, *keys).annotate(g=Sum("gpu_seconds"), c=Sum("cost_usd"),
                                                   u=Sum("unpriced_gpu_seconds")).order_by():
        who = row["attempt_id"] if by_node else (row["attempt__node_pool__name"],
                                                 row["attempt__node_pool__capacity_type"])
        s = sums[(who, *(row[k] for k in keys))]
        s[0] += row["g"]
        s[1] += row["c"]
        s[2] += row["u"]
    return sums


def _allocated(buckets: dict, teams: dict, start: dt.datetime, end: dt.datetime, cluster_ids,
               inventoried: set[int], by_node: bool) -> None:
    """Add the ledger's allocation to ``buckets`` (per pool, node and day) and ``teams`` (per cluster, day and
    team). ``by_node``: each attempt split over its placement's nodes; otherwise summed per pool and left on no
    node, for groupings that do not show nodes (a few thousand rows for a month instead of one per attempt and
    day)."""
    sums = _attempt_days(start, end, cluster_ids, by_node)
    attempts = {pk: row for pk, *row in JobAttempt.objects.filter(pk__in={k[0] for k in sums}).values_list(
        "pk", "node_pool__name", "node_pool__capacity_type", "placement", "gpus")} if by_node else {}
    for (owner, day, cluster_id, acc_id, team_id), (gpu_s, usd, unpriced) in sums.items():
        if by_node:
            pool_name, ctype, placement, gpus = attempts[owner]
            shares = _node_shares(placement, gpus)
        else:
            (pool_name, ctype), gpus, shares = owner, 1, [("", 1)]
        key = _pool_key(cluster_id, pool_name, acc_id, ctype)
        team = teams[(cluster_id, day, team_id)]
        for node, share in shares:
            part = Decimal(1) if share == gpus else Decimal(share) / Decimal(gpus)
            bucket = buckets[(key, node, day)]
            for b in (bucket, team):
                b.allocated += gpu_s * part
                b.allocated_unpriced += unpriced * part
                b.allocated_cost += usd * part
            if cluster_id not in inventoried:
                bucket.outside += gpu_s * part
                bucket.outside_unpriced += unpriced * part
                bucket.outside_cost += usd * part


def _idle(start: dt.datetime, end: dt.datetime, cluster_ids) -> dict[tuple, float]:
    """Idle GPU-seconds inside allocation per (pool key, day), where the rollups measured any."""
    first, last = start.astimezone(dt.UTC).date(), (end - dt.timedelta(microseconds=1)).astimezone(dt.UTC).date()
    rollups = UtilizationRollup.objects.filter(day__gte=first, day__lte=last, idle_gpu_seconds__isnull=False)
    if cluster_ids is not None:
        rollups = rollups.filter(cluster_id__in=cluster_ids)
    idle: dict[tuple, float] = defaultdict(float)
    for cluster_id, name, acc_id, ctype, day, seconds in rollups.values_list(
            "cluster_id", "attempt__node_pool__name", "accelerator_id", "attempt__node_pool__capacity_type", "day",
            "idle_gpu_seconds"):
        idle[(_pool_key(cluster_id, name, acc_id, ctype), day)] += seconds
    return idle


def _hours(seconds: Decimal) -> Decimal:
    return (seconds / HOUR).quantize(Decimal("0.000001"))


def _usd(amount: Decimal) -> Decimal:
    return amount.quantize(LEDGER_QUANTUM)


def _present(b: Bucket, idle: float | None) -> dict:
    """The figures of one row. A cost whose GPU-seconds all lack a price is None (unknown), never 0; a partly priced
    one is the priced part, with the unpriced GPU-hours beside it."""
    inside = b.allocated - b.outside
    unallocated = b.capacity - inside
    figures = {
        "capacity_gpu_seconds": b.capacity, "cordoned_gpu_seconds": b.cordoned,
        "allocated_gpu_seconds": b.allocated, "unallocated_gpu_seconds": unallocated,
        "uninventoried_allocated_gpu_seconds": b.outside,
        "capacity_gpu_hours": _hours(b.capacity), "cordoned_gpu_hours": _hours(b.cordoned),
        "allocated_gpu_hours": _hours(b.allocated), "unallocated_gpu_hours": _hours(unallocated),
        "uninventoried_allocated_gpu_hours": _hours(b.outside),
        "idle_allocated_gpu_hours": None if idle is None else _hours(Decimal(repr(idle))),
        "capacity_cost_usd": _known(b.capacity_cost, b.capacity, b.capacity_unpriced),
        "allocated_cost_usd": _known(b.allocated_cost, b.allocated, b.allocated_unpriced),
        "unallocated_cost_usd": _known(b.capacity_cost - (b.allocated_cost - b.outside_cost), b.capacity,
                                       b.capacity_unpriced),
        "unpriced_capacity_gpu_hours": _hours(b.capacity_unpriced),
        "unpriced_allocated_gpu_hours": _hours(b.allocated_unpriced),
        "unpriced_unallocated_gpu_hours": _hours(b.capacity_unpriced - (b.allocated_unpriced - b.outside_unpriced)),
    }
    if not b.capacity and b.outside:  # no node of it was ever listed: its capacity is unknown, not 0
        for key in ("capacity_gpu_seconds", "cordoned_gpu_seconds", "unallocated_gpu_seconds", "capacity_gpu_hours",
                    "cordoned_gpu_hours", "unallocated_gpu_hours", "capacity_cost_usd", "unallocated_cost_usd",
                    "unpriced_capacity_gpu_hours", "unpriced_unallocated_gpu_hours"):
            figures[key] = None
    return figures


def _label(group_by: str, pool_key: tuple, node: str, day: dt.date, names: dict) -> tuple:
    cluster_id, pool_name, acc_id, ctype = pool_key
    if group_by == "cluster":
        return (names["cluster"][cluster_id],)
    if group_by == "node_pool":
        return (names["cluster"][cluster_id], pool_name, names["accelerator"][acc_id], ctype)
    if group_by == "node":
        return (names["cluster"][cluster_id], node or "(no node recorded)")
    if group_by == "accelerator":
        return (names["accelerator"][acc_id],)
    return (day.isoformat(),)


LABEL_FIELDS = {"cluster": ("cluster",), "node_pool": ("cluster", "node_pool", "accelerator", "capacity_type"),
                "node": ("cluster", "node"), "accelerator": ("accelerator",), "day": ("day",)}


def _share_idle(buckets: dict, teams: dict, team_names: dict) -> list[dict]:
    """Team rows: each cluster-day's unallocated GPU-seconds and cost shared by allocated GPU-seconds."""
    per_cluster_day: dict[tuple, Bucket] = defaultdict(Bucket)
    for (pool_key, _node, day), b in buckets.items():
        per_cluster_day[(pool_key[0], day)].add(b)
    users: dict[tuple, list] = defaultdict(list)
    for (cluster_id, day, team_id), t in teams.items():
        users[(cluster_id, day)].append((team_id, t))
    rows: dict[object, dict] = defaultdict(lambda: defaultdict(Decimal))
    for cd, whole in per_cluster_day.items():
        idle_s = whole.capacity - (whole.allocated - whole.outside)
        idle_usd = whole.capacity_cost - (whole.allocated_cost - whole.outside_cost)
        idle_unpriced = whole.capacity_unpriced - (whole.allocated_unpriced - whole.outside_unpriced)
        holders = [(tid, t) for tid, t in users.get(cd, []) if t.allocated > 0]
        total = sum((t.allocated for _tid, t in holders), ZERO)
        if not holders:
            holders, total = [(IDLE_ROW, Bucket(allocated=Decimal(1)))], Decimal(1)
        for tid, t in holders:
            row = rows[tid]
            share = t.allocated / total
            row["shared_idle_gpu_seconds"] += idle_s * share
            row["shared_idle_cost_usd"] += idle_usd * share
            row["unpriced_shared_idle_gpu_seconds"] += idle_unpriced * share
    for (_c, _d, tid), t in teams.items():
        rows[tid]["allocated_gpu_seconds"] += t.allocated
        rows[tid]["allocated_cost_usd"] += t.allocated_cost
        rows[tid]["unpriced_allocated_gpu_seconds"] += t.allocated_unpriced
    out = []
    for tid, r in sorted(rows.items(), key=lambda kv: str(team_names.get(kv[0], kv[0]))):
        allocated = _known(r["allocated_cost_usd"], r["allocated_gpu_seconds"], r["unpriced_allocated_gpu_seconds"])
        shared = _known(r["shared_idle_cost_usd"], r["shared_idle_gpu_seconds"],
                        r["unpriced_shared_idle_gpu_seconds"])
        out.append({
            "team": team_names.get(tid, tid),
            "allocated_gpu_hours": _hours(r["allocated_gpu_seconds"]),
            "allocated_cost_usd": allocated,
            "unpriced_allocated_gpu_hours": _hours(r["unpriced_allocated_gpu_seconds"]),
            "shared_idle_gpu_hours": _hours(r["shared_idle_gpu_seconds"]),
            "shared_idle_cost_usd": shared,
            "unpriced_shared_idle_gpu_hours": _hours(r["unpriced_shared_idle_gpu_seconds"]),
            "total_cost_usd": None if allocated is None and shared is None else _usd(
                r["allocated_cost_usd"] + r["shared_idle_cost_usd"]),
        })
    return out


def _known(cost: Decimal, gpu_seconds: Decimal, unpriced: Decimal) -> Decimal | None:
    """``cost`` to the ledger's quantum, or None when every one of its GPU-seconds lacks a price."""
    return None if unpriced > 0 and unpriced == gpu_seconds else _usd(cost)


def capacity_report(group_by: str, start: dt.datetime, end: dt.datetime, *, cluster_ids=None,
                    team_ids=None) -> tuple[list[dict], dict]:
    """Capacity, cordoned, allocated, unallocated and idle GPU-hours and their USD over ``[start, end)`` (aware UTC).

    ``group_by``: one of ``GROUPS``. ``cluster_ids``: only these clusters (None: all). ``team_ids``: with
    ``group_by="team"``, the team rows returned (None: all; the shares are always computed over every team).
    Returns ``(rows, total)``; each row carries its label fields (``LABEL_FIELDS``, or ``team``) and the figures of
    ``_present`` (GPU-seconds exact, GPU-hours to 1e-6, USD to the ledger's quantum), the total the same figures
    over every row. Raises ValueError for an unknown ``group_by`` or ``end <= start``.
    """
    return capacity_reports((group_by,), start, end, cluster_ids=cluster_ids, team_ids=team_ids)[group_by]


def capacity_reports(groups, start: dt.datetime, end: dt.datetime, *, cluster_ids=None,
                     team_ids=None) -> dict[str, tuple[list[dict], dict]]:
    """``capacity_report`` of each grouping in ``groups`` from one read of the inventory, the ledger and the
    utilization rollups (a page's table and its daily chart): ``{group_by: (rows, total)}``. Raises ValueError as
    ``capacity_report`` does."""
    if unknown := [g for g in groups if g not in GROUPS]:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}, not {', '.join(unknown)}")
    if end <= start:
        raise ValueError("end must be after start")
    buckets: dict[tuple, Bucket] = defaultdict(Bucket)
    teams: dict[tuple, Bucket] = defaultdict(Bucket)
    inventoried = _capacity(buckets, start, end, cluster_ids)
    _allocated(buckets, teams, start, end, cluster_ids, inventoried, by_node="node" in groups)
    whole = Bucket()
    for b in buckets.values():
        whole.add(b)
    idle = _idle(start, end, cluster_ids)
    total = _present(whole, sum(idle.values()) if idle else None)
    names = {"cluster": dict(Cluster.objects.values_list("pk", "name")),
             "accelerator": dict(Accelerator.objects.values_list("pk", "name"))}
    return {group_by: (_team_rows(buckets, teams, team_ids) if group_by == "team"
                       else _grouped_rows(group_by, buckets, idle, names), total) for group_by in groups}


def _team_rows(buckets: dict, teams: dict, team_ids) -> list[dict]:
    names = dict(Team.objects.values_list("pk", "slug"))
    rows = _share_idle(buckets, teams, names)
    if team_ids is not None:
        keep = {names[t] for t in team_ids if t in names}
        rows = [r for r in rows if r["team"] in keep]
    return rows


def _grouped_rows(group_by: str, buckets: dict, idle: dict, names: dict) -> list[dict]:
    grouped: dict[tuple, Bucket] = defaultdict(Bucket)
    grouped_idle: dict[tuple, float] = defaultdict(float)
    measured: set[tuple] = set()
    for (pool_key, node, day), b in buckets.items():
        grouped[_label(group_by, pool_key, node, day, names)].add(b)
    if group_by != "node":
        for (pool_key, day), seconds in idle.items():
            label = _label(group_by, pool_key, "", day, names)
            grouped_idle[label] += seconds
            measured.add(label)
    rows = []
    for label in sorted(grouped):
        row = dict(zip(LABEL_FIELDS[group_by], label, strict=True))
        row.update(_present(grouped[label], grouped_idle[label] if label in measured else None))
        rows.append(row)
    return rows


def wire_row(row: dict) -> dict:
    """A row as the API, the CLI and the pages show it: GPU-seconds and GPU-hours as exact strings, USD as a string
    rounded to cents half to even (``core.money.usd_cents``; None stays None: unknown)."""
    return {k: usd_cents(v) if k.endswith("_usd") else (str(v) if isinstance(v, Decimal) else v)
            for k, v in row.items()}


def with_rounding(rows: list[dict], total: dict) -> tuple[list[dict], dict]:
    """``rows`` and ``total`` through ``wire_row``, the total with ``rounding_difference_usd``: per USD figure, what
    the shown rows miss of the shown total, when they do (each is its exact sum rounded once: the table rule of
    docs/design.md, Cost ledger); ``{}`` when every column adds up, and for team rows, whose figures are not the
    fleet total's (a user sees only their teams' rows)."""
    shown, whole = [wire_row(r) for r in rows], wire_row(total)
    differences = {}
    for key in whole:
        if key.endswith("_usd") and shown and key in shown[0] and "team" not in shown[0]:
            difference = rounding_difference(whole[key], [r.get(key) for r in shown])
            if difference != "0.00":
                differences[key] = difference
    whole["rounding_difference_usd"] = differences
    return shown, whole
