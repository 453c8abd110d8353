"""Job lifecycle services: submit, dispatch, observe, end an attempt, cancel, preempt.

Each function is one transaction: the job's state change (compare and set),
its JobEvent and the attempt's end (which releases quota and capacity,
since both are counted from live attempts) commit together or not at all.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from django.db import connection, transaction
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce, Greatest
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
from runners.cluster_health import set_health
from runners.models import Accelerator, Cluster, Installation, Node, NodePool

from . import dependencies, metrics
from .dependencies import check_and_record
from .enqueue import (
    enqueue_cancel,
    enqueue_delete_attempt,
    enqueue_dispatch,
    enqueue_final_accrual,
    enqueue_record_end,
    enqueue_schedule,
)
from .models import FREE_RETRY_END_REASONS, Job, JobAttempt, JobEvent, JobState
from .states import Move, StaleState, record_event, transition, transition_many
from .workload import collect_before_delete

log = logging.getLogger(__name__)
S = JobState


class NotCancellable(Exception):
    """The job already reached a final state."""


def submit_job(*, team, submitter, name: str, kind: str, spec: dict, resources: dict, after=()) -> Job:
    """Store a validated job as QUEUED, write its first event, and enqueue a scheduling pass on commit.

    ``spec`` must already be validated (``jobs.spec``); ``resources`` holds the
    accelerator instance and integer fields copied to columns; ``after`` the
    upstream jobs it waits for, ``(Job, condition)`` pairs (``jobs.dependencies``).
    Raises ``jobs.dependencies.DependencyRefused`` (nothing stored) when an upstream
    ended meanwhile in a way its condition no longer accepts.
    """
    fields = dict(team=team, submitter=submitter, name=name, kind=kind, spec=spec, resources=resources, after=after)
    if connection.vendor == "postgresql" and not after:
        job = store_submitted_job(**fields)  # one statement, committed on its own: on_commit runs at once
        enqueue_schedule(background=True)
        return job
    with transaction.atomic():
        job = store_submitted_job(**fields)
        enqueue_schedule(background=True)
    return job


def store_submitted_job(*, team, submitter, name: str, kind: str, spec: dict, resources: dict, after=()) -> Job:
    """Insert the QUEUED job and its ``submitted`` event, and its dependencies when ``after`` lists any (then in
    one transaction with them, ``jobs.dependencies.check_and_record``), and nothing else (no scheduling pass).

    On PostgreSQL one statement (``_insert_job_with_event``), atomic by itself;
    elsewhere one transaction of two ORM inserts. ``submit_job`` is this plus admission's pass;
    ``benchmarks/submit.py`` times this alone to show what admission adds. The job carries ``after_edges``
    (its ``after`` as the API shows it, ``jobs.dependencies.edges_of``), so the answer reads nothing back.
    """
    job = Job(
        team=team, submitter=submitter, name=name, kind=kind, spec=spec,
        accelerator=resources["accelerator"], gpus_per_node=resources["gpus_per_node"], nodes=resources["nodes"],
        gpu_share_milli=resources.get("gpu_share_milli", 0), mig_profile=resources.get("mig_profile", ""),
        priority=resources["priority"], preemptible=resources["preemptible"],
        max_runtime_seconds=resources["max_runtime_seconds"], max_retries=resources["max_retries"],
        replicas=resources.get("replicas", 1),
    )
    reason = f"submitted by {submitter}"
    if after:
        with transaction.atomic():
            _store(job, submitter, reason)
            info = check_and_record(job, list(after))
            if info:
                Job.objects.filter(pk=job.pk).update(queue_info=info, state_reason=info["message"][:500])
                job.queue_info, job.state_reason = info, info["message"][:500]
        job.after_edges = [{"job": u.pk, "name": u.name, "condition": c, "state": u.state,
                            "met": dependencies.holds(c, u.state)} for u, c in after]
        return job
    _store(job, submitter, reason)
    job.after_edges = []
    return job


def _store(job: Job, submitter, reason: str) -> None:
    """Insert ``job`` and its ``submitted`` event (one statement on PostgreSQL, else one transaction)."""
    if connection.vendor == "postgresql":
        _insert_job_with_event(job, JobEvent(kind="submitted", reason=reason[:500], actor=submitter, data={},
                                             from_state=job.state, to_state=job.state))
        return
    with transaction.atomic():
        job.save(force_insert=True)
        record_event(job, "submitted", reason, actor=submitter)


def _insert_params(obj, fields: list) -> list:
    """The parameters of ``obj``'s ``fields`` as an INSERT sends them: each field's ``pre_save`` (so
    ``auto_now_add`` and defaults apply) then ``get_db_prep_save``, Django's public Field API. Raises
    ValueError for a value that is an expression (its SQL would not be a plain placeholder)."""
    params = []
    for field in fields:
        value = field.pre_save(obj, True)
        if hasattr(value, "resolve_expression"):
            raise ValueError(f"submit_job stores plain values only; {field.name} is an expression")
        params.append(field.get_db_prep_save(value, connection=connection))
    return params


def _insert_columns(model) -> tuple[list, str, str]:
    """(fields, quoted table, quoted columns) of ``model``'s concrete fields but its auto primary key, from the
    model's ``_meta`` (Django's documented Model _meta API)."""
    meta = model._meta
    fields = [f for f in meta.local_concrete_fields if f is not meta.auto_field]
    qn = connection.ops.quote_name
    return fields, qn(meta.db_table), ", ".join(qn(f.column) for f in fields)


#: Per connection alias: (job fields, event fields but the job, the statement of ``_insert_job_with_event``).
_JOB_WITH_EVENT_SQL: dict[str, tuple[list, list, str]] = {}


def _job_with_event_statement() -> tuple[list, list, str]:
    """The fields of both rows and the statement of ``_insert_job_with_event``, written once per process from the
    models' ``_meta`` (the text depends only on the models)."""
    cached = _JOB_WITH_EVENT_SQL.get(connection.alias)
    if cached is not None:
        return cached
    job_fields, job_table, job_columns = _insert_columns(Job)
    event_fields, event_table, _ = _insert_columns(JobEvent)
    job_fk = JobEvent._meta.get_field("job")
    event_fields = [f for f in event_fields if f is not job_fk]
    qn = connection.ops.quote_name
    job_pk, event_pk = qn(Job._meta.pk.column), qn(JobEvent._meta.pk.column)
    marks = ", ".join(["%s"] * len(job_fields))
    sql = (f"WITH new_job AS (INSERT INTO {job_table} ({job_columns}) VALUES ({marks}) RETURNING {job_pk}) "
           f"INSERT INTO {event_table} ({qn(job_fk.column)}, {', '.join(qn(f.column) for f in event_fields)}) "
           f"VALUES ((SELECT {job_pk} FROM new_job), {', '.join(['%s'] * len(event_fields))}) "
           f"RETURNING {qn(job_fk.column)}, {event_pk}")
    _JOB_WITH_EVENT_SQL[connection.alias] = cached = (job_fields, event_fields, sql)
    return cached


