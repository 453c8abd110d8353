"""``/api/v1/prices/`` (the price catalog) and ``/api/v1/costs/`` (aggregates of the cost ledger).

Aggregation is pushed to the database (one GROUP BY query, by group and
GPU count); an entry counts in the window that contains its
``interval_start``, the rule budgets use.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db.models import DurationField, ExpressionWrapper, F, Sum
from django.db.models.functions import TruncDate
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from core.money import usd_cents
from core.viewsets import ScopedGenericViewSet, ScopedReadOnlyViewSet

from ..models import CostEntry, Price, UtilizationRollup
from .utilization import aggregate_utilization, filter_days
from .filtersets import PriceFilterSet
from .serializers import CostQuerySerializer, CostReportSerializer, PriceSerializer
from quotas.models import scope_to_teams

# Output key -> ledger lookup, per group_by ("day" is annotated first).
GROUP_KEYS = {
    "team": {"team": "team__slug"},
    "cluster": {"cluster": "cluster__name"},
    "accelerator": {"accelerator": "accelerator__name"},
    "job": {"job": "job_id", "job_name": "job__name"},
    "day": {"day": "day"},
}
UTC_DAY = TruncDate("interval_start", tzinfo=dt.timezone.utc)
# Summed per (group, gpus) and multiplied by gpus in Python: SQLite cannot multiply a duration in SQL.
HELD_TIME = ExpressionWrapper(F("interval_end") - F("interval_start"), output_field=DurationField())


def gpu_hours(gpu_time: dt.timedelta | None) -> float:
    """GPU-time as GPU-hours, rounded to 6 decimals."""
    return round((gpu_time or dt.timedelta()).total_seconds() / 3600, 6)


def aggregate_costs(entries, group_by: str) -> tuple[list[dict], dict]:
    """Group ledger ``entries`` (a CostEntry queryset) by ``group_by``; returns ``(rows, total)``.

    Each row holds the group's key fields (see ``GROUP_KEYS``), ``gpu_hours``
    (float) and ``cost_usd`` (string, cents, half-even); the total is the
    exact sum of all entries, rounded once.
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


UTILIZATION_COLUMNS = ("avg_gpu_util_percent", "idle_gpu_hours", "idle_cost_usd")


def add_utilization(rows: list[dict], total: dict, rollups, group_by: str) -> None:
    """Add the utilization columns (``UTILIZATION_COLUMNS``) of each group to the cost rows, in place.

    Utilization comes from day rollups, so for a window that cuts a UTC day
    it covers the whole day; a group without rollups gets nulls ("no data").
    """
    util_rows, util_total = aggregate_utilization(rollups, group_by)
    keys = list(GROUP_KEYS[group_by])
    by_key = {tuple(r[k] for k in keys): r for r in util_rows}
    for row in rows:
        found = by_key.get(tuple(row[k] for k in keys), {})
        row.update({c: found.get(c) for c in UTILIZATION_COLUMNS})
    total.update({c: util_total[c] if util_rows else None for c in UTILIZATION_COLUMNS})


@extend_schema(tags=["costs"])
class PriceViewSet(ScopedReadOnlyViewSet):
    """The effective-dated price catalog (USD per GPU-hour), readable by every user."""

    queryset = Price.objects.select_related("accelerator", "cluster")
    serializer_class = PriceSerializer
    filterset_class = PriceFilterSet
    ordering_fields = ["usd_per_gpu_hour", "effective_from"]

    def scope_queryset(self, queryset, user):
        return queryset  # public list prices


@extend_schema(tags=["costs"])
class CostViewSet(ScopedGenericViewSet):
    """Cost aggregates of the user's teams (all teams for staff) from the append-only ledger."""

    queryset = CostEntry.objects.all()
    filter_backends = []
    pagination_class = None
    serializer_class = CostReportSerializer

    def scope_queryset(self, queryset, user):
        return scope_to_teams(queryset, user)

    @staticmethod
    def utilization_rollups(user, params):
        """The user's utilization rollups of the UTC days the query touches (scoped as the ledger is)."""
        rollups = scope_to_teams(UtilizationRollup.objects.all(), user)
        if "team" in params:
            rollups = rollups.filter(team__slug=params["team"])
        return filter_days(rollups, params.get("start"), params.get("end"))

    @extend_schema(parameters=[CostQuerySerializer], responses=CostReportSerializer)
    def list(self, request):
        """GPU-hours and USD per team, cluster, accelerator, job or UTC day over ``[start, end)``.

        400 with field errors for a bad ``group_by``, a naive or malformed
        datetime, or ``end <= start``.
        """
        query = CostQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        entries = self.get_queryset()
        if "start" in params:
            entries = entries.filter(interval_start__gte=params["start"])
        if "end" in params:
            entries = entries.filter(interval_start__lt=params["end"])
        if "team" in params:
            entries = entries.filter(team__slug=params["team"])
        rows, total = aggregate_costs(entries, params["group_by"])
        if params["with_utilization"]:
            add_utilization(rows, total, self.utilization_rollups(request.user, params), params["group_by"])
        return Response({
            "group_by": params["group_by"],
            "start": params["start"].isoformat() if "start" in params else None,
            "end": params["end"].isoformat() if "end" in params else None,
            "results": rows,
            "total": total,
        })
