"""Job lifecycle services: submit, dispatch, observe, end an attempt, cancel, preempt.

Each function is one transaction: the job's state change (compare and set),
its JobEvent and the attempt's end (which releases quota and capacity,
since both are counted from live attempts) commit together or not at all.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce
from django.db.models.sql import InsertQuery
from django.utils import timezone

from core.lookups import LookupCache
from runners.base import (
    ClusterUnreachable,
    Observation,
    PermanentDispatchError,
    TransientDispatchError,
    UnknownBackend,
    backend_for,
)
from runners.models import Accelerator, Cluster, NodePool

from . import metrics
from .enqueue import enqueue_cancel, enqueue_delete_attempt, enqueue_final_accrual, enqueue_schedule
from .models import Job, JobAttempt, JobEvent, JobState
from .states import StaleState, record_event, transition

log = logging.getLogger(__name__)
S = JobState


class NotCancellable(Exception):
    """The job already reached a final state."""


def submit_job(*, team, submitter, name: str, kind: str, spec: dict, resources: dict) -> Job:
    """Store a validated job as QUEUED, write its first event, and enqueue a scheduling pass on commit.

    ``spec`` must already be validated (``jobs.spec``); ``resources`` holds the
    accelerator instance and integer fields copied to columns.
    """
    fields = dict(team=team, submitter=submitter, name=name, kind=kind, spec=spec, resources=resources)
    if connection.vendor == "postgresql":
        job = store_submitted_job(**fields)  # one statement, committed on its own: on_commit runs at once
        enqueue_schedule(background=True)
        return job
    with transaction.atomic():
        job = store_submitted_job(**fields)
        enqueue_schedule(background=True)
    return job


def store_submitted_job(*, team, submitter, name: str, kind: str, spec: dict, resources: dict) -> Job:
    """Insert the QUEUED job and its ``submitted`` event, and nothing else (no scheduling pass).

    On PostgreSQL one statement (``_insert_job_with_event``), atomic by itself;
    elsewhere one transaction. ``submit_job`` is this plus admission's pass;
    ``benchmarks/submit.py`` times this alone to show what admission adds.
    """
    job = Job(
        team=team, submitter=submitter, name=name, kind=kind, spec=spec,
        accelerator=resources["accelerator"], gpus_per_node=resources["gpus_per_node"], nodes=resources["nodes"],
        priority=resources["priority"], preemptible=resources["preemptible"],
        max_runtime_seconds=resources["max_runtime_seconds"], max_retries=resources["max_retries"],
    )
    reason = f"submitted by {submitter}"
    if connection.vendor == "postgresql":
        _insert_job_with_event(job, JobEvent(kind="submitted", reason=reason[:500], actor=submitter, data={},
                                             from_state=job.state, to_state=job.state))
        return job
    with transaction.atomic():
        job.save(force_insert=True)
        record_event(job, "submitted", reason, actor=submitter)
    return job


def _insert_sql(obj, fields: list) -> tuple[str, list]:
    """Django's own INSERT statement (no RETURNING) and parameters for ``obj``'s ``fields``; runs their pre_save."""
    query = InsertQuery(type(obj))
    query.insert_values(fields, [obj])
    [(sql, params)] = query.get_compiler(connection.alias).as_sql()
    return sql, list(params)


def _insert_params(obj, fields: list) -> list | None:
    """The parameters Django's INSERT compiler would send for ``obj``'s ``fields`` (``pre_save`` then
    ``get_db_prep_save``, as ``SQLInsertCompiler.prepare_value`` does); None when a value is an
    expression, whose SQL only the compiler can write."""
    params = []
    for field in fields:
        value = field.pre_save(obj, True)
        if hasattr(value, "resolve_expression"):
            return None
        params.append(field.get_db_prep_save(value, connection=connection))
    return params


#: Per connection alias: (job fields, event fields, the statement of ``_insert_job_with_event``). The
#: statement's text depends only on the models' fields, so it is compiled once per process.
_JOB_WITH_EVENT_SQL: dict[str, tuple[list, list, str]] = {}


def _job_with_event_statement(job: Job, event: JobEvent) -> tuple[list, list, str]:
    """Fields of both rows and the CTE's SQL, compiled by Django from ``job`` and ``event`` on first use."""
    cached = _JOB_WITH_EVENT_SQL.get(connection.alias)
    if cached is not None:
        return cached
    job_meta, event_meta = Job._meta, JobEvent._meta
    job_fields = [f for f in job_meta.local_concrete_fields if f is not job_meta.auto_field]
    event_fields = [event_meta.get_field("job")] + [
        f for f in event_meta.local_concrete_fields if f is not event_meta.auto_field and f.name != "job"]
    # Compiled from copies: pre_save (auto_now_add) must run once, on the rows actually inserted.
    job_copy = Job(**{f.attname: getattr(job, f.attname) for f in job_fields})
    event_copy = JobEvent(**{f.attname: getattr(event, f.attname) for f in event_fields})
    event_copy.job_id = 0
    # Only plain values may shape the cached text: an expression would compile into it (e.g. UPPER(%s))
    # and apply to every later job of the process.
    if _insert_params(job_copy, job_fields) is None or _insert_params(event_copy, event_fields) is None:
        raise ValueError("submit_job stores plain values only; an expression reached _insert_job_with_event")
    job_sql, _ = _insert_sql(job_copy, job_fields)
    event_sql, _ = _insert_sql(event_copy, event_fields)
    head, values = event_sql.split(" VALUES (%s, ", 1)  # the job id's placeholder comes first (event_fields)
    qn = connection.ops.quote_name
    sql = (f"WITH new_job AS ({job_sql} RETURNING {qn(job_meta.pk.column)}) "
           f"{head} VALUES ((SELECT {qn(job_meta.pk.column)} FROM new_job), {values} "
           f"RETURNING {qn(event_meta.get_field('job').column)}, {qn(event_meta.pk.column)}")
    _JOB_WITH_EVENT_SQL[connection.alias] = cached = (job_fields, event_fields[1:], sql)
    return cached


