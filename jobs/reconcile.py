"""Reconcile: compare what each cluster runs with what the database says, and move job states.

One backend call per cluster (``observe_all``: observations and owned
attempt ids from one look) for all its live attempts, not one per job;
attempts whose state does not change cost no query of their own. Objects
on a cluster that no live attempt owns are orphans and are deleted, so
nothing keeps running or billing after its job ended.

A pass looks at its clusters concurrently: each cluster's ``observe_all``
(the LISTs, bounded by the cluster client's timeouts and rate limit) runs in
a thread of its own, while this thread reads the database and applies each
cluster's answer as soon as it arrives, so a slow or unreachable cluster
delays only itself. Every database read and write stays in the calling
thread (and its transaction); the look threads never touch the database.

The pass is also the cluster's health probe: one failure makes it
``degraded``, ``CLUSTER_UNREACHABLE_AFTER_FAILURES`` in a row ``unreachable``;
its jobs are left alone until reconcile has watched it fail for
``CLUSTER_LOST_GRACE_SECONDS``, then their attempts are recovered elsewhere
(a control plane that loses contact never kills healthy work before that).
The grace counts only watched time (docs/adr/0017): two looks further apart
than ``CLUSTER_LOST_OBSERVED_GAP_SECONDS`` (the control plane was down)
count nothing between them, so an outage of the control plane is never a
verdict on its clusters.

Evidence before verdicts: any failed, erroring (404, 410, 429, 5xx),
timed-out or malformed answer fails the whole look at that cluster (counted
in its health) and changes nothing else. An attempt is gone only when the
kind was listed and the attempt's own GET answered 404, on two looks in a
row (``lifecycle.confirm_absent``), or when its cluster is lost after the
grace period. Orphan cleanup deletes only objects of ended attempts, and
only after a look that succeeded.

No attempt is stranded: ADMITTED attempts are looked at too. Objects found
for one are adopted (billed from their creation); none found
``DISPATCH_DEADLINE_SECONDS`` after admission are dispatched again once, then
released and placed again (``lifecycle.redispatch_or_release``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import gc
import logging
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from runners.base import (
    Backend,
    ClusterUnreachable,
    Observation,
    Owned,
    UnknownBackend,
    attempt_key,
    backend_for,
    each_cluster,
)
from runners.cluster_health import set_health
from runners.models import Cluster

from .enqueue import enqueue_schedule
from .lifecycle import (
    apply_observation,
    bill_objects,
    confirm_absent,
    finish_cancel,
    recover_or_fail,
    redispatch_or_release,
    seen_again,
)
from .metrics import RECONCILE_SECONDS
from .models import Job, JobAttempt, JobState
from .replica_loss import follow_lost_replicas
from .states import StaleState
from .workload import collect_before_delete

log = logging.getLogger(__name__)

#: Seconds after admission before reconcile adopts the objects of an ADMITTED attempt: a dispatch still in flight
#: (creating its objects one by one) records them itself, with the backend's own state.
ADOPT_AFTER_SECONDS = 10.0

#: Clusters looked at at the same time in one pass (threads; each waits on its own cluster's API server).
MAX_CONCURRENT_LOOKS = 16

# Columns a pass never reads: JSON and decimals cost a parse per row (10,000s of rows per pass). A code path that
# does read one (a rare state change) loads it on access, in this thread.
_DEFERRED = ("runner_state", "message", "usd_per_gpu_hour", "accrued_until",
             "job__spec", "job__queue_info", "job__state_reason", "job__estimated_cost_usd", "job__accrued_cost_usd",
             "job__created_at", "job__updated_at", "job__admitted_at", "job__ended_at")


@dataclasses.dataclass
class _Look:
    """One cluster's part of a pass: the attempts it looks at (read here) and its backend's answer (read in a
    thread). ``full``: every live attempt, from full LISTs; else those ``_recheck`` picks, from the changes since
    the versions in ``watch`` (the cluster's ``reconcile_watch``). ``versions``: where the next look resumes (None:
    the backend does not follow changes)."""

    cluster: Cluster
    backend: Backend
    attempts: list[JobAttempt]
    started: float
    full: bool = True
    watch: dict = dataclasses.field(default_factory=dict)
    versions: dict | None = None
    changed: int = 0
    asked_at: dt.datetime | None = None


def reconcile_cluster(cluster: Cluster) -> dict:
    """One reconcile pass over ``cluster``; returns counts (observed, orphans deleted, seconds).

    Raises UnknownBackend when no backend serves the cluster.
    """
    backend_for(cluster)  # raises UnknownBackend before any work
    return reconcile_clusters([cluster])[0]


def reconcile_clusters(clusters: Iterable[Cluster], *, fresh: bool = False) -> list[dict]:
    """One reconcile pass over ``clusters``, their LISTs concurrent; a result dict per cluster, in input order.

    ``fresh``: the caller read each row just now, under the cluster's reconcile lease (``reconcile_leased``), so
    its ``reconcile_watch`` is current and is not read again; otherwise it is read again per cluster.

    Each result holds ``observed``, ``orphans_deleted`` and ``seconds`` (this
    cluster's time from its database read to its last change), or
    ``unreachable`` and the cluster's health, or ``error`` (unknown backend,
    or a backend failure other than ClusterUnreachable, logged with its
    traceback). A cluster that answers late (at most its client's connect +
    read timeout per LIST) is applied last and delays no other cluster's
    changes.

    Failure domain: one cluster (docs/adr/0016). Whatever fails for one
    cluster (its credential cannot be decrypted or is refused, which its
    client raises as InvalidCredentials and its health records; an error
    while applying its answer) gives that cluster's result an ``error`` or
    ``unreachable`` and never stops another cluster's pass.
    """
    clusters = list(clusters)
    results: dict[int, dict] = {}
    with paused_gc(), ThreadPoolExecutor(max_workers=max(1, min(MAX_CONCURRENT_LOOKS, len(clusters))),
                                         thread_name_prefix="reconcile-look") as pool:
        looks: dict[Future, tuple[_Look, str]] = {}  # a look thread's future -> its look, and "changes" or "observe"
        for cluster in clusters:
            try:
                backend = backend_for(cluster)
            except UnknownBackend as exc:  # one misconfigured cluster must not stop the others' reconcile
                log.error("%s", exc)
                results[cluster.pk] = {"cluster": cluster.name, "error": str(exc)}
                continue
            look = _Look(cluster, backend, [], time.monotonic(), watch=_resume_point(cluster, backend, fresh=fresh))
            if look.watch:  # first the changes since the last look; what to look at follows from them
                look.full = False
                looks[pool.submit(_changes, backend, cluster, look.watch["versions"])] = (look, "changes")
            else:
                looks[_submit_observe(pool, look, ())] = (look, "observe")
        try:
            while looks:
                done, _ = wait(looks, return_when=FIRST_COMPLETED)
                for future in done:
                    look, step = looks.pop(future)
                    try:
                        if step == "changes" and (follow := _after_changes(pool, look, future)) is not None:
                            looks[follow] = (look, "observe")
                            continue
                        results[look.cluster.pk] = (_failed_look(look, future) if step == "changes"
                                                    else _apply(look, future))
                    except SoftTimeLimitExceeded:
                        raise
                    except Exception as exc:  # noqa: BLE001 - failure domain: one cluster (docs/adr/0016)
                        log.exception("cluster %s: applying its answer failed", look.cluster.name)
                        results[look.cluster.pk] = {"cluster": look.cluster.name,
                                                    "error": f"{type(exc).__name__}: {exc}"}
                    RECONCILE_SECONDS.labels(cluster=look.cluster.name).observe(time.monotonic() - look.started)
        except BaseException:  # e.g. the task's soft time limit: start no further look, wait only for those running
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [results[cluster.pk] for cluster in clusters]


def _live_attempts(cluster: Cluster, picked: Q | None = None) -> list[JobAttempt]:
    """The not ended attempts on ``cluster`` (ADMITTED ones too; only those matching ``picked`` when given) with
    their jobs (heavy columns deferred, ``cluster`` set)."""
    rows = JobAttempt.objects.filter(cluster=cluster, ended_at__isnull=True)
    if picked is not None:
        rows = rows.filter(picked)
    attempts = list(rows.select_related("job__team").defer(*_DEFERRED))
    for attempt in attempts:
        attempt.cluster = cluster  # the row just read: no join, no per-row decryption of its credentials
    return attempts


def _observe(backend: Backend, cluster: Cluster, attempts: list[JobAttempt], versions: dict | None,
             keys: Iterable | None) -> tuple[dict[int, Observation], set[int]]:
    """In a look thread: ``backend.observe_all`` (``keys`` None; ``versions``, when not None, filled with where the
    next look resumes), or ``backend.observe_changed`` for ``attempts`` and the changed attempt ``keys``; closes
    any database connection the thread opened."""
    try:
        if keys is not None:
            return backend.observe_changed(cluster, attempts, keys)
        if versions is not None:
            return backend.observe_all(cluster, attempts, versions)
        return backend.observe_all(cluster, attempts)
    finally:
        connections.close_all()  # per-thread connections: a backend that read the database must not leak one


def _changes(backend: Backend, cluster: Cluster, versions: dict) -> tuple[set, dict] | None:
    """``backend.changes`` in a look thread (closing any database connection it opened)."""
    try:
        return backend.changes(cluster, dict(versions))
    finally:
        connections.close_all()


def _resume_point(cluster: Cluster, backend: Backend, *, fresh: bool = False) -> dict:
    """The cluster's ``reconcile_watch`` when this pass may look at its changes only; ``{}`` when it LISTs
    everything: the backend does not follow changes, the setting ``RECONCILE_FULL_LIST_SECONDS`` is 0, no
    look answered yet, the API endpoint changed, the last full LIST is ``RECONCILE_FULL_LIST_SECONDS`` old,
    or the last look that answered is older than ``CLUSTER_LOST_OBSERVED_GAP_SECONDS`` (the control plane was
    down or restored from a backup: whatever it kept is not trusted, as after the first contact). ``fresh``: the
    row was read just now under the cluster's reconcile lease, and its own ``reconcile_watch`` is used."""
    every = float(settings.RECONCILE_FULL_LIST_SECONDS)
    if not hasattr(backend, "changes") or every <= 0:
        return {}
    # Read here, not from the row as loaded, unless that row is fresh: a caller may hold the row across passes.
    if fresh:
        watch = cluster.reconcile_watch or {}
    else:
        watch = Cluster.objects.filter(pk=cluster.pk).values_list("reconcile_watch", flat=True).first() or {}
    if not watch.get("versions") or not watch.get("listed_at") or watch.get("endpoint") != cluster.api_endpoint \
            or not watch.get("looked_at"):
        return {}
    now = timezone.now()
    try:
        listed, looked = dt.datetime.fromisoformat(watch["listed_at"]), dt.datetime.fromisoformat(watch["looked_at"])
    except (TypeError, ValueError):
        return {}
    if (now - listed).total_seconds() >= every or \
            (now - looked).total_seconds() > settings.CLUSTER_LOST_OBSERVED_GAP_SECONDS:
        return {}
    return watch


