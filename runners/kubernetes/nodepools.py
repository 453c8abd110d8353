"""GPU node pools and their nodes as a cluster's Nodes show them: grouped by ``nvidia.com/gpu.product`` and capacity
type, each node with its allocatable resources, the requests of pods the platform does not own, topology, taints
and cordon.

Pure functions over Node and Pod dicts (the API's JSON), so discovery is
testable without a server. Spot labels: ``manifests.SPOT_LABELS`` (one table, every provider's).
"""

from __future__ import annotations

import math
from collections import defaultdict

from kubernetes.utils.quantity import parse_quantity

from ..base import NodeInfo, PoolCapacity
from ..models import CPU_ACCELERATOR
from . import manifests as m

ZONE_LABEL = "topology.kubernetes.io/zone"
#: Topology labels finer than a zone, finest first: GKE's placement groups and blocks, AWS's network nodes,
#: the common rack label. A multi-node job prefers nodes that share the first of these a node carries.
TOPOLOGY_LABELS = ("cloud.google.com/gce-topology-block", "cloud.google.com/gke-placement-group",
                   "topology.k8s.aws/network-node-layer-3", "topology.kubernetes.io/block", "topology.kubernetes.io/rack")
#: The label an operator puts on nodes without GPUs that CPU-only jobs may use (any value); they form the cluster's
#: CPU node pools (accelerator ``CPU``), one per capacity type. Nodes without GPUs and without it (system nodes,
#: the platform's own) are never offered.
CPU_POOL_LABEL = "controlplane.io/cpu-pool"
#: Taints the platform's pods tolerate (``manifests._scheduling``): the GPU taint; spot taints for spot pods.
TOLERATED_TAINT_KEYS = frozenset({m.GPU_RESOURCE} | {row.key for row in m.SPOT_LABELS})


def capacity_type(labels: dict) -> str:
    """``spot`` when a node with ``labels`` carries a ``manifests.SPOT_LABELS`` row (any provider's: the table the
    pods' node affinity uses), else ``on-demand``. The pool's capacity type picks its catalog price."""
    return "spot" if m.is_spot(labels) else "on-demand"


def gpu_count(quantity) -> int:
    """An ``nvidia.com/gpu`` quantity as a whole number of GPUs; 0 when absent or unreadable."""
    try:
        return int(str(quantity or 0))
    except ValueError:
        return 0


def cpu_millicores(quantity) -> int:
    """A CPU quantity (``"4"``, ``"500m"``) in millicores, rounded up; 0 when absent or unreadable."""
    try:
        return math.ceil(parse_quantity(quantity) * 1000) if quantity not in (None, "") else 0
    except (ValueError, ArithmeticError):
        return 0


def memory_mebibytes(quantity) -> int:
    """A memory quantity (``"512Gi"``, ``"1e9"``) in MiB, rounded up; 0 when absent or unreadable."""
    try:
        return math.ceil(parse_quantity(quantity) / (1 << 20)) if quantity not in (None, "") else 0
    except (ValueError, ArithmeticError):
        return 0


def pod_requests(pod: dict) -> tuple[int, int, int]:
    """``(GPUs, CPU millicores, memory MiB)`` a pod requests: the sum over its containers (a request, else its limit,
    as the API server defaults it), at least the largest init container's (Kubernetes' effective request)."""
    spec = pod.get("spec") or {}

    def one(container: dict) -> tuple[int, int, int]:
        res = container.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        return (gpu_count(req.get(m.GPU_RESOURCE) or lim.get(m.GPU_RESOURCE)), cpu_millicores(req.get("cpu") or lim.get("cpu")),
                memory_mebibytes(req.get("memory") or lim.get("memory")))

    main = [one(c) for c in spec.get("containers") or []]
    init = [one(c) for c in spec.get("initContainers") or []]
    return tuple(max(sum(x[i] for x in main), max((x[i] for x in init), default=0)) for i in range(3))


