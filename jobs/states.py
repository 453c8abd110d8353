"""The job state machine: allowed transitions and the one function that performs them.

Every change is a compare-and-set UPDATE on the job's current state (as in
healthchecks' ``sendalerts``) with a JobEvent written in the same
transaction; an impossible transition raises instead of doing nothing.
A job that reaches a final state settles its QUEUED dependents in the same
transaction (``jobs.dependencies.settle``: REJECTED when their condition can
no longer hold, down the chain; otherwise their ``queue_info`` brought up to date).
"""

import dataclasses

from django.db import models, transaction
from django.db.models import Case, Value, When
from django.utils import timezone

from . import dependencies
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
    """Whether the state machine (docs/design.md, Job states) has the edge ``from_state -> to_state``."""
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
            if to_state in FINAL_STATES:
                settle_dependents([job.pk])
    if updated != 1:
        raise StaleState(job.pk, from_state)
    job.state = to_state
    job.updated_at = now
    for name, value in fields.items():
        setattr(job, name, value)
    return job


@dataclasses.dataclass
class Move:
    """One job of ``transition_many``: its reason, the attempt and data of its event, and extra columns to set."""

    job: Job
    reason: str = ""
    attempt: object = None
    data: dict | None = None
    fields: dict = dataclasses.field(default_factory=dict)


#: Jobs per UPDATE of ``transition_many`` (each carries its own values in CASE branches).
MANY_CHUNK = 500


def transition_many(moves: list[Move], to_state: str, *, actor=None) -> list[Job]:
    """``transition`` of several jobs to ``to_state`` at once: a compare-and-set UPDATE per from-state (and per
    ``MANY_CHUNK`` jobs) and one INSERT of their events, whatever their number; returns the jobs moved, updated in
    memory. A job whose row left its in-memory state is left out, with nothing written for it (StaleState's case);
    the others move. Per-job values (``reason``, ``fields``) go in CASE branches. Raises InvalidTransition (and
    writes nothing) when one of the edges does not exist. For callers that hold the rows' locks (admission):
    otherwise the moved rows are found again with one more query.
    """
    with transaction.atomic(savepoint=False):
        moved = _move_many(moves, to_state, actor)
        if to_state in FINAL_STATES and moved:
            settle_dependents([job.pk for job in moved])
    return moved


def _move_many(moves: list[Move], to_state: str, actor) -> list[Job]:
    """``transition_many`` without settling the dependents of the jobs it ends (``settle_dependents`` settles a
    chain level by level, each level's ends settled by the next round of its loop)."""
    for m in moves:
        if not can_transition(m.job.state, to_state):
            raise InvalidTransition(m.job.pk, m.job.state, to_state)
    now = timezone.now()
    for m in moves:
        m.fields.setdefault("state_reason", m.reason[:500])
        if to_state == S.ADMITTED:
            m.fields.setdefault("admitted_at", now)
            m.fields.setdefault("queue_info", {})
        if to_state in FINAL_STATES:
            m.fields.setdefault("ended_at", now)
        if to_state == S.RUNNING and m.job.started_at is None:
            m.fields.setdefault("started_at", now)
    moved: list[Move] = []
    with transaction.atomic(savepoint=False):
        groups: dict[tuple, list[Move]] = {}
        for m in moves:
            groups.setdefault((m.job.state, tuple(sorted(m.fields))), []).append(m)
        for (from_state, names), group in groups.items():
            for start in range(0, len(group), MANY_CHUNK):
                chunk = group[start:start + MANY_CHUNK]
                ids = [m.job.pk for m in chunk]
                updated = Job.objects.filter(pk__in=ids, state=from_state).update(
                    state=to_state, updated_at=now, **{name: _per_job(chunk, name) for name in names})
                if updated != len(chunk):
                    done = set(Job.objects.filter(pk__in=ids, state=to_state, updated_at=now)
                               .values_list("pk", flat=True))
                    chunk = [m for m in chunk if m.job.pk in done]
                moved += chunk
        JobEvent.objects.bulk_create([
            JobEvent(job_id=m.job.pk, attempt=m.attempt, kind="state", from_state=m.job.state, to_state=to_state,
                     reason=m.reason[:500], actor=actor, data=m.data or {}) for m in moved])
    for m in moved:
        m.job.state = to_state
        m.job.updated_at = now
        for name, value in m.fields.items():
            setattr(m.job, name, value)
    return [m.job for m in moved]


def settle_dependents(ended_ids: list[int]) -> int:
    """Settle the QUEUED dependents of the jobs ``ended_ids``, which just reached a final state, inside the caller's
    transaction (``jobs.dependencies.settle``): REJECT those whose condition can no longer hold, with the reason
    naming the upstream and how it ended, and write the others' ``queue_info`` (compare-and-set on QUEUED); then
    the same for the dependents of the jobs just rejected, and so on down the chain: one round per level, in a loop
    (a pipeline may be longer than the interpreter's recursion limit). Returns how many it rejected, every level
    counted. One query when no job depends on them."""
    rejected = 0
    while ended_ids:
        rejections, infos = dependencies.settle(ended_ids)
        for job_id, info in infos.items():
            message = info.get("message", "its dependencies are met; it waits for the next scheduling pass")
            Job.objects.filter(pk=job_id, state=S.QUEUED).update(queue_info=info, state_reason=message[:500])
        moved = _move_many([Move(job, reason=reason, data=data, fields={"queue_info": {}})
                            for job, reason, data in rejections], S.REJECTED, None) if rejections else []
        rejected += len(moved)
        ended_ids = [job.pk for job in moved]
    return rejected


def _per_job(chunk: list[Move], name: str):
    """The value of column ``name`` for the UPDATE of ``chunk``: the one value they share, else a CASE on the id."""
    field = Job._meta.get_field(name)
    values = [m.fields[name] for m in chunk]
    if field.is_relation:
        values = [v.pk if isinstance(v, models.Model) else v for v in values]
        field = field.target_field
    first = values[0]
    if all(v == first and type(v) is type(first) for v in values):
        return Value(first, output_field=field)
    return Case(*[When(pk=m.job.pk, then=Value(v, output_field=field)) for m, v in zip(chunk, values, strict=True)],
                output_field=field)


def record_event(job: Job, kind: str, reason: str = "", *, actor=None, attempt=None, data=None) -> JobEvent:
    """Append a non-state event (a queue reason, a dispatch retry, an alert) to the job's timeline."""
    return JobEvent.objects.create(
        job_id=job.pk, attempt=attempt, kind=kind, reason=reason[:500], actor=actor, data=data or {},
        from_state=job.state, to_state=job.state,
    )
