"""Scheduled reports through an outage of beat: every period gets its report when beat returns, each mailed once,
whatever the outage, however often the tasks are delivered and however many workers run them at once.

Beat is played by its own scheduler's entries (django-celery-beat's ``ModelEntry`` on the schedule rows, with the
clock moved by ``time_machine``): at each wake-up every due row's task runs, as beat sends it, and the row's last
run is recorded. The expected periods are worked out here from the schedules' times (daily at 06:00 UTC, weekly
on Monday at 06:30 UTC), not read from the code under test.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections import Counter
from datetime import UTC
from decimal import Decimal

import pytest
import time_machine
from django.core import mail
from django.db import connection, transaction
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import ModelEntry
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from controlplane.celery import app

app.loader.import_default_modules()  # what a worker and beat do at start: autodiscover every app's tasks.py
from costs.models import Report  # noqa: E402 (after the tasks are loaded)
from costs.reports.schedules import TASK, ensure_report_schedules  # noqa: E402 (after the tasks are loaded)
from costs.reports.tasks import CATCH_UP_TASK_NAME  # noqa: E402 (after the tasks are loaded)
from quotas.models import Team  # noqa: E402 (after the tasks are loaded)
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job  # noqa: E402
from tests.support.personas import make_persona  # noqa: E402
from tests.support.racing import run_concurrently  # noqa: E402

DAY = dt.timedelta(days=1)
START = dt.datetime(2026, 3, 9, 0, 30, tzinfo=UTC)  # a Monday: the teams and their schedules exist from here
TUESDAY = dt.datetime(2026, 3, 10, tzinfo=UTC)
DOWN = TUESDAY + dt.timedelta(hours=6, minutes=30)  # beat stops after Tuesday's 06:00 run...
UP = dt.datetime(2026, 3, 13, 7, 0, tzinfo=UTC)  # ...and is back on Friday at 07:00
SUBJECT = re.compile(r"\[controlplane\] (daily|weekly) report (\S+) (\d{4}-\d{2}-\d{2})")


def daily_runs(first: dt.datetime, last: dt.datetime) -> list[dt.datetime]:
    """The daily schedule's times (06:00 UTC) in ``[first, last)``."""
    at = first.replace(hour=6, minute=0, second=0, microsecond=0)
    at = at if at >= first else at + DAY
    runs = []
    while at < last:
        runs.append(at)
        at += DAY
    return runs


def weekly_runs(first: dt.datetime, last: dt.datetime) -> list[dt.datetime]:
    """The weekly schedule's times (Monday 06:30 UTC) in ``[first, last)``."""
    return [t + dt.timedelta(minutes=30) for t in daily_runs(first, last) if t.weekday() == 0
            and t + dt.timedelta(minutes=30) < last]


def beat_wakes() -> None:
    """What beat does when it wakes now: send each enabled report schedule that is due, and record its run."""
    for row in PeriodicTask.objects.filter(task=TASK, enabled=True):
        entry = ModelEntry(row, app=app)
        if entry.is_due().is_due:
            app.tasks[entry.task].apply(args=entry.args, kwargs=entry.kwargs).get()
            PeriodicTask.objects.filter(pk=row.pk).update(last_run_at=timezone.now())


def run_beat(clock, first: dt.datetime, last: dt.datetime) -> None:
    """Beat up over ``[first, last)``: it wakes at each schedule time."""
    for at in sorted(daily_runs(first, last) + weekly_runs(first, last)):
        clock.move_to(at)
        beat_wakes()


def reports() -> Counter:
    """``(kind, scope, period start date) -> rows``, over every stored report."""
    return Counter((r.kind, r.scope_name, r.period_start.date()) for r in Report.objects.select_related("team"))


def mailed() -> Counter:
    """``(kind, scope, period start date) -> messages sent``, from Django's test outbox."""
    found = Counter()
    for message in mail.outbox:
        kind, scope, day = SUBJECT.match(message.subject).groups()
        found[(kind, scope, dt.date.fromisoformat(day))] += 1
    return found


