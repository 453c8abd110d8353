"""The cost ledger: GPUs x time x price in force, idempotent, split at price changes and UTC hours, rounded 1e-9
half even; an open entry grows until a boundary; no price means GPU-hours of unknown cost.

Times are fixed instants (after the catalog epoch), so every amount is
worked out here with Decimal arithmetic from the formula of docs/design.md, Cost ledger.
"""

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from django.db.models import Sum

from costs.ledger import accrue_attempt
from costs.models import CostEntry, Price
from jobs.models import Job, JobAttempt, JobState
from tests.support.factories import make_attempt, make_job_row

D = Decimal
T0 = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.timezone.utc)
H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)
QUANTUM = D("0.000000001")

pytestmark = pytest.mark.django_db


def usd(gpus, seconds, price):
    """Hand formula: GPUs x seconds / 3600 x USD per GPU-hour, to 1e-9 half even."""
    return (D(gpus) * D(seconds) * D(price) / D(3600)).quantize(QUANTUM, ROUND_HALF_EVEN)


@pytest.fixture
def attempt_on(teams, user, h100):
    """``attempt_on(pool, *, gpus=4, started_at=T0, ended_at=None, job=None, number=1)``: an attempt of a RUNNING
    job of alpha (a new one unless ``job``) on ``pool``, recorded at 0 USD/GPU-h so only the catalog can price it."""
    def make(pool, *, gpus=4, started_at=T0, ended_at=None, job=None, number=1):
        job = job or make_job_row(teams[0], user, h100, name="j", spec={}, gpus_per_node=gpus, max_runtime=86400,
                                  state=JobState.RUNNING)
        return make_attempt(job, pool.cluster, pool, number=number, gpus=gpus, started_at=started_at,
                            ended_at=ended_at, usd_per_gpu_hour=D("0"))
    return make


@pytest.fixture
def pool(cluster_factory, h100):
    return cluster_factory("eks", "aws", "us-east-1", h100, price="6.88")[1]


def entries(attempt):
    return list(CostEntry.objects.filter(attempt=attempt).order_by("interval_start"))


def spans(attempt):
    return [(e.interval_start, e.interval_end, e.usd_per_gpu_hour, e.amount_usd) for e in entries(attempt)]


def accrued(attempt):
    return Job.objects.get(pk=attempt.job_id).accrued_cost_usd


def test_four_gpus_for_ninety_minutes_cost_four_times_one_and_a_half_hours_times_the_price(pool, attempt_on):
    attempt = attempt_on(pool, gpus=4)
    added = accrue_attempt(attempt.pk, until=T0 + 90 * M)
    expected = D(4) * D("1.5") * D("6.88")
    assert expected == D("41.28")
    assert added == expected
    first, second = entries(attempt)  # cut at the UTC hour: 4 x 1 h x 6.88 = 27.52, 4 x 0.5 h x 6.88 = 13.76
    assert (first.interval_start, first.interval_end, first.amount_usd) == (T0, T0 + H, D("27.52"))
    assert (second.interval_start, second.interval_end, second.amount_usd) == (T0 + H, T0 + 90 * M, D("13.76"))
    for entry in (first, second):
        assert entry.gpus == 4 and entry.usd_per_gpu_hour == D("6.88")
        assert (entry.job_id, entry.team_id, entry.cluster_id, entry.accelerator_id) == (
            attempt.job_id, attempt.job.team_id, pool.cluster_id, pool.accelerator_id)
    assert accrued(attempt) == expected
    assert JobAttempt.objects.get(pk=attempt.pk).accrued_until == T0 + 90 * M


def test_accruing_twice_to_the_same_instant_adds_nothing(pool, attempt_on):
    attempt = attempt_on(pool)
    first = accrue_attempt(attempt.pk, until=T0 + H)
    assert accrue_attempt(attempt.pk, until=T0 + H) == 0
    assert accrue_attempt(attempt.pk, until=T0 + 30 * M) == 0  # an earlier instant neither
    assert len(entries(attempt)) == 1
    assert accrued(attempt) == first == usd(4, 3600, "6.88")


