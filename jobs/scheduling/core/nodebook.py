"""The node book (node-exact placement): free GPUs, CPU and memory of every node, the packing policies that
choose nodes for a job, and the choice of a pool with room now.

Pure functions and classes over plain data (``placement``'s pools, nodes and requests), so the decision loop can
call them in a tight loop and tests can compute expected choices by hand.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections import Counter
from types import MappingProxyType

from core.gpus import MILLI_PER_GPU

from .fragmentation import NodeGpus, ShapeHistory, by_size, job_milli, node_kinds, share_fragment, step_down
from .placement import UNLIMITED, PlacementRequest, PoolOffer, matches, pods_on, price_order
from .scarcity import PRIOR_WEIGHT, PoolDemand, level


def fits_now(request: PlacementRequest, offer: PoolOffer) -> bool:
    """Whether ``offer`` has room for the whole job now: ``nodes`` distinct nodes with room each (all or none)."""
    return matches(request, offer) and NodeBook([offer]).fit(offer.node_pool_id, request) is not None


def choose_pool(request: PlacementRequest, offers: list[PoolOffer], policy: str = "best-fit") -> PoolOffer | None:
    """The cheapest matching offer with room now for every node of the job; between equal prices, ``policy``
    decides (``NodeBook.place``), then the cluster name and pool id. Returns None when no offer has room."""
    book = NodeBook(offers, policy)
    found = book.place(request, sorted((o for o in offers if matches(request, o)), key=price_order))
    return found[0] if found else None



# --- node bookkeeping ----------------------------------------------------------------------------------------

#: The packing policies: ``best-fit`` (default) takes the nodes with the least room that still fit (GPUs, then
#: CPU, then memory, compared in that order), so whole nodes stay free for large jobs; ``first-fit`` takes nodes in the pool's order;
#: ``spread`` takes the nodes with the most free GPUs (the least fragmentation-aware choice, for comparison);
#: ``fgd`` takes the nodes whose fragmentation grows least for the expected workload (``fragment_gpus``).
PACKING_POLICIES = ("best-fit", "first-fit", "spread", "fgd")
DEFAULT_PACKING_POLICY = "best-fit"

#: Decimal digits (of a milli-GPU) growths are compared at, so equal growths reached by different float sums tie
#: and best fit decides between them.
GROWTH_DIGITS = 6

#: ``fgd`` on whole GPUs of nodes that do not share: growths of fragmentation (GPUs) are compared in steps of this
#: size after the GPUs left, so a growth smaller than it leaves the choice to best fit's CPU and memory left.
FIT_GROWTH_GPUS = 1.0

#: Seen jobs between two refreshes of the shapes FGD scores shares for (``NodeBook.milli_shapes``), at most: a book
#: that has seen fewer jobs than this refreshes once their number doubled (``refresh_after``).
SHAPE_REFRESH = 32


def refresh_after(seen: int) -> int:
    """How many more jobs must be seen before the shapes FGD scores, read from a history of ``seen`` jobs (counted
    observations, ``ShapeHistory.version``), are read again: ``seen`` itself, at least 1 and at most
    ``SHAPE_REFRESH``.

    Why: the shapes are an estimate of the workload from ``seen`` samples; the next ``n`` move it by about
    ``n / (seen + n)`` of its weight, so a fixed interval leaves a young book's estimate stale (with 32, the first 32
    jobs of a platform that saw none are scored by the first one's shape alone), while refreshing once the count
    doubled bounds that drift at a half and costs a handful of refreshes (1, 2, 4, 8, 16, then every 32). A book
    built from a snapshot that holds 32 jobs or more refreshes every 32, as before."""
    return min(SHAPE_REFRESH, max(1, seen))

#: One kind of job of the expected workload: ``(GPUs per node, CPU millicores per node, memory MiB per node,
#: weight)``; a kind's popularity is its weight over the workload's total.
WorkloadShape = tuple[int, int, int, float]


def fragment_gpus(free_gpus: int, free_cpu_milli: int, free_memory_mib: int,
                  workload: list[WorkloadShape] | tuple[WorkloadShape, ...]) -> float:
    """A node's expected GPU fragmentation for ``workload``: GPUs (float), ``sum_m p_m * F(m)``.

    Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
    Descent", USENIX ATC 2023: the fragment of a node for a task ``m``, ``F(m)``, is the GPU capacity the task could
    not use there: all of the node's free GPUs when ``m`` does not fit on the node in some resource (GPUs, CPU or
    memory); otherwise only the partly used GPUs with less free than ``m`` asks per GPU, of which there are none
    when GPUs are allocated whole, so 0. The node's fragmentation is the expectation over the workload's kinds
    weighted by popularity ``p_m``. Kinds asking no GPU are left out (they strand no GPU); an empty workload, or one
    of zero weight, gives 0.

    ``free_gpus``, ``free_cpu_milli`` (millicores), ``free_memory_mib`` (MiB): what is free on the node now.
    """
    total = sum(w for g, _, _, w in workload if g > 0)
    if free_gpus <= 0 or total <= 0:
        return 0.0
    stranded = sum(w for g, c, m, w in workload
                   if g > 0 and (g > free_gpus or c > free_cpu_milli or m > free_memory_mib))
    return free_gpus * stranded / total


def workload_of(jobs) -> tuple[WorkloadShape, ...]:
    """The workload of ``jobs`` (anything with ``gpus_per_node``, ``cpu_milli``, ``memory_mib``): each distinct
    per-node shape with the number of jobs of that shape as its weight."""
    counts = Counter((j.gpus_per_node, j.cpu_milli, j.memory_mib) for j in jobs)
    return tuple((g, c, m, float(n)) for (g, c, m), n in sorted(counts.items()))


class _PoolNodes:
    """One pool's nodes as parallel lists (free GPUs, CPU, memory), with the schedulable nodes grouped by free GPUs
    (``buckets[k]``: ``(free CPU, free memory, index)`` of the nodes with ``k`` GPUs free, sorted: the first that
    fits a request is the tightest on CPU, then memory)."""

    __slots__ = ("offer", "names", "index", "gpus", "free_g", "free_c", "free_m", "domain", "sched", "buckets",
                 "failed", "domains", "free_total", "suspect", "shares", "slices", "mig", "mixed", "held",
                 "any_mixed", "ver", "choices", "tick", "log", "ranks", "cap", "free_cm", "changes", "fits", "narrow")

    def __init__(self, offer: PoolOffer, changes: list[int] | None = None):
        self.offer = offer
        # the book's pools changed, in order (``_LazyPools.changes``): each ``move`` adds this pool's id
        self.changes = [] if changes is None else changes
        # the offer's nodes as laid out (``_layout``); from a layout kept with the offer, what the pass changes is
        # copied and the rest (read only) shared with every other book of the same offer
        layout, kept = _layout(offer)
        (self.names, self.index, self.gpus, free_g, free_c, free_m, self.domain, self.sched, self.mixed, shares,
         slices, mig, self.suspect, self.domains, self.any_mixed, buckets, self.free_total, self.cap,
         free_cm, sharing, has_mig) = layout
        if kept:
            free_g, free_c, free_m, buckets, free_cm = free_g[:], free_c[:], free_m[:], list(map(list.copy, buckets)), free_cm[:]
            # a pool whose nodes share no GPU keeps empty tuples there (nothing to change); one without MIG devices
            # the read-only ``_NO_MIG`` per node, which ``NodeBook._take_share`` replaces in this book's own list
            if sharing:
                shares, slices = list(map(list.copy, shares)), list(map(list.copy, slices))
            mig = list(map(dict.copy, mig)) if has_mig else mig[:]
        self.free_g, self.free_c, self.free_m = free_g, free_c, free_m
        # schedulable nodes by free GPUs: ``(free CPU, free memory, index)`` sorted in each
        self.buckets: list[list[tuple[int, int, int]]] = buckets
        # the open nodes' free CPU and memory, for ``room_share`` (``cap``: their allocatable GPUs, CPU and memory)
        self.free_cm = free_cm
        # GPU sharing (ADR 0040): per node, free milli-GPUs and free slices of each shared GPU, free MIG devices
        self.shares, self.slices, self.mig = shares, slices, mig
        # mixed nodes' GPUs held whole: GPU index -> its free slices before (given back with it)
        self.held: dict[int, dict[int, int]] = {}
        # per node, a count bumped by every change (``move``), and FGD's share choices remembered against it:
        # (node, share, CPU, memory) -> (count, shapes' version, ``NodeBook._share_choice``)
        self.ver = [0] * len(free_g)
        self.choices: dict[tuple[int, int, int, int], tuple] = {}
        # the nodes changed, in order (``tick`` changes in all; the log keeps the latest ones), and per shape of a
        # shared request the nodes' keys for it with the tick they were read at (``NodeBook._share_node``)
        self.tick = 0
        self.log: list[int] = []
        self.ranks: dict[tuple, list] = {}
        # request shapes known not to fit now: (nodes, GPUs, CPU, memory, pods may share a node)
        self.failed: list[tuple[int, int, int, int, bool]] = []
        # best fit's answer per whole-GPU request shape (nodes, GPUs, CPU, memory, pods may share a node), read at
        # ``tick``: (tick, node indexes or None, ``NodeBook.leftover``, suspect nodes among them)
        self.fits: dict[tuple, tuple] = {}
        # the narrower jobs' demand here (``scarcity.PoolDemand.exclusive``'s entry) and the pods of its mean shape
        # the pool holds (``NodeBook.narrow_room``), read at ``tick``: (tick, demand, pods)
        self.narrow: tuple | None = None

    def move(self, i: int, dg: int, dc: int, dm: int) -> None:
        """Change node ``i``'s free resources by the deltas, keeping its bucket."""
        self.ver[i] += 1
        self.tick += 1
        self.log.append(i)
        self.changes.append(self.offer.node_pool_id)
        if len(self.log) > 2 * len(self.names):
            del self.log[:len(self.log) - len(self.names)]
        if self.sched[i]:
            bucket = self.buckets[self.free_g[i]]
            del bucket[bisect.bisect_left(bucket, (self.free_c[i], self.free_m[i], i))]
            self.free_total += dg
            self.free_cm[0] += dc
            self.free_cm[1] += dm
        self.free_g[i] += dg
        self.free_c[i] += dc
        self.free_m[i] += dm
        if self.sched[i]:
            bisect.insort(self.buckets[self.free_g[i]], (self.free_c[i], self.free_m[i], i))

    def free_gpus(self) -> int:
        return self.free_total

    def room_share(self) -> float:
        """The share of the open nodes' resources still free, by the scarcest of GPUs, CPU and memory (CPU or
        memory left out when some node reports none): what is left of the pool for any job, 0 to 1."""
        cap, share = self.cap, 1.0
        if cap[0]:
            share = self.free_total / cap[0]
        if cap[1]:
            share = min(share, self.free_cm[0] / cap[1])
        if cap[2]:
            share = min(share, self.free_cm[1] / cap[2])
        return max(share, 0.0)

    def most_free(self) -> int:
        """The most free GPUs on one schedulable node."""
        for k in range(len(self.buckets) - 1, -1, -1):
            if self.buckets[k]:
                return k
        return 0