def _insert_job_with_event(job: Job, event: JobEvent) -> None:
    """Insert ``job`` and its first ``event`` in one PostgreSQL statement (one round trip, atomic by itself).

    A data-modifying CTE: ``WITH new_job AS (INSERT ... RETURNING id) INSERT INTO event ... VALUES ((SELECT id
    FROM new_job), ...)``, its text written from the models' ``_meta`` and its parameters by each field's own
    ``pre_save`` and ``get_db_prep_save`` (so column types, defaults and ``auto_now_add`` are the ORM's); sets
    ``job.pk`` and ``event.pk``. Sends no ``post_save`` signal (nothing listens for these two models).
    Submission is the hottest write path: against ``Job.objects.create`` and ``JobEvent.objects.create`` in a
    transaction this saves three round trips (BEGIN, the second INSERT, COMMIT) and the ORM's SQL compilation
    (``benchmarks/submit.py``). Raises ValueError when a value is an expression.
    """
    job_fields, event_fields, sql = _job_with_event_statement()
    params = _insert_params(job, job_fields) + _insert_params(event, event_fields)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        job.pk, event.pk = cursor.fetchone()
    job._state.adding, job._state.db = False, connection.alias
    event.job = job
    event._state.adding, event._state.db = False, connection.alias


def end_attempt(job: Job, attempt: JobAttempt, to_state: str, *, reason: str, end_reason: str,
                exit_code: int | None = None, message: str = "", actor=None, ended_at=None,
                bad_nodes: tuple[str, ...] = ()) -> Job:
    """End ``attempt`` and move ``job`` to ``to_state`` in one transaction.

    Ending the attempt releases its GPUs from quota and capacity. ``ended_at``
    is when its pods stopped holding GPUs as the cluster reports it (billing
    ends there; default now), kept between its start and now. ``bad_nodes``:
    the nodes whose fault ended it (``JobAttempt.bad_nodes``). Raises
    StaleState or InvalidTransition (and writes nothing) like ``transition``.
    """
    now = billing_end(attempt, ended_at)
    with transaction.atomic():
        # Job row first, then the attempt: the one lock order of every lifecycle change and of the
        # scheduler, so two of them can never deadlock on a job and its attempt.
        transition(job, to_state, reason=reason, actor=actor, attempt=attempt,
                   data={"end_reason": end_reason, "exit_code": exit_code,
                         **({"bad_nodes": list(bad_nodes)} if bad_nodes else {})})
        updated = JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
            ended_at=now, end_reason=end_reason, exit_code=exit_code, message=message[:4000], bad_nodes=list(bad_nodes)
        )
        if updated:
            attempt.ended_at, attempt.end_reason, attempt.exit_code = now, end_reason, exit_code
    enqueue_final_accrual(attempt.pk)
    enqueue_schedule()  # the GPUs it held may admit a waiting job
    return job


def billing_end(attempt: JobAttempt, ended_at=None):
    """When billing of ``attempt`` ends: ``ended_at`` (the cluster's word on when its pods stopped), kept
    between the attempt's start and now; now when the cluster did not say."""
    now = timezone.now()
    if ended_at is None or ended_at > now:
        return now
    return max(ended_at, attempt.started_at) if attempt.started_at is not None else ended_at


def objects_created_at(runner_state: dict):
    """The objects' creation time from a backend's ``runner_state`` (``created_at``, ISO 8601), else now."""
    value = (runner_state or {}).get("created_at")
    try:
        made = dt.datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        made = None
    now = timezone.now()
    return made if made is not None and made.tzinfo is not None and made <= now else now


def mark_started(job: Job, attempt: JobAttempt, runner_state: dict, *, reason: str = "") -> Job:
    """Record that ``attempt``'s objects exist and move ADMITTED -> STARTING.

    Billing starts when the objects were created (``runner_state["created_at"]``, the cluster's
    creationTimestamp; now when absent), not when this runs: an attempt adopted by reconcile is billed
    from the creation of its objects.
    """
    created = objects_created_at(runner_state)
    with transaction.atomic():
        transition(job, S.STARTING, reason=reason or f"objects created on {attempt.cluster.name}", attempt=attempt)
        # One UPDATE, after the job's (lock order: job, then attempt); started_at keeps its first
        # value, so a repeated dispatch does not move billing's start.
        JobAttempt.objects.filter(pk=attempt.pk).update(
            started_at=Coalesce(F("started_at"), Value(created, output_field=DateTimeField())),
            runner_state=runner_state)
        attempt.started_at = attempt.started_at or created
    return job


#: How far past the timeline line that ended an attempt its billing must run before the timeline says why: the
#: timeline shows whole seconds, so a deletion accepted a few milliseconds after the end is the same instant there.
EXPLAINED_AFTER = dt.timedelta(seconds=1)


def _ended_on_timeline(attempt: JobAttempt) -> dt.datetime:
    """When ``attempt``'s end shows on its job's timeline: the state event that ended it (its ``end_reason``), else
    its recorded end."""
    shown = (JobEvent.objects.filter(attempt_id=attempt.pk, kind="state", data__has_key="end_reason")
             .order_by("created_at", "id").values_list("created_at", flat=True).first())
    return shown or attempt.ended_at


