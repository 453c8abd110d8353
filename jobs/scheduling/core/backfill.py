"""Backfill with reservations: a waiting job that cannot fit gets the nodes that free first, and the jobs behind it
run only where and while they cannot delay it.

Slurm's backfill scheduler (``sched/backfill``, slurm.conf ``SchedulerType``; "Scheduling Configuration Guide"):
jobs are planned in priority order; a job that cannot start now is given the earliest start the running jobs'
time limits allow, on nodes chosen then, and a lower-priority job starts now only when it does not delay that
start: it ends before the reserved start (its time limit) or it uses no node of the reservation. Here, node-exact
and deterministic, inside the pure pass (ADR 0044):

- which jobs get a reservation (``Backfill.wants``): a job that waits for capacity (not for quota, a budget or a
  fleet change) and that is its StrictFIFO team's first waiting job, or that has waited ``reserve_after_s`` or
  longer since its submission; at most ``max_reservations`` per scheduler; jobs of one shape per pool only (no
  multi-role job, no share of a GPU, no replicas sharing a node);
- when and where (``Backfill.reserve``): per pool the job could ever run on (price order), the nodes' free
  resources now plus, in order of their ends, what every live attempt and every admission of this scheduler gives
  back at ``admitted + max_runtime_seconds`` (an attempt past its limit: now); the first instant ``n`` distinct
  nodes each hold one pod is the pool's start; the earliest start wins (ties: price order), and its nodes are
  the ``n`` fitting ones with the least free then (best fit: GPUs, CPU, memory, index). Nodes of an earlier
  reservation are not planned again. A live attempt without recorded nodes or run time frees nothing in the plan;
- the hold (``mask``): the reserved nodes' free resources are taken from the node book, so no placement of the
  pass or of a later submission chooses them; a job whose own end (now + its max run time) is at or before a
  reservation's start may use what that reservation's nodes hold now (``window``), which the hold then keeps
  less of;
- the safety net (``conflict``): an admission that would end after a reservation's start on one of its nodes (a
  preempting one: its victims free the nodes it takes) is not made.

So a reserved job's nodes hold at its start what the plan says: nothing admitted after the reservation is still
on them then. Times are seconds on the snapshot's epoch (``Snapshot.now``).
"""

from __future__ import annotations

import bisect
import dataclasses

from .nodebook import NodeBook
from .placement import PlacementRequest, PoolOffer
from .types import QueuedJob, RunningJob

#: The most reservations one scheduler holds (Slurm's ``bf_max_job_test`` bounds the same search).
MAX_RESERVATIONS = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Reservation:
    """Nodes held for a waiting job: ``node_names`` of pool ``offer`` from ``start`` (seconds, the snapshot's epoch),
    when the work on them reaches its max run time at the latest; ``planned_at`` is the pass's ``now``."""

    job_id: int
    offer: PoolOffer
    node_names: tuple[str, ...]
    start: float
    planned_at: float

    def info(self) -> dict:
        """The queue explanation's ``reservation``: pool, nodes, the expected start (seconds on the snapshot's
        epoch, and seconds from the pass) and a sentence."""
        wait = max(0, round(self.start - self.planned_at))
        names = ", ".join(self.node_names[:8]) + (f" and {len(self.node_names) - 8} more"
                                                  if len(self.node_names) > 8 else "")
        return {"pool": self.offer.label, "node_pool_id": self.offer.node_pool_id, "nodes": list(self.node_names),
                "expected_start": self.start, "expected_start_in_seconds": wait,
                "message": (f"Node{'s' if len(self.node_names) > 1 else ''} {names} of {self.offer.label} "
                            f"{'are' if len(self.node_names) > 1 else 'is'} reserved for it; it expects to start "
                            f"within {wait} s, when the work there reaches its max run time at the latest. Jobs "
                            f"behind it run there only if they end before then.")}


def reservable(job: QueuedJob) -> bool:
    """Whether backfill plans for ``job``: one shape, whole GPUs (or CPU only), one pod per node."""
    return not (job.roles or job.share_milli or job.mig_profile or job.share_nodes)


