"""Accrual of every running attempt at once: an unpriced or failing attempt never stops the others.

An attempt with no price in force accrues its GPU-hours with an unknown cost
(``costs.spend.unpriced_usage`` says how many and since when), and a budget
counts them at the catalog's highest price for the accelerator. Expected
money is worked out here from GPUs x seconds x price, one rounding per UTC
hour (the ledger's entry span).
"""

from __future__ import annotations

import datetime as dt
import threading
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from django.db import connection, transaction
from django.db.models import Max
from django.test.utils import CaptureQueriesContext

from costs.budgets import budget_status
from costs.ledger import accrue_running
from costs.models import CostEntry, Price
from costs.spend import unpriced_usage
from jobs.models import Job, JobAttempt, JobState
from jobs.scheduling.passes import try_admit
from quotas.models import Team
from runners.models import Cluster, NodePool
from tests.support.factories import make_attempt, make_cost_entry, make_job_row

D = Decimal
T0 = dt.datetime(2026, 3, 10, 11, 20, tzinfo=UTC)
M = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
QUANTUM = D("0.000000001")

pytestmark = pytest.mark.django_db


def hourly_cost(gpus: int, start: dt.datetime, end: dt.datetime, price: str) -> Decimal:
    """GPUs x seconds / 3600 x price over ``[start, end)``, rounded to 1e-9 half even once per UTC hour."""
    total, lo = D(0), start
    while lo < end:
        hi = min(end, lo.replace(minute=0, second=0, microsecond=0) + H)
        seconds = D((hi - lo).total_seconds())
        total += (D(gpus) * seconds * D(price) / D(3600)).quantize(QUANTUM, ROUND_HALF_EVEN)
        lo = hi
    return total


@pytest.fixture
def running(teams, user, h100):
    """``running(pool, gpus, started_at)``: a RUNNING job of alpha with one live attempt on ``pool``."""
    def make(pool, gpus, started_at=T0):
        job = make_job_row(teams[0], user, h100, name="j", spec={}, gpus_per_node=gpus, max_runtime=86400,
                           state=JobState.RUNNING)
        return make_attempt(job, pool.cluster, pool, gpus=gpus, started_at=started_at, usd_per_gpu_hour=D("0"))
    return make


@pytest.fixture
def fleet(cluster_factory, h100, running):
    """Two priced attempts (aws at $6.88, gcp from the catalog at $4.20) and one on a cluster without a price."""
    aws = cluster_factory("eks", "aws", "us-east-1", h100, price="6.88")[1]
    gcp = cluster_factory("gke", "gcp", "us-central1", h100, price="4.20")[1]
    onprem = cluster_factory("basement", "onprem", "dc-1", h100)[1]
    return {"aws": running(aws, 4), "gcp": running(gcp, 2, T0 + 7 * M), "unpriced": running(onprem, 8)}


def test_an_unpriced_attempt_beside_priced_ones_over_several_runs_leaves_their_money_exact(fleet, h100):
    stops = [T0 + 1 * M, T0 + 2 * M, T0 + 41 * M, T0 + 41 * M + dt.timedelta(seconds=13, microseconds=250),
             T0 + 3 * H + 5 * M]
    for until in stops:
        with CaptureQueriesContext(connection) as run:
            assert accrue_running(until=until) == 3 - (until <= T0 + 7 * M)  # gcp starts at T0 + 7 min
        # One transaction of set-based statements, not one per attempt: key-share the teams and clusters, lock
        # and read the attempts, their pools, prices and open entries; update jobs, attempts, team totals, both rollups, open entries; insert entries;
        # the running allocation: read the attempts' placements, upsert their series, add the new days, grow the days.
        assert len(run) <= 21, [q["sql"][:80] for q in run.captured_queries]
    end = stops[-1]
    aws, gcp, unpriced = (Job.objects.get(pk=fleet[k].job_id) for k in ("aws", "gcp", "unpriced"))
    assert aws.accrued_cost_usd == hourly_cost(4, T0, end, "6.88")
    assert gcp.accrued_cost_usd == hourly_cost(2, T0 + 7 * M, end, "4.20")
    assert abs(aws.accrued_cost_usd - D(4) * D((end - T0).total_seconds()) / 3600 * D("6.88")) < 5 * QUANTUM
    assert unpriced.accrued_cost_usd == 0
    for attempt in fleet.values():
        assert JobAttempt.objects.get(pk=attempt.pk).accrued_until == end
    # The unpriced attempt's time is all in the ledger, with no price: 8 GPUs x 3 h 5 min since T0.
    rows = CostEntry.objects.filter(attempt=fleet["unpriced"])
    assert not rows.filter(usd_per_gpu_hour__isnull=False).exists()
    assert sum((e.interval_end - e.interval_start for e in rows), dt.timedelta()) == end - T0
    [usage] = unpriced_usage(job_ids=[unpriced.pk])
    assert (usage.job_id, usage.team_id, usage.since, usage.until) == (unpriced.pk, unpriced.team_id, T0, end)
    assert usage.gpu_hours == D(8) * D((end - T0).total_seconds()) / 3600
    [team_usage] = unpriced_usage(team_ids=[unpriced.team_id], by="team")
    assert (team_usage.job_id, team_usage.gpu_hours, team_usage.since) == (None, usage.gpu_hours, T0)
    # The ledger grows with work: one row per attempt and UTC hour it ran in (11:20 -> 14:25 is 4 hours).
    assert CostEntry.objects.filter(attempt=fleet["aws"]).count() == 4


