"""Shared GPUs on the local runner's emulated cluster: time-sliced (or MPS) nodes and MIG nodes beside its whole-GPU
nodes (ADR 0040), configured by ``LOCAL_RUNNER_SHARED_NODES``.

A shared node is described to the platform exactly as a Kubernetes node whose GPU feature discovery labels say the
same: its ``NodeInfo`` has the sharing mode, replicas, slice resource, MIG devices per profile and physical GPUs
that ``runners.kubernetes.nodepools.gpu_inventory`` reads from those labels, and carries the labels themselves
(``node_labels``), so placement (``jobs.scheduling.offers``) works on it unchanged.

**Configuration** (``LOCAL_RUNNER_SHARED_NODES``, entries separated by ``;``, one node each):

- ``time-slicing:<gpus>x<replicas>`` (or ``mps:...``): ``<gpus>`` physical GPUs each advertised as ``<replicas>``
  slices of ``nvidia.com/gpu`` (the device plugin's time-slicing ``replicas``; at least 2);
- ``mig-mixed:<gpus>x<profile>=<count>,<profile>=<count>...[+<whole>]``: ``<gpus>`` physical GPUs each cut into
  those MIG devices (the mixed strategy: one resource per profile), and ``<whole>`` GPUs without MIG (default 0).
  Profiles are NVIDIA's for the local accelerator (``core.gpus.MIG_PROFILES``); one GPU's devices must fit in its
  7 compute and 8 memory slices.

Example: ``time-slicing:1x4;mig-mixed:1x1g.10gb=2,3g.40gb=1``: a node of 1 GPU time-sliced 4 ways and a node of
1 GPU cut into two ``1g.10gb`` and one ``3g.40gb``. Nodes are named ``local-<mode>-<i>`` (``local-time-slicing-0``,
``local-mig-mixed-1``); their GPUs are numbered on this machine after the whole GPUs (``machine_gpus``).

Standard library and ``core.gpus`` only (read by the node supervisors' side as well).
"""

from __future__ import annotations

import dataclasses

from core.gpus import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, MILLI_PER_GPU, mig_profile

#: The labels GPU feature discovery and the NVIDIA device plugin put on a node (the ones ``gpu_inventory`` reads).
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
SHARED_SUFFIX = "-SHARED"
GPU_RESOURCE = "nvidia.com/gpu"
TIME_SHARED = ("time-slicing", "mps")
MODES = (*TIME_SHARED, "mig-mixed")


class SharedNodesError(ValueError):
    """``LOCAL_RUNNER_SHARED_NODES`` cannot be read; the message names the entry and why."""


@dataclasses.dataclass(frozen=True)
class MigInstance:
    """One MIG device of an emulated GPU: the GPU's index on its node, its GPU instance id (``GPU_I_ID``, numbered
    from 1 on each GPU in the order configured) and its profile."""

    gpu: int
    instance: int
    profile: str


@dataclasses.dataclass(frozen=True)
class SharedNode:
    """One configured shared node: ``name``, ``sharing`` (``time-slicing``, ``mps`` or ``mig-mixed``), ``gpus``
    (physical GPUs), ``replicas`` (slices of each, time-slicing and MPS), ``partition`` (``(profile, count)`` of
    the MIG devices each cut GPU holds) and ``cut`` (the GPUs so cut; the rest, ``gpus - cut``, are whole)."""

    name: str
    sharing: str
    gpus: int
    replicas: int = 1
    partition: tuple[tuple[str, int], ...] = ()
    cut: int = 0

    @property
    def whole_gpus(self) -> int:
        """GPUs a pod can hold alone: those without MIG of a MIG node; none of a time-sliced one."""
        return self.gpus - self.cut if self.sharing == "mig-mixed" else 0

    @property
    def mig_devices(self) -> tuple[tuple[str, int], ...]:
        """``(profile, devices on the node)`` in profile order."""
        totals: dict[str, int] = {}
        for profile, count in self.partition:
            totals[profile] = totals.get(profile, 0) + count * self.cut
        return tuple(sorted(totals.items()))

    def instances(self) -> list[MigInstance]:
        """The node's MIG devices, GPU by GPU, instance ids from 1 per GPU in the configured order."""
        out = []
        for gpu in range(self.cut):
            number = 0
            for profile, count in self.partition:
                for _ in range(count):
                    number += 1
                    out.append(MigInstance(gpu, number, profile))
        return out