def bill_objects(attempt_id: int, created, *, held_until=None, evidence: str = "") -> None:
    """Bill objects that exist for ``attempt_id`` although it ended (a dispatch that lost a race to a cancel or a
    release, objects of an ended attempt still running until deleted): billing starts at their creation
    ``created`` unless it started before, and its end moves to ``held_until`` when that is later: a time the
    cluster's evidence says their pods still held their GPUs (their owner's deletion accepted then, a look that
    saw them running then) or stopped (their own times). The ledger picks the extra time up (it accrues to
    ``ended_at``). ``evidence``: what the cluster said, in words, for the job's timeline.

    Class of failure: an end moved by a repeated delivery (a second DELETE of objects still terminating moved the
    end to its own time). Invariant: once recorded, an attempt's end moves only to the cluster's evidence, never
    to when a task happened to run, and the same evidence gives the same end however often it is delivered
    (``Greatest`` of the end and a time the cluster reported; docs/adr/0021). A time past now (a cluster clock
    ahead of ours) counts as now.

    Class of failure: billing past a job's end without a word. Invariant: every move of an attempt's end to at
    least ``EXPLAINED_AFTER`` past the timeline line that ended it writes, in the same transaction, one
    ``billed_past_end`` event on the job's timeline that gives the old and the new end and the evidence
    (``data``: ``from``, ``to`` as ISO 8601 UTC, ``seconds`` added); a delivery that moves nothing writes
    nothing."""
    now = timezone.now()
    changes = {"started_at": Coalesce(F("started_at"), Value(created or now, output_field=DateTimeField()))}
    until = min(held_until, now) if held_until is not None else None
    if until is not None:
        value = Value(until, output_field=DateTimeField())
        changes["ended_at"] = Greatest(Coalesce(F("ended_at"), value), value)
    with transaction.atomic():
        row = (JobAttempt.objects.select_for_update(of=("self",)).select_related("job")
               .only("ended_at", "number", "job__state")
               .filter(pk=attempt_id, ended_at__isnull=False).first())
        if row is None:
            return
        JobAttempt.objects.filter(pk=attempt_id).update(**changes)
        enqueue_final_accrual(attempt_id)
        if until is not None and until > row.ended_at and until >= _ended_on_timeline(row) + EXPLAINED_AFTER:
            added = (until - row.ended_at).total_seconds()
            record_event(row.job, "billed_past_end",
                         f"attempt #{row.number}: billed until {until:%Y-%m-%d %H:%M:%S} UTC, {added:.0f} s past its "
                         f"recorded end, because its pods still held their GPUs then"
                         f"{': ' + evidence if evidence else ''}",
                         attempt=row, data={"from": row.ended_at.isoformat(), "to": until.isoformat(),
                                            "seconds": added})
            # the cluster's end record follows (``record_end``), so a restored database bills the same
            enqueue_record_end(attempt_id)


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

    Returns ``dispatched``; ``skipped`` when the job moved on, the attempt
    is not its current one or no longer exists; ``failed`` when the backend refused for good (or
    no backend serves the cluster): the attempt ends and the job FAILS with
    the backend's message; ``raced`` when another dispatch or a cancel moved
    the job first (reconcile deletes orphans). Raises TransientDispatchError
    for the caller to retry (the dispatch task does, with backoff). ``dispatch_many`` of one attempt.
    """
    return dispatch_many([attempt_id])[attempt_id]


def dispatch_many(attempt_ids: list[int]) -> dict[int, str]:
    """Dispatch the attempts ``attempt_ids`` (any clusters) as ``dispatch`` does each, with one read of their rows
    and, per cluster, one transaction recording those whose objects were created (docs/adr/0047).

    Returns ``{attempt id: outcome}`` with ``dispatch``'s outcomes, and ``waiting`` for an attempt left ADMITTED
    by a transient failure (its previous attempt's pods still stopping, its cluster unreachable, 408/429/5xx).
    The clusters are independent: a cluster that does not answer stops the creates of its own attempts (each
    would wait out the client's timeout), never another cluster's. When any attempt is ``waiting``, raises
    TransientDispatchError after the others are recorded: the caller's retry dispatches the batch again, and
    the attempts already STARTING are ``skipped`` then (their objects were created once; a create repeated
    after a lost record finds them, 409 owned by the attempt, and adopts them).
    """
    ids = list(dict.fromkeys(attempt_ids))
    outcomes = dict.fromkeys(ids, "skipped")
    by_cluster: dict[int, list[JobAttempt]] = {}
    for attempt in (JobAttempt.objects.select_related("job__team", "job__submitter").filter(pk__in=ids)
                    .order_by("pk")):
        job = attempt.job
        if job.state == S.ADMITTED and job.current_attempt_id == attempt.pk and attempt.ended_at is None:
            by_cluster.setdefault(attempt.cluster_id, []).append(attempt)
    waiting: list[TransientDispatchError] = []
    rows: dict[tuple[int, int], tuple] = {}  # (cluster id, pool id) -> the shared rows, looked up once a batch
    for attempts in by_cluster.values():
        created = []
        for attempt in attempts:
            key = (attempt.cluster_id, attempt.node_pool_id)
            if key in rows:
                attempt.cluster, attempt.node_pool = rows[key]
            else:
                attach_placement_rows(attempt)
                rows[key] = attempt.cluster, attempt.node_pool
            outcome = _create_objects(attempt, waiting)
            if outcome == "unreachable":  # the rest of this cluster's attempts wait for the retry
                for rest in attempts[attempts.index(attempt):]:
                    outcomes[rest.pk] = "waiting"
                break
            if isinstance(outcome, dict):
                created.append((attempt, outcome))
            else:
                outcomes[attempt.pk] = outcome
        outcomes.update(record_started(created))
    left = sum(1 for outcome in outcomes.values() if outcome == "waiting")
    if left == 1:
        raise waiting[0]
    if waiting:
        raise TransientDispatchError(f"{left} of {len(ids)} attempt(s) wait for a retry; first: {waiting[0]}")
    return outcomes


def _create_objects(attempt: JobAttempt, waiting: list) -> dict | str:
    """Create ``attempt``'s objects through its cluster's backend: its ``runner_state``, or ``failed`` (the attempt
    ended, the job FAILED), ``waiting`` (a transient failure of this attempt, appended to ``waiting``) or
    ``unreachable`` (its cluster did not answer: appended too)."""
    job = attempt.job
    try:
        wait_for_previous_attempt(attempt)
        with metrics.DISPATCH_SECONDS.time():
            return backend_for(attempt.cluster).dispatch(attempt)
    except TransientDispatchError as exc:
        metrics.DISPATCH_ERRORS.labels(kind="transient").inc()
        waiting.append(exc)
        return "unreachable" if isinstance(exc.__cause__, ClusterUnreachable) else "waiting"
    except (PermanentDispatchError, UnknownBackend) as exc:
        metrics.DISPATCH_ERRORS.labels(kind="unknown_backend" if isinstance(exc, UnknownBackend) else "permanent").inc()
        try:
            end_attempt(job, attempt, S.FAILED, reason=f"dispatch failed: {exc}",
                        end_reason=JobAttempt.EndReason.DISPATCH_ERROR, message=str(exc))
        except StaleState:
            pass
        return "failed"


def record_started(created: list[tuple[JobAttempt, dict]]) -> dict[int, str]:
    """Record that the objects of each ``(attempt, runner_state)`` of ``created`` (attempts of one cluster) exist:
    in one transaction, their jobs ADMITTED -> STARTING (one compare-and-set UPDATE and one INSERT of their events,
    ``jobs.states.transition_many``), then their attempts' ``runner_state`` and billing start (one UPDATE; lock
    order job, then attempt, as ``mark_started``). Returns ``{attempt id: "dispatched"}``, ``"raced"`` for one whose
    job a cancel or a release moved first: its objects are billed from their creation until reconcile's orphan
    cleanup deletes them (``bill_objects``)."""
    if not created:
        return {}
    cluster = created[0][0].cluster
    reason = f"objects created on {cluster.name}"
    with transaction.atomic():
        if connection.vendor == "postgresql":
            moved = _start_many([(attempt, objects_created_at(state), state) for attempt, state in created], reason)
        else:  # SQLite (the demo): the same writes through the ORM
            list(Job.objects.select_for_update(of=("self",)).filter(pk__in=[a.job_id for a, _ in created])
                 .order_by("pk").values_list("pk", flat=True))
            list(JobAttempt.objects.select_for_update(of=("self",)).filter(pk__in=[a.pk for a, _ in created])
                 .order_by("pk").values_list("pk", flat=True))
            moved = {job.pk for job in transition_many(
                [Move(attempt.job, reason=reason, attempt=attempt) for attempt, _ in created], S.STARTING)}
            rows = [(attempt, objects_created_at(state), state) for attempt, state in created
                    if attempt.job_id in moved]
            if rows:
                _set_started(rows)
    outcomes = {}
    for attempt, state in created:
        if attempt.job_id in moved:
            outcomes[attempt.pk] = "dispatched"
        else:
            bill_objects(attempt.pk, objects_created_at(state))
            outcomes[attempt.pk] = "raced"
    return outcomes


def _start_many(rows: list[tuple[JobAttempt, dt.datetime, dict]], reason: str) -> set[int]:
    """Inside the caller's transaction on PostgreSQL, ``record_started``'s writes for ``rows`` (``(attempt, created,
    runner_state)``, attempts of ADMITTED jobs, one per job) in three statements: the jobs' rows locked in id
    order, then the attempts' (a batch delivered twice at once, or two batches that share jobs, then wait for each
    other instead of locking in the order each UPDATE scans: a deadlock); then one statement (``_START_MANY``)
    that moves the jobs ADMITTED -> STARTING by compare-and-set and, for those it moved alone, inserts their
    ``state`` events (naming the attempt) and sets their attempts' ``runner_state`` and ``started_at`` unless set
    before (a repeated dispatch does not move billing's start), as ``transition_many`` and ``_set_started`` do.
    Returns the ids of the jobs moved (one whose row left ADMITTED is left out, nothing written for it: StaleState's
    case); updates the moved jobs and attempts in memory. Against the ORM's statements (two lock queries, the
    UPDATE, the events' ``bulk_create``, the attempts' UPDATE) this saves two round trips and the compilation of
    four queries and of an event instance per job (``benchmarks/dispatch.py``)."""
    now = timezone.now()
    reason = reason[:500]
    job_ids, attempt_ids = sorted(a.job_id for a, _, _ in rows), sorted(a.pk for a, _, _ in rows)
    with connection.cursor() as cursor:
        for table, ids in ((Job._meta.db_table, job_ids), (JobAttempt._meta.db_table, attempt_ids)):
            cursor.execute(f'SELECT "id" FROM "{table}" WHERE "id" IN ({", ".join(["%s"] * len(ids))}) '
                           f'ORDER BY "id" FOR UPDATE', ids)
            cursor.fetchall()
        values = ", ".join(["(%s::bigint, %s::bigint, %s::timestamptz, %s::jsonb)"] * len(rows))
        params = [p for attempt, made, state in rows for p in (attempt.pk, attempt.job_id, made, json.dumps(state))]
        cursor.execute(_START_MANY.format(values=values), [*params, S.STARTING, now, reason, S.ADMITTED,
                                                           "state", S.ADMITTED, S.STARTING, reason, "{}", now])
        moved = {job_id for job_id, in cursor.fetchall()}
    for attempt, made, state in rows:
        if attempt.job_id in moved:
            attempt.job.state, attempt.job.updated_at, attempt.job.state_reason = S.STARTING, now, reason
            attempt.started_at = attempt.started_at or made
            attempt.runner_state = state
    return moved


#: ``_start_many``'s statement; ``{values}``: a VALUES row ``(attempt id, job id, created, runner_state)`` per
#: attempt. Parameters after the rows: the new state, now, the reason, the expected state (the compare-and-set),
#: then the event's kind, from state, to state, reason, data (JSON) and time. Data-modifying CTEs see one snapshot and run once each:
#: ``moved`` holds the jobs the UPDATE changed, and only those get an event and their attempt's start.
_START_MANY = (
    f'WITH v ("attempt", "job", "made", "state") AS (VALUES {{values}}), '
    f'moved AS (UPDATE "{Job._meta.db_table}" AS j SET "state" = %s, "updated_at" = %s, "state_reason" = %s FROM v '
    'WHERE j."id" = v."job" AND j."state" = %s RETURNING j."id"), '
    f'event AS (INSERT INTO "{JobEvent._meta.db_table}" ("job_id", "attempt_id", "kind", "from_state", "to_state", '
    '"reason", "actor_id", "data", "created_at") SELECT v."job", v."attempt", %s, %s, %s, %s, NULL, %s::jsonb, %s '
    'FROM v JOIN moved ON moved."id" = v."job" ORDER BY v."attempt"), '
    f'started AS (UPDATE "{JobAttempt._meta.db_table}" AS a SET "started_at" = COALESCE(a."started_at", v."made"), '
    '"runner_state" = v."state" FROM v JOIN moved ON moved."id" = v."job" WHERE a."id" = v."attempt") '
    'SELECT "id" FROM moved'
)


def _set_started(rows: list[tuple[JobAttempt, dt.datetime, dict]]) -> None:
    """The attempts' part of ``record_started`` off PostgreSQL (SQLite, the demo; ``_start_many`` on PostgreSQL): an
    UPDATE per attempt of ``rows`` (``(attempt, created, runner_state)``) setting ``runner_state``, and
    ``started_at`` unless set before (a repeated dispatch does not move billing's start)."""
    for attempt, made, state in rows:
        JobAttempt.objects.filter(pk=attempt.pk).update(started_at=Coalesce(F("started_at"), Value(made)),
                                                        runner_state=state)
        attempt.started_at = attempt.started_at or made
        attempt.runner_state = state


#: End reasons of an attempt whose objects the platform itself deleted while they ran: their pods may still be
#: running out their termination grace when the job's next attempt is dispatched.
DELETED_BY_PLATFORM = (JobAttempt.EndReason.PREEMPTED, JobAttempt.EndReason.NODE_UNHEALTHY)


def wait_for_previous_attempt(attempt: JobAttempt) -> None:
    """Raise TransientDispatchError (the dispatch task retries with backoff) while the pods of the job's previous
    attempt, ended by a preemption or an unhealthy node, still hold their GPUs: being deleted, they run out their
    termination grace (``terminationGracePeriodSeconds``, e.g. a checkpoint on SIGTERM). Kueue likewise frees an
    evicted workload's quota only once its pods are gone.

    Class: a job running twice (its old pods still run when its new ones start: two writers of one checkpoint).
    Invariant (the simulator's ``no_duplicate_run``): never more pods of a job alive than its nodes x replicas.
    A previous attempt on a cluster that does not answer does not hold the dispatch up (its recovery already
    judged that cluster). After the task's retries the dispatch deadline releases and places the job again."""
    if attempt.number <= 1:  # a job's first attempt: no attempt before it (no query)
        return
    for previous in (JobAttempt.objects.filter(job_id=attempt.job_id, number__lt=attempt.number,
                                               end_reason__in=DELETED_BY_PLATFORM, started_at__isnull=False)
                     .select_related("cluster", "job__team").order_by("-number")[:3]):  # those that had pods
        try:
            holding = backend_for(previous.cluster).still_holding(previous)
        except (ClusterUnreachable, UnknownBackend):
            continue
        if holding:
            raise TransientDispatchError(f"attempt {previous.number}'s pods are still stopping on "
                                         f"{previous.cluster.name}; attempt {attempt.number} waits for them")


def record_end(attempt_id: int) -> bool:
    """Move the end record of ended attempt ``attempt_id`` on its cluster forward to the attempt's end
    (``Backend.record_end``); True when it moved. Idempotent: the record's end only moves forward, to the end
    the row holds when this runs, so a repeated or late delivery writes nothing new (docs/adr/0021). A live
    attempt, or a cluster without a backend (logged), is left alone (False). Raises TransientDispatchError
    (the cluster did not answer) for the caller to retry.

    Class of failure: an end recorded on the cluster before the pods' real stop (see
    ``runners.kubernetes.runner.KubernetesBackend.record_end``). Invariant: after a restore from a backup, an
    attempt whose objects are gone ends, and is billed, where the live database ended it."""
    attempt = JobAttempt.objects.select_related("job__team", "cluster").get(pk=attempt_id)
    if attempt.ended_at is None:
        return False
    try:
        return bool(backend_for(attempt.cluster).record_end(attempt))
    except UnknownBackend:
        log.warning("attempt %s: cluster %s has an unknown backend; its end record is left", attempt_id,
                    attempt.cluster)
        return False
    except ClusterUnreachable as exc:
        raise TransientDispatchError(f"updating the end record of {attempt.object_name}: {exc}") from exc


def delete_ended_attempt(attempt_id: int) -> bool:
    """Delete the objects of an ended (preempted) attempt on its cluster; True when the backend confirms they are gone.

    Idempotent; a live attempt is left alone (False), and so is a cluster
    without a backend (logged). Whatever stays behind is removed by
    reconcile's orphan cleanup. A preempted attempt's pods ran until the
    cluster accepted their deletion: billing ends there. Raises
    TransientDispatchError (the cluster did not answer) for the caller to retry.
    """
    attempt = JobAttempt.objects.select_related("job__team", "cluster", "node_pool__accelerator").get(pk=attempt_id)
    if attempt.ended_at is None:
        return False
    collect_before_delete(attempt)  # its pods' logs go with them: keep the run's last reports first
    try:
        gone = bool(backend_for(attempt.cluster).delete(attempt))
    except UnknownBackend:
        log.warning("attempt %s: cluster %s has an unknown backend; left to reconcile", attempt_id, attempt.cluster)
        return False
    except ClusterUnreachable as exc:
        _bill_until_deleted(attempt)
        raise TransientDispatchError(f"deleting {attempt.object_name}: {exc}") from exc
    _bill_until_deleted(attempt)
    return gone


def _bill_until_deleted(attempt: JobAttempt) -> None:
    """A preempted attempt whose pods' owner the cluster accepted to delete: bill it until then, by the owner's own
    deletion time (``Backend.delete``), which every later delivery of the deletion reads again unchanged. Pods that
    run out a termination grace past it are billed by reconcile's looks (``reconcile._delete_orphans``)."""
    accepted = getattr(attempt, "deletion_accepted_at", None)
    if accepted is not None and attempt.end_reason in (JobAttempt.EndReason.PREEMPTED,
                                                        JobAttempt.EndReason.NODE_UNHEALTHY):
        bill_objects(attempt.pk, None, held_until=accepted,
                     evidence=f"the cluster accepted the deletion of their owner at {accepted:%H:%M:%S} UTC")


def failure_text(end_reason: str, exit_code: int | None) -> str:
    """The reason a FAILED job shows, read after its state (``FAILED: exited with code 134``), so it does not
    repeat it: the exit code for a plain failure, the end reason (``OOMKilled``, ``ImagePullBackOff``) with
    the exit code when there is one."""
    if end_reason == JobAttempt.EndReason.FAILED:
        return "exited with code %d" % exit_code if exit_code is not None else "a container failed"
    return end_reason + (f" (exit code {exit_code})" if exit_code is not None else "")


#: How an attempt may end and be started again (within ``max_retries``): its container exited non-zero (a serving
#: job's server crashed; a training job's process failed) or, for a serving job, ran out of memory. A deadline, a cancel or an image that cannot be pulled would only
#: repeat: those fail the job whatever ``max_retries`` says.
RESTARTED_ENDS = frozenset({JobAttempt.EndReason.FAILED, JobAttempt.EndReason.OOM_KILLED})


def apply_observation(job: Job, attempt: JobAttempt, obs: Observation) -> None:
    """Move ``job`` as ``obs`` says; a race lost to another worker is ignored (it did the work).

    An ADMITTED job whose objects exist (a dispatch that died after creating
    them) is adopted: STARTING, billed from the objects' creation. STARTING
    goes through RUNNING before any end, so no state is skipped. Lost
    attempts are recovered while ``max_retries`` allows, else failed; the end
    reason names the cause (Evicted, PodDeleted, NodeLost, Preempted...).
    ``absent`` is not handled here: reconcile acts on it only after a second
    look (``confirm_absent``).
    Attempts whose container exited with an error or was OOM-killed
    (``RESTARTED_ENDS``) are recovered the same way, a serving job's always
    and a training job's that exited non-zero when it has ``max_retries``; a
    training job without retries that exits non-zero, or OOM-killed, fails.
    An unschedulable attempt (STARTING) goes back to the queue (RECOVERING).
    ``ended`` (the objects are gone, the cluster's end record says how the
    attempt ended) ends it as recorded (``end_as_recorded``).
    """
    try:
        if job.state == S.CANCELLING or obs.phase == "absent":
            return
        if obs.phase == "ended":
            end_as_recorded(job, attempt, obs)
            return
        if job.state == S.ADMITTED:
            state = {"adopted": True, "created_at": (obs.created_at or timezone.now()).isoformat()}
            mark_started(job, attempt, state, reason=f"objects found on {attempt.cluster.name}: adopted "
                                                     f"(the dispatch that created them did not finish)")
        if obs.phase in ("running", "succeeded", "failed") and job.state == S.STARTING:
            transition(job, S.RUNNING, reason="all nodes running" if obs.phase == "running" else
                       f"it ran and had already {obs.phase} when first observed on {attempt.cluster.name}",
                       attempt=attempt)
        if obs.phase == "succeeded" and job.state == S.RUNNING:
            end_attempt(job, attempt, S.SUCCEEDED, reason="all nodes exited 0", end_reason=JobAttempt.EndReason.SUCCEEDED,
                        exit_code=0, ended_at=obs.ended_at)
        elif (obs.phase == "failed" and job.state in (S.RUNNING, S.STARTING) and obs.end_reason in RESTARTED_ENDS
              and (job.kind == Job.Kind.INFERENCE or (job.max_retries > 0 and obs.end_reason == JobAttempt.EndReason.FAILED))):
            # A server that crashed is restarted (as a Deployment restarts its pods), and a training container that
            # exited non-zero runs again (a Kubernetes Job's backoffLimit), while max_retries allows; a training
            # job OOM-killed fails (the same memory would be exceeded again).
            code = f" (exit code {obs.exit_code})" if obs.exit_code is not None else ""
            recover_or_fail(job, attempt, end_reason=obs.end_reason, message=obs.message,
                            what=f"{'server ' if job.kind == Job.Kind.INFERENCE else ''}exited{code}",
                            ended_at=obs.ended_at, exit_code=obs.exit_code)
        elif obs.phase == "failed" and job.state in (S.RUNNING, S.STARTING) and (sick := unhealthy_nodes(attempt)):
            # It failed on a node marked unhealthy: the node's fault, not the job's; placed again elsewhere.
            code = f" (exit code {obs.exit_code})" if obs.exit_code is not None else ""
            end_attempt(job, attempt, S.RECOVERING, end_reason=JobAttempt.EndReason.NODE_UNHEALTHY,
                        reason=f"NodeUnhealthy: attempt {attempt.number} failed{code} on {node_words(sick)}; "
                               f"placed again elsewhere, no retry used"[:500],
                        exit_code=obs.exit_code, message=obs.message, ended_at=obs.ended_at,
                        bad_nodes=tuple(sorted(sick)))
        elif obs.phase == "failed" and job.state in (S.RUNNING, S.STARTING):
            reason = obs.end_reason or JobAttempt.EndReason.FAILED
            text = failure_text(reason, obs.exit_code)
            end_attempt(job, attempt, S.FAILED, reason=text, end_reason=reason, exit_code=obs.exit_code,
                        message=obs.message, ended_at=obs.ended_at)
        elif obs.phase == "lost" and job.state in (S.STARTING, S.RUNNING):
            end_reason = spot_cause(attempt, obs.end_reason or JobAttempt.EndReason.NODE_LOST)
            sick = unhealthy_nodes(attempt)
            blamed = tuple(sorted(set(obs.nodes) | set(sick))) if end_reason == JobAttempt.EndReason.NODE_LOST else ()
            where = (f" on {node_words(sick)}" if sick else
                     f" on node {', '.join(sorted(obs.nodes))}" if obs.nodes else "")
            recover_or_fail(job, attempt, end_reason=end_reason, message=obs.message, ended_at=obs.ended_at,
                            what=f"lost{where}", bad_nodes=blamed)
        elif obs.phase == "unschedulable" and job.state == S.STARTING:
            # No node had room after all (a pod the platform does not know of took it): give the quota and the
            # nodes back and wait in the queue again; not a failure, so no retry is used.
            end_attempt(job, attempt, S.RECOVERING, reason=f"Unschedulable: back to the queue ({obs.message})"[:500],
                        end_reason=JobAttempt.EndReason.UNSCHEDULABLE, message=obs.message, ended_at=obs.ended_at)
    except StaleState:
        log.info("job %s changed under reconcile; leaving it to the winner", job.pk)


def spot_cause(attempt: JobAttempt, end_reason: str) -> str:
    """``end_reason`` of a lost ``attempt`` by its cause: a pod taken by its node's shutdown or reclaim
    (``Preempted`` as the runner reads it: DisruptionTarget TerminationByKubelet and the like) on a spot node pool
    is the provider reclaiming its spot capacity, ``SpotReclaimed``, and so is a node that vanished from a spot pool
    (``NodeLost``: the pods were garbage-collected with their node before a look saw why); anything else is
    returned as given.

    Class of failure: "recovery returns to the failure it recovers from". Named by its cause, a spot reclaim
    uses no retry (``FREE_RETRY_END_REASONS``) and the job's next placements keep off the cluster for
    ``SPOT_RECLAIM_AVOID_SECONDS`` (``jobs.scheduling.snapshot.spot_avoidance``; ADR 0018)."""
    if end_reason not in (JobAttempt.EndReason.PREEMPTED, JobAttempt.EndReason.NODE_LOST):
        return end_reason
    spot = NodePool.objects.filter(pk=attempt.node_pool_id, capacity_type="spot").exists()
    return JobAttempt.EndReason.SPOT_RECLAIMED if spot else end_reason


def unhealthy_nodes(attempt: JobAttempt) -> dict[str, str]:
    """``{node name: its health evidence in words}`` of the nodes ``attempt`` was placed on that are marked
    unhealthy now (``runners.models.Node.health``); empty when none is, or none was recorded."""
    names = (attempt.placement or {}).get("nodes") or []
    if not names:
        return {}
    return {n.name: "; ".join(e.get("message", "") for e in n.health_evidence if e.get("severity") == "unhealthy")
            for n in Node.objects.filter(cluster_id=attempt.cluster_id, name__in=names,
                                         health=Node.Health.UNHEALTHY)}


def node_words(sick: dict[str, str]) -> str:
    """``unhealthy node a (evidence)`` for a recovery's reason, several nodes joined."""
    return ", ".join(f"unhealthy node {name}" + (f" ({why})" if why else "") for name, why in sorted(sick.items()))


def end_as_recorded(job: Job, attempt: JobAttempt, obs: Observation) -> None:
    """End ``attempt`` as its end record in the cluster says (ADR 0011): the job reaches the recorded state
    (SUCCEEDED, FAILED, CANCELLED, or RECOVERING to run again) through the state machine's edges, billed up to
    the recorded end. An ADMITTED attempt (adopted after a restore) is first started from the recorded start.
    Raises StaleState when the job moved meanwhile."""
    record = obs.record or {}
    target = record.get("job_state") or S.RECOVERING
    reason = f"{obs.end_reason or 'ended'} per the end record on {attempt.cluster.name} ({obs.message})"
    if job.state == S.ADMITTED:
        mark_started(job, attempt, {"created_at": (obs.created_at or timezone.now()).isoformat()},
                     reason=f"started {obs.created_at} on {attempt.cluster.name}, as its end record says")
    if target == S.CANCELLED:
        with transaction.atomic():
            transition(job, S.CANCELLING, reason=reason, attempt=attempt)
            end_attempt(job, attempt, S.CANCELLED, reason=reason, end_reason=obs.end_reason or "Cancelled",
                        ended_at=obs.ended_at)
        return
    if target == S.SUCCEEDED and job.state == S.STARTING:
        transition(job, S.RUNNING, reason=f"it ran and succeeded, as its end record on {attempt.cluster.name} says",
                   attempt=attempt)
    if target not in (S.SUCCEEDED, S.FAILED):
        target = S.RECOVERING
    end_attempt(job, attempt, target, reason=reason, end_reason=obs.end_reason or JobAttempt.EndReason.DELETED,
                exit_code=obs.exit_code, message=obs.message, ended_at=obs.ended_at)


def held_for_decision(attempt: JobAttempt, now) -> bool:
    """Whether a look that found none of ``attempt``'s objects must wait for staff (ADR 0011): the database was
    restored (``Installation.restored_at``) after the attempt was made, and no end record says how it ended, so
    restarting it could run the work twice. ``manage.py after_restore --decide`` releases it."""
    restored = Installation.objects.filter(restored_at__isnull=False).values_list("restored_at", flat=True).first()
    if restored is None or attempt.created_at >= restored:
        return False
    return (attempt.runner_state or {}).get("restore_decision") is None


def confirm_absent(job: Job, attempt: JobAttempt, now) -> bool:
    """One look found none of ``attempt``'s objects (their own GET answered 404): the first such look is
    recorded (``absent_since``), the second in a row ends the attempt (``Deleted``: recovered while retries
    are left), billed up to the first. Returns True when the attempt ended."""
    if attempt.absent_since is None:
        JobAttempt.objects.filter(pk=attempt.pk, absent_since__isnull=True).update(absent_since=now)
        attempt.absent_since = now
        return False
    if job.state not in (S.STARTING, S.RUNNING):
        return False
    if held_for_decision(attempt, now):
        state = attempt.runner_state or {}
        if not state.get("held_after_restore"):
            with transaction.atomic():
                JobAttempt.objects.filter(pk=attempt.pk).update(runner_state={**state, "held_after_restore":
                                                                              now.isoformat()})
                record_event(job, "held_after_restore", f"the objects of {attempt.object_name} are gone and no end "
                             f"record says how it ended: a staff decision is needed (manage.py after_restore "
                             f"--decide {job.pk}=recover|fail)", attempt=attempt)
            log.warning("job %s: %s gone without an end record after a restore; held for a staff decision",
                        job.pk, attempt.object_name)
        return False
    try:
        recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.DELETED, ended_at=attempt.absent_since,
                        message=f"the attempt's objects answered 404 NotFound on two looks in a row, since "
                                f"{attempt.absent_since.isoformat()}")
    except StaleState:
        return False
    return True


