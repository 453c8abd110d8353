"""GPU node pools and their nodes as a cluster's Nodes show them: grouped by the base GPU product and capacity
type, each node with its allocatable resources, its physical GPUs and how they are shared (time-slicing, MPS, MIG:
``gpu_inventory``, ADR 0040), the requests of pods the platform does not own, topology, taints and cordon.

Pure functions over Node and Pod dicts (the API's JSON), so discovery is
testable without a server. Spot labels: ``manifests.SPOT_LABELS`` (one table, every provider's).
"""

from __future__ import annotations

import math
from collections import defaultdict

from kubernetes.utils.quantity import parse_quantity

from core.gpus import mig_gpus

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


#: GPU feature discovery's and the NVIDIA device plugin's node labels read for GPU sharing (ADR 0040; sources:
#: NVIDIA/k8s-device-plugin README "Shared Access to GPUs" and "Catalog of Labels", and its GPU feature discovery
#: README "Generated Labels").
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
#: The suffix the device plugin adds to ``nvidia.com/gpu.product`` on a node whose GPUs it time-slices or shares by
#: MPS; and the infix GPU feature discovery adds under the MIG single strategy (``A100-SXM4-40GB-MIG-1g.5gb``).
SHARED_SUFFIX = "-SHARED"
MIG_INFIX = "-MIG-"
#: The resource a shared GPU's slices are advertised as with the device plugin's ``renameByDefault``.
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def base_product(product: str) -> str:
    """The GPU product of a ``nvidia.com/gpu.product`` value without what sharing adds to it: the ``-SHARED``
    suffix and the ``-MIG-<profile>`` suffix (``NVIDIA-H100-80GB-HBM3-SHARED`` -> ``NVIDIA-H100-80GB-HBM3``), so a
    shared node is the base product, found and priced as it."""
    if product.endswith(SHARED_SUFFIX):
        product = product[:-len(SHARED_SUFFIX)]
    head, infix, _profile = product.partition(MIG_INFIX)
    return head if infix else product


def _count(value) -> int:
    try:
        return max(int(str(value)), 0)
    except (TypeError, ValueError):
        return 0


def gpu_inventory(labels: dict, allocatable: dict) -> dict:
    """How a node's GPUs are shared, from its labels and ``status.allocatable``: the ``NodeInfo`` fields ``gpus``
    (physical GPUs), ``sharing``, ``gpu_replicas``, ``slice_resource``, ``mig_devices`` and ``whole_gpus``.

    Rules (NVIDIA device plugin and GPU feature discovery docs, ADR 0040):

    - **MIG single** (``nvidia.com/mig.strategy=single``): every GPU is cut into MIG devices of one profile,
      named by the product's ``-MIG-<profile>`` suffix; ``nvidia.com/gpu`` (and ``nvidia.com/gpu.count``) counts
      the devices, not GPUs. Physical GPUs: ``core.gpus.mig_gpus``. No whole GPU.
    - **MIG mixed**: each profile is its own resource ``nvidia.com/mig-<profile>`` with a
      ``nvidia.com/mig-<profile>.count`` label (the allocatable resource when the label is absent);
      ``nvidia.com/gpu`` counts the GPUs without MIG (whole), ``nvidia.com/gpu.count`` the physical GPUs.
    - **Time-slicing / MPS**: a ``nvidia.com/gpu.sharing-strategy`` of ``time-slicing`` or ``mps``, a
      ``nvidia.com/gpu.replicas`` above 1, a product ending ``-SHARED`` or an allocatable ``nvidia.com/gpu.shared``
      (``renameByDefault``) mark it. The resource counts slices: physical GPUs x replicas. Physical GPUs:
      ``nvidia.com/gpu.count``, else slices over replicas; replicas: the label, else slices over physical GPUs. A
      node of 8 GPUs advertised as 32 is 8 GPUs of 4 slices, never 32 GPUs. No whole GPU: the plugin hands slices
      out without regard to which GPU, so a pod asking 4 may get 4 slices of one GPU.
    - Otherwise every allocatable ``nvidia.com/gpu`` is a whole physical GPU.
    """
    product = str(labels.get(m.GPU_PRODUCT_LABEL, ""))
    plain = _count(allocatable.get(m.GPU_RESOURCE))
    counted = _count(labels.get(GPU_COUNT_LABEL))
    mig = str(labels.get(MIG_STRATEGY_LABEL, "")).lower()
    if mig == "single" and MIG_INFIX in product:
        profile = product.rstrip().removesuffix(SHARED_SUFFIX).partition(MIG_INFIX)[2]
        devices = plain or counted
        return {"gpus": mig_gpus(base_product(product), profile, devices), "sharing": "mig-single",
                "gpu_replicas": 1, "slice_resource": "", "mig_devices": ((profile, devices),) if devices else (),
                "whole_gpus": 0}
    if mig == "mixed":
        devices = {}
        for key in labels:
            if key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(".count"):
                devices[key[len(MIG_RESOURCE_PREFIX):-len(".count")]] = _count(labels[key])
        for key, value in allocatable.items():
            if key.startswith(MIG_RESOURCE_PREFIX):
                devices.setdefault(key[len(MIG_RESOURCE_PREFIX):], _count(value))
        devices = {k: v for k, v in devices.items() if v > 0}
        if devices:
            gpus = counted or plain + sum(mig_gpus(base_product(product), k, v) for k, v in devices.items())
            return {"gpus": max(gpus, plain), "sharing": "mig-mixed", "gpu_replicas": 1, "slice_resource": "",
                    "mig_devices": tuple(sorted(devices.items())), "whole_gpus": plain}
    renamed = _count(allocatable.get(SHARED_GPU_RESOURCE))
    strategy = str(labels.get(SHARING_STRATEGY_LABEL, "")).lower()
    replicas = _count(labels.get(GPU_REPLICAS_LABEL))
    shared = (strategy in ("time-slicing", "mps") or replicas > 1 or product.endswith(SHARED_SUFFIX)
              or renamed > 0)
    if not shared:
        return {"gpus": plain, "sharing": "none", "gpu_replicas": 1, "slice_resource": "", "mig_devices": (),
                "whole_gpus": plain}
    slices = renamed or plain
    resource = SHARED_GPU_RESOURCE if renamed else m.GPU_RESOURCE
    gpus = counted if 0 < counted <= slices else slices // max(replicas, 1)
    if replicas < 1:
        replicas = slices // gpus if gpus else 1
    return {"gpus": gpus, "sharing": "mps" if strategy == "mps" else "time-slicing", "gpu_replicas": max(replicas, 1),
            "slice_resource": resource, "mig_devices": (), "whole_gpus": 0}


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


