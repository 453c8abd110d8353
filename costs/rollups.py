"""The ledger's running totals recomputed from the entries: daily rollups and each team's totals row.

Accrual keeps ``DailyCostRollup`` (UTC day x team x cluster x accelerator x
job) and ``TeamSpend`` in step with the entries it writes
(``costs.ledger``); ``rebuild_totals`` recomputes them from the ledger alone
(after a restore, a manual correction, or to prove they agree:
``totals_mismatches``). An entry counts on the UTC day of its
``interval_start`` (the costs API's and the budgets' rule).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from decimal import Decimal

from django.db import connection, transaction

from .models import CostEntry, DailyCostRollup, TeamSpend
from .spend import exact_seconds

UTC = dt.timezone.utc
_SUMS = ("gpu_seconds", "cost_usd", "unpriced_gpu_seconds", "entries")


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=UTC)


def _ledger_sums(entry_model, start_day: dt.date | None, end_day: dt.date | None) -> dict[tuple, list]:
    """(day, team, cluster, accelerator, job) -> [GPU-seconds, USD, unknown-cost GPU-seconds, entries], in Python."""
    entries = entry_model.objects.all()
    if start_day:
        entries = entries.filter(interval_start__gte=_midnight(start_day))
    if end_day:
        entries = entries.filter(interval_start__lt=_midnight(end_day + dt.timedelta(days=1)))
    sums: dict[tuple, list] = defaultdict(lambda: [Decimal(0), Decimal(0), Decimal(0), 0])
    for day_of, team, cluster, acc, job, gpus, lo, hi, amount in entries.values_list(
            "interval_start", "team_id", "cluster_id", "accelerator_id", "job_id", "gpus", "interval_start",
            "interval_end", "amount_usd").iterator():
        s = sums[(day_of.astimezone(UTC).date(), team, cluster, acc, job)]
        held = gpus * exact_seconds(hi - lo)
        s[0] += held
        s[1] += amount or 0
        s[2] += held if amount is None else 0
        s[3] += 1
    return sums


def rebuild_totals(start_day: dt.date | None = None, end_day: dt.date | None = None, *, models=None) -> int:
    """Recompute the rollups of UTC days ``[start_day, end_day]`` (every day when left out) from the ledger, then
    every team's ``TeamSpend`` from the rollups; returns the number of rollup rows written.

    One transaction; on PostgreSQL it locks both totals tables against
    writers first (accrual waits, readers see the old or the new totals,
    never half) and sums in SQL with exact numerics. ``models`` is
    ``(CostEntry, DailyCostRollup, TeamSpend)`` (a migration passes its
    historical models).
    """
    entry_model, rollup_model, spend_model = models or (CostEntry, DailyCostRollup, TeamSpend)
    entry_t, rollup_t, spend_t = (m._meta.db_table for m in (entry_model, rollup_model, spend_model))
    with transaction.atomic():
        if connection.vendor == "postgresql":
            where, params = ["TRUE"], []
            if start_day:
                where.append("interval_start >= %s")
                params.append(_midnight(start_day))
            if end_day:
                where.append("interval_start < %s")
                params.append(_midnight(end_day + dt.timedelta(days=1)))
            days = [f"day {op} %s" for op, d in ((">=", start_day), ("<=", end_day)) if d] or ["TRUE"]
            held = "e.gpus * EXTRACT(EPOCH FROM e.interval_end - e.interval_start)"
            with connection.cursor() as cursor:
                cursor.execute(f'LOCK TABLE "{spend_t}", "{rollup_t}" IN SHARE ROW EXCLUSIVE MODE')
                cursor.execute(f'DELETE FROM "{rollup_t}" WHERE {" AND ".join(days)}', [d for d in (start_day, end_day) if d])
                cursor.execute(
                    f'INSERT INTO "{rollup_t}" (day, team_id, cluster_id, accelerator_id, job_id, gpu_seconds, '
                    f"cost_usd, unpriced_gpu_seconds, entries, rebuilt_at) "
                    f"SELECT (e.interval_start AT TIME ZONE 'UTC')::date, e.team_id, e.cluster_id, e.accelerator_id, "
                    f"e.job_id, SUM({held}), COALESCE(SUM(e.amount_usd), 0), "
                    f"COALESCE(SUM({held}) FILTER (WHERE e.amount_usd IS NULL), 0), COUNT(*), now() "
                    f'FROM "{entry_t}" AS e WHERE {" AND ".join(where)} GROUP BY 1, 2, 3, 4, 5', params)
                written = cursor.rowcount
                cursor.execute(
                    f'INSERT INTO "{spend_t}" (team_id, cost_usd, gpu_seconds, unpriced_gpu_seconds, entries, '
                    f"updated_at) SELECT team_id, SUM(cost_usd), SUM(gpu_seconds), SUM(unpriced_gpu_seconds), "
                    f'SUM(entries), now() FROM "{rollup_t}" GROUP BY team_id ON CONFLICT (team_id) DO UPDATE SET '
                    f"cost_usd = EXCLUDED.cost_usd, gpu_seconds = EXCLUDED.gpu_seconds, "
                    f"unpriced_gpu_seconds = EXCLUDED.unpriced_gpu_seconds, entries = EXCLUDED.entries, "
                    f"updated_at = EXCLUDED.updated_at")
                cursor.execute(
                    f'UPDATE "{spend_t}" SET cost_usd = 0, gpu_seconds = 0, unpriced_gpu_seconds = 0, entries = 0 '
                    f'WHERE team_id NOT IN (SELECT team_id FROM "{rollup_t}")')
            return written
        groups = _ledger_sums(entry_model, start_day, end_day)
        rollups = rollup_model.objects.all()
        if start_day:
            rollups = rollups.filter(day__gte=start_day)
        if end_day:
            rollups = rollups.filter(day__lte=end_day)
        rollups.delete()
        rollup_model.objects.bulk_create(
            rollup_model(day=day, team_id=team, cluster_id=cluster, accelerator_id=acc, job_id=job,
                         **dict(zip(_SUMS, sums)))
            for (day, team, cluster, acc, job), sums in groups.items())
        teams: dict[int, list] = defaultdict(lambda: [Decimal(0), Decimal(0), Decimal(0), 0])
        for row in rollup_model.objects.values_list("team_id", *_SUMS):
            for i, value in enumerate(row[1:]):
                teams[row[0]][i] += value
        spend_model.objects.exclude(team_id__in=list(teams)).update(
            cost_usd=0, gpu_seconds=0, unpriced_gpu_seconds=0, entries=0)
        for team, sums in teams.items():
            spend_model.objects.update_or_create(team_id=team, defaults=dict(zip(_SUMS, sums)))
        return len(groups)


def rebuild_rollups(start_day: dt.date | None = None, end_day: dt.date | None = None) -> int:
    """``rebuild_totals`` of UTC days ``[start_day, end_day]`` (all days when left out); rollup rows written."""
    return rebuild_totals(start_day, end_day)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A totals row that disagrees with the ledger: which (``kind``, ``key``), and the stored and ledger sums."""

    kind: str  # "rollup" or "team"
    key: tuple
    stored: tuple
    ledger: tuple


