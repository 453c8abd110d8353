"""Celery tasks of the job lifecycle. Each takes ids only, is idempotent, and is enqueued on commit.

``dispatch_attempt`` is ``acks_late`` with ``reject_on_worker_lost``: a worker
that dies mid-dispatch leaves the message for another worker, and the
backend's idempotent dispatch makes the second run harmless.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from celery import shared_task
from django.db import transaction

from jobs import metrics
from core.lookups import LookupCache
from runners.base import PermanentDispatchError, TransientDispatchError, UnknownBackend, backend_for
from runners.models import Accelerator, Cluster, NodePool

from .models import JobAttempt, JobState

log = logging.getLogger(__name__)


#: Redis key (on the broker's Redis) that says "a scheduling pass is published and has not started yet".
SCHEDULE_PENDING_KEY = "controlplane:schedule-pending"
#: Seconds the flag lives at most: bounds how long a lost task can suppress publishes
#: (the periodic pass, every 10 s, is the safety net meanwhile).
SCHEDULE_PENDING_TTL = 30

_redis_client = None
_redis_url = None


def schedule_flag_client():
    """The broker's Redis (a cached ``redis.Redis``), or None when the broker is not Redis.

    The URL is the Celery app's ``broker_url``, i.e. ``settings.CELERY_BROKER_URL``
    (read by the app), so the flag lives where the tasks are published even
    when a test repoints the app. Cached per process and per URL.
    """
    global _redis_client, _redis_url
    from controlplane.celery import app

    url = str(app.conf.broker_url or "")
    if not url.startswith(("redis://", "rediss://")):
        return None
    if _redis_client is None or _redis_url != url:
        import redis

        _redis_client, _redis_url = redis.Redis.from_url(url), url
    return _redis_client


def publish_schedule() -> bool:
    """Publish a scheduling pass unless one is already published and not yet started; True when published.

    With a Redis broker, ``SET controlplane:schedule-pending NX EX 30`` decides:
    only the caller that sets the flag publishes. The pass clears the flag
    (``jobs.scheduler.schedule_coalesced``) *before* it reads the queue, so a
    job committed before a failed SET NX is read by the pass that clears the
    flag afterwards (see there). Any other broker, or a Redis error, publishes
    every time: coalescing only saves work, it never decides correctness.
    """
    client = schedule_flag_client()
    if client is not None:
        try:
            if not client.set(SCHEDULE_PENDING_KEY, "1", nx=True, ex=SCHEDULE_PENDING_TTL):
                return False
        except Exception:  # noqa: BLE001 - Redis down: publish (the publish itself will report broker trouble)
            log.warning("schedule flag: Redis error; publishing anyway", exc_info=True)
    try:
        schedule_pending.delay()
    except Exception:
        if client is not None:  # the flag this call set announces a pass that was never published: free it
            try:
                client.delete(SCHEDULE_PENDING_KEY)
            except Exception:  # noqa: BLE001 - it expires within SCHEDULE_PENDING_TTL anyway
                pass
        raise
    return True


#: Redis key holding ``"<unix end time> <pause seconds>"`` of the last pass (see ``jobs.scheduler.schedule_coalesced``).
SCHEDULE_LAST_PASS_KEY = "controlplane:schedule-last-pass"


def record_pass(duration_s: float) -> float:
    """Record that a pass of ``duration_s`` seconds just ended; returns the pause (seconds) before the next one.

    The pause is ``min(duration_s x SCHEDULE_PASS_PAUSE_FACTOR, SCHEDULE_PASS_PAUSE_MAX_SECONDS)``; 0 after
    a pass shorter than ``SCHEDULE_PASS_PAUSE_MIN_SECONDS`` (a short queue is not worth deferring for), and
    0 without a Redis broker.
    """
    from django.conf import settings

    pause = min(duration_s * settings.SCHEDULE_PASS_PAUSE_FACTOR, settings.SCHEDULE_PASS_PAUSE_MAX_SECONDS)
    if duration_s < settings.SCHEDULE_PASS_PAUSE_MIN_SECONDS:
        pause = 0.0
    client = schedule_flag_client()
    if client is None:
        return 0.0
    try:
        client.set(SCHEDULE_LAST_PASS_KEY, f"{time.time():.6f} {pause:.6f}", ex=60)
    except Exception:  # noqa: BLE001 - pacing only saves work
        log.warning("schedule pacing: Redis error", exc_info=True)
        return 0.0
    return pause


def pass_pause_remaining() -> float:
    """Seconds until the pause after the last recorded pass ends (0 when it has, or without Redis)."""
    client = schedule_flag_client()
    if client is None:
        return 0.0
    try:
        value = client.get(SCHEDULE_LAST_PASS_KEY)
    except Exception:  # noqa: BLE001 - pacing only saves work
        log.warning("schedule pacing: Redis error", exc_info=True)
        return 0.0
    if not value:
        return 0.0
    ended, pause = (float(x) for x in value.split())
    return max(0.0, ended + pause - time.time())


def defer_schedule(countdown_s: float, *, own_flag: bool) -> None:
    """Publish a scheduling pass to run in ``countdown_s`` seconds, with the flag set for it.

    ``own_flag``: the caller is the published pass that holds the flag (it has not cleared it), and hands
    the flag to its deferred copy. Otherwise the copy is published only if the flag is free (SET NX): a
    set flag means a pass is already on its way, and it will pace itself.
    """
    client = schedule_flag_client()
    if client is not None:
        try:
            if own_flag:
                client.set(SCHEDULE_PENDING_KEY, "1", ex=SCHEDULE_PENDING_TTL)
            elif not client.set(SCHEDULE_PENDING_KEY, "1", nx=True, ex=SCHEDULE_PENDING_TTL):
                return
        except Exception:  # noqa: BLE001 - publish anyway
            log.warning("schedule flag: Redis error", exc_info=True)
    schedule_pending.apply_async(countdown=countdown_s)


def clear_schedule_flag() -> None:
    """Clear the "pass published" flag; called by the pass before it reads the queue."""
    client = schedule_flag_client()
    if client is None:
        return
    try:
        client.delete(SCHEDULE_PENDING_KEY)
    except Exception:  # noqa: BLE001 - the flag expires by itself within SCHEDULE_PENDING_TTL
        log.warning("schedule flag: Redis error on delete", exc_info=True)


class ScheduleNotifier:
    """Publishes scheduling passes for this process's submissions from one background thread.

    ``notify()`` (called on commit) only counts the request and wakes the thread; the thread reads
    the count, then calls ``publish_schedule``. Every ``notify`` is therefore followed by a
    ``publish_schedule`` that starts after it, so the ordering argument of ``publish_schedule``
    holds for every committed job, while a burst of submissions in one process costs one Redis
    round trip instead of one each (the thread publishes at most once per ``coalesce_seconds``) and
    no request waits on Redis. The thread is started lazily per process (after a fork, anew). A
    notification still pending when the process exits is published by an ``atexit`` hook; one lost
    to a crash is picked up by the periodic pass (``SCHEDULE_INTERVAL_SECONDS``).
    """

    #: Seconds the thread waits after each publish before the next (see ``_run``); a pass is published at
    #: most this much later than without it.
    coalesce_seconds = 0.02

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a child has no thread, and the parent's locks may be held

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._requested = 0  # notifications so far
        self._done = 0  # notifications whose publish has returned
        self._thread: threading.Thread | None = None

    def notify(self) -> None:
        """Ask for a scheduling pass: published soon, from the notifier thread (microseconds here).

        With eager Celery (``CELERY_TASK_ALWAYS_EAGER``) the pass runs here, in the caller's thread and
        database connection, as an eager task must.
        """
        from controlplane.celery import app

        if app.conf.task_always_eager:
            publish_schedule()
            return
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="schedule-notifier", daemon=True)
                self._thread.start()
            self._requested += 1
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._requested > self._done)
                target = self._requested  # read after the notifications it covers: the publish below follows them
            try:
                publish_schedule()
            except Exception:  # noqa: BLE001 - broker trouble: the periodic pass is the safety net
                log.warning("schedule notifier: publishing a pass failed", exc_info=True)
            with self._cond:
                self._done = target
                self._cond.notify_all()
            # Gather the notifications of the next few milliseconds into one publish: under a stream of
            # submissions this halved Redis's CPU per job in benchmarks/submit.py, and passes are paced far
            # coarser than this anyway (SCHEDULE_PASS_PAUSE_*).
            time.sleep(self.coalesce_seconds)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every notification made so far is published (tests, process exit); False on timeout."""
        with self._cond:
            target = self._requested
            return self._cond.wait_for(lambda: self._done >= target or self._thread is None, timeout)


