"""``{% load money %}``: ``{{ amount|usd }}``, a Decimal USD amount as every page shows it.

The one rounding of money for display is ``core.money.usd_cents`` (half to even, to cents), the API's; Django's
``floatformat`` rounds half up, so a page using it could show another cent than the API for the same amount.
"""

from __future__ import annotations

from django import template

from core.money import usd_cents

register = template.Library()


@register.filter
def usd(amount) -> str:
    """``amount`` (Decimal USD, or a cents string) rounded to cents half to even, without the ``$`` (an amount
    above 0 below half a cent to two significant digits: ``core.money.usd_cents``); None: ``unknown``."""
    shown = usd_cents(amount) if amount is not None and amount != "" else None
    return "unknown" if shown is None else shown