def totals_mismatches() -> list[Mismatch]:
    """Every rollup and team totals row that differs from the sums of the ledger's entries (exact comparison).

    Reads the whole ledger (an audit, not a hot path). Empty when the running
    totals agree with the entries to the last 1e-9 USD and microsecond.
    """
    ledger = {k: tuple(v) for k, v in _ledger_sums(CostEntry, None, None).items()}
    stored = {(r[0], r[1], r[2], r[3], r[4]): tuple(r[5:]) for r in DailyCostRollup.objects.values_list(
        "day", "team_id", "cluster_id", "accelerator_id", "job_id", *_SUMS)}
    found = [Mismatch("rollup", k, stored.get(k, (0, 0, 0, 0)), ledger.get(k, (0, 0, 0, 0)))
             for k in sorted(set(ledger) | set(stored), key=str)
             if tuple(map(Decimal, stored.get(k, (0, 0, 0, 0)))) != tuple(map(Decimal, ledger.get(k, (0, 0, 0, 0))))]
    teams: dict[int, list] = defaultdict(lambda: [Decimal(0), Decimal(0), Decimal(0), 0])
    for key, sums in ledger.items():
        for i, value in enumerate(sums):
            teams[key[1]][i] += value
    rows = {r[0]: tuple(r[1:]) for r in TeamSpend.objects.values_list("team_id", *_SUMS)}
    for team in sorted(set(teams) | set(rows)):
        want, have = tuple(teams.get(team, (0, 0, 0, 0))), rows.get(team, (0, 0, 0, 0))
        if tuple(map(Decimal, have)) != tuple(map(Decimal, want)):
            found.append(Mismatch("team", (team,), have, want))
    return found
