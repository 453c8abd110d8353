"""``/api/v1/reports/``: stored utilization and cost reports scoped to the user's teams, and reports built on demand
for a team and period (``POST``)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from core.viewsets import ScopedReadOnlyViewSet
from costs.models import Report

from ..build import generate_report
from .serializers import ReportRequestSerializer, ReportSerializer


@extend_schema(tags=["reports"])
class ReportViewSet(ScopedReadOnlyViewSet):
    """Reports of the user's teams (platform-wide ones for staff only); another team's report is a 404."""

    queryset = Report.objects.select_related("team", "requested_by")
    serializer_class = ReportSerializer
    filterset_fields = ["kind"]
    ordering_fields = ["period_end", "generated_at"]
    schema_summaries = {"csv": "Download a report as CSV", "create": "Build a report of a team and period now"}

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)

    @extend_schema(request=ReportRequestSerializer, responses={201: ReportSerializer, 200: ReportSerializer})
    def create(self, request):
        """Build the ``custom`` report of ``team`` (left out: the platform, staff only) over ``[start, end)`` now,
        from the ledger and the utilization rollups, and store it (not mailed). Who may: any member of the team
        (viewers too: it shows what ``costs/`` and ``utilization/`` show them) and staff. The same team and period
        asked again refreshes the stored report (200) instead of adding one (201). 400 naming the field and the
        reason for bad input (``ReportRequestSerializer``)."""
        query = ReportRequestSerializer(data=request.data, context={"request": request})
        query.is_valid(raise_exception=True)
        params = query.validated_data
        report, created = generate_report(params.get("team"), params["start"], params["end"], Report.Kind.CUSTOM,
                                          source=Report.Source.REQUEST, requested_by=request.user)
        return Response(ReportSerializer(report).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={(200, "text/csv"): OpenApiResponse(description="The report as CSV")})
    @action(detail=True, methods=["get"], filter_backends=[])
    def csv(self, request, pk=None):
        """The report as CSV (``section,item,metric,value``)."""
        report = self.get_object()
        response = HttpResponse(report.csv, content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="report-{report.pk}.csv"'
        return response
