"""The ledger's running GPU allocation per pool and team and per node of the placements (``AllocationSeries``,
``AllocationRunningTotal``): what the capacity figures read for a window's whole UTC days, two rows per series
whatever the length of the ledger's history (``costs.capacity``).

Rule: an entry counts when it bills GPUs (``gpu_milli`` > 0), on the UTC day of its ``interval_start`` (the costs
API's rule), in the series of its attempt's node pool and team, and in the series of each node of the attempt's
placement with the node's GPUs of it (``share``, as ``costs.capacity._node_shares`` splits them) out of the
attempt's ``gpus``; the reader divides by ``gpus`` (never stored divided: the sums stay exact).

Kept in the transaction that writes the entries (``costs.ledger``: ``apply``), rebuilt from the ledger with the
other totals (``costs.rollups.rebuild_totals``: ``rebuild``). An attempt's placement or GPUs changing (a serving
job's released replicas) moves its whole allocation to the series of its new placement (``reattribute``), as the
capacity figures have always split an attempt's allocation by its current placement.

Concurrency: ``apply`` first upserts the series rows in key order (``ON CONFLICT DO UPDATE`` locks each), so two
writers of one series follow each other and each sees the other's rows (READ COMMITTED takes a snapshot per
statement); the day rows are written after.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from datetime import UTC
from decimal import Decimal

from django.db import connection

from jobs.models import JobAttempt

from .spend import entries_starting_on, exact_seconds, gpu_seconds, rows_of_days, sql_entries_starting_on

ZERO = Decimal(0)
#: A series' key in ``AllocationSeries``' column names.
SERIES_KEYS = ("by_node", "cluster_id", "accelerator_id", "node_pool_id", "team_id", "node", "share", "gpus")
SUMS = ("gpu_seconds", "cost_usd", "unpriced_gpu_seconds")


def _models():
    from .models import AllocationRunningTotal, AllocationSeries, CostEntry

    return CostEntry, AllocationSeries, AllocationRunningTotal


def node_shares(placement, gpus: int) -> list[tuple[str, int]]:
    """An attempt's GPUs per node of its placement, as ``costs.capacity._BY_NODE_SQL`` computes them: whole GPUs each, the
    remainder on the first node named, a node named twice holding both parts; ``[("", gpus)]`` when placement
    names no nodes."""
    names = (placement or {}).get("nodes") if isinstance(placement, dict) else None
    if not isinstance(names, list) or not names:
        return [("", gpus)]
    each, rest = divmod(gpus, len(names))
    shares: dict[str, int] = defaultdict(int)
    for i, name in enumerate(names):
        shares[name if isinstance(name, str) else json.dumps(name)] += each + (rest if i == 0 else 0)
    return list(shares.items())


def series_deltas(attempt_days: dict[tuple, list], attempts: dict[int, tuple]) -> dict[tuple, list]:
    """The series sums of ``attempt_days`` (``{(day, attempt id, team id, cluster id, accelerator id): [GPU-seconds,
    USD, unpriced GPU-seconds]}``, entries billing GPUs only), per ``(SERIES_KEYS..., day)``: each attempt-day to its
    pool-and-team series and to each node series of its placement. ``attempts``: ``{attempt id: (node pool id,
    gpus, placement)}``."""
    out: dict[tuple, list] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    for (day, attempt_id, team_id, cluster_id, acc_id), sums in attempt_days.items():
        pool_id, gpus, placement = attempts[attempt_id]
        keys = [(False, cluster_id, acc_id, pool_id, team_id, "", 0, 0, day)]
        keys += [
            (True, cluster_id, acc_id, pool_id, team_id, node, share, gpus, day)
            for node, share in node_shares(placement, gpus)
        ]
        for key in keys:
            o = out[key]
            for i in range(3):
                o[i] += sums[i]
    return out


def attempt_facts(attempt_ids) -> dict[int, tuple]:
    """``{attempt id: (node pool id, gpus, placement)}`` of ``attempt_ids``."""
    return {
        pk: (pool, gpus, placement)
        for pk, pool, gpus, placement in JobAttempt.objects.filter(pk__in=list(attempt_ids)).values_list(
            "pk", "node_pool_id", "gpus", "placement"
        )
    }


def apply(attempt_days: dict[tuple, list]) -> None:
    """Add ``attempt_days`` (as ``series_deltas`` takes them; a negative sum takes back) to the running totals, inside
    the caller's transaction: each series' day row grows by its day's sums and every row of the series from that
    day on by them in ``through_*``."""
    attempt_days = {k: v for k, v in attempt_days.items() if any(v)}
    if not attempt_days:
        return
    deltas = series_deltas(attempt_days, attempt_facts({k[1] for k in attempt_days}))
    (_apply_postgresql if connection.vendor == "postgresql" else _apply_generic)(deltas)


def _values(rows: list[tuple], casts: tuple[str, ...]) -> tuple[str, list]:
    one = "(" + ", ".join(f"%s::{c}" for c in casts) + ")"
    return ", ".join([one] * len(rows)), [v for row in rows for v in row]


_KEY_CASTS = ("boolean", "bigint", "bigint", "bigint", "bigint", "text", "integer", "integer")


def _series_ids(cursor, series_t: str, spans: dict[tuple, list]) -> dict[tuple, int]:
    """Upsert the series of ``spans`` (``{key: [first day, last day]}``) in key order, widening their days; returns
    their ids. The upsert locks each series row until the transaction ends."""
    ids = {}
    rows = sorted((*key, lo, hi) for key, (lo, hi) in spans.items())
    for start in range(0, len(rows), 2000):
        chunk = rows[start : start + 2000]
        values, params = _values(chunk, (*_KEY_CASTS, "date", "date"))
        cursor.execute(
            f'INSERT INTO "{series_t}" ({", ".join(SERIES_KEYS)}, first_day, last_day) VALUES {values} '
            f"ON CONFLICT ({', '.join(SERIES_KEYS)}) DO UPDATE SET "
            f'first_day = LEAST("{series_t}".first_day, EXCLUDED.first_day), '
            f'last_day = GREATEST("{series_t}".last_day, EXCLUDED.last_day) '
            f"RETURNING id, {', '.join(SERIES_KEYS)}",
            params,
        )
        for pk, *key in cursor.fetchall():
            ids[tuple(key)] = pk
    return ids


def _apply_postgresql(deltas: dict[tuple, list], series_t: str | None = None, running_t: str | None = None) -> None:
    _entry, series_model, running_model = _models()
    series_t, running_t = series_t or series_model._meta.db_table, running_t or running_model._meta.db_table
    spans: dict[tuple, list] = {}
    for *key, day in deltas:
        span = spans.setdefault(tuple(key), [day, day])
        span[0], span[1] = min(span[0], day), max(span[1], day)
    with connection.cursor() as cursor:
        ids = _series_ids(cursor, series_t, spans)
        rows = sorted((ids[tuple(key)], day, *sums) for (*key, day), sums in deltas.items())
        for start in range(0, len(rows), 2000):
            chunk = rows[start : start + 2000]
            values, params = _values([r[:2] for r in chunk], ("bigint", "date"))
            # The days not yet held start from the series' running sums before them.
            cursor.execute(
                f'INSERT INTO "{running_t}" (series_id, day, {", ".join(SUMS)}, '
                f"{', '.join('through_' + s for s in SUMS)}) "
                f"SELECT v.sid, v.day, 0, 0, 0, COALESCE(p.g, 0), COALESCE(p.c, 0), COALESCE(p.u, 0) "
                f"FROM (VALUES {values}) AS v(sid, day) LEFT JOIN LATERAL ("
                f"  SELECT r.through_gpu_seconds AS g, r.through_cost_usd AS c, r.through_unpriced_gpu_seconds AS u "
                f'  FROM "{running_t}" AS r WHERE r.series_id = v.sid AND r.day < v.day ORDER BY r.day DESC LIMIT 1'
                f") AS p ON TRUE ON CONFLICT (series_id, day) DO NOTHING",
                params,
            )
            values, params = _values(chunk, ("bigint", "date", "numeric", "numeric", "numeric"))
            cursor.execute(
                f'UPDATE "{running_t}" AS r SET gpu_seconds = r.gpu_seconds + x.og, cost_usd = r.cost_usd + x.oc, '
                f"unpriced_gpu_seconds = r.unpriced_gpu_seconds + x.ou, "
                f"through_gpu_seconds = r.through_gpu_seconds + x.tg, through_cost_usd = r.through_cost_usd + x.tc, "
                f"through_unpriced_gpu_seconds = r.through_unpriced_gpu_seconds + x.tu "
                f"FROM (SELECT r2.id, COALESCE(SUM(v.g) FILTER (WHERE v.day = r2.day), 0) AS og, "
                f"COALESCE(SUM(v.c) FILTER (WHERE v.day = r2.day), 0) AS oc, "
                f"COALESCE(SUM(v.u) FILTER (WHERE v.day = r2.day), 0) AS ou, SUM(v.g) AS tg, SUM(v.c) AS tc, "
                f"SUM(v.u) AS tu FROM (VALUES {values}) AS v(sid, day, g, c, u) "
                f'JOIN "{running_t}" AS r2 ON r2.series_id = v.sid AND r2.day >= v.day GROUP BY r2.id) AS x '
                f"WHERE r.id = x.id",
                params,
            )


def _apply_generic(deltas: dict[tuple, list]) -> None:
    """``_apply_postgresql`` row by row (SQLite: its transactions are serialised whole)."""
    _entry, series_model, running_model = _models()
    for (*key, day), sums in sorted(deltas.items()):
        series, created = series_model.objects.get_or_create(
            **dict(zip(SERIES_KEYS, key, strict=True)), defaults={"first_day": day, "last_day": day}
        )
        if not created and not series.first_day <= day <= series.last_day:
            series.first_day, series.last_day = min(series.first_day, day), max(series.last_day, day)
            series.save(update_fields=["first_day", "last_day"])
        if not running_model.objects.filter(series=series, day=day).exists():
            before = running_model.objects.filter(series=series, day__lt=day).order_by("-day").first()
            running_model.objects.create(
                series=series,
                day=day,
                **{f"through_{s}": getattr(before, f"through_{s}") if before else ZERO for s in SUMS},
            )
        for row in running_model.objects.filter(series=series, day__gte=day):
            for name, value in zip(SUMS, sums, strict=True):
                if row.day == day:
                    setattr(row, name, getattr(row, name) + value)
                setattr(row, f"through_{name}", getattr(row, f"through_{name}") + value)
            row.save()


def gpu_attempt_days(
    start_day: dt.date | None = None, end_day: dt.date | None = None, *, attempt_id: int | None = None, entry_model=None
) -> dict[tuple, list]:
    """The ledger's entries billing GPUs summed per ``(day, attempt id, team id, cluster id, accelerator id)``:
    ``[GPU-seconds, USD (priced), unpriced GPU-seconds]`` (exact), over the UTC days ``[start_day, end_day]`` (all
    when left out) and, given ``attempt_id``, that attempt's entries only."""
    entry_model = entry_model or _models()[0]
    bounds, params = sql_entries_starting_on(start_day, end_day, "e.interval_start")
    where = ["e.gpu_milli > 0", *bounds]
    if attempt_id is not None:
        where.append("e.attempt_id = %s")
        params.append(attempt_id)
    out: dict[tuple, list] = {}
    if connection.vendor == "postgresql":
        held = "e.gpu_milli * EXTRACT(EPOCH FROM e.interval_end - e.interval_start) * 0.001"
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT (e.interval_start AT TIME ZONE 'UTC')::date, e.attempt_id, e.team_id, e.cluster_id, "
                f"e.accelerator_id, SUM({held}), COALESCE(SUM(e.amount_usd), 0), "
                f"COALESCE(SUM({held}) FILTER (WHERE e.amount_usd IS NULL), 0) "
                f'FROM "{entry_model._meta.db_table}" AS e WHERE {" AND ".join(where)} GROUP BY 1, 2, 3, 4, 5',
                params,
            )
            for *key, g, c, u in cursor.fetchall():
                out[tuple(key)] = [Decimal(g), Decimal(c), Decimal(u)]
        return out
    entries = entries_starting_on(entry_model.objects.filter(gpu_milli__gt=0), start_day, end_day)
    if attempt_id is not None:
        entries = entries.filter(attempt_id=attempt_id)
    for key, milli, lo, hi, amount in (
        ((e[0].astimezone(UTC).date(), *e[1:5]), *e[5:])
        for e in entries.values_list(
            "interval_start",
            "attempt_id",
            "team_id",
            "cluster_id",
            "accelerator_id",
            "gpu_milli",
            "interval_start",
            "interval_end",
            "amount_usd",
        ).iterator()
    ):
        held = gpu_seconds(milli, exact_seconds(hi - lo))
        s = out.setdefault(key, [ZERO, ZERO, ZERO])
        s[0] += held
        s[1] += amount or 0
        s[2] += held if amount is None else 0
    return out


