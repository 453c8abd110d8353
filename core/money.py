"""Money presentation: Decimal USD rounded to cents at the edge only (docs/design.md, Units)."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

CENT = Decimal("0.01")


def usd_cents(amount: Decimal | None) -> str | None:
    """A USD amount as a string rounded to cents, half to even (the presentation rule of docs/design.md, Units)."""
    if amount is None:
        return None
    return str(Decimal(amount).quantize(CENT, ROUND_HALF_EVEN))