def _insert_job_with_event(job: Job, event: JobEvent) -> None:
    """Insert ``job`` and its first ``event`` in one PostgreSQL statement (one round trip, atomic by itself).

    A data-modifying CTE: ``WITH new_job AS (INSERT ... RETURNING id) INSERT
    INTO event ... VALUES ((SELECT id FROM new_job), ...)``. The SQL of both rows is Django's own
    (``InsertQuery``, compiled once per process: its text depends only on the fields), so column
    types, defaults and ``auto_now_add`` are the ORM's; sets ``job.pk`` and ``event.pk``. Sends no
    ``post_save`` signal (nothing listens for these two models). Submission is the hottest write
    path: this saves three round trips (BEGIN, second INSERT, COMMIT) and the compiler's work.
    """
    job_fields, event_fields, sql = _job_with_event_statement(job, event)
    job_params, event_params = _insert_params(job, job_fields), _insert_params(event, event_fields)
    if job_params is None or event_params is None:  # an expression among the values: no cached text fits
        raise ValueError("submit_job stores plain values only; an expression reached _insert_job_with_event")
    with connection.cursor() as cursor:
        cursor.execute(sql, job_params + event_params)
        job.pk, event.pk = cursor.fetchone()
    job._state.adding, job._state.db = False, connection.alias
    event.job = job
    event._state.adding, event._state.db = False, connection.alias