def parse_shared_nodes(text: str, accelerator: str) -> list[SharedNode]:
    """The shared nodes of the configuration ``text`` (see the module docstring) on GPUs of ``accelerator`` (an
    accelerator name, for its MIG profiles). Empty text: none. Raises SharedNodesError naming the bad entry."""
    nodes: list[SharedNode] = []
    counters: dict[str, int] = {}
    for entry in (e.strip() for e in (text or "").split(";")):
        if not entry:
            continue
        mode, _, shape = entry.partition(":")
        mode = mode.strip().lower()
        if mode not in MODES:
            raise SharedNodesError(f"{entry!r}: the mode must be one of {', '.join(MODES)}")
        name = f"local-{mode}-{counters.get(mode, 0)}"
        counters[mode] = counters.get(mode, 0) + 1
        if mode in TIME_SHARED:
            gpus, replicas = _pair(entry, shape)
            if replicas < 2:
                raise SharedNodesError(f"{entry!r}: replicas must be at least 2 (1 is a whole GPU)")
            nodes.append(SharedNode(name, mode, gpus, replicas))
        else:
            nodes.append(_mig_node(entry, name, shape, accelerator))
    return nodes


def _int(entry: str, word: str) -> int:
    try:
        value = int(word)
    except ValueError:
        raise SharedNodesError(f"{entry!r}: {word!r} is not a whole number") from None
    if value < 1:
        raise SharedNodesError(f"{entry!r}: {value} must be at least 1")
    return value


def _pair(entry: str, shape: str) -> tuple[int, int]:
    left, x, right = shape.partition("x")
    if not x:
        raise SharedNodesError(f"{entry!r}: expected <gpus>x<...>")
    return _int(entry, left.strip()), _int(entry, right.strip())


def _mig_node(entry: str, name: str, shape: str, accelerator: str) -> SharedNode:
    head, plus, whole = shape.partition("+")
    left, x, right = head.partition("x")
    if not x or not right:
        raise SharedNodesError(f"{entry!r}: expected <gpus>x<profile>=<count>,...[+<whole gpus>]")
    cut = _int(entry, left.strip())
    partition = []
    compute = memory = 0
    for item in right.split(","):
        profile, eq, count = item.strip().partition("=")
        known = mig_profile(accelerator, profile)
        if known is None:
            raise SharedNodesError(f"{entry!r}: {profile!r} is not a MIG profile of {accelerator}")
        number = _int(entry, count.strip()) if eq else 1
        partition.append((profile, number))
        compute += known.compute_slices * number
        memory += known.memory_slices * number
    if compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
        raise SharedNodesError(f"{entry!r}: the devices of one GPU need {compute} compute and {memory} memory slices; "
                               f"a GPU has {MIG_COMPUTE_SLICES} and {MIG_MEMORY_SLICES}")
    extra = _int(entry, whole.strip()) if plus else 0
    return SharedNode(name, "mig-mixed", cut + extra, 1, tuple(partition), cut)


def node_labels(node: SharedNode, product: str) -> dict[str, str]:
    """The labels GPU feature discovery and the device plugin would put on ``node`` with GPUs of ``product`` (the
    accelerator's ``nvidia.com/gpu.product``): the product (``-SHARED`` under time-slicing and MPS), the physical
    GPUs, the replicas and strategy; under MIG mixed the strategy and ``nvidia.com/mig-<profile>.count`` per
    profile (NVIDIA/k8s-device-plugin README, "Shared Access to GPUs" and "Catalog of Labels")."""
    if node.sharing in TIME_SHARED:
        return {PRODUCT_LABEL: product + SHARED_SUFFIX, COUNT_LABEL: str(node.gpus),
                REPLICAS_LABEL: str(node.replicas), STRATEGY_LABEL: node.sharing}
    labels = {PRODUCT_LABEL: product, COUNT_LABEL: str(node.gpus), MIG_STRATEGY_LABEL: "mixed"}
    labels.update({f"nvidia.com/mig-{profile}.count": str(count) for profile, count in node.mig_devices})
    return labels


