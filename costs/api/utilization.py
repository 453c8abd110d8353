"""``/api/v1/utilization/`` (GPU utilization from the rollups) and ``/api/v1/budget-status/`` (budgets' money now).

Utilization rows aggregate UtilizationRollup exactly: average utilization
is sample weighted (``sum(util_sum) / sum(samples)``), "no data" is null,
coverage is ``samples / expected samples``. Rollups are per UTC day, so
``start``/``end`` select whole days: those whose midnight-to-midnight span
starts in ``[floor(start), end)``.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal

from django.db.models import Sum
from django.db.models.functions import TruncDate
from drf_spectacular.utils import extend_schema
from django.utils import timezone
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from core.money import usd_cents
from core.viewsets import ScopedGenericViewSet
from quotas.models import Budget, scope_to_teams

from ..budgets import budget_status
from ..models import CostEntry, UtilizationRollup
from .serializers import BudgetStatusSerializer, CostQuerySerializer, UtilizationReportSerializer

GROUP_KEYS = {
    "team": {"team": "team__slug"},
    "cluster": {"cluster": "cluster__name"},
    "accelerator": {"accelerator": "accelerator__name"},
    "job": {"job": "job_id", "job_name": "job__name"},
    "day": {"day": "day"},
}


def filter_days(rollups, start: dt.datetime | None, end: dt.datetime | None):
    """Rollups of the UTC days that start in ``[floor(start) , end)``."""
    if start is not None:
        rollups = rollups.filter(day__gte=start.astimezone(dt.timezone.utc).date())
    if end is not None:
        end = end.astimezone(dt.timezone.utc)
        last = end.date() if end.time() != dt.time() else end.date() - dt.timedelta(days=1)
        rollups = rollups.filter(day__lte=last)
    return rollups


def idle_costs(rollups) -> dict[int, Decimal]:
    """USD of idle GPU time per rollup id: the ledger cost of its attempt on its day x idle share."""
    rows = list(rollups.filter(idle_gpu_seconds__gt=0).values("pk", "attempt_id", "day", "gpu_seconds", "idle_gpu_seconds"))
    if not rows:
        return {}
    ledger = {
        (r["attempt_id"], r["d"]): r["usd"]
        for r in CostEntry.objects.filter(attempt_id__in={r["attempt_id"] for r in rows})
        .annotate(d=TruncDate("interval_start", tzinfo=dt.timezone.utc))
        .values("attempt_id", "d").annotate(usd=Sum("amount_usd"))
    }
    return {
        r["pk"]: ledger.get((r["attempt_id"], r["day"]), Decimal(0)) * Decimal(r["idle_gpu_seconds"] / r["gpu_seconds"])
        for r in rows
    }


def aggregate_utilization(rollups, group_by: str) -> tuple[list[dict], dict]:
    """Group UtilizationRollup rows by ``group_by``; returns ``(rows, total)`` (see the module docstring).

    Each row: key fields, ``gpu_hours`` (allocated), ``avg_gpu_util_percent``
    (null for no data), ``coverage`` (0-1, null without expected samples),
    ``avg_memory_used_mib``, ``idle_gpu_hours``, ``idle_cost_usd`` (cents).
    """
    keys = GROUP_KEYS[group_by]
    idle_usd = idle_costs(rollups)
    sums: dict[tuple, dict] = defaultdict(lambda: defaultdict(float))
    for r in rollups.values("pk", *keys.values(), "gpu_seconds", "samples", "expected_samples", "util_sum",
                            "memory_samples", "avg_memory_used_mib", "idle_gpu_seconds"):
        for group in (tuple(r[k] for k in keys.values()), None):
            s = sums[group]
            for f in ("gpu_seconds", "samples", "expected_samples", "util_sum", "memory_samples"):
                s[f] += r[f]
            s["memory_sum"] += (r["avg_memory_used_mib"] or 0) * r["memory_samples"]
            s["idle_gpu_seconds"] += r["idle_gpu_seconds"] or 0
            s["idle_usd"] = s.get("idle_usd", Decimal(0)) + idle_usd.get(r["pk"], Decimal(0))

    def present(s) -> dict:
        return {
            "gpu_hours": round(s["gpu_seconds"] / 3600, 6),
            "avg_gpu_util_percent": round(s["util_sum"] / s["samples"], 3) if s["samples"] else None,
            "coverage": round(min(1.0, s["samples"] / s["expected_samples"]), 4) if s["expected_samples"] else None,
            "avg_memory_used_mib": round(s["memory_sum"] / s["memory_samples"], 1) if s["memory_samples"] else None,
            "idle_gpu_hours": round(s["idle_gpu_seconds"] / 3600, 6),
            "idle_cost_usd": usd_cents(s.get("idle_usd", Decimal(0))),
        }

    rows = []
    for group in sorted((g for g in sums if g is not None), key=lambda g: tuple(str(x) for x in g)):
        row = dict(zip(keys, group))
        if group_by == "day":
            row["day"] = row["day"].isoformat()
        row.update(present(sums[group]))
        rows.append(row)
    total = present(sums[None]) if None in sums else present(defaultdict(float))
    return rows, total


@extend_schema(tags=["costs"])
class UtilizationViewSet(ScopedGenericViewSet):
    """GPU utilization of the user's teams (all for staff), from Prometheus rollups per attempt and day."""

    queryset = UtilizationRollup.objects.all()
    filter_backends = []
    pagination_class = None
    serializer_class = UtilizationReportSerializer

    def scope_queryset(self, queryset, user):
        return scope_to_teams(queryset, user)

    @extend_schema(parameters=[CostQuerySerializer], responses=UtilizationReportSerializer)
    def list(self, request):
        """Average GPU utilization (%), coverage, memory, idle GPU-hours and their USD per group over UTC days.

        400 with field errors for a bad ``group_by``, a naive or malformed datetime, or ``end <= start``.
        """
        query = CostQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        rollups = filter_days(self.get_queryset(), params.get("start"), params.get("end"))
        if "team" in params:
            rollups = rollups.filter(team__slug=params["team"])
        rows, total = aggregate_utilization(rollups, params["group_by"])
        return Response({
            "group_by": params["group_by"],
            "start": params["start"].isoformat() if "start" in params else None,
            "end": params["end"].isoformat() if "end" in params else None,
            "results": rows,
            "total": total,
        })


@extend_schema(tags=["costs"])
class BudgetStatusViewSet(ScopedGenericViewSet):
    """Read-only money of each budget in its current period: spent, committed, remaining, forecast (USD).

    A custom budget whose dates do not contain now has no current period and is left out (404 alone).
    """

    queryset = Budget.objects.select_related("team").order_by("pk")
    serializer_class = BudgetStatusSerializer
    filter_backends = []
    pagination_class = None

    def scope_queryset(self, queryset, user):
        return scope_to_teams(queryset, user).distinct()

    def list(self, request):
        now = timezone.now()
        statuses = [s for s in (budget_status(b, now) for b in self.get_queryset()) if s is not None]
        return Response(BudgetStatusSerializer(statuses, many=True).data)

    def retrieve(self, request, pk=None):
        status = budget_status(self.get_object())
        if status is None:
            raise NotFound("this budget has no current period")
        return Response(BudgetStatusSerializer(status).data)
