"""Who may change a team's quotas and budgets, and who may ask for a change: the rules, and the DRF permission
class of the API that applies them.

Quotas, budgets, cohorts, priority classes, prices and clusters are the platform's to set (ADR 0029): only
platform staff create, change or delete them, in the API, the web UI and the Django admin (which only staff
reach). A team admin asks for a quota or budget change with a reason (``quotas.changes``); staff approve or
decline it. The web UI (``frontend``) and the REST API (``quotas.api``) both ask the functions here, so they
always agree.
"""

from __future__ import annotations

from rest_framework import permissions

from .models import Membership

STAFF_ONLY = ("only platform staff change quotas and budgets; a team admin may request a change "
              "(POST /api/v1/change-requests/, or Request a change on the team's page)")
REQUEST_REFUSED = "only admins of the team request changes of its quotas and budgets"


def may_change_entitlements(user) -> bool:
    """Whether ``user`` may create, change or delete quotas and budgets (of any team): platform staff only."""
    return bool(user and user.is_authenticated and user.is_staff)


def may_administer(user, team_id: int) -> bool:
    """Whether ``user`` administers team ``team_id``: an admin of that team, or platform staff.

    A team admin requests quota and budget changes for the team (``may_request_changes``) and cancels any of
    its jobs; changing the quota or budget itself is staff's alone (``may_change_entitlements``). ``user`` is
    an authenticated user; ``team_id`` a Team primary key (an unknown id is nobody's team: False unless
    staff). One query for non-staff users.
    """
    if user.is_staff:
        return True
    return Membership.objects.filter(team_id=team_id, user=user, role=Membership.Role.ADMIN).exists()


def may_request_changes(user, team_id: int) -> bool:
    """Whether ``user`` may ask for a change of team ``team_id``'s quotas or budgets: its admins (and staff)."""
    return may_administer(user, team_id)


class StaffWritePermission(permissions.BasePermission):
    """Object permission: reads for whoever can see the object; writes for platform staff only.

    For team-owned objects (quotas, budgets). A create (POST to the list) by anyone but staff is refused before
    its body is read. Seeing an object at all is the viewset's scoping (another team's object is a 404, before
    the object check); a refused write is a 403 with ``STAFF_ONLY`` as its detail, which says how to ask for
    the change instead.
    """

    message = STAFF_ONLY

    def has_permission(self, request, view) -> bool:
        return request.method != "POST" or may_change_entitlements(request.user)

    def has_object_permission(self, request, view, obj) -> bool:
        return request.method in permissions.SAFE_METHODS or may_change_entitlements(request.user)