def _submit_observe(pool: ThreadPoolExecutor, look: _Look, keys: Iterable | None) -> Future:
    """Start ``look``'s observation in a look thread: of every live attempt from full LISTs (``keys`` empty,
    ``look.full`` set), or of ``look.attempts`` and the changed ``keys``."""
    if look.full:
        look.attempts = _live_attempts(look.cluster)
        look.versions = {} if hasattr(look.backend, "changes") and settings.RECONCILE_FULL_LIST_SECONDS > 0 else None
        keys = None
    look.asked_at = timezone.now()
    return pool.submit(_observe, look.backend, look.cluster, look.attempts, look.versions, keys)


def _after_changes(pool: ThreadPoolExecutor, look: _Look, future: Future) -> Future | None:
    """The observation to start after ``look``'s changes answered: of the attempts ``_recheck`` picks, or of
    every live attempt from full LISTs when the server no longer keeps the changes since the versions kept (410
    Gone). None when asking for the changes failed (``_failed_look`` records it)."""
    try:
        answer = future.result()
    except SoftTimeLimitExceeded:
        raise
    except Exception:  # noqa: BLE001 - recorded by _failed_look, as a failed LIST is
        return None
    if answer is None:
        log.info("cluster %s: its changes since the last look are no longer kept: listing everything",
                 look.cluster.name)
        look.full = True
        return _submit_observe(pool, look, ())
    keys, look.versions = answer
    look.changed = len(keys)
    look.attempts = _recheck(look.cluster, keys, look.watch)
    return _submit_observe(pool, look, set(keys) | _ended_since(look.cluster, look.watch))