def test_a_later_accrual_extends_the_open_entry_until_the_hour_ends_with_no_gap_or_overlap(pool, attempt_on):
    attempt = attempt_on(pool, gpus=4)
    accrue_attempt(attempt.pk, until=T0 + 10 * M)
    accrue_attempt(attempt.pk, until=T0 + 25 * M)
    [entry] = entries(attempt)  # one open entry, grown: its amount is its whole interval's, rounded once
    assert (entry.interval_start, entry.interval_end, entry.amount_usd) == (T0, T0 + 25 * M, usd(4, 25 * 60, "6.88"))
    stops = [T0 + 25 * M + dt.timedelta(seconds=1, microseconds=500), T0 + 2 * H + 7 * M]
    for until in stops:
        accrue_attempt(attempt.pk, until=until)
    rows = entries(attempt)
    assert [(e.interval_start, e.interval_end) for e in rows] == [(T0, T0 + H), (T0 + H, T0 + 2 * H),
                                                                 (T0 + 2 * H, T0 + 2 * H + 7 * M)]
    assert [e.amount_usd for e in rows] == [usd(4, 3600, "6.88"), usd(4, 3600, "6.88"), usd(4, 7 * 60, "6.88")]
    assert accrued(attempt) == sum(e.amount_usd for e in rows)
    # to 1e-9 that is the whole 127 minutes: 4 x 127/60 h x 6.88
    assert abs(accrued(attempt) - D(4) * D(127) / D(60) * D("6.88")) <= 3 * QUANTUM
    assert JobAttempt.objects.get(pk=attempt.pk).accrued_until == stops[-1]


def test_a_price_change_inside_the_interval_splits_the_entry_at_the_change(pool, attempt_on, h100):
    Price.objects.create(provider="aws", region="us-east-1", accelerator=h100, capacity_type="on-demand",
                         cluster=pool.cluster, usd_per_gpu_hour=D("8.00"), effective_from=T0 + H)
    attempt = attempt_on(pool, gpus=4)
    added = accrue_attempt(attempt.pk, until=T0 + 90 * M)
    # [T0, T0+1h) at 6.88: 4 x 1 x 6.88 = 27.52; [T0+1h, T0+1.5h) at 8.00: 4 x 0.5 x 8 = 16.00
    assert spans(attempt) == [(T0, T0 + H, D("6.88"), D("27.52")), (T0 + H, T0 + 90 * M, D("8.00"), D("16.00"))]
    assert added == D("43.52") == accrued(attempt)


def test_a_catalog_price_change_splits_too_when_the_cluster_has_no_override(cluster_factory, attempt_on, h100):
    _, pool = cluster_factory("gke", "gcp", "us-central1", h100)  # catalog: 4.20
    Price.objects.create(provider="gcp", region="us-central1", accelerator=h100, capacity_type="on-demand",
                         usd_per_gpu_hour=D("5.00"), effective_from=T0 + 20 * M)
    attempt = attempt_on(pool, gpus=3)
    accrue_attempt(attempt.pk, until=T0 + H)
    # 3 x 1/3 h x 4.20 = 4.20; 3 x 2/3 h x 5.00 = 10.00
    assert spans(attempt) == [(T0, T0 + 20 * M, D("4.20"), D("4.20")), (T0 + 20 * M, T0 + H, D("5.00"), D("10.00"))]


def test_a_price_added_later_never_reprices_what_is_already_in_the_ledger(pool, attempt_on, h100):
    attempt = attempt_on(pool, gpus=4)
    accrue_attempt(attempt.pk, until=T0 + H)
    before = spans(attempt)
    assert before == [(T0, T0 + H, D("6.88"), D("27.52"))]

    Price.objects.create(provider="aws", region="us-east-1", accelerator=h100, capacity_type="on-demand",
                         cluster=pool.cluster, usd_per_gpu_hour=D("9.50"), effective_from=T0 + 2 * H)
    accrue_attempt(attempt.pk, until=T0 + 3 * H)

    assert spans(attempt) == before + [
        (T0 + H, T0 + 2 * H, D("6.88"), D("27.52")),  # still the old price until the change
        (T0 + 2 * H, T0 + 3 * H, D("9.50"), D("38.00")),  # 4 x 1 x 9.50
    ]
    assert accrued(attempt) == D("27.52") + D("27.52") + D("38.00")


def test_a_backdated_price_leaves_entries_already_written_as_they_were(pool, attempt_on, h100):
    attempt = attempt_on(pool, gpus=2)
    accrue_attempt(attempt.pk, until=T0 + H)  # 2 x 1 x 6.88 = 13.76
    Price.objects.create(provider="aws", region="us-east-1", accelerator=h100, capacity_type="on-demand",
                         cluster=pool.cluster, usd_per_gpu_hour=D("1.00"), effective_from=T0 + 30 * M)
    accrue_attempt(attempt.pk, until=T0 + 2 * H)
    assert spans(attempt) == [(T0, T0 + H, D("6.88"), D("13.76")), (T0 + H, T0 + 2 * H, D("1.00"), D("2.00"))]
    assert accrued(attempt) == D("15.76")


def test_an_ended_attempt_accrues_only_up_to_its_end(pool, attempt_on):
    attempt = attempt_on(pool, gpus=4, ended_at=T0 + 45 * M)
    added = accrue_attempt(attempt.pk, until=T0 + 5 * H)
    assert added == D(4) * D("0.75") * D("6.88") == D("20.64")
    assert spans(attempt) == [(T0, T0 + 45 * M, D("6.88"), D("20.64"))]
    assert accrue_attempt(attempt.pk, until=T0 + 6 * H) == 0
    assert accrue_attempt(attempt.pk) == 0  # now, long after the end
    assert len(entries(attempt)) == 1 and accrued(attempt) == D("20.64")


