"""Scheduled reports of every period, those missed while beat or the workers were down included: built when they
return, one per scope and period, each mailed once.

A report schedule (``costs.reports.schedules``) used to build only the last
complete period before the moment it ran, so a beat or worker outage across
several of its times left every period but the last without a report (beat
runs a missed crontab once when it returns, not once per time missed). Here
each run covers the last ``REPORTS_CATCHUP_PERIODS`` complete periods of its
kind instead, and builds the ones without a report:

- the task a schedule fires (``run_schedule``) covers its kind and scope, the
  last complete period (the one it fires for) included;
- the catch-up task (``catch_up``, every ``REPORTS_CATCHUP_INTERVAL_SECONDS``
  from ``CELERY_BEAT_SCHEDULE``) covers every enabled schedule; it also mails
  what a failed mail left unmailed.

Both build a period only once its schedule's time has come
(``Schedule.runs_for``), never a day's report before its 06:00 run would,
with the day's late scrapes and accrual still missing.

Invariant: after either run at instant ``now``, each scope of an enabled
schedule has exactly one report per complete period of the window whose
schedule time is at or before ``now`` (periods that ended before the team
existed are left out, but for the last one, which the schedule always
builds), and each of them has been mailed exactly once. Duplicate deliveries
and concurrent runs are safe: a report is inserted, never upserted, under
the unique constraint of ``Report`` (scope, kind, period start), so the
second builder finds the row that won and builds nothing; mailing claims the
row by compare-and-set of ``mailed_at`` (NULL to now) in the transaction that
sends it, so a concurrent claim waits for it and then finds the row taken; a
mail that fails rolls its claim back for the next run to retry (a mail server
that accepted a message just before the database failed to commit can still
get it twice: at least once, never zero times). An outage longer than the
window leaves its older periods without a scheduled report: the bound keeps
the work of one run to (teams + 1) x REPORTS_CATCHUP_PERIODS reports per kind;
those periods can be asked for on demand (``POST /api/v1/reports/``).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Callable

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Min
from django.utils import timezone

from quotas.models import Team

from ..models import Report
from .build import PERIOD_LENGTH, build_report_data, period_window
from .mail import send_report
from .render import render_csv, render_html
from .schedules import enabled_schedules

log = logging.getLogger(__name__)

Period = tuple[dt.datetime, dt.datetime]


@dataclass
class Covered:
    """What one run did: the reports it built and mailed, and how many of the window's reports were already there."""

    built: list[Report] = field(default_factory=list)
    mailed: list[Report] = field(default_factory=list)
    present: int = 0

    def add(self, other: Covered) -> None:
        self.built += other.built
        self.mailed += other.mailed
        self.present += other.present


def recent_periods(kind: str, now: dt.datetime, count: int) -> list[Period]:
    """The last ``count`` (at least 1) complete periods of ``kind`` before ``now``, newest first, as aware UTC
    ``[start, end)`` (``costs.reports.build.period_window``). Raises KeyError for an unknown kind."""
    length = PERIOD_LENGTH[kind]
    start, end = period_window(kind, now)
    return [(start - i * length, end - i * length) for i in range(max(1, count))]


def scope_teams(scope: str) -> list[Team | None]:
    """The scopes a schedule's ``scope`` names: ``all`` (every team, then the platform: None), ``platform`` or a
    team slug. Raises Team.DoesNotExist for an unknown slug."""
    if scope == "all":
        return [*Team.objects.all(), None]
    if scope == "platform":
        return [None]
    return [Team.objects.get(slug=scope)]


def _existed_since(team: Team | None) -> dt.datetime | None:
    """When the scope began: the team's creation; for the platform, the first team's (None without any team)."""
    if team is not None:
        return team.created_at
    return Team.objects.aggregate(first=Min("created_at"))["first"]


def build_once(team: Team | None, kind: str, start: dt.datetime, end: dt.datetime, source: str) -> Report | None:
    """Insert the ``kind`` report of ``team`` (None: platform) for ``[start, end)``; None when a concurrent or
    earlier run inserted it first (the unique constraint of ``Report``), which is then left as it is."""
    data = build_report_data(team, start, end)
    try:
        with transaction.atomic():
            return Report.objects.create(team=team, kind=kind, period_start=start, period_end=end, source=source,
                                         data=data, html=render_html(data), csv=render_csv(data))
    except IntegrityError:
        return None


