"""``/api/v1/reports/``: stored utilization and cost reports, read-only and scoped to the user's teams."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action

from core.viewsets import ScopedReadOnlyViewSet

from frontend.models import Report


class ReportSerializer(serializers.ModelSerializer):
    """A report: scope (team slug, null for platform-wide), kind, period ``[start, end)``, when generated, its data."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Report
        fields = ["id", "team", "kind", "period_start", "period_end", "generated_at", "data"]
        read_only_fields = fields


@extend_schema(tags=["reports"])
class ReportViewSet(ScopedReadOnlyViewSet):
    """Reports of the user's teams (platform-wide ones for staff only); another team's report is a 404."""

    queryset = Report.objects.select_related("team")
    serializer_class = ReportSerializer
    filterset_fields = ["kind"]
    ordering_fields = ["period_end", "generated_at"]

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)

    @extend_schema(responses={(200, "text/csv"): OpenApiResponse(description="The report as CSV")})
    @action(detail=True, methods=["get"], filter_backends=[])
    def csv(self, request, pk=None):
        """The report as CSV (``section,item,metric,value``)."""
        report = self.get_object()
        response = HttpResponse(report.csv, content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="report-{report.pk}.csv"'
        return response