@pytest.fixture
def world(teams, owner, outsider, staff, catalog):
    """alpha and beta exist from START, each with an admin who reads mail, and staff for the platform's reports;
    Tuesday alpha's job "big" cost 8 GPUs x 2 h x $6.88 = $110.08, Wednesday beta's 4 x 1.5 h x $3.00 = $18.00."""
    Team.objects.update(created_at=START)
    for persona, address in ((owner, "owner@example.com"), (outsider, "outsider@example.com"),
                             (staff, "staff@example.com")):
        persona.user.email = address
        persona.user.save()
    aws, aws_pool = make_cluster("aws-h100", "aws", "us-east-1", catalog["H100-80GB"])
    big = make_attempt(make_job(teams[0], owner.user, catalog["H100-80GB"], name="big", gpus_per_node=8), aws,
                       aws_pool, state="SUCCEEDED")
    small = make_attempt(make_job(teams[1], outsider.user, catalog["H100-80GB"], name="small", gpus_per_node=4),
                         aws, aws_pool, state="SUCCEEDED")
    make_cost_entry(big, TUESDAY + dt.timedelta(hours=10), dt.timedelta(hours=2), 8 * 2 * Decimal("6.88"))
    make_cost_entry(small, TUESDAY + DAY + dt.timedelta(hours=3), dt.timedelta(hours=1, minutes=30),
                    4 * Decimal("1.5") * Decimal("3.00"), usd_per_gpu_hour="3.00")
    with time_machine.travel(START, tick=False):
        ensure_report_schedules()
    return teams


def expected_after_the_outage() -> set:
    """Every period whose schedule time passed by Friday 07:00 and that ended after START, or was the last one
    complete at a run before the outage: Sunday (made Monday 06:00) to Thursday, and the week before Monday."""
    days = [dt.date(2026, 3, 8) + dt.timedelta(days=i) for i in range(5)]
    return ({("daily", scope, day) for scope in ("alpha", "beta", "platform") for day in days}
            | {("weekly", scope, dt.date(2026, 3, 2)) for scope in ("alpha", "beta", "platform")})


@pytest.mark.django_db
def test_a_three_day_beat_outage_leaves_no_day_without_its_report_and_mails_each_once(world):
    mail.outbox = []
    with time_machine.travel(START, tick=False) as clock:
        run_beat(clock, START, DOWN)
        clock.move_to(UP)
        beat_wakes()  # beat is back: each schedule missed three times is sent once
        expected = expected_after_the_outage()
        assert reports() == Counter(dict.fromkeys(expected, 1))
        assert mailed() == Counter({key: 1 for key in expected})
        tuesday = Report.objects.get(team=world[0], kind="daily", period_start=TUESDAY)
        assert tuesday.data["totals"]["cost_usd"] == "110.08" and tuesday.source == "catch-up"
        assert Report.objects.get(team=world[1], kind="daily", period_start=TUESDAY + DAY).data["totals"][
            "cost_usd"] == "18.00"
        assert Report.objects.get(team=None, kind="daily", period_start=TUESDAY).data["totals"]["cost_usd"] == "110.08"

        # The same messages delivered again, and the catch-up task on top: nothing more is built or sent.
        for row in PeriodicTask.objects.filter(task=TASK, kwargs__contains="daily"):
            app.tasks[TASK].apply(kwargs=ModelEntry(row, app=app).kwargs).get()
        app.tasks[CATCH_UP_TASK_NAME].apply().get()
        assert reports() == Counter(dict.fromkeys(expected, 1))
        assert mailed() == Counter({key: 1 for key in expected})


@pytest.mark.django_db
def test_the_catch_up_alone_covers_an_outage_but_never_runs_ahead_of_a_schedule(world):
    """Beat back without sending the report schedules (a row whose last run was lost): the periodic catch-up builds
    each missed day, but Thursday's report only once its 06:00 run has come."""
    mail.outbox = []
    with time_machine.travel(START, tick=False) as clock:
        run_beat(clock, START, DOWN)
        clock.move_to(UP - dt.timedelta(hours=2))  # Friday 05:00
        app.tasks[CATCH_UP_TASK_NAME].apply().get()
        expected = expected_after_the_outage()
        thursday = {key for key in expected if key[2] == dt.date(2026, 3, 12)}
        assert set(reports()) == expected - thursday
        clock.move_to(UP)
        app.tasks[CATCH_UP_TASK_NAME].apply().get()
        assert reports() == Counter(dict.fromkeys(expected, 1))
        assert mailed() == Counter({key: 1 for key in expected})


@pytest.mark.django_db
def test_a_disabled_schedule_is_not_caught_up(world):
    mail.outbox = []
    with time_machine.travel(START, tick=False) as clock:
        run_beat(clock, START, DOWN)
        PeriodicTask.objects.filter(name="report daily team beta").update(enabled=False)
        clock.move_to(UP)
        app.tasks[CATCH_UP_TASK_NAME].apply().get()
    beta_days = {key[2] for key in reports() if key[:2] == ("daily", "beta")}
    assert beta_days == {dt.date(2026, 3, 8), dt.date(2026, 3, 9)}  # made before the outage; none after


