"""Spend read from the ledger: the sums that admission and budget status need.

Reads ``CostEntry`` only, so admission (in ``jobs``) can use it without
importing the accrual code above it.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db.models import Sum

from .models import CostEntry


def exact_seconds(delta: dt.timedelta) -> Decimal:
    """A timedelta as an exact Decimal number of seconds (microsecond resolution)."""
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / Decimal(1_000_000)


def ledger_usd(team_id: int, start: dt.datetime, end: dt.datetime) -> Decimal:
    """USD of the team's ledger entries with ``interval_start`` in ``[start, end)``."""
    return CostEntry.objects.filter(team_id=team_id, interval_start__gte=start, interval_start__lt=end).aggregate(
        s=Sum("amount_usd"))["s"] or Decimal(0)


def ledger_usd_prorated(team_id: int, start: dt.datetime, end: dt.datetime) -> Decimal:
    """USD the team's ledger entries accrued inside ``[start, end)``, an entry counted by the share of it inside.

    For the burn rate: an entry written once for a long interval (a final
    accrual after a pause) must spread over the hours it covers.
    """
    total = Decimal(0)
    for lo, hi, amount in CostEntry.objects.filter(team_id=team_id, interval_start__lt=end, interval_end__gt=start) \
            .values_list("interval_start", "interval_end", "amount_usd"):
        inside = exact_seconds(min(hi, end) - max(lo, start))
        total += amount * inside / exact_seconds(hi - lo)
    return total
