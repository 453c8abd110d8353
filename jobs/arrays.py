"""Job arrays and parameter sweeps (Slurm's ``sbatch --array=0-49%8``): one ``JobArray`` row, element jobs made lazily.

An array is submitted as one job submission (validated once, as one job: team, quota, placement, budget) plus
``array``: ``{"count": n, "parallelism": p}`` or ``{"grid": {NAME: [values...], ...}, "parallelism": p}``. A grid's
cartesian product gives the elements; element ``i`` takes the ``i``-th point in the order of ``itertools.product``
over the parameters as submitted: the last parameter varies fastest (``grid_point``).

Element ``Job`` rows are materialized lazily (docs/adr/0038): at submission at most ``min(parallelism,
ARRAY_QUEUED_WINDOW)``, then by each scheduling pass (``top_up_arrays``), which keeps every array's live (not
final) elements at most ``parallelism`` and its QUEUED ones at most ``ARRAY_QUEUED_WINDOW``. Since only
materialized elements can be admitted, no more than ``parallelism`` elements ever run at once, with admission
itself unchanged: each element is a normal job admitted one by one (quota, budget, placement).

Lock order: the array row comes after the team row and before its element job rows (a top-up and a cancel lock
the array row, then write or move its elements).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from core.lookups import LookupCache
from costs.models import JobDailyCost

from .enqueue import enqueue_schedule
from .lifecycle import NotCancellable, cancel_job
from .models import FINAL_STATES, Job, JobArray, JobEvent, JobState
from .spec import DNS_1123_LABEL_MAX
from .states import Move, StaleState, transition_many

S = JobState
ARRAY_FIELD = "array"
#: A grid parameter's name: an environment variable name (``SWEEP_<NAME upper-cased>`` carries its value).
PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The longest accepted grid parameter name and string value (characters).
PARAM_NAME_MAX = 64
PARAM_VALUE_MAX = 1024
#: Live states: an element in one of them counts against its array's parallelism.
LIVE_STATES = tuple(s.value for s in JobState if s not in FINAL_STATES)
#: States in which an element has left the queue for a cluster (the roll-up's "running" side).
ACTIVE_ELEMENT_STATES = (S.ADMITTED, S.STARTING, S.RUNNING, S.RECOVERING, S.CANCELLING)


class ArrayError(ValueError):
    """A bad ``array`` field: ``errors`` maps dotted field paths (``array.count``) to their reasons."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


# --- Validation of the ``array`` field.


def _is_int(value) -> bool:
    return type(value) is int


def _scalar_error(value) -> str | None:
    """Why ``value`` cannot be a grid value (a string, an integer, a finite number or a boolean), else None.

    A float must come back from the database as the same float, since its text is the element's ``SWEEP_``
    value: PostgreSQL's jsonb stores numbers as ``numeric``, which keeps a written ``.0`` but not an exponent's
    form or the sign of zero, so ``1e+20`` (every float of 1e16 or more, which JSON writes with an exponent)
    would come back as the integer ``100000000000000000000`` and ``-0.0`` as ``0.0``; both are refused."""
    if type(value) is str:
        if "\x00" in value:
            return "a string value may not contain a NUL character (\\x00)"
        if len(value) > PARAM_VALUE_MAX:
            return f"a string value may have at most {PARAM_VALUE_MAX} characters"
        return None
    if type(value) in (int, bool):
        return None
    if type(value) is float:
        if not math.isfinite(value):
            return "a number must be finite"
        text = json.dumps(value)
        if "e+" in text or text == "-0.0":
            return (
                f"{text} would be stored as another number (PostgreSQL keeps numbers as numeric, without a "
                f'float\'s exponent or sign of zero); give it as a string ("{text}"), or as an integer'
            )
        return None
    return f"values must be strings, numbers or booleans, not {type(value).__name__ if value is not None else 'null'}"


