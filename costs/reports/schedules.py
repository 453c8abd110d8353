"""The default report schedules as django-celery-beat rows, editable afterwards in the Django admin."""

from __future__ import annotations

import json

from django.db import transaction
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from quotas.models import Team

from .tasks import TASK_NAME as TASK  # the Celery task every report schedule fires

# Minute, hour, day of week (UTC): daily at 06:00, weekly on Monday at 06:30, after the day's rollups.
CRONTABS = {"daily": ("0", "6", "*"), "weekly": ("30", "6", "1")}


def schedule_name(period: str, scope: str) -> str:
    """The PeriodicTask name of one schedule, e.g. ``report daily team alpha`` or ``report weekly platform``."""
    return f"report {period} platform" if scope == "platform" else f"report {period} team {scope}"


def ensure_report_schedules() -> list[PeriodicTask]:
    """Create the missing daily and weekly report schedules: one per team and one platform-wide.

    Idempotent: existing rows (found by name) are left as they are, so edits
    made in the admin (crontab, enabled flag) survive. Returns every
    report schedule of the current teams and the platform.
    """
    tasks = []
    with transaction.atomic():
        for period, (minute, hour, day_of_week) in CRONTABS.items():
            crontab, _ = CrontabSchedule.objects.get_or_create(
                minute=minute, hour=hour, day_of_week=day_of_week, day_of_month="*", month_of_year="*", timezone="UTC")
            for scope in ["platform", *Team.objects.values_list("slug", flat=True)]:
                task, _ = PeriodicTask.objects.get_or_create(
                    name=schedule_name(period, scope),
                    defaults={"task": TASK, "crontab": crontab,
                              "kwargs": json.dumps({"period": period, "scope": scope})},
                )
                tasks.append(task)
    return tasks
