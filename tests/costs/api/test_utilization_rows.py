"""``/api/v1/utilization/`` rows: in numeric order of their job ids (job 999999 before job 1000000, which text order
puts first) and with the cost of the unobserved GPU-hours."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from tests.support.factories import make_attempt, make_cost_entry, make_job_row

pytestmark = pytest.mark.django_db
DAY = dt.datetime(2026, 3, 10, 9, tzinfo=dt.UTC)
WINDOW = {"start": "2026-03-10T00:00:00Z", "end": "2026-03-11T00:00:00Z"}


def test_job_rows_come_in_numeric_order_with_the_cost_of_their_unobserved_hours(owner, aws_cluster, teams, h100):
    cluster, pool = aws_cluster["cluster"], aws_cluster["pool"]
    for pk, gpus in ((1_000_000, 2), (999_999, 1)):
        job = make_job_row(teams[0], owner.user, h100, name=f"job-{pk}", gpus_per_node=gpus, id=pk)
        attempt = make_attempt(job, cluster, pool, started_at=DAY, ended_at=DAY + dt.timedelta(hours=1),
                               state="SUCCEEDED")
        make_cost_entry(attempt, DAY, dt.timedelta(hours=1), gpus * Decimal("6.88"), gpus=gpus)
    body = owner.client.get("/api/v1/utilization/", {"group_by": "job", **WINDOW}).json()
    assert [r["job"] for r in body["results"]] == [999_999, 1_000_000]
    # no DCGM sample at all: every billed GPU-hour is unobserved, and so is its whole cost
    assert [(r["unobserved_gpu_hours"], r["unobserved_cost_usd"]) for r in body["results"]] == [
        (1.0, "6.88"), (2.0, "13.76")]
    assert body["total"]["unobserved_cost_usd"] == "20.64"