def inventory(node: SharedNode) -> dict:
    """The ``NodeInfo`` fields of ``node``'s GPUs, in ``gpu_inventory``'s terms: ``gpus`` (physical),
    ``sharing``, ``gpu_replicas``, ``slice_resource``, ``mig_devices`` and ``whole_gpus``."""
    if node.sharing in TIME_SHARED:
        return {"gpus": node.gpus, "sharing": node.sharing, "gpu_replicas": node.replicas,
                "slice_resource": GPU_RESOURCE, "mig_devices": (), "whole_gpus": 0}
    return {"gpus": node.gpus, "sharing": "mig-mixed", "gpu_replicas": 1, "slice_resource": "",
            "mig_devices": node.mig_devices, "whole_gpus": node.whole_gpus}


@dataclasses.dataclass(frozen=True)
class MachineGpu:
    """One GPU of the emulated cluster as this machine numbers it: ``index`` (0 ...: the whole-GPU nodes' GPUs first,
    then each shared node's in configured order), the ``node`` it belongs to ("" for the whole-GPU nodes'), its
    index there (``on_node``), the node's ``sharing`` mode and, for a GPU cut into MIG devices, its ``instances``."""

    index: int
    node: str = ""
    on_node: int = 0
    sharing: str = "none"
    instances: tuple[MigInstance, ...] = ()


def machine_gpus(whole: int, nodes: list[SharedNode]) -> list[MachineGpu]:
    """The emulated cluster's GPUs: ``whole`` GPUs of its whole-GPU nodes (indices ``0 .. whole-1``), then every
    physical GPU of ``nodes`` (``parse_shared_nodes``)."""
    gpus = [MachineGpu(i) for i in range(whole)]
    for node in nodes:
        instances = node.instances()
        for k in range(node.gpus):
            mine = tuple(i for i in instances if i.gpu == k)
            gpus.append(MachineGpu(len(gpus), node.name, k, node.sharing if (mine or node.sharing in TIME_SHARED)
                                   else "none", mine))
    return gpus


@dataclasses.dataclass(frozen=True)
class Share:
    """Where one pod's share sits: its ``node``, the physical GPU there (``gpu``, its index on the node), its
    share (``milli``, milli-GPUs), its MIG ``profile`` and GPU instance id (``instance``; "" and 0 on a time-sliced
    node)."""

    node: str
    gpu: int
    milli: int
    profile: str = ""
    instance: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data) -> Share | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(str(data["node"]), int(data["gpu"]), int(data["milli"]), str(data.get("profile") or ""),
                       int(data.get("instance") or 0))
        except (KeyError, TypeError, ValueError):
            return None


def place_share(node: SharedNode, milli: int, profile: str, taken: list[Share]) -> Share | None:
    """Where on ``node`` a new pod's share of ``milli`` milli-GPUs (or a MIG device of ``profile``) goes, next to the
    live shares ``taken`` there; None when nothing holds it.

    A MIG device: the first free device of its profile (GPU by GPU, instance ids in order). A time-slice: the GPU
    with the least free share that holds ``milli`` and has a free replica (best fit, the lowest index on a tie),
    as admission books shares (``jobs.scheduling.offers.book_share``), so the device the pod is told it holds
    is the one the platform's model counts.
    """
    mine = [s for s in taken if s.node == node.name]
    if profile:
        used = {(s.gpu, s.instance) for s in mine if s.profile}
        for device in node.instances():
            if device.profile == profile and (device.gpu, device.instance) not in used:
                return Share(node.name, device.gpu, milli, profile, device.instance)
        return None
    if node.sharing not in TIME_SHARED:
        return None
    free = [MILLI_PER_GPU - sum(s.milli for s in mine if s.gpu == k) for k in range(node.gpus)]
    slices = [node.replicas - sum(1 for s in mine if s.gpu == k) for k in range(node.gpus)]
    fits = [k for k in range(node.gpus) if free[k] >= milli and slices[k] > 0]
    if not fits:
        return None
    k = min(fits, key=lambda k: (free[k], k))
    return Share(node.name, k, milli)