def _recheck(cluster: Cluster, keys: Iterable, watch: dict) -> list[JobAttempt]:
    """The live attempts on ``cluster`` a look between full LISTs looks at (as ``_live_attempts`` loads them):
    those whose objects changed (attempt ``keys``: uid strings, ids of attempts made before uids), those the
    last look found not steady (``watch["recheck"]``), every one whose job is not RUNNING (admitted, starting,
    cancelling: deadlines and graces run on them), with a look that missed its objects (``absent_since``: the
    second look decides), of several roles (their JobSet is not watched), or serving past its max runtime (a
    Deployment has no deadline of its own). The time-based picks are database conditions (job state, absence
    mark) and a read of the serving attempts with a max runtime, never work per running attempt."""
    uids, ids = [], []
    for key in keys:
        if isinstance(key, str):
            with contextlib.suppress(ValueError):
                uids.append(uuid.UUID(key))
        else:
            ids.append(key)
    now = timezone.now()
    # Serving attempts with a max runtime: one narrow read (ids and two columns, no rows built), the deadline
    # compared here (SQLite, the demo's database, has no interval arithmetic on a column).
    overdue = [pk for pk, started, limit in JobAttempt.objects.filter(
        cluster=cluster, ended_at__isnull=True, started_at__isnull=False, job__kind=Job.Kind.INFERENCE,
        job__max_runtime_seconds__isnull=False).values_list("pk", "started_at", "job__max_runtime_seconds")
        if (now - started).total_seconds() >= limit]
    picked = (Q(pk__in=[*ids, *overdue, *(watch.get("recheck") or ())]) | Q(uid__in=uids)
              | ~Q(job__state=JobState.RUNNING) | Q(absent_since__isnull=False) | Q(job__kind=Job.Kind.MULTI_ROLE))
    return _live_attempts(cluster, picked)


