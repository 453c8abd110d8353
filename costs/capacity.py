"""Capacity, allocated and unallocated GPU-hours of the fleet and their cost, as OpenCost has them.

- **Capacity**: allocatable GPUs x the time each node was present, from the node inventory over time
  (``runners.NodeSpan``: what node sync saw; time nobody observed is not capacity). Cordoned capacity (the node was
  not schedulable: cordoned in Kubernetes or by staff in the platform, from the instant of the staff cordon, not
  Ready or tainted against the platform's pods) is part of capacity and shown apart.
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

The database sums both sides (ADR 0027): the spans clipped to the pieces of the window (cut at each price change and,
where a grouping shows days, each UTC midnight), and the ledger's allocation per pool, or per node of each placement,
from the attempt-day rollups and the clipped edge entries; Python prices each piece and shapes the rows. Each
grouping reads at the resolution it needs (``RESOLUTIONS``: by node without days, by day without nodes, or neither),
so a month of 478 nodes is a few hundred rows whichever the grouping.

Every figure is a sum over buckets (cluster, pool, node, UTC day, price), so each grouping adds up: per row and in
total, ``capacity_gpu_seconds == allocated_gpu_seconds - uninventoried_allocated_gpu_seconds +
unallocated_gpu_seconds`` exactly (Decimal seconds at microsecond resolution). ``uninventoried_*`` is the allocation
on clusters whose nodes no sync listed in the window (before a cluster's first node sync, or a runner without
one): it is billed, so it is allocated, but there is no capacity to hold it against; a row made only of it has
its capacity and unallocated figures None (unknown), never 0 or below.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import decimal
from collections import defaultdict
from decimal import Decimal
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from core.money import LEDGER_QUANTUM, rounding_difference, usd_cents
from jobs.models import JobAttempt
from quotas.models import Team
from runners.models import Accelerator, Cluster, Node, NodePool, NodeSpan

from .catalog import NoPrice, prices_by_pool, row_at
from .models import (
    AllocationRunningTotal,
    AllocationSeries,
    AttemptDailyCost,
    CostEntry,
    NodeUtilizationRollup,
    Price,
    UtilizationRollup,
)
from .running import node_shares as _node_shares
from .spend import ENTRY_SPAN, edge_outside, exact_seconds, first_entry_since, gpu_seconds, utc_midnight

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


def _pool_key(cluster_id: int, pool_name: str, accelerator_id: int, capacity_type: str) -> tuple:
    return (cluster_id, pool_name, accelerator_id, capacity_type)


class Resolution(NamedTuple):
    """How finely one grouping needs its buckets: per node (else one ``""`` node per pool) and per UTC day (else one
    ``None`` day for the window). The buckets of every resolution add up to the same figures; the coarser, the fewer
    rows the database returns (a month of 478 nodes by node alone: 478 rows, not 14,800)."""

    by_node: bool
    by_day: bool


#: The resolution each grouping reads (``team`` shares each cluster-day's idle, so it reads days).
RESOLUTIONS = {"cluster": Resolution(False, False), "node_pool": Resolution(False, False),
               "accelerator": Resolution(False, False), "node": Resolution(True, False),
               "day": Resolution(False, True), "team": Resolution(False, True)}


def _fetch(sql: str, params: dict) -> list[tuple]:
    """The rows of one of this module's aggregate queries, run with PostgreSQL's JIT off: the planner's row estimates
    for the set-returning functions in them (``unnest``, ``jsonb_array_elements_text``) are far above the few
    thousand rows they make, which crosses ``jit_above_cost``, and compiling the plan then took a second where
    running it takes tens of milliseconds (``benchmarks/ledger_scale.py``); and with no parallel workers: for the few
    thousand rows these read, starting and gathering workers cost the backend more CPU than they share."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        cursor.execute(sql, params)
        return cursor.fetchall()


def _cuts(start: dt.datetime, end: dt.datetime, by_day: bool, prices: list[Price]) -> list[dt.datetime]:
    """``[start, end]`` and the instants inside it where a piece of capacity must be cut: every UTC midnight
    (``by_day``) and every price change of ``prices``, sorted."""
    cuts = {start, end} | {p.effective_from for p in prices if start < p.effective_from < end}
    if by_day:
        cuts |= {lo for _day, lo, _hi in _days(start, end)}
    return sorted(cuts)


def _inventoried(start: dt.datetime, end: dt.datetime, cluster_ids) -> set[int]:
    """The clusters whose nodes some sync listed inside ``[start, end)`` (a NodeSpan overlapping it)."""
    spans = NodeSpan.objects.filter(start__lt=end, end__gt=start)
    if cluster_ids is not None:
        spans = spans.filter(cluster_id__in=cluster_ids)
    return set(spans.values_list("cluster_id", flat=True).distinct().order_by())


