"""When scheduling passes are published and run: the "pass published" flag, the notifier, the pause, the lock.

Many submissions each ask for a pass; one pass serves them all. On a Redis
broker a flag (``SET NX``) lets only the first ask publish, this process's
``ScheduleNotifier`` thread gathers the asks of a burst into one publish,
a pause after a long pass spaces passes out under a storm, and a PostgreSQL
advisory lock lets one process at a time run the passes that serve
submissions (``passes.schedule_coalesced`` puts these together; its
docstring gives the ordering argument). None of this decides correctness:
admission holds its own row locks, and the periodic pass catches anything
a lost message left.

The scheduling task is reached by its registered name (``SCHEDULE_TASK``)
through the current Celery app, so nothing here imports the task modules.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time

from celery import current_app
from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

#: The Celery task that runs a coalesced pass (``jobs.tasks.schedule_pending``; beat schedules name it too).
SCHEDULE_TASK = "jobs.tasks.schedule_pending"

#: Redis key (on the broker's Redis) that says "a scheduling pass is published and has not started yet".
SCHEDULE_PENDING_KEY = "controlplane:schedule-pending"
#: Seconds the flag lives at most: bounds how long a lost task can suppress publishes
#: (the periodic pass, every 10 s, is the safety net meanwhile).
SCHEDULE_PENDING_TTL = 30
#: Redis key holding ``"<unix end time> <pause seconds>"`` of the last pass (see ``record_pass``).
SCHEDULE_LAST_PASS_KEY = "controlplane:schedule-last-pass"
#: Key of the PostgreSQL advisory lock held by the process that runs the passes serving queued submissions.
SCHEDULER_LOCK_KEY = 0x6A6F6273  # "jobs"

_redis_client = None
_redis_url = None


def registered_task(name: str):
    """The Celery task registered as ``name`` in the current app.

    A process that has not imported the task modules yet (a web worker, the
    tests) imports them first: every installed app's ``tasks.py``, found
    through Celery's Django fixup (``autodiscover_tasks(force=True)``), not
    ``loader.import_default_modules``, whose signal makes the fixup run
    ``django.setup()`` again and so rebuild the logging handlers on whatever
    stderr is current (in tests, a captured stream that is later closed).
    Raises KeyError for a name no app registers.
    """
    try:
        return current_app.tasks[name]
    except KeyError:
        current_app.autodiscover_tasks(force=True)
        return current_app.tasks[name]


def schedule_flag_client():
    """The broker's Redis (a cached ``redis.Redis``), or None when the broker is not Redis.

    The URL is the Celery app's ``broker_url``, i.e. ``settings.CELERY_BROKER_URL``
    (read by the app), so the flag lives where the tasks are published even
    when a test repoints the app. Cached per process and per URL.
    """
    global _redis_client, _redis_url

    url = str(current_app.conf.broker_url or "")
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
    (``passes.schedule_coalesced``) *before* it reads the queue, so a job
    committed before a failed SET NX is read by the pass that clears the
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
        registered_task(SCHEDULE_TASK).delay()
    except Exception:
        if client is not None:  # the flag this call set announces a pass that was never published: free it
            try:
                client.delete(SCHEDULE_PENDING_KEY)
            except Exception:  # noqa: BLE001 - it expires within SCHEDULE_PENDING_TTL anyway
                pass
        raise
    return True


def record_pass(duration_s: float) -> float:
    """Record that a pass of ``duration_s`` seconds just ended; returns the pause (seconds) before the next one.

    The pause is ``min(duration_s x SCHEDULE_PASS_PAUSE_FACTOR, SCHEDULE_PASS_PAUSE_MAX_SECONDS)``; 0 after
    a pass shorter than ``SCHEDULE_PASS_PAUSE_MIN_SECONDS`` (a short queue is not worth deferring for), and
    0 without a Redis broker.
    """
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
    registered_task(SCHEDULE_TASK).apply_async(countdown=countdown_s)


def clear_schedule_flag() -> None:
    """Clear the "pass published" flag; called by the pass before it reads the queue."""
    client = schedule_flag_client()
    if client is None:
        return
    try:
        client.delete(SCHEDULE_PENDING_KEY)
    except Exception:  # noqa: BLE001 - the flag expires by itself within SCHEDULE_PENDING_TTL
        log.warning("schedule flag: Redis error on delete", exc_info=True)


@contextlib.contextmanager
def scheduler_lock():
    """Hold the advisory lock ``SCHEDULER_LOCK_KEY`` for the block if no other session holds it; yields whether it
    got it (PostgreSQL only: the caller checks the vendor). Released when the block ends, also on errors."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [SCHEDULER_LOCK_KEY])
        got = cursor.fetchone()[0]
    if not got:
        yield False
        return
    try:
        yield True
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [SCHEDULER_LOCK_KEY])


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
        if current_app.conf.task_always_eager:
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


#: The process's notifier (``jobs.enqueue.enqueue_schedule(background=True)``).
SCHEDULE_NOTIFIER = ScheduleNotifier()
atexit.register(SCHEDULE_NOTIFIER.flush, 2.0)