def end_attempt(job: Job, attempt: JobAttempt, to_state: str, *, reason: str, end_reason: str,
                exit_code: int | None = None, message: str = "", actor=None) -> Job:
    """End ``attempt`` and move ``job`` to ``to_state`` in one transaction.

    Ending the attempt releases its GPUs from quota and capacity. Raises
    StaleState or InvalidTransition (and writes nothing) like ``transition``.
    """
    now = timezone.now()
    with transaction.atomic():
        # Job row first, then the attempt: the one lock order of every lifecycle change and of the
        # scheduler, so two of them can never deadlock on a job and its attempt.
        transition(job, to_state, reason=reason, actor=actor, attempt=attempt,
                   data={"end_reason": end_reason, "exit_code": exit_code})
        updated = JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
            ended_at=now, end_reason=end_reason, exit_code=exit_code, message=message[:4000]
        )
        if updated:
            attempt.ended_at, attempt.end_reason, attempt.exit_code = now, end_reason, exit_code
    enqueue_final_accrual(attempt.pk)
    enqueue_schedule()  # the GPUs it held may admit a waiting job
    return job


def mark_started(job: Job, attempt: JobAttempt, runner_state: dict) -> Job:
    """Record that ``attempt``'s objects exist (billing starts now) and move ADMITTED -> STARTING."""
    with transaction.atomic():
        transition(job, S.STARTING, reason=f"objects created on {attempt.cluster.name}", attempt=attempt)
        # One UPDATE, after the job's (lock order: job, then attempt); started_at keeps its first
        # value, so a repeated dispatch does not move billing's start.
        JobAttempt.objects.filter(pk=attempt.pk).update(
            started_at=Coalesce(F("started_at"), Value(timezone.now(), output_field=DateTimeField())),
            runner_state=runner_state)
    return job


#: The attempt's cluster and node pool (with its accelerator) by id, for dispatch: rows every dispatch to a
#: cluster reads again and that rarely change. Cleared when one is saved in this process; another process's
#: change shows within ``settings.LOOKUP_CACHE_SECONDS`` (the Kubernetes client is rebuilt when the cluster's
#: endpoint or credentials differ, ``runners.kubernetes.client.client_for``).
PLACEMENT_ROWS = LookupCache("dispatch-placement-rows").invalidate_on(Cluster, NodePool, Accelerator)


def attach_placement_rows(attempt: JobAttempt) -> None:
    """Set ``attempt.cluster`` and ``attempt.node_pool`` (with ``.accelerator``) from ``PLACEMENT_ROWS``.

    The instances are shared between dispatches in this process: read them, never save them.
    """
    attempt.cluster = PLACEMENT_ROWS.get(("cluster", attempt.cluster_id),
                                         lambda: Cluster.objects.filter(pk=attempt.cluster_id).first())
    attempt.node_pool = PLACEMENT_ROWS.get(
        ("pool", attempt.node_pool_id),
        lambda: NodePool.objects.select_related("accelerator").filter(pk=attempt.node_pool_id).first())


def dispatch(attempt_id: int) -> str:
    """Create attempt ``attempt_id``'s objects on its cluster and move its job ADMITTED -> STARTING.

    Returns ``dispatched``; ``skipped`` when the job moved on or the attempt
    is not its current one; ``failed`` when the backend refused for good (or
    no backend serves the cluster): the attempt ends and the job FAILS with
    the backend's message; ``raced`` when another dispatch or a cancel moved
    the job first (reconcile deletes orphans). Raises TransientDispatchError
    for the caller to retry (the dispatch task does, with backoff).
    """
    attempt = JobAttempt.objects.select_related("job__team").get(pk=attempt_id)
    job = attempt.job
    if job.state != S.ADMITTED or job.current_attempt_id != attempt.pk or attempt.ended_at is not None:
        return "skipped"
    attach_placement_rows(attempt)
    try:
        with metrics.DISPATCH_SECONDS.time():
            runner_state = backend_for(attempt.cluster).dispatch(attempt)
    except TransientDispatchError:
        metrics.DISPATCH_ERRORS.labels(kind="transient").inc()
        raise
    except (PermanentDispatchError, UnknownBackend) as exc:
        metrics.DISPATCH_ERRORS.labels(kind="unknown_backend" if isinstance(exc, UnknownBackend) else "permanent").inc()
        try:
            end_attempt(job, attempt, S.FAILED, reason=f"dispatch failed: {exc}",
                        end_reason=JobAttempt.EndReason.DISPATCH_ERROR, message=str(exc))
        except StaleState:
            pass
        return "failed"
    try:
        mark_started(job, attempt, runner_state)
    except StaleState:
        return "raced"
    return "dispatched"


