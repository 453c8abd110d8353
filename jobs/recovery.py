"""Recovery after the database was restored from a backup (ADR 0011): adopt what the clusters run, hold what
cannot be told, and leave nothing running untracked.

A restored database is behind the clusters by the backup's age (the gap):
jobs started in the gap run without rows, attempts that ended in the gap
look live. ``recover`` (run by ``manage.py after_restore`` before workers and
beat start again) does, in order:

1. ``begin``: marks the installation restored (``Installation.restored_at``)
   and records the recovery point, the newest instant the database knew.
   While marked, reconcile never restarts an attempt made before the restore
   whose objects are gone without an end record; it holds it for a staff
   decision (``decide``).
2. ``adopt``: every attempt of this installation a cluster holds objects or
   an end record of, unknown to the database, gets its job and attempt rows
   back from the dispatch record its objects carry (team, submitter, spec,
   columns, node pool, price, ids), marked ``adopted_after_restore``, with
   its original ids where they are free. A job the database knows as still
   waiting for that attempt (QUEUED, or RECOVERING between attempts) gets it
   onto its own row, since it was admitted in the gap; an element of a job
   array the database holds is linked to its array. What cannot be rebuilt (a
   team, user or pool the database lacks; a later attempt of a job whose own
   attempt the database holds live) is listed for staff and left running,
   untouched.
3. the sequences move past every id seen in the clusters, so new jobs,
   attempts and arrays never repeat one;
4. one reconcile pass: adopted attempts start from their objects' creation,
   attempts with an end record end as recorded (billed to the recorded end),
   live ones go on. Quota use and free capacity follow, as both are counted
   from live attempts.

The ledger of the gap is rebuilt afterwards by ``costs.ledger.reconstruct_gap``
(it sits above this module).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from decimal import Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from costs.models import CostEntry
from quotas.models import Team
from runners.base import ClusterUnreachable, UnknownBackend, backend_for
from runners.models import Cluster, Installation, NodePool, installation

from .lifecycle import end_attempt, mark_started
from .models import Job, JobArray, JobAttempt, JobEvent, JobState
from .reconcile import reconcile_all
from .states import StaleState, record_event, transition

log = logging.getLogger(__name__)


class CannotAdopt(Exception):
    """An unknown attempt's rows cannot be rebuilt from what its objects carry; the message says why."""


@dataclasses.dataclass
class Recovery:
    """What a recovery did: attempts adopted (``[{"job_id", "attempt_id", "uid", "cluster"}]``), attempts listed
    for staff (``[{"uid", "cluster", "name", "namespace", "why"}]``), clusters that did not answer (name ->
    error), and the restore's instants."""

    restored_at: dt.datetime
    recovery_point: dt.datetime | None
    adopted: list[dict] = dataclasses.field(default_factory=list)
    listed: list[dict] = dataclasses.field(default_factory=list)
    unreachable: dict[str, str] = dataclasses.field(default_factory=dict)
    reconcile: list[dict] = dataclasses.field(default_factory=list)


def recovery_point() -> dt.datetime | None:
    """The newest instant the database knows of: its latest job event, ledger entry end or accrual (None: empty)."""
    times = [JobEvent.objects.aggregate(t=Max("created_at"))["t"],
             CostEntry.objects.aggregate(t=Max("interval_end"))["t"],
             JobAttempt.objects.aggregate(t=Max("accrued_until"))["t"]]
    times = [t for t in times if t is not None]
    return max(times) if times else None


def begin(now: dt.datetime | None = None) -> Installation:
    """Mark the installation restored at ``now`` (default now) with its recovery point; returns the row."""
    row = installation()
    row.restored_at, row.recovery_point = now or timezone.now(), recovery_point()
    Installation.objects.filter(pk=row.pk).update(restored_at=row.restored_at, recovery_point=row.recovery_point)
    return row


def end_recovery() -> None:
    """Leave recovery mode: attempts gone without an end record follow the normal rule again (ADR 0008)."""
    Installation.objects.update(restored_at=None)


