"""GPU sharing in the node inventory: time-sliced, MPS and MIG nodes are counted in physical GPUs, with their slices
and MIG devices beside them, and a shared product is its base product (ADR 0040)."""

from __future__ import annotations

import pytest

from runners.kubernetes.nodepools import base_product, pools_from_nodes
from runners.kubernetes.sync import sync_cluster
from runners.models import Node, NodePool, NodeSpan
from tests.support.factories import make_cluster
from tests.support.kubernetes import Emulators, Kubelet

H100 = "NVIDIA-H100-80GB-HBM3"
A100_40 = "NVIDIA-A100-SXM4-40GB"
A100_80 = "NVIDIA-A100-SXM4-80GB"


def node(name: str, labels: dict, allocatable: dict) -> dict:
    """A Ready v1 Node with ``labels`` and ``status.allocatable`` (CPU and memory added)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "96", "memory": "1Ti", **allocatable},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, on: str, limits: dict, owned: bool = False) -> dict:
    """A Running pod bound to node ``on`` whose one container has ``limits``; ``owned``: the platform's."""
    labels = {"controlplane.io/attempt": "1"} if owned else {}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"nodeName": on, "containers": [
        {"name": "c", "resources": {"limits": limits}}]}, "status": {"phase": "Running"}}


def time_sliced(name: str, product: str = f"{H100}-SHARED", gpus: int = 8, replicas: int = 4, **extra) -> dict:
    """A node whose device plugin time-slices ``gpus`` GPUs into ``replicas`` each, labelled as GFD labels it."""
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.replicas": str(replicas), "nvidia.com/gpu.sharing-strategy": "time-slicing", **extra}
    return node(name, labels, {"nvidia.com/gpu": str(gpus * replicas)})


def only(pools, name: str):
    return next(n for p in pools for n in p.node_list if n.name == name)


def test_a_time_sliced_node_is_its_physical_gpus_with_slices():
    pools = pools_from_nodes([time_sliced("ts")], [])

    (pool,) = pools
    info = pool.node_list[0]
    assert (pool.accelerator, pool.gpus_per_node, pool.free_gpus) == (H100, 8, 8)  # 32 advertised = 8 x 4
    assert (info.gpus, info.sharing, info.gpu_replicas, info.slice_resource, info.whole_gpus) == (
        8, "time-slicing", 4, "nvidia.com/gpu", 0)


def test_a_time_sliced_node_without_the_shared_suffix_is_never_32_gpus():
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "4"}
    info = only(pools_from_nodes([node("plain-label", labels, {"nvidia.com/gpu": "32"})], []), "plain-label")
    assert (info.gpus, info.gpu_replicas, info.sharing) == (8, 4, "time-slicing")


def test_renamed_slices_without_a_count_label_are_divided_by_replicas():
    labels = {"nvidia.com/gpu.product": f"{H100}-SHARED", "nvidia.com/gpu.replicas": "4"}
    info = only(pools_from_nodes([node("renamed", labels, {"nvidia.com/gpu.shared": "16"})], []), "renamed")
    assert (info.gpus, info.gpu_replicas, info.slice_resource) == (16 // 4, 4, "nvidia.com/gpu.shared")


def test_replicas_are_slices_over_gpus_when_only_the_count_is_labelled():
    labels = {"nvidia.com/gpu.product": f"{H100}-SHARED", "nvidia.com/gpu.count": "2"}
    info = only(pools_from_nodes([node("counted", labels, {"nvidia.com/gpu": "20"})], []), "counted")
    assert (info.gpus, info.gpu_replicas) == (2, 10)


def test_mps_is_shared_like_time_slicing():
    info = only(pools_from_nodes([time_sliced("mps", replicas=2, **{"nvidia.com/gpu.sharing-strategy": "mps"})], []),
                "mps")
    assert (info.gpus, info.sharing, info.gpu_replicas) == (8, "mps", 2)


def test_a_mig_single_node_counts_gpus_not_devices():
    # GFD's own example: 8 A100-SXM4-40GB, each cut into 7 x 1g.5gb, labelled as 56 GPUs of product ...-MIG-1g.5gb.
    labels = {"nvidia.com/gpu.product": f"{A100_40}-MIG-1g.5gb", "nvidia.com/gpu.count": "56",
              "nvidia.com/mig.strategy": "single"}
    pools = pools_from_nodes([node("mig1", labels, {"nvidia.com/gpu": "56"})], [])
    info = only(pools, "mig1")
    assert pools[0].accelerator == A100_40
    assert (info.gpus, info.sharing, info.mig_devices, info.whole_gpus) == (8, "mig-single", (("1g.5gb", 56),), 0)


def test_a_mig_single_node_of_larger_devices_counts_them_per_gpu():
    # A100-80GB holds 2 x 3g.40gb per GPU (NVIDIA's table): 8 devices are 4 GPUs.
    labels = {"nvidia.com/gpu.product": f"{A100_80}-MIG-3g.40gb", "nvidia.com/mig.strategy": "single"}
    info = only(pools_from_nodes([node("mig3", labels, {"nvidia.com/gpu": "8"})], []), "mig3")
    assert (info.gpus, info.mig_devices) == (4, (("3g.40gb", 8),))


def test_a_mig_mixed_node_has_its_profiles_and_its_whole_gpus():
    labels = {"nvidia.com/gpu.product": A100_80, "nvidia.com/gpu.count": "8", "nvidia.com/mig.strategy": "mixed",
              "nvidia.com/mig-1g.10gb.count": "28", "nvidia.com/mig-3g.40gb.count": "4"}
    allocatable = {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "28", "nvidia.com/mig-3g.40gb": "4"}
    pools = pools_from_nodes([node("mixed", labels, allocatable)], [])
    info = only(pools, "mixed")
    assert (info.gpus, info.sharing, info.whole_gpus) == (8, "mig-mixed", 2)
    assert info.mig_devices == (("1g.10gb", 28), ("3g.40gb", 4))


def test_a_plain_node_is_unchanged():
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "1",
              "nvidia.com/gpu.sharing-strategy": "none"}
    info = only(pools_from_nodes([node("plain", labels, {"nvidia.com/gpu": "8"})], []), "plain")
    assert (info.gpus, info.sharing, info.gpu_replicas, info.whole_gpus, info.exclusive_gpus) == (8, "none", 1, 8, 8)


