"""Celery tasks of reports: the task each report schedule fires (django-celery-beat's PeriodicTask rows) and the
periodic catch-up of missed periods (``CELERY_BEAT_SCHEDULE``); both in ``costs.reports.catchup``.

``costs.tasks`` imports this module, so the worker's autodiscovery registers the tasks.
"""

from __future__ import annotations

from celery import shared_task

from . import catchup
from .schedules import TASK_NAME

CATCH_UP_TASK_NAME = "costs.tasks.catch_up_reports"


# Slow queue. Minutes at most (a report per team and missed period, its charts and its mail); the hard limit stays
# under the broker's visibility timeout (300 s), or a report still running would be delivered to a second worker.
# Each report is committed on its own, so a run stopped by its soft limit keeps what it built; the next run goes on.
@shared_task(name=TASK_NAME, ignore_result=True, acks_late=True, reject_on_worker_lost=True,
             soft_time_limit=240, time_limit=270)
def generate_reports(period: str, scope: str = "all") -> list[int]:
    """Build the ``period`` (``daily`` or ``weekly``) reports of ``scope`` (``all``, ``platform`` or a team slug)
    for the last complete period and every missed one of the catch-up window, and mail each new one once;
    returns the ids of the reports built.

    Idempotent: a redelivered message, or two workers running it at once, build and mail nothing twice.
    """
    return [r.pk for r in catchup.run_schedule(period, scope).built]


@shared_task(name=CATCH_UP_TASK_NAME, ignore_result=True, acks_late=True, reject_on_worker_lost=True,
             soft_time_limit=240, time_limit=270)
def catch_up_reports() -> list[int]:
    """Build the reports of every enabled schedule whose time came but that have none (beat or the workers were
    down), and mail those not mailed yet; returns the ids of the reports built. Idempotent, as above."""
    return [r.pk for r in catchup.catch_up().built]
