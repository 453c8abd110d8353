"""The budget forecast: what a team will have spent at the end of a budget period, with its method and inputs.

Formula::

    forecast = spent + committed + rate x days left

* ``spent``: the ledger's USD in the period so far;
* ``committed``: what the jobs running now may still spend, up to their
  max runtime (``estimated - accrued``, at least 0);
* ``rate``: the median of the team's daily spend (USD per UTC day, from
  the per-job day rollups) over
  the last ``COSTS_FORECAST_WINDOW_DAYS`` complete days before ``at``,
  leaving out the entries of the jobs running at ``at`` (they are in
  ``committed``; counting them twice is what made a burst swing the old
  forecast). Days without spend count as 0.
* ``days left``: from ``at`` to the period's end, in days.

Source: the "average method" of Hyndman & Athanasopoulos, *Forecasting:
Principles and Practice* (3rd ed., section 5.2), with the median in place of
the mean so that one burst day among seven moves the rate by nothing (the
median's breakdown point is 50 %, Hampel 1974, *JASA* 69(346)); the known
part (spent and committed) is added as a project's "estimate at completion"
adds actual cost and remaining commitments (PMBOK, earned value management).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from decimal import Decimal

from django.conf import settings
from django.db.models import Q, Sum

from core.sql import as_date, as_decimal, fetch
from jobs.models import Job, JobAttempt

from .models import CostEntry, JobDailyCost
from .spend import exact_seconds

DAY = dt.timedelta(days=1)
METHOD = ("spent + committed by running jobs (up to their max runtime) + median daily spend of the last {days} "
          "complete UTC days (jobs running now left out) x days left")


@dataclasses.dataclass(frozen=True)
class Forecast:
    """A forecast and its inputs; money in exact Decimal USD, ``days_left`` in days.

    ``daily_spend`` lists the window's days, oldest first: ``[(date, USD)]``.
    """

    forecast_usd: Decimal
    spent_usd: Decimal
    committed_usd: Decimal
    rate_usd_per_day: Decimal
    days_left: Decimal
    window_start: dt.date
    window_end: dt.date
    daily_spend: tuple
    method: str

    @property
    def burn_rate_usd_per_hour(self) -> Decimal:
        return self.rate_usd_per_day / 24


def running_job_ids(team_id: int, at: dt.datetime) -> set[int]:
    """Ids of the team's jobs with an attempt running at ``at`` (started before it, not ended by it)."""
    return set(JobAttempt.objects.filter(job__team_id=team_id, started_at__lte=at)
               .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=at)).values_list("job_id", flat=True))


def committed_at(team_id: int, at: dt.datetime) -> Decimal:
    """What the jobs running at ``at`` could still spend then: ``sum(max(estimated - ledger before at, 0))``, USD.

    For a past instant (a report): the ledger entries that started before ``at`` stand for what was accrued.
    """
    jobs = running_job_ids(team_id, at)
    if not jobs:
        return Decimal(0)
    spent = dict(CostEntry.objects.filter(job_id__in=jobs, interval_start__lt=at).values("job_id")
                 .annotate(s=Sum("amount_usd")).values_list("job_id", "s"))
    return sum((max(est - (spent.get(pk) or Decimal(0)), Decimal(0))
                for pk, est in Job.objects.filter(pk__in=jobs).values_list("pk", "estimated_cost_usd")), Decimal(0))


def daily_spend(team_id: int, first: dt.date, last: dt.date, running_at: dt.datetime) -> list[tuple[dt.date, Decimal]]:
    """The team's ledger USD per UTC day in ``[first, last]``, leaving out the jobs running at ``running_at``
    (``running_job_ids``); days without spend are 0. Read from the per-job day rollups (``costs.JobDailyCost``,
    kept with the ledger): an entry counts on the UTC day of its start, and entries are cut at every UTC hour,
    so a day holds exactly its own spend. One statement (``core.sql``: budget status repeats it per budget)."""
    totals = {first + dt.timedelta(days=i): Decimal(0) for i in range((last - first).days + 1)}
    day_t, attempt_t, job_t = JobDailyCost._meta.db_table, JobAttempt._meta.db_table, Job._meta.db_table
    rows = fetch(
        f'SELECT d.day, SUM(d.cost_usd) FROM "{day_t}" d WHERE d.team_id = %s AND d.day >= %s AND d.day <= %s '
        f'AND d.job_id NOT IN (SELECT a.job_id FROM "{attempt_t}" a INNER JOIN "{job_t}" j ON j.id = a.job_id '
        f"WHERE j.team_id = %s AND a.started_at <= %s AND (a.ended_at IS NULL OR a.ended_at > %s)) GROUP BY d.day",
        [team_id, first, last, team_id, running_at, running_at])
    for day, usd in rows:
        totals[as_date(day)] += as_decimal(usd, 9) or Decimal(0)
    return sorted(totals.items())


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), dt.timezone.utc)


def forecast(team_id: int, period_end: dt.datetime, at: dt.datetime, spent_usd: Decimal,
             committed_usd: Decimal | None = None, window_days: int | None = None) -> Forecast:
    """The forecast at ``period_end`` seen from ``at`` (see the module docstring for the formula and its source).

    ``spent_usd``: the period's ledger USD so far (the caller's, so budgets
    and reports show the same number); ``committed_usd``: default
    ``committed_at(team, at)``; ``window_days``: default
    ``COSTS_FORECAST_WINDOW_DAYS`` (7). Raises ValueError for a window under 1 day.
    """
    window_days = window_days or settings.COSTS_FORECAST_WINDOW_DAYS
    if window_days < 1:
        raise ValueError("window_days must be at least 1")
    committed = committed_at(team_id, at) if committed_usd is None else committed_usd
    last = at.astimezone(dt.timezone.utc).date() - DAY
    first = last - dt.timedelta(days=window_days - 1)
    days = daily_spend(team_id, first, last, at)
    rate = statistics.median(usd for _, usd in days)
    left = max(Decimal(0), exact_seconds(period_end - at) / 86400)
    return Forecast(spent_usd + committed + rate * left, spent_usd, committed, rate, left, first, last, tuple(days),
                    METHOD.format(days=window_days))
