"""The local runner's CPU pool (ADR 0012): this machine's CPUs and memory as a node pool of the CPU flavor, priced
like the catalog's GCP us-central1 vCPU-hours and GiB-hours, where a CPU-only job is admitted, runs to SUCCEEDED
with the cores it asked for and is billed (vCPUs x vCPU price + GiB x GiB price) x hours.

Jobs run real (short) Python processes under ``tmp_path``, through ``try_admit``, the ``dispatch_attempt`` task body
and ``reconcile_cluster`` called directly, as in ``test_local_runner``.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal

import pytest

from costs.ledger import accrue_attempt
from costs.models import CostEntry, Price
from costs.seed import seed_cpu_prices
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from runners.base import backend_for
from runners.local.capacity import ensure_local_cluster, machine_resources
from runners.models import Node
from tests.support.factories import make_job_row
from tests.support.local_runner import dispatched, emulated_local_cluster_for, wait_until

# The seeded catalog row of costs/data/cpu_prices.csv (GCP N2 on-demand, us-central1), read here from the file's
# published figures rather than from the code that copies them.
VCPU_HOUR, GIB_HOUR = Decimal("0.031611"), Decimal("0.004237")
PRINT_THREADS = ["python", "-c", "import os; print('threads', os.environ['OMP_NUM_THREADS'])"]


@pytest.fixture
def local_cpu(local_runs, settings, monkeypatch, catalog, teams):
    """The emulated local cluster of 2 nodes (CPU catalog prices seeded first); its ``cpu`` pool."""
    seed_cpu_prices()
    cluster = emulated_local_cluster_for(settings, monkeypatch, teams[0], catalog["H100-80GB"], nodes=2)
    return cluster.node_pools.get(name="cpu")


def cpu_job(team, user, pool, *, nodes: int, cores: float, memory_gib: float, command) -> Job:
    spec = {"image": "python:3.11", "command": command, "env": {},
            "resources": {"accelerator": "CPU", "gpus_per_node": 0, "nodes": nodes, "cpu": cores,
                          "memory_gib": memory_gib},
            "priority": "normal", "max_runtime_seconds": 600, "preemptible": False, "placement": {}, "max_retries": 0}
    return make_job_row(team, user, pool.accelerator, name="prep", gpus_per_node=0, nodes=nodes, max_runtime=600,
                        spec=spec)


def test_the_local_cluster_reports_this_machines_cpus_and_memory_as_a_priced_cpu_pool(local_cpu):
    pool = local_cpu
    cpu_milli, memory_mib = machine_resources()
    assert (pool.accelerator.is_cpu, pool.gpus_per_node, pool.nodes, pool.capacity_type) == (True, 0, 2, "on-demand")
    nodes = list(Node.objects.filter(node_pool=pool).order_by("name").values_list("name", "gpus", "cpu_milli",
                                                                                  "memory_mib"))
    assert nodes == [(f"local-cpu-{i}", 0, cpu_milli, memory_mib) for i in range(2)]
    price = Price.objects.get(cluster=pool.cluster, accelerator=pool.accelerator)
    assert (price.usd_per_gpu_hour, price.usd_per_vcpu_hour, price.usd_per_gib_hour) == (0, VCPU_HOUR, GIB_HOUR)
    assert [p.name for p in backend_for(pool.cluster).discover(pool.cluster)] == ["gpu", "cpu"]

    counts = (Node.objects.count(), Price.objects.count())
    ensure_local_cluster()  # idempotent
    assert (Node.objects.count(), Price.objects.count()) == counts


def test_a_cpu_only_job_runs_to_succeeded_on_the_local_cpu_pool_billed_by_vcpu_and_gib_hours(local_cpu, teams, user):
    pool = local_cpu
    job = cpu_job(teams[0], user, pool, nodes=2, cores=1.5, memory_gib=0.5, command=PRINT_THREADS)

    assert try_admit(job.pk) == "admitted"  # alpha has no CPU quota: quota-free
    attempt = JobAttempt.objects.select_related("job__team", "cluster", "node_pool").get(job=job)
    assert (attempt.node_pool_id, attempt.gpus) == (pool.pk, 0)
    attempt = dispatched(attempt)

    def succeeded():
        reconcile_cluster(attempt.cluster)
        job.refresh_from_db()
        return job.state == JobState.SUCCEEDED
    wait_until(succeeded, 20, "the CPU-only job to succeed")

    backend = backend_for(attempt.cluster)
    assert [backend.logs(attempt, n).strip() for n in range(2)] == ["threads 2", "threads 2"]  # 1.5 cores, up
    attempt.refresh_from_db()
    accrue_attempt(attempt.pk)
    entries = list(CostEntry.objects.filter(attempt=attempt))
    assert entries and all(e.gpus == 0 and e.cpu_milli == 3000 and e.memory_mib == 1024 for e in entries)
    assert (entries[0].interval_start, max(e.interval_end for e in entries)) == (attempt.started_at, attempt.ended_at)
    seconds = Decimal((attempt.ended_at - attempt.started_at) // dt.timedelta(microseconds=1)) / Decimal(10**6)
    per_hour = Decimal(3) * VCPU_HOUR + Decimal(1) * GIB_HOUR  # 2 pods x 1.5 vCPUs, 2 x 0.5 GiB
    expected = (per_hour * seconds / 3600).quantize(Decimal("1e-9"), ROUND_HALF_EVEN)
    total = sum(e.amount_usd for e in entries)
    assert abs(total - expected) <= Decimal("1e-9") * len(entries)
    job.refresh_from_db()
    assert job.accrued_cost_usd == total
