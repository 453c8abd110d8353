"""What this machine offers to the local runner: NVIDIA GPUs found by NVML, or emulated GPUs on the CPU.

``ensure_local_cluster`` records it as the ``local`` cluster (or
``local-emulated``), its ``gpu`` node pool, that pool's nodes
(``local-node-<i>``: GPUs each, and this machine's CPU and memory, which the
processes of every node share) and a price override, so the scheduler can
place and price jobs here like on any cloud cluster; and its ``cpu`` node
pool of the CPU flavor (ADR 0012: ``LOCAL_RUNNER_NODES`` nodes
``local-cpu-<i>``, 0 GPUs, this machine's CPU and memory each) priced per
vCPU-hour and GiB-hour, where CPU-only jobs run.

The emulated cluster's ``gpu`` pool also holds the shared nodes of
``LOCAL_RUNNER_SHARED_NODES`` (time-sliced, MPS and MIG nodes: ``runners.local.sharing``,
ADR 0040), described as GPU feature discovery describes a Kubernetes node (physical GPUs,
sharing mode, replicas, MIG devices per profile, and the labels themselves); the pool's
shape (nodes x GPUs per node) stays that of its whole-GPU nodes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..base import NodeInfo, PoolCapacity
from ..models import CPU_ACCELERATOR, Accelerator, Cluster, NodePool, cpu_flavor, store_nodes
from .sharing import SharedNode, inventory, node_labels, parse_shared_nodes

log = logging.getLogger(__name__)

GPU_CLUSTER_NAME = "local"
EMULATED_CLUSTER_NAME = "local-emulated"
POOL_NAME = "gpu"
#: The local cluster's node pool of the CPU flavor (CPU-only jobs).
CPU_POOL_NAME = "cpu"
PROVIDER = "local"
REGION = "this-machine"
# The catalog row whose price the local GPUs borrow, so the demo's money is realistic.
REFERENCE_PROVIDER, REFERENCE_REGION = "aws", "us-east-1"
FALLBACK_PRICE = Decimal("1.00")
# The catalog row whose vCPU-hour and GiB-hour prices the local CPU pool borrows (AWS publishes instance prices
# only, so the CPU catalog has GCP's N2 figures: costs/data/cpu_prices.csv).
CPU_REFERENCE_PROVIDER, CPU_REFERENCE_REGION = "gcp", "us-central1"
GIB = 1024**3

# NVML device-name pattern -> accelerator name; an A100 with 60 GiB or less is the 40 GB part.
KNOWN_GPUS: list[tuple[str, str]] = [
    (r"H200", "H200-141GB"),
    (r"H100", "H100-80GB"),
    (r"A100", "A100-80GB"),
    (r"\bL4\b", "L4"),
]
# Peak dense BF16 TFLOP/s per GPU from NVIDIA's data sheets, for accelerators the catalog may lack.
PEAK_BF16_TFLOPS = {"H200-141GB": 989, "H100-80GB": 989, "A100-80GB": 312, "A100-40GB": 312, "L4": 121}


@dataclasses.dataclass(frozen=True)
class LocalGpu:
    """One NVIDIA GPU as NVML reports it: index, product name, total memory in bytes."""

    index: int
    name: str
    memory_bytes: int


def detect_gpus() -> list[LocalGpu]:
    """This machine's NVIDIA GPUs through NVML (``nvidia-ml-py``); an empty list when there is no driver or GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            gpus.append(LocalGpu(index, name, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
        return gpus
    except pynvml.NVMLError as exc:
        log.warning("NVML initialised but listing GPUs failed: %s", exc)
        return []
    finally:
        pynvml.nvmlShutdown()