def test_an_attempt_whose_ledger_write_fails_is_skipped_and_the_others_accrue(fleet):
    # A hand-made row already holds the aws attempt's 12:00 entry: its accrual past 12:00 cannot be written.
    make_cost_entry(fleet["aws"], T0 + 40 * M, M, "0.458666667", usd_per_gpu_hour="6.88")
    end = T0 + 2 * H
    accrue_running(until=end)
    assert JobAttempt.objects.get(pk=fleet["aws"].pk).accrued_until is None
    assert Job.objects.get(pk=fleet["aws"].job_id).accrued_cost_usd == 0
    assert Job.objects.get(pk=fleet["gcp"].job_id).accrued_cost_usd == hourly_cost(2, T0 + 7 * M, end, "4.20")
    assert JobAttempt.objects.get(pk=fleet["unpriced"].pk).accrued_until == end


def test_a_block_budget_counts_unknown_cost_at_the_highest_catalog_price_of_the_accelerator(
        teams, user, fleet, h100, budget_factory, quota_factory):
    CostEntry.objects.all().delete()
    for attempt in (fleet["aws"], fleet["gcp"]):
        JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=T0)  # only the unpriced one runs
    end = T0 + 2 * H
    accrue_running(until=end)
    highest = Price.objects.filter(accelerator=h100).aggregate(m=Max("usd_per_gpu_hour"))["m"]
    bound = D(8) * 2 * highest  # 8 GPUs x 2 h, unknown cost, at the highest H100 price anywhere
    budget = budget_factory(teams[0], str((bound + 10).quantize(D("0.01"))), action="block")
    status = budget_status(budget, end)
    assert (status.spent_usd, status.unpriced_gpu_hours, status.unpriced_usd) == (0, 16, bound)
    assert status.remaining_usd == budget.amount_usd - bound
    quota_factory(teams[0], h100, nominal=64)
    # 1 GPU x 3 h x $4.20 (gcp, the cheapest pool) = $12.60 does not fit the $10 left once unknown cost counts.
    job = make_job_row(teams[0], user, h100, name="next", max_runtime=3 * 3600)
    assert try_admit(job.pk, now=end) == "waiting"
    assert Job.objects.get(pk=job.pk).queue_info["reason"] == "budget"


def hold(*querysets):
    """Lock the rows of ``querysets`` FOR UPDATE in another transaction until the returned ``release()``."""
    held, done = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            for qs in querysets:
                list(qs.order_by("pk").select_for_update(of=("self",)))
            held.set()
            done.wait(60)
        connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(30)

    def release():
        done.set()
        thread.join()
    release.thread = thread
    return release


@pytest.mark.django_db(transaction=True)
def test_accrual_leaves_attempts_whose_rows_are_held_to_the_next_run_without_waiting(fleet):
    # A victim's job row, a node pool and a cluster row held FOR UPDATE by other transactions.
    release = hold(Job.objects.filter(pk=fleet["aws"].job_id), NodePool.objects.filter(pk=fleet["gcp"].node_pool_id),
                   Cluster.objects.filter(pk=fleet["unpriced"].cluster_id))
    try:
        assert accrue_running(until=T0 + H) == 1  # only gcp: its pool row is not one the ledger references
        assert release.thread.is_alive()  # returned while the rows were still held: it waited on none
        assert Job.objects.get(pk=fleet["gcp"].job_id).accrued_cost_usd == hourly_cost(2, T0 + 7 * M, T0 + H, "4.20")
        assert JobAttempt.objects.get(pk=fleet["aws"].pk).accrued_until is None
        assert JobAttempt.objects.get(pk=fleet["unpriced"].pk).accrued_until is None
    finally:
        release()
    assert accrue_running(until=T0 + 2 * H) == 3
    assert Job.objects.get(pk=fleet["aws"].job_id).accrued_cost_usd == hourly_cost(4, T0, T0 + 2 * H, "6.88")
    assert JobAttempt.objects.get(pk=fleet["unpriced"].pk).accrued_until == T0 + 2 * H


@pytest.mark.django_db(transaction=True)
def test_a_team_under_admission_is_skipped_so_accrual_never_waits_behind_it(fleet, teams):
    # An admission holds its team row FOR UPDATE while it waits for the team's totals row: accrual must not
    # take the totals row and then wait for the team row (that would deadlock), so it leaves the team for later.
    release = hold(Team.objects.filter(pk=teams[0].pk))
    try:
        assert accrue_running(until=T0 + H) == 0
        assert release.thread.is_alive()
    finally:
        release()
    assert accrue_running(until=T0 + H) == 3