#: A node's free MIG devices in a pool without any (``_PoolNodes.mig``): read-only, shared by every such node, until a
#: device given back there makes it a dict of its own (``NodeBook._take_share``).
_NO_MIG = MappingProxyType({})

#: What ``_layout`` reads of each node (``placement.NodeRoom``), in its order.
_NODE_FIELDS = operator.attrgetter("name", "gpus", "free_gpus", "free_cpu_milli", "free_memory_mib", "domain",
                                   "schedulable", "healthy", "suspect", "shares", "slices", "mig_free", "cpu_milli",
                                   "memory_mib")


def _layout(offer: PoolOffer) -> tuple[tuple, bool]:
    """``offer``'s nodes as a ``_PoolNodes`` of it starts: ``(names, index by name, GPUs, free GPUs, free CPU, free
    memory, domains, takes work, mixed, free shares, free slices, free MIG devices, suspect indexes, several
    domains, any mixed, buckets, free GPUs in all, allocatable (GPUs, CPU, memory) of the open nodes, their free
    (CPU, memory), whether some node shares GPUs, whether some node has MIG devices)``, per node where a list; and
    whether it is kept with the offer (the caller must copy what it changes) or the caller's own. A pool whose nodes
    share no GPU has an empty tuple of shares and slices per node (no list per node to make or copy); one without
    MIG devices ``_NO_MIG`` per node.

    The first book of an offer gets a layout of its own (a pass over a new snapshot pays no copy); from the second
    on, the layout is kept with the offer (``PoolOffer.derived``) and read from there. An offer is frozen, so what
    is kept can never describe other nodes (a changed inventory is a new offer, laid out afresh); nothing kept is
    ever changed: ``_PoolNodes`` copies what a pass changes (free resources, buckets, shares, slices, MIG
    devices)."""
    derived = offer.derived
    found = derived.get("nodes")
    if found is not None:
        return found, True
    keep = derived.get("laid out", False)
    derived["laid out"] = True
    rooms = offer.rooms()
    count = len(rooms)
    # column by column (the per-node work in C where it can be): the fields as read (tuples: a list only where a
    # pass changes it), then what they give
    (names, gpus, free_g, free_c, free_m, domain, schedulable, healthy, suspect, shares, slices, mig_free, cpu,
     memory) = zip(*map(_NODE_FIELDS, rooms), strict=True) if rooms else ((),) * 14
    free_g, free_c, free_m = list(free_g), list(free_c), list(free_m)
    sched = schedulable if all(healthy) else tuple(map(operator.and_, schedulable, healthy))  # ``takes_work``
    sharing = any(shares) or any(slices)
    if any(shares):
        # A node whose GPUs are taken whole or in shares (``NodeRoom.shares`` and ``gpus``): its whole GPUs are
        # its wholly free shared ones, so a share on one takes it from whole-GPU jobs and a whole job empties it.
        slices = [sl or (UNLIMITED,) * len(sh) for sh, sl in zip(shares, slices, strict=True)]
        mixed = [bool(sh) and ng > 0 for sh, ng in zip(shares, gpus, strict=True)]
        free_g = [min(min(max(0, g), ng), sum(1 for f, x in zip(sh, sl, strict=True) if f >= MILLI_PER_GPU and x > 0))
                  if mix else min(max(0, g), ng)
                  for g, ng, sh, sl, mix in zip(free_g, gpus, shares, slices, mixed, strict=True)]
    else:
        mixed = [False] * count
        if min(free_g, default=0) < 0 or any(map(operator.gt, free_g, gpus)):
            free_g = [min(max(0, g), ng) for g, ng in zip(free_g, gpus, strict=True)]
    if sharing:
        shares, slices = list(map(list, shares)), list(map(list, slices))
    else:
        shares = slices = [()] * count
    has_mig = any(mig_free)
    mig = list(map(dict, mig_free)) if has_mig else [_NO_MIG] * count
    cpu_known = max(cpu, default=0) < UNLIMITED
    memory_known = max(memory, default=0) < UNLIMITED
    if all(sched):
        free_total, cap_g, cap_c, cap_m, cm_c, cm_m = map(sum, (free_g, gpus, cpu, memory, free_c, free_m))
    else:
        free_total, cap_g, cap_c, cap_m, cm_c, cm_m = (sum(itertools.compress(column, sched))
                                                       for column in (free_g, gpus, cpu, memory, free_c, free_m))
    top = max(gpus, default=0)
    buckets: list[list[tuple[int, int, int]]] = [[] for _ in range(top + 1)]
    for g, c, m, i, open_ in zip(free_g, free_c, free_m, range(count), sched, strict=True):
        if open_:
            buckets[g].append((c, m, i))
    for bucket in buckets:
        bucket.sort()
    suspect = list(itertools.compress(range(count), suspect))
    found = (
        names, dict(zip(names, range(count), strict=True)), gpus, free_g, free_c, free_m, domain, sched, mixed,
        shares, slices, mig, frozenset(suspect), len(set(domain)) > 1, any(mixed), buckets, free_total,
        # CPU or memory 0: some node reports none
        [cap_g, cap_c if cpu_known else 0, cap_m if memory_known else 0], [cm_c, cm_m], sharing, has_mig)
    if keep:
        derived["nodes"] = found
    return found, keep


def _free_milli(p: _PoolNodes, i: int) -> int:
    """Node ``i``'s free GPU capacity in milli-GPUs: its GPUs' free shares on a node that gives whole GPUs and shares
    (partly used GPUs counted), else its free whole GPUs x 1000. What FGD's ties read after the growth, as best fit
    reads free GPUs."""
    return sum(p.shares[i]) if p.mixed[i] else p.free_g[i] * MILLI_PER_GPU


class _LazyPools(dict):
    """Pool id -> ``_PoolNodes``, each built on first use: a re-check of one admission touches one or two of the
    accelerator's pools, so the others' nodes are never laid out. An unknown pool id raises KeyError."""

    def __init__(self, offers):
        super().__init__()
        self._offers = {o.node_pool_id: o for o in offers}
        #: the id of the pool of every change of a node, in order (``_PoolNodes.move``)
        self.changes: list[int] = []

    def __missing__(self, pool_id: int) -> _PoolNodes:
        built = self[pool_id] = _PoolNodes(self._offers[pool_id], self.changes)
        return built

    def get(self, pool_id: int, default=None):
        return self[pool_id] if pool_id in self._offers else default

    def offers(self):
        """Every pool's offer, laid out or not."""
        return self._offers.values()

    def offer(self, pool_id: int) -> PoolOffer:
        """The offer of pool ``pool_id``, laid out or not (KeyError when unknown)."""
        return self._offers[pool_id]

    def cluster_of(self, pool_id: int) -> int | None:
        """The cluster id of pool ``pool_id``'s offer, laid out or not (None when unknown)."""
        offer = self._offers.get(pool_id)
        return None if offer is None else offer.cluster_id


