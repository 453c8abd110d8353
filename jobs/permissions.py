"""Who may act on a job beyond seeing it: the rule the REST API and the web UI both apply."""

from __future__ import annotations

from quotas.models import Membership

from .models import Job

CANCEL_REFUSED = "only the submitter, a team admin or staff may cancel this job"


def may_cancel(user, job: Job) -> bool:
    """Whether ``user`` may cancel ``job``: its submitter, an admin of its team, or platform staff.

    ``user`` is an authenticated user who can already see the job (seeing it
    is the caller's scoping: another team's job is a 404 before this check).
    At most one query. A refusal is a 403 with ``CANCEL_REFUSED`` as its detail.
    """
    if user.is_staff or job.submitter_id == user.pk:
        return True
    return Membership.objects.filter(team_id=job.team_id, user=user, role=Membership.Role.ADMIN).exists()
