"""Submission rate limits, per submitting user (scope ``submit_user``) and per team (``submit_team``).

The API counts a user's submission before its body is parsed (``SubmitterThrottle``) and the team's once the
submission is valid and the team known, so naming another team cannot use up that team's rate. The web form
counts the same. Rates: ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (docs/adr/0033).
"""

from __future__ import annotations

from rest_framework.exceptions import Throttled
from rest_framework.throttling import BaseThrottle

from core.throttles import RateLimit


def submitter_retry_after(user) -> int | None:
    """Counts one submission of ``user`` (a User): None when allowed, else seconds to wait (nothing counted)."""
    return RateLimit("submit_user").take(user.pk)


def team_retry_after(team) -> int | None:
    """Counts one submission for ``team`` (a Team): None when allowed, else seconds to wait (nothing counted)."""
    return RateLimit("submit_team").take(team.pk)


def refuse_team_flood(team) -> None:
    """Raise Throttled (429 with Retry-After) when ``team``'s submissions reached ``submit_team``'s rate; counts one
    otherwise."""
    if (wait := team_retry_after(team)) is not None:
        raise Throttled(wait, detail=f"Too many submissions for team {team.slug}.")


#: The viewset actions that store a new job: each counts as one submission.
SUBMITTING_ACTIONS = ("create", "resubmit")


class SubmitterThrottle(BaseThrottle):
    """DRF throttle of a viewset's submitting actions (``SUBMITTING_ACTIONS``: ``create``, ``resubmit``) by the
    authenticated user (``submit_user``); other actions pass."""

    def allow_request(self, request, view) -> bool:
        self.retry = None
        if getattr(view, "action", None) not in SUBMITTING_ACTIONS or not request.user.is_authenticated:
            return True
        self.retry = submitter_retry_after(request.user)
        return self.retry is None

    def wait(self) -> float | None:
        return self.retry
