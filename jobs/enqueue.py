"""Work handed to Celery when the current transaction commits: a scheduling pass, a dispatch, a deletion, an accrual,
an end record brought up to date.

A publish that the broker refuses never fails the committed change (no 500 after a commit): the task is kept in
the outbox (``OutboxTask``) and ``send_outbox`` (a beat task) sends it once the broker is back; a scheduling
pass that could not be published is run by beat's periodic pass anyway.

The one place the job services (lifecycle, scheduling) reach tasks from.
Tasks are looked up by their registered names (the names beat schedules
use too), never imported, so these services sit below ``jobs.tasks``,
which calls them.
"""

from __future__ import annotations

import logging

from celery.exceptions import SoftTimeLimitExceeded
from django.db import transaction

from .scheduling.pacing import SCHEDULE_NOTIFIER, publish_schedule, registered_task

log = logging.getLogger(__name__)

DISPATCH_TASK = "jobs.tasks.dispatch_attempt"
DISPATCH_MANY_TASK = "jobs.tasks.dispatch_attempts"
CANCEL_TASK = "jobs.tasks.cancel_job_objects"
DELETE_ATTEMPT_TASK = "jobs.tasks.delete_attempt_objects"
ACCRUE_ATTEMPT_TASK = "costs.tasks.accrue_attempt"
RECORD_END_TASK = "jobs.tasks.record_attempt_end"

#: How long a publish after commit may retry (kombu's retry policy: seconds): the caller (an API request) waits
#: at most about this long before the task goes to the outbox instead.
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.25, "interval_max": 0.25}


def publish_or_keep(task_name: str, args: list) -> bool:
    """Publish ``task_name(*args)``; when the broker refuses, keep it in the outbox (``OutboxTask``) for
    ``send_outbox``. True when published. Never raises: the change that asked for the task is committed."""
    try:
        registered_task(task_name).apply_async(args, retry=True, retry_policy=PUBLISH_RETRY_POLICY)
        return True
    except Exception as exc:  # noqa: BLE001 - broker down: keep the task, the committed change stands
        log.warning("broker unavailable, %s%s kept in the outbox: %r", task_name, tuple(args), exc)
        keep(task_name, args, exc)
        return False


def keep(task_name: str, args: list, exc: BaseException) -> None:
    """Store the task in the outbox; if the database is down too, log it (the periodic passes, the reconcile
    sweep and the accrual pass then redo what it would have done)."""
    from .models import OutboxTask

    try:
        OutboxTask.objects.create(task=task_name, args=list(args), last_error=repr(exc)[:500])
    except Exception:  # noqa: BLE001
        log.error("task %s%s lost: neither the broker nor the database took it", task_name, tuple(args),
                  exc_info=True)


def send_outbox(limit: int = 500) -> int:
    """Publish up to ``limit`` kept tasks in id order, deleting each one the broker took; stops at the first
    refusal (the broker is still down). Returns how many were sent. Rows another sweeper holds are skipped."""
    from .models import OutboxTask

    sent = 0
    with transaction.atomic():
        for row in OutboxTask.objects.select_for_update(skip_locked=True).order_by("pk")[:limit]:
            try:
                registered_task(row.task).apply_async(row.args, retry=True, retry_policy=PUBLISH_RETRY_POLICY)
            except SoftTimeLimitExceeded:  # the sweep's time is up, not the broker: the rows stay for the next one
                raise
            except Exception as exc:  # noqa: BLE001 - still down: the next sweep retries
                OutboxTask.objects.filter(pk=row.pk).update(attempts=row.attempts + 1, last_error=repr(exc)[:500])
                break
            row.delete()
            sent += 1
    if sent:
        log.info("outbox: %d kept task(s) sent", sent)
    return sent


def _on_commit(task_name: str, *args) -> None:
    transaction.on_commit(lambda: publish_or_keep(task_name, list(args)), robust=True)


def _publish_schedule_or_log() -> None:
    try:
        publish_schedule()
    except Exception:  # noqa: BLE001 - broker down: beat's periodic pass (SCHEDULE_INTERVAL_SECONDS) is the net
        log.warning("broker unavailable: scheduling pass not published; the periodic pass will run it",
                    exc_info=True)


def enqueue_schedule(*, background: bool = False) -> None:
    """Run a scheduling pass after the current transaction commits (coalesced on a Redis broker).

    ``background``: published by this process's ``ScheduleNotifier`` thread, so the caller never waits on
    the broker (the API's submissions); otherwise published in the committing thread (workers, whose
    pool processes may end with ``os._exit`` and would take a pending notification with them).
    """
    transaction.on_commit(SCHEDULE_NOTIFIER.notify if background else _publish_schedule_or_log, robust=True)


def enqueue_dispatch(attempt_id: int) -> None:
    """Dispatch ``attempt_id`` after the current transaction commits."""
    _on_commit(DISPATCH_TASK, attempt_id)


#: Attempts per ``dispatch_attempts`` message (docs/adr/0047): the task's fixed costs (a Celery message, the read of
#: the rows, the transaction recording the started) shared by this many, while a scheduling pass that admits
#: hundreds still spreads them over every worker of the fast queue (benchmarks/dispatch.py).
DISPATCH_BATCH = 25


def dispatch_batches(attempts: list[tuple[int, int]], size: int = DISPATCH_BATCH) -> list[list[int]]:
    """``(attempt id, cluster id)`` pairs -> lists of at most ``size`` attempt ids, each of one cluster (so a
    cluster that does not answer holds up its own attempts alone), in the order given within a cluster."""
    by_cluster: dict[int, list[int]] = {}
    for attempt_id, cluster_id in attempts:
        by_cluster.setdefault(cluster_id, []).append(attempt_id)
    return [ids[start:start + size] for ids in by_cluster.values() for start in range(0, len(ids), size)]


def enqueue_dispatches(attempts: list[tuple[int, int]]) -> None:
    """Dispatch the attempts of ``(attempt id, cluster id)`` pairs after the current transaction commits: one
    ``dispatch_attempts`` task per batch of ``dispatch_batches``."""
    for batch in dispatch_batches(attempts):
        _on_commit(DISPATCH_MANY_TASK, batch)


def enqueue_cancel(job_id: int) -> None:
    """Delete a cancelled job's objects after the current transaction commits."""
    _on_commit(CANCEL_TASK, job_id)


def enqueue_delete_attempt(attempt_id: int) -> None:
    """Delete a preempted attempt's objects after the current transaction commits."""
    _on_commit(DELETE_ATTEMPT_TASK, attempt_id)


def enqueue_record_end(attempt_id: int) -> None:
    """Move the end record of an ended attempt on its cluster to the attempt's end after the current transaction
    commits (``jobs.lifecycle.record_end``)."""
    _on_commit(RECORD_END_TASK, attempt_id)


def enqueue_final_accrual(attempt_id: int) -> None:
    """Write the last ledger entries of an ended attempt after the current transaction commits."""
    _on_commit(ACCRUE_ATTEMPT_TASK, attempt_id)