def seen_again(attempt: JobAttempt) -> None:
    """The objects answered again after a look that missed them: forget that look."""
    if attempt.absent_since is not None:
        JobAttempt.objects.filter(pk=attempt.pk).update(absent_since=None)
        attempt.absent_since = None


def redispatch_or_release(job: Job, attempt: JobAttempt, *, cluster_answers: bool, deadline_seconds: float,
                          now) -> str:
    """An ADMITTED attempt without objects ``deadline_seconds`` after its admission (or its re-dispatch).

    When its cluster answers and it was not re-dispatched yet: dispatched again (an event says why); returns
    ``redispatched``. Otherwise released: the attempt ends NotDispatched (it never created objects, so it
    costs $0 and uses no retry), its quota and committed budget are free at once, and the job goes back to
    admission (RECOVERING) with an event naming the cluster; the cluster counts a failure in its health, so
    the next placement avoids it while it refuses work. Returns ``released``, ``waiting`` (deadline not
    reached) or ``raced``.
    """
    state = attempt.runner_state or {}
    since = attempt.created_at
    if state.get("redispatched_at"):
        since = dt.datetime.fromisoformat(state["redispatched_at"])
    if (now - since).total_seconds() < deadline_seconds:
        return "waiting"
    cluster = attempt.cluster
    if cluster_answers and not state.get("redispatched_at"):
        with transaction.atomic():
            JobAttempt.objects.filter(pk=attempt.pk).update(runner_state={**state, "redispatched_at": now.isoformat()})
            record_event(job, "dispatch_retry", f"no objects on {cluster.name} {deadline_seconds:g} s after "
                                                f"admission: dispatching again", attempt=attempt)
            enqueue_dispatch(attempt.pk)
        return "redispatched"
    why = "it answers, but its objects were never created" if cluster_answers else "it does not answer"
    try:
        end_attempt(job, attempt, S.RECOVERING, end_reason=JobAttempt.EndReason.NOT_DISPATCHED,
                    reason=f"not dispatched within {deadline_seconds:g} s on {cluster.name} ({why}): quota and "
                           f"committed budget released, placing it again")
    except StaleState:
        return "raced"
    cluster.refresh_from_db(fields=["health", "health_reason", "health_since"])
    if cluster.health == Cluster.Health.HEALTHY and set_health(
            cluster, Cluster.Health.DEGRADED, f"attempt {attempt.pk} of job {job.pk} was not dispatched within "
                                              f"{deadline_seconds:g} s ({why})", now=now):
        Cluster.objects.filter(pk=cluster.pk).update(consecutive_failures=F("consecutive_failures") + 1)
    return "released"


