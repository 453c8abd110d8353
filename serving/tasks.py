"""The Celery task of autoscaled serving (beat: ``AUTOSCALE_INTERVAL_SECONDS``)."""

from __future__ import annotations

from celery import shared_task

from .autoscaler import autoscale
from .follow import follow_checkpoints
from .rollout import step_rollouts


@shared_task(name="serving.tasks.autoscale_serving", ignore_result=True, soft_time_limit=60, time_limit=75)
def autoscale_serving() -> list[dict]:
    """The rollouts of serving jobs that follow a training job whose newer run succeeded (``serving.follow``), one
    step of every rolling update (``serving.rollout``), then one autoscaling pass over the RUNNING serving jobs with
    ``spec.autoscaling`` (``serving.autoscaler``, which leaves a job alone while it rolls out); the results of
    all three."""
    return [*follow_checkpoints(), *step_rollouts(), *autoscale()]