#: Shapes whose room ``_offered_fits`` keeps with an offer (the oldest forgotten beyond it).
KEPT_FITS = 16

#: What ``_offered_fits`` reads of each node of a pool without shares (``placement.NodeRoom``).
_FIT_FIELDS = operator.attrgetter("schedulable", "healthy", "free_gpus", "gpus", "free_cpu_milli", "free_memory_mib")


def _offered_fits(offer: PoolOffer, shape: tuple[float, float, float]) -> list[int]:
    """``_pods_fits`` of ``offer``'s nodes as a ``_PoolNodes`` of it starts (free GPUs within 0 and the node's GPUs;
    on a node giving whole GPUs and shares, its wholly free shared GPUs at most), without laying the pool out: from
    the layout kept with the offer (``_layout``) when an earlier book made one, else from its nodes. A new list
    (the caller changes it); the counts are kept with the offer (``PoolOffer.derived``, ``KEPT_FITS`` shapes), so a
    pass over offers kept from the pass before reads them without a count."""
    derived = offer.derived
    key = ("fits", shape)
    kept = derived.get(key)
    if kept is not None:
        return list(kept)
    layout = derived.get("nodes")
    if layout is not None:
        out = _pods_fits(zip(layout[3], layout[4], layout[5], layout[7], strict=True), shape)
    else:
        out = _nodes_fits(offer.rooms(), shape)
    # the keys copied at once (another thread's pass may add one meanwhile), the oldest shape forgotten
    fits = [k for k in list(derived) if k.__class__ is tuple and k[0] == "fits"]
    if len(fits) >= KEPT_FITS:
        derived.pop(fits[0], None)
    derived[key] = tuple(out)
    return out


def _nodes_fits(rooms, shape: tuple[float, float, float]) -> list[int]:
    """``_offered_fits`` of nodes ``rooms`` (``placement.NodeRoom``) read one by one: nodes alike in what the count
    reads (open, free and allocatable GPUs, free CPU and memory) are counted once."""
    g, c, m = shape
    g = max(g, 0.01)
    if any(n.shares for n in rooms):
        out = []
        for n in rooms:
            if not n.takes_work:
                out.append(0)
                continue
            fg = min(max(0, n.free_gpus), n.gpus)
            if n.shares and n.gpus > 0:
                slices = n.slices or (UNLIMITED,) * len(n.shares)
                fg = min(fg, sum(1 for f, s in zip(n.shares, slices, strict=True) if f >= MILLI_PER_GPU and s > 0))
            fit = fg / g
            if c > 0:
                fit = min(fit, n.free_cpu_milli / c)
            if m > 0:
                fit = min(fit, n.free_memory_mib / m)
            out.append(int(fit))
        return out
    states = list(map(_FIT_FIELDS, rooms))
    counted: dict[tuple, int] = {}
    for state in set(states):
        schedulable, healthy, free_g, gpus, free_c, free_m = state
        if not (schedulable and healthy):
            counted[state] = 0
            continue
        fit = min(max(0, free_g), gpus) / g
        if c > 0:
            fit = min(fit, free_c / c)
        if m > 0:
            fit = min(fit, free_m / m)
        counted[state] = int(fit)
    return list(map(counted.__getitem__, states))


def narrow_shape(asked: tuple[float, float, float, float]) -> tuple[float, float, float]:
    """The mean pod of narrower jobs' decayed demand ``asked`` (pods, GPUs, CPU millicores, memory MiB), rounded
    (GPUs to 0.01, CPU and memory to 100) so that nearly equal demands share one count of room; no pods: one
    GPU and nothing else."""
    n = asked[0]
    g, c, m = (asked[1] / n, asked[2] / n, asked[3] / n) if n > 0 else (1.0, 0.0, 0.0)
    return round(g, 2), round(c, -2), round(m, -2)


def per_gpu(shape: tuple[float, float, float]) -> tuple[float, float, float]:
    """The least of ``shape`` (a mean pod, ``narrow_shape``) a narrower job could still ask: one GPU with the CPU and
    memory the shape asks per GPU (a mean pod of several GPUs averages 1-GPU pods with 8-GPU ones); a shape of at
    most one GPU as it is."""
    g, c, m = shape
    if g <= 1:
        return shape
    return 1.0, round(c / g, -2), round(m / g, -2)


def _pods_fits(nodes, shape: tuple[float, float, float]) -> list[int]:
    """``_pods_fit`` of each of ``nodes`` (``(free GPUs, free CPU, free memory, open)``; a closed node holds 0)."""
    g, c, m = shape
    g = max(g, 0.01)
    out = []
    for fg, fc, fm, open_ in nodes:
        if not open_:
            out.append(0)
            continue
        fit = fg / g
        if c > 0:
            fit = min(fit, fc / c)
        if m > 0:
            fit = min(fit, fm / m)
        out.append(int(fit))
    return out


def _pods_fit(free_g: int, free_c: int, free_m: int, shape: tuple[float, float, float]) -> int:
    """Pods of ``shape`` (``narrow_shape``) one open node with these free GPUs, CPU and memory holds: each resource
    divided by the shape's (GPUs at least 0.01), the least, floored (``placement.pods_on``'s rule)."""
    g, c, m = shape
    fit = free_g / max(g, 0.01)
    if c > 0:
        fit = min(fit, free_c / c)
    if m > 0:
        fit = min(fit, free_m / m)
    return int(fit)


