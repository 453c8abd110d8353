"""Aggregates of the cost ledger and of the utilization rollups, by team, cluster, accelerator, job or UTC day.

The one implementation behind ``/api/v1/costs/``, ``/api/v1/utilization/``,
the web UI's cost pages and the reports (``costs.reports``).

Cost: aggregation is pushed to the database (one GROUP BY query, by group
and GPU count); an entry counts in the window that contains its
``interval_start``, the rule budgets use.

Utilization rows aggregate UtilizationRollup exactly: average utilization
is sample weighted (``sum(util_sum) / sum(samples)``), "no data" is null,
coverage is ``samples / expected samples``. Rollups are per UTC day, so a
window ``[start, end)`` selects whole days: those whose midnight-to-midnight
span starts in ``[floor(start), end)`` (``filter_days``).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db.models import DurationField, ExpressionWrapper, F, Sum
from django.db.models.functions import TruncDate

from core.money import usd_cents

from .utilization import aggregate_utilization  # noqa: F401  (utilization rows live with their collection)

# Output key -> lookup, per group_by (the ledger and the rollups name them alike; the ledger's "day" is annotated).
GROUP_KEYS = {
    "team": {"team": "team__slug"},
    "cluster": {"cluster": "cluster__name"},
    "accelerator": {"accelerator": "accelerator__name"},
    "job": {"job": "job_id", "job_name": "job__name"},
    "attempt": {"job": "job_id", "attempt": "attempt_id", "attempt_number": "attempt__number"},
    "day": {"day": "day"},
}
UTC_DAY = TruncDate("interval_start", tzinfo=dt.timezone.utc)
# Summed per (group, gpus) and multiplied by gpus in Python: SQLite cannot multiply a duration in SQL.
HELD_TIME = ExpressionWrapper(F("interval_end") - F("interval_start"), output_field=DurationField())
# The columns ``add_utilization`` puts on cost rows.
UTILIZATION_COLUMNS = ("avg_gpu_util_percent", "observed_gpu_hours", "idle_gpu_hours", "unobserved_gpu_hours",
                       "idle_cost_usd")


def gpu_hours(gpu_time: dt.timedelta | None) -> float:
    """GPU-time as GPU-hours, rounded to 6 decimals (None counts as no time)."""
    return round((gpu_time or dt.timedelta()).total_seconds() / 3600, 6)


def aggregate_costs(entries, group_by: str) -> tuple[list[dict], dict]:
    """Group ledger ``entries`` (a CostEntry queryset) by ``group_by``; returns ``(rows, total)``.

    Each row holds the group's key fields (see ``GROUP_KEYS``), ``gpu_hours``
    (float) and ``cost_usd`` (string, cents, half-even); rows are ordered by
    key. The total is the exact sum of all entries, rounded once. Raises
    KeyError for a ``group_by`` not in ``GROUP_KEYS``.
    """
    keys = GROUP_KEYS[group_by]
    if group_by == "day":
        entries = entries.annotate(day=UTC_DAY)
    lookups = list(keys.values())
    grouped = (
        entries.values(*lookups, "gpus").annotate(held=Sum(HELD_TIME), cost=Sum("amount_usd")).order_by(*lookups)
    )
    rows: dict[tuple, dict] = {}
    for part in grouped:
        row = rows.setdefault(tuple(part[lookup] for lookup in lookups),
                              {"gpu_time": dt.timedelta(), "cost": Decimal(0)})
        row["gpu_time"] += part["gpus"] * (part["held"] or dt.timedelta())
        row["cost"] += part["cost"] or Decimal(0)
    results = []
    for key, sums in rows.items():
        row = dict(zip(keys, key))
        if group_by == "day":
            row["day"] = row["day"].isoformat()
        row.update(gpu_hours=gpu_hours(sums["gpu_time"]), cost_usd=usd_cents(sums["cost"]))
        results.append(row)
    total_time = sum((sums["gpu_time"] for sums in rows.values()), dt.timedelta())
    total_cost = sum((sums["cost"] for sums in rows.values()), Decimal(0))
    return results, {"gpu_hours": gpu_hours(total_time), "cost_usd": usd_cents(total_cost)}


def add_utilization(rows: list[dict], total: dict, rollups, group_by: str) -> None:
    """Add the utilization columns (``UTILIZATION_COLUMNS``) of each group to the cost rows, in place.

    ``rows`` and ``total`` are what ``aggregate_costs`` returned for the same
    ``group_by``; ``rollups`` a UtilizationRollup queryset (already narrowed
    with ``filter_days``). Utilization comes from day rollups, so for a window
    that cuts a UTC day it covers the whole day; a group without rollups gets
    nulls ("no data").
    """
    util_rows, util_total = aggregate_utilization(rollups, group_by)
    keys = list(GROUP_KEYS[group_by])
    by_key = {tuple(r[k] for k in keys): r for r in util_rows}
    for row in rows:
        found = by_key.get(tuple(row[k] for k in keys), {})
        row.update({c: found.get(c) for c in UTILIZATION_COLUMNS})
    total.update({c: util_total[c] if util_rows else None for c in UTILIZATION_COLUMNS})


def filter_days(rollups, start: dt.datetime | None, end: dt.datetime | None):
    """Rollups (a UtilizationRollup queryset) of the UTC days that start in ``[floor(start), end)``.

    ``start`` and ``end`` are aware datetimes; None leaves that end open.
    """
    if start is not None:
        rollups = rollups.filter(day__gte=start.astimezone(dt.timezone.utc).date())
    if end is not None:
        end = end.astimezone(dt.timezone.utc)
        last = end.date() if end.time() != dt.time() else end.date() - dt.timedelta(days=1)
        rollups = rollups.filter(day__lte=last)
    return rollups
