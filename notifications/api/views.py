"""``/api/v1/subscriptions/`` (who is notified of what, and how) and ``/api/v1/notifications/`` (the delivery log).

A user reads their own subscriptions and those of their teams (staff all); a user makes and changes their own,
a team's admins (and staff) the team's; a teammate who sees a team subscription gets 403 on a write, an outsider
404 (docs/adr/0035-notifications.md). The log is read-only: the notifications of the subscriptions the user sees.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions
from rest_framework.exceptions import PermissionDenied

from core.viewsets import ScopedGenericViewSet, ScopedReadOnlyViewSet
from quotas.permissions import may_administer

from ..models import Notification, Subscription
from ..rules import TEAM_ONLY_ADMINS, may_change, refusal
from .serializers import NotificationSerializer, SubscriptionSerializer


class SubscriptionWritePermission(permissions.BasePermission):
    """Object permission: reads for whoever sees the subscription; writes for its user (a personal one) or the
    team's admins and staff (a team's)."""

    def has_object_permission(self, request, view, obj: Subscription) -> bool:
        if request.method in permissions.SAFE_METHODS or may_change(request.user, obj):
            return True
        self.message = refusal(obj)
        return False


@extend_schema(tags=["notifications"])
class SubscriptionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                          mixins.UpdateModelMixin, mixins.DestroyModelMixin, ScopedGenericViewSet):
    """Notification subscriptions: the user's own and their teams' (all for staff)."""

    queryset = Subscription.objects.select_related("team", "user")
    serializer_class = SubscriptionSerializer
    permission_classes = [permissions.IsAuthenticated, SubscriptionWritePermission]
    ordering_fields = ["created_at", "id"]
    schema_summaries = {"list": "List your and your teams' notification subscriptions",
                        "retrieve": "Show one notification subscription",
                        "create": "Subscribe yourself or a team to notifications",
                        "update": "Replace a notification subscription",
                        "partial_update": "Change a notification subscription",
                        "destroy": "Delete a notification subscription"}

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)

    def perform_create(self, serializer):
        """A team subscription only by the team's admins and staff (403); a personal one for the user."""
        team = serializer.validated_data.get("team")
        user = self.request.user
        if team is not None and not may_administer(user, team.pk):
            raise PermissionDenied(TEAM_ONLY_ADMINS)
        serializer.save(user=None if team is not None else user, created_by=user)


@extend_schema(tags=["notifications"])
class NotificationViewSet(ScopedReadOnlyViewSet):
    """The notifications of the subscriptions the user sees, newest first, with their delivery status."""

    queryset = Notification.objects.select_related("team", "subscription")
    serializer_class = NotificationSerializer
    ordering_fields = ["created_at", "id"]
    filterset_fields = ["status", "event", "subscription"]
    schema_summaries = {"list": "List sent and pending notifications", "retrieve": "Show one notification"}

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)