def recover_or_fail(job: Job, attempt: JobAttempt, *, end_reason: str, message: str = "", ended_at=None,
                    what: str = "lost", exit_code: int | None = None, bad_nodes: tuple[str, ...] = ()) -> Job:
    """End a lost attempt: RECOVERING (back to admission) while retries remain, FAILED after ``max_retries``.

    Retries count earlier attempts that were lost (or, for inference, whose
    server exited with an error); attempts ended by preemption were the
    scheduler's choice, not a failure, a spot reclaim the provider's (an
    ``end_reason`` of ``FREE_RETRY_END_REASONS`` recovers the job whatever
    ``max_retries`` says), attempts sent back to the queue as
    unschedulable were the scheduler's doing, and attempts that never created
    objects never ran: none counts. ``ended_at``: when the pods stopped,
    as the cluster says (billing ends there). ``what`` says in the reason
    what happened to the attempt (``lost``, ``server exited (exit code 2)``); ``exit_code``: the server's,
    kept on the attempt; ``bad_nodes`` the nodes whose fault it was (``end_attempt``).
    """
    retries_used = (
        job.attempts.filter(number__lt=attempt.number).exclude(end_reason__in=FREE_RETRY_END_REASONS).count()
    )
    # A plain failure's end reason is the state's own word: "FAILED: attempt 3 server exited...", not "Failed: ...".
    cause = "" if end_reason == JobAttempt.EndReason.FAILED else f"{end_reason}: "
    if end_reason in FREE_RETRY_END_REASONS:
        # Not the job's failure (a spot reclaim, a preemption the cluster made): it uses no retry, so it ends
        # no job, whatever max_retries says (ADR 0018).
        return end_attempt(job, attempt, S.RECOVERING,
                           reason=f"{cause}attempt {attempt.number} {what}; placed again, no retry used"[:500],
                           end_reason=end_reason, message=message, ended_at=ended_at, exit_code=exit_code,
                           bad_nodes=bad_nodes)
    if retries_used < job.max_retries:
        return end_attempt(job, attempt, S.RECOVERING,
                           reason=f"{cause}attempt {attempt.number} {what}, retry {retries_used + 1} of "
                                  f"{job.max_retries}"[:500],
                           end_reason=end_reason, message=message, ended_at=ended_at, exit_code=exit_code,
                           bad_nodes=bad_nodes)
    return end_attempt(job, attempt, S.FAILED,
                       reason=f"{cause}attempt {attempt.number} {what} and {job.max_retries} retries used"[:500],
                       end_reason=end_reason, message=message, ended_at=ended_at, exit_code=exit_code,
                       bad_nodes=bad_nodes)


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
    pending, and ``deletion_pending_since`` set: reconcile's orphan cleanup
    deletes the objects of ended attempts when the cluster answers again,
    and the first look that finds them gone clears the mark. Returns True
    when the job reached CANCELLED. Safe to call repeatedly.
    """
    job = Job.objects.select_related("current_attempt__cluster").get(pk=job_id)
    if job.state != S.CANCELLING:
        return job.state == S.CANCELLED
    attempt = job.current_attempt
    reason = f"{_cancelled_by(job)}: objects deleted"
    pending = False
    try:
        gone = attempt is None or attempt.ended_at is not None or backend_for(attempt.cluster).delete(attempt)
        if attempt is not None and attempt.ended_at is None:
            attempt.deletion_accepted_at = _cancel_evidence(attempt)
    except ClusterUnreachable as exc:
        log.warning("job %s: cluster %s unreachable, cancelled with deletion pending: %s", job_id,
                    attempt.cluster.name, exc)
        gone, pending = True, True
        reason = (f"{_cancelled_by(job)}: cluster {attempt.cluster.name} unreachable, objects will be deleted when "
                  f"it answers again (deletion pending)")
        # Billed up to the last time the cluster answered, the last instant its pods are known to have held their
        # GPUs; reconcile's orphan cleanup bills on to their real stop once the cluster answers again.
        seen = [t for t in (attempt.cluster.last_contact_at, attempt.started_at, _cancel_evidence(attempt))
                if t is not None]
        attempt.deletion_accepted_at = max(seen) if seen else None
    if not gone:
        return False
    try:
        if attempt is not None and attempt.ended_at is None:
            # Billing ends at the cluster's latest evidence of the pods holding their GPUs, whichever call learned it
            # (``_cancel_evidence``: their owner's deletion accepted, a look that saw them run out their grace), or
            # now when no call saw anything of them.
            ended_at = getattr(attempt, "deletion_accepted_at", None)
            with transaction.atomic():
                end_attempt(job, attempt, S.CANCELLED, reason=reason + _billed_past_cancel(job, attempt, ended_at),
                            end_reason=JobAttempt.EndReason.CANCELLED, ended_at=ended_at)
                if pending:
                    # Its pods may still run: until a look at the cluster finds them gone they count as running
                    # where a limit is on running work (``JobAttempt.deletion_pending_since``).
                    JobAttempt.objects.filter(pk=attempt.pk).update(deletion_pending_since=timezone.now())
            # The end record was written at the first DELETE, with that instant as the end: it follows the end
            # recorded now (``record_end``), so a restored database ends and bills the attempt as this one did.
            enqueue_record_end(attempt.pk)
        else:
            transition(job, S.CANCELLED, reason="nothing was running")
    except StaleState:
        return False
    return True


def _cancelled_by(job: Job) -> str:
    """``cancelled by alice`` (the user who asked, from the CANCELLING event), or ``cancelled`` when nobody is named
    (a cancel the platform made): the start of a cancelled job's last reason, which its lists show."""
    actor = (JobEvent.objects.filter(job_id=job.pk, to_state=S.CANCELLING).exclude(from_state=S.CANCELLING)
             .order_by("-created_at").values_list("actor__username", flat=True).first())
    return f"cancelled by {actor}" if actor else "cancelled"