def _blocking_taints(taints: list[dict]) -> list[dict]:
    return [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in TOLERATED_TAINT_KEYS]


def node_info(node: dict, foreign: tuple[int, int, int]) -> NodeInfo:
    """One Node as ``NodeInfo``; ``foreign``: what pods the platform does not own request on it."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    taints = spec.get("taints") or []
    zone = labels.get(ZONE_LABEL, "")
    domain = next((labels[k] for k in TOPOLOGY_LABELS if labels.get(k)), zone)
    cordoned = bool(spec.get("unschedulable"))
    return NodeInfo(
        name=meta.get("name", ""), gpus=gpu_count(alloc.get(m.GPU_RESOURCE)), cpu_milli=cpu_millicores(alloc.get("cpu")),
        memory_mib=memory_mebibytes(alloc.get("memory")), foreign_gpus=foreign[0], foreign_cpu_milli=foreign[1],
        foreign_memory_mib=foreign[2], zone=zone, topology_domain=domain,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        taints=tuple((t.get("key", ""), t.get("value", "") or "", t.get("effect", "")) for t in taints),
        unschedulable=cordoned, schedulable=ready and not cordoned and not _blocking_taints(taints),
        problem_conditions=tuple((str(c.get("type", "")), str(c.get("reason", "") or ""), str(c.get("message", "") or ""))
                                 for c in status.get("conditions") or []
                                 if c.get("type") != "Ready" and c.get("status") == "True"),
    )


def pools_from_nodes(nodes: list[dict], running_pods: list[dict]) -> list[PoolCapacity]:
    """One PoolCapacity per (GPU product, capacity type) over the nodes with allocatable GPUs, with every such node
    in ``node_list`` (cordoned, tainted and not Ready ones included, marked not schedulable); and one per capacity
    type of ``CPU`` over the nodes without GPUs labelled ``CPU_POOL_LABEL`` (``gpus_per_node`` 0).

    ``accelerator`` is the product label value (the caller maps it to an
    Accelerator by ``product_label``); ``nodes`` counts the schedulable nodes
    and ``gpus_per_node`` is their smallest allocatable ``nvidia.com/gpu``
    (of all nodes when none is schedulable); ``free_gpus`` = allocatable minus
    the GPU requests of every pod bound to those nodes that has not finished.
    A node's ``foreign_*`` are the requests of such pods without the
    platform's ``controlplane.io/attempt`` label (the platform counts its own
    pods from its live attempts).
    """
    used_by_node: dict[str, int] = defaultdict(int)
    foreign_by_node: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for pod in running_pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # a finished pod holds nothing
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            continue  # not bound yet: on no node
        gpus, cpu, mem = pod_requests(pod)
        used_by_node[node_name] += gpus
        if m.LABEL_ATTEMPT not in ((pod.get("metadata") or {}).get("labels") or {}):
            f = foreign_by_node[node_name]
            f[0] += gpus
            f[1] += cpu
            f[2] += mem
    groups: dict[tuple[str, str], list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        product = labels.get(m.GPU_PRODUCT_LABEL)
        info = node_info(node, tuple(foreign_by_node.get((node.get("metadata") or {}).get("name"), (0, 0, 0))))
        if info.gpus <= 0 and CPU_POOL_LABEL in labels:
            product = CPU_ACCELERATOR
        elif not product or info.gpus <= 0:
            continue
        groups[(product, capacity_type(labels))].append(info)
    pools = []
    for (product, ctype), members in sorted(groups.items()):
        name = f"{product}-{ctype}".lower().replace("_", "-").replace(".", "-")[:63].strip("-")
        open_ = [n for n in members if n.schedulable]
        shape = open_ or members
        pools.append(PoolCapacity(name=name, accelerator=product, capacity_type=ctype, nodes=len(open_),
                                  gpus_per_node=min(n.gpus for n in shape),
                                  free_gpus=sum(max(n.gpus - used_by_node[n.name], 0) for n in open_),
                                  node_list=tuple(sorted(members, key=lambda n: n.name))))
    return pools