def reattribute(attempt_id: int, old_gpus: int, old_placement) -> None:
    """Move attempt ``attempt_id``'s allocation from the node series of ``old_placement`` and ``old_gpus`` to those
    of its placement and GPUs now (call after changing them, in the same transaction). The pool-and-team series
    are left as they are (the attempt's pool and team do not change)."""
    days = gpu_attempt_days(attempt_id=attempt_id)
    if not days:
        return
    pool_id, gpus, placement = attempt_facts([attempt_id])[attempt_id]
    moved: dict[tuple, list] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    for facts, sign in (((pool_id, old_gpus, old_placement), -1), ((pool_id, gpus, placement), 1)):
        for key, sums in series_deltas(days, {attempt_id: facts}).items():
            if key[0]:  # node series only
                for i in range(3):
                    moved[key][i] += sign * sums[i]
    moved = {k: v for k, v in moved.items() if any(v)}
    if moved:
        (_apply_postgresql if connection.vendor == "postgresql" else _apply_generic)(moved)


def rebuild(start_day: dt.date | None = None, end_day: dt.date | None = None) -> int:
    """Recompute the day rows of UTC days ``[start_day, end_day]`` (every day when left out) from the ledger, then
    every series' ``through_*`` sums and days (inside the caller's transaction; ``rebuild_totals`` holds it and the
    locks). Returns the day rows written."""
    _entry, series_model, running_model = _models()
    deltas = series_deltas(days := gpu_attempt_days(start_day, end_day), attempt_facts({k[1] for k in days}))
    rows_of_days(running_model.objects.all(), start_day, end_day).delete()
    spans: dict[tuple, list] = {}
    for *key, day in deltas:
        span = spans.setdefault(tuple(key), [day, day])
        span[0], span[1] = min(span[0], day), max(span[1], day)
    existing = {tuple(row[1:]): row[0] for row in series_model.objects.values_list("pk", *SERIES_KEYS)}
    series_model.objects.bulk_create(
        [
            series_model(**dict(zip(SERIES_KEYS, key, strict=True)), first_day=lo, last_day=hi)
            for key, (lo, hi) in spans.items()
            if key not in existing
        ]
    )
    ids = {tuple(row[1:]): row[0] for row in series_model.objects.values_list("pk", *SERIES_KEYS)}
    running_model.objects.bulk_create(
        [
            running_model(series_id=ids[tuple(key)], day=day, **dict(zip(SUMS, sums, strict=True)))
            for (*key, day), sums in deltas.items()
        ],
        batch_size=2000,
    )
    series_t, running_t = series_model._meta.db_table, running_model._meta.db_table
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f'UPDATE "{running_t}" AS r SET through_gpu_seconds = x.g, through_cost_usd = x.c, '
                f"through_unpriced_gpu_seconds = x.u FROM (SELECT id, "
                f"SUM(gpu_seconds) OVER w AS g, SUM(cost_usd) OVER w AS c, SUM(unpriced_gpu_seconds) OVER w AS u "
                f'FROM "{running_t}" WINDOW w AS (PARTITION BY series_id ORDER BY day)) AS x WHERE r.id = x.id'
            )
            cursor.execute(
                f'DELETE FROM "{series_t}" AS s WHERE NOT EXISTS '
                f'(SELECT 1 FROM "{running_t}" AS r WHERE r.series_id = s.id)'
            )
            cursor.execute(
                f'UPDATE "{series_t}" AS s SET first_day = x.lo, last_day = x.hi FROM (SELECT series_id, '
                f'MIN(day) AS lo, MAX(day) AS hi FROM "{running_t}" GROUP BY 1) AS x '
                f"WHERE s.id = x.series_id"
            )
        return len(deltas)
    through: dict[int, list] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    changed = []
    for row in running_model.objects.order_by("series_id", "day"):
        t = through[row.series_id]
        for i, name in enumerate(SUMS):
            t[i] += getattr(row, name)
            setattr(row, f"through_{name}", t[i])
        changed.append(row)
    running_model.objects.bulk_update(changed, [f"through_{s}" for s in SUMS], batch_size=2000)
    series_model.objects.exclude(pk__in=list(through)).delete()
    for series in series_model.objects.all():
        days_held = running_model.objects.filter(series=series).order_by("day").values_list("day", flat=True)
        series.first_day, series.last_day = days_held.first(), days_held.last()
        series.save(update_fields=["first_day", "last_day"])
    return len(deltas)