def delete_ended_attempt(attempt_id: int) -> bool:
    """Delete the objects of an ended (preempted) attempt on its cluster; True when the backend confirms they are gone.

    Idempotent; a live attempt is left alone (False), and so is a cluster
    without a backend (logged). Whatever stays behind is removed by
    reconcile's orphan cleanup. Raises TransientDispatchError for the caller
    to retry.
    """
    attempt = JobAttempt.objects.select_related("job__team", "cluster", "node_pool__accelerator").get(pk=attempt_id)
    if attempt.ended_at is None:
        return False
    try:
        return bool(backend_for(attempt.cluster).delete(attempt))
    except UnknownBackend:
        log.warning("attempt %s: cluster %s has an unknown backend; left to reconcile", attempt_id, attempt.cluster)
        return False


def apply_observation(job: Job, attempt: JobAttempt, obs: Observation) -> None:
    """Move ``job`` as ``obs`` says; a race lost to another worker is ignored (it did the work).

    STARTING goes through RUNNING before any end, so no state is skipped.
    Lost attempts are recovered while ``max_retries`` allows, else failed;
    an unschedulable one (STARTING) goes back to the queue (RECOVERING).
    """
    try:
        if job.state == S.CANCELLING:
            return
        if obs.phase in ("running", "succeeded", "failed") and job.state == S.STARTING:
            transition(job, S.RUNNING, reason="all nodes running" if obs.phase == "running" else f"observed {obs.phase}",
                       attempt=attempt)
        if obs.phase == "succeeded" and job.state == S.RUNNING:
            end_attempt(job, attempt, S.SUCCEEDED, reason="all nodes exited 0", end_reason=JobAttempt.EndReason.SUCCEEDED,
                        exit_code=0)
        elif obs.phase == "failed" and job.state in (S.RUNNING, S.STARTING):
            reason = obs.end_reason or JobAttempt.EndReason.FAILED
            text = f"{reason}" + (f" (exit code {obs.exit_code})" if obs.exit_code is not None else "")
            end_attempt(job, attempt, S.FAILED, reason=text, end_reason=reason, exit_code=obs.exit_code, message=obs.message)
        elif obs.phase in ("lost", "absent") and job.state in (S.STARTING, S.RUNNING):
            recover_or_fail(job, attempt, end_reason=obs.end_reason or JobAttempt.EndReason.NODE_LOST, message=obs.message)
        elif obs.phase == "unschedulable" and job.state == S.STARTING:
            # No node had room after all (a pod the platform does not know of took it): give the quota and the
            # nodes back and wait in the queue again; not a failure, so no retry is used.
            end_attempt(job, attempt, S.RECOVERING, reason=f"Unschedulable: back to the queue ({obs.message})"[:500],
                        end_reason=JobAttempt.EndReason.UNSCHEDULABLE, message=obs.message)
    except StaleState:
        log.info("job %s changed under reconcile; leaving it to the winner", job.pk)


def recover_or_fail(job: Job, attempt: JobAttempt, *, end_reason: str, message: str = "") -> Job:
    """End a lost attempt: RECOVERING (back to admission) while retries remain, FAILED after ``max_retries``.

    Retries count earlier attempts that were lost; attempts ended by
    preemption, or sent back to the queue as unschedulable, were the
    scheduler's doing, not a failure, and do not count.
    """
    retries_used = (
        job.attempts.filter(number__lt=attempt.number)
        .exclude(end_reason__in=[JobAttempt.EndReason.PREEMPTED, JobAttempt.EndReason.UNSCHEDULABLE]).count()
    )
    if retries_used < job.max_retries:
        return end_attempt(job, attempt, S.RECOVERING, reason=f"{end_reason}: attempt {attempt.number} lost, recovering",
                           end_reason=end_reason, message=message)
    return end_attempt(job, attempt, S.FAILED, reason=f"{end_reason}: attempt lost and {job.max_retries} retries used",
                       end_reason=end_reason, message=message)


