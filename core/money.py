"""Money: the ledger's rounding quantum, and Decimal USD rounded to cents at the edge only (docs/design.md, Units)."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

#: The ledger's rounding quantum, USD: each interval cost (``costs.ledger``) and each USD bound derived from
#: GPU-seconds (``costs.spend``) is rounded half to even to 1e-9 USD, the scale of ``CostEntry.amount_usd`` and
#: ``DailyCostRollup.cost_usd`` (9 decimal places); sums of such amounts are exact.
LEDGER_QUANTUM = Decimal("0.000000001")
#: The presentation quantum, USD: amounts leave the server rounded half to even to cents (``usd_cents``).
CENT = Decimal("0.01")


#: Significant digits a non-zero amount below half a cent keeps when shown (``usd_cents``).
SMALL_AMOUNT_DIGITS = 2


def usd_cents(amount: Decimal | None) -> str | None:
    """A USD amount as a string rounded to cents, half to even (the presentation rule of docs/design.md, Units);
    a non-zero amount that cents would show as ``0.00`` keeps its first ``SMALL_AMOUNT_DIGITS`` significant digits
    instead (``0.0000394`` -> ``"0.000039"``), so a cost that is not zero never reads as zero. None: None."""
    if amount is None:
        return None
    exact = Decimal(amount)
    cents = exact.quantize(CENT, ROUND_HALF_EVEN)
    if cents or not exact:
        return str(cents)
    small = exact.quantize(Decimal(1).scaleb(exact.adjusted() - SMALL_AMOUNT_DIGITS + 1), ROUND_HALF_EVEN)
    return format(small.normalize(), "f")


def price_per_hour(price: Decimal | str) -> str:
    """A price (Decimal USD per GPU-, vCPU- or GiB-hour, or its decimal string) with every digit it has, at least to
    cents, without the ``$``: ``6.880000`` -> ``"6.88"``, ``2.5`` -> ``"2.50"``, ``0.031611`` -> ``"0.031611"``."""
    exact = Decimal(price).normalize()
    return str(exact.quantize(CENT)) if exact.as_tuple().exponent > -2 else format(exact, "f")


def shown_usd(amount: Decimal | None, unpriced_hours: float | Decimal = 0) -> str | None:
    """The one rounding of a money figure for display: ``usd_cents`` of the exact priced ``amount`` (USD), or None
    ("unknown") when nothing of it is priced: ``amount`` None or 0 while ``unpriced_hours`` (GPU- or vCPU-hours
    accrued without a price, docs/design.md "Cost ledger") are above 0. Never a bare 0 for a cost nobody knows."""
    if amount is None or (not amount and unpriced_hours):
        return None
    return usd_cents(amount)



def rounding_difference(total: str | None, rows: list[str | None]) -> str:
    """``total`` (cents string) minus the sum of the shown ``rows`` (cents strings; None, an unknown figure, counts
    0), as a USD string to cents: what a table's rows, each its exact sum rounded once, miss or exceed of its total,
    itself the table's exact sum rounded once (the table rule of docs/design.md "Cost ledger"). ``"0.00"`` when they
    add up, or miss by less than half a cent (rows below a cent are shown to two significant digits)."""
    shown = sum((Decimal(r) for r in rows if r is not None), Decimal(0))
    return str((Decimal(total or 0) - shown).quantize(CENT) + 0)  # + 0: a difference below half a cent is 0.00, never -0.00