def validated_array(data, *, name: str | None = None) -> dict:
    """The array field ``data`` (parsed JSON or YAML) checked: ``{"count": int, "parallelism": int, "grid":
    [[name, [values]], ...] or []}``. ``parallelism`` defaults to ``count`` and is capped at it. ``name``: the
    submission's job name, whose elements are named ``<name>-<index>`` (at most 63 characters).

    Raises ArrayError with errors keyed ``array``, ``array.count``, ``array.parallelism``, ``array.grid`` or
    ``array.grid.<NAME>``: not an object, unknown keys, neither ``count`` nor ``grid``, ``count`` not an integer
    from 1 to ``settings.ARRAY_MAX_ELEMENTS``, ``parallelism`` not an integer of at least 1, a grid that is not a
    non-empty object of non-empty lists of scalars, names that are not environment variable names (or that
    collide once upper-cased), a product over the maximum, and ``count`` given with a grid of another size.
    """
    maximum = settings.ARRAY_MAX_ELEMENTS
    if not isinstance(data, Mapping):
        raise ArrayError(
            {
                ARRAY_FIELD: [
                    'Expected an object: {"count": n, "parallelism": p} or {"grid": {NAME: '
                    '[values...]}, "parallelism": p}.'
                ]
            }
        )
    errors: dict[str, list[str]] = {}
    unknown = sorted(str(k) for k in data if k not in ("count", "parallelism", "grid"))
    if unknown:
        errors[ARRAY_FIELD] = [f"unknown field(s): {', '.join(unknown)}; the fields are count, parallelism and grid"]
    count = data.get("count")
    if "count" in data and not (_is_int(count) and 1 <= count <= maximum):
        errors["array.count"] = [f"must be an integer from 1 to {maximum} (ARRAY_MAX_ELEMENTS)"]
        count = None
    parallelism = data.get("parallelism")
    if "parallelism" in data and not (_is_int(parallelism) and parallelism >= 1):
        errors["array.parallelism"] = ["must be an integer of at least 1 (elements queued or running at once)"]
    grid: list = []
    if "grid" in data:
        grid, grid_errors = _validated_grid(data["grid"], maximum)
        errors.update(grid_errors)
        if grid and count is not None and "array.count" not in errors:
            size = math.prod(len(values) for _, values in grid)
            if size != count:
                errors["array.count"] = [
                    f"the grid has {size} points (the product of its value counts), not "
                    f"{count}: give the grid alone, or the count that matches it"
                ]
    elif "count" not in data:
        errors.setdefault(ARRAY_FIELD, []).append(
            "give count (the number of elements) or grid (the parameters to sweep)"
        )
    if errors:
        raise ArrayError(errors)
    if grid:
        count = math.prod(len(values) for _, values in grid)
    if name is not None and len(f"{name}-{count - 1}") > DNS_1123_LABEL_MAX:
        raise ArrayError(
            {
                "name": [
                    f"with {count} elements, named <name>-<index>, the name may have at most "
                    f"{DNS_1123_LABEL_MAX - 1 - len(str(count - 1))} characters"
                ]
            }
        )
    parallelism = min(parallelism if parallelism is not None else count, count)
    return {"count": count, "parallelism": parallelism, "grid": grid}