#: GPU-seconds of the node inventory per pool, node (or ``''``) and piece of the window: the spans clipped to each
#: piece by the database (exact numeric seconds), pieces without overlap left out.
_CAPACITY_SQL = """
SELECT s.cluster_id, s.pool_name, s.accelerator_id, s.capacity_type, {node}, p.i,
       SUM(s.gpus * EXTRACT(EPOCH FROM LEAST(s."end", p.hi) - GREATEST(s.start, p.lo))),
       COALESCE(SUM(s.gpus * EXTRACT(EPOCH FROM LEAST(s."end", p.hi) - GREATEST(s.start, p.lo)))
                FILTER (WHERE NOT s.schedulable), 0)
FROM {spans} AS s
JOIN unnest(%(lo)s::timestamptz[], %(hi)s::timestamptz[]) WITH ORDINALITY AS p(lo, hi, i)
  ON s.start < p.hi AND s."end" > p.lo AND LEAST(s."end", p.hi) > GREATEST(s.start, p.lo)
WHERE s.start < %(end)s AND s."end" > %(start)s {clusters}
GROUP BY 1, 2, 3, 4, 5, 6
"""


def _in_database() -> bool:
    """Whether the database sums the figures (PostgreSQL); elsewhere (the demo's SQLite) Python sums the same rows."""
    return connection.vendor == "postgresql"


def _capacity_rows(start: dt.datetime, end: dt.datetime, cluster_ids, res: Resolution, cuts: list[dt.datetime],
                   in_database: bool | None = None) -> list[tuple]:
    """The node inventory's GPU-seconds inside ``[start, end)`` per piece of ``cuts`` (``_cuts``): rows of
    ``(cluster id, pool name, accelerator id, capacity type, node or '', piece number from 1, GPU-seconds,
    cordoned GPU-seconds)`` (Decimal, exact), pieces a span does not overlap left out. Summed by the database
    (``_CAPACITY_SQL``) unless ``in_database`` is False (default: ``_in_database()``)."""
    if in_database if in_database is not None else _in_database():
        params = {"lo": cuts[:-1], "hi": cuts[1:], "start": start, "end": end, "clusters": list(cluster_ids or [])}
        return _fetch(_CAPACITY_SQL.format(
            node="s.node_name" if res.by_node else "''", spans=NodeSpan._meta.db_table,
            clusters="" if cluster_ids is None else "AND s.cluster_id = ANY(%(clusters)s)"), params)
    spans = NodeSpan.objects.filter(start__lt=end, end__gt=start)
    if cluster_ids is not None:
        spans = spans.filter(cluster_id__in=cluster_ids)
    sums: dict[tuple, list] = defaultdict(lambda: [ZERO, ZERO])
    for cluster_id, pool_name, acc_id, ctype, node, gpus, schedulable, lo, hi in spans.values_list(
            "cluster_id", "pool_name", "accelerator_id", "capacity_type", "node_name", "gpus", "schedulable", "start",
            "end").order_by():
        lo, hi = max(lo, start), min(hi, end)
        i = bisect.bisect_right(cuts, lo)  # cuts[i - 1] <= lo < cuts[i]: piece i
        while lo < hi:
            cut = min(hi, cuts[i])
            s = sums[(cluster_id, pool_name, acc_id, ctype, node if res.by_node else "", i)]
            s[0] += gpus * exact_seconds(cut - lo)
            if not schedulable:
                s[1] += gpus * exact_seconds(cut - lo)
            lo, i = cut, i + 1
    return [(*key, gpu_s, cordoned) for key, (gpu_s, cordoned) in sums.items()]


def _capacity(buckets: dict, start: dt.datetime, end: dt.datetime, cluster_ids, res: Resolution,
              objects: dict) -> None:
    """Add the node inventory's capacity (GPU-seconds, cordoned GPU-seconds and their USD at the pool's price in force)
    inside ``[start, end)`` to ``buckets`` at resolution ``res``. The database clips the spans to the window's pieces
    (cut at each price change and, ``res.by_day``, each UTC midnight) and sums them; each piece is priced here once.
    ``objects``: ``{"cluster": {pk: Cluster}, "accelerator": {pk: Accelerator}}``."""
    rows = list(Price.objects.filter(effective_from__lt=end))
    cuts = _cuts(start, end, res.by_day, rows)
    found = _capacity_rows(start, end, cluster_ids, res, cuts)
    refs = {}
    for cluster_id, pool_name, acc_id, ctype, *_rest in found:
        key = _pool_key(cluster_id, pool_name, acc_id, ctype)
        refs.setdefault(key, PoolRef(key, objects["cluster"][cluster_id], cluster_id, acc_id, ctype,
                                     objects["accelerator"][acc_id]))
    prices = prices_by_pool(list(refs.values()), [r for r in rows if r.accelerator_id in
                                                  {ref.accelerator_id for ref in refs.values()}])
    priced: dict[tuple, Decimal | None] = {}
    for cluster_id, pool_name, acc_id, ctype, node, i, gpu_s, cordoned in found:
        key = _pool_key(cluster_id, pool_name, acc_id, ctype)
        lo = cuts[i - 1]
        if (key, i) not in priced:
            try:
                priced[(key, i)] = row_at(refs[key], lo, prices[key]).usd_per_gpu_hour
            except NoPrice:
                priced[(key, i)] = None
        price = priced[(key, i)]
        bucket = buckets[(key, node, lo.astimezone(dt.UTC).date() if res.by_day else None)]
        bucket.capacity += gpu_s
        bucket.cordoned += cordoned
        if price is None:
            bucket.capacity_unpriced += gpu_s
        else:
            bucket.capacity_cost += gpu_s * price / HOUR


