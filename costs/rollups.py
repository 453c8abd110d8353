"""The ledger's running totals recomputed from the entries: day rollups, job-day rollups and each team's totals row.

Accrual keeps ``DailyCostRollup`` (UTC day x team x cluster x accelerator),
``JobDailyCost`` (UTC day x job) and ``TeamSpend`` in step with the entries
it writes (``costs.ledger``); ``rebuild_totals`` recomputes them from the
ledger alone (after a restore, a manual correction, or to prove they agree:
``totals_mismatches``). An entry counts on the UTC day of its
``interval_start`` (the costs API's and the budgets' rule).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from datetime import UTC
from decimal import Decimal

from django.db import connection, transaction

from core.gpus import MILLI_PER_GPU

from . import running
from .models import ATTEMPT_DAY_KEYS, AttemptDailyCost, CostEntry, DailyCostRollup, JobDailyCost, TeamSpend
from .spend import entries_starting_on, exact_seconds, gpu_seconds, rows_of_days, sql_entries_starting_on

_SUMS = ("gpu_seconds", "cost_usd", "unpriced_gpu_seconds", "entries")
#: The key of each level of totals, in the ledger's column names.
ROLLUP_KEYS = ("day", "team_id", "cluster_id", "accelerator_id")
JOB_DAY_KEYS = ("day", "job_id", "team_id")


def _zero() -> list:
    return [Decimal(0), Decimal(0), Decimal(0), 0]


def _milli_column(entry_model) -> tuple[str, int]:
    """The ledger's column of billed GPUs and milli-GPUs per unit of it: ``gpu_milli`` (1), or on the historical
    model of a migration before it (``costs`` 0016) ``gpus``, whole GPUs (1000)."""
    names = {f.name for f in entry_model._meta.get_fields()}
    return ("gpu_milli", 1) if "gpu_milli" in names else ("gpus", MILLI_PER_GPU)


def ledger_sums(entry_model=CostEntry, start_day: dt.date | None = None, end_day: dt.date | None = None
                ) -> tuple[dict[tuple, list], dict[tuple, list]]:
    """The sums of the ledger, in Python: ``(by ROLLUP_KEYS, by JOB_DAY_KEYS, by ATTEMPT_DAY_KEYS)``, each key -> [GPU-seconds, USD,
    unknown-cost GPU-seconds, entries], over the entries starting on UTC days ``[start_day, end_day]``."""
    entries = entries_starting_on(entry_model.objects.all(), start_day, end_day)
    rollups: dict[tuple, list] = defaultdict(_zero)
    job_days: dict[tuple, list] = defaultdict(_zero)
    attempt_days: dict[tuple, list] = defaultdict(_zero)
    column, per = _milli_column(entry_model)
    for team, cluster, acc, job, attempt, amount_held, lo, hi, amount in entries.values_list(
            "team_id", "cluster_id", "accelerator_id", "job_id", "attempt_id", column, "interval_start",
            "interval_end", "amount_usd").iterator():
        day = lo.astimezone(UTC).date()
        held = gpu_seconds(amount_held * per, exact_seconds(hi - lo))
        for s in (rollups[(day, team, cluster, acc)], job_days[(day, job, team)],
                  attempt_days[(day, attempt, team, cluster, acc)]):
            s[0] += held
            s[1] += amount or 0
            s[2] += held if amount is None else 0
            s[3] += 1
    return rollups, job_days, attempt_days


def _rebuild_postgresql(tables, start_day, end_day, column: str = "gpu_milli") -> int:
    entry_t, rollup_t, job_day_t, spend_t, attempt_day_t = (*tables, None)[:5]
    bounds, params = sql_entries_starting_on(start_day, end_day)
    where = ["TRUE", *bounds]
    days = [f"day {op} %s" for op, d in ((">=", start_day), ("<=", end_day)) if d] or ["TRUE"]
    # milli-GPUs x seconds x 0.001: exact (a product, no division); whole GPUs before ``costs`` 0016
    scale = " * 0.001" if column == "gpu_milli" else ""
    held = f"e.{column} * EXTRACT(EPOCH FROM e.interval_end - e.interval_start){scale}"
    sums = (f"SUM({held}), COALESCE(SUM(e.amount_usd), 0), "
            f"COALESCE(SUM({held}) FILTER (WHERE e.amount_usd IS NULL), 0), COUNT(*), now()")
    day = "(e.interval_start AT TIME ZONE 'UTC')::date"
    with connection.cursor() as cursor:
        cursor.execute(f'LOCK TABLE "{spend_t}", "{rollup_t}", "{job_day_t}" IN SHARE ROW EXCLUSIVE MODE')
        written = 0
        levels = [(rollup_t, ROLLUP_KEYS, f"{day}, e.team_id, e.cluster_id, e.accelerator_id"),
                  (job_day_t, JOB_DAY_KEYS, f"{day}, e.job_id, e.team_id")]
        if attempt_day_t is not None:
            levels.append((attempt_day_t, ATTEMPT_DAY_KEYS,
                           f"{day}, e.attempt_id, e.team_id, e.cluster_id, e.accelerator_id"))
        for table, keys, select in levels:
            cursor.execute(f'DELETE FROM "{table}" WHERE {" AND ".join(days)}', [d for d in (start_day, end_day) if d])
            cursor.execute(
                f'INSERT INTO "{table}" ({", ".join(keys)}, gpu_seconds, cost_usd, unpriced_gpu_seconds, entries, '
                f'rebuilt_at) SELECT {select}, {sums} FROM "{entry_t}" AS e WHERE {" AND ".join(where)} '
                f"GROUP BY {', '.join(str(i + 1) for i in range(len(keys)))}", params)
            written += cursor.rowcount
        cursor.execute(
            f'INSERT INTO "{spend_t}" (team_id, cost_usd, gpu_seconds, unpriced_gpu_seconds, entries, updated_at) '
            f"SELECT team_id, SUM(cost_usd), SUM(gpu_seconds), SUM(unpriced_gpu_seconds), SUM(entries), now() "
            f'FROM "{rollup_t}" GROUP BY team_id ON CONFLICT (team_id) DO UPDATE SET '
            f"cost_usd = EXCLUDED.cost_usd, gpu_seconds = EXCLUDED.gpu_seconds, "
            f"unpriced_gpu_seconds = EXCLUDED.unpriced_gpu_seconds, entries = EXCLUDED.entries, "
            f"updated_at = EXCLUDED.updated_at")
        cursor.execute(
            f'UPDATE "{spend_t}" SET cost_usd = 0, gpu_seconds = 0, unpriced_gpu_seconds = 0, entries = 0 '
            f'WHERE team_id NOT IN (SELECT team_id FROM "{rollup_t}")')
    return written


def rebuild_totals(start_day: dt.date | None = None, end_day: dt.date | None = None, *, models=None) -> int:
    """Recompute the day and job-day rollups of UTC days ``[start_day, end_day]`` (every day when left out) from
    the ledger, then every team's ``TeamSpend`` from the day rollups and, with the attempt-day rollups, the running
    GPU allocation (``costs.running.rebuild``); returns the number of rollup rows written.

    One transaction; on PostgreSQL it locks the totals tables against
    writers first (accrual waits, readers see the old or the new totals,
    never half) and sums in SQL with exact numerics. ``models`` is
    ``(CostEntry, DailyCostRollup, JobDailyCost, TeamSpend[, AttemptDailyCost])``
    (a migration passes its historical models; without the fifth, attempt-day
    rollups are left alone; with them, the running allocation is left alone).
    """
    current = models is None  # a migration's historical models: the running allocation is its own migration's
    models = models or (CostEntry, DailyCostRollup, JobDailyCost, TeamSpend, AttemptDailyCost)
    with transaction.atomic():
        written = _rebuild_levels(models, start_day, end_day)
        if current:
            if connection.vendor == "postgresql":
                from .models import AllocationRunningTotal, AllocationSeries

                with connection.cursor() as cursor:
                    cursor.execute(f'LOCK TABLE "{AllocationSeries._meta.db_table}", '
                                   f'"{AllocationRunningTotal._meta.db_table}" IN SHARE ROW EXCLUSIVE MODE')
            written += running.rebuild(start_day, end_day)
        return written


def _rebuild_levels(models, start_day: dt.date | None, end_day: dt.date | None) -> int:
    """``rebuild_totals``' day, job-day, attempt-day and team totals (in its transaction); rows written."""
    entry_model, rollup_model, job_day_model, spend_model = models[:4]
    attempt_day_model = models[4] if len(models) > 4 else None
    if connection.vendor == "postgresql":
        return _rebuild_postgresql([m._meta.db_table for m in models], start_day, end_day,
                                   _milli_column(entry_model)[0])
    rollups, job_days, attempt_days = ledger_sums(entry_model, start_day, end_day)
    levels = [(rollup_model, ROLLUP_KEYS, rollups), (job_day_model, JOB_DAY_KEYS, job_days)]
    if attempt_day_model is not None:
        levels.append((attempt_day_model, ATTEMPT_DAY_KEYS, attempt_days))
    for model, names, groups in levels:
        rows_of_days(model.objects.all(), start_day, end_day).delete()
        model.objects.bulk_create(model(**dict(zip(names, key, strict=True)), **dict(zip(_SUMS, sums, strict=True)))
                                  for key, sums in groups.items())
    teams: dict[int, list] = defaultdict(_zero)
    for row in rollup_model.objects.values_list("team_id", *_SUMS):
        for i, value in enumerate(row[1:]):
            teams[row[0]][i] += value
    spend_model.objects.exclude(team_id__in=list(teams)).update(
        cost_usd=0, gpu_seconds=0, unpriced_gpu_seconds=0, entries=0)
    for team, sums in teams.items():
        spend_model.objects.update_or_create(team_id=team, defaults=dict(zip(_SUMS, sums, strict=True)))
    return sum(len(groups) for _model, _names, groups in levels)