@pytest.mark.django_db(transaction=True)
def test_two_workers_catching_up_at_once_build_and_mail_each_report_once(world):
    """Two workers run the catch-up at the same instant on PostgreSQL. While a third connection holds the report
    table in SHARE ROW EXCLUSIVE mode both compute their reports and wait at their first insert, so both try every
    missed period: the unique constraint lets one insert each, the compare-and-set of ``mailed_at`` one mail."""
    assert connection.vendor == "postgresql"
    mail.outbox = []
    with time_machine.travel(START, tick=False) as clock:
        run_beat(clock, START, DOWN)
        clock.move_to(UP)
        before = reports()
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {Report._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
            results, errors = [], []

            def catch_up():
                return app.tasks[CATCH_UP_TASK_NAME].apply().get()

            runner = threading.Thread(target=lambda: results.append(run_concurrently(catch_up, catch_up)))
            runner.start()
            wait_for_waiters(2)
        runner.join(60)
        (results_, errors), = results
        assert not errors, errors
        expected = expected_after_the_outage()
        assert reports() == Counter(dict.fromkeys(expected, 1))
        assert mailed() == Counter({key: 1 for key in expected})
        built = sorted(results_[0] + results_[1])
        assert len(built) == len(set(built)) == len(expected) - len(before)  # each insert made by one worker


def wait_for_waiters(count: int) -> None:
    """Wait until ``count`` other sessions of the test database wait for a lock (at most 60 s). Activity statistics
    are read afresh each time (``pg_stat_clear_snapshot``): inside a transaction they are a snapshot."""
    deadline = time.monotonic() + 60
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            if cursor.fetchone()[0] >= count:
                return
            time.sleep(0.02)
    raise AssertionError("the two workers never reached their inserts")


def monday_of(day: dt.date) -> dt.date:
    return day - dt.timedelta(days=day.weekday())


def expected_reports(down: dt.datetime, up: dt.datetime, lookback: int) -> set:
    """The periods that have a report once beat, up from START, was down over ``[down, up)`` and is back at ``up``:
    those whose schedule time came while it was up, and those whose time came during the outage that are among
    the last ``lookback`` complete periods at ``up``."""
    found = set()
    for offset in range(-7, (up - START).days + 2):
        day = START.date() + dt.timedelta(days=offset)
        runs_at = dt.datetime.combine(day + DAY, dt.time(6, 0), tzinfo=UTC)
        in_window = day >= up.date() - dt.timedelta(days=lookback)
        if START <= runs_at <= up and (runs_at < down or in_window):
            found.add(("daily", day))
        if day.weekday() == 0:
            runs_at = dt.datetime.combine(day + dt.timedelta(days=7), dt.time(6, 30), tzinfo=UTC)
            in_window = day >= monday_of(up.date()) - dt.timedelta(weeks=lookback)
            if START <= runs_at <= up and (runs_at < down or in_window):
                found.add(("weekly", day))
    return found


@pytest.mark.django_db
@hypothesis_settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(down_after_hours=st.integers(min_value=24, max_value=6 * 24),
       outage_hours=st.integers(min_value=1, max_value=9 * 24), lookback=st.integers(min_value=1, max_value=8))
def test_after_any_outage_each_period_of_the_window_has_one_report_mailed_once(
        db, settings, down_after_hours, outage_hours, lookback):
    settings.REPORTS_CATCHUP_PERIODS = lookback
    down = START + dt.timedelta(hours=down_after_hours)
    up = down + dt.timedelta(hours=outage_hours)
    mail.outbox = []
    with transaction.atomic(), time_machine.travel(START, tick=False) as clock:
        team = Team.objects.create(slug="solo", name="Solo")
        for persona in (make_persona("solo-admin", team, "admin"), make_persona("boss", staff=True)):
            persona.user.email = f"{persona.user.username}@example.com"
            persona.user.save()
        ensure_report_schedules()
        run_beat(clock, START, down)
        clock.move_to(up)
        beat_wakes()
        app.tasks[CATCH_UP_TASK_NAME].apply().get()
        expected = expected_reports(down, up, lookback)
        both = Counter({(kind, scope, day): 1 for kind, day in expected for scope in ("solo", "platform")})
        assert reports() == both
        assert mailed() == both
        transaction.set_rollback(True)
