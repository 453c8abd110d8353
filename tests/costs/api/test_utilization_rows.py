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


def _rl_grpo_spec() -> dict:
    """examples/jobs/rl-grpo.yaml's shape: a learner and two rollouts, every role on CPUs (no GPU)."""
    role = {"image": "python:3.11", "command": ["python", "examples/rl_grpo.py"], "env": {},
            "resources": {"accelerator": "CPU", "gpus_per_node": 0, "nodes": 1, "cpu": 1, "memory_gib": 2}}
    return {"roles": {"learner": role, "rollout": {**role, "resources": {**role["resources"], "nodes": 2},
                                                   "completion": False}},
            "priority": "normal", "max_runtime_seconds": 900, "preemptible": False, "placement": {},
            "max_retries": 1}


@pytest.mark.parametrize("collected", ["prepare-data", "rl-grpo", "both", "neither"])
def test_cpu_only_jobs_single_or_multi_role_are_no_row_whichever_a_collection_reached(
        collected, owner, aws_cluster, cpu, teams, h100):
    """A GPU job of 1 GPU for an hour (6.88 USD) and two CPU-only jobs billed in vCPU and GiB-hours: a training job
    of one pod and a multi-role job of three. A collection that ran while a CPU-only attempt was running writes it
    a rollup of 0 GPU-seconds and no sample (``costs.collection``); one that did not writes none. Either way a
    CPU-only job has no GPU to utilize: the rows by job, team and attempt are the GPU job's alone."""
    gpu_job = make_job_row(teams[0], owner.user, h100, name="train", gpus_per_node=1)
    gpu_attempt = make_attempt(gpu_job, aws_cluster["cluster"], aws_cluster["pool"], started_at=DAY,
                               ended_at=DAY + dt.timedelta(hours=1), state="SUCCEEDED")
    gpu_cost = Decimal("6.88")
    make_cost_entry(gpu_attempt, DAY, dt.timedelta(hours=1), gpu_cost, gpus=1)
    cpu_pool = NodePool.objects.get(accelerator=cpu)
    prep = make_job_row(teams[0], owner.user, cpu, name="prepare-data", gpus_per_node=0)
    grpo = make_job_row(teams[0], owner.user, cpu, name="rl-grpo", kind="multi-role", spec=_rl_grpo_spec(),
                        nodes=3, gpus_per_node=0)
    cpu_attempts = {}
    for job, minutes, usd in ((prep, 10, Decimal("0.01")), (grpo, 20, Decimal("0.05"))):
        attempt = make_attempt(job, cpu_pool.cluster, cpu_pool, gpus=0, started_at=DAY,
                               ended_at=DAY + dt.timedelta(minutes=minutes), state="SUCCEEDED")
        if job.kind == "multi-role":
            attempt.placement = {"roles": {"learner": {"nodes": ["cpu-1"], "gpus_per_node": 0},
                                           "rollout": {"nodes": ["cpu-2", "cpu-3"], "gpus_per_node": 0}}}
            attempt.save(update_fields=["placement"])
        make_cost_entry(attempt, DAY, dt.timedelta(minutes=minutes), usd, gpus=0, usd_per_gpu_hour="0")
        cpu_attempts[job.name] = attempt
    for name, attempt in cpu_attempts.items():
        if collected in (name, "both"):  # what a collection writes for an attempt of 0 GPUs: nothing allocated, seen
            UtilizationRollup.objects.create(
                attempt=attempt, job=attempt.job, team=teams[0], cluster=cpu_pool.cluster, accelerator=cpu,
                day=DAY.date(), gpu_seconds=0.0, samples=0, expected_samples=0.0, util_sum=0.0,
                observed_gpu_seconds=0.0, idle_gpu_seconds=None, util_metric="")

    by_job = owner.client.get("/api/v1/utilization/", {"group_by": "job", **WINDOW}).json()
    assert [(r["job"], r["job_name"]) for r in by_job["results"]] == [(gpu_job.pk, "train")], by_job["results"]
    row = by_job["results"][0]
    assert (row["gpu_hours"], row["unobserved_gpu_hours"], row["unobserved_cost_usd"]) == (1.0, 1.0, str(gpu_cost))
    assert (by_job["total"]["gpu_hours"], by_job["total"]["unobserved_cost_usd"]) == (1.0, str(gpu_cost))
    by_team = owner.client.get("/api/v1/utilization/", {"group_by": "team", **WINDOW}).json()
    assert [(r["team"], r["gpu_hours"]) for r in by_team["results"]] == [(teams[0].slug, 1.0)]
    for job in (prep, grpo):  # one job's attempts (its page's table): none
        by_attempt = owner.client.get("/api/v1/utilization/", {"group_by": "attempt", "job": job.pk, **WINDOW}).json()
        assert by_attempt["results"] == [], (job.name, by_attempt["results"])