#: The ledger's GPU allocation inside a window (``alloc``): whole UTC days from the attempt-day rollups
#: (``AttemptDailyCost``), the partial days at the window's edges (``w``) from the entries, each clipped to its edge
#: and its amount prorated by the seconds kept (entries never cross a UTC hour, ``spend.ENTRY_SPAN``, which bounds
#: the index range read).
_ALLOCATION_SQL = """
WITH {edge_cte}alloc AS (
  SELECT d.attempt_id, d.day, d.cluster_id, d.accelerator_id, d.team_id,
         d.gpu_seconds AS g, d.cost_usd AS c, d.unpriced_gpu_seconds AS u
  FROM {rollups} AS d
  WHERE d.day >= %(first)s AND d.day < %(last)s AND d.gpu_seconds > 0 {rollup_clusters}
  UNION ALL
  SELECT e.attempt_id, (e.interval_start AT TIME ZONE 'UTC')::date, e.cluster_id, e.accelerator_id, e.team_id,
         e.gpu_milli * k.kept * 0.001,
         CASE WHEN e.amount_usd IS NULL THEN 0 WHEN k.kept = k.whole THEN e.amount_usd
              ELSE (e.amount_usd * k.kept)::numeric(65, 30) / k.whole END,
         CASE WHEN e.amount_usd IS NULL THEN e.gpu_milli * k.kept * 0.001 ELSE 0 END
  FROM unnest(%(lo)s::timestamptz[], %(hi)s::timestamptz[]) AS w(lo, hi)
  JOIN {entries} AS e ON e.interval_start >= w.lo - %(span)s AND e.interval_start < w.hi AND e.interval_end > w.lo
  CROSS JOIN LATERAL (SELECT EXTRACT(EPOCH FROM LEAST(e.interval_end, w.hi) - GREATEST(e.interval_start, w.lo)) AS kept,
                             EXTRACT(EPOCH FROM e.interval_end - e.interval_start) AS whole) AS k
  WHERE e.gpu_milli > 0 {entry_clusters}
  UNION ALL
  SELECT * FROM edge
){split}
"""

#: The entries of the edge days ``rday`` that reach outside the window, per edge (``o`` below): each entry's part
#: inside the window less its whole (negative sums).
_OUTSIDE_ENTRIES_SQL = """
    SELECT e.attempt_id, (e.interval_start AT TIME ZONE 'UTC')::date, e.cluster_id, e.accelerator_id, e.team_id,
           e.gpu_milli * (k.kept - k.whole) * 0.001,
           CASE WHEN e.amount_usd IS NULL THEN 0 WHEN k.kept = 0 THEN -e.amount_usd
                ELSE (e.amount_usd * k.kept)::numeric(65, 30) / k.whole - e.amount_usd END,
           CASE WHEN e.amount_usd IS NULL THEN e.gpu_milli * (k.kept - k.whole) * 0.001 ELSE 0 END
    FROM unnest(%(owlo)s::timestamptz[], %(owhi)s::timestamptz[], %(olo)s::timestamptz[], %(ohi)s::timestamptz[],
                %(opast)s::boolean[]) AS o(wlo, whi, lo, hi, past)
    JOIN {entries} AS e ON e.interval_start >= o.lo AND e.interval_start < o.hi
                         AND (NOT o.past OR e.interval_end > o.whi)
    CROSS JOIN LATERAL (
      SELECT GREATEST(EXTRACT(EPOCH FROM LEAST(e.interval_end, o.whi) - GREATEST(e.interval_start, o.wlo)), 0)
               AS kept,
             EXTRACT(EPOCH FROM e.interval_end - e.interval_start) AS whole) AS k
    WHERE e.gpu_milli > 0 {entry_clusters}
"""

