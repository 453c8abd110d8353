"""CPU-only jobs end to end on an emulated cluster: nodes without GPUs labelled for the platform become a CPU node
pool (accelerator CPU, 0 GPUs per node) with their allocatable CPU and memory; a job with ``gpus_per_node: 0`` is
admitted without any GPU quota onto a node with room for its CPU and memory, dispatched without a GPU request or
the GPU toleration, reconciled to its end, and billed by vCPU-hour and GiB-hour at the catalog's CPU price, its MFU
null for the CPU."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

from costs.ledger import accrue_attempt
from costs.models import CostEntry
from costs.seed import seed_cpu_prices
from jobs.lifecycle import dispatch
from jobs.models import Job, JobState
from jobs.scheduling.passes import try_admit
from jobs.workload import job_efficiency
from runners.kubernetes.nodepools import CPU_POOL_LABEL
from runners.kubernetes.sync import sync_cluster
from runners.models import Accelerator, Node, NodePool
from tests.support.clusters import load, state
from tests.support.factories import make_job_row

S = JobState
# GCP N2 on-demand in us-central1 (costs/data/cpu_prices.csv): USD per vCPU-hour and per GiB-hour.
VCPU_HOUR, GIB_HOUR = Decimal("0.031611"), Decimal("0.004237")


def cpu_job(world, cpu: float, memory_gib: float, *, nodes: int = 1, max_runtime: int = 3600) -> Job:
    """A CPU-only training job of alpha (no accelerator named, 0 GPUs), queued, placed on gcp-usc1."""
    flavor = Accelerator.objects.get(name="CPU")
    spec = {"image": "registry.example/prep:1", "command": ["python", "prep.py"], "args": [], "env": {},
            "resources": {"accelerator": "CPU", "gpus_per_node": 0, "nodes": nodes, "cpu": cpu,
                          "memory_gib": memory_gib},
            "placement": {"clusters": ["gcp-usc1"]}, "max_runtime_seconds": max_runtime, "max_retries": 0,
            "preemptible": False}
    return make_job_row(world.team, world.user, flavor, name="prep", spec=spec, gpus_per_node=0, nodes=nodes,
                        max_runtime=max_runtime)


def with_cpu_nodes(world) -> None:
    """gcp-usc1 gets two CPU nodes (64 cores, 512 GiB each, as the emulator's nodes have) and a system node
    without the label; the pools are synced and the CPU prices seeded."""
    seed_cpu_prices()
    gcp = world.emulators["gcp-usc1"]
    for i in range(2):
        gcp.add_node(f"gcp-usc1-cpu-{i}", 0, {CPU_POOL_LABEL: "true"})
    gcp.add_node("gcp-usc1-system", 0, {})
    sync_cluster(world.clusters["gcp-usc1"])


def test_labelled_nodes_without_gpus_form_a_cpu_node_pool(live_clusters):
    with_cpu_nodes(live_clusters)
    pool = NodePool.objects.get(cluster__name="gcp-usc1", accelerator__name="CPU")
    assert (pool.nodes, pool.gpus_per_node, pool.capacity_type) == (2, 0, "on-demand")
    assert sorted(Node.objects.filter(node_pool=pool).values_list("name", "gpus", "cpu_milli", "memory_mib")) == [
        ("gcp-usc1-cpu-0", 0, 64000, 512 * 1024), ("gcp-usc1-cpu-1", 0, 64000, 512 * 1024)]
    assert not Node.objects.filter(name="gcp-usc1-system").exists()  # unlabelled: never offered


def test_a_cpu_only_job_runs_on_a_cpu_node_and_is_billed_by_vcpu_and_gib_hours(live_clusters):
    world = live_clusters
    with_cpu_nodes(world)
    job = cpu_job(world, cpu=4, memory_gib=8)

    assert try_admit(job.pk) == "admitted"  # alpha has no CPU quota: CPU-only work is quota-free

    job.refresh_from_db()
    attempt = load(job.current_attempt_id)
    assert attempt.gpus == 0 and attempt.node_pool.accelerator.name == "CPU"
    assert attempt.placement["nodes"][0].startswith("gcp-usc1-cpu-")
    assert (attempt.placement["cpu_milli"], attempt.placement["memory_mib"]) == (4000, 8192)
    hourly = 4 * VCPU_HOUR + 8 * GIB_HOUR  # 0.16034 USD per hour
    assert job.estimated_cost_usd == hourly.quantize(Decimal("0.000001"))  # max runtime one hour
    assert "$0.031611/vCPU-h + $0.004237/GiB-h" in job.events.get(to_state=S.ADMITTED).reason

    assert dispatch(attempt.pk) == "dispatched"
    gcp = world.emulators["gcp-usc1"]
    pod = gcp.pods(attempt.pk)[0]
    container = pod["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["resources"]["requests"] == {"cpu": "4000m", "memory": "8192Mi"}
    assert not any(t.get("key") == "nvidia.com/gpu" for t in pod["spec"].get("tolerations") or [])
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert all({"key": "kubernetes.io/hostname", "operator": "In", "values": attempt.placement["nodes"]}
               in t["matchExpressions"] for t in terms["nodeSelectorTerms"])  # pinned to the node admission chose
    assert "nvidia.com/gpu.product" not in (pod["spec"].get("nodeSelector") or {})

    world.reconcile("gcp-usc1")
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RUNNING
    gcp.finish_pod(pod["metadata"]["name"], 0)
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.SUCCEEDED

    accrue_attempt(attempt.pk)
    ended = load(attempt.pk)
    entries = list(CostEntry.objects.filter(attempt_id=attempt.pk))
    assert entries and all((e.gpus, e.cpu_milli, e.memory_mib) == (0, 4000, 8192) for e in entries)
    assert all((e.usd_per_gpu_hour, e.usd_per_vcpu_hour, e.usd_per_gib_hour) == (0, VCPU_HOUR, GIB_HOUR)
               for e in entries)
    for e in entries:
        seconds = Decimal(str((e.interval_end - e.interval_start).total_seconds()))
        assert e.amount_usd == (hourly * seconds / 3600).quantize(Decimal("1e-9"), ROUND_HALF_EVEN)
    assert entries[0].interval_start == ended.started_at and entries[-1].interval_end == ended.ended_at
    job.refresh_from_db()
    assert job.accrued_cost_usd == sum(e.amount_usd for e in entries) > 0

    attempt_view = job_efficiency(job)["attempts"][0]
    assert attempt_view["mfu_percent"] is None and attempt_view["mfu_reason"].startswith("CPU")


def test_cpu_only_jobs_take_nodes_with_cpu_room_and_never_gpu_quota(live_clusters):
    world = live_clusters
    with_cpu_nodes(world)
    big = [cpu_job(world, cpu=40, memory_gib=64) for _ in range(3)]

    assert [try_admit(j.pk) for j in big[:2]] == ["admitted", "admitted"]
    placed = [load(Job.objects.get(pk=j.pk).current_attempt_id).placement["nodes"][0] for j in big[:2]]
    assert sorted(placed) == ["gcp-usc1-cpu-0", "gcp-usc1-cpu-1"]  # 40 of 64 cores taken: one job per node
    assert try_admit(big[2].pk) != "admitted"
    waiting = Job.objects.get(pk=big[2].pk)
    assert waiting.state == S.QUEUED and waiting.queue_info["reason"] == "capacity"

    # The team's GPU quota is untouched: its whole 64 H100 GPUs still admit a GPU job at once.
    gpu = world.admit(cluster="gcp-usc1", nodes=2, gpus=8)
    assert gpu.gpus == 16 and state(gpu) == S.ADMITTED
