"""Placement (Kueue's resource flavors): which node pools could ever hold a job, which has room now, which is cheapest.

Pure functions over plain data, so the decision loop can call them in a
tight loop and tests can compute expected choices by hand.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from decimal import Decimal

#: CPU or memory of a node that nobody reported (a pool registered by hand): no limit.
UNLIMITED = 1 << 62


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRoom:
    """One node of a pool as admission sees it: allocatable GPUs, CPU (millicores) and memory (MiB), and what is free
    of each now (allocatable minus the requests of every pod on it, the platform's and others'); its topology
    domain (block, rack or zone label; "" when unknown), whether new pods may land on it (False: cordoned, or
    tainted NoSchedule/NoExecute) and whether it is healthy (False: GPU errors or attempts lost there; see
    ``runners.health``). Only a node that is both takes work (``takes_work``). A ``suspect`` node (evidence short
    of unhealthy) takes work and counts as capacity, but the packing policies try it last: it is chosen only
    when the pool's other nodes cannot hold the job (``NodeBook.fit``)."""

    name: str
    gpus: int
    free_gpus: int
    cpu_milli: int = UNLIMITED
    free_cpu_milli: int = UNLIMITED
    memory_mib: int = UNLIMITED
    free_memory_mib: int = UNLIMITED
    domain: str = ""
    schedulable: bool = True
    healthy: bool = True
    suspect: bool = False
    #: GPU sharing (ADR 0040): a time-sliced or MPS node's free share of each physical GPU (milli-GPUs) and free
    #: slices of each (empty: the node takes no shares, and ``gpus`` are its whole GPUs); a MIG node's free devices
    #: per profile, ``(profile, free)``. ``gpus``/``free_gpus`` count only GPUs a pod can hold alone.
    shares: tuple[int, ...] = ()
    slices: tuple[int, ...] = ()
    mig_free: tuple[tuple[str, int], ...] = ()

    @property
    def takes_work(self) -> bool:
        """Whether admission may place work on it: schedulable and healthy."""
        return self.schedulable and self.healthy


@dataclasses.dataclass(frozen=True)
class PoolOffer:
    """A node pool as admission sees it: where it is, its shape, free GPUs now and its price (USD/GPU-hour).

    ``node_rooms``: its nodes one by one (``NodeRoom``); when empty, the pool
    is ``nodes`` identical nodes of ``gpus_per_node`` GPUs whose used GPUs
    (``nodes x gpus_per_node - free_gpus``) fill the first nodes
    (``rooms()``), with no CPU or memory limit.
    """

    node_pool_id: int
    cluster_id: int
    cluster_name: str
    provider: str
    region: str
    capacity_type: str
    nodes: int
    gpus_per_node: int
    free_gpus: int
    usd_per_gpu_hour: Decimal
    healthy: bool = True
    node_rooms: tuple[NodeRoom, ...] = ()
    name: str = ""
    #: A CPU node pool's prices per vCPU-hour and per GiB-hour of memory (None: priced by GPU only).
    usd_per_vcpu_hour: Decimal | None = None
    usd_per_gib_hour: Decimal | None = None
    #: Whether the cluster's runner starts multi-role jobs (``runners.base.MULTI_ROLE_BACKENDS``); only such pools
    #: are offered to one (``room.Room.matching_entry``).
    multi_role: bool = True

    def rooms(self) -> tuple[NodeRoom, ...]:
        """The pool's nodes: ``node_rooms``, or ``nodes`` nodes named ``<pool id>-<i>`` with the used GPUs packed
        onto the first ones."""
        if self.node_rooms:
            return self.node_rooms
        used = max(self.nodes * self.gpus_per_node - self.free_gpus, 0)
        out = []
        for i in range(self.nodes):
            taken = min(used, self.gpus_per_node)
            used -= taken
            out.append(NodeRoom(f"{self.node_pool_id}-{i}", self.gpus_per_node, self.gpus_per_node - taken))
        return tuple(out)

    @functools.cached_property
    def share_nodes_ever(self) -> tuple[tuple[int, tuple[tuple[str, int], ...], int, int, bool], ...]:
        """Its nodes that take shares of a GPU, as ``(GPUs shared, MIG devices by profile, CPU millicores, memory
        MiB, takes work)``: what a share could ever have there (``holds_share``)."""
        return tuple((len(n.shares), n.mig_free, n.cpu_milli, n.memory_mib, n.takes_work) for n in self.node_rooms
                     if n.shares or n.mig_free)

    @functools.cached_property
    def node_shapes(self) -> tuple[tuple[int, int, int, bool, int], ...]:
        """The distinct ``(GPUs, CPU millicores, memory MiB, takes work, how many)`` of the pool's nodes."""
        if not self.node_rooms:  # nodes synthesized from the pool's counts: all alike, schedulable
            return ((self.gpus_per_node, UNLIMITED, UNLIMITED, True, self.nodes),) if self.nodes > 0 else ()
        counts = Counter((n.gpus, n.cpu_milli, n.memory_mib, n.takes_work) for n in self.rooms())
        return tuple((*shape, count) for shape, count in counts.items())

    @functools.cached_property
    def prices(self) -> tuple[Decimal, Decimal, Decimal]:
        """What pools are compared by: USD per GPU-hour, then (CPU node pools) per vCPU-hour and per GiB-hour
        (computed once: the offer is frozen)."""
        return (self.usd_per_gpu_hour, self.usd_per_vcpu_hour or Decimal(0), self.usd_per_gib_hour or Decimal(0))

    @property
    def label(self) -> str:
        """``cluster/pool`` for messages."""
        return f"{self.cluster_name}/{self.name or self.node_pool_id}"


