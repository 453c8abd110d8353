"""The running GPU allocation per pool, team and node (``costs.running``) and the capacity figures read from it.

Expected sums are computed here from the ledger entries themselves: each entry billing GPUs clipped to the window,
its amount prorated by the seconds kept, split over the nodes of its attempt's placement by a rule written out here;
never from the totals under test.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from datetime import UTC
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from costs import running
from costs.capacity import Resolution, _allocation_rows, capacity_report
from costs.ledger import accrue_attempt, accrue_running
from costs.models import AllocationRunningTotal, AllocationSeries, CostEntry
from costs.rollups import rebuild_totals, totals_mismatches
from jobs.models import JobAttempt, JobState
from tests.support.factories import make_attempt, make_cost_entry, make_job_row

D = Decimal
T0 = dt.datetime(2026, 3, 9, 22, 50, tzinfo=UTC)
M = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
HOUR = D(3600)

pytestmark = pytest.mark.django_db


def exact(delta: dt.timedelta) -> Decimal:
    return D(delta.days * 86400 + delta.seconds) + D(delta.microseconds) / D(10**6)


def split(placement, gpus: int) -> list[tuple[str, int]]:
    """The nodes of a placement with their GPUs: whole GPUs each, the rest on the first node named."""
    nodes = (placement or {}).get("nodes") or []
    if not nodes:
        return [("", gpus)]
    out: dict[str, int] = defaultdict(int)
    for i, node in enumerate(nodes):
        out[node] += gpus // len(nodes) + (gpus % len(nodes) if i == 0 else 0)
    return list(out.items())


def expected(lo: dt.datetime, hi: dt.datetime) -> dict[str, dict]:
    """GPU-seconds, USD and unpriced GPU-seconds of the entries billing GPUs inside ``[lo, hi)``, per pool, per team and per
    (cluster, node) of the placements as they are now."""
    attempts = {a.pk: a for a in JobAttempt.objects.select_related("node_pool", "cluster", "job__team")}
    out = {kind: defaultdict(lambda: [D(0), D(0), D(0)]) for kind in ("pool", "team", "node")}
    for e in CostEntry.objects.filter(gpu_milli__gt=0, interval_start__lt=hi, interval_end__gt=lo):
        kept = exact(min(e.interval_end, hi) - max(e.interval_start, lo))
        whole = exact(e.interval_end - e.interval_start)
        g = D(e.gpu_milli) * kept / 1000
        usd = D(0) if e.amount_usd is None else e.amount_usd * kept / whole
        a = attempts[e.attempt_id]
        for kind, key in (("pool", (a.cluster.name, a.node_pool.name)), ("team", a.job.team.slug)):
            out[kind][key][0] += g
            out[kind][key][1] += usd
            out[kind][key][2] += g if e.amount_usd is None else 0
        for node, share in split(a.placement, a.gpus):
            s = out["node"][(a.cluster.name, node or "(no node recorded)")]
            s[0] += g * share / a.gpus
            s[1] += usd * share / a.gpus
    return out


@pytest.fixture
def fleet(teams, user, h100, cluster_factory):
    """Three days of a small fleet: multi-node placements (one of 3 GPUs on 2 nodes, which does not divide), an
    attempt whose placement names no nodes, an unpriced cluster, a pause in accrual; then a late hand-posted entry
    on an earlier day and an end learned after accrual (billing given back)."""
    aws = cluster_factory("eks", "aws", "us-east-1", h100, price="6.88")[1]
    onprem = cluster_factory("basement", "onprem", "dc-1", h100)[1]
    attempts = []
    for i, (team, pool, gpus, nodes, start) in enumerate(
        [
            (teams[0], aws, 4, ["n1", "n2"], T0),
            (teams[1], aws, 3, ["n1", "n2"], T0 + 13 * M),
            (teams[0], aws, 8, [], T0 + 30 * M),
            (teams[1], onprem, 2, ["m1"], T0),
        ]
    ):
        job = make_job_row(
            team, user, h100, name=f"j{i}", spec={}, gpus_per_node=gpus, max_runtime=86400 * 5, state=JobState.RUNNING
        )
        attempt = make_attempt(job, pool.cluster, pool, gpus=gpus, started_at=start, usd_per_gpu_hour=D("0"))
        JobAttempt.objects.filter(pk=attempt.pk).update(placement={"nodes": nodes, "gpus_per_node": gpus})
        attempts.append(attempt)
    until = T0
    while until < T0 + 60 * H:
        until += 11 * M if until < T0 + 4 * H or until > T0 + 40 * H else 5 * H
        accrue_running(until=until)
    # A late entry on an earlier day (an import), before the attempt's first accrued hour.
    make_cost_entry(attempts[1], T0 - 50 * H, 37 * M, D("7.123456789"), gpus=3)
    # The end learned after accrual: what was billed after it is given back.
    JobAttempt.objects.filter(pk=attempts[0].pk).update(ended_at=T0 + 30 * H + 7 * M)
    accrue_attempt(attempts[0].pk, until=T0 + 61 * H)
    return attempts


WINDOWS = [
    (dt.datetime(2026, 3, 9, tzinfo=UTC), dt.datetime(2026, 3, 13, tzinfo=UTC)),  # whole days only
    (T0 + 3 * M, T0 + 49 * H + 41 * M),  # partial days at both edges
    (T0 - 60 * H, T0 + 26 * H),  # from before the ledger, the late entry's day inside
    (T0 + 26 * H + 5 * M, T0 + 27 * H),  # inside one day
    (dt.datetime(2026, 3, 10, 7, tzinfo=UTC), dt.datetime(2026, 3, 12, tzinfo=UTC)),  # a partial first day only
]


def assert_capacity_matches(lo, hi):
    want = expected(lo, hi)
    rows, _total = capacity_report("node_pool", lo, hi)
    got = {
        (r["cluster"], r["node_pool"]): (r["allocated_gpu_seconds"], r["allocated_cost_usd"])
        for r in rows
        if r["allocated_gpu_seconds"]
    }
    assert set(got) == {k for k, v in want["pool"].items() if v[0]}
    for pool, (g, usd) in got.items():
        assert g == want["pool"][pool][0], pool  # exact
        if want["pool"][pool][2] == g:  # no price at all: unknown, never $0
            assert usd is None, pool
        else:
            assert abs(usd - want["pool"][pool][1]) <= D("1e-9"), pool
    rows, _total = capacity_report("node", lo, hi)
    got = {(r["cluster"], r["node"]): r["allocated_gpu_seconds"] for r in rows if r["allocated_gpu_seconds"]}
    assert set(got) == {k for k, v in want["node"].items() if v[0]}
    for key, g in got.items():
        assert abs(g - want["node"][key][0]) <= D("1e-15"), key  # 2/3 of an attempt does not divide exactly
    rows, _total = capacity_report("team", lo, hi)
    got = {r["team"]: r["allocated_gpu_hours"] for r in rows if r["team"] != "__idle__" and r["allocated_gpu_hours"]}
    assert got == {t: (v[0] / HOUR).quantize(D("0.000001")) for t, v in want["team"].items() if v[0]}


@pytest.mark.parametrize("window", WINDOWS)
def test_capacity_allocation_from_running_totals_sums_as_the_entries(fleet, window):
    assert CostEntry.objects.filter(amount_usd__isnull=True).exists()
    assert_capacity_matches(*window)
    assert running.running_mismatches() == []


@pytest.mark.parametrize("window", WINDOWS)
def test_running_totals_and_attempt_day_rollups_give_the_same_rows(fleet, window):
    lo, hi = window
    for res in (Resolution(False, False), Resolution(True, False), Resolution(False, True)):
        for by_team in (False, True):
            if res.by_node and by_team:
                continue
            fast = _allocation_rows(lo, hi, None, res, by_team)
            slow = _allocation_rows(lo, hi, None, res, by_team, running=False)
            key = {tuple(r[:9]): r[9:] for r in fast}
            assert set(key) == {tuple(r[:9]) for r in slow}, (res, by_team)
            for r in slow:
                assert key[tuple(r[:9])][0] == r[9] and key[tuple(r[:9])][2] == r[11], (res, by_team)
                assert abs(key[tuple(r[:9])][1] - r[10]) <= D("1e-18"), (res, by_team)


def test_a_late_entry_moves_every_later_day_of_its_series(fleet):
    first = AllocationSeries.objects.get(by_node=False, team=fleet[1].job.team, node_pool=fleet[1].node_pool)
    days = list(AllocationRunningTotal.objects.filter(series=first).order_by("day"))
    assert days[0].day == (T0 - 50 * H).date() and days[0].cost_usd == D("7.123456789")
    late = make_cost_entry(fleet[1], T0 - 52 * H, 5 * M, D("1.5"), gpus=3)
    assert late.interval_start.date() == days[0].day
    after = {r.day: r for r in AllocationRunningTotal.objects.filter(series=first)}
    for row in days:
        assert after[row.day].through_cost_usd == row.through_cost_usd + D("1.5")
        assert after[row.day].through_gpu_seconds == row.through_gpu_seconds + 3 * 300
    assert running.running_mismatches() == []
    assert_capacity_matches(T0 - 60 * H, T0 + 26 * H)


def test_the_rebuild_restores_running_totals_from_the_entries(fleet):
    AllocationRunningTotal.objects.filter(day=dt.date(2026, 3, 11)).update(cost_usd=D("1e6"), through_cost_usd=0)
    AllocationRunningTotal.objects.filter(day=dt.date(2026, 3, 10)).delete()
    assert running.running_mismatches()
    assert any(m.kind == "running" for m in totals_mismatches())
    with pytest.raises(CommandError):
        call_command("rebuild_rollups", "--check")
    rebuild_totals(dt.date(2026, 3, 10), dt.date(2026, 3, 11))  # the days broken only
    assert running.running_mismatches() == []
    call_command("rebuild_rollups", "--check")
    AllocationRunningTotal.objects.all().delete()
    AllocationSeries.objects.all().delete()
    rebuild_totals()
    assert running.running_mismatches() == []
    for window in WINDOWS:
        assert_capacity_matches(*window)


def test_a_changed_placement_moves_the_attempts_allocation_to_its_nodes(fleet):
    attempt = JobAttempt.objects.get(pk=fleet[1].pk)
    old_gpus, old_placement = attempt.gpus, attempt.placement
    JobAttempt.objects.filter(pk=attempt.pk).update(gpus=2, placement={"nodes": ["n2"], "gpus_per_node": 2})
    assert running.running_mismatches()  # the node series still hold the old placement
    running.reattribute(attempt.pk, old_gpus, old_placement)
    assert running.running_mismatches() == []
    assert_capacity_matches(T0 + 3 * M, T0 + 49 * H + 41 * M)
