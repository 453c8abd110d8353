"""Constraint-aware placement (ADR 0043): how much of each node pool's room is wanted by jobs that can run only there.

A job's placement rules (providers, regions, clusters), its spot rule, its accelerator alternatives and whether it
asks GPUs at all give the set of node pools it could ever be allowed on (its *pool set*). Whether the level is on at
all is decided by those rules alone (``narrowed``: a fleet whose jobs have no rules keeps every decision best fit
makes); once it is on, what jobs ask is counted against the pools that could ever hold them (their *sized pool
set*: the pool set less the pools whose nodes are too small, ``placement.matches``), so a task of 120 cores that only
one model's nodes can hold counts as narrow there as one held to that model by a rule. Jobs whose (sized) pool set
holds a pool but not every pool another job could use are narrower than that job there: a flexible job placed on
that pool takes room the narrow ones cannot find elsewhere. ``PoolDemand`` keeps decayed counts of the
pods, GPUs, CPU and memory asked per pool set (the waiting jobs and every submission seen, as
``fragmentation.ShapeHistory`` keeps task shapes), and ``level`` scores a pool for one request by the narrower
jobs' pods over the pods of their mean shape the pool still holds (``nodebook.NodeBook.narrow_room``).
``nodebook.NodeBook.place`` compares the level before best fit (and before FGD's growth), between pools of one price
only: the price order is the user's, and where no pool set is narrower than another every level is equal and the
choice is the policy's, unchanged.

Source: the rule is the platform's own, a judgement measured on the trace replay's constrained fill
(``benchmarks/trace_replay.py``); its demand model is FGD's (Weng et al., USENIX ATC 2023): an expectation over
the workload seen, weighted by popularity, rather than the job in hand alone.
Pure data and arithmetic, no database, as the rest of the core.
"""

from __future__ import annotations

import math

from core.gpus import MILLI_PER_GPU

from .fragmentation import FORGET_BELOW, RESCALE_HALF_LIVES, SHAPE_HALF_LIFE_S
from .placement import PoolOffer, allowed, kept_for, matching_offers

#: Levels per doubling of the ratio of narrower demand to room (``level``): pools whose ratios are within a factor
#: of 2 ** (1/4) (19 %) share a level and best fit decides between them (so equally contended pools keep best fit's
#: packing). A judgement checked on the trace replay's constrained fill, seed 0: 1 and 2 gave 9 and 2 points less
#: ``StrictFIFO`` allocation, 8 the same and 0.2 point less ``BestEffortFIFO`` at 130 % demand.
LEVELS_PER_DOUBLING = 4
#: The weight of the prior in ``level``: 1 counts a pool as asked, before anything is seen of it, at the request's
#: pool set's mean (narrow pods per pod of room). A judgement, as ``LEVELS_PER_DOUBLING``.
PRIOR_WEIGHT = 1.0