#: The partial days at a window's edges read as their attempt-day rollups (days ``rday``) less the entries of those
#: days that reach outside the window (``o``: per edge ``[wlo, whi)``, the entries starting in ``[lo, hi)``, with
#: ``past`` those ending after ``whi`` only): each such entry's whole is taken off and its part inside the window
#: added back as the entries' reading clips it, so the sums are the same, exactly; an attempt-day keeps a row only
#: where GPU-seconds are left inside the window (``spend.edge_outside`` chooses this reading).
_EDGE_FROM_ROLLUPS_SQL = """, edge AS (
  SELECT x.attempt_id, x.day, x.cluster_id, x.accelerator_id, x.team_id, SUM(x.g) AS g, SUM(x.c) AS c, SUM(x.u) AS u
  FROM (
    SELECT d.attempt_id, d.day, d.cluster_id, d.accelerator_id, d.team_id,
           d.gpu_seconds AS g, d.cost_usd AS c, d.unpriced_gpu_seconds AS u
    FROM {rollups} AS d
    WHERE d.day = ANY(%(rday)s::date[]) {rollup_clusters}
    UNION ALL
""" + _OUTSIDE_ENTRIES_SQL + """  ) AS x
  GROUP BY 1, 2, 3, 4, 5
  HAVING SUM(x.g) > 0
)"""

#: With the running totals (``_running_rows``), an edge day read from its side outside the window is its series' day
#: row, read with the whole days, less this: its entries reaching outside the window (``o`` as above), each entry's
#: whole taken off and its part inside the window added back, per attempt (negative sums).
_EDGE_OUTSIDE_SQL = """, edge AS (
""" + _OUTSIDE_ENTRIES_SQL + """)"""

#: ``alloc`` per pool (and day or team as asked).
_BY_POOL_SQL = """
SELECT al.cluster_id, p.name, al.accelerator_id, p.capacity_type, '', NULL, NULL, {day}, {team},
       SUM(al.g), SUM(al.c), SUM(al.u)
FROM alloc AS al JOIN {attempts} AS a ON a.id = al.attempt_id JOIN {pools} AS p ON p.id = a.node_pool_id
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
"""

#: ``alloc`` per attempt first (and day or team as asked), then per pool and node of its placement, with the node's
#: GPUs of the attempt (``shares``: ``placement["nodes"]`` in order, whole GPUs each, the remainder on the first
#: node named, a node named twice holding both parts; an attempt whose placement names no nodes is on node ``''``
#: with all its GPUs) and the attempt's GPUs, by which the caller splits the sums.
_BY_NODE_SQL = """, per_attempt AS (
  SELECT attempt_id, cluster_id, accelerator_id, {day} AS day, {team} AS team_id, SUM(g) AS g, SUM(c) AS c,
         SUM(u) AS u
  FROM alloc GROUP BY 1, 2, 3, 4, 5
), attempts AS (
  SELECT a.id, p.name AS pool_name, p.capacity_type, a.gpus, a.placement
  FROM {attempts} AS a JOIN {pools} AS p ON p.id = a.node_pool_id
  WHERE a.id IN (SELECT attempt_id FROM per_attempt)
), shares AS (
  SELECT a.id, x.node, SUM(CASE WHEN x.i = 1 THEN a.gpus / x.n + a.gpus %% x.n ELSE a.gpus / x.n END) AS share
  FROM attempts AS a CROSS JOIN LATERAL (
    SELECT t.node, t.i, COUNT(*) OVER () AS n
    FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(a.placement -> 'nodes') = 'array'
                                        THEN a.placement -> 'nodes' ELSE '[]'::jsonb END) WITH ORDINALITY AS t(node, i)
  ) AS x
  GROUP BY a.id, x.node
)
SELECT pa.cluster_id, a.pool_name, pa.accelerator_id, a.capacity_type, COALESCE(s.node, ''),
       COALESCE(s.share, a.gpus), a.gpus, pa.day, pa.team_id, SUM(pa.g), SUM(pa.c), SUM(pa.u)
FROM per_attempt AS pa JOIN attempts AS a ON a.id = pa.attempt_id LEFT JOIN shares AS s ON s.id = pa.attempt_id
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
"""