def test_foreign_slices_and_devices_are_recorded_and_hold_their_gpus():
    mixed = node("mixed", {"nvidia.com/gpu.product": A100_80, "nvidia.com/gpu.count": "8",
                           "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.count": "14"},
                 {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "14"})
    pods = [pod("other-1", "ts", {"nvidia.com/gpu": "3"}), pod("mine", "ts", {"nvidia.com/gpu": "2"}, owned=True),
            pod("other-2", "mixed", {"nvidia.com/mig-1g.10gb": "5"}),
            pod("other-3", "mixed", {"nvidia.com/gpu": "1"})]
    pools = {p.accelerator: p for p in pools_from_nodes([time_sliced("ts"), mixed], pods)}

    ts, mx = only(pools.values(), "ts"), only(pools.values(), "mixed")
    # 3 foreign slices may sit on 3 GPUs; with the platform's 2, 5 slices hold at most 5 of the 8 GPUs.
    assert (ts.foreign_gpu_slices, ts.foreign_gpus) == (3, 3)
    assert pools[H100].free_gpus == 8 - 5
    assert (mx.foreign_mig_devices, mx.foreign_gpus) == ((("1g.10gb", 5),), 1)


@pytest.mark.parametrize(("label", "base"), [
    (f"{H100}-SHARED", H100), (f"{A100_40}-MIG-1g.5gb", A100_40), (f"{A100_40}-MIG-1g.5gb-SHARED", A100_40),
    (H100, H100)])
def test_the_base_product_drops_what_sharing_adds(label, base):
    assert base_product(label) == base


@pytest.fixture
def cluster(settings, catalog):
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 3.0
    with Emulators(["shared"]) as emulators:
        made, _ = make_cluster("shared", "gcp", "us-central1", catalog["H100-80GB"])
        made.api_endpoint = emulators.url("shared")
        made.save()
        yield made, Kubelet(emulators.url("shared"))


def test_sync_records_a_shared_node_as_its_base_product_in_physical_gpus(cluster):
    made, k = cluster
    k._req("POST", "/api/v1/nodes", time_sliced("ts-1"))
    k._req("POST", "/api/v1/nodes", node("plain-1", {"nvidia.com/gpu.product": H100}, {"nvidia.com/gpu": "8"}))

    result = sync_cluster(made)

    assert (result["skipped"], result["unknown_products"]) == (0, [])  # -SHARED is H100, not an unknown product
    pool = NodePool.objects.get(cluster=made)
    assert (pool.accelerator.name, pool.nodes, pool.gpus_per_node) == ("H100-80GB", 2, 8)
    row = Node.objects.get(cluster=made, name="ts-1")
    assert (row.gpus, row.gpu_sharing, row.gpu_replicas, row.slice_resource, row.whole_gpus) == (
        8, "time-slicing", 4, "nvidia.com/gpu", 0)
    plain = Node.objects.get(cluster=made, name="plain-1")
    assert (plain.gpus, plain.gpu_sharing, plain.whole_gpus) == (8, "none", None)
    assert NodeSpan.objects.get(cluster=made, node_name="ts-1").gpus == 8  # capacity in physical GPUs
