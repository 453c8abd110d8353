"""The job state machine: allowed transitions and the one function that performs them.

Every change is a compare-and-set UPDATE on the job's current state (as in
healthchecks' ``sendalerts``) with a JobEvent written in the same
transaction; an impossible transition raises instead of doing nothing.
"""

from django.db import transaction
from django.utils import timezone

from .models import FINAL_STATES, Job, JobEvent, JobState

S = JobState

ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.ADMITTED, S.REJECTED, S.CANCELLED}),
    S.ADMITTED: frozenset({S.STARTING, S.RECOVERING, S.FAILED, S.CANCELLING}),
    S.STARTING: frozenset({S.RUNNING, S.RECOVERING, S.FAILED, S.CANCELLING}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.RECOVERING, S.CANCELLING}),
    S.RECOVERING: frozenset({S.ADMITTED, S.FAILED, S.CANCELLED, S.CANCELLING}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
}


class InvalidTransition(Exception):
    """The state machine has no edge from the job's state to the requested one."""

    def __init__(self, job_id: int, from_state: str, to_state: str):
        super().__init__(f"job {job_id}: no transition {from_state} -> {to_state}")
        self.job_id, self.from_state, self.to_state = job_id, from_state, to_state


class StaleState(Exception):
    """The job left the expected state before our update (another worker won the race)."""

    def __init__(self, job_id: int, expected: str):
        super().__init__(f"job {job_id} is no longer {expected}")
        self.job_id, self.expected = job_id, expected


def can_transition(from_state: str, to_state: str) -> bool:
    """Whether DESIGN.md's state machine has the edge ``from_state -> to_state``."""
    return to_state in ALLOWED_TRANSITIONS.get(from_state, frozenset())


def transition(job: Job, to_state: str, *, reason: str = "", actor=None, attempt=None, data=None, **fields) -> Job:
    """Move ``job`` from its in-memory state to ``to_state`` if the row still has that state.

    ``fields`` are extra columns set in the same UPDATE (``current_attempt``,
    ``queue_info``...); ``started_at``/``ended_at``/``admitted_at`` are set
    here when the new state calls for them. Returns ``job`` updated in memory.

    Raises InvalidTransition when the edge does not exist, StaleState when the
    row's state changed since ``job`` was read (nothing is written then).
    """
    from_state = job.state
    if not can_transition(from_state, to_state):
        raise InvalidTransition(job.pk, from_state, to_state)
    now = timezone.now()
    fields.setdefault("state_reason", reason[:500])
    if to_state == S.ADMITTED:
        fields.setdefault("admitted_at", now)
        fields.setdefault("queue_info", {})
    if to_state == S.RUNNING and job.started_at is None:
        fields.setdefault("started_at", now)
    if to_state in FINAL_STATES:
        fields.setdefault("ended_at", now)
    # No savepoint: inside a caller's transaction (admission, dispatch, an attempt's end) it would cost two
    # round trips. A lost compare-and-set writes nothing, so StaleState is raised after the block and leaves
    # the caller's transaction usable; a database error inside still rolls the whole transaction back.
    with transaction.atomic(savepoint=False):
        updated = Job.objects.filter(pk=job.pk, state=from_state).update(state=to_state, updated_at=now, **fields)
        if updated == 1:
            JobEvent.objects.create(
                job_id=job.pk,
                attempt=attempt,
                kind="state",
                from_state=from_state,
                to_state=to_state,
                reason=reason[:500],
                actor=actor,
                data=data or {},
            )
    if updated != 1:
        raise StaleState(job.pk, from_state)
    job.state = to_state
    job.updated_at = now
    for name, value in fields.items():
        setattr(job, name, value)
    return job


def record_event(job: Job, kind: str, reason: str = "", *, actor=None, attempt=None, data=None) -> JobEvent:
    """Append a non-state event (a queue reason, a dispatch retry, an alert) to the job's timeline."""
    return JobEvent.objects.create(
        job_id=job.pk, attempt=attempt, kind=kind, reason=reason[:500], actor=actor, data=data or {},
        from_state=job.state, to_state=job.state,
    )