def recover(now: dt.datetime | None = None) -> Recovery:
    """Steps 1-4 of the module docstring over every cluster; returns what was done. Unreachable clusters are
    reported and skipped (run it again once they answer)."""
    row = begin(now)
    result = Recovery(row.restored_at, row.recovery_point)
    seen_ids: list[tuple[int, int]] = []
    for cluster in Cluster.objects.order_by("pk"):
        try:
            found = backend_for(cluster).inventory(cluster)
        except (ClusterUnreachable, UnknownBackend) as exc:
            result.unreachable[cluster.name] = str(exc)
            log.warning("recovery: cluster %s not looked at: %s", cluster.name, exc)
            continue
        adopted, listed = adopt(cluster, found, row.restored_at)
        result.adopted += adopted
        result.listed += listed
        seen_ids += [(int(i["record"].get("job_id") or 0), int(i["record"].get("attempt_id") or 0),
                      _recorded_array_id(i["record"])) for i in found]
    advance_sequences(*(max((ids[k] for ids in seen_ids), default=0) for k in range(3)))
    Cluster.objects.update(reconcile_watch={})  # kept from before the restore: this reconcile LISTs everything
    result.reconcile = reconcile_all()
    return result


def adopt(cluster: Cluster, found: list[dict], now: dt.datetime) -> tuple[list[dict], list[dict]]:
    """Rebuild the rows of the attempts in ``found`` (``Backend.inventory`` of ``cluster``) the database does not
    know; returns ``(adopted, listed)`` as in ``Recovery``."""
    known = {str(u) for u in JobAttempt.objects.filter(uid__in=[i["uid"] for i in found]).values_list("uid", flat=True)}
    adopted, listed = [], []
    for item in found:
        if item["uid"] in known:
            continue
        try:
            attempt = adopt_one(cluster, item, now)
        except CannotAdopt as exc:
            listed.append({"uid": item["uid"], "cluster": cluster.name, "name": item.get("name", ""),
                           "namespace": item.get("namespace", ""), "why": str(exc)})
            log.warning("recovery: %s/%s on %s (attempt %s) needs a staff decision: %s", item.get("namespace"),
                        item.get("name"), cluster.name, item["uid"], exc)
            continue
        adopted.append({"job_id": attempt.job_id, "attempt_id": attempt.pk, "uid": item["uid"],
                        "cluster": cluster.name})
    return adopted, listed


def _decimal(value, default: str = "0") -> Decimal:
    try:
        return Decimal(str(value if value not in (None, "") else default))
    except InvalidOperation:
        return Decimal(default)


def _time(value) -> dt.datetime | None:
    try:
        made = dt.datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None
    return made if made is not None and made.tzinfo is not None else None


def _element_of(record: dict) -> tuple[int | None, int | None]:
    """``(array id, index)`` of the element of a job array that a dispatch record names, when the database holds
    that array (its id and submission time both match: a later array that took the id is another one); else
    ``(None, None)``: a job of no array, or of an array submitted after the backup, which is gone with it (the
    element is then adopted as a job of its own, its environment still naming the array). Raises CannotAdopt
    when another job of the database already is that element."""
    shown = record.get("array") or {}
    try:
        array_id, index = int(shown.get("id")), int(shown.get("index"))
    except (TypeError, ValueError):
        return None, None
    made = _time(shown.get("created_at"))
    array = JobArray.objects.filter(pk=array_id).values_list("created_at", "count").first()
    if array is None or made is None or array[0] != made or not 0 <= index < array[1]:
        return None, None
    other = Job.objects.filter(array_id=array_id, array_index=index).values_list("pk", flat=True).first()
    if other is not None:
        raise CannotAdopt(f"element {index} of array {array_id} is job {other} in the database")
    return array_id, index


def _waiting_job(job_id: int, number: int) -> Job:
    """Job ``job_id`` of the database, locked, when a cluster's attempt ``number`` of it can be adopted onto it:
    the job waits for an attempt (QUEUED, or RECOVERING between attempts) and has no live attempt and none
    numbered ``number`` or later, so the backup was taken before that attempt was made. Raises CannotAdopt
    otherwise (a later attempt of a job whose own attempt the database still holds live: staff decide)."""
    job = Job.objects.select_for_update().get(pk=job_id)
    attempts = JobAttempt.objects.filter(job_id=job_id)
    if job.state not in (JobState.QUEUED, JobState.RECOVERING) or attempts.filter(ended_at__isnull=True).exists() \
            or attempts.filter(number__gte=number).exists():
        raise CannotAdopt(f"a later attempt of job {job_id}, which the database knows as {job.state}")
    return job