def _ended_since(cluster: Cluster, watch: dict) -> set:
    """Attempt keys of the attempts on ``cluster`` that ended since its last look (``watch["looked_at"]``), or
    whose objects' deletion is pending: their objects, unchanged on the cluster, are deleted as orphans by this
    look, and a pending one found gone is cleared (``_track_pending_deletions``)."""
    rows = JobAttempt.objects.filter(Q(ended_at__gte=dt.datetime.fromisoformat(watch["looked_at"]))
                                     | Q(deletion_pending_since__isnull=False), cluster=cluster)
    return {attempt_key(a) for a in rows.only("pk", "uid", "job_id", "number", "object_name")}


def _failed_look(look: _Look, future: Future) -> dict:
    """Record the failure of ``look``'s call in ``future`` (it raised): counted in the cluster's health, and past
    the grace its attempts recovered, all of its live attempts (loaded here when the look had only some). The
    versions kept stay where they were: the next look asks for the same changes again."""
    cluster = look.cluster
    attempts = look.attempts if look.full else _live_attempts(cluster)
    try:
        future.result()
    except ClusterUnreachable as exc:
        log.warning("cluster %s did not answer: %s", cluster.name, exc)
        return _record_failure(cluster, attempts, str(exc))
    except SoftTimeLimitExceeded:  # the task's time is up (raised in this thread): no verdict on the cluster
        raise
    except Exception as exc:  # noqa: BLE001 - a backend bug on one cluster must not stop the others' reconcile
        log.exception("cluster %s: observing failed", cluster.name)
        return {**_record_failure(cluster, attempts, f"{type(exc).__name__}: {exc}"),
                "error": f"{type(exc).__name__}: {exc}"}
    raise RuntimeError("_failed_look called for a call that succeeded")


def _apply(look: _Look, future: Future) -> dict:
    """Apply one cluster's answer in the calling thread: health, state changes, orphan deletion, and where the
    next look resumes (``reconcile_watch``)."""
    cluster, backend, attempts = look.cluster, look.backend, look.attempts
    if future.exception() is not None:
        return _failed_look(look, future)
    observations, owned = future.result()
    answered = timezone.now()
    Cluster.objects.filter(pk=cluster.pk).update(last_contact_at=answered, last_look_at=answered, failing_since=None,
                                                 consecutive_failures=0)
    if cluster.health != Cluster.Health.HEALTHY:
        set_health(cluster, Cluster.Health.HEALTHY)
    now = timezone.now()
    looked: list[tuple[JobAttempt, Observation]] = []
    for attempt in attempts:
        job = attempt.job
        if job.current_attempt_id != attempt.pk:
            continue
        if job.state == JobState.CANCELLING:
            _finish_cancel(job.pk)
            continue
        obs = observations.get(attempt.pk)
        if obs is None:
            continue
        looked.append((attempt, obs))
        if obs.phase != "absent":
            if job.state == JobState.ADMITTED and (now - attempt.created_at).total_seconds() < ADOPT_AFTER_SECONDS:
                continue  # a dispatch in flight records its own objects
            seen_again(attempt)
            apply_observation(job, attempt, obs)
            if obs.lost_replicas and backend.replaces_replicas:
                follow_lost_replicas(job, attempt, obs, backend, now)
        elif job.state == JobState.ADMITTED:
            redispatch_or_release(job, attempt, cluster_answers=True, now=now,
                                  deadline_seconds=settings.DISPATCH_DEADLINE_SECONDS)
        else:
            confirm_absent(job, attempt, now)

    # Attempts still live after this pass's changes own their objects; the rest of what the cluster runs is a
    # candidate orphan (ended this pass or before, or live elsewhere: _delete_orphans asks the database).
    held = owned if isinstance(owned, dict) else dict.fromkeys(owned, Owned())
    live = {attempt_key(a) for a in attempts if a.ended_at is None}
    candidates, unknown = _resolve({k: v for k, v in held.items() if k not in live})
    if unknown:  # objects of attempts the database does not know (a restore lost them): never touched here
        log.warning("cluster %s runs objects of %d attempt(s) the database does not know: %s (manage.py "
                    "after_restore adopts them)", cluster.name, len(unknown), ", ".join(sorted(map(str, unknown))))
    orphans, ended = _delete_orphans(cluster, backend, candidates, answered)
    _track_pending_deletions(cluster, {pk for pk in ended if candidates[pk].holding}, look.asked_at or answered,
                             answered)
    if look.versions is not None:
        # Attempts the next look between full LISTs looks at again, changed or not: not RUNNING and running as
        # observed after this look's changes (a grace or a second look pending), or with replicas lost.
        unsteady = sorted(a.pk for a, obs in looked if a.ended_at is None and (
            obs.phase != "running" or a.job.state != JobState.RUNNING or obs.lost_replicas))
        Cluster.objects.filter(pk=cluster.pk).update(reconcile_watch={
            "versions": look.versions, "endpoint": cluster.api_endpoint, "looked_at": answered.isoformat(),
            "listed_at": answered.isoformat() if look.full else look.watch.get("listed_at"), "recheck": unsteady})
    return {"cluster": cluster.name, "observed": len(attempts), "ended": len(attempts) - len(live),
            "orphans_deleted": orphans, "unknown": len(unknown), "full_list": look.full, "changed": look.changed,
            "seconds": round(time.monotonic() - look.started, 4)}