def _validated_grid(grid, maximum: int) -> tuple[list, dict[str, list[str]]]:
    """``(grid as [[name, values], ...], errors)`` for the submitted ``grid`` (see ``validated_array``)."""
    if not isinstance(grid, Mapping) or not grid:
        return [], {"array.grid": ["must be a non-empty object of parameter names to lists of values"]}
    errors: dict[str, list[str]] = {}
    upper: dict[str, str] = {}
    pairs = []
    for key, values in grid.items():
        path = f"array.grid.{str(key)[:PARAM_NAME_MAX]}"
        if type(key) is not str or len(key) > PARAM_NAME_MAX or not PARAM_NAME.fullmatch(key):
            errors[path] = [
                f"invalid parameter name: names must match [A-Za-z_][A-Za-z0-9_]* (at most "
                f"{PARAM_NAME_MAX} characters); each is passed as the variable SWEEP_<NAME>"
            ]
            continue
        if key.upper() in upper:
            errors[path] = [
                f'"{key}" and "{upper[key.upper()]}" are both SWEEP_{key.upper()}: names must differ once upper-cased'
            ]
            continue
        upper[key.upper()] = key
        if type(values) is not list or not values:
            errors[path] = ["must be a non-empty list of values"]
            continue
        bad = next(((i, why) for i, v in enumerate(values) if (why := _scalar_error(v)) is not None), None)
        if bad is not None:
            errors[path] = [f"item {bad[0]}: {bad[1]}"]
            continue
        pairs.append([key, list(values)])
    if not errors:
        size = math.prod(len(values) for _, values in pairs)
        if size > maximum:
            errors["array.grid"] = [f"the grid has {size} points, more than {maximum} (ARRAY_MAX_ELEMENTS)"]
    return ([] if errors else pairs), errors


# --- Elements: their grid point and environment.


def grid_point(grid: list, index: int) -> dict:
    """The parameters of element ``index`` of ``grid`` (``[[name, values], ...]``): the ``index``-th tuple of
    ``itertools.product(*values)`` (the last parameter varies fastest), computed without building the product:
    ``index`` written in the mixed radix of the value counts. ``{}`` for no grid. Raises IndexError past the end."""
    if not grid:
        return {}
    size = math.prod(len(values) for _, values in grid)
    if not 0 <= index < size:
        raise IndexError(f"element {index} of a grid of {size}")
    picked = []
    for name, values in reversed(grid):
        index, digit = divmod(index, len(values))
        picked.append((name, values[digit]))
    return dict(reversed(picked))


def env_value(value) -> str:
    """A grid value as an environment variable's text: strings as they are, booleans ``true``/``false``, numbers
    as JSON writes them (``0.0003``, ``3e-05``, ``64``)."""
    return value if type(value) is str else json.dumps(value)


def array_env(array_id: int, index: int, count: int, grid: list) -> dict[str, str]:
    """The variables the platform sets for element ``index`` of array ``array_id`` (of ``count`` elements, over
    ``grid``): ``CONTROLPLANE_ARRAY_ID``, ``CONTROLPLANE_ARRAY_INDEX`` (0-based), ``CONTROLPLANE_ARRAY_COUNT``,
    and for a sweep ``SWEEP_<NAME upper-cased>`` per parameter."""
    env = {
        "CONTROLPLANE_ARRAY_ID": str(array_id),
        "CONTROLPLANE_ARRAY_INDEX": str(index),
        "CONTROLPLANE_ARRAY_COUNT": str(count),
    }
    env.update({f"SWEEP_{name.upper()}": env_value(value) for name, value in grid_point(grid, index).items()})
    return env


#: An array's ``(count, grid)`` by id, for ``element_env``: columns written once, when the array is stored, and
#: read again for every element a dispatch batch creates (up to ``jobs.enqueue.DISPATCH_BATCH`` of one array).
ARRAY_SHAPES = LookupCache("array-shapes").invalidate_on(JobArray)


def element_env(job: Job) -> dict[str, str]:
    """``array_env`` of ``job`` when it is an array element, else ``{}``: what the runners add to a job's
    environment. Its array's count and grid come from ``ARRAY_SHAPES`` (one query per array while cached, not one
    per element). Raises JobArray.DoesNotExist when the element's array row is gone."""
    if job.array_id is None or job.array_index is None:
        return {}
    shape = ARRAY_SHAPES.get(
        job.array_id, lambda: JobArray.objects.filter(pk=job.array_id).values_list("count", "grid").first()
    )
    if shape is None:
        raise JobArray.DoesNotExist(f"array {job.array_id} of job {job.pk}")
    count, grid = shape
    return array_env(job.array_id, job.array_index, count, grid or [])


