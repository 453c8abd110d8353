"""Daily cost rollups per team, cluster and accelerator, derived from the ledger and rebuildable from it.

An entry counts on the UTC day of its ``interval_start`` (the costs API's
and the budgets' rule), so a rollup day always sums to the API's day.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Sum
from django.db.models.functions import TruncDate

from .spend import exact_seconds
from .models import CostEntry, DailyCostRollup

HELD = ExpressionWrapper(F("interval_end") - F("interval_start"), output_field=DurationField())


def rebuild_rollups(start_day: dt.date | None = None, end_day: dt.date | None = None) -> int:
    """Replace the rollups of UTC days ``[start_day, end_day]`` (all days when left out) with sums of the ledger.

    One transaction: readers see the old or the new rollups, never half.
    Returns the number of rollup rows written.
    """
    entries = CostEntry.objects.annotate(day=TruncDate("interval_start", tzinfo=dt.timezone.utc))
    rollups = DailyCostRollup.objects.all()
    if start_day:
        entries, rollups = entries.filter(day__gte=start_day), rollups.filter(day__gte=start_day)
    if end_day:
        entries, rollups = entries.filter(day__lte=end_day), rollups.filter(day__lte=end_day)
    groups: dict[tuple, dict] = {}
    for part in entries.values("day", "team_id", "cluster_id", "accelerator_id", "gpus").annotate(
        held=Sum(HELD), cost=Sum("amount_usd"), n=Count("pk")
    ):
        key = (part["day"], part["team_id"], part["cluster_id"], part["accelerator_id"])
        row = groups.setdefault(key, {"gpu_seconds": Decimal(0), "cost": Decimal(0), "n": 0})
        row["gpu_seconds"] += part["gpus"] * exact_seconds(part["held"])
        row["cost"] += part["cost"]
        row["n"] += part["n"]
    with transaction.atomic():
        rollups.delete()
        DailyCostRollup.objects.bulk_create(
            DailyCostRollup(day=day, team_id=team, cluster_id=cluster, accelerator_id=acc,
                            gpu_seconds=row["gpu_seconds"], cost_usd=row["cost"], entries=row["n"])
            for (day, team, cluster, acc), row in groups.items()
        )
    return len(groups)
