"""Node pool sync over HTTP: Nodes in kmock emulators become NodePool rows; pools in use are never deleted."""

from __future__ import annotations

import logging

import pytest

from jobs.models import JobState
from runners.kubernetes.sync import sync_cluster
from runners.models import NodePool
from runners.tasks import sync_node_pools
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.kubernetes import Emulators, Kubelet

H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, product: str, gpus: int, spot_label: tuple[str, str] | None = None, ready: bool = True) -> dict:
    """A v1 Node as the GPU operator labels it: ``nvidia.com/gpu.product`` and allocatable ``nvidia.com/gpu``."""
    labels = {"nvidia.com/gpu.product": product} if product else {}
    if spot_label:
        labels[spot_label[0]] = spot_label[1]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.fixture
def clusters(settings, catalog):
    """Two emulated clusters (azure, aws), each with the hand-registered 2x8 H100 on-demand pool of ``make_cluster``."""
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 3.0
    with Emulators(["azure-eastus", "aws-use1"]) as emulators:
        made = {}
        for name, provider, region in (("azure-eastus", "azure", "eastus"), ("aws-use1", "aws", "us-east-1")):
            cluster, _ = make_cluster(name, provider, region, catalog["H100-80GB"])
            cluster.api_endpoint = emulators.url(name)
            cluster.save()
            made[name] = cluster
        yield emulators, made


def pools(cluster) -> dict[tuple[str, str], tuple[str, int, int]]:
    """``{(accelerator, capacity type): (pool name, nodes, GPUs per node)}`` of ``cluster``'s rows."""
    return {(p.accelerator.name, p.capacity_type): (p.name, p.nodes, p.gpus_per_node)
            for p in NodePool.objects.filter(cluster=cluster).select_related("accelerator")}


def test_it_writes_discovered_pools_and_skips_unknown_products(clusters, caplog):
    emulators, made = clusters
    cluster = made["azure-eastus"]
    k = Kubelet(emulators.url("azure-eastus"))
    spot = ("kubernetes.azure.com/scalesetpriority", "spot")
    for body in (node("n1", H100, 8), node("n2", H100, 8), node("n3", H100, 8), node("s1", H100, 4, spot),
                 node("s2", H100, 4, spot), node("l1", "NVIDIA-L4", 1), node("b1", "NVIDIA-B200", 8),
                 node("cpu", "", 0), node("down", H100, 8, ready=False)):
        k._req("POST", "/api/v1/nodes", body)
    caplog.set_level(logging.WARNING)

    result = sync_cluster(cluster)

    assert pools(cluster) == {
        ("H100-80GB", "on-demand"): ("h100-80gb-on-demand", 3, 8),  # the hand-registered row, updated in place
        ("H100-80GB", "spot"): ("nvidia-h100-80gb-hbm3-spot", 2, 4),
        ("L4", "on-demand"): ("nvidia-l4-on-demand", 1, 1),
    }
    assert (result["created"], result["updated"], result["skipped"]) == (2, 1, 1)
    assert result["unknown_products"] == ["NVIDIA-B200"]
    assert "NVIDIA-B200" in caplog.text
    assert pools(made["aws-use1"]) == {("H100-80GB", "on-demand"): ("h100-80gb-on-demand", 2, 8)}  # untouched

    again = sync_cluster(cluster)
    assert (again["created"], again["updated"], again["unchanged"], again["deleted"]) == (0, 0, 3, 0)


def test_it_never_deletes_a_pool_that_attempts_use(clusters, catalog, teams, user):
    emulators, made = clusters
    cluster = made["azure-eastus"]
    k = Kubelet(emulators.url("azure-eastus"))
    spot = ("kubernetes.azure.com/scalesetpriority", "spot")
    for body in (node("n1", H100, 8), node("s1", H100, 8, spot), node("l1", "NVIDIA-L4", 1)):
        k._req("POST", "/api/v1/nodes", body)
    sync_cluster(cluster)
    spot_pool = NodePool.objects.get(cluster=cluster, capacity_type="spot")
    job = make_job_row(teams[0], user, catalog["H100-80GB"], name="t", spec={}, gpus_per_node=8, preemptible=True)
    make_attempt(job, cluster, spot_pool, usd_per_gpu_hour="1.0", started_at=None, state=JobState.ADMITTED)

    for name in ("s1", "l1"):  # the spot node is reclaimed, the L4 node scaled away
        k._req("DELETE", f"/api/v1/nodes/{name}")
    result = sync_cluster(cluster)

    assert (result["deleted"], result["emptied"]) == (1, 1)
    assert pools(cluster) == {("H100-80GB", "on-demand"): ("h100-80gb-on-demand", 1, 8),
                              ("H100-80GB", "spot"): ("nvidia-h100-80gb-hbm3-spot", 0, 8)}
    assert NodePool.objects.filter(pk=spot_pool.pk).exists()


def test_the_periodic_task_syncs_every_cluster_and_skips_an_unreachable_one(clusters):
    emulators, made = clusters
    Kubelet(emulators.url("aws-use1"))._req("POST", "/api/v1/nodes", node("a1", H100, 8))
    Kubelet(emulators.url("azure-eastus"))._req("POST", "/api/v1/nodes", node("z1", "NVIDIA-A100-SXM4-80GB", 8))
    emulators.stop("azure-eastus")

    results = {r["cluster"]: r for r in sync_node_pools()}

    assert "error" in results["azure-eastus"]
    assert pools(made["azure-eastus"]) == {("H100-80GB", "on-demand"): ("h100-80gb-on-demand", 2, 8)}  # unchanged
    assert pools(made["aws-use1"]) == {("H100-80GB", "on-demand"): ("h100-80gb-on-demand", 1, 8)}
    emulators.start("azure-eastus")
    sync_node_pools()
    assert pools(made["azure-eastus"]) == {("A100-80GB", "on-demand"): ("nvidia-a100-sxm4-80gb-on-demand", 1, 8)}
