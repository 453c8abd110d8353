"""Billing on evidence: a live attempt is billed up to its cluster's last contact, not up to now, and what was
billed past an end learned later (the pods' own finish time, told by the cluster after accrual had gone on) is
given back, entries and running totals alike, with an event on the job.

Class of failure: billing on belief (time nobody observed billed as if the pods ran). Invariant (the simulator's
``billed_once``): every pod-second is billed once, and none past the pods' end. Amounts are worked out here from
the formula GPUs x seconds / 3600 x USD per GPU-hour.
"""

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from django.db.models import Sum

from costs.ledger import accrue_attempt, accrue_running
from costs.models import CostEntry, DailyCostRollup, JobDailyCost, TeamSpend
from costs.rollups import rebuild_totals
from jobs.models import Job, JobAttempt, JobEvent, JobState
from runners.models import Cluster
from tests.support.factories import make_attempt, make_job_row

D = Decimal
T0 = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)
M = dt.timedelta(minutes=1)
PRICE = D("6.88")

pytestmark = pytest.mark.django_db


def usd(gpus, seconds):
    return (D(gpus) * D(seconds) * PRICE / D(3600)).quantize(D("0.000000001"), ROUND_HALF_EVEN)


@pytest.fixture
def pool(cluster_factory, h100):
    return cluster_factory("eks", "aws", "us-east-1", h100, price=str(PRICE))[1]


@pytest.fixture
def attempt(pool, teams, user, h100):
    job = make_job_row(teams[0], user, h100, name="j", spec={}, gpus_per_node=4, max_runtime=86400,
                       state=JobState.RUNNING)
    return make_attempt(job, pool.cluster, pool, number=1, gpus=4, started_at=T0, usd_per_gpu_hour=D("0"))


def billed_seconds(attempt):
    return sum((e.interval_end - e.interval_start).total_seconds() for e in CostEntry.objects.filter(attempt=attempt))


def totals(attempt):
    """(team spend, the job's accrued cost, the rollups' and the job-days' sums) in USD (no row: 0)."""
    return (TeamSpend.objects.get(team_id=attempt.job.team_id).cost_usd,
            Job.objects.get(pk=attempt.job_id).accrued_cost_usd,
            DailyCostRollup.objects.aggregate(s=Sum("cost_usd"))["s"] or D(0),
            JobDailyCost.objects.aggregate(s=Sum("cost_usd"))["s"] or D(0))


def test_a_live_attempt_is_billed_up_to_its_clusters_last_contact(attempt):
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=T0 + 5 * M)
    accrue_running(until=T0 + 30 * M)
    assert billed_seconds(attempt) == 300
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=T0 + 30 * M)
    accrue_running(until=T0 + 30 * M)  # the cluster answered again: the time it observed is billed
    assert billed_seconds(attempt) == 1800


@pytest.mark.parametrize("end_minute", [0, 7, 59, 60, 61, 95])
def test_what_was_billed_past_an_end_learned_later_is_given_back(attempt, end_minute):
    """Billed to 12:00 + 100 min (two UTC hours: two entries); the end then learned lies at ``end_minute``."""
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=T0 + 100 * M)
    accrue_attempt(attempt.pk, until=T0 + 100 * M)
    assert billed_seconds(attempt) == 6000
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=T0 + end_minute * M)
    accrue_attempt(attempt.pk, until=T0 + 120 * M)
    assert billed_seconds(attempt) == end_minute * 60
    expected = usd(4, 60 * min(end_minute, 60)) + usd(4, 60 * max(end_minute - 60, 0))
    assert totals(attempt) == (expected,) * 4
    assert JobAttempt.objects.get(pk=attempt.pk).accrued_until == T0 + end_minute * M
    note = JobEvent.objects.get(job_id=attempt.job_id, kind="billing")
    assert note.data["gpu_seconds"] == str(D(4 * 60 * (100 - end_minute)))
    before = totals(attempt)
    rebuild_totals()  # the running totals agree with the entries they summarise
    assert totals(attempt) == before
    accrue_attempt(attempt.pk, until=T0 + 120 * M)  # nothing more to give back, nothing to add
    assert billed_seconds(attempt) == end_minute * 60
    assert JobEvent.objects.filter(job_id=attempt.job_id, kind="billing").count() == 1