def _allocation_rows(start: dt.datetime, end: dt.datetime, cluster_ids, res: Resolution, by_team: bool,
                     in_database: bool | None = None, edges: str = "auto", running: bool = True) -> list[tuple]:
    """The ledger's GPU allocation inside ``[start, end)`` per (cluster id, pool name, accelerator id, capacity type,
    node, the node's GPUs of the attempt, the attempt's GPUs, UTC day, team id): rows of those keys and
    ``GPU-seconds, USD (priced), GPU-seconds without a price`` (Decimal). Unless ``res.by_node`` the node is ``''``
    and both GPU counts None; the day is None unless ``res.by_day``, the team None unless ``by_team``. Summed by the
    database (``_ALLOCATION_SQL``) unless ``in_database`` is False (default: ``_in_database()``); the database reads
    each partial edge day from the side with less time up to now (``spend.edge_outside``, whose ``edges`` this
    passes): its entries inside the window, or its attempt-day rollups less its entries reaching outside
    (``_EDGE_FROM_ROLLUPS_SQL``), the same sums where an attempt bills GPUs in every entry of a day or in none.
    The whole days come from the running totals (``_running_rows``: two rows per series, however long the ledger's
    history) unless ``running`` is False or the grouping is by node and by team or day (no series holds it), then from the
    attempt-day rollups. Both count the entries billing GPUs; the running totals per entry, the attempt-day rows
    where the attempt-day billed any GPU-seconds."""
    first = start.astimezone(dt.UTC).date()
    if utc_midnight(first) < start:
        first += dt.timedelta(days=1)
    last = end.astimezone(dt.UTC).date()  # whole days are [first, last)
    if first >= last:
        partial = [(start, end)]
    else:
        partial = [(lo, hi) for lo, hi in ((start, utc_midnight(first)), (utc_midnight(last), end)) if lo < hi]
    if not (in_database if in_database is not None else _in_database()):
        return _allocation_rows_python(first, last, partial, cluster_ids, res, by_team)
    names = {"rollups": AttemptDailyCost._meta.db_table, "entries": CostEntry._meta.db_table,
             "attempts": JobAttempt._meta.db_table, "pools": NodePool._meta.db_table}
    split = (_BY_NODE_SQL if res.by_node else _BY_POOL_SQL).format(
        day=("al.day", "day")[res.by_node] if res.by_day else "NULL::date",
        team=("al.team_id", "team_id")[res.by_node] if by_team else "NULL::integer", **names)
    clusters = "" if cluster_ids is None else "AND {}.cluster_id = ANY(%(clusters)s)"
    filters = {"rollup_clusters": clusters.format("d"), "entry_clusters": clusters.format("e")}
    now = timezone.now()
    direct, rday, outside = [], [], []
    for lo, hi in partial:
        if edge_outside(lo, hi, now, edges, first_entry_since(lo) if edges == "auto" else None) is None:
            direct.append((lo, hi))
            continue
        day = lo.astimezone(dt.UTC).date()
        rday.append(day)
        # Entries starting before the window (crossing its start or not), and those from the window's start (or an
        # entry's span before its end) on that end after it; entries never cross a UTC midnight.
        outside.append((lo, hi, utc_midnight(day), lo, False))
        outside.append((lo, hi, max(lo, hi - ENTRY_SPAN), utc_midnight(day + dt.timedelta(days=1)), True))
    # Whole days from the running totals where a series holds the grouping (not nodes by team or by day); an edge
    # day read from the side outside the window is then its series' day less the entries outside.
    whole = running and not (res.by_node and (by_team or res.by_day))
    edge_sql = _EDGE_OUTSIDE_SQL if whole else _EDGE_FROM_ROLLUPS_SQL
    edge_cte = edge_sql.format(**names, **filters)[2:] + ",\n" if rday else ""
    sql = _ALLOCATION_SQL.format(split=split, edge_cte=edge_cte, **filters, **names)
    if not rday:
        sql = sql.replace("  UNION ALL\n  SELECT * FROM edge\n", "")
    params = {"first": last if whole else first, "last": last, "lo": [lo for lo, _hi in direct],
              "hi": [hi for _lo, hi in direct], "span": ENTRY_SPAN, "clusters": list(cluster_ids or []), "rday": rday,
              **{k: [o[i] for o in outside] for i, k in enumerate(("owlo", "owhi", "olo", "ohi", "opast"))}}
    if not whole:
        return _fetch(sql, params)
    days = set(rday) | ({first, last - dt.timedelta(days=1)} if first < last else set())
    rows = _fetch(sql, params) if direct or rday else []
    if days:
        rows += _running_rows(min(days), max(days) + dt.timedelta(days=1), cluster_ids, res, by_team)
    merged: dict[tuple, list] = {}
    with decimal.localcontext(prec=100):  # exact: the prorated edge amounts carry 30 decimals (numeric(65, 30))
        for row in rows:
            sums = merged.setdefault(tuple(row[:9]), [ZERO, ZERO, ZERO])
            for i in range(3):
                sums[i] += row[9 + i]
    return [(*key, *sums) for key, sums in merged.items() if sums[0]]


#: The running GPU allocation of whole UTC days ``[first, last)`` per series (``costs.running``): ``through_*`` of
#: its last row before ``last`` less that of its last row before ``first``, two index reads per series that reaches
#: the window, whatever the length of the ledger's history; the pool's name and capacity type as they are now.
_RUNNING_SQL = """
SELECT s.cluster_id, p.name, s.accelerator_id, p.capacity_type, {node}, {share}, {gpus}, NULL::date, {team},
       SUM(COALESCE(hi.g, 0) - COALESCE(lo.g, 0)), SUM(COALESCE(hi.c, 0) - COALESCE(lo.c, 0)),
       SUM(COALESCE(hi.u, 0) - COALESCE(lo.u, 0))
FROM {series} AS s JOIN {pools} AS p ON p.id = s.node_pool_id
LEFT JOIN LATERAL (SELECT r.through_gpu_seconds AS g, r.through_cost_usd AS c, r.through_unpriced_gpu_seconds AS u
                   FROM {running} AS r WHERE r.series_id = s.id AND r.day < %(last)s ORDER BY r.day DESC LIMIT 1
                  ) AS hi ON TRUE
LEFT JOIN LATERAL (SELECT r.through_gpu_seconds AS g, r.through_cost_usd AS c, r.through_unpriced_gpu_seconds AS u
                   FROM {running} AS r WHERE r.series_id = s.id AND r.day < %(first)s ORDER BY r.day DESC LIMIT 1
                  ) AS lo ON TRUE
WHERE s.by_node = %(by_node)s AND s.last_day >= %(first)s AND s.first_day < %(last)s {clusters}
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
HAVING SUM(COALESCE(hi.g, 0) - COALESCE(lo.g, 0)) <> 0
"""