def _track_pending_deletions(cluster: Cluster, found: set[int], asked: dt.datetime, answered: dt.datetime) -> None:
    """After a look at ``cluster`` sent at ``asked`` that answered at ``answered``: the ended attempts whose pods
    it found holding their GPUs (``found``, ids; the look asked for every attempt marked pending,
    ``_ended_since``) are pending deletion from then, unless marked already; every other attempt of the cluster
    marked pending before the look was sent is cleared, its pods gone or stopped (one marked while the look was
    out, by a cancel that could not reach the cluster, waits for the next look).

    Class of failure: work counted as ended while its pods still run. A cancel on an unreachable cluster ends the
    attempt at once, and a job array then started its next element beside the old pods, one more than its
    parallelism. Invariant: an attempt's ``deletion_pending_since`` is set from its end (or from the look that
    found its objects after it) until a look finds them gone or the cluster is judged lost; limits on running
    work count it (``jobs.arrays``). A steady look reads the partial index of marked attempts and writes nothing."""
    if found:
        JobAttempt.objects.filter(pk__in=found, deletion_pending_since__isnull=True).update(
            deletion_pending_since=answered)
    gone = list(JobAttempt.objects.filter(cluster=cluster, deletion_pending_since__lt=asked).exclude(pk__in=found)
                .values_list("pk", flat=True))  # a read, not a write, on a steady pass
    if gone and JobAttempt.objects.filter(pk__in=gone, deletion_pending_since__lt=asked).update(
            deletion_pending_since=None):
        enqueue_schedule()  # an array held back by those pods may start its next element


def _resolve(held: dict) -> tuple[dict[int, Owned], list]:
    """Attempt ids of ``held`` (keyed by ``attempt_key``: uid strings, or ids of attempts made before uids), and
    the keys no attempt row has. An id key counts only for an attempt made before uids, a uid only for its own
    attempt: an id the restored database handed out again never matches another attempt's objects."""
    uids = [k for k in held if isinstance(k, str)]
    ids = [k for k in held if not isinstance(k, str)]
    found: dict[int, Owned] = {}
    by_uid = dict(JobAttempt.objects.filter(uid__in=uids).values_list("uid", "pk")) if uids else {}
    for uid, pk in by_uid.items():
        found[pk] = held[str(uid)]
    known = {str(u) for u in by_uid}
    legacy = {pk for pk, job_id, number, name in JobAttempt.objects.filter(pk__in=ids).values_list(
        "pk", "job_id", "number", "object_name") if name == f"job-{job_id}-{number}"} if ids else set()
    for pk in ids:
        if pk in legacy:
            found[pk] = held[pk]
    return found, [k for k in uids if k not in known] + [k for k in ids if k not in legacy]