# --- Submission and materialization.


def submit_array(
    *,
    team,
    submitter,
    name: str,
    kind: str,
    spec: dict,
    resources: dict,
    count: int,
    parallelism: int,
    grid: list,
    after=(),
) -> JobArray:
    """Store a validated array (``jobs.spec.validated_submission``'s fields and ``validated_array``'s) with its
    first ``min(parallelism, ARRAY_QUEUED_WINDOW)`` elements QUEUED, in one transaction, and enqueue a scheduling
    pass on commit. Returns the array.

    Raises ValueError when ``after`` lists jobs: an array does not wait for other jobs (the API answers 400
    on ``after`` before this is called)."""
    if after:
        raise ValueError("a job array cannot wait for other jobs (after)")
    with transaction.atomic():
        array = JobArray.objects.create(
            team=team,
            submitter=submitter,
            name=name,
            kind=kind,
            spec=spec,
            accelerator=resources["accelerator"],
            gpus_per_node=resources["gpus_per_node"],
            gpu_share_milli=resources.get("gpu_share_milli", 0),
            mig_profile=resources.get("mig_profile", ""),
            nodes=resources["nodes"],
            priority=resources["priority"],
            preemptible=resources["preemptible"],
            max_runtime_seconds=resources["max_runtime_seconds"],
            max_retries=resources["max_retries"],
            replicas=resources.get("replicas", 1),
            count=count,
            parallelism=parallelism,
            grid=grid,
        )
        first = min(parallelism, count, max(1, settings.ARRAY_QUEUED_WINDOW))
        _materialize(array, first)
        enqueue_schedule(background=True)
    return array


def _materialize(array: JobArray, n: int) -> int:
    """Insert elements ``array.materialized .. + n - 1`` QUEUED with their ``submitted`` events, and move
    ``array.materialized`` (row and instance) on; the caller holds the array row (or just created it). Returns
    the number inserted: n, less any index that already has its row (an element a restored database adopted from
    a cluster, ``jobs.recovery``, which must not run twice)."""
    if n <= 0:
        return 0
    start, stop = array.materialized, array.materialized + n
    if connection.vendor == "postgresql":
        made = _insert_elements_sql(array, start, stop)
    else:
        taken = set(
            Job.objects.filter(array_id=array.pk, array_index__gte=start, array_index__lt=stop).values_list(
                "array_index", flat=True
            )
        )
        jobs = Job.objects.bulk_create([_element(array, i) for i in range(start, stop) if i not in taken])
        made = len(jobs)
        # ``auto_now_add`` stamped each row with the time of the insert: the elements carry the array's.
        Job.objects.filter(pk__in=[job.pk for job in jobs]).update(created_at=array.created_at)
        reason = _submitted_reason(array)
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job_id=job.pk,
                    kind="submitted",
                    from_state=S.QUEUED,
                    to_state=S.QUEUED,
                    reason=reason,
                    actor_id=array.submitter_id,
                    data={"array": array.pk, "index": job.array_index},
                )
                for job in jobs
            ]
        )
    array.materialized = stop
    array.state = JobArray.State.MATERIALIZED if stop >= array.count else JobArray.State.OPEN
    JobArray.objects.filter(pk=array.pk).update(materialized=stop, state=array.state, updated_at=timezone.now())
    return made


def _element(array: JobArray, index: int) -> Job:
    """Element ``index`` of ``array`` as an unsaved QUEUED Job: the template's columns, named ``<name>-<index>``,
    created at the array's submission (so admission's first-come order counts the array's place in the queue)."""
    job = Job(
        team_id=array.team_id,
        submitter_id=array.submitter_id,
        name=f"{array.name}-{index}",
        kind=array.kind,
        spec=array.spec,
        accelerator_id=array.accelerator_id,
        gpus_per_node=array.gpus_per_node,
        gpu_share_milli=array.gpu_share_milli,
        mig_profile=array.mig_profile,
        nodes=array.nodes,
        priority=array.priority,
        preemptible=array.preemptible,
        max_runtime_seconds=array.max_runtime_seconds,
        max_retries=array.max_retries,
        replicas=array.replicas,
        array_id=array.pk,
        array_index=index,
    )
    job.created_at = array.created_at
    return job


