"""Celery tasks of the web UI app: scheduled report generation (fired by django-celery-beat's PeriodicTask rows)."""

from __future__ import annotations

from celery import shared_task

from . import reports


@shared_task(name="frontend.tasks.generate_reports", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def generate_reports(period: str, scope: str = "all") -> list[int]:
    """Generate the ``period`` (``daily`` or ``weekly``) reports of ``scope`` (``all``, ``platform`` or a team slug)
    for the last complete period, and e-mail the new ones; returns the report ids.

    Idempotent: a redelivered message refreshes the same Report rows and sends no second e-mail.
    """
    return reports.generate_reports(period, scope)