def _delete_orphans(cluster: Cluster, backend: Backend, candidates: dict[int, Owned], seen_at) -> tuple[int, set[int]]:
    """Delete the objects on ``cluster`` of the attempts in ``candidates`` that ended; returns how many were deleted
    and the ids of the ended attempts among ``candidates`` (their objects were still there).

    ``candidates``: attempt ids seen on the cluster that the pass did not
    load as live (so a steady pass asks nothing), with what the cluster
    holds of each at the look answered at ``seen_at``. A candidate that is
    still live (e.g. admitted since the look) is kept; ids without a row are
    left alone. Objects whose pods still held GPUs are billed
    (``lifecycle.bill_objects``) until the look that saw them so, or until
    the cluster accepted the deletion of their owner when that came later:
    they ran, whatever the attempt's state said. Pods that stopped by
    themselves are billed to their stop, by their own times. Only the
    cluster's evidence moves an end: a pass that sees the same holds the
    same end.
    """
    if not candidates:
        return 0, set()
    live_ids = set(JobAttempt.objects.filter(pk__in=candidates, ended_at__isnull=True).values_list("pk", flat=True))
    orphans = 0
    ended = set(candidates) - live_ids
    for attempt in JobAttempt.objects.filter(pk__in=ended).select_related("job__team", "cluster"):
        log.info("deleting orphaned objects of %s on %s", attempt.object_name, cluster.name)
        collect_before_delete(attempt)  # its pods' logs go with them: keep the run's final report first
        failure = None
        try:
            backend.delete(attempt)
        except ClusterUnreachable as exc:  # the next pass retries
            log.warning("cluster %s: deleting %s failed: %s", cluster.name, attempt.object_name, exc)
            failure = exc
        accepted = getattr(attempt, "deletion_accepted_at", None)
        owned = candidates[attempt.pk]
        if owned.holding:
            # They ran until the look saw them, or until the deletion of their owner was accepted, if later (a later
            # call may have failed); the acceptance is the owner's own time, the same on every pass.
            held = max(t for t in (seen_at, accepted) if t)
            bill_objects(attempt.pk, owned.created_at, held_until=held,
                         evidence=("the cluster accepted the deletion of their owner then" if held == accepted
                                   else f"a look at {cluster.name} saw them still running then"))
        elif owned.stopped_at is not None:
            # They stopped by themselves, possibly after the end recorded while the cluster could not be asked (a
            # cancel on an unreachable cluster ends the attempt at its last contact): billed up to their stop.
            bill_objects(attempt.pk, owned.created_at, held_until=owned.stopped_at,
                         evidence=f"{cluster.name} reports they stopped then")
        if failure is not None:
            break
        orphans += 1
    return orphans, ended


@contextlib.contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while a pass builds its snapshot (restored after, also on errors).

    Per 1,000 attempts the snapshot allocates some 10^5 acyclic objects
    (four model instances per attempt, the parsed LIST bodies); with the
    collector on, those allocations trigger repeated full collections over
    the whole heap, which measured as half of a pass. Reference counting
    still frees everything; the collector runs again once the pass is done.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _record_failure(cluster: Cluster, attempts: list[JobAttempt], error: str = "") -> dict:
    """Count a failed look; mark ``unreachable`` after enough in a row; past the grace period recover its attempts.

    ADMITTED attempts past ``DISPATCH_DEADLINE_SECONDS`` are released and placed again at once (a cluster that
    does not answer cannot be dispatched to). ``error``: what failed, in the result and the log.
    """
    now = timezone.now()
    _count_failed_look(cluster, now)
    cluster.refresh_from_db(fields=["consecutive_failures", "last_contact_at", "last_look_at", "failing_since",
                                    "health", "health_reason", "health_since"])
    unreachable = cluster.consecutive_failures >= settings.CLUSTER_UNREACHABLE_AFTER_FAILURES
    health = Cluster.Health.UNREACHABLE if unreachable else Cluster.Health.DEGRADED
    failed = f"{cluster.consecutive_failures} failed probe(s) in a row"
    if set_health(cluster, health, f"{failed}, the last: {error or 'no answer'}"):
        log.warning("cluster %s is %s after %s", cluster.name, health, failed)
    result = {"cluster": cluster.name, "unreachable": True, "health": str(health),
              "consecutive_failures": cluster.consecutive_failures, "recovered": 0, "failure": error}
    for attempt in attempts:
        if attempt.job.current_attempt_id == attempt.pk and attempt.job.state == JobState.ADMITTED:
            redispatch_or_release(attempt.job, attempt, cluster_answers=False, now=now,
                                  deadline_seconds=settings.DISPATCH_DEADLINE_SECONDS)
    if unreachable:
        result["recovered"] = recover_lost_cluster(cluster, attempts, now)
    return result


def _count_failed_look(cluster: Cluster, now: dt.datetime) -> None:
    """Record one failed look at ``cluster`` at ``now`` (aware UTC): one more failure in a row, and the clock of
    watched failure that the lost-cluster grace reads.

    Class of failure: a verdict on time the control plane did not observe. Invariant: the clock
    (``failing_since``) counts only time between looks at most ``CLUSTER_LOST_OBSERVED_GAP_SECONDS`` apart. After
    a longer gap (the control plane was down, or the row was restored from a backup) nobody watched the cluster:
    the clock starts at this look. Within the bound it keeps running, or starts at the previous look when that
    one answered (the cluster has been failing since its last contact, as watched). The cluster row is locked for
    the read and the write, so two passes looking at once count both looks.
    """
    with transaction.atomic():
        row = Cluster.objects.select_for_update(no_key=True).only("last_look_at", "failing_since").get(pk=cluster.pk)
        last, since = row.last_look_at, row.failing_since
        if last is None or (now - last).total_seconds() > settings.CLUSTER_LOST_OBSERVED_GAP_SECONDS:
            since = now
        elif since is None:
            since = min(last, now)
        Cluster.objects.filter(pk=cluster.pk).update(
            consecutive_failures=F("consecutive_failures") + 1, failing_since=since,
            last_look_at=now if last is None else max(last, now))


