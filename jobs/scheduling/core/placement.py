"""Placement (Kueue's resource flavors): which node pools could ever hold a job, which has room now, which is cheapest.

Pure functions over plain data, so the decision loop can call them in a
tight loop and tests can compute expected choices by hand.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from decimal import Decimal

#: CPU or memory of a node that nobody reported (a pool registered by hand): no limit.
UNLIMITED = 1 << 62

#: The price of what a pool does not charge for (``PoolOffer.prices``), made once.
_NO_PRICE = Decimal(0)


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


class kept:  # noqa: N801 -- a decorator, named as ``functools.cached_property`` is
    """``functools.cached_property`` without its lock: the value, computed on the first read, is stored in the
    instance's ``__dict__``, where every later read finds it without a call. Python 3.11's ``cached_property``
    takes a lock on every first read, which a pass over a new snapshot pays for each figure of each offer it reads;
    an offer is frozen, so two threads reading a figure at once compute the same value (one of them is kept)."""

    def __init__(self, func):
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.func(instance)
        return value


#: What ``PoolOffer.node_shapes`` counts of each node.
_SHAPE_FIELDS = operator.attrgetter("gpus", "cpu_milli", "memory_mib", "schedulable", "healthy")


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

    @kept
    def derived(self) -> dict:
        """Figures derived from the offer alone, each computed once and kept with it by whoever reads it (by name:
        ``"nodes"``, the node book's layout of its nodes, ``nodebook._layout``; ``("fits", shape)``, its nodes' room
        for a shape, ``nodebook._offered_fits``; ``"matching"``, the offers of a list it heads that match each
        request, ``matching_offers``, kept with the offers themselves). The offer is frozen, so none can go stale:
        an offer with other nodes or numbers is another object, with its own."""
        return {}

    @kept
    def share_nodes_ever(self) -> tuple[tuple[int, tuple[tuple[str, int], ...], int, int, bool], ...]:
        """Its nodes that take shares of a GPU, as ``(GPUs shared, MIG devices by profile, CPU millicores, memory
        MiB, takes work)``: what a share could ever have there (``holds_share``)."""
        return tuple((len(n.shares), n.mig_free, n.cpu_milli, n.memory_mib, n.takes_work) for n in self.node_rooms
                     if n.shares or n.mig_free)

    @kept
    def node_shapes(self) -> tuple[tuple[int, int, int, bool, int], ...]:
        """The distinct ``(GPUs, CPU millicores, memory MiB, takes work, how many)`` of the pool's nodes."""
        if not self.node_rooms:  # nodes synthesized from the pool's counts: all alike, schedulable
            return ((self.gpus_per_node, UNLIMITED, UNLIMITED, True, self.nodes),) if self.nodes > 0 else ()
        # counted by (GPUs, CPU, memory, schedulable, healthy) in C, then merged by whether the node takes work
        # (``NodeRoom.takes_work``), each shape where its first node is
        shapes: dict[tuple, int] = {}
        for (gpus, cpu, memory, schedulable, healthy), count in Counter(map(_SHAPE_FIELDS, self.rooms())).items():
            shape = (gpus, cpu, memory, schedulable and healthy)
            shapes[shape] = shapes.get(shape, 0) + count
        return tuple((*shape, count) for shape, count in shapes.items())

    @kept
    def prices(self) -> tuple[Decimal, Decimal, Decimal]:
        """What pools are compared by: USD per GPU-hour, then (CPU node pools) per vCPU-hour and per GiB-hour
        (computed once: the offer is frozen)."""
        return (self.usd_per_gpu_hour, self.usd_per_vcpu_hour or _NO_PRICE, self.usd_per_gib_hour or _NO_PRICE)

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


#: Nodes beyond the request's count that ``matches`` reads one by one on an offer whose shapes are not counted yet,
#: before it counts them all (``PoolOffer.node_shapes``): a pool whose nodes are alike is settled by its first ones.
_FIRST_NODES = 2