class Backfill:
    """The reservations of one scheduler over ``book`` (``nodebook.NodeBook``) at ``now`` (None: backfill off).

    ``live``: every live attempt (``RunningJob`` with ``max_runtime_seconds``; their nodes free at ``admitted`` +
    that); ``reserve_after_s``: a job waiting that long (seconds since submission) gets a reservation whatever its
    team's strategy (None: StrictFIFO heads only); ``limit``: the most reservations held.
    """

    def __init__(self, book: NodeBook, now: float | None, live: list[RunningJob], reserve_after_s: float | None,
                 limit: int = MAX_RESERVATIONS):
        self.book, self.now, self.reserve_after_s, self.limit = book, now, reserve_after_s, limit
        self.reservations: dict[int, Reservation] = {}
        self._live = live
        self._ends: dict[int, list[tuple]] | None = None  # pool id -> sorted (end, node index, g, c, m, job id)
        self._pending: list[tuple[int, tuple]] = []  # admissions not yet in ``_ends``: (pool id, row)
        self.gone: set[int] = set()  # job ids whose plan entries no longer free anything (preempted)
        # (pool id, node index) -> [g, c, m] taken from the book for the reservation holding the node, and the
        # reservation's job id
        self.held: dict[tuple[int, int], list[int]] = {}
        self.holder: dict[tuple[int, int], int] = {}
        self.latest = float("-inf")  # the latest start of a reservation held (``window``: nothing ends before)
        self.version = 0  # bumped whenever the holds change (``window``'s remembered misses)
        self.misses: dict[tuple, int] = {}  # a ``window`` key -> the version it found nothing at

    @property
    def on(self) -> bool:
        """Whether backfill is on (the snapshot has a ``now``)."""
        return self.now is not None

    @property
    def open(self) -> bool:
        """Whether another reservation may be made."""
        return len(self.reservations) < self.limit

    def wants(self, job: QueuedJob, strict_head: bool) -> bool:
        """Whether ``job``, waiting for capacity, should get a reservation now (see the module docstring)."""
        if self.now is None or len(self.reservations) >= self.limit or job.job_id in self.reservations:
            return False
        if not reservable(job):
            return False
        return strict_head or (self.reserve_after_s is not None and self.now - job.submitted >= self.reserve_after_s)

    # --- the plan ---------------------------------------------------------------------------------------------

    def _plan(self) -> dict[int, list[tuple]]:
        ends = self._ends
        if ends is None:
            ends = self._ends = {}
            for r in self._live:
                if not r.node_names or not r.max_runtime_seconds or r.share_milli or r.mig_profile:
                    continue  # frees nothing the plan can count on
                p = self.book.pools.get(r.node_pool_id)
                if p is None:
                    continue
                end = max(r.admitted + r.max_runtime_seconds, self.now)
                rows = ends.setdefault(r.node_pool_id, [])
                for name in r.node_names:
                    i = p.index.get(name)
                    if i is not None:
                        rows.append((end, i, r.gpus_per_node, r.cpu_milli, r.memory_mib, r.job_id))
            for rows in ends.values():
                rows.sort()
        if self._pending:
            for pid, row in self._pending:
                bisect.insort(ends.setdefault(pid, []), row)
            self._pending.clear()
        return ends

    def admitted(self, pool_id: int, nodes: list[int], request: PlacementRequest, job_id: int, end: float) -> None:
        """An admission of this scheduler on ``nodes`` of ``pool_id``: its resources free at ``end`` in the plan."""
        if self.now is None or request.shared or len(self.reservations) >= self.limit:
            return  # no later plan reads it
        for i in nodes:
            self._pending.append((pool_id, (end, i, request.gpus_per_node, request.cpu_milli, request.memory_mib,
                                            job_id)))

    def reserve(self, job: QueuedJob, pools: list[PoolOffer]) -> Reservation | None:
        """Plan ``job`` on ``pools`` (the pools that could ever hold it, in price order) and hold the nodes; None
        when no pool's plan ever fits it (its nodes wait on attempts without a known end)."""
        request = job.placement()
        n, g, c, m = request.nodes, request.gpus_per_node, request.cpu_milli, request.memory_mib
        plan, gone, book, held, now = self._plan(), self.gone, self.book, self.held, self.now
        best = None
        for o in pools:
            pid = o.node_pool_id
            p = book.pools[pid]
            free = {i: [p.free_g[i], p.free_c[i], p.free_m[i]] for i in range(len(p.names))
                    if p.sched[i] and (pid, i) not in held}
            fitting = {i for i, f in free.items() if f[0] >= g and f[1] >= c and f[2] >= m}
            start = now if len(fitting) >= n else None
            if start is None:
                for end, i, dg, dc, dm, jid in plan.get(pid, ()):
                    if best is not None and end >= best[0]:
                        break
                    f = free.get(i)
                    if f is None or jid in gone:
                        continue
                    f[0] += dg
                    f[1] += dc
                    f[2] += dm
                    if i not in fitting and f[0] >= g and f[1] >= c and f[2] >= m:
                        fitting.add(i)
                        if len(fitting) >= n:
                            start = end
                            break
            if start is not None and (best is None or start < best[0]):
                chosen = sorted(fitting, key=lambda i: (*free[i], i))[:n]
                best = (start, o, sorted(chosen))
        if best is None:
            return None
        start, offer, nodes = best
        reservation = Reservation(job.job_id, offer, book.names(offer.node_pool_id, nodes), start, now)
        self.reservations[job.job_id] = reservation
        self.latest = max(self.latest, start)
        p = book.pools[offer.node_pool_id]
        for i in nodes:  # the hold: what the nodes have free now is no placement's
            have = [p.free_g[i], p.free_c[i], p.free_m[i]]
            book.take(offer.node_pool_id, [i], PlacementRequest(1, *have[:1], cpu_milli=have[1], memory_mib=have[2]))
            held[(offer.node_pool_id, i)] = have
            self.holder[(offer.node_pool_id, i)] = job.job_id
        self.version += 1
        return reservation

    # --- what may run on held nodes ---------------------------------------------------------------------------

    def window(self, job: QueuedJob, pools: list[PoolOffer], key: tuple) -> tuple[PoolOffer, list[int]] | None:
        """Held nodes ``job`` may run on now, because it ends (now + its max run time) at or before the start of the
        reservation holding each: ``(offer, node indexes)`` on one of ``pools`` (best fit on what the holds keep),
        or None. ``key``: what the answer depends on besides the holds (the job's accelerator, shape, max run
        time and ``pools``); a miss is remembered by it until the holds change."""
        if not self.held or not reservable(job) or self.misses.get(key) == self.version:
            return None
        request = job.placement()
        n, g, c, m = request.nodes, request.gpus_per_node, request.cpu_milli, request.memory_mib
        end = self.now + job.max_runtime_seconds
        reservations = self.reservations
        by_pool: dict[int, list[tuple]] = {}
        for (pid, i), (hg, hc, hm) in self.held.items():
            if hg >= g and hc >= c and hm >= m and end <= reservations[self.holder[(pid, i)]].start:
                by_pool.setdefault(pid, []).append((hg, hc, hm, i))
        for o in pools:
            rows = by_pool.get(o.node_pool_id)
            if rows and len(rows) >= n:
                return o, sorted(i for *_, i in sorted(rows)[:n])
        self.misses[key] = self.version
        return None

    def unhold(self, pool_id: int, nodes: list[int]) -> list[list[int]]:
        """Give the book back what the holds keep on ``nodes`` (before a ``window`` admission books them); returns
        the amounts, for ``rehold``."""
        p = self.book.pools[pool_id]
        out = []
        for i in nodes:
            hg, hc, hm = have = self.held[(pool_id, i)]
            self.book.release(pool_id, (p.names[i],), hg, hg, hc, hm)
            out.append(have)
        return out

    def rehold(self, pool_id: int, nodes: list[int]) -> None:
        """Hold again what ``nodes`` have free once a ``window`` admission booked them."""
        p = self.book.pools[pool_id]
        for i in nodes:
            have = [p.free_g[i], p.free_c[i], p.free_m[i]]
            self.book.take(pool_id, [i], PlacementRequest(1, have[0], cpu_milli=have[1], memory_mib=have[2]))
            self.held[(pool_id, i)] = have
        self.version += 1

    def conflict(self, pool_id: int, node_names, end: float) -> Reservation | None:
        """The reservation an admission on ``node_names`` of ``pool_id`` ending at ``end`` would delay, or None."""
        if not self.held:
            return None
        index = self.book.pools[pool_id].index
        for name in node_names:
            holder = self.holder.get((pool_id, index.get(name)))
            if holder is not None and end > self.reservations[holder].start:
                return self.reservations[holder]
        return None
