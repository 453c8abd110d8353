"""``/api/v1/reports/``: stored utilization and cost reports, read-only and scoped to the user's teams."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import action

from core.viewsets import ScopedReadOnlyViewSet
from costs.models import Report

from .serializers import ReportSerializer


@extend_schema(tags=["reports"])
class ReportViewSet(ScopedReadOnlyViewSet):
    """Reports of the user's teams (platform-wide ones for staff only); another team's report is a 404."""

    queryset = Report.objects.select_related("team")
    serializer_class = ReportSerializer
    filterset_fields = ["kind"]
    ordering_fields = ["period_end", "generated_at"]
    schema_summaries = {"csv": "Download a report as CSV"}

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
