"""``/api/v1/fair-sharing/``: each of the user's teams' place in fair sharing over time (every team for staff), in the
order the scheduler ranks teams of equal priority: decayed GPU-hours, weight, decayed GPU-hours per unit of weight
(the order's key, Kueue's Admission Fair Sharing) and the team's part of its cohort's weighted decayed usage
(docs/adr/0045-fair-sharing-over-time.md). Read as of the request, from the stored samples moved to now
(``jobs.scheduling.usage``).
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.response import Response

from core.viewsets import ScopedGenericViewSet
from quotas.models import Team

from ..scheduling.usage import fair_usage, half_life_seconds


class FairUsageRowSerializer(serializers.Serializer):
    """One team: ``team`` (slug), ``cohort`` (name, null: the default cohort), ``decayed_gpu_hours``, ``weight``,
    ``weighted_gpu_hours`` (decayed / weight), ``cohort_share`` (0 to 1, null when the cohort used nothing or has a
    team the reader is not a member of);
    hours are exact decimal strings (6 places)."""

    team = serializers.CharField(source="slug")
    cohort = serializers.CharField(allow_null=True)
    decayed_gpu_hours = serializers.DecimalField(max_digits=30, decimal_places=6)
    weight = serializers.DecimalField(max_digits=8, decimal_places=3)
    weighted_gpu_hours = serializers.DecimalField(max_digits=30, decimal_places=6)
    cohort_share = serializers.DecimalField(max_digits=8, decimal_places=6, allow_null=True)


@extend_schema_serializer(many=False)  # one answer object, although served by the list action
class FairSharingSerializer(serializers.Serializer):
    """The answer: ``half_life_seconds`` (0: fair sharing over time is off and every figure is 0), ``at`` (the time
    the figures hold for) and ``results``, one row per team, least weighted usage first."""

    half_life_seconds = serializers.IntegerField()
    at = serializers.DateTimeField()
    results = FairUsageRowSerializer(many=True)


class FairSharingViewSet(ScopedGenericViewSet):
    """The user's teams' decayed usage, weight and cohort share (every team for staff)."""

    queryset = Team.objects.select_related("cohort")
    filter_backends = []
    pagination_class = None
    serializer_class = FairSharingSerializer
    schema_summaries = {"list": "Each team's decayed GPU-hours, weight and cohort share (fair sharing over time)"}

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)

    @extend_schema(responses=FairSharingSerializer)
    def list(self, request):
        """``{"half_life_seconds", "at", "results": [...]}``: every team the user may see, in the scheduler's order
        (lowest decayed GPU-hours per unit of weight first, then slug). Takes no parameters."""
        now = timezone.now()
        user = request.user
        rows = fair_usage(self.get_queryset(), now,
                          None if user.is_staff else set(user.memberships.values_list("team_id", flat=True)))
        return Response(FairSharingSerializer({"half_life_seconds": half_life_seconds(), "at": now,
                                               "results": rows}).data)
