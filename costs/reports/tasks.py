"""Celery task of reports: scheduled report generation (fired by django-celery-beat's PeriodicTask rows).

``costs.tasks`` imports this module, so the worker's autodiscovery registers the task.
"""

from __future__ import annotations

from celery import shared_task

from . import build

# The registered name is the one stored in the report schedules' PeriodicTask.task column
# (``costs.reports.schedules.TASK``): renaming it would orphan every existing schedule.
TASK_NAME = "frontend.tasks.generate_reports"


# Slow queue. Minutes at most (a report per team, its charts and its mail); the hard limit stays under the broker's
# visibility timeout (300 s), or a report still running would be delivered to a second worker.
@shared_task(name=TASK_NAME, ignore_result=True, acks_late=True, reject_on_worker_lost=True,
             soft_time_limit=240, time_limit=270)
def generate_reports(period: str, scope: str = "all") -> list[int]:
    """Generate the ``period`` (``daily`` or ``weekly``) reports of ``scope`` (``all``, ``platform`` or a team slug)
    for the last complete period, and e-mail the new ones; returns the report ids.

    Idempotent: a redelivered message refreshes the same Report rows and sends no second e-mail.
    """
    return build.generate_reports(period, scope)