def _billed_past_cancel(job: Job, attempt: JobAttempt, ended_at) -> str:
    """The words a cancel's end adds to its timeline line when ``attempt`` is billed past the cancel's request
    (``ended_at``, the cluster's evidence, ``EXPLAINED_AFTER`` or more after the CANCELLING event): until when and
    why; "" otherwise.

    Class of failure: billing past a job's end without a word. Invariant: a job billed after the instant its
    owner asked it to end says on its timeline until when and on what evidence."""
    asked = (JobEvent.objects.filter(job_id=job.pk, to_state=S.CANCELLING).exclude(from_state=S.CANCELLING)
             .order_by("-created_at").values_list("created_at", flat=True).first())
    if ended_at is None or asked is None:
        return ""
    end = billing_end(attempt, ended_at)
    if end < asked + EXPLAINED_AFTER:
        return ""
    return (f"; billed until {end:%Y-%m-%d %H:%M:%S} UTC, {(end - asked).total_seconds():.0f} s after the cancel "
            f"was requested: the cluster's evidence shows its pods holding their GPUs until then")


def _cancel_evidence(attempt: JobAttempt) -> dt.datetime | None:
    """The latest time the cluster's evidence says a cancelled attempt's pods held their GPUs, over every call of
    ``finish_cancel`` so far: the deletion of their owner accepted (``deletion_accepted_at``), a look that saw them
    still hold them (``holding_seen_at``), this call's and those kept in ``runner_state["cancel_evidence_at"]``
    (written forward only while the attempt is live); None when there is none yet.

    Class of failure: an end set when a task ran. A cancel whose pods run out a termination grace finishes on a
    later call, once they are gone; that call ended the attempt at its own time, so a control plane down in
    between billed its whole outage. Invariant: a cancel's end is the cluster's evidence, whichever call learned
    it (docs/adr/0021); pods that vanish unseen are billed up to the last look that saw them hold their GPUs."""
    kept = (attempt.runner_state or {}).get("cancel_evidence_at")
    times = [t for t in (getattr(attempt, "deletion_accepted_at", None), getattr(attempt, "holding_seen_at", None),
                         dt.datetime.fromisoformat(kept) if kept else None) if t is not None]
    if not times:
        return None
    latest = max(times)
    if kept is None or latest > dt.datetime.fromisoformat(kept):
        with transaction.atomic():
            row = JobAttempt.objects.select_for_update().only("runner_state", "ended_at").get(pk=attempt.pk)
            stored = (row.runner_state or {}).get("cancel_evidence_at")
            if row.ended_at is None and (stored is None or latest > dt.datetime.fromisoformat(stored)):
                state = {**(row.runner_state or {}), "cancel_evidence_at": latest.isoformat()}
                JobAttempt.objects.filter(pk=attempt.pk).update(runner_state=state)
                attempt.runner_state = state
    return latest


