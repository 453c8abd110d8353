"""Who may change a team's quotas and budgets: the rule, and the DRF permission class of the API that applies it.

The web UI (``frontend``) and the REST API (``quotas.api``) both ask
``may_administer``, so they always agree.
"""

from __future__ import annotations

from rest_framework import permissions

from .models import Membership

ADMIN_ONLY = "only admins of the team and platform staff may change its quotas and budgets"


def may_administer(user, team_id: int) -> bool:
    """Whether ``user`` may change team ``team_id``'s quotas and budgets: an admin of that team, or platform staff.

    ``user`` is an authenticated user; ``team_id`` a Team primary key (an
    unknown id is simply nobody's team: False unless staff). One query for
    non-staff users.
    """
    if user.is_staff:
        return True
    return Membership.objects.filter(team_id=team_id, user=user, role=Membership.Role.ADMIN).exists()


class TeamAdminWritePermission(permissions.BasePermission):
    """Object permission: reads for whoever can see the object; writes only for its team's admins and staff.

    For objects with a ``team_id`` (quotas, budgets). Seeing the object at all
    is the viewset's scoping (another team's object is a 404, before this
    check); a refused write is a 403 with ``ADMIN_ONLY`` as its detail.
    """

    message = ADMIN_ONLY

    def has_object_permission(self, request, view, obj) -> bool:
        return request.method in permissions.SAFE_METHODS or may_administer(request.user, obj.team_id)
