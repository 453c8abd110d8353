"""The report schedules: django-celery-beat rows (editable afterwards in the Django admin), their defaults, and when
each one runs for a period (what the catch-up of missed periods goes by, ``costs.reports.catchup``)."""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass

from django.db import transaction
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from quotas.models import Team

log = logging.getLogger(__name__)

# The Celery task every report schedule fires. Its registered name is the one stored in the schedules'
# PeriodicTask.task column: renaming it would orphan every existing schedule.
TASK_NAME = "frontend.tasks.generate_reports"
TASK = TASK_NAME

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


@dataclass(frozen=True)
class Schedule:
    """One enabled report schedule: its period kind (``daily``, ``weekly``), scope (``all``, ``platform`` or a team
    slug) and PeriodicTask row."""

    kind: str
    scope: str
    task: PeriodicTask

    def runs_for(self, period_end: dt.datetime) -> dt.datetime:
        """When this schedule first runs at or after ``period_end`` (aware UTC): the report of a period that ended
        then is due from that instant. A crontab's next time (Celery's ``crontab.remaining_delta``); a schedule
        of another type (interval, clocked, solar) is due at the period's end."""
        if self.task.crontab is None:
            return period_end
        start, delta, _ = self.task.crontab.schedule.remaining_delta(period_end - dt.timedelta(microseconds=1))
        return (start + delta).astimezone(dt.timezone.utc)


def enabled_schedules(kinds) -> list[Schedule]:
    """The enabled PeriodicTask rows that fire the report task for a period kind in ``kinds``, one per (kind,
    scope) (the first by name when several name the same). A row whose kwargs cannot be read is left out, with a
    warning in the log."""
    found: dict[tuple[str, str], Schedule] = {}
    for task in PeriodicTask.objects.filter(task=TASK_NAME, enabled=True).select_related("crontab").order_by("name"):
        try:
            kwargs = json.loads(task.kwargs or "{}")
            kind, scope = kwargs["period"], str(kwargs.get("scope", "all"))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("report schedule %r has unreadable kwargs %r: left out of the catch-up", task.name, task.kwargs)
            continue
        if kind in kinds:
            found.setdefault((kind, scope), Schedule(kind, scope, task))
    return list(found.values())
