"""``/api/v1/audit/``: the audit trail, read only (ADR 0031).

Staff read every record; anyone else the records of their own teams (any role), never another team's nor a
platform-wide object's. Filters: ``quotas.audit.AuditFilterSet``; newest first, paginated like every list.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import permissions

from core.viewsets import ScopedReadOnlyViewSet

from ..audit import AuditFilterSet, visible_records
from ..models import AuditRecord
from ..serializers import AuditRecordSerializer


@extend_schema(tags=["teams"])
class AuditRecordViewSet(ScopedReadOnlyViewSet):
    """Who changed which quota, budget, cohort, price, cluster, node cordon, membership or role, or decided which
    change request, when, from what to what and why; newest first."""

    queryset = AuditRecord.objects.select_related("team")
    serializer_class = AuditRecordSerializer
    permission_classes = [permissions.IsAuthenticated]
    filterset_class = AuditFilterSet
    ordering_fields = ["at"]
    schema_summaries = {"list": "List audit records (who changed what, when, before and after, why)",
                        "retrieve": "Show one audit record"}

    def scope_queryset(self, queryset, user):
        return visible_records(user, queryset)