def accelerator_name(gpu: LocalGpu) -> str:
    """The accelerator (resource flavor) name of ``gpu``: ``H100-80GB`` for an "NVIDIA H100 80GB HBM3", etc.

    A GPU outside ``KNOWN_GPUS`` is named from its product name and memory
    (``L40S-45GB``).
    """
    memory_gib = round(gpu.memory_bytes / GIB)
    if "A100" in gpu.name and memory_gib <= 60:
        return "A100-40GB"
    for pattern, name in KNOWN_GPUS:
        if re.search(pattern, gpu.name):
            return name
    model = re.sub(r"[^A-Za-z0-9]+", "-", gpu.name.replace("NVIDIA", "")).strip("-")
    return f"{model}-{memory_gib}GB"


def _accelerator_for(gpu: LocalGpu) -> Accelerator:
    """The Accelerator row for ``gpu``, created from NVML's figures when the catalog lacks it."""
    name = accelerator_name(gpu)
    peak = PEAK_BF16_TFLOPS.get(name, 0)
    accelerator, _ = Accelerator.objects.get_or_create(
        name=name,
        defaults={"memory_gib": round(gpu.memory_bytes / GIB), "peak_bf16_tflops": Decimal(peak),
                  "product_label": re.sub(r"\s+", "-", gpu.name.strip())},
    )
    return accelerator


