"""GPU node pools as a cluster's Nodes show them: grouped by ``nvidia.com/gpu.product`` and capacity type.

Pure functions over Node and Pod dicts (the API's JSON), so discovery is
testable without a server. Spot labels: ``manifests.SPOT_LABELS``.
"""

from __future__ import annotations

from collections import defaultdict

from ..base import PoolCapacity
from . import manifests as m


def capacity_type(labels: dict, provider: str) -> str:
    """``spot`` when the node carries one of the spot labels (the provider's first, then any cloud's), else ``on-demand``."""
    pairs = m.SPOT_LABELS.get(provider, ()) + m.ALL_SPOT_LABELS
    return "spot" if any(labels.get(key) == value for key, value in pairs) else "on-demand"


def _gpus(quantity) -> int:
    try:
        return int(str(quantity or 0))
    except ValueError:
        return 0


def pools_from_nodes(nodes: list[dict], running_pods: list[dict], provider: str) -> list[PoolCapacity]:
    """One PoolCapacity per (GPU product, capacity type) over schedulable Ready nodes with allocatable GPUs.

    ``accelerator`` is the product label value (the caller maps it to an
    Accelerator by ``product_label``); ``gpus_per_node`` is the smallest
    allocatable ``nvidia.com/gpu`` of the group; ``free_gpus`` = allocatable
    minus the GPU requests (limits, for extended resources) of the pods bound to those nodes that have not finished.
    """
    used_by_node: dict[str, int] = defaultdict(int)
    for pod in running_pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # a finished pod holds no GPU
        node_name = (pod.get("spec") or {}).get("nodeName")
        for container in (pod.get("spec") or {}).get("containers") or []:
            res = container.get("resources") or {}
            used_by_node[node_name] += _gpus((res.get("requests") or {}).get(m.GPU_RESOURCE)
                                             or (res.get("limits") or {}).get(m.GPU_RESOURCE))
    groups: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for node in nodes:
        meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
        labels = meta.get("labels") or {}
        product = labels.get(m.GPU_PRODUCT_LABEL)
        gpus = _gpus((status.get("allocatable") or {}).get(m.GPU_RESOURCE))
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if not product or gpus <= 0 or spec.get("unschedulable") or not ready:
            continue
        groups[(product, capacity_type(labels, provider))].append((gpus, max(gpus - used_by_node[meta.get("name")], 0)))
    pools = []
    for (product, ctype), members in sorted(groups.items()):
        name = f"{product}-{ctype}".lower().replace("_", "-").replace(".", "-")[:63].strip("-")
        pools.append(PoolCapacity(name=name, accelerator=product, capacity_type=ctype, nodes=len(members),
                                  gpus_per_node=min(g for g, _ in members), free_gpus=sum(f for _, f in members)))
    return pools