def cancel_job(job: Job, actor=None) -> Job:
    """Cancel ``job``: straight to CANCELLED when nothing runs, else CANCELLING until the cluster confirms.

    Raises NotCancellable for a job in a final state or already CANCELLING,
    StaleState when it changed meanwhile.
    """
    if job.is_final:
        raise NotCancellable(f"job {job.pk} is already {job.state}")
    if job.state == S.CANCELLING:  # a second cancel: CANCELLING -> CANCELLING is no transition
        raise NotCancellable(f"job {job.pk} is already being cancelled")
    with transaction.atomic():
        if job.state == S.QUEUED or (job.state == S.RECOVERING and not job.attempts.filter(ended_at__isnull=True).exists()):
            return transition(job, S.CANCELLED, reason=f"cancelled by {actor}" if actor else "cancelled", actor=actor,
                              queue_info={})
        transition(job, S.CANCELLING, reason=f"cancel requested by {actor}" if actor else "cancel requested", actor=actor)
        enqueue_cancel(job.pk)
    return job


def finish_cancel(job_id: int) -> bool:
    """Delete a CANCELLING job's objects; end it CANCELLED when the backend confirms they are gone or cannot be reached.

    On an unreachable cluster the attempt ends at once (end reason
    Cancelled, so billing stops) with a reason saying the deletion is
    pending: reconcile's orphan cleanup deletes the objects of ended
    attempts when the cluster answers again. Returns True when the job
    reached CANCELLED. Safe to call repeatedly.
    """
    job = Job.objects.select_related("current_attempt__cluster").get(pk=job_id)
    if job.state != S.CANCELLING:
        return job.state == S.CANCELLED
    attempt = job.current_attempt
    reason = "objects deleted"
    try:
        gone = attempt is None or attempt.ended_at is not None or backend_for(attempt.cluster).delete(attempt)
    except ClusterUnreachable as exc:
        log.warning("job %s: cluster %s unreachable, cancelled with deletion pending: %s", job_id,
                    attempt.cluster.name, exc)
        gone, reason = True, (f"cluster {attempt.cluster.name} unreachable: objects will be deleted when it "
                              f"answers again (deletion pending)")
    if not gone:
        return False
    try:
        if attempt is not None and attempt.ended_at is None:
            end_attempt(job, attempt, S.CANCELLED, reason=reason, end_reason=JobAttempt.EndReason.CANCELLED)
        else:
            transition(job, S.CANCELLED, reason="nothing was running")
    except StaleState:
        return False
    return True


def preempt_attempt(job: Job, attempt: JobAttempt, *, reason: str, actor=None) -> Job:
    """End ``attempt`` as Preempted and move ``job`` to RECOVERING in one transaction (its quota is released).

    The job is requeued with its original priority and submission time
    (resuming from its checkpoint); its objects are deleted on commit by
    ``jobs.tasks.delete_attempt_objects`` (reconcile's orphan cleanup is the
    safety net). Preemption does not count against ``max_retries``. Raises
    StaleState or InvalidTransition (and writes nothing) like ``transition``.
    """
    now = timezone.now()
    before = job.state
    with transaction.atomic():
        # Job row first, then the attempt (the lock order of every lifecycle change).
        transition(job, S.RECOVERING, reason=reason, actor=actor, attempt=attempt,
                   data={"end_reason": JobAttempt.EndReason.PREEMPTED})
        updated = JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
            ended_at=now, end_reason=JobAttempt.EndReason.PREEMPTED, message=reason[:4000]
        )
        if not updated:  # the attempt ended meanwhile: roll the transition back
            job.state = before
            raise StaleState(job.pk, before)
        attempt.ended_at, attempt.end_reason = now, JobAttempt.EndReason.PREEMPTED
        enqueue_delete_attempt(attempt.pk)
    enqueue_final_accrual(attempt.pk)
    return job