def matches(request: PlacementRequest, offer: PoolOffer) -> bool:
    """Whether ``offer`` could hold ``request`` once its running work ends: healthy, constraints, spot rule, and
    schedulable nodes large enough (GPUs, CPU, memory) for its ``nodes`` pods (``capable_nodes``)."""
    if not offer.healthy or request.gpus_per_node > offer.gpus_per_node or not allowed(request, offer):
        return False
    need = request.nodes
    if request.share_nodes or request.share_milli or request.mig_profile:
        return capable_nodes(request, offer, schedulable_only=True) >= need
    # pods on distinct nodes: ``capable_nodes``' count, stopped once it reaches ``need`` (every term is >= 0)
    g, c, m, held = request.gpus_per_node, request.cpu_milli, request.memory_mib, 0
    if held >= need:
        return True
    rooms = offer.node_rooms
    if rooms and "node_shapes" not in offer.__dict__:
        # an offer not counted yet: its first nodes usually settle it, without counting every node's shape
        for n in rooms[:need + _FIRST_NODES]:
            if n.schedulable and n.healthy and n.gpus >= g and n.cpu_milli >= c and n.memory_mib >= m:
                held += 1
                if held >= need:
                    return True
        held = 0
    for gpus, cpu, memory, open_, count in offer.node_shapes:
        if open_ and gpus >= g and cpu >= c and memory >= m:
            held += count
            if held >= need:
                return True
    return False


#: Requests whose matching offers ``matching_offers`` keeps per list of offers (the oldest forgotten beyond it).
KEPT_REQUESTS = 512


def kept_for(offers, key, make) -> tuple[PoolOffer, ...]:
    """``make(offers)`` (a tuple of some of ``offers``, a sequence of ``PoolOffer``: an accelerator's), kept under
    ``key`` (hashable; it names ``make``, which must read the offers alone) with the list's first offer
    (``PoolOffer.derived``: one list per offer, with every offer of it, compared by identity on each read). So a
    pass over offers kept from the pass before (an inventory that did not change) finds it without reading the
    offers again, and every reader of one pass finds it once made. Offers are frozen: a list with another offer
    anywhere is another list. At most ``KEPT_REQUESTS`` keys per list are kept."""
    if not offers:
        return ()
    derived = offers[0].derived
    entry = derived.get("matching")
    if entry is None or len(entry[0]) != len(offers) or not all(map(operator.is_, entry[0], offers)):
        entry = derived["matching"] = (tuple(offers), {})
    kept = entry[1]
    found = kept.get(key)
    if found is None:
        if len(kept) >= KEPT_REQUESTS:
            for old in list(kept)[:len(kept) - KEPT_REQUESTS + 1]:
                kept.pop(old, None)
        found = kept[key] = make(offers)
    return found


def matching_offers(request: PlacementRequest, offers) -> tuple[PoolOffer, ...]:
    """The offers of ``offers`` that ``matches`` ``request``, in their order (``kept_for``: kept with the offers, so
    every reader of one pass, and every pass over the same offers, matches them once)."""
    return kept_for(offers, request, lambda offers: tuple(o for o in offers if matches(request, o)))


def matching_in_price_order(request: PlacementRequest, offers) -> tuple[PoolOffer, ...]:
    """``matching_offers`` in ``price_order`` (kept as they are). The sort is stable, so it is the accelerator's
    pools sorted (once per list, ``in_price_order``), then filtered: a pass's requests share one sort."""
    def make(offers):
        matching = {id(o) for o in matching_offers(request, offers)}
        return tuple(o for o in in_price_order(offers) if id(o) in matching)

    return kept_for(offers, ("price order", request), make)


def in_price_order(offers) -> tuple[PoolOffer, ...]:
    """``offers`` (a sequence of ``PoolOffer``: an accelerator's) sorted by ``price_order``, kept with them
    (``kept_for``)."""
    return kept_for(offers, "price order", lambda offers: tuple(sorted(offers, key=price_order)))


def price_order(offer: PoolOffer) -> tuple:
    """The order pools are tried in: cheapest first, then by cluster name and pool id (stable between passes)."""
    return (*offer.prices, offer.cluster_name, offer.node_pool_id)