def adopt_one(cluster: Cluster, item: dict, now: dt.datetime) -> JobAttempt:
    """The attempt rows of one unknown attempt, from its dispatch record, and its job's: the job STARTING with it
    as its current attempt, started at its objects' creation, which reconcile then moves on (RUNNING, or ended as
    its end record says).

    A job the database already knows (same id and submission time) that still waits for this attempt (QUEUED or
    RECOVERING in the backup: the attempt was made after it) gets the attempt, ADMITTED -> STARTING, instead of
    being admitted a second time; a job the database lacks is rebuilt from the record, an element of an array
    the database holds linked to it (``_element_of``). The original job and attempt ids are kept where no row has
    them. Raises CannotAdopt when the record is missing or names a team, user, accelerator or node pool the
    database lacks, or a job whose own attempt the database still holds live (staff decide).
    """
    r = item.get("record") or {}
    if not r.get("uid") or r.get("uid") != item["uid"]:
        raise CannotAdopt("its objects carry no dispatch record")
    team = Team.objects.filter(slug=r.get("team")).first()
    submitter = get_user_model().objects.filter(username=r.get("submitter")).first()
    pool = NodePool.objects.select_related("accelerator").filter(cluster=cluster, name=r.get("node_pool")).first()
    for what, value in (("team", team), ("submitter", submitter), ("node pool", pool)):
        if value is None:
            raise CannotAdopt(f"the {what} it names ({r.get(what.replace(' ', '_'))!r}) is not in the database")
    job_created = _time(r.get("job_created_at"))
    existing = Job.objects.filter(pk=r.get("job_id")).values_list("created_at", flat=True).first()
    known = existing is not None and existing == job_created
    made = item.get("created_at") or now
    number = int(r.get("number") or 1)
    with transaction.atomic():
        if known:
            job = _waiting_job(int(r["job_id"]), number)
            array_id, array_index = job.array_id, job.array_index
        else:
            array_id, array_index = _element_of(r)
            job = _rebuilt_job(r, team, submitter, pool, item, made, array_id, array_index)
        attempt = JobAttempt(job=job, number=number, uid=item["uid"], cluster=cluster,
                             node_pool=pool, gpus=int(r.get("gpus") or job.total_gpus),
                             object_name=item.get("name") or "", usd_per_gpu_hour=_decimal(r.get("usd_per_gpu_hour")),
                             placement=r.get("placement") or {}, adopted_after_restore=True,
                             runner_state={"adopted_after_restore": now.isoformat()})
        if r.get("attempt_id") and not JobAttempt.objects.filter(pk=r["attempt_id"]).exists():
            attempt.pk = int(r["attempt_id"])
        attempt.save(force_insert=True)
        # Its own times, not the adoption's: reconcile adopts objects only of attempts older than a dispatch.
        JobAttempt.objects.filter(pk=attempt.pk).update(created_at=made)
        where = f"{item.get('namespace')}/{item.get('name')} found on {cluster.name} after a restore of the database"
        if known:  # admitted in the gap: the admission the backup lacks, with its attempt
            transition(job, JobState.ADMITTED, reason=f"admitted before the restore: {where}", attempt=attempt,
                       current_attempt=attempt)
        else:
            Job.objects.filter(pk=job.pk).update(current_attempt=attempt, created_at=job_created or made)
            job.current_attempt = attempt
        record_event(job, "adopted_after_restore",
                     f"{where}: " + ("attempt rebuilt from its labels and annotations onto its waiting job" if known
                                     else "job and attempt rebuilt from its labels and annotations"),
                     attempt=attempt,
                     data={"uid": item["uid"], "cluster": cluster.name, "recorded_job_id": r.get("job_id"),
                           "recorded_attempt_id": r.get("attempt_id"), "recorded_array": r.get("array"),
                           "array": array_id, "array_index": array_index, "onto_known_job": known})
        # Billed from its objects' creation, as any adopted attempt (ADR 0008); reconcile moves it on from there.
        mark_started(job, attempt, {**attempt.runner_state, "created_at": made.isoformat()},
                     reason=f"adopted after a restore: objects created {made.isoformat()} on {cluster.name}")
    log.info("recovery: adopted %s on %s as job %s, attempt %s", item.get("name"), cluster.name, job.pk, attempt.pk)
    return attempt


