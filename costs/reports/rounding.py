"""Rounding for display so that shown rows add up to the shown total (largest remainder method).

Amounts stay exact inside (Decimal USD to 1e-9 in the ledger); only what is
shown is rounded. Each row is first rounded down to the quantum (a cent);
the cents still missing to reach the total rounded half to even are given,
one each, to the rows with the largest remainders (ties: the earlier row).
This is Hamilton's apportionment method (largest remainder), as used to
make rounded percentages sum to 100; source: Balinski & Young, *Fair
Representation* (2nd ed., 2001), chapter 2.
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

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