def running_mismatches() -> list[tuple]:
    """Every series-day whose stored sums (the day's and ``through_*``) differ from the ledger's:
    ``[(series key..., day, stored, ledger)]`` (an audit: reads the whole ledger)."""
    _entry, series_model, running_model = _models()
    days = gpu_attempt_days()
    ledger = series_deltas(days, attempt_facts({k[1] for k in days}))
    through: dict[tuple, list] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    expected = {}
    for (*key, day), sums in sorted(ledger.items(), key=lambda kv: (str(kv[0][:-1]), kv[0][-1])):
        t = through[tuple(key)]
        for i in range(3):
            t[i] += sums[i]
        expected[(*key, day)] = (*sums, *t)
    stored = {}
    for row in running_model.objects.select_related("series"):
        key = tuple(getattr(row.series, k) for k in SERIES_KEYS)
        stored[(*key, row.day)] = tuple(getattr(row, s) for s in SUMS) + tuple(
            getattr(row, f"through_{s}") for s in SUMS
        )
    out = []
    for key in set(stored) | set(expected):
        s, e = stored.get(key), expected.get(key)
        if s is None and e is not None and not any(e[:3]) or e is None and s is not None and not any(s[:3]):
            continue  # a day whose sums are 0 held or not: the same running sums
        if s != e:
            out.append((*key, s, e))
    return out