def _submitted_reason(array: JobArray) -> str:
    return f"element of array {array.pk}, submitted by {array.submitter}"[:500]


def _insert_elements_sql(array: JobArray, start: int, stop: int) -> int:
    """Elements ``start .. stop - 1`` of ``array`` and their events in one PostgreSQL statement: ``WITH new AS
    (INSERT INTO job (...) SELECT ... FROM generate_series(start, stop - 1) WHERE no row has that index RETURNING
    id, array_index) INSERT INTO event (...) SELECT ... FROM new``. Every column's parameter comes from the field's
    own ``get_db_prep_save`` (the ORM's types and defaults); the name and index are computed from the series,
    ``created_at`` is the array's. Returns the number of elements inserted.
    """
    qn = connection.ops.quote_name
    template = _element(array, 0)
    job_fields = [f for f in Job._meta.local_concrete_fields if f is not Job._meta.auto_field]
    columns, exprs, params = [], [], []
    for field in job_fields:
        columns.append(qn(field.column))
        if field.name == "name":
            exprs.append("%s::text || '-' || gs.i::text")
            params.append(array.name)
        elif field.name == "array_index":
            exprs.append("gs.i")
        elif field.name == "created_at":
            exprs.append("%s")
            params.append(field.get_db_prep_save(array.created_at, connection=connection))
        else:
            exprs.append("%s")
            params.append(field.get_db_prep_save(field.pre_save(template, True), connection=connection))
    event_fields = [
        f for f in JobEvent._meta.local_concrete_fields if f is not JobEvent._meta.auto_field and f.name != "job"
    ]
    event = JobEvent(
        kind="submitted",
        from_state=S.QUEUED,
        to_state=S.QUEUED,
        reason=_submitted_reason(array),
        actor_id=array.submitter_id,
        data={"array": array.pk},
    )
    event_exprs, event_params = [], []
    for field in event_fields:
        if field.name == "data":
            event_exprs.append("jsonb_build_object('array', %s::bigint, 'index', new_jobs.array_index)")
            event_params.append(array.pk)
        else:
            event_exprs.append("%s")
            event_params.append(field.get_db_prep_save(field.pre_save(event, True), connection=connection))
    sql = (
        f"WITH new_jobs AS (INSERT INTO {qn(Job._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(exprs)} FROM generate_series(%s::integer, %s::integer) AS gs(i) "
        f"WHERE NOT EXISTS (SELECT 1 FROM {qn(Job._meta.db_table)} AS taken WHERE "
        f"taken.{qn(Job._meta.get_field('array').column)} = %s "
        f"AND taken.{qn(Job._meta.get_field('array_index').column)} = gs.i) ORDER BY gs.i "
        f"RETURNING {qn(Job._meta.pk.column)} AS id, {qn(Job._meta.get_field('array_index').column)} "
        f"AS array_index) "
        f"INSERT INTO {qn(JobEvent._meta.db_table)} ({qn(JobEvent._meta.get_field('job').column)}, "
        f"{', '.join(qn(f.column) for f in event_fields)}) "
        f"SELECT new_jobs.id, {', '.join(event_exprs)} FROM new_jobs"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, start, stop - 1, array.pk, *event_params])
        return cursor.rowcount