def _rebuilt_job(r: dict, team, submitter, pool, item: dict, made: dt.datetime, array_id, array_index) -> Job:
    """The job row of dispatch record ``r``, ADMITTED, saved with its recorded id where no row has it."""
    job = Job(array_id=array_id, array_index=array_index, team=team, submitter=submitter,
              name=str(r.get("job_name") or item.get("name"))[:63],
              kind=r.get("kind") or Job.Kind.TRAINING, spec=r.get("spec") or {}, accelerator=pool.accelerator,
              gpus_per_node=int(r.get("gpus_per_node") or 0), nodes=int(r.get("nodes") or 1),
              replicas=int(r.get("replicas") or 1), priority=int(r.get("priority") or 0),
              preemptible=bool(r.get("preemptible")), max_runtime_seconds=int(r.get("max_runtime_seconds") or 0) or None,
              max_retries=int(r.get("max_retries") or 0), state=JobState.ADMITTED, admitted_at=made,
              estimated_cost_usd=_decimal(r.get("estimated_cost_usd")),
              state_reason="adopted after a restore of the database")
    if r.get("job_id") and not Job.objects.filter(pk=r["job_id"]).exists():
        job.pk = int(r["job_id"])
    job.save(force_insert=True)
    return job


def _recorded_array_id(record: dict) -> int:
    """The array id a dispatch record names (0: none or unreadable)."""
    try:
        return int((record.get("array") or {}).get("id") or 0)
    except (TypeError, ValueError):
        return 0


def advance_sequences(job_id: int = 0, attempt_id: int = 0, array_id: int = 0) -> None:
    """Move the job, attempt and job array id sequences past their tables' largest id and past ``job_id`` /
    ``attempt_id`` / ``array_id`` (the largest seen in the clusters), so no new row repeats an id the clusters'
    objects carry (PostgreSQL)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for model, seen in ((Job, job_id), (JobAttempt, attempt_id), (JobArray, array_id)):
            table = model._meta.db_table
            cursor.execute(f"SELECT setval(pg_get_serial_sequence(%s, 'id'), GREATEST(COALESCE(MAX(id), 0), %s, 1)) "
                           f'FROM "{table}"', [table, seen])


def decide(job_id: int, decision: str, actor=None) -> str:
    """A staff decision on a job held after a restore (its objects gone, no end record): ``recover`` lets
    reconcile's normal rule restart it (ADR 0008, within ``max_retries``); ``fail`` ends it FAILED, billed up to
    the first look that missed it. Returns what was done. Raises ValueError for another decision or a job that
    is not held."""
    if decision not in ("recover", "fail"):
        raise ValueError(f"decision must be recover or fail, not {decision!r}")
    job = Job.objects.select_related("current_attempt__cluster").get(pk=job_id)
    attempt = job.current_attempt
    if attempt is None or attempt.ended_at is not None or not (attempt.runner_state or {}).get("held_after_restore"):
        raise ValueError(f"job {job_id} is not held after a restore")
    with transaction.atomic():
        JobAttempt.objects.filter(pk=attempt.pk).update(
            runner_state={**(attempt.runner_state or {}), "restore_decision": decision})
        record_event(job, "restore_decision", f"staff decided: {decision}", actor=actor, attempt=attempt)
    if decision == "fail":
        try:
            end_attempt(job, attempt, JobState.FAILED, reason="failed by a staff decision after a restore: its "
                        "objects were gone without an end record", end_reason=JobAttempt.EndReason.DELETED,
                        ended_at=attempt.absent_since, actor=actor)
        except StaleState:
            return "raced"
        return "failed"
    return "released"