#: The process's notifier (``enqueue_schedule(background=True)``).
SCHEDULE_NOTIFIER = ScheduleNotifier()
atexit.register(SCHEDULE_NOTIFIER.flush, 2.0)


def enqueue_schedule(*, background: bool = False) -> None:
    """Run a scheduling pass after the current transaction commits (coalesced on a Redis broker).

    ``background``: published by this process's ``ScheduleNotifier`` thread, so the caller never waits on
    the broker (the API's submissions); otherwise published in the committing thread (workers, whose
    pool processes may end with ``os._exit`` and would take a pending notification with them).
    """
    transaction.on_commit(SCHEDULE_NOTIFIER.notify if background else publish_schedule)


def enqueue_dispatch(attempt_id: int) -> None:
    """Dispatch ``attempt_id`` after the current transaction commits."""
    transaction.on_commit(lambda: dispatch_attempt.delay(attempt_id))


def enqueue_cancel(job_id: int) -> None:
    """Delete a cancelled job's objects after the current transaction commits."""
    transaction.on_commit(lambda: cancel_job_objects.delay(job_id))


def enqueue_delete_attempt(attempt_id: int) -> None:
    """Delete a preempted attempt's objects after the current transaction commits."""
    transaction.on_commit(lambda: delete_attempt_objects.delay(attempt_id))


