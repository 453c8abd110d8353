"""``/api/v1/utilization/`` rows: in numeric order of their job ids (job 999999 before job 1000000, which text order
puts first) and with the cost of the unobserved GPU-hours."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from costs.models import UtilizationRollup
from runners.models import NodePool
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


def test_a_cpu_only_job_is_no_row_of_gpu_utilization(owner, aws_cluster, cpu, teams, h100):
    gpu_job = make_job_row(teams[0], owner.user, h100, name="gpu-job", gpus_per_node=1)
    gpu_attempt = make_attempt(gpu_job, aws_cluster["cluster"], aws_cluster["pool"], started_at=DAY,
                               ended_at=DAY + dt.timedelta(hours=1), state="SUCCEEDED")
    make_cost_entry(gpu_attempt, DAY, dt.timedelta(hours=1), Decimal("6.88"), gpus=1)
    cpu_pool = NodePool.objects.get(accelerator=cpu)
    cpu_job = make_job_row(teams[0], owner.user, cpu, name="prep", gpus_per_node=0)
    cpu_attempt = make_attempt(cpu_job, cpu_pool.cluster, cpu_pool, started_at=DAY,
                               ended_at=DAY + dt.timedelta(hours=1), state="SUCCEEDED")
    make_cost_entry(cpu_attempt, DAY, dt.timedelta(hours=1), Decimal("0.04"), gpus=0, usd_per_gpu_hour="0")
    body = owner.client.get("/api/v1/utilization/", {"group_by": "job", **WINDOW}).json()
    assert [r["job"] for r in body["results"]] == [gpu_job.pk], body["results"]
    assert body["results"][0]["unobserved_cost_usd"] == "6.88"


def test_the_unobserved_cost_of_a_team_and_a_day_is_a_share_of_its_gpu_cost_only(owner, aws_cluster, cpu, teams, h100):
    """One team, one UTC day: a GPU job of 2 GPUs for an hour (13.76 USD at 6.88 per GPU-hour), DCGM saw 1 of its 2
    GPU-hours; a CPU-only job cost 5.00 USD in vCPU and GiB-hours. Half the GPU cost is unobserved; none of the CPU
    job's cost is."""
    gpu_cost, cpu_cost = 2 * Decimal("6.88"), Decimal("5.00")
    gpu_job = make_job_row(teams[0], owner.user, h100, name="train", gpus_per_node=2)
    gpu_attempt = make_attempt(gpu_job, aws_cluster["cluster"], aws_cluster["pool"], started_at=DAY,
                               ended_at=DAY + dt.timedelta(hours=1), state="SUCCEEDED")
    make_cost_entry(gpu_attempt, DAY, dt.timedelta(hours=1), gpu_cost, gpus=2)
    UtilizationRollup.objects.create(
        attempt=gpu_attempt, job=gpu_job, team=teams[0], cluster=aws_cluster["cluster"], accelerator=h100,
        day=DAY.date(), gpu_seconds=2 * 3600, samples=120, expected_samples=240, util_sum=120 * 50.0,
        avg_gpu_util_percent=50.0, observed_gpu_seconds=3600, idle_gpu_seconds=0, util_metric="DCGM_FI_DEV_GPU_UTIL")
    cpu_pool = NodePool.objects.get(accelerator=cpu)
    cpu_job = make_job_row(teams[0], owner.user, cpu, name="prep", gpus_per_node=0)
    cpu_attempt = make_attempt(cpu_job, cpu_pool.cluster, cpu_pool, started_at=DAY,
                               ended_at=DAY + dt.timedelta(hours=1), state="SUCCEEDED")
    make_cost_entry(cpu_attempt, DAY, dt.timedelta(hours=1), cpu_cost, gpus=0, usd_per_gpu_hour="0")
    want = str((gpu_cost * Decimal(1) / Decimal(2)).quantize(Decimal("0.01")))  # 1 of 2 GPU-hours unobserved
    for group_by in ("team", "day"):
        body = owner.client.get("/api/v1/utilization/", {"group_by": group_by, **WINDOW}).json()
        assert [(r["gpu_hours"], r["unobserved_gpu_hours"], r["unobserved_cost_usd"]) for r in body["results"]] == [
            (2.0, 1.0, want)], group_by
        assert body["total"]["unobserved_cost_usd"] == want, group_by