def emulated_shape() -> tuple[int, int]:
    """``(nodes, gpus_per_node)`` of the emulated pool: ``LOCAL_RUNNER_NODES`` and ``LOCAL_RUNNER_EMULATED_GPUS // nodes``, each at least 1."""
    nodes = max(1, int(settings.LOCAL_RUNNER_NODES))
    return nodes, max(1, int(settings.LOCAL_RUNNER_EMULATED_GPUS) // nodes)


def machine_resources() -> tuple[int, int]:
    """This machine's ``(CPU millicores, memory MiB)``: ``os.cpu_count()`` cores and the physical memory
    (``SC_PHYS_PAGES`` x ``SC_PAGE_SIZE``; 0 where the platform does not say)."""
    cpu = (os.cpu_count() or 1) * 1000
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (ValueError, OSError, AttributeError):
        memory = 0
    return cpu, memory


def local_nodes(nodes: int, gpus_per_node: int) -> tuple[NodeInfo, ...]:
    """The local pool's nodes, ``local-node-0`` ...: ``gpus_per_node`` GPUs each and this machine's CPU and memory
    (the nodes are process groups of one machine, so each may use all of it), schedulable."""
    cpu, memory = machine_resources()
    return tuple(NodeInfo(f"local-node-{i}", gpus_per_node, cpu, memory, zone=REGION, topology_domain=REGION)
                 for i in range(nodes))


def shared_nodes(accelerator: str | None = None) -> list[SharedNode]:
    """The emulated cluster's shared nodes: ``LOCAL_RUNNER_SHARED_NODES`` read for GPUs of ``accelerator`` (default
    ``LOCAL_RUNNER_ACCELERATOR``; ``runners.local.sharing.parse_shared_nodes``). Raises SharedNodesError for a
    configuration it cannot read."""
    return parse_shared_nodes(getattr(settings, "LOCAL_RUNNER_SHARED_NODES", ""),
                              accelerator or settings.LOCAL_RUNNER_ACCELERATOR)


def shared_node_infos(product: str, accelerator: str | None = None) -> tuple[NodeInfo, ...]:
    """The shared nodes (``shared_nodes``) as ``NodeInfo``: this machine's CPU and memory each (as ``local_nodes``),
    their GPUs as ``runners.kubernetes.nodepools.gpu_inventory`` reads a node with the same labels, and those labels
    (``sharing.node_labels`` with GPUs of ``product``, the accelerator's ``nvidia.com/gpu.product``)."""
    cpu, memory = machine_resources()
    return tuple(NodeInfo(n.name, cpu_milli=cpu, memory_mib=memory, zone=REGION, topology_domain=REGION,
                          labels=tuple(sorted(node_labels(n, product).items())), **inventory(n))
                 for n in shared_nodes(accelerator))


def local_cpu_nodes() -> tuple[NodeInfo, ...]:
    """The local CPU pool's nodes, ``local-cpu-0`` ...: ``LOCAL_RUNNER_NODES`` (at least 1) nodes of 0 GPUs, each with
    this machine's CPU and memory (``machine_resources``; process groups of one machine, as ``local_nodes``)."""
    cpu, memory = machine_resources()
    return tuple(NodeInfo(f"local-cpu-{i}", 0, cpu, memory, zone=REGION, topology_domain=REGION)
                 for i in range(max(1, int(settings.LOCAL_RUNNER_NODES))))


def local_cpu_pool() -> PoolCapacity:
    """The local CPU pool as the local backend discovers it: the CPU flavor, on-demand, ``local_cpu_nodes``."""
    nodes = local_cpu_nodes()
    return PoolCapacity(CPU_POOL_NAME, CPU_ACCELERATOR, NodePool.CapacityType.ON_DEMAND, len(nodes), 0,
                        node_list=nodes)


def local_pools(emulated: bool | None = None, gpus: list[LocalGpu] | None = None) -> list[PoolCapacity]:
    """This machine's node pools as the local backend discovers them: its GPU pool, then its CPU pool
    (``local_cpu_pool``).

    ``emulated``: True for the emulated pool of the settings, False for the
    NVML GPUs (only the CPU pool when there are none), None to choose by what
    NVML finds. ``gpus`` may pass a ``detect_gpus()`` result.
    """
    if emulated is not True:
        gpus = detect_gpus() if gpus is None else gpus
        if gpus:
            return [PoolCapacity(POOL_NAME, accelerator_name(gpus[0]), NodePool.CapacityType.ON_DEMAND, 1, len(gpus),
                                 node_list=local_nodes(1, len(gpus))), local_cpu_pool()]
        if emulated is False:
            return [local_cpu_pool()]
    nodes, per_node = emulated_shape()
    product = Accelerator.objects.filter(name=settings.LOCAL_RUNNER_ACCELERATOR).values_list("product_label",
                                                                                             flat=True).first()
    return [PoolCapacity(POOL_NAME, settings.LOCAL_RUNNER_ACCELERATOR, NodePool.CapacityType.ON_DEMAND, nodes, per_node,
                         node_list=local_nodes(nodes, per_node) + shared_node_infos(product or "")),
            local_cpu_pool()]


def gpu_pool(cluster: Cluster) -> NodePool:
    """The local cluster's GPU node pool (``POOL_NAME``; its other pool is the CPU pool)."""
    return cluster.node_pools.get(name=POOL_NAME)


def ensure_local_cluster() -> Cluster:
    """Create or update the local cluster, its ``gpu`` and ``cpu`` node pools and their prices; returns the cluster.

    With NVML GPUs: cluster ``local`` with one pool of 1 node x (GPU count)
    GPUs of the first GPU's accelerator. Without: cluster ``local-emulated``
    (``emulated=True``) with ``LOCAL_RUNNER_NODES`` nodes x
    ``LOCAL_RUNNER_EMULATED_GPUS // nodes`` GPUs of ``LOCAL_RUNNER_ACCELERATOR``, and the shared nodes of
    ``LOCAL_RUNNER_SHARED_NODES`` beside them (``shared_node_infos``; the NVML cluster has none).
    The pool's nodes are stored as ``Node`` rows (``local_nodes``). The
    ``cpu`` pool of the CPU flavor has ``local_cpu_nodes``, priced by
    ``ensure_local_cpu_price``.
    The price is a cluster override (see ``ensure_local_price``).
    Idempotent: a second call with the same machine and settings writes
    nothing. Raises Accelerator.DoesNotExist when ``LOCAL_RUNNER_ACCELERATOR``
    is neither in the database nor in ``costs/data/accelerators.csv``, and
    SharedNodesError when ``LOCAL_RUNNER_SHARED_NODES`` cannot be read.
    """
    gpus = detect_gpus()
    with transaction.atomic():
        if gpus:
            name, emulated, accelerator = GPU_CLUSTER_NAME, False, _accelerator_for(gpus[0])
            nodes, per_node = 1, len(gpus)
        else:
            name, emulated, accelerator = EMULATED_CLUSTER_NAME, True, _configured_accelerator()
            nodes, per_node = emulated_shape()
        cluster = _update_or_create(Cluster, {"name": name}, {"provider": PROVIDER, "region": REGION,
                                                              "backend": Cluster.Backend.LOCAL, "emulated": emulated})
        pool = _update_or_create(NodePool, {"cluster": cluster, "name": POOL_NAME},
                                 {"accelerator": accelerator, "capacity_type": NodePool.CapacityType.ON_DEMAND,
                                  "nodes": nodes, "gpus_per_node": per_node})
        cpu_nodes = local_cpu_nodes()
        flavor = cpu_flavor()
        cpu_pool = _update_or_create(NodePool, {"cluster": cluster, "name": CPU_POOL_NAME},
                                     {"accelerator": flavor, "capacity_type": NodePool.CapacityType.ON_DEMAND,
                                      "nodes": len(cpu_nodes), "gpus_per_node": 0})
        shared = () if gpus else shared_node_infos(accelerator.product_label, accelerator.name)
        store_nodes(cluster, [(n, pool, accelerator.product_label, pool.capacity_type)
                              for n in local_nodes(nodes, per_node) + shared]
                    + [(n, cpu_pool, "", cpu_pool.capacity_type) for n in cpu_nodes])
        ensure_local_price(cluster, accelerator)
        ensure_local_cpu_price(cluster, flavor)
    return cluster


def refresh_local_inventory() -> list[dict]:
    """Record this machine's nodes again when a local cluster is registered (``ensure_local_cluster``), so the node
    inventory over time (``runners.NodeSpan``, capacity GPU-hours) follows it as node sync follows a Kubernetes
    cluster; nothing when no local cluster exists. Returns one ``{"cluster", "nodes"}`` result, or none."""
    if not Cluster.objects.filter(backend=Cluster.Backend.LOCAL,
                                  name__in=[GPU_CLUSTER_NAME, EMULATED_CLUSTER_NAME]).exists():
        return []
    cluster = ensure_local_cluster()
    return [{"cluster": cluster.name, "nodes": cluster.gpu_nodes.count()}]


def _configured_accelerator() -> Accelerator:
    name = settings.LOCAL_RUNNER_ACCELERATOR
    if not Accelerator.objects.filter(name=name).exists():
        from costs.seed import seed_accelerators

        seed_accelerators()
    return Accelerator.objects.get(name=name)


def _update_or_create(model, keys: dict, values: dict):
    """Like ``update_or_create`` but saves only when a value differs, so a repeated call writes nothing."""
    obj, created = model.objects.get_or_create(**keys, defaults=values)
    changed = [field for field, value in values.items() if getattr(obj, field) != value]
    if not created and changed:
        for field in changed:
            setattr(obj, field, values[field])
        obj.save(update_fields=changed)
    return obj


def ensure_local_price(cluster: Cluster, accelerator: Accelerator):
    """The cluster's on-demand price override for ``accelerator`` (USD per GPU-hour); created if missing.

    Equal to the AWS us-east-1 on-demand catalog price of the accelerator
    in force now (``costs/data/prices.csv``, SkyPilot's catalog), else
    $1.00, effective from ``costs.seed.CATALOG_EFFECTIVE_FROM``. An existing
    override at that instant is kept as it is: later prices are new
    effective-dated rows, never a rewrite of the past. Returns the Price.
    """
    from costs.models import Price
    from costs.seed import CATALOG_EFFECTIVE_FROM

    existing = _override(cluster, accelerator)
    if existing is not None:
        return existing
    reference = _catalog_price(accelerator, REFERENCE_PROVIDER, REFERENCE_REGION)
    if reference is not None:
        amount = reference.usd_per_gpu_hour
        basis = f"priced like {REFERENCE_PROVIDER} {REFERENCE_REGION} on-demand {accelerator.name}"
    else:
        amount, basis = FALLBACK_PRICE, "no catalog price for this accelerator, flat $1.00/GPU-h"
    what = "demo price for emulated GPUs (jobs run on the CPU)" if cluster.emulated else "local GPUs"
    return Price.objects.create(
        provider=PROVIDER, region=REGION, accelerator=accelerator, capacity_type=NodePool.CapacityType.ON_DEMAND,
        cluster=cluster, usd_per_gpu_hour=amount, effective_from=CATALOG_EFFECTIVE_FROM, source=f"{what}: {basis}"[:200],
    )


def _catalog_price(accelerator: Accelerator, provider: str, region: str, **extra):
    """The catalog's (no cluster) on-demand Price of ``accelerator`` in ``provider`` ``region`` in force now, with
    ``extra`` filters, or None."""
    from costs.models import Price

    return (Price.objects.filter(cluster__isnull=True, provider=provider, region=region, accelerator=accelerator,
                                 capacity_type=NodePool.CapacityType.ON_DEMAND, effective_from__lte=timezone.now(),
                                 **extra)
            .order_by("-effective_from").first())


def _override(cluster: Cluster, accelerator: Accelerator):
    """The cluster's on-demand price override for ``accelerator`` effective from the catalog's start, or None."""
    from costs.models import Price
    from costs.seed import CATALOG_EFFECTIVE_FROM

    return Price.objects.filter(cluster=cluster, accelerator=accelerator, capacity_type=NodePool.CapacityType.ON_DEMAND,
                                effective_from=CATALOG_EFFECTIVE_FROM).first()


def ensure_local_cpu_price(cluster: Cluster, flavor: Accelerator):
    """The cluster's on-demand price override for its CPU pool (``flavor``: the CPU accelerator); created if missing.

    USD 0 per GPU-hour and the GCP us-central1 on-demand catalog prices per vCPU-hour and GiB-hour in force now
    (``costs/data/cpu_prices.csv``, seeded by ``seed_catalog``; N2 $0.031611 and $0.004237), so a CPU-only job
    here is offered and billed as on a cloud CPU pool; without that catalog row, none is created (the pool is
    then not offered: a job waits with the "no price" reason, ADR 0012). Effective from
    ``costs.seed.CATALOG_EFFECTIVE_FROM``; an existing override at that instant is kept. Returns the Price or None.
    """
    from costs.models import Price
    from costs.seed import CATALOG_EFFECTIVE_FROM

    existing = _override(cluster, flavor)
    if existing is not None:
        return existing
    reference = _catalog_price(flavor, CPU_REFERENCE_PROVIDER, CPU_REFERENCE_REGION, usd_per_vcpu_hour__isnull=False)
    if reference is None:
        log.warning("no %s %s CPU price in the catalog: the local CPU pool is not offered until one exists",
                    CPU_REFERENCE_PROVIDER, CPU_REFERENCE_REGION)
        return None
    return Price.objects.create(
        provider=PROVIDER, region=REGION, accelerator=flavor, capacity_type=NodePool.CapacityType.ON_DEMAND,
        cluster=cluster, usd_per_gpu_hour=Decimal(0), usd_per_vcpu_hour=reference.usd_per_vcpu_hour,
        usd_per_gib_hour=reference.usd_per_gib_hour, effective_from=CATALOG_EFFECTIVE_FROM,
        source=(f"this machine's CPUs: priced like {CPU_REFERENCE_PROVIDER} {CPU_REFERENCE_REGION} on-demand "
                f"vCPU-hours and GiB-hours")[:200],
    )
