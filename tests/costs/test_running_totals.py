"""The ledger's running totals: rollups and team totals equal the entries, are rebuilt from them, and answer budgets
and cost queries exactly as summing the entries does.

Expected sums are computed here from the entries themselves (Decimal, per
UTC day of ``interval_start``), never from the totals under test.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from datetime import UTC
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from costs.aggregation import GROUP_KEYS, aggregate_costs, aggregate_window, window_sums
from costs.budgets import budget_status
from costs.ledger import accrue_attempt, accrue_running
from costs.models import CostEntry, DailyCostRollup, JobDailyCost, Price, TeamSpend
from costs.spend import edge_outside
from jobs.models import JobAttempt, JobState
from quotas.models import Budget
from tests.support.factories import make_attempt, make_job_row

D = Decimal
T0 = dt.datetime(2026, 3, 9, 22, 50, tzinfo=UTC)  # runs cross two UTC midnights
M = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)

pytestmark = pytest.mark.django_db


def seconds(entry) -> Decimal:
    delta = entry.interval_end - entry.interval_start
    return D(delta.days * 86400 + delta.seconds) + D(delta.microseconds) / D(10**6)


def ledger_by(key) -> dict[tuple, tuple]:
    """[GPU-seconds, USD, unknown-cost GPU-seconds, entries] of the entries per ``key(entry, utc day)``."""
    sums = defaultdict(lambda: [D(0), D(0), D(0), 0])
    for e in CostEntry.objects.all():
        s = sums[key(e, e.interval_start.astimezone(UTC).date())]
        s[0] += e.gpus * seconds(e)
        s[1] += e.amount_usd or 0
        s[2] += e.gpus * seconds(e) if e.amount_usd is None else 0
        s[3] += 1
    return {k: tuple(v) for k, v in sums.items()}


def assert_totals_agree_with_entries():
    assert {(r.day, r.team_id, r.cluster_id, r.accelerator_id):
            (r.gpu_seconds, r.cost_usd, r.unpriced_gpu_seconds, r.entries) for r in DailyCostRollup.objects.all()} \
        == ledger_by(lambda e, day: (day, e.team_id, e.cluster_id, e.accelerator_id))
    assert {(r.day, r.job_id, r.team_id): (r.gpu_seconds, r.cost_usd, r.unpriced_gpu_seconds, r.entries)
            for r in JobDailyCost.objects.all()} == ledger_by(lambda e, day: (day, e.job_id, e.team_id))
    assert {r.team_id: (r.gpu_seconds, r.cost_usd, r.unpriced_gpu_seconds, r.entries)
            for r in TeamSpend.objects.all()} == ledger_by(lambda e, day: e.team_id)


@pytest.fixture
def history(teams, user, h100, cluster_factory):
    """Two days of a small fleet of both teams: a price change, a pause in accrual, an unpriced cluster, attempts
    that end; accrued by the periodic run and by single accruals at the ends."""
    aws = cluster_factory("eks", "aws", "us-east-1", h100, price="6.88")[1]
    onprem = cluster_factory("basement", "onprem", "dc-1", h100)[1]
    Price.objects.create(provider="aws", region="us-east-1", accelerator=h100, capacity_type="on-demand",
                         cluster=aws.cluster, usd_per_gpu_hour=D("7.13"), effective_from=T0 + 5 * H + 17 * M)
    attempts = []
    for i, (team, pool, gpus, start, end) in enumerate([
            (teams[0], aws, 4, T0, None), (teams[0], aws, 2, T0 + 13 * M, T0 + 3 * H + 1 * M),
            (teams[1], aws, 8, T0 + 30 * M, None), (teams[1], onprem, 3, T0, T0 + 26 * H)]):
        job = make_job_row(team, user, h100, name=f"j{i}", spec={}, gpus_per_node=gpus, max_runtime=86400 * 3,
                           state=JobState.RUNNING)
        attempts.append(make_attempt(job, pool.cluster, pool, gpus=gpus, started_at=start, ended_at=end,
                                     usd_per_gpu_hour=D("0")))
    until = T0
    while until < T0 + 30 * H:
        until += 7 * M if until < T0 + 4 * H or until > T0 + 20 * H else 3 * H  # a long pause in the middle
        accrue_running(until=until)
    accrue_attempt(attempts[1].pk, until=T0 + 40 * H)
    return attempts


def test_accrual_keeps_rollups_and_team_totals_equal_to_the_entries(history):
    assert CostEntry.objects.filter(amount_usd__isnull=True).exists()
    assert_totals_agree_with_entries()


def test_the_rebuild_command_restores_totals_from_the_entries_and_check_finds_a_difference(history, teams):
    DailyCostRollup.objects.filter(pk=DailyCostRollup.objects.order_by("pk").first().pk).update(cost_usd=D("1e6"))
    JobDailyCost.objects.filter(pk=JobDailyCost.objects.order_by("pk").last().pk).delete()
    TeamSpend.objects.filter(team=teams[1]).update(entries=0)
    with pytest.raises(CommandError):
        call_command("rebuild_rollups", "--check")
    call_command("rebuild_rollups")
    assert_totals_agree_with_entries()
    call_command("rebuild_rollups", "--check")
    # A partial rebuild of one day leaves the others and the team totals right too.
    DailyCostRollup.objects.filter(day=dt.date(2026, 3, 10)).update(cost_usd=0)
    JobDailyCost.objects.filter(day=dt.date(2026, 3, 10)).update(gpu_seconds=1)
    call_command("rebuild_rollups", "--start", "2026-03-10", "--end", "2026-03-10")
    assert_totals_agree_with_entries()


WINDOWS = [
    (dt.datetime(2026, 3, 9, tzinfo=UTC), dt.datetime(2026, 3, 12, tzinfo=UTC)),  # whole days only
    (T0 + 3 * M, T0 + 27 * H + 41 * M),  # partial days at both edges
    (T0 + 2 * H, T0 + 5 * H),  # inside one day
    (T0 + 70 * M, None), (None, T0 + 26 * H + 13 * M), (None, None),  # open on a side
]


@pytest.mark.parametrize("window", WINDOWS)
def test_cost_queries_from_rollups_answer_as_summing_the_entries(history, window):
    start, end = window
    entries = CostEntry.objects.all()
    if start:
        entries = entries.filter(interval_start__gte=start)
    if end:
        entries = entries.filter(interval_start__lt=end)
    cents = sum((e.amount_usd or 0 for e in entries), D(0)).quantize(D("0.01"))
    for group_by in GROUP_KEYS:
        rows, total = aggregate_window(group_by, start, end)
        assert (rows, total) == aggregate_costs(entries, group_by)
        assert total["cost_usd"] == str(cents)
    rows, total = aggregate_window("team", start, end, team_slug="beta")
    assert [r["team"] for r in rows] == (["beta"] if rows else [])


def test_budget_spent_is_the_sum_of_the_periods_entries_also_for_a_period_cut_inside_days(history, teams):
    custom = Budget.objects.create(team=teams[0], period="custom", amount_usd=D(1000), action="block",
                                   starts_at=T0 + 47 * M, ends_at=T0 + 25 * H + 5 * M)
    monthly = Budget.objects.create(team=teams[0], amount_usd=D(1000), action="block")
    at = T0 + 25 * H
    for budget in (custom, monthly):
        start, end = budget.window(at)
        expected = sum((e.amount_usd or 0 for e in CostEntry.objects.filter(
            team=teams[0], interval_start__gte=start, interval_start__lt=end)), D(0))
        assert budget_status(budget, at).spent_usd == expected
    assert JobAttempt.objects.filter(accrued_until__isnull=True).count() == 0


#: Windows whose edge days hold entries on both sides of the cut: j1 ends on 10 March at 01:51, so a window from
#: 05:00 that day leaves none of its entries (its rollup row of that day is all outside the window).
EDGE_WINDOWS = [
    (T0 + 3 * M, T0 + 27 * H + 41 * M), (T0 + 6 * H + 10 * M, T0 + 29 * H + 10 * M),
    (T0 + 70 * M, T0 + 26 * H + 11 * M),  # from a midnight
    (T0 + 2 * H, T0 + 5 * H), (T0 + 7 * H, T0 + 8 * H),  # inside one day
    (T0 + 70 * M + 26 * H, T0 + 30 * H), (T0 + 10 * M, None), (None, T0 + 25 * H + 1 * M),
]
KEYS = {"team": lambda e: (e.team.slug,), "cluster": lambda e: (e.cluster.name,),
        "accelerator": lambda e: (e.accelerator.name,), "job": lambda e: (e.job_id, e.job.name),
        "day": lambda e: (e.interval_start.astimezone(UTC).date(),)}


@pytest.mark.parametrize("window", EDGE_WINDOWS)
@pytest.mark.parametrize("edges", ["rollups", "entries", "auto"])
def test_edge_days_read_from_their_rollups_less_the_entries_outside_sum_as_the_windows_entries(history, window,
                                                                                               edges):
    start, end = window
    inside = [e for e in CostEntry.objects.select_related("team", "cluster", "accelerator", "job")
              if (start is None or e.interval_start >= start) and (end is None or e.interval_start < end)]
    for group_by, key in KEYS.items():
        expected = defaultdict(lambda: [D(0), D(0), D(0), D(0)])
        for e in inside:
            s = expected[key(e)]
            s[0] += D(e.gpu_milli) * seconds(e) / 1000
            s[1] += e.amount_usd or 0
            s[2] += D(e.gpu_milli) * seconds(e) / 1000 if e.amount_usd is None else 0
        for gpus_only in (False, True):
            assert window_sums(group_by, start, end, edges=edges, gpus_only=gpus_only) == \
                {k: list(v) for k, v in expected.items()}, (group_by, gpus_only)
    beta = {("beta",): [v for k, v in window_sums("team", start, end).items() if k == ("beta",)]}
    assert window_sums("team", start, end, edges=edges, team_slug="beta") == \
        {k: v[0] for k, v in beta.items() if v}


def test_an_edge_is_read_from_the_side_with_less_time_up_to_now():
    day = dt.datetime(2026, 3, 10, tzinfo=UTC)
    now = day + 10 * H
    # A window ending now: the day's rollups, nothing outside up to now to read.
    assert edge_outside(day, now, now) == ((now, day + 24 * H),)
    assert edge_outside(day, day + 3 * H, now) is None  # 3 hours inside, 7 outside up to now
    assert edge_outside(day + 2 * H, day + 24 * H, now) == ((day, day + 2 * H),)  # 8 hours inside up to now, 2 out
    assert edge_outside(day + 7 * H, day + 24 * H, now) is None  # 3 hours inside up to now, 7 outside
    assert edge_outside(day + 2 * H, day + 24 * H, now, "entries") is None
    assert edge_outside(day + 2 * H, day + 26 * H, now, "rollups") is None  # crosses a midnight
    assert edge_outside(None, day, now, "rollups") is None
    # No entry before 06:00 that day: the 6 hours before the window hold none, the 4 inside it up to now some.
    assert edge_outside(day + 6 * H, day + 24 * H, now, since=day + 6 * H) == ((day, day + 6 * H),)
    assert edge_outside(day + 6 * H, day + 24 * H, now) is None
    assert edge_outside(day + 6 * H, day + 24 * H, now, since=day + 11 * H) is None  # none up to now either side
    last = dt.datetime.combine(dt.date.max, dt.time(), UTC)  # the last day has no following midnight
    assert edge_outside(last, last + 12 * H, now, "rollups") is None
    with pytest.raises(ValueError):
        edge_outside(day, now, now, "both")