def _is_gpu_device(resource: str) -> bool:
    return resource in (m.GPU_RESOURCE, SHARED_GPU_RESOURCE) or resource.startswith(MIG_RESOURCE_PREFIX)


def pod_devices(pod: dict) -> dict[str, int]:
    """The GPU devices a pod requests, by resource (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
    ``nvidia.com/mig-<profile>``): the sum over its containers (a request, else its limit), at least the largest init
    container's, as ``pod_requests`` counts the rest."""
    spec = pod.get("spec") or {}

    def one(container: dict) -> dict[str, int]:
        res = container.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        return {k: gpu_count(req.get(k) or lim.get(k)) for k in {*req, *lim} if _is_gpu_device(k)}

    main = [one(c) for c in spec.get("containers") or []]
    init = [one(c) for c in spec.get("initContainers") or []]
    names = {k for d in main + init for k in d}
    out = {k: max(sum(d.get(k, 0) for d in main), max((d.get(k, 0) for d in init), default=0)) for k in names}
    return {k: v for k, v in out.items() if v > 0}


def pod_requests(pod: dict) -> tuple[int, int, int]:
    """``(GPUs, CPU millicores, memory MiB)`` a pod requests: the sum over its containers (a request, else its limit,
    as the API server defaults it), at least the largest init container's (Kubernetes' effective request). GPUs
    are its ``nvidia.com/gpu`` devices (``pod_devices`` has the others)."""
    spec = pod.get("spec") or {}

    def one(container: dict) -> tuple[int, int, int]:
        res = container.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        return (gpu_count(req.get(m.GPU_RESOURCE) or lim.get(m.GPU_RESOURCE)), cpu_millicores(req.get("cpu") or lim.get("cpu")),
                memory_mebibytes(req.get("memory") or lim.get("memory")))

    main = [one(c) for c in spec.get("containers") or []]
    init = [one(c) for c in spec.get("initContainers") or []]
    return tuple(max(sum(x[i] for x in main), max((x[i] for x in init), default=0)) for i in range(3))


def gpus_held(shape: dict, devices: dict[str, int]) -> int:
    """Physical GPUs of a node of ``shape`` (``gpu_inventory``'s answer) that pods asking ``devices`` (``{resource:
    count}``, summed over those pods) hold or may touch: whole GPUs asked on an unshared or MIG mixed node; on a
    time-sliced or MIG single node every slice or device asked may sit on a GPU of its own (the device plugin does
    not say which), so as many GPUs as slices, at most the node's."""
    if shape["sharing"] in ("none", "mig-mixed"):
        return devices.get(m.GPU_RESOURCE, 0)
    asked = devices.get(shape["slice_resource"] or m.GPU_RESOURCE, 0)
    return min(asked, shape["gpus"])


def _blocking_taints(taints: list[dict]) -> list[dict]:
    return [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in TOLERATED_TAINT_KEYS]