def top_up_arrays() -> int:
    """Materialize more QUEUED elements of every open array: as many as keep its live elements at most its
    ``parallelism``, its QUEUED ones at most ``settings.ARRAY_QUEUED_WINDOW`` and its elements at most its
    ``count``. Run by each scheduling pass before it reads the queue. Returns the number of elements made.

    Two queries find the open arrays with room (their live and QUEUED elements counted in one GROUP BY); each
    array with room is then locked (SKIP LOCKED: a cancel or another pass holding it is left alone), counted again
    under its lock and topped up in one statement (``_materialize``), in a transaction of its own.
    """
    arrays = list(
        JobArray.objects.filter(state=JobArray.State.OPEN).values_list("pk", "count", "parallelism", "materialized")
    )
    if not arrays:
        return 0
    live = _live_counts([pk for pk, *_ in arrays])
    window = max(1, settings.ARRAY_QUEUED_WINDOW)
    made = 0
    for pk, count, parallelism, materialized in arrays:
        if _room(count, parallelism, materialized, *live.get(pk, (0, 0)), window) <= 0:
            continue
        with transaction.atomic():
            array = (
                JobArray.objects.select_for_update(skip_locked=True, no_key=True)
                .filter(pk=pk, state=JobArray.State.OPEN)
                .first()
            )
            if array is None:
                continue
            counted = _live_counts([pk]).get(pk, (0, 0))
            made += _materialize(array, _room(array.count, array.parallelism, array.materialized, *counted, window))
    return made


def _room(count: int, parallelism: int, materialized: int, live: int, queued: int, window: int) -> int:
    """How many elements an array may materialize now: within its parallelism (live elements), its queued window
    and its count."""
    return min(parallelism - live, window - queued, count - materialized)