#: The running GPU allocation per pool, team and UTC day of ``[first, last)``: the day rows of the pool series that
#: reach the window (a day-resolved grouping needs each day).
_RUNNING_DAYS_SQL = """
SELECT s.cluster_id, p.name, s.accelerator_id, p.capacity_type, '', NULL::integer, NULL::integer, r.day, {team},
       SUM(r.gpu_seconds), SUM(r.cost_usd), SUM(r.unpriced_gpu_seconds)
FROM {series} AS s JOIN {pools} AS p ON p.id = s.node_pool_id
JOIN {running} AS r ON r.series_id = s.id AND r.day >= %(first)s AND r.day < %(last)s
WHERE NOT s.by_node AND s.last_day >= %(first)s AND s.first_day < %(last)s {clusters}
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
HAVING SUM(r.gpu_seconds) <> 0
"""


def _running_rows(first: dt.date, last: dt.date, cluster_ids, res: Resolution, by_team: bool) -> list[tuple]:
    """``_allocation_rows``' rows of the whole UTC days ``[first, last)`` from the running totals
    (``costs.running``): per pool (and team, ``by_team``) or per node of the placements (``res.by_node``, not with
    ``by_team``), per day where ``res.by_day``. Only series with GPU-seconds in the window make rows, as the
    attempt-day reading keeps only attempt-days with GPU-seconds."""
    sql = _RUNNING_DAYS_SQL if res.by_day else _RUNNING_SQL
    return _fetch(sql.format(
        series=AllocationSeries._meta.db_table, running=AllocationRunningTotal._meta.db_table,
        pools=NodePool._meta.db_table, node="s.node" if res.by_node else "''",
        share="s.share" if res.by_node else "NULL::integer", gpus="s.gpus" if res.by_node else "NULL::integer",
        team="s.team_id" if by_team else "NULL::integer",
        clusters="" if cluster_ids is None else "AND s.cluster_id = ANY(%(clusters)s)"),
        {"first": first, "last": last, "by_node": res.by_node, "clusters": list(cluster_ids or [])})


def _allocation_rows_python(first: dt.date, last: dt.date, edges: list, cluster_ids, res: Resolution,
                            by_team: bool) -> list[tuple]:
    """``_allocation_rows`` summed here, for databases other than PostgreSQL: the same rows by the same rules."""
    per_attempt: dict[tuple, list] = defaultdict(lambda: [ZERO, ZERO, ZERO])

    def add(attempt_id, cluster_id, acc_id, day, team_id, gpu_s, usd, unpriced):
        s = per_attempt[(attempt_id, cluster_id, acc_id, day if res.by_day else None, team_id if by_team else None)]
        s[0] += gpu_s
        s[1] += usd
        s[2] += unpriced

    rollups = AttemptDailyCost.objects.filter(day__gte=first, day__lt=last, gpu_seconds__gt=0)
    if cluster_ids is not None:
        rollups = rollups.filter(cluster_id__in=cluster_ids)
    for row in rollups.values_list("attempt_id", "cluster_id", "accelerator_id", "day", "team_id", "gpu_seconds",
                                   "cost_usd", "unpriced_gpu_seconds"):
        add(*row)
    for lo, hi in edges:
        entries = CostEntry.objects.filter(interval_start__gte=lo - ENTRY_SPAN, interval_start__lt=hi,
                                           interval_end__gt=lo, gpu_milli__gt=0)
        if cluster_ids is not None:
            entries = entries.filter(cluster_id__in=cluster_ids)
        for attempt_id, cluster_id, acc_id, team_id, milli, a, b, amount in entries.values_list(
                "attempt_id", "cluster_id", "accelerator_id", "team_id", "gpu_milli", "interval_start", "interval_end",
                "amount_usd"):
            kept, whole = exact_seconds(min(b, hi) - max(a, lo)), exact_seconds(b - a)
            usd = ZERO if amount is None else amount if kept == whole else amount * kept / whole
            add(attempt_id, cluster_id, acc_id, a.astimezone(dt.UTC).date(), team_id, gpu_seconds(milli, kept), usd,
                gpu_seconds(milli, kept) if amount is None else ZERO)
    attempts = {pk: row for pk, *row in JobAttempt.objects.filter(pk__in={k[0] for k in per_attempt}).values_list(
        "pk", "node_pool__name", "node_pool__capacity_type", "gpus", "placement")}
    out: dict[tuple, list] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    for (attempt_id, cluster_id, acc_id, day, team_id), sums in per_attempt.items():
        pool_name, ctype, gpus, placement = attempts[attempt_id]
        shares = _node_shares(placement, gpus) if res.by_node else [("", None)]
        for node, share in shares:
            o = out[(cluster_id, pool_name, acc_id, ctype, node, share, gpus if res.by_node else None, day, team_id)]
            for k in range(3):
                o[k] += sums[k]
    return [(*key, *sums) for key, sums in out.items()]


