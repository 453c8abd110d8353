"""Rounding for display so that shown rows add up to the shown total (largest remainder method).

Used by the reports and the web UI's costs page (``balanced_window``). ``/api/v1/costs/`` keeps each row
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

from core.money import CENT

from ..aggregation import present_sums, window_sums


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


def balanced_window(group_by: str, start: dt.datetime | None, end: dt.datetime | None, *, scope=None,
                    team_slug: str | None = None) -> tuple[list[dict], dict]:
    """``costs.aggregation.aggregate_window`` with the rows' cents re-rounded from their exact sums by the largest
    remainder method, so that they add up to the total's cents exactly (the total is unchanged: the exact sum
    rounded once). Arguments as ``aggregate_window``; raises KeyError for an unknown ``group_by``."""
    sums = window_sums(group_by, start, end, scope=scope, team_slug=team_slug)
    rows, total = present_sums(sums, group_by)
    rounded, shown_total = largest_remainder([sums[key][1] for key in sorted(sums)])  # present_sums' row order
    for row, cents in zip(rows, rounded, strict=True):
        if row["cost_usd"] is not None:  # null: none of it priced (its unpriced hours beside it)
            row["cost_usd"] = str(cents)
    if total["cost_usd"] is not None:
        total["cost_usd"] = str(shown_total)
    return rows, total