@shared_task(name="jobs.tasks.schedule_pending", ignore_result=True)
def schedule_pending() -> dict:
    """A scheduling pass (periodic, and after each submission or end of an attempt), coalesced.

    Many submissions each enqueue a pass; one pass serves them all, so a
    task that finds another pass running returns at once (see
    ``jobs.scheduler.schedule_coalesced``).
    """
    from .scheduler import schedule_coalesced

    result = schedule_coalesced()
    if result is None:
        return {"coalesced": True}
    return {"admitted": len(result.admitted), "waiting": result.waiting, "rejected": result.rejected}


@shared_task(
    name="jobs.tasks.dispatch_attempt", bind=True, acks_late=True, reject_on_worker_lost=True,
    autoretry_for=(TransientDispatchError,), retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=8,
    ignore_result=True,
)
def dispatch_attempt(self, attempt_id: int) -> str:
    """Create attempt ``attempt_id``'s objects on its cluster and move its job ADMITTED -> STARTING.

    A no-op when the job moved on or the attempt is not its current one.
    Transient backend errors retry with exponential backoff; a permanent one
    ends the attempt and fails the job with the backend's message.
    """
    from .lifecycle import end_attempt, mark_started
    from .states import StaleState

    attempt = JobAttempt.objects.select_related("job__team").get(pk=attempt_id)
    job = attempt.job
    if job.state != JobState.ADMITTED or job.current_attempt_id != attempt.pk or attempt.ended_at is not None:
        return "skipped"
    attach_placement_rows(attempt)
    try:
        with metrics.DISPATCH_SECONDS.time():
            runner_state = backend_for(attempt.cluster).dispatch(attempt)
    except TransientDispatchError:
        metrics.DISPATCH_ERRORS.labels(kind="transient").inc()
        raise  # autoretry_for retries it with backoff
    except (PermanentDispatchError, UnknownBackend) as exc:
        metrics.DISPATCH_ERRORS.labels(kind="unknown_backend" if isinstance(exc, UnknownBackend) else "permanent").inc()
        try:
            end_attempt(job, attempt, JobState.FAILED, reason=f"dispatch failed: {exc}",
                        end_reason=JobAttempt.EndReason.DISPATCH_ERROR, message=str(exc))
        except StaleState:
            pass
        return "failed"
    try:
        mark_started(job, attempt, runner_state)
    except StaleState:
        return "raced"  # another dispatch, or a cancel, moved the job first; reconcile deletes orphans
    return "dispatched"


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


@shared_task(name="jobs.tasks.cancel_job_objects", bind=True, ignore_result=True, max_retries=None)
def cancel_job_objects(self, job_id: int) -> bool:
    """Delete a CANCELLING job's objects; until the cluster confirms, periodic reconcile retries."""
    from .lifecycle import finish_cancel

    return finish_cancel(job_id)


@shared_task(name="jobs.tasks.reconcile_all", ignore_result=True)
def reconcile_all() -> list:
    """Periodic reconcile of every cluster, then a scheduling pass for the capacity it freed."""
    from .reconcile import reconcile_all as run

    results = run()
    schedule_pending.delay()
    return results


@shared_task(
    name="jobs.tasks.delete_attempt_objects", bind=True, acks_late=True, reject_on_worker_lost=True,
    autoretry_for=(TransientDispatchError,), retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=8,
    ignore_result=True,
)
def delete_attempt_objects(self, attempt_id: int) -> bool:
    """Delete the objects of an ended (preempted) attempt on its cluster; True when the backend confirms they are gone.

    Idempotent; a live attempt is left alone. Whatever stays behind is
    removed by reconcile's orphan cleanup.
    """
    attempt = JobAttempt.objects.select_related("job__team", "cluster", "node_pool__accelerator").get(pk=attempt_id)
    if attempt.ended_at is None:
        return False
    try:
        return bool(backend_for(attempt.cluster).delete(attempt))
    except UnknownBackend:
        log.warning("attempt %s: cluster %s has an unknown backend; left to reconcile", attempt_id, attempt.cluster)
        return False