def node_info(node: dict, foreign: tuple[dict[str, int], int, int]) -> NodeInfo:
    """One Node as ``NodeInfo``; ``foreign``: what pods the platform does not own request on it: ``(GPU devices by
    resource (``pod_devices``), CPU millicores, memory MiB)``."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    taints = spec.get("taints") or []
    zone = labels.get(ZONE_LABEL, "")
    domain = next((labels[k] for k in TOPOLOGY_LABELS if labels.get(k)), zone)
    cordoned = bool(spec.get("unschedulable"))
    shape = gpu_inventory(labels, alloc)
    devices = foreign[0]
    mig = {k[len(MIG_RESOURCE_PREFIX):]: v for k, v in devices.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    if shape["sharing"] == "mig-single" and shape["mig_devices"]:  # nvidia.com/gpu asks the one profile's devices
        mig[shape["mig_devices"][0][0]] = devices.get(m.GPU_RESOURCE, 0)
    slices = devices.get(shape["slice_resource"], 0) if shape["slice_resource"] else 0
    return NodeInfo(
        name=meta.get("name", ""), gpus=shape["gpus"], cpu_milli=cpu_millicores(alloc.get("cpu")),
        memory_mib=memory_mebibytes(alloc.get("memory")), foreign_gpus=gpus_held(shape, devices),
        foreign_cpu_milli=foreign[1], foreign_memory_mib=foreign[2], zone=zone, topology_domain=domain,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        taints=tuple((t.get("key", ""), t.get("value", "") or "", t.get("effect", "")) for t in taints),
        unschedulable=cordoned, schedulable=ready and not cordoned and not _blocking_taints(taints),
        problem_conditions=tuple((str(c.get("type", "")), str(c.get("reason", "") or ""), str(c.get("message", "") or ""))
                                 for c in status.get("conditions") or []
                                 if c.get("type") != "Ready" and c.get("status") == "True"),
        sharing=shape["sharing"], gpu_replicas=shape["gpu_replicas"], slice_resource=shape["slice_resource"],
        mig_devices=shape["mig_devices"], whole_gpus=shape["whole_gpus"], foreign_gpu_slices=slices,
        foreign_mig_devices=tuple(sorted((k, v) for k, v in mig.items() if v > 0)),
    )


def pools_from_nodes(nodes: list[dict], running_pods: list[dict]) -> list[PoolCapacity]:
    """One PoolCapacity per (base GPU product, capacity type) over the nodes with GPUs, with every such node
    in ``node_list`` (cordoned, tainted and not Ready ones included, marked not schedulable); and one per capacity
    type of ``CPU`` over the nodes without GPUs labelled ``CPU_POOL_LABEL`` (``gpus_per_node`` 0).

    ``accelerator`` is the base product (``base_product``: a time-sliced node's ``-SHARED`` product and a MIG
    single node's ``-MIG-<profile>`` product are their GPU's; the caller maps it to an Accelerator by
    ``product_label``); ``nodes`` counts the schedulable nodes and ``gpus_per_node`` is their smallest count of
    physical GPUs (``gpu_inventory``; of all nodes when none is schedulable); ``free_gpus`` = physical GPUs
    minus those the pods bound to those nodes that have not finished hold (``gpus_held``). A node's ``foreign_*``
    are the requests of such pods without the platform's ``controlplane.io/attempt`` label (the platform counts its
    own pods from its live attempts).
    """
    used_by_node: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    foreign_by_node: dict[str, list] = defaultdict(lambda: [defaultdict(int), 0, 0])
    for pod in running_pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # a finished pod holds nothing
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            continue  # not bound yet: on no node
        _gpus, cpu, mem = pod_requests(pod)
        devices = pod_devices(pod)
        for key, value in devices.items():
            used_by_node[node_name][key] += value
        if m.LABEL_ATTEMPT not in ((pod.get("metadata") or {}).get("labels") or {}):
            f = foreign_by_node[node_name]
            for key, value in devices.items():
                f[0][key] += value
            f[1] += cpu
            f[2] += mem
    groups: dict[tuple[str, str], list[NodeInfo]] = defaultdict(list)
    held: dict[str, int] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        product = base_product(str(labels.get(m.GPU_PRODUCT_LABEL, "")))
        f = foreign_by_node.get(meta.get("name"))
        info = node_info(node, (dict(f[0]), f[1], f[2]) if f else ({}, 0, 0))
        if info.gpus <= 0 and CPU_POOL_LABEL in labels:
            product = CPU_ACCELERATOR
        elif not product or info.gpus <= 0:
            continue
        shape = {"gpus": info.gpus, "sharing": info.sharing, "slice_resource": info.slice_resource}
        held[info.name] = gpus_held(shape, used_by_node.get(info.name, {}))
        groups[(product, capacity_type(labels))].append(info)
    pools = []
    for (product, ctype), members in sorted(groups.items()):
        name = f"{product}-{ctype}".lower().replace("_", "-").replace(".", "-")[:63].strip("-")
        open_ = [n for n in members if n.schedulable]
        shape = open_ or members
        pools.append(PoolCapacity(name=name, accelerator=product, capacity_type=ctype, nodes=len(open_),
                                  gpus_per_node=min(n.gpus for n in shape),
                                  free_gpus=sum(max(n.gpus - held.get(n.name, 0), 0) for n in open_),
                                  node_list=tuple(sorted(members, key=lambda n: n.name))))
    return pools