def _allocated(buckets: dict, teams: dict | None, start: dt.datetime, end: dt.datetime, cluster_ids,
               inventoried: set[int], res: Resolution) -> None:
    """Add the ledger's allocation to ``buckets`` (per pool, node and day at resolution ``res``) and, unless None,
    ``teams`` (per cluster, day and team). An attempt's GPU-seconds and USD go to its placement's nodes in proportion
    to each node's GPUs of it (``res.by_node``); the database sums them per pool, node, share, day and team."""
    for cluster_id, pool_name, acc_id, ctype, node, share, gpus, day, team_id, gpu_s, usd, unpriced in \
            _allocation_rows(start, end, cluster_ids, res, teams is not None):
        key = _pool_key(cluster_id, pool_name, acc_id, ctype)
        if share != gpus:  # a node's part of a multi-node attempt (exact where the GPUs divide it)
            gpu_s, usd, unpriced = (v * share / gpus for v in (gpu_s, usd, unpriced))
        bucket = buckets[(key, node, day)]
        targets = (bucket,) if teams is None else (bucket, teams[(cluster_id, day, team_id)])
        for b in targets:
            b.allocated += gpu_s
            b.allocated_unpriced += unpriced
            b.allocated_cost += usd
        if cluster_id not in inventoried:
            bucket.outside += gpu_s
            bucket.outside_unpriced += unpriced
            bucket.outside_cost += usd


def _idle(start: dt.datetime, end: dt.datetime, cluster_ids) -> dict[tuple, float]:
    """Idle GPU-seconds inside allocation per (pool key, day), where the rollups measured any (summed by the
    database)."""
    first, last = start.astimezone(dt.UTC).date(), (end - dt.timedelta(microseconds=1)).astimezone(dt.UTC).date()
    rollups = UtilizationRollup.objects.filter(day__gte=first, day__lte=last, idle_gpu_seconds__isnull=False)
    if cluster_ids is not None:
        rollups = rollups.filter(cluster_id__in=cluster_ids)
    idle: dict[tuple, float] = defaultdict(float)
    for row in rollups.values("cluster_id", "attempt__node_pool__name", "accelerator_id",
                              "attempt__node_pool__capacity_type", "day").annotate(s=Sum("idle_gpu_seconds")).order_by():
        idle[(_pool_key(row["cluster_id"], row["attempt__node_pool__name"], row["accelerator_id"],
                        row["attempt__node_pool__capacity_type"]), row["day"])] += row["s"]
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
    """``capacity_report`` of each grouping in ``groups`` (a page's table and its daily chart): ``{group_by: (rows,
    total)}``. Groupings of one resolution (``RESOLUTIONS``) share one read of the inventory and the ledger; the
    utilization rollups are read once. Raises ValueError as ``capacity_report`` does."""
    if unknown := [g for g in groups if g not in GROUPS]:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}, not {', '.join(unknown)}")
    if end <= start:
        raise ValueError("end must be after start")
    objects = {"cluster": Cluster.objects.in_bulk(), "accelerator": Accelerator.objects.in_bulk()}
    names = {kind: {pk: o.name for pk, o in found.items()} for kind, found in objects.items()}
    inventoried = _inventoried(start, end, cluster_ids)
    idle = _idle(start, end, cluster_ids)
    measured = sum(idle.values()) if idle else None
    read: dict[Resolution, tuple[dict, dict | None, dict]] = {}
    for res in dict.fromkeys(RESOLUTIONS[g] for g in groups):
        buckets: dict[tuple, Bucket] = defaultdict(Bucket)
        teams = defaultdict(Bucket) if "team" in groups and res == RESOLUTIONS["team"] else None
        _capacity(buckets, start, end, cluster_ids, res, objects)
        _allocated(buckets, teams, start, end, cluster_ids, inventoried, res)
        whole = Bucket()
        for b in buckets.values():
            whole.add(b)
        read[res] = (buckets, teams, _present(whole, measured))
    out = {}
    for group_by in groups:
        buckets, teams, total = read[RESOLUTIONS[group_by]]
        out[group_by] = (_team_rows(buckets, teams, team_ids) if group_by == "team"
                         else _grouped_rows(group_by, buckets, idle, names), total)
    return out


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


# --- GPU utilization per node --------------------------------------------------------------------------------

