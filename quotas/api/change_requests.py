"""``/api/v1/change-requests/``: a team admin's requests for quota and budget changes, decided by platform staff.

Members of a team see its requests (staff all); its admins create them (anyone else in the team gets 403, a
team the user is not in is refused on ``team``, 400); staff approve or decline them; the requester withdraws
a pending one. The rules and the transaction are ``quotas.changes`` (ADR 0029).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from core.viewsets import ScopedGenericViewSet

from .. import changes
from ..models import ChangeRequest, scope_to_teams
from ..permissions import REQUEST_REFUSED, may_request_changes
from ..serializers import ChangeDecisionSerializer, ChangeRequestSerializer
from .filtersets import ChangeRequestFilterSet

DECIDE_REFUSED = "only platform staff approve or decline change requests"
WITHDRAW_REFUSED = "only the requester withdraws a change request"
DETAIL_RESPONSE = {"type": "object", "properties": {"detail": {"type": "string"}}}


def conflict(exc: changes.ChangeConflict) -> Response:
    """A 409 whose ``detail`` says why; field errors of values the rules now refuse follow under ``payload``."""
    if isinstance(exc.detail, str):
        return Response({"detail": exc.detail}, status=status.HTTP_409_CONFLICT)
    return Response({"detail": str(exc), **exc.detail}, status=status.HTTP_409_CONFLICT)


@extend_schema(tags=["teams"])
class ChangeRequestViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                           ScopedGenericViewSet):
    """Requests for quota and budget changes of the user's teams (all for staff), newest first."""

    queryset = ChangeRequest.objects.select_related("team", "requested_by", "decided_by").prefetch_related(
        "events__actor")
    serializer_class = ChangeRequestSerializer
    permission_classes = [permissions.IsAuthenticated]
    filterset_class = ChangeRequestFilterSet
    ordering_fields = ["created_at"]
    schema_summaries = {"list": "List quota and budget change requests",
                        "retrieve": "Show one change request",
                        "create": "Request a quota or budget change",
                        "approve": "Approve a change request and apply it",
                        "decline": "Decline a change request",
                        "withdraw": "Withdraw your change request"}

    def scope_queryset(self, queryset, user):
        return scope_to_teams(queryset, user)

    def perform_create(self, serializer):
        """Store the request (``quotas.changes.request_change``); 403 unless the user administers the team."""
        data = serializer.validated_data
        if not may_request_changes(self.request.user, data["team"].pk):
            raise PermissionDenied(REQUEST_REFUSED)
        serializer.instance = changes.request_change(
            user=self.request.user, team=data["team"], kind=data["kind"], target_id=data.get("target_id"),
            payload=data["payload"], reason=data["reason"])

    def _decided(self, change: ChangeRequest) -> Response:
        return Response(ChangeRequestSerializer(self.get_queryset().get(pk=change.pk)).data)

    def _staff_decision(self, request, decide) -> Response:
        """``decide(id, user, note)`` (``changes.approve`` or ``changes.decline``) on the URL's request: 404 if the
        user cannot see it, 403 unless staff, 400 for a bad note, 409 on a ``ChangeConflict``."""
        change = self.get_object()
        if not request.user.is_staff:
            raise PermissionDenied(DECIDE_REFUSED)
        body = ChangeDecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            change = decide(change.pk, request.user, body.validated_data["note"])
        except changes.ChangeConflict as exc:
            return conflict(exc)
        return self._decided(change)

    @extend_schema(request=ChangeDecisionSerializer,
                   responses={200: ChangeRequestSerializer, 403: DETAIL_RESPONSE, 409: DETAIL_RESPONSE})
    @action(detail=True, methods=["post"], filter_backends=[])
    def approve(self, request, pk=None):
        """Approve a pending request and apply exactly its values in the same transaction. Staff only (403).

        409 when the request is no longer pending (another decision won), or its quota or budget changed since
        it was requested or is gone, or the rules refuse its values now; nothing changes then. The requester is
        mailed the decision.
        """
        return self._staff_decision(request, changes.approve)

    @extend_schema(request=ChangeDecisionSerializer,
                   responses={200: ChangeRequestSerializer, 403: DETAIL_RESPONSE, 409: DETAIL_RESPONSE})
    @action(detail=True, methods=["post"], filter_backends=[])
    def decline(self, request, pk=None):
        """Decline a pending request with a note (required: 400 without), changing nothing else. Staff only (403).

        409 when it is no longer pending. The requester is mailed the decision and the note.
        """
        return self._staff_decision(request, changes.decline)

    @extend_schema(request=None, responses={200: ChangeRequestSerializer, 403: DETAIL_RESPONSE,
                                            409: DETAIL_RESPONSE})
    @action(detail=True, methods=["post"], filter_backends=[])
    def withdraw(self, request, pk=None):
        """Withdraw your pending request; nothing else changes. The requester only (403); 409 when not pending."""
        change = self.get_object()
        if change.requested_by_id != request.user.pk:
            raise PermissionDenied(WITHDRAW_REFUSED)
        try:
            change = changes.withdraw(change.pk, request.user)
        except changes.ChangeConflict as exc:
            return conflict(exc)
        return self._decided(change)