class PoolDemand:
    """Decayed pods, GPUs, CPU millicores and memory MiB asked per pool set (frozenset of node pool ids), each count
    halving every ``half_life_s`` seconds (a day, as the task shapes of ``fragmentation.ShapeHistory``). ``pools``:
    accelerator id -> its offers (the snapshot's); ``queue``: the waiting jobs (``types.QueuedJob``), counted at
    their submission times when the counts are first read; ``observe`` counts one job at its submission time.
    ``version`` counts the observations that changed a count.

    Counts are kept scaled to a reference time (a count seen at ``t`` weighs ``2 ** ((t - ref) / half_life_s)``),
    as ``ShapeHistory`` does, so an observation costs one dictionary update."""

    __slots__ = ("pools", "half_life_s", "counts", "sized", "ref", "version", "_sets", "_sized_sets", "_exclusive",
                 "_narrow_version", "_narrow", "_accelerator_of", "_queue")

    def __init__(self, pools: dict[int, list[PoolOffer]], queue=(), half_life_s: float = SHAPE_HALF_LIFE_S):
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self.pools = pools
        self._accelerator_of: dict[int, int] | None = None  # built when first read (``accelerator_of``)
        self.half_life_s = half_life_s
        self.counts: dict[frozenset, list[float]] = {}  # pool set -> decayed [pods, GPUs, CPU, memory]
        self.sized: dict[frozenset, list[float]] = {}  # sized pool set -> the same, what ``exclusive`` reads
        self._sized_sets: dict[tuple, frozenset] = {}
        self.ref: float | None = None
        self.version = 0
        self._sets: dict[tuple, frozenset] = {}
        # (pool set of a request) -> (version, {pool id: exclusive demand})
        self._exclusive: dict[frozenset, tuple[int, dict]] = {}
        self._narrow_version = -1
        self._narrow = False
        # the waiting jobs, counted at their submission when first needed (``_load``)
        self._queue = list(queue)

    @property
    def accelerator_of(self) -> dict[int, int]:
        """Node pool id -> the accelerator whose offers list it (the first, when several do); built when first read,
        so a pass that compares no pools by their demand never walks the fleet's pools."""
        found = self._accelerator_of
        if found is None:
            # the first accelerator listing a pool wins: the last written, walking them backwards
            found = self._accelerator_of = {o.node_pool_id: acc for acc, offers in reversed(self.pools.items())
                                            for o in offers[::-1]}
        return found

    def pool_set(self, job) -> frozenset:
        """The node pools ``job`` (a ``QueuedJob``) could ever be allowed on, over every accelerator it accepts: pools
        its placement and spot rules allow (``placement.allowed``), with GPUs when it asks GPUs; sizes aside."""
        key = (job.accelerator_ids, job.preemptible, job.providers, job.regions, job.clusters, job.cpu_only)
        found = self._sets.get(key)
        if found is None:
            request, cpu_only = job.placement(), job.cpu_only

            def ruled(offers):
                return tuple(o for o in offers if allowed(request, o) and (cpu_only or o.gpus_per_node > 0))

            found = self._sets[key] = frozenset(o.node_pool_id for acc in job.accelerator_ids
                                                for o in kept_for(self.pools.get(acc, ()), ("pool set", *key[1:]),
                                                                  ruled))
        return found

    def sized_pool_set(self, job) -> frozenset:
        """``pool_set`` less the pools none of whose schedulable nodes could hold one pod of ``job``, all free
        (``placement.matches``); a multi-role job's is its pool set."""
        key = (job.accelerator_ids, job.preemptible, job.providers, job.regions, job.clusters, job.cpu_only,
               job.nodes, job.gpus_per_node, job.cpu_milli, job.memory_mib, job.share_nodes, job.share_milli,
               job.mig_profile, bool(job.roles))
        found = self._sized_sets.get(key)
        if found is None:
            rules = self.pool_set(job)
            if job.roles:
                found = rules
            else:
                request = job.placement()
                found = frozenset(o.node_pool_id for acc in job.accelerator_ids
                                  for o in matching_offers(request, self.pools.get(acc, ()))
                                  if o.node_pool_id in rules)
            self._sized_sets[key] = found
        return found

    def _load(self) -> None:
        """Count the waiting jobs given at construction (once), oldest first, each at its submission."""
        queue, self._queue = self._queue, None
        self.observe_all((job, job.submitted) for job in sorted(queue, key=_submitted))

    def observe(self, job, at: float) -> None:
        """Count ``job``'s GPUs (a share of one GPU as its fraction; a CPU-only job counts none) against its pool
        set, seen at ``at`` (seconds, any monotonic epoch)."""
        self.observe_all(((job, at),))

    def observe_all(self, seen) -> None:
        """``observe`` each of ``seen`` (``(job, seen at)`` pairs), in their order: one loop, so a full pass's count
        of every waiting job costs a few dictionary looks per job."""
        if self._queue is not None:
            self._load()
        half_life_s, counts, sized, ref, changed = self.half_life_s, self.counts, self.sized, self.ref, 0
        # per class of job (accelerators and ``QueuedJob.shape``: everything the two keys and the amounts read), its
        # two counts and amounts, or None when it asks no GPUs; dropped when the counts are rescaled
        classes: dict[tuple, tuple | None] = {}
        pow_, rescale = math.pow, RESCALE_HALF_LIVES
        for job, at in seen:
            ckey = (job.accelerator_id, job.alternatives, job.shape)
            found = classes.get(ckey, classes)
            if found is classes:
                found = classes[ckey] = self._class_of(job, counts, sized)
            if found is None:
                continue
            if ref is None:
                ref = at
            age = (at - ref) / half_life_s
            if age > rescale:  # counts rescaled to ``at``, the faded ones forgotten
                fade = pow_(0.5, age)
                counts = {k: [x * fade for x in v] for k, v in counts.items() if v[0] * fade >= FORGET_BELOW}
                sized = {k: [x * fade for x in v] for k, v in sized.items() if v[0] * fade >= FORGET_BELOW}
                ref, age = at, 0.0
                classes.clear()
                found = classes[ckey] = self._class_of(job, counts, sized)
            weight = pow_(2.0, age)
            count, sized_count, pods, gpus, cpu, memory = found
            for c in (count, sized_count):
                c[0] += pods * weight
                c[1] += gpus * weight
                c[2] += cpu * weight
                c[3] += memory * weight
            changed += 1
        self.counts, self.sized, self.ref = counts, sized, ref
        self.version += changed

    def _class_of(self, job, counts: dict, sized: dict) -> tuple | None:
        """What ``observe_all`` adds to for ``job``: its pool set's count in ``counts`` and its sized pool set's in
        ``sized`` (each made at 0 when missing), and its pods, GPUs (a share as its fraction), CPU millicores and
        memory MiB; None when it asks no GPUs (it counts nowhere)."""
        pods = job.nodes
        if job.roles:
            gpus = sum(r.nodes * r.gpus_per_node for r in job.roles)
            cpu, memory = job.total_cpu_milli, job.total_memory_mib
        else:
            gpus = job.share_milli / MILLI_PER_GPU if job.share_milli else job.total_gpus
            cpu, memory = pods * job.cpu_milli, pods * job.memory_mib
        if gpus <= 0:
            return None
        out = []
        for table, k in ((counts, self.pool_set(job)), (sized, self.sized_pool_set(job))):
            count = table.get(k)
            if count is None:
                count = table[k] = [0.0, 0.0, 0.0, 0.0]
            out.append(count)
        return (*out, pods, gpus, cpu, memory)

    def narrowed(self) -> bool:
        """Whether two pool sets (by rules, sizes aside) were seen of which one is not a superset of the other: only
        then can a level be above 0."""
        if self._queue is not None:
            self._load()
        if self._narrow_version != self.version:
            sets = list(self.counts)
            self._narrow = len(sets) > 1 and any(not a <= b for a in sets for b in sets if a is not b)
            self._narrow_version = self.version
        return self._narrow

    def exclusive(self, wanted: frozenset) -> dict[int, tuple[float, float, float, float]]:
        """Per pool id of ``wanted`` (a request's sized pool set, ``wanted``): what jobs whose sized pool set holds
        the pool but not every pool of ``wanted`` (jobs that cannot go everywhere the request can) asked, decayed,
        as ``(pods, GPUs, CPU millicores, memory MiB)``; pools with none are left out."""
        if self._queue is not None:
            self._load()
        known = self._exclusive.get(wanted)
        if known is not None and known[0] == self.version:
            return known[1]
        sums: dict[int, list[float]] = {}
        for pools, count in self.sized.items():
            if wanted <= pools:
                continue
            for pid in pools & wanted:
                total = sums.get(pid)
                if total is None:
                    sums[pid] = list(count)
                else:
                    for k in range(4):
                        total[k] += count[k]
        out = {pid: tuple(v) for pid, v in sums.items()}
        self._exclusive[wanted] = (self.version, out)
        return out

    def wanted(self, request, pool_id: int) -> frozenset:
        """The sized pool set of a request (``placement.PlacementRequest``) on the accelerator of node pool
        ``pool_id``: that accelerator's pools its rules allow whose nodes could hold it (``placement.matches``),
        with GPUs when it asks GPUs (empty for a pool of no accelerator)."""
        acc = self.accelerator_of.get(pool_id)
        cpu_only = request.gpus_per_node == 0
        key = ("request", acc, request)
        found = self._sized_sets.get(key)
        if found is None:
            found = self._sized_sets[key] = frozenset(o.node_pool_id
                                                      for o in matching_offers(request, self.pools.get(acc, ()))
                                                      if cpu_only or o.gpus_per_node > 0)
        return found


def _submitted(job) -> float:
    """A job's submission time (the order ``PoolDemand`` counts waiting jobs in)."""
    return job.submitted


def level(wanted_gpus: float, free_gpus: float) -> int:
    """A pool's scarcity level for a request, lower placed on first: ``floor(LEVELS_PER_DOUBLING * log2(wanted_gpus /
    max(free_gpus, 1)))``, or the lowest level when nothing is wanted.

    ``wanted_gpus``: the GPUs narrower jobs asked of the pool (``PoolDemand.exclusive``) plus the pool's GPUs times
    their demand per GPU over the request's whole pool set, a prior so that a pool no narrow job was seen on yet is
    not taken as free of them (pools asked for in proportion to their size score by their free share alone).
    ``free_gpus``: the pool's GPUs times the share of it still free by its scarcest resource
    (``nodebook._PoolNodes.room_share``), so a pool whose CPU or memory is nearly taken counts as nearly full."""
    if wanted_gpus <= 0:
        return -(1 << 30)
    return math.floor(LEVELS_PER_DOUBLING * math.log2(wanted_gpus / max(free_gpus, 1.0)))