def _live_counts(array_ids: list[int]) -> dict[int, tuple[int, int]]:
    """``{array id: (live elements, QUEUED elements)}`` for the arrays ``array_ids`` having any live one.

    An element that ended while its pods may still run (its last attempt's ``deletion_pending_since`` set: a
    cancel on an unreachable cluster) counts as live until a look finds them gone: the parallelism bounds the
    elements running on the clusters, not the rows in a live state."""
    rows = (
        Job.objects.filter(array_id__in=array_ids, state__in=LIVE_STATES)
        .values("array_id")
        .annotate(live=Count("id"), queued=Count("id", filter=Q(state=S.QUEUED)))
        .order_by()
    )
    counts = {r["array_id"]: (r["live"], r["queued"]) for r in rows}
    stopping = (
        Job.objects.filter(array_id__in=array_ids, current_attempt__deletion_pending_since__isnull=False)
        .exclude(state__in=LIVE_STATES)
        .values("array_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    for r in stopping:
        live, queued = counts.get(r["array_id"], (0, 0))
        counts[r["array_id"]] = (live + r["n"], queued)
    return counts


# --- Cancel.


def cancel_array(array: JobArray, actor=None) -> JobArray:
    """Cancel ``array``: no element is materialized any more, QUEUED (and RECOVERING, not running) elements end
    CANCELLED at once in bulk (compare and set, with their events), the live ones are cancelled one by one
    (``jobs.lifecycle.cancel_job``: CANCELLING until their cluster confirms). Raises NotCancellable when the
    array was cancelled already or every element has ended."""
    with transaction.atomic():
        locked = JobArray.objects.select_for_update(no_key=True).get(pk=array.pk)
        if locked.state == JobArray.State.CANCELLED:
            raise NotCancellable(f"array {array.pk} is already cancelled")
        if (
            locked.materialized >= locked.count
            and not Job.objects.filter(array_id=array.pk, state__in=LIVE_STATES).exists()
        ):
            raise NotCancellable(f"array {array.pk} has ended: every element is final")
        now = timezone.now()
        JobArray.objects.filter(pk=array.pk).update(
            state=JobArray.State.CANCELLED, cancelled_at=now, cancelled_by=actor, updated_at=now
        )
        array.state, array.cancelled_at, array.cancelled_by = JobArray.State.CANCELLED, now, actor
        reason = f"array {array.pk} cancelled by {actor}" if actor else f"array {array.pk} cancelled"
        waiting = list(Job.objects.filter(array_id=array.pk, state=S.QUEUED).only("pk", "state", "started_at"))
        transition_many(
            [Move(job, reason=reason, fields={"queue_info": {}}) for job in waiting], S.CANCELLED, actor=actor
        )
    # The rest (admitted, running, recovering, or admitted between the read and the bulk move) one by one, each in
    # its own transaction, as a single job's cancel.
    for _ in range(3):
        rest = list(Job.objects.filter(array_id=array.pk, state__in=LIVE_STATES).exclude(state=S.CANCELLING))
        if not rest:
            break
        for job in rest:
            try:
                cancel_job(job, actor=actor)
            except (NotCancellable, StaleState):
                continue
    return array


# --- Roll-ups.


def element_counts(array_ids: list[int]) -> dict[int, dict[str, int]]:
    """``{array id: {state (lower case): materialized elements in it}}`` for ``array_ids``, every state present
    (0 when none), in one GROUP BY."""
    counts = {pk: {s.lower(): 0 for s in JobState.values} for pk in array_ids}
    rows = Job.objects.filter(array_id__in=array_ids).values("array_id", "state").annotate(n=Count("id")).order_by()
    for row in rows:
        counts[row["array_id"]][row["state"].lower()] = row["n"]
    return counts


def element_costs(array_ids: list[int]) -> dict[int, Decimal]:
    """``{array id: USD}``: the priced ledger cost of its elements, exact: the sum of their ``JobDailyCost`` rows
    (the ledger's totals per job and UTC day, written in the transactions that write the entries: ``costs.ledger``),
    one query whatever the ledger's length; 0 for an array without cost yet."""
    costs = {pk: Decimal(0) for pk in array_ids}
    rows = (
        JobDailyCost.objects.filter(job__array_id__in=array_ids)
        .values("job__array_id")
        .annotate(usd=Sum("cost_usd"))
        .order_by()
    )
    for row in rows:
        costs[row["job__array_id"]] = row["usd"] or Decimal(0)
    return costs


def rolled_up_counts(array: JobArray, materialized_counts: dict[str, int]) -> dict[str, int]:
    """The array's counts by state, its elements not yet materialized included: as ``queued`` while the array is
    open, as ``cancelled`` once it was cancelled. ``materialized_counts`` is ``element_counts``' (every element
    row, so one adopted past ``array.materialized`` after a restore is counted once)."""
    counts = dict(materialized_counts)
    pending = array.count - sum(materialized_counts.values())
    key = "cancelled" if array.state == JobArray.State.CANCELLED else "queued"
    counts[key] = counts.get(key, 0) + max(pending, 0)
    return counts


def array_status(array: JobArray, counts: dict[str, int]) -> str:
    """The array's status from its ``rolled_up_counts``: ``cancelling`` while a cancelled array still has live
    elements, then ``cancelled``; once every element is final ``succeeded`` (all succeeded), ``failed`` (some
    failed or were rejected) or ``cancelled``; before that ``running`` once any element left the queue, else
    ``queued``."""
    live = sum(counts.get(s.lower(), 0) for s in LIVE_STATES)
    if array.state == JobArray.State.CANCELLED:
        return "cancelling" if live else "cancelled"
    if not live:
        if counts.get("succeeded", 0) == array.count:
            return "succeeded"
        if counts.get("failed", 0) or counts.get("rejected", 0):
            return "failed"
        return "cancelled"
    started = sum(counts.get(s.lower(), 0) for s in ACTIVE_ELEMENT_STATES)
    ended = sum(counts.get(s.lower(), 0) for s in FINAL_STATES)
    return "running" if started or ended else "queued"


def grid_object(grid: list) -> dict:
    """A stored grid (``[[name, values], ...]``) as the API shows it: ``{name: values}`` in the submitted order."""
    return {name: values for name, values in grid or []}
