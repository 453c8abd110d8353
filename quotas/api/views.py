"""``/api/v1/teams/``, ``quotas/`` and ``budgets/``: tenancy and entitlement, scoped to the user's teams.

Everyone in a team reads its quotas and budgets; only the team's admins and
platform staff create or change them (403 for other members, 404 for
outsiders, who cannot see them at all).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions
from rest_framework.exceptions import PermissionDenied

from controlplane.api import ScopedGenericViewSet, ScopedReadOnlyViewSet

from ..models import Budget, Membership, Quota, Team
from .filtersets import BudgetFilterSet, QuotaFilterSet
from .serializers import BudgetSerializer, QuotaSerializer, TeamSerializer

ADMIN_ONLY = "only admins of the team and platform staff may change its quotas and budgets"


def may_administer(user, team_id: int) -> bool:
    """Whether ``user`` may change team ``team_id``'s quotas and budgets: a team admin, or staff."""
    if user.is_staff:
        return True
    return Membership.objects.filter(team_id=team_id, user=user, role=Membership.Role.ADMIN).exists()


class TeamAdminWritePermission(permissions.BasePermission):
    """Reads for the team's members; writes to an existing object for its team's admins and staff."""

    message = ADMIN_ONLY

    def has_object_permission(self, request, view, obj) -> bool:
        return request.method in permissions.SAFE_METHODS or may_administer(request.user, obj.team_id)


class TeamAdminWriteViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                            mixins.UpdateModelMixin, ScopedGenericViewSet):
    """List, retrieve, create and update objects that belong to a team; writes need a team admin or staff."""

    permission_classes = [permissions.IsAuthenticated, TeamAdminWritePermission]

    def scope_queryset(self, queryset, user):
        if user.is_staff:
            return queryset
        return queryset.filter(team__memberships__user=user)

    def perform_create(self, serializer):
        # The team comes from the body, so the object permission cannot see it yet.
        if not may_administer(self.request.user, serializer.validated_data["team"].pk):
            raise PermissionDenied(ADMIN_ONLY)
        serializer.save()


@extend_schema(tags=["teams"])
class TeamViewSet(ScopedReadOnlyViewSet):
    """The user's teams (all teams for staff) with members and roles."""

    queryset = Team.objects.prefetch_related("memberships__user")
    serializer_class = TeamSerializer
    lookup_field = "slug"
    ordering_fields = ["slug", "name"]

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)


@extend_schema(tags=["teams"])
class QuotaViewSet(TeamAdminWriteViewSet):
    """GPU quotas of the user's teams."""

    queryset = Quota.objects.select_related("team", "accelerator", "cluster")
    serializer_class = QuotaSerializer
    filterset_class = QuotaFilterSet
    ordering_fields = ["nominal_gpus"]


@extend_schema(tags=["teams"])
class BudgetViewSet(TeamAdminWriteViewSet):
    """Money budgets of the user's teams."""

    queryset = Budget.objects.select_related("team")
    serializer_class = BudgetSerializer
    filterset_class = BudgetFilterSet
    ordering_fields = ["amount_usd"]