def rebuild_rollups(start_day: dt.date | None = None, end_day: dt.date | None = None) -> int:
    """``rebuild_totals`` of UTC days ``[start_day, end_day]`` (all days when left out); rollup rows written."""
    return rebuild_totals(start_day, end_day)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A totals row that disagrees with the ledger: which (``kind``, ``key``), and the stored and ledger sums."""

    kind: str  # "rollup", "job-day", "attempt-day", "team" or "running" (``costs.running``: series key and day)
    key: tuple
    stored: tuple
    ledger: tuple


def _differences(kind: str, stored: dict, ledger: dict) -> list[Mismatch]:
    zero = (0, 0, 0, 0)
    return [Mismatch(kind, k, tuple(stored.get(k, zero)), tuple(ledger.get(k, zero)))
            for k in sorted(set(ledger) | set(stored), key=str)
            if tuple(map(Decimal, stored.get(k, zero))) != tuple(map(Decimal, ledger.get(k, zero)))]


def totals_mismatches() -> list[Mismatch]:
    """Every rollup, job-day, team totals and running allocation row that differs from the sums of the ledger
    (exact comparison).

    Reads the whole ledger (an audit, not a hot path). Empty when the running
    totals agree with the entries to the last 1e-9 USD and microsecond.
    """
    rollups, job_days, attempt_days = ledger_sums()
    teams: dict[tuple, list] = defaultdict(_zero)
    for key, sums in rollups.items():
        for i, value in enumerate(sums):
            teams[(key[1],)][i] += value
    found = []
    for kind, model, keys, ledger in (("rollup", DailyCostRollup, ROLLUP_KEYS, rollups),
                                      ("job-day", JobDailyCost, JOB_DAY_KEYS, job_days),
                                      ("attempt-day", AttemptDailyCost, ATTEMPT_DAY_KEYS, attempt_days),
                                      ("team", TeamSpend, ("team_id",), teams)):
        stored = {r[:len(keys)]: r[len(keys):] for r in model.objects.values_list(*keys, *_SUMS)}
        found += _differences(kind, stored, ledger)
    found += [Mismatch("running", tuple(m[:-2]), m[-2] or (), m[-1] or ()) for m in running.running_mismatches()]
    return found
