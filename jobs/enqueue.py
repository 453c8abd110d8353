"""Work handed to Celery when the current transaction commits: a scheduling pass, a dispatch, a deletion, an accrual.

The one place the job services (lifecycle, scheduling) reach tasks from.
Tasks are looked up by their registered names (the names beat schedules
use too), never imported, so these services sit below ``jobs.tasks``,
which calls them.
"""

from __future__ import annotations

from django.db import transaction

from .scheduling.pacing import SCHEDULE_NOTIFIER, publish_schedule, registered_task

DISPATCH_TASK = "jobs.tasks.dispatch_attempt"
CANCEL_TASK = "jobs.tasks.cancel_job_objects"
DELETE_ATTEMPT_TASK = "jobs.tasks.delete_attempt_objects"
ACCRUE_ATTEMPT_TASK = "costs.tasks.accrue_attempt"


def _on_commit(task_name: str, *args) -> None:
    transaction.on_commit(lambda: registered_task(task_name).delay(*args))


def enqueue_schedule(*, background: bool = False) -> None:
    """Run a scheduling pass after the current transaction commits (coalesced on a Redis broker).

    ``background``: published by this process's ``ScheduleNotifier`` thread, so the caller never waits on
    the broker (the API's submissions); otherwise published in the committing thread (workers, whose
    pool processes may end with ``os._exit`` and would take a pending notification with them).
    """
    transaction.on_commit(SCHEDULE_NOTIFIER.notify if background else publish_schedule)


def enqueue_dispatch(attempt_id: int) -> None:
    """Dispatch ``attempt_id`` after the current transaction commits."""
    _on_commit(DISPATCH_TASK, attempt_id)


def enqueue_cancel(job_id: int) -> None:
    """Delete a cancelled job's objects after the current transaction commits."""
    _on_commit(CANCEL_TASK, job_id)


def enqueue_delete_attempt(attempt_id: int) -> None:
    """Delete a preempted attempt's objects after the current transaction commits."""
    _on_commit(DELETE_ATTEMPT_TASK, attempt_id)


def enqueue_final_accrual(attempt_id: int) -> None:
    """Write the last ledger entries of an ended attempt after the current transaction commits."""
    _on_commit(ACCRUE_ATTEMPT_TASK, attempt_id)
