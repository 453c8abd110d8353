"""The Celery task of autoscaled serving (beat: ``AUTOSCALE_INTERVAL_SECONDS``)."""

from __future__ import annotations

from celery import shared_task

from .autoscaler import autoscale


@shared_task(name="serving.tasks.autoscale_serving", ignore_result=True, soft_time_limit=60, time_limit=75)
def autoscale_serving() -> list[dict]:
    """One autoscaling pass over the RUNNING serving jobs with ``spec.autoscaling`` (``serving.autoscaler``)."""
    return autoscale()
