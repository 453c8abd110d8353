"""``/api/v1/prices/`` (the price catalog) and ``/api/v1/costs/`` (aggregates of the cost ledger, from its rollups).

The aggregation itself is ``costs.aggregation`` (its rules are documented there).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from core.viewsets import ScopedGenericViewSet, ScopedReadOnlyViewSet
from quotas.models import scope_to_teams

from ..aggregation import add_energy, add_utilization, aggregate_window, filter_days
from ..models import CostEntry, Price, UtilizationRollup
from .filtersets import PriceFilterSet
from .serializers import CostQuerySerializer, CostReportSerializer, PriceSerializer


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
    schema_summaries = {"list": "Cost by team, cluster, accelerator, job or UTC day"}

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
        """GPU-hours and USD per team, cluster, accelerator, job or UTC day over ``[start, end)``, with the GPUs'
        energy (kWh, null: not measured) and its cost at the cluster's electricity price as a line of its own
        (``energy_cost_usd``, null: unknown price, never $0; not part of ``cost_usd``).

        400 with field errors for a bad ``group_by``, a naive or malformed
        datetime, or ``end <= start``.
        """
        query = CostQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        user = request.user
        rows, total = aggregate_window(params["group_by"], params.get("start"), params.get("end"),
                                       scope=lambda qs: self.scope_queryset(qs, user), team_slug=params.get("team"))
        rollups = self.utilization_rollups(request.user, params)
        add_energy(rows, total, rollups, params["group_by"])
        if params["with_utilization"]:
            add_utilization(rows, total, rollups, params["group_by"])
        return Response({
            "group_by": params["group_by"],
            "start": params["start"].isoformat() if "start" in params else None,
            "end": params["end"].isoformat() if "end" in params else None,
            "results": rows,
            "total": total,
        })
