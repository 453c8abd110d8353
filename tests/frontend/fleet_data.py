"""The fleet the Nodes, Clusters and Utilization page tests read: nodes with work placed on them, and a week of
GPU-hours billed with and without DCGM samples. Each figure the tests expect is worked out here by hand."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import time_machine
from django.utils import timezone

from costs import running
from costs.models import NodeUtilizationRollup, UtilizationRollup
from jobs.models import JobAttempt
from runners import health
from runners.base import NodeInfo, PoolCapacity
from runners.kubernetes.sync import apply_pools
from runners.models import Node
from tests.runners.api.test_nodes_endpoint import XID_79
from tests.support.factories import make_attempt, make_cost_entry, make_job, make_job_row

GIB = 1024  # MiB


def place(job, cluster, pool, node: str, *, gpus: int, cpu_milli: int, memory_mib: int) -> JobAttempt:
    """A live attempt of ``job`` placed on ``node`` holding ``gpus`` GPUs, ``cpu_milli`` and ``memory_mib``."""
    attempt = make_attempt(job, cluster, pool, gpus=gpus)
    JobAttempt.objects.filter(pk=attempt.pk).update(placement={"nodes": [node], "gpus_per_node": gpus,
                                                               "cpu_milli": cpu_milli, "memory_mib": memory_mib})
    return attempt


def make_fleet(aws_cluster, cpu, teams, user, h100) -> dict:
    """aws-use1's H100 pool: n0 (healthy; a job holds 4 GPUs, 16 vCPU, 64 GiB and pods the platform does not own
    1 GPU, 2 vCPU, 8 GiB) and n1 (unhealthy: XID 79), 8 GPUs, 64 vCPU, 512 GiB each; gcp-usc1's CPU pool: cpu-0 to
    cpu-3 (16 vCPU, 64 GiB each), a CPU job holding 6 vCPU and 10 GiB of cpu-0.

    ``expected`` is each node's (GPUs, allocated, free, vCPU, vCPU free, GiB, GiB free) as the pages show them."""
    cluster, pool = aws_cluster["cluster"], aws_cluster["pool"]
    now = timezone.now()
    n0 = Node.objects.create(cluster=cluster, node_pool=pool, name="n0", gpus=8, cpu_milli=64_000,
                             memory_mib=512 * GIB, foreign_gpus=1, foreign_cpu_milli=2_000, foreign_memory_mib=8 * GIB,
                             seen_at=now)
    n1 = Node.objects.create(cluster=cluster, node_pool=pool, name="n1", gpus=8, cpu_milli=64_000,
                             memory_mib=512 * GIB, seen_at=now)
    health.store_health(n1, "unhealthy", [XID_79], now)
    place(make_job(teams[0], user, h100, name="on-n0", gpus_per_node=4), cluster, pool, "n0", gpus=4,
          cpu_milli=16_000, memory_mib=64 * GIB)
    cpu_pool = Node.objects.get(name="cpu-0").node_pool
    place(make_job_row(teams[0], user, cpu, name="cpu-job", gpus_per_node=0, state="RUNNING"), cpu_pool.cluster, cpu_pool, "cpu-0",
          gpus=0, cpu_milli=6_000, memory_mib=10 * GIB)
    expected = {
        "n0": ("8", "5", "3", "64.0", "46.0", "512.0", "440.0"),  # 8-4-1 GPUs, 64-16-2 vCPU, 512-64-8 GiB
        "n1": ("8", "0", "0", "64.0", "0.0", "512.0", "0.0"),  # unhealthy: it takes no work, nothing is free
        "cpu-0": ("0", "0", "0", "16.0", "10.0", "64.0", "54.0"),
        **{f"cpu-{i}": ("0", "0", "0", "16.0", "16.0", "64.0", "64.0") for i in (1, 2, 3)},
    }
    return {"n0": n0, "n1": n1, "cpu_pool": cpu_pool, "expected": expected}


def yesterday() -> dt.datetime:
    """10:00 UTC of yesterday (UTC)."""
    day = timezone.now().astimezone(dt.UTC).date() - dt.timedelta(days=1)
    return dt.datetime.combine(day, dt.time(10), tzinfo=dt.UTC)


def make_use(aws_cluster, teams, user, h100) -> dict:
    """alpha's GPU-hours at $6.88 per GPU-hour: "big" yesterday, 8 GPUs x 2 h (16 GPU-h, $110.08), 12 of them
    observed by DCGM at 40 % on average, 3 idle; "small" yesterday, 1 GPU x 3 h ($20.64), never observed; "old" 10
    days ago, 2 GPUs x 1 h ($13.76), never observed (only in a 30-day window)."""
    cluster, pool = aws_cluster["cluster"], aws_cluster["pool"]
    start = yesterday()
    made = {}
    for name, gpus, hours, when in (("small", 1, 3, start), ("big", 8, 2, start),
                                    ("old", 2, 1, start - dt.timedelta(days=9))):
        job = make_job(teams[0], user, h100, name=name, gpus_per_node=gpus)
        attempt = make_attempt(job, cluster, pool, started_at=when, ended_at=when + dt.timedelta(hours=hours),
                               state="SUCCEEDED")
        make_cost_entry(attempt, when, dt.timedelta(hours=hours), gpus * hours * Decimal("6.88"), gpus=gpus)
        made[name] = (job, attempt)
    job, attempt = made["big"]
    UtilizationRollup.objects.create(
        attempt=attempt, job=job, team=teams[0], cluster=cluster, accelerator=h100, day=start.date(),
        gpu_seconds=16 * 3600, samples=432, expected_samples=576, util_sum=432 * 40.0, avg_gpu_util_percent=40.0,
        observed_gpu_seconds=12 * 3600, idle_gpu_seconds=3 * 3600, util_metric="DCGM_FI_DEV_GPU_UTIL")
    return {name: job for name, (job, _) in made.items()}


def make_node_use(aws_cluster, big_job) -> str:
    """Node ``n-big`` of aws-use1 (8 GPUs) as node sync saw it yesterday from 10:00 to 12:00 UTC, every 15 minutes,
    with ``make_use``'s "big" placed on it and its per-node rollup as dcgm-exporter's ``Hostname`` gives it: its 12
    observed GPU-hours at 40 % on average, 3 of them idle. Returns the node's row key on the Utilization page."""
    cluster, pool = aws_cluster["cluster"], aws_cluster["pool"]
    start = yesterday()
    node = NodeInfo(name="n-big", gpus=8, cpu_milli=96_000, memory_mib=1 << 20)
    found = [PoolCapacity(name=pool.name, accelerator=pool.accelerator.name, capacity_type=pool.capacity_type,
                          nodes=1, gpus_per_node=8, node_list=(node,))]
    for quarter in range(9):
        with time_machine.travel(start + dt.timedelta(minutes=15 * quarter), tick=False):
            apply_pools(cluster, found)
    attempt = JobAttempt.objects.get(job=big_job)
    JobAttempt.objects.filter(pk=attempt.pk).update(placement={"nodes": ["n-big"], "gpus_per_node": 8})
    running.reattribute(attempt.pk, attempt.gpus, attempt.placement)  # its billed time moves to n-big (placement changes)
    NodeUtilizationRollup.objects.create(attempt=attempt, team_id=big_job.team_id, cluster=cluster, day=start.date(),
                                         node="n-big", samples=432, util_sum=432 * 40.0,
                                         observed_gpu_seconds=12 * 3600, idle_gpu_seconds=3 * 3600)
    return f"{cluster.name}/n-big"
