"""The admission's locked re-check reads the team's spend after locking its totals row: an accrual in flight
commits wholly before the figures are read, never half.

The accrual is played by a transaction that posts ledger entries (with their totals) and holds them uncommitted.
"""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

from costs.ledger import post_entries
from costs.models import CostEntry
from jobs.scheduling.snapshot import budget_views
from tests.support.factories import make_attempt, make_job_row

D = Decimal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def accrual_in_flight(cluster_factory, budget_factory, alpha, user, h100):
    """Alpha with a $1,000 block budget; yields ``(now, commit)`` while another transaction has posted $27.52 of
    alpha's spend in this period (4 GPUs x 1 h x $6.88) and holds it uncommitted until ``commit()`` (which
    returns once it committed)."""
    _, pool = cluster_factory("eks", "aws", "us-east-1", h100, price="6.88")
    budget_factory(alpha, "1000.00", action="block")
    job = make_job_row(alpha, user, h100, name="running", spec={}, gpus_per_node=4, max_runtime=86400)
    attempt = make_attempt(job, pool.cluster, pool, gpus=4, usd_per_gpu_hour="6.88")
    now = timezone.now()
    start = max(now - dt.timedelta(hours=1), now.replace(day=1, hour=0, minute=0, second=0, microsecond=0))
    posted, release = threading.Event(), threading.Event()

    def accrual():
        with transaction.atomic():
            post_entries([CostEntry(attempt=attempt, job=job, team=alpha, cluster=pool.cluster, accelerator=h100,
                                    interval_start=start, interval_end=start + dt.timedelta(hours=1), gpu_milli=4000,
                                    usd_per_gpu_hour=D("6.88"), amount_usd=D("27.52"))])
            posted.set()
            release.wait(30)
        connection.close()

    def commit():
        release.set()
        writer.join()

    writer = threading.Thread(target=accrual)
    writer.start()
    assert posted.wait(30)
    try:
        yield now, commit
    finally:
        commit()


def test_the_locked_recheck_waits_for_an_accrual_in_flight_and_reads_its_spend(accrual_in_flight, alpha):
    now, commit = accrual_in_flight
    read = {}

    def recheck():
        with transaction.atomic():
            [view] = budget_views(alpha.pk, now, lock=True)
            read["spent"] = view.spent_usd
        connection.close()

    reader = threading.Thread(target=recheck)
    reader.start()
    reader.join(1.0)
    assert reader.is_alive() and "spent" not in read  # it waits on the totals row the accrual holds
    commit()
    reader.join(30)
    assert read["spent"] == D("27.52")


def test_the_unlocked_pass_reads_the_committed_spend_without_waiting(accrual_in_flight, alpha):
    now, commit = accrual_in_flight
    [view] = budget_views(alpha.pk, now)  # the pass's snapshot: no lock, the last committed totals
    assert view.spent_usd == 0
    commit()
    [view] = budget_views(alpha.pk, now)
    assert view.spent_usd == D("27.52")