class NodeBook:
    """Free GPUs, CPU and memory of every node of some pools, kept up to date as a pass admits and preempts.

    ``fit`` finds nodes for one job on one pool by the packing ``policy``
    (``PACKING_POLICIES``); ``place`` chooses the pool (cheapest first, then
    the policy's score); ``take``/``release`` book a job's nodes. A request
    shape that did not fit a pool is remembered until something is released
    there, so a queue of jobs at least as large is answered at once.

    ``workload`` (``fgd`` only): the expected jobs' shapes and weights
    (``WorkloadShape``); a shape the book is asked to place that is not in it
    joins it with weight 1, so an empty workload is the shapes asked so far.

    Shares of a GPU, and whole GPUs on nodes that also give shares, are
    placed by FGD at milli-GPU grain under ``best-fit`` and ``fgd``
    (``share_scored``, ``whole_scored``) for the shapes seen: ``history``
    (a ``fragmentation.ShapeHistory``), else one built on first use from
    ``seen`` (a callable giving ``(milli-GPUs, CPU millicores, memory MiB,
    seen at)`` per job: ``cycle.seen_shapes`` of the snapshot), with what
    ``observe`` counted since; with no shape seen, best fit.

    ``demand`` (a ``scarcity.PoolDemand``): the GPUs asked per pool set; under
    ``best-fit`` and ``fgd``, ``place`` puts a job on the pool least wanted by
    jobs narrower than it before anything else of the policy (ADR 0043).
    """

    def __init__(self, offers, policy: str = DEFAULT_PACKING_POLICY, workload: tuple[WorkloadShape, ...] = (),
                 history: ShapeHistory | None = None, seen=None, demand: PoolDemand | None = None):
        if policy not in PACKING_POLICIES:
            raise ValueError(f"unknown packing policy {policy!r}; one of {', '.join(PACKING_POLICIES)}")
        self.policy = policy
        # Constraint-aware placement (ADR 0043): the GPUs asked per pool set, read by ``place`` under best-fit and fgd
        self.demand = demand
        # (pool id, narrow shape) -> (the pool's tick, pods of the shape it holds, those pods node by node)
        self._narrow_rooms: dict[tuple, tuple[int, int, list[int]]] = {}
        # a request's pool set -> [the exclusive demand read, {pool id: [its narrow shape, its room]}, the pods
        # asked, the rooms summed, how many of the pools' changes they count]: ``_narrow_intensity``
        self._shapes_of: dict[frozenset, list] = {}
        # Shares of a GPU (and whole GPUs on nodes that also take shares) are scored by FGD at milli-GPU grain
        # for the shapes seen (``history``, else built from ``seen`` on first use), under best-fit and fgd; with
        # nothing seen, best-fit.
        self._history = history
        self._seen = seen
        # the fleet's prior (``fragmentation.node_kinds``) is still to be added to a history this book builds: once
        # it holds a job (a history given is taken as it is)
        self._prior_due = history is None
        self._pending: list[tuple[int, int, int, float]] = []
        self._milli_shapes: tuple = ()
        self._milli_version = -1
        self._milli_fragment: dict[tuple, float] = {}
        # the CPU and memory values of the shapes scored, ascending (``fragmentation.step_down``)
        self._cpu_steps: list[int] = []
        self._memory_steps: list[int] = []
        # a node's state and a share's shape -> ``_share_choice`` for the shapes scored now
        self._choice_by_state: dict[tuple, tuple | None] = {}
        self.pools: dict[int, _PoolNodes] = _LazyPools(offers)
        self.workload: list[WorkloadShape] = [s for s in workload if s[0] > 0]
        self._shapes = {s[:3] for s in self.workload}
        self._fragment: dict[tuple[int, int, int], float] = {}  # free (GPUs, CPU, memory) -> fragment_gpus

    def fragment(self, free_gpus: int, free_cpu_milli: int, free_memory_mib: int) -> float:
        """``fragment_gpus`` of a node with these free resources for the book's workload (remembered)."""
        key = (free_gpus, free_cpu_milli, free_memory_mib)
        found = self._fragment.get(key)
        if found is None:
            found = self._fragment[key] = fragment_gpus(*key, self.workload)
        return found

    def fragment_growth(self, pool_id: int, i: int, request: PlacementRequest) -> float:
        """How much node ``i`` of the pool's fragmentation (GPUs) grows if one node of ``request`` lands on it:
        FGD's score, lower is better (it may be negative)."""
        p = self.pools[pool_id]
        if p.mixed[i] and self.milli_shapes():
            return self._mixed_growth(p, i, request)
        g, c, m = p.free_g[i], p.free_c[i], p.free_m[i]
        return (self.fragment(g - request.gpus_per_node, c - request.cpu_milli, m - request.memory_mib)
                - self.fragment(g, c, m))

    def _learn(self, request: PlacementRequest) -> None:
        shape = (request.gpus_per_node, request.cpu_milli, request.memory_mib)
        if shape[0] > 0 and shape not in self._shapes:
            self._shapes.add(shape)
            self.workload.append((*shape, 1.0))
            self._fragment.clear()

    # --- FGD for shares of a GPU (milli-GPU grain) ----------------------------------------------------

    @property
    def history(self) -> ShapeHistory:
        """The shapes seen (``fragmentation.ShapeHistory``): the one given, or built from ``seen`` (a callable
        giving ``(milli-GPUs, CPU millicores, memory MiB, seen at)`` per job) when first read, with the jobs
        ``observe``d since."""
        if self._history is None:
            self._history = ShapeHistory.of_jobs(self._seen() if self._seen is not None else ())
            for shape in self._pending:
                self._history.observe(*shape)
            self._pending = []
            self._add_prior()
        return self._history

    def _add_prior(self) -> None:
        """Add the fleet's prior (``fragmentation.node_kinds`` of the book's offers, ``ShapeHistory.add_prior``) to
        the history this book built, once it has counted a job."""
        if self._prior_due and self._history.counts:
            self._prior_due = False
            self._history.add_prior(node_kinds(self.pools.offers()))

    def observe(self, gpus_per_node: int, share_milli: int, cpu_milli: int, memory_mib: int, at: float) -> None:
        """Count a job's per-pod shape (GPUs per node, or its share in milli-GPUs; CPU millicores; memory MiB),
        seen at ``at`` (seconds), in the history shares are scored for (kept aside until the history is read)."""
        shape = (job_milli(gpus_per_node, share_milli), cpu_milli, memory_mib, at)
        if self._history is None:
            self._pending.append(shape)
        else:
            self._history.observe(*shape)
            if self._prior_due:
                self._add_prior()

    def milli_shapes(self) -> tuple:
        """The shapes FGD scores shares for (``fragmentation.ShapeHistory.shapes``, weighted by
        ``fragmentation.by_size``), refreshed from the history once ``refresh_after`` more jobs were seen (or when
        empty), so the remembered scores stay valid between."""
        history = self._history
        if history is not None and history.version == self._milli_version:  # nothing seen since: as they are
            return self._milli_shapes
        history = self.history
        if history.version != self._milli_version and (
                not self._milli_shapes or history.version - self._milli_version >= refresh_after(self._milli_version)):
            self._milli_shapes = by_size(history.shapes())
            self._milli_version = history.version
            self._milli_fragment.clear()
            self._choice_by_state.clear()
            self._cpu_steps = sorted({s[1] for s in self._milli_shapes})
            self._memory_steps = sorted({s[2] for s in self._milli_shapes})
        return self._milli_shapes

    def whole_scored(self, p: _PoolNodes) -> bool:
        """Whether FGD places a whole-GPU request on pool ``p`` under best-fit: the pool has nodes that take whole
        GPUs and shares (``_PoolNodes.mixed``) and shapes were seen; there a whole job is scored at milli-GPU grain
        as a share is (fgd scores every pool so)."""
        return self.policy == "best-fit" and p.any_mixed and bool(self.milli_shapes())

    def share_scored(self, request: PlacementRequest) -> bool:
        """Whether FGD places ``request``'s share: a share (not a MIG device), under best-fit or fgd, with shapes
        seen; otherwise best-fit's least room left."""
        return (not request.mig_profile and self.policy in ("best-fit", "fgd") and bool(self.milli_shapes()))

    def node_fragment(self, shares, slices, cpu_milli: int, memory_mib: int, whole_ok: bool) -> float:
        """``fragmentation.share_fragment`` (milli-GPUs) of a node with these free shares and slices per GPU, free
        CPU and memory, for the shapes seen (remembered by the node's state, its CPU and memory by their steps:
        ``fragmentation.step_down``)."""
        cpu_milli, memory_mib = step_down(self._cpu_steps, cpu_milli), step_down(self._memory_steps, memory_mib)
        # what ``NodeGpus`` reads: the free shares of GPUs with a free slice (sorted; a GPU with none free adds
        # nothing) and the free milli-GPUs of those without (stranded)
        if min(slices, default=1) > 0:
            key = (tuple(sorted(shares)), 0, cpu_milli, memory_mib, whole_ok)
        else:
            key = (tuple(sorted(f for f, s in zip(shares, slices, strict=True) if f > 0 and s > 0)),
                   sum(f for f, s in zip(shares, slices, strict=True) if f > 0 and s <= 0), cpu_milli, memory_mib,
                   whole_ok)
        found = self._milli_fragment.get(key)
        if found is None:
            found = self._milli_fragment[key] = share_fragment(
                NodeGpus(shares, slices, cpu_milli, memory_mib, whole_ok), self._milli_shapes)
        return found

    def _share_choice(self, p: _PoolNodes, i: int, request: PlacementRequest) -> tuple[float, int, int] | None:
        """FGD's GPU of node ``i`` for a share of ``request``: ``(fragmentation growth in milli-GPUs, room left on
        that GPU, GPU index)``, the least growth, then the least room (best fit), then the lowest index; None when
        no GPU has the share free and a slice."""
        d, shares, slices = request.share_milli, p.shares[i], p.slices[i]
        key = (i, d, request.cpu_milli, request.memory_mib)
        known = p.choices.get(key)
        if known is not None and known[0] == p.ver[i] and known[1] == self._milli_version:
            return known[2]
        c, m, whole_ok = p.free_c[i], p.free_m[i], p.mixed[i]
        # nodes in the same state (the same free shares and slices per GPU, CPU and memory) choose alike: a
        # pass's many nodes still empty, or filled alike, are read once
        self.milli_shapes()
        rc, rm, cpu, memory = request.cpu_milli, request.memory_mib, self._cpu_steps, self._memory_steps
        state = (tuple(shares), tuple(slices), whole_ok, d, step_down(cpu, c), step_down(cpu, c - rc),
                 step_down(memory, m), step_down(memory, m - rm))
        best = self._choice_by_state.get(state, self)
        if best is self:
            best = self._choice_by_state[state] = self._share_choice_of(shares, slices, c, m, whole_ok, request)
        p.choices[key] = (p.ver[i], self._milli_version, best)
        return best

    def _share_choice_of(self, shares, slices, c: int, m: int, whole_ok: bool, request: PlacementRequest
                         ) -> tuple[float, int, int] | None:
        """``_share_choice`` of a node with free ``shares`` and ``slices`` per GPU, ``c`` CPU and ``m`` memory free."""
        d = request.share_milli
        before = None
        best = None
        tried = set()
        for k, free in enumerate(shares):
            if free < d or slices[k] <= 0 or (free, slices[k]) in tried:
                continue
            tried.add((free, slices[k]))
            if before is None:
                before = self.node_fragment(shares, slices, c, m, whole_ok)
            after_s, after_l = list(shares), list(slices)
            after_s[k] -= d
            after_l[k] -= 1
            growth = round(self.node_fragment(after_s, after_l, c - request.cpu_milli, m - request.memory_mib,
                                              whole_ok) - before, GROWTH_DIGITS)
            choice = (growth, free - d, k)
            if best is None or choice < best:
                best = choice
        return best

    def _share_gpu(self, p: _PoolNodes, i: int, request: PlacementRequest) -> int | None:
        """The GPU of node ``i`` a share of ``request`` goes to: FGD's (``_share_choice``) when shares are scored,
        else the least free share that holds it (``_gpu_for``)."""
        if self.share_scored(request):
            found = self._share_choice(p, i, request)
            return None if found is None else found[2]
        return self._gpu_for(p, i, request)

    def share_gpu(self, pool_id: int, i: int, request: PlacementRequest) -> int | None:
        """The GPU index of node ``i`` of the pool a share of ``request`` is booked on (``_share_gpu``)."""
        return self._share_gpu(self.pools[pool_id], i, request)

    def _mixed_growth(self, p: _PoolNodes, i: int, request: PlacementRequest) -> float:
        """Fragmentation growth (GPUs) of a node that takes whole GPUs and shares when one node of a whole-GPU
        ``request`` lands on it, at milli-GPU grain for the shapes seen."""
        g = request.gpus_per_node
        shares, slices = list(p.shares[i]), list(p.slices[i])
        before = self.node_fragment(shares, slices, p.free_c[i], p.free_m[i], True)
        for k in range(len(shares)):
            if g and shares[k] >= MILLI_PER_GPU and slices[k] > 0:
                shares[k], slices[k], g = 0, 0, g - 1
        after = self.node_fragment(shares, slices, p.free_c[i] - request.cpu_milli, p.free_m[i] - request.memory_mib,
                                   True)
        return round(after - before, GROWTH_DIGITS) / MILLI_PER_GPU

    def _whole(self, p: _PoolNodes, i: int, g: int, c: int, m: int, sign: int) -> None:
        """Book (``sign`` -1) or give back (+1) ``g`` whole GPUs, ``c`` CPU and ``m`` memory on node ``i``; on a node
        that also takes shares, the GPUs taken are wholly free ones (lowest index first), emptied of their share
        and slices until given back."""
        p.move(i, sign * g, sign * c, sign * m)
        if not p.mixed[i] or not g:
            return
        held = p.held.setdefault(i, {})
        shares, slices = p.shares[i], p.slices[i]
        if sign < 0:
            for k in range(len(shares)):
                if g and k not in held and shares[k] >= MILLI_PER_GPU and slices[k] > 0:
                    held[k] = slices[k]
                    shares[k], slices[k], g = 0, 0, g - 1
        else:
            for k in sorted(held)[:g]:
                shares[k], slices[k] = MILLI_PER_GPU, held.pop(k)

    def free_gpus(self, pool_id: int) -> int:
        """Free GPUs of the pool's schedulable nodes."""
        return self.pools[pool_id].free_gpus()

    def most_free(self, pool_id: int) -> int:
        """The most free GPUs on one schedulable node of the pool."""
        return self.pools[pool_id].most_free()

    def nodes_with_room(self, pool_id: int, request: PlacementRequest) -> int:
        """How many schedulable nodes of the pool have room now for one node of ``request``."""
        p = self.pools[pool_id]
        g, c, m = request.gpus_per_node, request.cpu_milli, request.memory_mib
        return sum(1 for k in range(g, len(p.buckets)) for fc, fm, _ in p.buckets[k] if fc >= c and fm >= m)

    def room_by_resource(self, pool_id: int, request: PlacementRequest) -> tuple[int, int, int, int, int]:
        """Which resource keeps the pool's schedulable nodes from holding one node of ``request`` now:
        ``(with GPUs, with GPUs and CPU, with GPUs, CPU and memory, most free CPU millicores on a node that has the
        GPUs but too little CPU (0: none such), most free memory MiB on a node that has the GPUs and CPU but too
        little memory (0: none such))``, counts in nodes."""
        p = self.pools[pool_id]
        g, c, m = request.gpus_per_node, request.cpu_milli, request.memory_mib
        with_g = with_c = with_all = most_c = most_m = 0
        for k in range(g, len(p.buckets)):
            for fc, fm, _ in p.buckets[k]:
                with_g += 1
                if fc < c:
                    most_c = max(most_c, fc)
                    continue
                with_c += 1
                if fm < m:
                    most_m = max(most_m, fm)
                    continue
                with_all += 1
        return with_g, with_c, with_all, most_c, most_m

    def fit(self, pool_id: int, request: PlacementRequest) -> list[int] | None:
        """Node indexes of the pool for every node of ``request`` (distinct nodes, each with room), or None.

        Multi-node requests prefer nodes of one topology domain: the first
        domain (in the policy's order) that can hold them all; otherwise the
        policy's nodes across domains. Suspect nodes (``NodeRoom.suspect``)
        come after every other node in the policy's order: one is taken only
        when the pool's other nodes cannot hold the job (healthy nodes across
        domains before a domain completed by a suspect node).

        A request whose pods may share a node (``share_nodes``: an inference
        job's replicas) takes distinct nodes as above when the pool has them
        (spread first); otherwise its pods are dealt round by round onto the
        nodes with room, one more pod per node per round (``_share``), so an
        index may repeat: one entry per pod.
        """
        p = self.pools[pool_id]
        if request.shared:
            found = self._share_node(p, request)
            return None if found is None else [found]
        n, g, c, m = request.nodes, request.gpus_per_node, request.cpu_milli, request.memory_mib
        share = request.share_nodes
        if g >= len(p.buckets):
            return None
        for fn, fg, fc, fm, fs in p.failed:
            # A shared request that failed covers a distinct-node one of at least its size, not the reverse.
            if n >= fn and g >= fg and c >= fc and m >= fm and (fs or not share):
                return None
        scored = self.whole_scored(p)
        if n == 1 and self.policy == "best-fit" and not p.suspect and not scored:
            found = self._tightest(p, g, c, m)
        elif sum(map(len, p.buckets[g:])) < n:
            found = None  # fewer nodes with room than pods: only sharing (below) can hold it
        elif self.policy == "first-fit":
            found = self._first_fit(p, n, g, c, m)
        else:
            if self.policy == "fgd" or scored:
                candidates = self._by_fragment(pool_id, request)
            else:
                levels = range(g, len(p.buckets)) if self.policy == "best-fit" else range(len(p.buckets) - 1, g - 1, -1)
                candidates = self._by_levels(p, g, c, m, levels)
            found = self._pick_healthy_first(p, n, candidates) if p.suspect else self._pick(p, n, candidates)
        if found is None and share and n > 1:
            found = self._share(p, request)
        if found is None:
            p.failed = [s for s in p.failed if not (s[0] >= n and s[1] >= g and s[2] >= c and s[3] >= m
                                                    and (share or not s[4]))]
            p.failed.append((n, g, c, m, share))
        return found

    @staticmethod
    def _gpu_for(p: _PoolNodes, i: int, request: PlacementRequest) -> int | None:
        """The GPU of node ``i`` a share of ``request`` goes to: the one with the least free share that holds it
        and has a free slice (best fit, then the lowest index); None when none has room."""
        best = None
        for k, free in enumerate(p.shares[i]):
            if free >= request.share_milli and p.slices[i][k] > 0 and (best is None or free < p.shares[i][best]):
                best = k
        return best

    def _share_node(self, p: _PoolNodes, request: PlacementRequest) -> int | None:
        """The node for the one pod of a shared ``request`` (part of one GPU): among schedulable nodes with its CPU
        and memory free, one with a free MIG device of its profile (the fewest such free first) or a GPU with room
        for its share (``_gpu_for``: the least free share left first), healthy nodes before suspect ones, then
        the least free CPU and memory, then the pool's order; None when none has room. When shares are scored
        (``share_scored``), the node and GPU whose fragmentation grows least come first (``_share_choice``), then
        best fit's order: the least room left on the GPU, then on the node's GPUs (its free milli-GPUs), then the
        order above.

        Each node's key (``_share_key``) is remembered per request shape and read again only for the nodes changed
        since (``_PoolNodes.log``) or, for all, when the shapes scored changed: the answer is ``_share_node_scan``'s,
        the plain scan of every node, at a pass's cost of one key per node changed instead of one per node."""
        scored = self.share_scored(request)
        shape = (scored, request.share_milli, request.mig_profile, request.cpu_milli, request.memory_mib)
        rank = p.ranks.get(shape)
        version = self._milli_version if scored else None
        behind = None if rank is None or rank[1] != version else p.tick - rank[0]
        if behind == 0:
            return rank[3]
        if behind is None or behind > len(p.log):
            keys = self._share_keys(p, request, scored)
        else:
            keys = rank[2]
            for i in set(p.log[len(p.log) - behind:]):
                keys[i] = self._share_key(p, i, request, scored)
        best = min(filter(None, keys), default=None)
        found = None if best is None else best[-1]
        p.ranks[shape] = (p.tick, version, keys, found)
        return found

    def _share_keys(self, p: _PoolNodes, request: PlacementRequest, scored: bool) -> list[tuple | None]:
        """``_share_key`` of every node of the pool. When shares are scored, nodes in the same state (free shares
        and slices per GPU, CPU, memory, whether they take work and whole GPUs) rank alike but for their index and
        whether they are suspect: one is read, the others take its key."""
        if not scored:
            return [self._share_key(p, i, request, scored) for i in range(len(p.names))]
        keys: list[tuple | None] = []
        alike: dict[tuple, tuple | None] = {}
        shares, slices, free_c, free_m, mixed, sched, suspect = (p.shares, p.slices, p.free_c, p.free_m, p.mixed,
                                                                 p.sched, p.suspect)
        for i in range(len(p.names)):
            state = (tuple(shares[i]), tuple(slices[i]), free_c[i], free_m[i], mixed[i], sched[i])
            key = alike.get(state, self)
            if key is self:
                key = alike[state] = self._share_key(p, i, request, scored)
            elif key is not None:
                key = (i in suspect, *key[1:-1], i)
            keys.append(key)
        return keys

    def _share_node_scan(self, p: _PoolNodes, request: PlacementRequest) -> int | None:
        """``_share_node`` read from every node's key afresh, nothing remembered: the reference it must agree
        with."""
        scored = self.share_scored(request)
        keys = [k for k in (self._share_key(p, i, request, scored) for i in range(len(p.names))) if k is not None]
        return min(keys)[-1] if keys else None

    def _share_key(self, p: _PoolNodes, i: int, request: PlacementRequest, scored: bool) -> tuple | None:
        """Node ``i``'s rank for the one pod of a shared ``request`` (lower first; its index last), or None when it
        cannot hold it now (``_share_node``)."""
        c, m = request.cpu_milli, request.memory_mib
        if not p.sched[i] or p.free_c[i] < c or p.free_m[i] < m:
            return None
        if scored:
            found = self._share_choice(p, i, request)
            if found is None:
                return None
            # ties as best fit's: the least room left on the GPU, then on the node's GPUs, then CPU, memory
            return (i in p.suspect, found[0], found[1], sum(p.shares[i]) - request.share_milli, p.free_c[i],
                    p.free_m[i], i)
        if request.mig_profile:
            room = p.mig[i].get(request.mig_profile, 0)
            if room <= 0:
                return None
        else:
            k = self._gpu_for(p, i, request)
            if k is None:
                return None
            room = p.shares[i][k] - request.share_milli
        return (i in p.suspect, room, p.free_c[i], p.free_m[i], i)

    def _take_share(self, p: _PoolNodes, i: int, request: PlacementRequest, sign: int, gpu: int | None = None
                    ) -> None:
        """Book (``sign`` -1) or give back (+1) the one pod of a shared ``request`` on node ``i``: its CPU and
        memory, and its MIG device or its share and slice of one GPU (when booking, the ``_gpu_for`` GPU; when
        giving back, the GPU with the least free share that has it booked)."""
        p.move(i, 0, sign * request.cpu_milli, sign * request.memory_mib)
        if request.mig_profile:
            mig = p.mig[i]
            if mig is _NO_MIG:  # a node without MIG devices: a dict of its own from the first one given back
                mig = p.mig[i] = {}
            mig[request.mig_profile] = mig.get(request.mig_profile, 0) + sign
            return
        if sign < 0:
            k = self._share_gpu(p, i, request) if gpu is None else gpu
        else:
            whole = p.held.get(i, ())
            held = [k for k, free in enumerate(p.shares[i])
                    if MILLI_PER_GPU - free >= request.share_milli and k not in whole]
            k = gpu if gpu in held else min(held, key=lambda k: (p.shares[i][k], k)) if held else None
        if k is not None:
            was_whole = p.shares[i][k] >= MILLI_PER_GPU
            p.shares[i][k] += sign * request.share_milli
            p.slices[i][k] += sign
            if p.mixed[i] and was_whole != (p.shares[i][k] >= MILLI_PER_GPU):
                p.move(i, sign, 0, 0)  # a wholly free GPU of a mixed node taken in part, or free again

    @staticmethod
    def _share(p: _PoolNodes, request: PlacementRequest) -> list[int] | None:
        """Node indexes for the ``nodes`` pods of a ``share_nodes`` request when the pool has fewer distinct nodes
        with room than pods: round by round, one more pod on each node that still has room for it (``pods_on``
        of its free resources), healthy nodes before suspect ones, fewest free GPUs first within each (so the
        nodes left whole stay whole); None when the nodes with room hold fewer pods than asked."""
        n, g = request.nodes, request.gpus_per_node
        order = sorted((i for k in range(g, len(p.buckets)) for _fc, _fm, i in p.buckets[k]),
                       key=lambda i: (i in p.suspect, p.free_g[i], p.free_c[i], p.free_m[i], i))
        room = {i: pods_on(request, p.free_g[i], p.free_c[i], p.free_m[i]) for i in order}
        if sum(room.values()) < n:
            return None
        found: list[int] = []
        turn = 0
        while len(found) < n:
            turn += 1
            for i in order:
                if room[i] >= turn:
                    found.append(i)
                    if len(found) == n:
                        break
        return found

    @staticmethod
    def _tightest(p: _PoolNodes, g, c, m) -> list[int] | None:
        """Best-fit for one node: the first node of ``_by_levels`` (fewest free GPUs at or above ``g``, then least
        free CPU, then memory), without the generator; None when none has room."""
        buckets = p.buckets
        for k in range(g, len(buckets)):
            bucket = buckets[k]
            if not bucket:
                continue
            for j in range(bisect.bisect_left(bucket, (c, -1, -1)), len(bucket)):
                entry = bucket[j]
                if entry[1] >= m:
                    return [entry[2]]
        return None

    @staticmethod
    def _first_fit(p: _PoolNodes, n, g, c, m) -> list[int] | None:
        found, later, suspect = [], [], p.suspect
        for i in range(len(p.names)):
            if p.sched[i] and p.free_g[i] >= g and p.free_c[i] >= c and p.free_m[i] >= m:
                if suspect and i in suspect:
                    later.append(i)
                    continue
                found.append(i)
                if len(found) == n:
                    return found
        found += later[:n - len(found)]
        return found if len(found) == n else None

    @staticmethod
    def _by_levels(p: _PoolNodes, g, c, m, levels):
        """The schedulable nodes with room for one node of (``g`` GPUs, ``c`` CPU, ``m`` memory), level by level of
        free GPUs in ``levels``' order, the least free CPU, then memory, first within a level."""
        for k in levels:
            bucket = p.buckets[k]
            if not bucket:
                continue
            # Nodes with less free CPU than asked come first in the bucket: start after them.
            for _fc, fm, i in bucket[bisect.bisect_left(bucket, (c, -1, -1)):]:
                if fm >= m:
                    yield i

    def _by_fragment(self, pool_id: int, request: PlacementRequest) -> list[int]:
        """The schedulable nodes with room for one node of ``request``, least fragmentation growth first (FGD),
        then best-fit's order (fewest free GPUs, CPU, memory; on a pool with nodes that give whole GPUs and shares,
        the fewest free milli-GPUs, ``_free_milli``, instead of GPUs), then index."""
        if self.policy == "fgd":
            self._learn(request)
        p = self.pools[pool_id]
        g, c, m = request.gpus_per_node, request.cpu_milli, request.memory_mib
        if self.policy == "fgd" and not p.any_mixed:  # whole GPUs: the fewest GPUs left first, FGD between them
            scored = [(math.floor(self.fragment_growth(pool_id, i, request) / FIT_GROWTH_GPUS + 0.5), k, fc, fm, i)
                      for k in range(g, len(p.buckets)) for fc, fm, i in p.buckets[k] if fc >= c and fm >= m]
        elif p.any_mixed:  # ties by the node's free milli-GPUs (partly used GPUs too), then CPU, memory
            scored = [(self.fragment_growth(pool_id, i, request), _free_milli(p, i), fc, fm, i)
                      for k in range(g, len(p.buckets)) for fc, fm, i in p.buckets[k] if fc >= c and fm >= m]
        else:
            scored = [(self.fragment_growth(pool_id, i, request), k, fc, fm, i)
                      for k in range(g, len(p.buckets)) for fc, fm, i in p.buckets[k] if fc >= c and fm >= m]
        scored.sort()
        return [s[-1] for s in scored]

    @staticmethod
    def _pick(p: _PoolNodes, n: int, candidates) -> list[int] | None:
        """The first ``n`` of ``candidates`` (node indexes, best first) all in one topology domain when some domain
        has ``n`` of them (the first to get there), else the first ``n`` across domains; None when fewer."""
        chosen: list[int] = []
        by_domain: dict[str, list[int]] = {}
        for i in candidates:
            chosen.append(i)
            if not p.domains:
                if len(chosen) == n:
                    return chosen
                continue
            same = by_domain.setdefault(p.domain[i], [])
            same.append(i)
            if len(same) == n:
                return same
        return chosen[:n] if len(chosen) >= n else None

    @classmethod
    def _pick_healthy_first(cls, p: _PoolNodes, n: int, candidates) -> list[int] | None:
        """``_pick`` over the candidates that are not suspect; only when they cannot hold the job, over all of
        them with the suspect ones last (each group in the policy's order). Lazy like ``_pick``: a job that the
        first healthy candidates hold reads no further. For pools with suspect nodes only."""
        healthy: list[int] = []
        later: list[int] = []
        suspect = p.suspect

        def not_suspect():
            for i in candidates:
                if i in suspect:
                    later.append(i)
                else:
                    healthy.append(i)
                    yield i

        found = cls._pick(p, n, not_suspect())
        if found is None and later:  # every candidate was read: complete the job with suspect nodes
            found = cls._pick(p, n, healthy + later)
        return found

    def leftover(self, pool_id: int, nodes: list[int], request: PlacementRequest) -> tuple[int, int, int]:
        """GPUs, CPU and memory left free on ``nodes`` once ``request`` takes them (the best-fit score, compared in
        that order: lower packs tighter)."""
        p = self.pools[pool_id]
        if request.shared:  # what is left of the GPU (or of the profile's devices) it takes
            i = nodes[0]
            k = None if request.mig_profile else self._share_gpu(p, i, request)
            room = p.mig[i].get(request.mig_profile, 0) - 1 if k is None else p.shares[i][k] - request.share_milli
            return room, p.free_c[i] - request.cpu_milli, p.free_m[i] - request.memory_mib
        if len(nodes) == 1:
            i = nodes[0]
            return (p.free_g[i] - request.gpus_per_node, p.free_c[i] - request.cpu_milli,
                    p.free_m[i] - request.memory_mib)
        distinct = set(nodes)  # a node holding several pods of a shared request counts once
        return (sum(p.free_g[i] for i in distinct) - request.gpus_per_node * len(nodes),
                sum(p.free_c[i] for i in distinct) - request.cpu_milli * len(nodes),
                sum(p.free_m[i] for i in distinct) - request.memory_mib * len(nodes))

    def place(self, request: PlacementRequest, offers: list[PoolOffer]) -> tuple[PoolOffer, list[int]] | None:
        """The pool and nodes for ``request`` among ``offers`` (already in ``price_order``, all matching): the
        cheapest price with room; between pools of that price, the fewest suspect nodes chosen, then (``best-fit``
        and ``fgd``, with a ``demand``) the lowest scarcity level (``scarcity.level``: the pool least wanted by jobs
        narrower than this one, ADR 0043; 0 everywhere when no job is narrower; the prior's level where every node
        chosen had room for no GPU of theirs, ``_takes_no_narrow_room``), then the tightest
        fit for ``best-fit`` (fewest GPUs left on the chosen nodes, then CPU, then memory, then fewest free GPUs in
        the pool, so emptier pools stay whole), for ``fgd`` the least fragmentation growth summed over the chosen
        nodes and then best-fit's score, the loosest for ``spread``, the first for ``first-fit``; then the offers'
        order. None when none has room. A cheaper pool wins even on a suspect node: a suspect node takes work."""
        best = None
        pools, need = self.pools, request.total_gpus
        best_fit = self.policy == "best-fit"
        n, g = request.nodes, request.gpus_per_node
        exclusive, intensity = self._exclusive(request, offers)
        lvl = 0
        # the level of a pool no narrower job was seen on (the prior alone), which is also what a placement that takes
        # no room from the narrower jobs scores (``_takes_no_narrow_room``)
        free_lvl = level(intensity, 1.0) if exclusive else 0
        shape = None
        # best fit of whole GPUs reads only the pool's nodes: its answer is kept per pool until the pool changes
        kept = best_fit and not request.shared
        rkey = (n, g, request.cpu_milli, request.memory_mib, request.share_nodes) if kept else None
        for o in offers:
            if best is not None and o.prices != best[0].prices:
                break
            p = pools[o.node_pool_id]
            if p.free_total < need:  # fewer free GPUs on its open nodes than the job asks
                continue
            if exclusive:  # ``_level``, with the pool's room for the narrower jobs' shape kept until it changes
                asked = exclusive.get(o.node_pool_id)
                if asked is None:
                    lvl = level(intensity * p.free_total, p.free_total)
                else:
                    known = p.narrow
                    if known is not None and known[0] == p.tick and known[1] is asked:
                        room = known[2]
                    else:
                        room = self._room_for(o.node_pool_id, narrow_shape(asked))
                        p.narrow = (p.tick, asked, room)
                    lvl = level(asked[0] + intensity * room, room)
                # above the prior, the nodes chosen may still take nothing the narrower jobs could use: known once
                # they are chosen
                shape = (per_gpu(narrow_shape(asked)) if asked is not None and lvl > free_lvl and not request.shared
                         else None)
                if best is not None and not best[2][0] and (free_lvl if shape else lvl) > best[2][1]:
                    continue  # more wanted by narrower jobs than the best so far, which uses no suspect node
            if (best_fit and best is not None and not best[2][0] and lvl == best[2][1] and shape is None
                    and not request.share_nodes
                    and not request.shared and not p.any_mixed and not best[3]):
                # Each node it would get has at least the fewest free GPUs at or above the job's: when even that
                # leaves more GPUs than the best so far, which uses no suspect node, its score is worse (suspect
                # nodes used, then GPUs left, come first).
                buckets = p.buckets
                k = g
                while k < len(buckets) and not buckets[k]:
                    k += 1
                if (k - g) * n > best[2][2]:
                    continue
            if kept and not p.any_mixed:  # ``whole_scored`` needs a mixed node
                known = p.fits.get(rkey)
                if known is not None and known[0] == p.tick:
                    _, nodes, left, sick = known
                else:
                    nodes = self.fit(o.node_pool_id, request)
                    left = None if nodes is None else self.leftover(o.node_pool_id, nodes, request)
                    sick = len(p.suspect.intersection(nodes)) if p.suspect and nodes is not None else 0
                    p.fits[rkey] = (p.tick, nodes, left, sick)
                if nodes is None:
                    continue
                lv = free_lvl if shape and self._takes_no_narrow_room(p, nodes, shape) else lvl
                score = (sick, lv, *left, p.free_total)
                if best is None or score < best[2]:
                    best = (o, nodes, score, False)
                continue
            nodes = self.fit(o.node_pool_id, request)
            if nodes is None:
                continue
            if shape and self._takes_no_narrow_room(p, nodes, shape):
                lvl = free_lvl
            if self.policy == "first-fit":
                return o, nodes
            left = self.leftover(o.node_pool_id, nodes, request)
            sick = len(p.suspect.intersection(nodes)) if p.suspect else 0
            if self.policy == "spread":
                score = (sick, 0, -left[0], -p.free_total)
            elif self.policy == "fgd" and not request.shared and not p.any_mixed:
                # whole GPUs on nodes that do not share: best fit's GPUs left first, then FGD's growth (ADR 0043)
                score = (sick, lvl, math.floor(sum(self.fragment_growth(o.node_pool_id, i, request) for i in nodes)
                                               / FIT_GROWTH_GPUS + 0.5), *left, p.free_total)
            elif (self.policy == "fgd" or self.whole_scored(p)) and not request.shared:
                if p.any_mixed and len(nodes) == 1:  # ties by the node's free milli-GPUs left, as ``_by_fragment``
                    left = (_free_milli(p, nodes[0]) - request.gpus_per_node * MILLI_PER_GPU, *left[1:])
                score = (sick, lvl, sum(self.fragment_growth(o.node_pool_id, i, request) for i in nodes), *left,
                         p.free_total)
            elif request.shared and self.share_scored(request):
                found = self._share_choice(p, nodes[0], request)
                # ties as ``_share_key``'s: room left on the GPU, then on the node's GPUs (milli-GPUs), CPU, memory
                score = (sick, lvl, found[0] if found else 0.0, left[0],
                         sum(p.shares[nodes[0]]) - request.share_milli, *left[1:], p.free_total)
            else:
                score = (sick, lvl, *left, p.free_total)
            if best is None or score < best[2]:
                best = (o, nodes, score, p.any_mixed)
        return (best[0], list(best[1])) if best else None

    @staticmethod
    def _takes_no_narrow_room(p: _PoolNodes, nodes: list[int], shape: tuple[float, float, float]) -> bool:
        """Whether every one of ``nodes`` (of pool ``p``) has, before the job comes, too little free for one pod of
        ``shape`` (the least a narrower job asks, ``per_gpu``; ``_pods_fit``'s rule): such a leftover (a 2-GPU node of
        16 cores with one GPU and 4 cores free, for jobs of 11 cores per GPU) is taken from no job that could run
        only there, whatever takes it."""
        free_g, free_c, free_m = p.free_g, p.free_c, p.free_m
        return not any(_pods_fit(free_g[i], free_c[i], free_m[i], shape) for i in set(nodes))

    def _exclusive(self, request: PlacementRequest, offers: list[PoolOffer]) -> tuple[dict, float]:
        """What ``place`` scores pools by (ADR 0043): per pool id, what jobs narrower than ``request`` asked
        (``scarcity.PoolDemand.exclusive``: pods, GPUs, CPU, memory), and their pods per pod the request's pool set
        has room for (the prior each pool gets in proportion to its room, ``scarcity.level``). Empty and 0 (every
        level equal: the policy's choice alone) unless a ``demand`` is given, the policy is best-fit or fgd, there are
        several offers and some job seen is narrower than the request."""
        demand = self.demand
        if (demand is None or len(offers) < 2 or self.policy not in ("best-fit", "fgd") or not demand.narrowed()):
            return {}, 0.0
        wanted = demand.wanted(request, offers[0].node_pool_id)
        exclusive = demand.exclusive(wanted)
        if not exclusive:
            return {}, 0.0
        return exclusive, self._narrow_intensity(wanted, exclusive)

    def _narrow_intensity(self, wanted: frozenset, exclusive: dict) -> float:
        """``PRIOR_WEIGHT`` x the narrower jobs' pods (``exclusive``) per pod of their shapes that ``wanted``'s pools
        hold now (``_room_for``, summed). The sum is kept per pool set and brought up to date from the pools changed
        since (``_LazyPools.changes``)."""
        known = self._shapes_of.get(wanted)
        changes = self.pools.changes
        if known is None or known[0] is not exclusive:
            pairs = {}
            for pid in wanted:
                if pid in exclusive:
                    shape = narrow_shape(exclusive[pid])
                    pairs[pid] = [shape, self._room_for(pid, shape)]
            known = [exclusive, pairs, sum(e[0] for e in exclusive.values()), sum(r for _, r in pairs.values()),
                     len(changes)]
            self._shapes_of[wanted] = known
        elif known[4] != len(changes):
            pairs, room = known[1], known[3]
            for pid in set(changes[known[4]:]):
                pair = pairs.get(pid)
                if pair is not None:
                    now = self._room_for(pid, pair[0])
                    room += now - pair[1]
                    pair[1] = now
            known[3], known[4] = room, len(changes)
        pods, room = known[2], known[3]
        return PRIOR_WEIGHT * pods / room if room else 0.0

    def narrow_room(self, pool_id: int, asked: tuple[float, float, float, float]) -> int:
        """How many pods of the narrower jobs' mean shape (``asked``: their decayed pods, GPUs, CPU millicores,
        memory MiB; ``narrow_shape``) the pool's open nodes hold now, node by node (``pods_on``'s rule: each
        resource of the node divided by the shape's, the least, floored), remembered until the pool changes."""
        return self._room_for(pool_id, narrow_shape(asked))

    def _room_for(self, pool_id: int, shape: tuple[float, float, float]) -> int:
        """``narrow_room`` of a shape from ``narrow_shape``. A pool not laid out yet (``_LazyPools``: nothing booked
        there) is read from its offer without laying it out; a pool changed since the last answer recounts only
        the nodes changed since (its ``log``), when the log still holds them all."""
        key = (pool_id, shape)
        known = self._narrow_rooms.get(key)
        pools = self.pools
        if pool_id not in pools:  # untouched: its nodes as offered (``_PoolNodes``' free figures, tick 0)
            if known is None:
                fits = _offered_fits(pools.offer(pool_id), shape)
                known = self._narrow_rooms[key] = (0, sum(fits), fits)
            return known[1]
        p = pools[pool_id]
        if known is not None:
            tick, room, fits = known
            if tick == p.tick:
                return room
            changes = p.tick - tick
            if changes <= len(p.log):
                free_g, free_c, free_m, sched = p.free_g, p.free_c, p.free_m, p.sched
                for i in set(p.log[-changes:]):
                    fit = _pods_fit(free_g[i], free_c[i], free_m[i], shape) if sched[i] else 0
                    room += fit - fits[i]
                    fits[i] = fit
                self._narrow_rooms[key] = (p.tick, room, fits)
                return room
        if p.tick == 0:  # laid out, nothing changed since: its nodes as offered (kept with the offer)
            fits = _offered_fits(p.offer, shape)
        else:
            fits = _pods_fits(zip(p.free_g, p.free_c, p.free_m, p.sched, strict=True), shape)
        room = sum(fits)
        self._narrow_rooms[key] = (p.tick, room, fits)
        return room

    def _level(self, p: _PoolNodes, asked, intensity: float) -> int:
        """``scarcity.level`` of pool ``p`` for the narrower jobs' ``asked`` there (None: none) and the prior
        ``intensity`` (their pods per pod of room over the request's pool set)."""
        if asked is None:
            room = p.free_total  # no narrower pod seen here: the prior alone, per free GPU
            return level(intensity * room, room)
        room = self._room_for(p.offer.node_pool_id, narrow_shape(asked))
        return level(asked[0] + intensity * room, room)

    def place_gang(self, roles, offers: list[PoolOffer]):
        """The pool and each role's nodes for a gang of several pod shapes (``roles``: ``(name, PlacementRequest)``
        pairs, a multi-role job's) among ``offers`` (in ``price_order``, each matching every role): the first pool
        where every role fits at once, each role's pods on distinct nodes (``fit``) after the roles placed before it
        took theirs (roles may share a node). The roles are placed hardest first (most pods, then most GPUs, CPU and
        memory per pod: a role of several distinct nodes is the one a greedy order strands), and answered in their
        own order. Returns ``((offer, ((name, node indexes), ...)), None)``, or ``(None, the
        name of the role that fitted on no pool)``, the first role that failed on the cheapest pool. Nothing is
        booked: the tentative takes are given back, and each pool's remembered failures are as before."""
        first_failed = None
        order = sorted(roles, key=lambda r: (-r[1].nodes, -r[1].gpus_per_node, -r[1].cpu_milli, -r[1].memory_mib))
        rank = {name: i for i, (name, _) in enumerate(roles)}
        for o in offers:
            p = self.pools[o.node_pool_id]
            failed, taken, found = list(p.failed), [], []
            for name, request in order:
                nodes = self.fit(o.node_pool_id, request)
                if nodes is None:
                    first_failed = first_failed or name
                    break
                self.take(o.node_pool_id, nodes, request)
                taken.append((nodes, request))
                found.append((name, tuple(nodes)))
            for nodes, request in taken:
                for i in nodes:
                    self._whole(p, i, request.gpus_per_node, request.cpu_milli, request.memory_mib, +1)
            p.failed = failed
            if len(found) == len(roles):
                return (o, tuple(sorted(found, key=lambda f: rank[f[0]]))), None
        return None, first_failed or roles[0][0]

    def take(self, pool_id: int, nodes: list[int], request: PlacementRequest, gpu: int | None = None) -> None:
        """Book one node of ``request`` on each of ``nodes`` (indexes from ``fit``); a share on GPU ``gpu`` of its
        node when given (``Admission.gpu_index``), else on the one ``share_gpu`` chooses."""
        p = self.pools[pool_id]
        if request.shared:
            for i in nodes:
                self._take_share(p, i, request, -1, gpu)
            return
        for i in nodes:
            self._whole(p, i, request.gpus_per_node, request.cpu_milli, request.memory_mib, -1)

    def release(self, pool_id: int, names: tuple[str, ...], gpus: int, gpus_per_node: int, cpu_milli: int,
                memory_mib: int, share_milli: int = 0, mig_profile: str = "", gpu: int | None = None) -> list[int]:
        """Give back a running job's resources: per node of ``names`` its GPUs, CPU (millicores) and memory (MiB);
        a job without node names (admitted before nodes were recorded) gives its ``gpus`` back to the fullest nodes.
        A job on part of one GPU (``share_milli`` or ``mig_profile``) gives back its share or MIG device instead of
        GPUs: on GPU ``gpu`` of its node when given (its admission's ``gpu_index``), else on the GPU with the least
        free share that has it booked. On a node giving whole GPUs and shares, whole GPUs given back are the
        lowest-numbered held whole (which whole GPU a pod holds is the device plugin's choice, not recorded).
        Returns the node indexes changed (``take``-able again with the same amounts)."""
        p = self.pools.get(pool_id)
        if p is None:
            return []
        p.failed = []
        changed = []
        if share_milli or mig_profile:
            request = PlacementRequest(1, 1, cpu_milli=cpu_milli, memory_mib=memory_mib, share_milli=share_milli,
                                       mig_profile=mig_profile)
            for name in names:
                i = p.index.get(name)
                if i is not None:
                    self._take_share(p, i, request, +1, gpu)
                    changed.append(i)
            return changed
        if names:
            for name in names:
                i = p.index.get(name)
                if i is not None:
                    self._whole(p, i, gpus_per_node, cpu_milli, memory_mib, +1)
                    changed.append(i)
            return changed
        left = gpus
        for i in range(len(p.names)):
            give = min(left, p.gpus[i] - p.free_g[i])
            if give > 0:
                p.move(i, give, 0, 0)
                changed.append(i)
                left -= give
        return changed

    def names(self, pool_id: int, nodes: list[int]) -> tuple[str, ...]:
        """The node names of indexes ``nodes`` of the pool."""
        p = self.pools[pool_id]
        return tuple(p.names[i] for i in nodes)