def recover_lost_cluster(cluster: Cluster, attempts: list[JobAttempt], now: dt.datetime | None = None) -> int:
    """Recover the STARTING/RUNNING attempts of an unreachable ``cluster`` once it was watched failing for
    ``CLUSTER_LOST_GRACE_SECONDS``.

    The grace runs from ``cluster.failing_since`` (as loaded; set by each
    failed look, ``_count_failed_look``): time the control plane watched the
    cluster fail, never time it was itself down. ``now``: aware UTC, default
    the current time. Returns how many attempts were ended (RECOVERING, or
    FAILED when no retry is left). Cancels on an unreachable cluster end
    CANCELLED with deletion pending (``jobs.lifecycle.finish_cancel``); the
    objects of those and of recovered attempts are deleted as orphans when the
    cluster answers again: the verdict was made on watched time, their jobs
    may run elsewhere already, and a job never runs twice.
    """
    now = now or timezone.now()
    since = cluster.failing_since
    if since is None or (now - since).total_seconds() < settings.CLUSTER_LOST_GRACE_SECONDS:
        return 0
    watched = f"watched failing for {(now - since).total_seconds():.0f} s since {since.isoformat()}"
    # The verdict: what ran there is taken as gone, the ended attempts' objects with it (their jobs' limits on
    # running work no longer count them); they are deleted as orphans if the cluster answers again.
    if JobAttempt.objects.filter(cluster=cluster, deletion_pending_since__isnull=False).update(
            deletion_pending_since=None):
        enqueue_schedule()
    recovered = 0
    for attempt in attempts:
        job = attempt.job
        if job.current_attempt_id != attempt.pk or job.state not in (JobState.STARTING, JobState.RUNNING):
            continue
        try:
            recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.NODE_LOST,
                            message=f"cluster {cluster.name} unreachable, {watched}")
            recovered += 1
        except StaleState:
            log.info("job %s changed under reconcile; leaving it to the winner", job.pk)
    return recovered


def _finish_cancel(job_id: int) -> None:
    """``finish_cancel`` that logs instead of raising when the cluster's backend is missing (retried next pass)."""
    try:
        finish_cancel(job_id)
    except (ClusterUnreachable, UnknownBackend) as exc:
        log.warning("job %s: cancel not finished: %s", job_id, exc)


#: How long one cluster's reconcile holds its lease at most (seconds): the hard time limit of the task that runs it
#: (``jobs.tasks.reconcile_cluster``), so a lease outlives its holder only when that holder was killed, and then
#: the cluster's next reconcile waits at most this long. The lost-cluster grace counts watched time only
#: (docs/adr/0017), so a cluster nobody looked at meanwhile is never judged on that time.
RECONCILE_LEASE_SECONDS = 90


def take_reconcile_lease(cluster_id: int, holder: str, now: dt.datetime) -> bool:
    """Take cluster ``cluster_id``'s reconcile lease for ``holder`` (a task id) at ``now`` (aware UTC), for
    ``RECONCILE_LEASE_SECONDS``: one compare-and-set update, so of two workers that try at once exactly one gets
    it. Returns False while another holder's lease runs, or when the cluster is gone."""
    until = now + dt.timedelta(seconds=RECONCILE_LEASE_SECONDS)
    free = Q(reconcile_lease_until__isnull=True) | Q(reconcile_lease_until__lte=now)
    return Cluster.objects.filter(free, pk=cluster_id).update(reconcile_lease_until=until,
                                                              reconcile_lease_holder=holder) == 1


def give_back_reconcile_lease(cluster_id: int, holder: str) -> None:
    """End ``holder``'s reconcile lease on cluster ``cluster_id`` (compare-and-set on the holder: a lease that
    expired and was taken by another worker is left to it)."""
    Cluster.objects.filter(pk=cluster_id, reconcile_lease_holder=holder).update(reconcile_lease_until=None,
                                                                                reconcile_lease_holder="")