def test_an_attempt_that_never_started_costs_nothing(pool, attempt_on):
    attempt = attempt_on(pool, started_at=None)
    assert accrue_attempt(attempt.pk, until=T0 + 10 * H) == 0
    assert not CostEntry.objects.exists()
    assert JobAttempt.objects.get(pk=attempt.pk).accrued_until is None
    assert accrued(attempt) == 0


def test_no_price_for_the_clusters_region_accrues_gpu_hours_of_unknown_cost(cluster_factory, attempt_on, h100):
    _, pool = cluster_factory("basement", "onprem", "dc-1", h100)  # no catalog row, no override
    attempt = attempt_on(pool)
    assert accrue_attempt(attempt.pk, until=T0 + 30 * M) == 0
    assert accrue_attempt(attempt.pk, until=T0 + H) == 0
    assert spans(attempt) == [(T0, T0 + H, None, None)]  # one entry, grown, price and amount unknown
    assert JobAttempt.objects.get(pk=attempt.pk).accrued_until == T0 + H
    assert accrued(attempt) == 0


def test_a_price_starting_after_the_attempt_leaves_unknown_cost_before_it_and_prices_the_rest(
        cluster_factory, attempt_on, h100):
    cluster, pool = cluster_factory("basement", "onprem", "dc-1", h100)
    Price.objects.create(provider="onprem", region="dc-1", accelerator=h100, capacity_type="on-demand",
                         cluster=cluster, usd_per_gpu_hour=D("2.00"), effective_from=T0 + 30 * M)
    attempt = attempt_on(pool)
    # [T0, T0+30m) has no price, [T0+30m, T0+1h) 4 GPUs x 0.5 h x 2.00 = 4.00
    assert accrue_attempt(attempt.pk, until=T0 + H) == D("4.00")
    assert spans(attempt) == [(T0, T0 + 30 * M, None, None), (T0 + 30 * M, T0 + H, D("2.00"), D("4.00"))]
    assert accrued(attempt) == D("4.00")


def test_the_jobs_accrued_cost_is_the_sum_of_its_entries_over_attempts(pool, attempt_on):
    first = attempt_on(pool, gpus=4, ended_at=T0 + 20 * M)
    second = attempt_on(pool, gpus=4, job=first.job, number=2, started_at=T0 + 30 * M)
    for until in (T0 + 10 * M, T0 + 40 * M, T0 + 77 * M):
        accrue_attempt(first.pk, until=until)
        accrue_attempt(second.pk, until=until)
    job = Job.objects.get(pk=first.job_id)
    total = CostEntry.objects.filter(job=job).aggregate(s=Sum("amount_usd"))["s"]
    assert job.accrued_cost_usd == total
    # first: 20 min in one entry; second: 47 min from T0+30m, cut at T0+1h; 4 GPUs at 6.88
    assert total == usd(4, 20 * 60, "6.88") + usd(4, 30 * 60, "6.88") + usd(4, 17 * 60, "6.88")
    assert CostEntry.objects.filter(attempt=second).first().interval_start == T0 + 30 * M


def test_an_odd_interval_is_rounded_half_even_to_a_billionth_of_a_dollar(pool, attempt_on):
    attempt = attempt_on(pool, gpus=3)
    added = accrue_attempt(attempt.pk, until=T0 + dt.timedelta(seconds=7))
    # 3 x 7 x 6.88 / 3600 = 144.48 / 3600 = 0.0401333...
    exact = D(3) * D(7) * D("6.88") / D(3600)
    assert exact.quantize(QUANTUM, ROUND_HALF_EVEN) == D("0.040133333")
    assert added == D("0.040133333") == entries(attempt)[0].amount_usd == accrued(attempt)


def test_a_tie_at_the_tenth_decimal_rounds_to_the_even_billionth(cluster_factory, attempt_on, h100):
    cluster, pool = cluster_factory("tiny", "onprem", "dc-1", h100, price="0.000009")
    attempt = attempt_on(pool, gpus=1)
    # 1 x 1 s x 0.000009 / 3600 = 0.0000000025 -> 0.000000002 (half up would give ...3)
    assert accrue_attempt(attempt.pk, until=T0 + dt.timedelta(seconds=1)) == D("0.000000002")
    # 1 x 1.4 s x 0.000009 / 3600 = 0.0000000035 -> 0.000000004 (half down would give ...3)
    assert accrue_attempt(attempt.pk, until=T0 + dt.timedelta(seconds=2, microseconds=400_000)) == D("0.000000004")
    assert accrued(attempt) == D("0.000000006")
