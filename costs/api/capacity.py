"""``/api/v1/capacity/``: capacity, cordoned, allocated, unallocated and idle GPU-hours of the fleet and their USD.

The figures are ``costs.capacity``'s (its rules are documented there and in docs/design.md, Capacity): capacity
from the node inventory over time, allocated from the ledger, unallocated the difference; with ``group_by=team``
each cluster-day's unallocated cost shared to the teams in proportion to their allocation (OpenCost's
``shareIdle``). Fleet groupings are readable by every user (the fleet's size is not a team's secret); team rows are
the user's teams only (every team for staff).
"""

from __future__ import annotations

import datetime as dt

from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.response import Response

from core.fields import AwareDateTimeField, ListedChoiceField
from core.viewsets import ScopedGenericViewSet
from quotas.models import Team
from runners.models import Cluster, NodeSpan

from ..capacity import GROUPS, MAX_WINDOW_DAYS, capacity_report, with_rounding

DEFAULT_WINDOW = dt.timedelta(days=7)


class CapacityQuerySerializer(serializers.Serializer):
    """Query parameters of ``capacity/``: ``group_by`` (cluster, node_pool, node, accelerator, day or team; default
    cluster), ``start``/``end`` (ISO 8601 with an offset, ``[start, end)``; default the 7 days up to now; at most
    ``MAX_WINDOW_DAYS`` days), ``cluster`` (a cluster name: only that cluster). 400 for an unknown value, a naive
    or malformed datetime, ``end <= start``, a longer window or an unknown cluster."""

    group_by = ListedChoiceField(choices=list(GROUPS), default="cluster")
    start = AwareDateTimeField(required=False)
    end = AwareDateTimeField(required=False)
    cluster = serializers.CharField(required=False)

    def validate(self, attrs):
        end = attrs.get("end") or timezone.now()
        start = attrs.get("start") or end - DEFAULT_WINDOW
        if end <= start:
            raise serializers.ValidationError({"end": ["must be after start"]})
        if end - start > dt.timedelta(days=MAX_WINDOW_DAYS):
            raise serializers.ValidationError({"start": [f"the window may cover at most {MAX_WINDOW_DAYS} days"]})
        if "cluster" in attrs:
            cluster = Cluster.objects.filter(name=attrs["cluster"]).first()
            if cluster is None:
                raise serializers.ValidationError({"cluster": [f"no cluster named {attrs['cluster']!r}"]})
            attrs["cluster_ids"] = [cluster.pk]
        attrs["start"], attrs["end"] = start, end
        return attrs


@extend_schema_serializer(many=False)  # one report object, although served by the list action
class CapacityReportSerializer(serializers.Serializer):
    """A capacity answer: the grouping, the window, one row per group (its label fields and figures: GPU-seconds and
    GPU-hours as exact decimal strings, USD as cents strings or null when unknown) and the total with
    ``rounding_difference_usd`` (per USD figure, what the shown rows miss of the total)."""

    group_by = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    results = serializers.ListField(child=serializers.DictField())
    total = serializers.DictField()


@extend_schema(tags=["costs"])
class CapacityViewSet(ScopedGenericViewSet):
    """Capacity and unallocated GPU-hours of the fleet, and idle shared to teams."""

    queryset = NodeSpan.objects.all()
    filter_backends = []
    pagination_class = None
    serializer_class = CapacityReportSerializer
    schema_summaries = {"list": "Fleet capacity and unallocated GPU-hours by cluster, pool, node, day or team"}

    def scope_queryset(self, queryset, user):
        return queryset

    @extend_schema(parameters=[CapacityQuerySerializer], responses=CapacityReportSerializer)
    def list(self, request):
        """Capacity, cordoned, allocated, unallocated and idle-inside-allocation GPU-hours, and capacity, allocated
        and unallocated USD, per group over ``[start, end)``; GPU-hours without a price beside each USD figure (a
        USD figure is null when none of its GPU-hours has a price). ``group_by=team``: allocated and shared idle
        GPU-hours and USD per team.

        400 with field errors for a bad ``group_by``, a naive or malformed datetime, ``end <= start``, a window over
        ``MAX_WINDOW_DAYS`` days or an unknown cluster.
        """
        query = CapacityQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        team_ids = None
        if params["group_by"] == "team":
            team_ids = None if request.user.is_staff else set(
                Team.objects.filter(memberships__user=request.user).values_list("pk", flat=True))
        rows, total = capacity_report(params["group_by"], params["start"], params["end"],
                                      cluster_ids=params.get("cluster_ids"), team_ids=team_ids)
        rows, total = with_rounding(rows, total)
        return Response({"group_by": params["group_by"], "start": params["start"].isoformat(),
                          "end": params["end"].isoformat(), "results": rows, "total": total})
