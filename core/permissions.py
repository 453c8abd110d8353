"""Permission classes shared by every app's REST API (team-specific rules live in the apps' ``permissions``)."""

from __future__ import annotations

from rest_framework import permissions


class IsStaffOrReadOnly(permissions.BasePermission):
    """Reads for every authenticated user; writes for platform staff only."""

    def has_permission(self, request, view) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return bool(request.user and request.user.is_authenticated)
        return bool(request.user and request.user.is_staff)