#: The rule of the per-node utilization figures, as the API documents it and the pages state it.
NODE_UTILIZATION_RULE = (
    "Per node: GPU-hours allocated are the ledger's, split over the nodes of each attempt's placement; observed "
    "GPU-hours count, per GPU the platform's attempts held there, each scrape instant at which dcgm-exporter had a "
    "sample within Prometheus' lookback (one scrape interval each); idle GPU-hours are the observed ones under the "
    "idle threshold; average utilization is the mean of the utilization samples. A GPU is counted once per "
    "instant, inside one attempt's run; GPUs no attempt held are unallocated, never also idle.")


def node_utilization(start: dt.datetime, end: dt.datetime, *, team_ids=None) -> tuple[list[dict], dict]:
    """GPU utilization per node over the whole UTC days that ``[start, end)`` (aware) touches: ``(rows, total)``.

    Each row: ``cluster`` (name), ``node`` (the node's name; ``node_id``,
    the platform's ``runners.Node`` of that name in the cluster, or None),
    ``gpu_hours`` (allocated GPU-hours, ``_allocation_rows`` by node: the
    capacity figures' allocation), ``observed_gpu_hours``,
    ``idle_gpu_hours``, ``unobserved_gpu_hours`` (allocated minus observed,
    at least 0), ``idle_percent`` (idle share of observed, percent),
    ``coverage`` and ``coverage_percent`` (observed share of allocated, 0-1 and percent, at most 100 %)
    and ``avg_gpu_util_percent`` (sample weighted, percent), from the
    ``NodeUtilizationRollup`` rows (``NODE_UTILIZATION_RULE``). Without any
    observed time the idle figures are None, without any sample the average
    ("no data", never 0). ``team_ids``: only these teams' attempts (None:
    all). Rows ordered by cluster and node; a node allocated and never
    observed is a row with its GPU-hours all unobserved. Raises ValueError
    when ``end <= start``.
    """
    if end <= start:
        raise ValueError("end must be after start")
    first = start.astimezone(dt.UTC).date()
    last = (end - dt.timedelta(microseconds=1)).astimezone(dt.UTC).date()
    lo, hi = utc_midnight(first), utc_midnight(last + dt.timedelta(days=1))
    names = dict(Cluster.objects.values_list("pk", "name"))
    sums: dict[tuple, dict] = defaultdict(lambda: dict.fromkeys(
        ("allocated", "observed", "idle", "samples", "util_sum"), 0.0))
    for cluster_id, _pool, _acc, _ctype, node, share, gpus, _day, team_id, gpu_s, _usd, _unpriced in \
            _allocation_rows(lo, hi, None, Resolution(True, False), team_ids is not None):
        if team_ids is not None and team_id not in team_ids:
            continue
        sums[(cluster_id, node)]["allocated"] += float(gpu_s * share / gpus if share != gpus else gpu_s)
    rollups = NodeUtilizationRollup.objects.filter(day__gte=first, day__lte=last)
    if team_ids is not None:
        rollups = rollups.filter(team_id__in=team_ids)
    for row in rollups.values("cluster_id", "node").annotate(
            observed=Sum("observed_gpu_seconds"), idle=Sum("idle_gpu_seconds"), samples=Sum("samples"),
            util_sum=Sum("util_sum")).order_by():
        s = sums[(row["cluster_id"], row["node"])]
        for field in ("observed", "idle", "samples", "util_sum"):
            s[field] += row[field]
    node_ids = {(c, n): pk for pk, c, n in Node.objects.values_list("pk", "cluster_id", "name")}
    total = dict.fromkeys(("allocated", "observed", "idle", "samples", "util_sum"), 0.0)
    rows = []
    for (cluster_id, node), s in sorted(sums.items(), key=lambda kv: (names.get(kv[0][0], ""), kv[0][1])):
        for field in total:
            total[field] += s[field]
        rows.append({"cluster": names.get(cluster_id), "node": node or "(no node recorded)",
                     "node_id": node_ids.get((cluster_id, node)), **_node_figures(s)})
    return rows, _node_figures(total)


def _node_figures(s: dict) -> dict:
    """The figures of ``node_utilization`` from its sums (GPU-seconds, samples, percent sums)."""
    allocated, observed, idle = s["allocated"], s["observed"], s["idle"]
    share = min(1.0, observed / allocated) if allocated else None
    figures = {"gpu_hours": allocated, "observed_gpu_hours": observed, "idle_gpu_hours": idle if observed else None,
               "unobserved_gpu_hours": max(0.0, allocated - observed)}
    return {**{k: None if v is None else round(v / 3600, 6) for k, v in figures.items()},
            "idle_percent": round(100 * idle / observed, 2) if observed else None,
            "coverage": None if share is None else round(share, 4),
            "coverage_percent": None if share is None else round(100 * share, 2),
            "avg_gpu_util_percent": round(s["util_sum"] / s["samples"], 3) if s["samples"] else None}
