"""The Celery task of autoscaled serving (beat: ``AUTOSCALE_INTERVAL_SECONDS``)."""

from __future__ import annotations

from celery import shared_task

from .autoscaler import autoscale
from .rollout import step_rollouts


@shared_task(name="serving.tasks.autoscale_serving", ignore_result=True, soft_time_limit=60, time_limit=75)
def autoscale_serving() -> list[dict]:
    """One step of every rolling update (``serving.rollout``), then one autoscaling pass over the RUNNING serving
    jobs with ``spec.autoscaling`` (``serving.autoscaler``, which leaves a job alone while it rolls out); the
    results of both."""
    return [*step_rollouts(), *autoscale()]
