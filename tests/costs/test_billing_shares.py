"""The ledger bills a job on part of one GPU its share (ADR 0040): GPU-hours = share x hours, at the base product's
price; every total and reader counts the share. Expected figures are worked out here by hand (Fraction and Decimal
arithmetic on the spec's numbers), never read from the code under test."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction

import pytest
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costs.aggregation import aggregate_window
from costs.budgets import burn_rate
from costs.ledger import accrue_attempt
from costs.ledgercheck import ledger_gpu_hours
from costs.models import AttemptDailyCost, CostEntry, TeamSpend
from costs.rollups import rebuild_totals
from costs.unknown import unpriced_hours
from jobs.models import Job, JobState
from tests.support.factories import make_attempt, make_cluster, make_job_row

D = Decimal
T0 = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)

pytestmark = pytest.mark.django_db


def ended_attempt(team, user, pool, *, share_milli: int = 0, gpus: int = 1, start=T0, seconds: float = 3600):
    """An ended attempt of a new job of ``team`` on ``pool``: ``gpus`` whole GPUs, or a share of one GPU
    (``share_milli``, the job then asking one device), held ``seconds`` from ``start``."""
    job = make_job_row(team, user, pool.accelerator, name="j", spec={}, gpus_per_node=1 if share_milli else gpus,
                       max_runtime=86400, state=JobState.SUCCEEDED, gpu_share_milli=share_milli)
    return make_attempt(job, pool.cluster, pool, gpus=1 if share_milli else gpus, started_at=start,
                        ended_at=start + dt.timedelta(seconds=seconds), usd_per_gpu_hour=D("0"),
                        state=JobState.SUCCEEDED)


@pytest.fixture
def pool(catalog, h100):
    return make_cluster("eks-shares", "aws", "us-east-1", h100, price="4.20")[1]


def test_a_quarter_gpu_for_an_hour_is_a_quarter_gpu_hour_and_a_quarter_of_the_price(teams, user, pool):
    attempt = ended_attempt(teams[0], user, pool, share_milli=250)

    accrue_attempt(attempt.pk, T0 + 2 * H)

    (entry,) = CostEntry.objects.filter(attempt=attempt)
    assert entry.gpu_milli == 250 and entry.gpus == D("0.25")
    assert entry.amount_usd == D("1.05")  # 0.25 GPU x 1 h x $4.20
    assert TeamSpend.objects.get(team=teams[0]).gpu_seconds == D(900)  # 0.25 x 3600
    assert Job.objects.get(pk=attempt.job_id).accrued_cost_usd == D("1.05")
    rows, total = aggregate_window("job", T0, T0 + 2 * H)
    assert total["gpu_hours"] == 0.25 and total["cost_usd"] == "1.05"


def test_a_mig_share_is_billed_as_its_memory_eighths(teams, user, pool):
    attempt = ended_attempt(teams[0], user, pool, share_milli=125, seconds=1800)  # 1g.10gb: 1/8 of the GPU

    accrue_attempt(attempt.pk, T0 + H)

    (entry,) = CostEntry.objects.filter(attempt=attempt)
    assert entry.amount_usd == D("0.2625")  # 1/8 x 0.5 h x $4.20
    assert AttemptDailyCost.objects.get(attempt=attempt).gpu_seconds == D(225)  # 1/8 x 1800


def test_whole_gpus_keep_their_numbers(teams, user, pool):
    attempt = ended_attempt(teams[0], user, pool, gpus=4, seconds=5400)

    accrue_attempt(attempt.pk, T0 + 2 * H)

    assert [e.gpu_milli for e in CostEntry.objects.filter(attempt=attempt).order_by("interval_start")] == [4000, 4000]
    assert CostEntry.objects.filter(attempt=attempt).aggregate(s=Sum("amount_usd"))["s"] == D("25.2")  # 4 x 1.5 x 4.20
    assert TeamSpend.objects.get(team=teams[0]).gpu_seconds == D(21600)


def test_unpriced_hours_of_a_share_are_its_share(teams, user, h100, catalog):
    pool = make_cluster("onprem-shares", "onprem", "dc-1", h100)[1]  # no price in force on premises
    attempt = ended_attempt(teams[0], user, pool, share_milli=500, seconds=7200)

    accrue_attempt(attempt.pk, T0 + 3 * H)

    assert unpriced_hours(team=teams[0]) == (1.0, 0.0)  # 0.5 GPU x 2 h
    assert TeamSpend.objects.get(team=teams[0]).unpriced_gpu_seconds == D(3600)


holds = st.lists(st.tuples(st.one_of(st.integers(1, 99).map(lambda n: n * 10),  # a share: 0.01 .. 0.99 GPU
                                     st.sampled_from([125, 250, 375, 500, 875]),  # MIG eighths
                                     st.integers(1, 8).map(lambda g: -g)),  # whole GPUs (negative: g GPUs)
                           st.integers(1, 3 * 3600 * 1000).map(lambda ms: ms / 1000),  # seconds, to the millisecond
                           st.integers(0, 7200)),  # start, seconds after T0
                 min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(holds)
def test_ledger_gpu_hours_are_the_sum_of_share_times_seconds(teams, user, pool, mix):
    team = teams[1]
    before = TeamSpend.objects.filter(team=team).values_list("gpu_seconds", flat=True).first() or D(0)
    attempts, expected = [], Fraction(0)
    for held, seconds, offset in mix:
        share = 0 if held < 0 else held
        gpus = -held if held < 0 else 1
        start = T0 + dt.timedelta(seconds=offset)
        attempt = ended_attempt(team, user, pool, share_milli=share, gpus=gpus, start=start, seconds=seconds)
        attempts.append(attempt)
        held_seconds = Fraction(round((attempt.ended_at - start).total_seconds() * 1_000_000), 1_000_000)
        expected += (Fraction(share, 1000) if share else gpus) * held_seconds
    for attempt in attempts:
        accrue_attempt(attempt.pk, T0 + 6 * H)

    spent = TeamSpend.objects.get(team=team).gpu_seconds - before
    by_attempt = AttemptDailyCost.objects.filter(attempt__in=attempts).aggregate(s=Sum("gpu_seconds"))["s"]
    entries = sum(Fraction(e.gpu_milli, 1000) * Fraction(round((e.interval_end - e.interval_start).total_seconds()
                                                               * 1_000_000), 1_000_000)
                  for e in CostEntry.objects.filter(attempt__in=attempts))
    assert Fraction(spent) == Fraction(by_attempt) == entries == expected
    # money: each entry at its share of $4.20, rounded once per entry to 1e-9 half even
    for e in CostEntry.objects.filter(attempt__in=attempts):
        micros = (e.interval_end - e.interval_start) // dt.timedelta(microseconds=1)
        exact = D(e.gpu_milli) / 1000 * D("4.20") * D(micros) / D(1_000_000) / 3600
        assert e.amount_usd == exact.quantize(D("0.000000001"), ROUND_HALF_EVEN)
    # the totals the database rebuilds from the entries (SQL sums) are the ones accrual kept
    rebuild_totals()
    assert TeamSpend.objects.get(team=team).gpu_seconds - before == spent
    assert AttemptDailyCost.objects.filter(attempt__in=attempts).aggregate(s=Sum("gpu_seconds"))["s"] == by_attempt


def test_the_burn_rate_counts_a_running_share_and_unpriced_shares_apart(teams, user, pool, h100):
    onprem = make_cluster("onprem-shares", "onprem", "dc-1", h100)[1]  # no price in force there
    for where, share in ((pool, 250), (pool, 500), (onprem, 750)):
        job = make_job_row(teams[0], user, h100, name="s", spec={}, gpus_per_node=1, max_runtime=86400,
                           state=JobState.RUNNING, gpu_share_milli=share)
        make_attempt(job, where.cluster, where, gpus=1, started_at=T0)

    usd, unpriced = burn_rate(teams[0].pk, T0 + H)

    assert usd == D("3.15")  # (0.25 + 0.5) GPU x $4.20 per hour
    assert unpriced == D("0.75")


def test_the_ledger_check_counts_the_device_a_shared_pod_asks(teams, user, pool):
    for attempt in (ended_attempt(teams[0], user, pool, share_milli=250),  # asks nvidia.com/gpu: 1 for an hour
                    ended_attempt(teams[0], user, pool, gpus=2, seconds=1800)):  # 2 GPUs for half an hour
        accrue_attempt(attempt.pk, T0 + 2 * H)

    assert ledger_gpu_hours(pool.cluster, T0, T0 + 2 * H) == 2.0  # what kube-state-metrics counts: 1 + 1