@dataclasses.dataclass(frozen=True)
class PlacementRequest:
    """What a job needs: ``nodes`` pods each with ``gpus_per_node`` GPUs, ``cpu_milli`` CPU (millicores) and
    ``memory_mib`` memory (MiB) free on its node; spot allowed if ``preemptible``; optional lists of allowed
    providers, regions and cluster names (empty: any).

    ``share_nodes`` False (a training job: one process group per node): every pod on a distinct node.
    ``share_nodes`` True (an inference job's replicas, independent servers): pods may share a node that has
    room for several, spread first (``nodebook.NodeBook.fit``); ``pods_on`` counts what one node holds.
    """

    nodes: int
    gpus_per_node: int
    preemptible: bool = False
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    share_nodes: bool = False
    #: Part of one GPU (ADR 0040): the share its one pod holds, milli-GPUs, on a GPU of a node that shares GPUs
    #: (``NodeRoom.shares``); or ``mig_profile``, one free MIG device of that profile. ``gpus_per_node`` is then 1.
    share_milli: int = 0
    mig_profile: str = ""

    @property
    def shared(self) -> bool:
        """Whether it asks part of one GPU (a share or a MIG device) rather than whole GPUs."""
        return bool(self.share_milli or self.mig_profile)

    @property
    def total_gpus(self) -> int:
        return 0 if self.shared else self.nodes * self.gpus_per_node

    def holds(self, node: NodeRoom) -> bool:
        """Whether ``node``'s allocatable resources could ever hold one node of the request (cordon ignored)."""
        return (node.gpus >= self.gpus_per_node and node.cpu_milli >= self.cpu_milli
                and node.memory_mib >= self.memory_mib)


def allowed(request: PlacementRequest, offer: PoolOffer) -> bool:
    """Whether the request's constraints and the spot rule allow ``offer`` (health and size aside)."""
    return ((not request.providers or offer.provider in request.providers)
            and (not request.regions or offer.region in request.regions)
            and (not request.clusters or offer.cluster_name in request.clusters)
            and (request.preemptible or offer.capacity_type != "spot"))


def pods_on(request: PlacementRequest, gpus: int, cpu_milli: int, memory_mib: int) -> int:
    """How many pods of ``request`` a node with ``gpus`` GPUs, ``cpu_milli`` millicores and ``memory_mib`` MiB
    (free, or allocatable for "ever") holds: 0 or 1 when pods take distinct nodes; with ``share_nodes`` as many
    as each resource allows, at most ``request.nodes``.

    Class of failure this rule closes: "accepted but never placeable". The submission check
    (``jobs.scheduling.never``), the fleet match (``matches``) and the node choice (``NodeBook.fit``) all count
    a node's room for a job with this one function, so a job accepted at submission is placeable on an empty
    fleet and one no pool could ever hold is refused there (ADR 0019).
    """
    g, c, m = request.gpus_per_node, request.cpu_milli, request.memory_mib
    if gpus < g or cpu_milli < c or memory_mib < m:
        return 0
    if not request.share_nodes:
        return 1
    most = request.nodes
    for have, ask in ((gpus, g), (cpu_milli, c), (memory_mib, m)):
        if ask > 0:
            most = min(most, have // ask)
    return most


def pods_held(request: PlacementRequest, shapes) -> int:
    """How many pods of ``request`` nodes of ``shapes`` (``(GPUs, CPU millicores, memory MiB, how many)`` each)
    hold together (``pods_on`` per node)."""
    return sum(pods_on(request, gpus, cpu, memory) * count for gpus, cpu, memory, count in shapes)


def holds_share(request: PlacementRequest, gpus_shared: int, mig: tuple[tuple[str, int], ...], cpu_milli: int,
                memory_mib: int) -> bool:
    """Whether a node sharing ``gpus_shared`` GPUs (time-slicing or MPS) and offering the MIG devices ``mig``
    (``(profile, count)``), with ``cpu_milli`` and ``memory_mib``, could ever hold the one pod of a shared
    ``request``: a MIG profile among its devices, or a share on any GPU it shares (a share is below one GPU)."""
    if cpu_milli < request.cpu_milli or memory_mib < request.memory_mib:
        return False
    if request.mig_profile:
        return any(name == request.mig_profile and count > 0 for name, count in mig)
    return gpus_shared > 0


def capable_nodes(request: PlacementRequest, offer: PoolOffer, *, schedulable_only: bool) -> int:
    """How many pods of ``request`` ``offer``'s nodes could ever hold (``pods_held``; only nodes accepting pods, if
    asked): for a job whose pods take distinct nodes, the nodes that could each hold one; for a shared request
    (one pod on part of a GPU) the nodes that share GPUs as it asks (``holds_share``)."""
    if request.shared:
        return sum(1 for gpus, mig, cpu, memory, open_ in offer.share_nodes_ever
                   if (open_ or not schedulable_only) and holds_share(request, gpus, mig, cpu, memory))
    return pods_held(request, ((gpus, cpu, memory, count) for gpus, cpu, memory, open_, count in offer.node_shapes
                               if open_ or not schedulable_only))


def matches(request: PlacementRequest, offer: PoolOffer) -> bool:
    """Whether ``offer`` could hold ``request`` once its running work ends: healthy, constraints, spot rule, and
    schedulable nodes large enough (GPUs, CPU, memory) for its ``nodes`` pods (``capable_nodes``)."""
    return (offer.healthy and allowed(request, offer) and request.gpus_per_node <= offer.gpus_per_node
            and capable_nodes(request, offer, schedulable_only=True) >= request.nodes)


def price_order(offer: PoolOffer) -> tuple:
    """The order pools are tried in: cheapest first, then by cluster name and pool id (stable between passes)."""
    return (*offer.prices, offer.cluster_name, offer.node_pool_id)
