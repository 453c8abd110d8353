"""Room in the fleet for one scheduler: which pools could ever hold a job, where it fits now, and why not.

Kueue's flavor assignment, node-exact: the pools of an accelerator (resource flavors) filtered by a job's
placement rules and spot tolerance, in price order (``placement.price_order``), then the packing policy's
choice of nodes (``nodebook.NodeBook``). A job that fits nowhere gets a capacity verdict (``rules.no_room``)
with the nodes' numbers; within a run of the decision loop those numbers are the ones after the run
(``start_run`` / ``end_run``), so every job of the run that waits for the same pools is told the same thing.

What it learns is kept in the scheduler's memo (``memo``): facts of the snapshot, and verdicts stamped with
the generations of the cohort book (``cohort.CohortBook``: ``taken`` and ``released`` by accelerator).
"""

from __future__ import annotations

from .cohort import CohortBook
from .nodebook import NodeBook
from .placement import PoolOffer, allowed, capable_nodes, matches, matching_in_price_order, price_order
from .rules import job_estimate, never_placeable, no_price, no_room, unhealthy_nodes
from .types import QueuedJob, Verdict

#: The message of a no-room verdict until the end of the run of the loop that made it (``end_run``).
DEFERRED = "(numbers as after this pass)"


class Room:
    """The fleet's room for ``job``s: ``pools`` and ``unpriced`` (accelerator id -> offers, the snapshot's), the
    ``book`` of nodes' free resources, the ``cohorts``' generations and the ``memo`` (``memo.DecisionMemo``)."""

    def __init__(self, pools: dict[int, list[PoolOffer]], unpriced: dict[int, list[PoolOffer]], book: NodeBook,
                 cohorts: CohortBook, memo):
        self.pools, self.unpriced, self.book, self.cohorts = pools, unpriced, book, cohorts
        self.memo = memo
        self._released, self._taken = cohorts.released, cohorts.taken  # the cohort book never replaces them
        self._matching = memo.matching
        self._no_room, self._failed, self._short = memo.no_room, memo.failed, memo.short
        self._unhealthy, self._sick_pools, self._estimates = memo.unhealthy, memo.sick_pools, memo.estimates
        # Within a run of the loop: the no-room verdicts to fill in at its end; else None.
        self.deferred: list[tuple] | None = None
        self.deferred_waits: list[tuple] = []  # keys of ``memo.waits`` given such a verdict in this run

    def matching_entry(self, job: QueuedJob, acc: int) -> tuple[list[PoolOffer], Verdict | None, tuple[int, ...]]:
        """(pools that could hold ``job`` once their work ends, in price order; None; their ids), or ([], the
        fleet-change verdict that says why none matches, ())."""
        key = (acc, job.shape)
        found = self._matching.get(key)
        if found is None and job.roles:
            found = self._gang_matching(job, acc)
            self._matching[key] = found
        if found is None:
            request = job.placement()
            offers = self.pools.get(acc, ())
            pools = list(matching_in_price_order(request, offers))  # kept with the offers
            found = (pools, None if pools else never_placeable(job, *self.fleet_reason(job, request, offers)),
                     tuple(o.node_pool_id for o in pools))
            self._matching[key] = found
        return found

    def _gang_matching(self, job: QueuedJob, acc: int):
        """``matching_entry`` of a multi-role job: the pools that could hold every one of its roles (each role's
        pods on nodes of its own; a pool is one cluster, so the roles share a cluster), in price order, among the
        pools whose cluster's runner starts multi-role jobs (``PoolOffer.multi_role``); with none, the fleet-change
        verdict names the first role no pool could hold, or says that no pool holds them all."""
        offers = [o for o in self.pools.get(acc, ()) if o.multi_role]
        if not offers:
            return [], never_placeable(job, "no cluster of the accelerator has a runner that starts multi-role jobs "
                                            "(the local runner does; the Kubernetes runner not yet)", "placement"), ()
        in_order = sorted(offers, key=price_order)
        requests = job.role_requests()
        pools = [o for o in in_order if all(matches(r, o) for _, r in requests)]
        if pools:
            return pools, None, tuple(o.node_pool_id for o in pools)
        for name, request in requests:
            if not any(matches(request, o) for o in in_order):
                single = job.role_job(name)
                why, short = self.fleet_reason(single, request, offers)
                verdict = never_placeable(job, f"role {name}: {why}", short)
                verdict.detail["role"] = name
                return [], verdict, ()
        verdict = never_placeable(job, "each role fits some pool, but no one pool (one cluster) holds every role",
                                  "nodes")
        return [], verdict, ()

    def place_gang(self, job: QueuedJob, pools: list[PoolOffer]):
        """``(offer, ((role, node indexes), ...))`` for a multi-role job among ``pools`` now (every role on the one
        pool: ``NodeBook.place_gang``), or ``(None, the role that fitted nowhere)``. Pools of clusters the job
        avoids are tried last (``place``)."""
        avoid = job.avoid_clusters
        if avoid:
            pools = [o for o in pools if o.cluster_id not in avoid] + [o for o in pools if o.cluster_id in avoid]
        return self.book.place_gang(job.role_requests(), pools)

    def gang_no_room(self, job: QueuedJob, acc: int, pools: list[PoolOffer], role: str) -> Verdict:
        """Why a multi-role job waits for capacity: the no-room verdict of its ``role`` that fitted nowhere (its
        pods alone, with the nodes' numbers now, after what this pass booked), named in the message and in the
        detail's ``role``. Nothing of it is held meanwhile: the job is admitted whole or not at all."""
        single = job.role_job(role)
        request = single.placement()
        book = self.book
        verdict = self._no_room_of(single, acc, pools, tuple(o.node_pool_id for o in pools))
        fits_alone = any(book.fit(o.node_pool_id, request) is not None for o in pools)
        message = (f"Role {role} cannot be placed with the job's other roles on one pool"
                   if fits_alone else f"Role {role}: {verdict.message}")
        if fits_alone:
            message += (": there is room for it alone, not with the roles before it. The job is admitted with all "
                        "its roles or not at all, and holds nothing meanwhile.")
        else:
            message += " The job is admitted with all its roles or not at all, and holds nothing meanwhile."
        return Verdict(False, "capacity", message, {**verdict.detail, "role": role,
                                                    "request_gpus": job.total_gpus})

    @staticmethod
    def why_none(job: QueuedJob, request, offers) -> str:
        """What keeps every pool from holding ``job``, in words with the numbers (for the fleet-change reason)."""
        return Room.fleet_reason(job, request, offers)[0]

    @staticmethod
    def fleet_reason(job: QueuedJob, request, offers) -> tuple[str, str]:
        """``(why_none's words, what is short)``: ``placement`` (no pool allowed), ``health`` (an unhealthy cluster
        or node among those that could hold it), ``cordon`` (large enough nodes cordoned or tainted) or ``nodes``
        (too few nodes large enough)."""
        allowed_pools = [o for o in offers if allowed(request, o)]
        if not allowed_pools:
            return "none of the accelerator's pools is allowed by its placement and spot rules", "placement"
        sick = sorted({o.cluster_name for o in allowed_pools if not o.healthy})
        whole = max((capable_nodes(request, o, schedulable_only=False) for o in allowed_pools), default=0)
        open_ = max((capable_nodes(request, o, schedulable_only=True) for o in allowed_pools if o.healthy), default=0)
        bad = unhealthy_nodes(request, allowed_pools)
        parts = []
        if sick:
            parts.append(f"cluster{'s' if len(sick) > 1 else ''} {', '.join(sick)} "
                         f"{'are' if len(sick) > 1 else 'is'} not healthy")
        if open_ < whole:
            kept_out = whole - open_
            are = "node is" if kept_out == 1 else "nodes are"
            parts.append(f"{kept_out} large enough {are} cordoned, tainted or unhealthy" if bad else
                         f"{kept_out} large enough {are} cordoned or tainted")
        if bad:
            parts.append(bad)
        if job.share_nodes:
            parts.append(f"the schedulable nodes of one healthy pool hold at most {open_} of its pods, "
                         f"{job.nodes} needed")
        else:
            parts.append(f"at most {open_} schedulable node{'' if open_ == 1 else 's'} of one healthy pool can hold a "
                         f"node of it, {job.nodes} needed")
        short = "health" if sick or bad else "cordon" if open_ < whole and whole >= job.nodes else "nodes"
        return "; ".join(parts), short

    def whole_fleet_pool(self, job: QueuedJob, acc: int) -> PoolOffer | None:
        """The cheapest priced pool of ``acc`` that ``job``'s placement and spot rules allow and whose nodes, healthy
        or not, cordoned or not, could hold it (``capable_nodes`` over all its nodes), or None: the price it would
        run at once the fleet takes it back, for an estimate while no pool matches now."""
        request = job.placement()
        whole = [o for o in self.pools.get(acc, ()) if allowed(request, o) and request.gpus_per_node <= o.gpus_per_node
                 and capable_nodes(request, o, schedulable_only=False) >= request.nodes]
        return min(whole, key=price_order, default=None)

    def no_price(self, job: QueuedJob, acc: int, fleet: Verdict) -> Verdict:
        """Why no pool matches ``job`` on ``acc``: some would but have no price (``rules.no_price``), else ``fleet``."""
        request = job.placement()
        unpriced = [o for o in self.unpriced.get(acc, ()) if matches(request, o)]
        return no_price(job, unpriced) if unpriced else fleet

    def place(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...]):
        """``(offer, node indexes)`` for ``job`` among ``pools`` (ids ``pids``) now, or None.

        A job with ``avoid_clusters`` (a spot reclaim there within ``SPOT_RECLAIM_AVOID_SECONDS``) is placed on the
        other clusters' pools when one has room now, cheapest first; only when none has does it go back to an
        avoided cluster (SkyPilot's eager failover: the preempted region is blocked for the relaunch, then
        retried with the rest when nothing else launches). Class of failure: "recovery returns to the failure it
        recovers from" (ADR 0018).
        """
        avoid = job.avoid_clusters
        if avoid:
            first = [o for o in pools if o.cluster_id not in avoid]
            if len(first) < len(pools):
                last = [o for o in pools if o.cluster_id in avoid]
                found = self._place(job, acc, first, tuple(o.node_pool_id for o in first)) if first else None
                if found is None:
                    found = self._place(job, acc, last, tuple(o.node_pool_id for o in last))
                return found
        return self._place(job, acc, pools, pids)

    def _place(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...]):
        """``place`` among ``pools`` in their order, whatever the job avoids.

        Shapes known not to fit are remembered until a release on ``acc`` (bookings only take room, so a shape
        at least as large in every resource does not fit either); so are the pools in front with fewer free GPUs
        than the job asks, which ``NodeBook.place`` would pass over.
        """
        # a share's misfits say nothing of a whole job's or another share's (nor the reverse): kept apart
        key = (acc, job.preemptible, job.share_nodes, pids, job.share_milli, job.mig_profile)
        n, g, c, m = shape = (job.nodes, job.gpus_per_node, job.cpu_milli, job.memory_mib)
        released = self._released.get(acc, 0)
        failed = self._failed.get(key)
        if failed is not None and failed[0] == released:
            for fn, fg, fc, fm in failed[1]:
                if n >= fn and g >= fg and c >= fc and m >= fm:
                    return None
        need = 0 if job.share_milli or job.mig_profile else job.total_gpus  # a share needs no whole GPU free
        found = self.book.place(job.placement(), self._with_room(pools, pids, need, released) if need else pools)
        if found is None:
            least = failed[1] if failed is not None and failed[0] == released else []
            # the least shapes known not to fit: one that covers another replaces it
            self._failed[key] = (released, [s for s in least if not (s[0] >= n and s[1] >= g and s[2] >= c
                                                                     and s[3] >= m)] + [shape])
        return found

    def _with_room(self, pools: list[PoolOffer], pids: tuple[int, ...], need: int, released: int) -> list[PoolOffer]:
        """``pools`` (ids ``pids``) less those laid out with fewer free GPUs on their open nodes than ``need``, which
        ``NodeBook.place`` passes over: the same choice, without walking the full pools at every placement.

        Kept per ``(pids, need)`` until a release on the accelerator (``released``; bookings only take GPUs away,
        so a pool left out stays short) and brought up to date from the pools changed since
        (``nodebook._LazyPools.changes``): ``(released, changes read, pools kept, their ids)``. A pool not laid
        out yet is kept (its nodes are not read for this)."""
        book = self.book.pools
        changes = book.changes
        known = self._short.get((pids, need))
        if known is not None and known[0] == released:
            _, seen, live, members = known
            if seen == len(changes):
                return live
            if len(changes) - seen <= len(live):
                gone = {pid for pid in changes[seen:] if pid in members and book[pid].free_total < need}
            else:
                gone = {pid for pid in members if pid in book and book[pid].free_total < need}
            if gone:
                live = [o for o in live if o.node_pool_id not in gone]
                members = members - gone
        else:
            live = [o for o in pools if o.node_pool_id not in book or book[o.node_pool_id].free_total >= need]
            members = {o.node_pool_id for o in live}
        self._short[(pids, need)] = (released, len(changes), live, members)
        return live

    def no_room_verdict(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...]) -> Verdict:
        """``rules.no_room`` for ``job`` on ``pools`` (ids ``pids``) with the nodes' numbers now, remembered until
        the next booking or release on ``acc``. Within a run of the loop the numbers are those after the run:
        the message and detail are filled in by ``end_run``."""
        key = ((acc, job.shape), pids)
        cached = self._no_room.get(key)
        taken = self._taken.get(acc, 0)
        if cached is not None and cached[0] == taken:
            return cached[1]
        deferred = self.deferred
        if deferred is not None:
            if cached is not None and cached[0] is None:
                return cached[1]  # already to be filled in at the end of this run
            detail: dict = {}
            verdict = Verdict(False, "capacity", DEFERRED, detail)
            deferred.append((detail, key, job, acc, pools, pids))
            self._no_room[key] = (None, verdict)
            return verdict
        return self._no_room_now(job, acc, pools, pids, key, taken)

    def _no_room_now(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...], key: tuple,
                     taken: int) -> Verdict:
        verdict = self._no_room_of(job, acc, pools, pids)
        self._no_room[key] = (taken, verdict)
        return verdict

    def _no_room_of(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...]) -> Verdict:
        """``rules.no_room`` for ``job`` on ``pools`` (ids ``pids``) with the nodes' numbers now."""
        book = self.book
        request = job.placement()
        shown = pools[:3]
        nodes = book.pools
        verdict = no_room(job, pools, {pid: nodes[pid].free_total for pid in pids},
                          {o.node_pool_id: book.most_free(o.node_pool_id) for o in shown},
                          {o.node_pool_id: book.nodes_with_room(o.node_pool_id, request) for o in shown},
                          self.unhealthy_sentence(job, acc, request),
                          {o.node_pool_id: book.room_by_resource(o.node_pool_id, request) for o in shown})
        return verdict

    def start_run(self) -> None:
        """A run of the decision loop begins: no-room verdicts are filled in at its end."""
        self.deferred = []

    def end_run(self, waiting: dict) -> None:
        """Give the no-room verdicts of the run their message and numbers as the nodes are after it: in every
        waiting decision of ``waiting`` (job id -> ``Waiting``) and in the remembered capacity waits."""
        deferred, self.deferred = self.deferred, None
        if not deferred:
            return
        messages: dict[int, str] = {}
        taken = self.cohorts.taken
        for detail, key, job, acc, pools, pids in deferred:
            verdict = self._no_room_now(job, acc, pools, pids, key, taken.get(acc, 0))
            detail.update(verdict.detail)  # the same dict every decision of the run holds
            messages[id(detail)] = verdict.message
            self._no_room[key] = (taken.get(acc, 0), Verdict(False, "capacity", verdict.message, detail))
        for w in waiting.values():
            if w.message is DEFERRED:
                w.message = messages[id(w.detail)]
        waits = self.memo.waits
        for k in self.deferred_waits:
            entry = waits.get(k)
            if entry is not None and entry[1].message is DEFERRED:
                stamp, verdict = entry
                waits[k] = (stamp, Verdict(False, verdict.reason, messages[id(verdict.detail)], verdict.detail))
        self.deferred_waits.clear()

    def unhealthy_sentence(self, job: QueuedJob, acc: int, request) -> str:
        """``rules.unhealthy_nodes`` over the accelerator's pools allowed to ``job``."""
        key = (acc, job.shape)
        found = self._unhealthy.get(key)
        if found is None:
            sick = self._sick_pools.get(acc)
            if sick is None:  # the accelerator's pools with an unhealthy node, once: most fleets have none
                sick = [o for o in self.pools.get(acc, ()) if any(not n.healthy for n in o.node_rooms)]
                self._sick_pools[acc] = sick
            found = unhealthy_nodes(request, [o for o in sick if allowed(request, o)])
            self._unhealthy[key] = found
        return found

    def estimate(self, job: QueuedJob, offer: PoolOffer):
        """``rules.job_estimate`` of ``job`` on ``offer`` (one of the snapshot's pools), USD, remembered by what it
        reads: the job's nodes, GPUs, CPU and memory per node (or its roles) and run time, and the pool."""
        key = (job.nodes, job.gpus_per_node, job.cpu_milli, job.memory_mib, job.max_runtime_seconds,
               offer.node_pool_id, job.roles)
        found = self._estimates.get(key)
        if found is None or found[0] is not offer:
            found = (offer, job_estimate(job, offer))
            self._estimates[key] = found
        return found[1]

