"""``/api/v1/teams/``, ``quotas/``, ``budgets/``, ``cohorts/`` and ``priority-classes/``, scoped to the user's teams.

Everyone in a team reads its quotas and budgets; only platform staff create
or change them (403 for the team's members, its admins included, who ask
through ``change-requests/`` instead; 404 for outsiders, who cannot see them
at all; ADR 0029). Cohorts, team weights and cohort
membership, and priority classes are read by everyone and changed by staff.
Every change of a quota, budget, cohort, team's fair share or priority class
appends an audit record in the same transaction (``quotas.audit``, ADR 0031).
"""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, viewsets
from rest_framework.exceptions import ValidationError

from core.permissions import IsStaffOrReadOnly
from core.viewsets import ScopedGenericViewSet, ScopedReadOnlyViewSet, ScopedViewSetMixin

from ..audit import AuditedWriteMixin
from ..models import Budget, Cohort, CohortQuota, PriorityClass, Quota, Team, lock_cohort_tree, scope_to_teams
from ..permissions import StaffWritePermission
from ..serializers import (
    BudgetSerializer,
    CohortQuotaSerializer,
    CohortSerializer,
    PriorityClassSerializer,
    QuotaSerializer,
    TeamFairShareSerializer,
    TeamSerializer,
)
from .filtersets import BudgetFilterSet, QuotaFilterSet


class StaffWriteTeamObjectViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                                  mixins.UpdateModelMixin, ScopedGenericViewSet):
    """List, retrieve, create and update objects that belong to a team; members read, only staff write.

    A non-staff create is a 403 before its body is read, whatever its team; a non-staff update is a 403 on an
    object the user sees and a 404 on one they do not (``StaffWritePermission``).
    """

    permission_classes = [permissions.IsAuthenticated, StaffWritePermission]

    def scope_queryset(self, queryset, user):
        return scope_to_teams(queryset, user)


@extend_schema(tags=["teams"])
class TeamViewSet(AuditedWriteMixin, mixins.UpdateModelMixin, ScopedReadOnlyViewSet):
    """The user's teams (all teams for staff) with members and roles; staff PATCH ``cohort`` and ``weight``."""

    queryset = Team.objects.select_related("cohort").prefetch_related("memberships__user")
    serializer_class = TeamSerializer
    permission_classes = [IsStaffOrReadOnly]
    lookup_field = "slug"
    ordering_fields = ["slug", "name"]
    http_method_names = ["get", "patch", "head", "options"]

    def get_serializer_class(self):
        return TeamFairShareSerializer if self.request.method == "PATCH" else TeamSerializer

    def update(self, request, *args, **kwargs):
        """PATCH a team; a body naming ``cohort`` takes the cohort rows' lock (``lock_cohort_tree``, as a cohort's
        DELETE does) before the cohort is read, so a cohort deleted meanwhile answers 400 on ``cohort`` (no such
        cohort) and a cohort's DELETE that comes after sees the team in it (400 on ``teams``), never an FK error."""
        if not isinstance(request.data, dict) or "cohort" not in request.data:  # a body not an object: a 400 below
            return super().update(request, *args, **kwargs)
        with transaction.atomic():
            lock_cohort_tree()
            return super().update(request, *args, **kwargs)

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)


@extend_schema(tags=["teams"])
class QuotaViewSet(AuditedWriteMixin, StaffWriteTeamObjectViewSet):
    """GPU quotas of the user's teams; staff write them."""

    queryset = Quota.objects.select_related("team", "accelerator", "cluster")
    serializer_class = QuotaSerializer
    filterset_class = QuotaFilterSet
    ordering_fields = ["nominal_gpus"]


@extend_schema(tags=["teams"])
class BudgetViewSet(AuditedWriteMixin, StaffWriteTeamObjectViewSet):
    """Money budgets of the user's teams; staff write them."""

    queryset = Budget.objects.select_related("team")
    serializer_class = BudgetSerializer
    filterset_class = BudgetFilterSet
    ordering_fields = ["amount_usd"]


class StaffWriteViewSet(AuditedWriteMixin, ScopedViewSetMixin, viewsets.ModelViewSet):
    """Platform-wide objects: every authenticated user reads, staff write; every write is audited."""

    permission_classes = [IsStaffOrReadOnly]

    def scope_queryset(self, queryset, user):
        return queryset


@extend_schema(tags=["teams"])
class CohortViewSet(StaffWriteViewSet):
    """Cohorts: sets of teams that lend each other unused nominal quota, nested in trees (``parent``; ADR 0046).
    A cohort with children or teams cannot be deleted (400 naming them)."""

    queryset = Cohort.objects.select_related("parent").prefetch_related("teams", "children",
                                                                        "quotas__accelerator")
    serializer_class = CohortSerializer
    ordering_fields = ["name"]

    def create(self, request, *args, **kwargs):
        """Create a cohort with the parent links locked (``lock_cohort_tree``) while its parent is checked."""
        with transaction.atomic():
            lock_cohort_tree()
            return super().create(request, *args, **kwargs)

    def update(self, request, *args, **kwargs):
        """PUT or PATCH a cohort with the parent links locked (``lock_cohort_tree``) from before the cohort is read
        until its change commits, so concurrent parent changes are checked one after another."""
        with transaction.atomic():
            lock_cohort_tree()
            return super().update(request, *args, **kwargs)

    def destroy(self, request, *args, **kwargs):
        """DELETE a cohort with the parent links locked, so no cohort becomes its child between the check and the
        delete."""
        with transaction.atomic():
            lock_cohort_tree()
            return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance):
        children = list(instance.children.values_list("name", flat=True))
        if children:
            raise ValidationError({"parent": [f"cohort {instance} is the parent of {', '.join(children)}: "
                                              "give them another parent first"]})
        teams = list(instance.teams.order_by("slug").values_list("slug", flat=True))
        if teams:
            raise ValidationError({"teams": [f"cohort {instance} has the teams {', '.join(teams)}: "
                                             "give them another cohort first"]})
        super().perform_destroy(instance)


@extend_schema(tags=["teams"])
class CohortQuotaViewSet(StaffWriteViewSet):
    """Cohorts' own GPU quotas (nominal, borrowing and lending limits of a level of a tree; ADR 0046); staff write
    them, everyone reads."""

    queryset = CohortQuota.objects.select_related("cohort", "accelerator")
    serializer_class = CohortQuotaSerializer
    ordering_fields = ["nominal_gpus"]


@extend_schema(tags=["jobs"])
class PriorityClassViewSet(StaffWriteViewSet):
    """Priority classes that job specs name (``low``, ``normal``, ``high`` by default)."""

    queryset = PriorityClass.objects.all()
    serializer_class = PriorityClassSerializer
    ordering_fields = ["value", "name"]