def reconcile_leased(cluster_id: int, holder: str) -> dict:
    """One reconcile pass over cluster ``cluster_id`` under its lease (``take_reconcile_lease``), then the sweep of
    its end records (``expire_end_records``); the result of ``reconcile_clusters`` for it.

    Invariant: one cluster's reconcile never runs twice at once. A second call while the lease is held returns at
    once with ``skipped`` (the running pass reads the cluster's newest state anyway); so does a call for a cluster
    deleted since it was asked. The lease is given back however the pass ends.
    """
    if not take_reconcile_lease(cluster_id, holder, timezone.now()):
        return {"cluster_id": cluster_id, "skipped": "lease held by another reconcile, or no such cluster"}
    try:
        cluster = Cluster.objects.filter(pk=cluster_id).first()
        if cluster is None:
            return {"cluster_id": cluster_id, "skipped": "no such cluster"}
        result = reconcile_clusters([cluster], fresh=True)[0]  # the row just read, under the lease
        expire_end_records(clusters=[cluster])
        return result
    finally:
        give_back_reconcile_lease(cluster_id, holder)


def finish_unstarted_cancels() -> int:
    """Finish the cancels of CANCELLING jobs whose objects are known gone or were never created (an attempt
    never dispatched has no cluster to look at); returns how many jobs were looked at."""
    job_ids = list(Job.objects.filter(state=JobState.CANCELLING).values_list("pk", flat=True))
    for job_id in job_ids:
        _finish_cancel(job_id)
    return len(job_ids)


def reconcile_all() -> list[dict]:
    """Reconcile every cluster in one concurrent pass (``reconcile_clusters``), then finish cancels whose attempt
    never started, then expire old end records (``expire_end_records``). Returns the per-cluster results."""
    results = reconcile_clusters(Cluster.objects.all())
    finish_unstarted_cancels()
    expire_end_records()
    return results


#: When this process last expired each cluster's end records (cluster id -> ``time.monotonic()``).
LAST_SWEEP: dict[int, float] = {}


def latest_ends(uids: list[str]) -> dict[str, dt.datetime]:
    """``{uid: ended_at}`` of the ended attempts among ``uids`` (attempt uids as strings; malformed ones are
    ignored): the ends the clusters' end records must not lag behind (docs/adr/0021)."""
    valid = []
    for uid in uids:
        try:
            valid.append(uuid.UUID(uid))
        except (TypeError, ValueError):
            continue
    rows = JobAttempt.objects.filter(uid__in=valid, ended_at__isnull=False).values_list("uid", "ended_at")
    return {str(uid): ended for uid, ended in rows}


def expire_end_records(now: dt.datetime | None = None, clusters: Iterable[Cluster] | None = None) -> int:
    """Sweep the end records of each cluster whose backend keeps them, at most once per
    ``END_RECORD_SWEEP_SECONDS`` per cluster in this process: delete those older than
    ``settings.END_RECORD_RETENTION_SECONDS``, and move forward those behind their attempt's end (``latest_ends``:
    a ``record_end`` that ran out of retries while the cluster did not answer is made good once it answers); and,
    where the backend keeps serving endpoints of their own (``sweep_endpoints``), delete those of jobs that ended.
    Returns how many were deleted. A cluster that does not answer is left for the next sweep. ``clusters``: those
    to sweep (default: every cluster not unreachable)."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(seconds=settings.END_RECORD_RETENTION_SECONDS)

    def one(cluster: Cluster) -> dict:
        last = LAST_SWEEP.get(cluster.pk)
        if last is not None and time.monotonic() - last < settings.END_RECORD_SWEEP_SECONDS:
            return {"deleted": 0}
        try:
            backend = backend_for(cluster)
        except UnknownBackend:
            return {"deleted": 0}
        sweep = getattr(backend, "sweep_end_records", None)
        if sweep is None:
            return {"deleted": 0}
        try:
            swept = sweep(cluster, cutoff, latest_ends)
        except ClusterUnreachable as exc:
            log.info("cluster %s: end records not swept: %s", cluster.name, exc)
            return {"deleted": 0}
        endpoints = getattr(backend, "sweep_endpoints", None)  # serving Services of jobs that ended meanwhile
        try:
            swept["endpoints"] = endpoints(cluster) if endpoints else 0
        except ClusterUnreachable as exc:
            log.info("cluster %s: serving endpoints not swept: %s", cluster.name, exc)
        LAST_SWEEP[cluster.pk] = time.monotonic()
        if swept["moved"]:
            log.info("cluster %s: %d end record(s) moved forward to their attempt's end", cluster.name, swept["moved"])
        return swept

    # Failure domain: one cluster (runners.base.each_cluster): a sweep that fails in any way skips that cluster only.
    if clusters is None:
        clusters = Cluster.objects.exclude(health=Cluster.Health.UNREACHABLE)
    else:
        clusters = [c for c in clusters if c.health != Cluster.Health.UNREACHABLE]
    return sum(r.get("deleted", 0) for r in each_cluster(clusters, one, "end record expiry"))