def mail_once(report: Report) -> bool:
    """Mail ``report`` unless it was mailed already: claim it by compare-and-set of ``mailed_at`` and send in that
    transaction. True when this call claimed it (a scope without recipients counts as mailed); False when another
    run had, or when sending failed (an OSError, ``smtplib.SMTPException`` included: the claim is rolled back and
    the next run tries again)."""
    try:
        with transaction.atomic():
            claimed = Report.objects.filter(pk=report.pk, mailed_at__isnull=True).update(mailed_at=timezone.now())
            if claimed:
                send_report(report)
    except OSError:
        log.exception("report %s: its mail was not sent; the next run tries again", report)
        return False
    return bool(claimed)


def cover(kind: str, teams: list[Team | None], now: dt.datetime, *,
          due: Callable[[dt.datetime], dt.datetime] | None = None, latest_source: str = Report.Source.SCHEDULE
          ) -> Covered:
    """Build the missing ``kind`` reports of each scope in ``teams`` over the last ``REPORTS_CATCHUP_PERIODS``
    complete periods before ``now``, then mail every one of them not mailed yet (see the module's invariant).

    ``due(period_end)``: when a period's report is due (None: every complete period is). The newest period's
    report is recorded with ``latest_source``, older ones as ``catch-up``. Logs one line per scope that says
    what was built and mailed. Returns what was done.
    """
    periods = recent_periods(kind, now, settings.REPORTS_CATCHUP_PERIODS)
    latest = periods[0]
    done = Covered()
    for team in teams:
        since = _existed_since(team)
        wanted = [p for p in reversed(periods) if (due is None or due(p[1]) <= now)
                  and (p == latest or (since is not None and p[1] > since))]
        starts = [start for start, _ in wanted]
        existing = set(Report.objects.filter(team=team, kind=kind, period_start__in=starts)
                       .values_list("period_start", flat=True))
        scope = Covered(present=len(existing))
        for start, end in wanted:
            if start not in existing:
                source = latest_source if (start, end) == latest else Report.Source.CATCH_UP
                report = build_once(team, kind, start, end, source)
                if report is not None:
                    scope.built.append(report)
        unmailed = Report.objects.filter(team=team, kind=kind, period_start__in=starts, mailed_at__isnull=True)
        scope.mailed = [r for r in unmailed.select_related("team").order_by("period_start") if mail_once(r)]
        if scope.built or scope.mailed:
            log.info("reports %s %s: built %s; mailed %s; %d already there", kind, team.slug if team else "platform",
                     ", ".join(f"{r.period_start:%Y-%m-%d} ({r.source})" for r in scope.built) or "none",
                     ", ".join(f"{r.period_start:%Y-%m-%d}" for r in scope.mailed) or "none", scope.present)
        done.add(scope)
    return done


def run_schedule(kind: str, scope: str = "all", now: dt.datetime | None = None) -> Covered:
    """What a report schedule's task does when beat sends it (on time, late after an outage, or twice): cover
    ``kind`` (``daily``, ``weekly``) for ``scope`` (``all``, ``platform`` or a team slug) at ``now`` (default:
    now). A period is due once the enabled schedule of that kind and scope runs for it (sent late, before the
    time of the period it would run for, it builds only the periods before: beat sends that one on time); without
    such a schedule every complete period is due. Raises Team.DoesNotExist for an unknown slug, KeyError for an
    unknown kind."""
    now = now or timezone.now()
    PERIOD_LENGTH[kind]  # noqa: B018 - an unknown kind raises KeyError before any work
    schedule = next((s for s in enabled_schedules([kind]) if s.scope == scope), None)
    return cover(kind, scope_teams(scope), now, due=schedule.runs_for if schedule else None,
                 latest_source=Report.Source.SCHEDULE)


def catch_up(now: dt.datetime | None = None) -> Covered:
    """Cover every enabled report schedule at ``now`` (default: now), each period only once its schedule's time
    came (``Schedule.runs_for``). A schedule naming a team that no longer exists is left out, with a warning."""
    now = now or timezone.now()
    done = Covered()
    for schedule in enabled_schedules(PERIOD_LENGTH):
        try:
            teams = scope_teams(schedule.scope)
        except Team.DoesNotExist:
            log.warning("report schedule %r names no existing team: left out of the catch-up", schedule.task.name)
            continue
        done.add(cover(schedule.kind, teams, now, due=schedule.runs_for, latest_source=Report.Source.CATCH_UP))
    log.info("report catch-up: %d built, %d mailed, %d already there", len(done.built), len(done.mailed),
             done.present)
    return done
