"""Rounding for display so that shown rows add up to the shown total (largest remainder method).

Used by the reports and the web UI's costs page (``balanced_costs``). ``/api/v1/costs/`` keeps each row
its own exact amount rounded half to even (what a reconciliation against the ledger needs).

Amounts stay exact inside (Decimal USD to 1e-9 in the ledger); only what is
shown is rounded. Each row is first rounded down to the quantum (a cent);
the cents still missing to reach the total rounded half to even are given,
one each, to the rows with the largest remainders (ties: the earlier row).
This is Hamilton's apportionment method (largest remainder), as used to
make rounded percentages sum to 100; source: Balinski & Young, *Fair
Representation* (2nd ed., 2001), chapter 2.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

from django.db.models import Sum

from ..aggregation import GROUP_KEYS, UTC_DAY, aggregate_costs

CENT = Decimal("0.01")


def largest_remainder(values: list[Decimal], quantum: Decimal = CENT) -> tuple[list[Decimal], Decimal]:
    """``(rows, total)`` rounded to ``quantum`` so that ``sum(rows) == total``; ``total`` is ``sum(values)``
    rounded half to even. ``values`` are exact Decimals (USD); negative ones are allowed."""
    total = sum(values, Decimal(0)).quantize(quantum, ROUND_HALF_EVEN)
    floors = [v.quantize(quantum, ROUND_FLOOR) for v in values]
    missing = int((total - sum(floors, Decimal(0))) / quantum)
    order = sorted(range(len(values)), key=lambda i: (-(values[i] - floors[i]), i))
    for i in order[:max(0, missing)]:
        floors[i] += quantum
    return floors, total


def balanced_costs(entries, group_by: str) -> tuple[list[dict], dict]:
    """``aggregate_costs`` with the rows' cents re-rounded from exact sums by the largest remainder method, so that
    they add up to the total's cents exactly (the total is unchanged)."""
    rows, total = aggregate_costs(entries, group_by)
    keys = GROUP_KEYS[group_by]
    if group_by == "day":
        entries = entries.annotate(day=UTC_DAY)
    exact = {tuple(r[k] for k in keys.values()): r["usd"] or Decimal(0)
             for r in entries.values(*keys.values()).annotate(usd=Sum("amount_usd")).order_by()}
    rounded, shown_total = largest_remainder([exact.get(_key(row, group_by), Decimal(0)) for row in rows])
    for row, cents in zip(rows, rounded):
        row["cost_usd"] = str(cents)
    total["cost_usd"] = str(shown_total)  # the same cents: the exact sum rounded once
    return rows, total


def _key(row: dict, group_by: str) -> tuple:
    value = tuple(row[k] for k in GROUP_KEYS[group_by])
    return (dt.date.fromisoformat(value[0]),) if group_by == "day" else value