def preempt_attempt(job: Job, attempt: JobAttempt, *, reason: str, actor=None,
                    end_reason: str = JobAttempt.EndReason.PREEMPTED, bad_nodes: tuple[str, ...] = ()) -> Job:
    """End ``attempt`` as Preempted (or ``end_reason``: ``NodeUnhealthy`` when its node went bad, with
    ``bad_nodes`` naming it) and move ``job`` to RECOVERING in one transaction (its quota is released).

    The job is requeued with its original priority and submission time
    (resuming from its checkpoint); its objects are deleted on commit by
    ``jobs.tasks.delete_attempt_objects`` (reconcile's orphan cleanup is the
    safety net). Neither end counts against ``max_retries``. A preemption of an attempt that never ran (ADMITTED or
    STARTING) adds one to ``Job.preempted_before_run``, of a running one sets it to 0 (``PREEMPTION_BEFORE_RUN_LIMIT``
    protects the job from there). Raises
    StaleState or InvalidTransition (and writes nothing) like ``transition``.
    """
    now = timezone.now()
    before = job.state
    with transaction.atomic():
        # Job row first, then the attempt (the lock order of every lifecycle change).
        transition(job, S.RECOVERING, reason=reason, actor=actor, attempt=attempt,
                   data={"end_reason": end_reason, **({"bad_nodes": list(bad_nodes)} if bad_nodes else {})})
        updated = JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
            ended_at=now, end_reason=end_reason, message=reason[:4000], bad_nodes=list(bad_nodes)
        )
        if not updated:  # the attempt ended meanwhile: roll the transition back
            job.state = before
            raise StaleState(job.pk, before)
        attempt.ended_at, attempt.end_reason = now, end_reason
        if end_reason == JobAttempt.EndReason.PREEMPTED:
            # Counted toward the protection of ``PREEMPTION_BEFORE_RUN_LIMIT`` while no attempt ran; reset once one did.
            count = F("preempted_before_run") + 1 if before in (S.ADMITTED, S.STARTING) else 0
            Job.objects.filter(pk=job.pk).update(preempted_before_run=count)
        enqueue_delete_attempt(attempt.pk)
    enqueue_final_accrual(attempt.pk)
    return job
