"""The decision loop: a snapshot of teams, quotas, pools and jobs in, admissions, rejections and waits out.

Kueue's ClusterQueue/Cohort model (nominal quota, borrowing and lending
limits, BestEffortFIFO between teams, StrictFIFO within one) plus money
budgets; no Django import, so a pass over 100,000 jobs stays in memory.
The rules are in ``rules`` (quota, caps, cohort, capacity, budgets), the
order in ``order``, victim selection in ``preemption``, placement in
``placement``; this module runs them in order and keeps the state a pass
changes as it admits.

Rules (sources: Kueue docs "Cluster Queue", "Preemption", "Fair Sharing"):

- A team may hold ``nominal + borrowing_limit`` GPUs of an accelerator.
- Within a cohort, each team keeps ``nominal - lending_limit`` GPUs for
  itself (all of its nominal is lendable when there is no lending limit);
  the rest forms the cohort's lendable pool. A team's usage above its
  unlendable part is drawn from that pool, which must never be overdrawn;
  so a cohort never uses more than the sum of its nominal quotas.
- A team's limit is what it can reach: nominal + borrowing limit, at most
  nominal + what the other teams of its cohort can lend (``rules.reachable_gpus``).
- Order: priority (high first), then the team's dominant share (borrowed
  GPUs / cohort lendable GPUs, max over accelerators, / weight) lowest first,
  then submission time. Within a team, Kueue's queueing strategies: under
  ``BestEffortFIFO`` (the default) a job that cannot be admitted now waits
  and the next one is tried; under ``StrictFIFO`` the team stops at it (its
  order is kept). Other teams go on either way. Jobs that can never run are
  rejected and do not block; nor do jobs that need the fleet to change
  (a cordoned node, an unreachable cluster, a pool that does not exist yet).
- Gang admission: every node of a job goes on a distinct node of one node
  pool with room for its GPUs, CPU and memory now, or the job waits.
- Placement: healthy, constraints, spot only if preemptible, cheapest price;
  then the packing policy (``placement.PACKING_POLICIES``, best-fit by
  default) chooses between pools of that price and the nodes inside one,
  preferring one topology domain for multi-node jobs.
- CPU quota: the CPU flavor's quota counts CPU millicores (``TeamQuota.cpu``)
  by the same rules (nominal, borrowing and lending limits, the cohort's
  lendable pool, dominant share); a CPU-only job counts its pods' CPU
  requests against it, and none when its team has no CPU quota (quota-free).
  CPU-only jobs never preempt.
- Accelerator alternatives: the job's accelerators are tried in its order of
  preference; quota and price are those of the one it gets.
- Preemption: see ``preemption``; victims are not requeued within the pass
  that preempted them.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import heapq
import operator

from .order import TeamQueue, dominant_share, team_key
from .placement import (
    DEFAULT_PACKING_POLICY,
    NodeBook,
    PoolOffer,
    allowed,
    capable_nodes,
    matches,
    price_order,
    workload_of,
)
from .preemption import choose_victims, may_preempt, victim_order, victims_were_borrowing
from .rules import (
    budget_never,
    check_budgets,
    cohort_full,
    cohort_has_room,
    cpu_cohort_full,
    job_estimate,
    never_placeable,
    no_price,
    no_room,
    quota_verdict,
    reachable_gpus,
    unhealthy_nodes,
    within_cluster_caps,
)
from .types import (
    NO_QUOTA,
    Admission,
    Assessment,
    Decision,
    Decisions,
    QueuedJob,
    Rejection,
    RunningJob,
    Snapshot,
    TeamQuota,
    TeamState,
    Verdict,
    Waiting,
)

_ORDER_KEY = operator.attrgetter("key")  # ``QueuedJob.order_key`` without a call
STRICT_FIFO = "StrictFIFO"
BEST_EFFORT_FIFO = "BestEffortFIFO"
#: Kueue's queueing strategies, the default first.
QUEUEING_STRATEGIES = (BEST_EFFORT_FIFO, STRICT_FIFO)


class FairShareScheduler:
    """The pure scheduler over one Snapshot: ``full_pass()``, then ``submit(job)`` for incremental passes.

    The snapshot's ``used`` and the nodes' free resources (``book``) are
    updated in place as decisions are made, so a later ``submit`` sees the
    state after them. ``policy``: the packing policy (default: the
    snapshot's).
    """

    def __init__(self, snapshot: Snapshot, policy: str | None = None):
        self.teams = snapshot.teams
        self.queues: dict[int, TeamQueue] = {tid: TeamQueue(t) for tid, t in snapshot.teams.items()}
        self._pools: dict[int, list[PoolOffer]] = snapshot.pools
        self._unpriced: dict[int, list[PoolOffer]] = snapshot.unpriced
        policy = policy or snapshot.policy or DEFAULT_PACKING_POLICY
        workload = snapshot.workload or (workload_of([*snapshot.queue, *snapshot.running]) if policy == "fgd" else ())
        self.book = NodeBook([o for offers in snapshot.pools.values() for o in offers], policy, workload)
        self.pool_cluster: dict[int, int] = {o.node_pool_id: o.cluster_id for offers in snapshot.pools.values()
                                             for o in offers}
        self._matching: dict[tuple, tuple[list[PoolOffer], Verdict | None, tuple[int, ...]]] = {}
        self._by_price: dict[int, list[PoolOffer]] = {}  # by accelerator: its pools in ``price_order``
        # Capacity verdicts by (pools key, shape): (book version, verdict); shapes known not to fit by pools key.
        self._no_room: dict[tuple, tuple[int, Verdict]] = {}
        self._failed: dict[tuple, tuple[int, list[tuple[int, int, int, int]]]] = {}
        self._taken: dict[int, int] = {}  # by accelerator: bumped by every booking (its pools' cached numbers are stale)
        # By accelerator: bumped by every release on its pools (shapes known not to fit there may fit again).
        self._released: dict[int, int] = {}
        self._no_victims: dict[tuple, tuple[int, list[tuple[int, int, int, int]]]] = {}
        self._never_seen: dict[tuple, Verdict | None] = {}
        self._quota_seen: dict[tuple, tuple[int, Verdict]] = {}
        self._wait_seen: dict[tuple, tuple[tuple, Verdict]] = {}  # (team, shape) -> (stamp, capacity verdict)
        self._cohort_version: dict[tuple, int] = {}  # (cohort, accelerator) -> changes of its teams' usage
        self._estimates: dict[tuple, tuple[PoolOffer, object]] = {}  # ``_estimate``: (offer, USD) by job size and pool
        self._unhealthy: dict[tuple, str] = {}  # pools key -> ``unhealthy_nodes`` sentence (health is fixed)
        # A pass's decisions that admitted nothing, by what they depend on (``_run``), with the number of
        # bookings made when they were decided (``_epoch``): until the next booking, a job of the same key gets the
        # same decision. Emptied at the start of each run of the loop, as the state may be changed between runs.
        self._decided: dict[tuple, tuple[int, Decision]] = {}
        self._epoch = 0
        # Cohort lendable pool and borrowed GPUs, by (cohort, accelerator).
        self.lendable: dict[tuple, int] = {}
        self.borrowed: dict[tuple, int] = {}
        for t in self.teams.values():
            for acc, q in t.quotas.items():
                key = (t.cohort, acc)
                self.lendable[key] = self.lendable.get(key, 0) + q.lendable_gpus
            for acc, used in t.used.items():
                q = t.quotas.get(acc)
                key = (t.cohort, acc)
                self.borrowed[key] = self.borrowed.get(key, 0) + max(0, used - (q.guaranteed_gpus if q else 0))
        for t in self.teams.values():
            for acc, q in t.quotas.items():
                q.reachable_gpus = reachable_gpus(q.nominal_gpus, q.borrowing_limit_gpus,
                                                  self.lendable[(t.cohort, acc)] - q.lendable_gpus)
        self.share: dict[int, float] = {tid: dominant_share(t, self.lendable) for tid, t in self.teams.items()}
        #: The snapshot's queue in overall order (priority, submission, id), for the waiting jobs' positions.
        self._in_order: list[QueuedJob] = sorted(snapshot.queue, key=_ORDER_KEY)
        self._submitted = False  # set by ``submit``: the queues then hold jobs outside ``_in_order``
        for job in self._in_order:
            self.queues[job.team_id].jobs.append(job)
        # Preemption candidates by (cohort, accelerator), in victim order.
        self.candidates: dict[tuple, list[RunningJob]] = {}
        for r in snapshot.running:
            if r.preemptible and r.team_id in self.teams:
                self.candidates.setdefault((self.teams[r.team_id].cohort, r.accelerator_id), []).append(r)
        for lst in self.candidates.values():
            lst.sort(key=victim_order)
        self.order: list[tuple] = []  # waiting jobs' overall order keys (priority, submission, id)
        self.preempted: set[int] = set()

    def _key(self, tq: TeamQueue) -> tuple:
        return team_key(tq.jobs[tq.pos], self.share[tq.team.team_id])

    # --- placement ------------------------------------------------------------------------

    @staticmethod
    def _pools_key(job: QueuedJob, acc: int) -> tuple:
        return (acc, job.shape)

    def _matching_pools(self, job: QueuedJob, acc: int | None = None) -> list[PoolOffer]:
        """The pools that could hold ``job`` once their work ends, in ``price_order`` (cached per job shape and
        constraints)."""
        return self._matching_entry(job, job.accelerator_id if acc is None else acc)[0]

    def _matching_entry(self, job: QueuedJob, acc: int) -> tuple[list[PoolOffer], Verdict | None, tuple[int, ...]]:
        """(matching pools, None, their ids) or ([], the fleet-change verdict that says why none matches, ())."""
        key = self._pools_key(job, acc)
        found = self._matching.get(key)
        if found is None:
            request = job.placement()
            offers = self._pools.get(acc, ())
            in_order = self._by_price.get(acc)
            if in_order is None:  # the accelerator's pools sorted once: filtering keeps that (stable) order
                in_order = self._by_price[acc] = sorted(offers, key=price_order)
            pools = [o for o in in_order if matches(request, o)]
            found = (pools, None if pools else never_placeable(job, self._why_none(job, request, offers)),
                     tuple(o.node_pool_id for o in pools))
            self._matching[key] = found
        return found

    @staticmethod
    def _why_none(job: QueuedJob, request, offers) -> str:
        """What keeps every pool from holding ``job``, in words with the numbers (for the fleet-change reason)."""
        allowed_pools = [o for o in offers if allowed(request, o)]
        if not allowed_pools:
            return "none of the accelerator's pools is allowed by its placement and spot rules"
        sick = sorted({o.cluster_name for o in allowed_pools if not o.healthy})
        whole = max((capable_nodes(request, o, schedulable_only=False) for o in allowed_pools), default=0)
        open_ = max((capable_nodes(request, o, schedulable_only=True) for o in allowed_pools if o.healthy), default=0)
        bad = unhealthy_nodes(request, allowed_pools)
        parts = []
        if sick:
            parts.append(f"cluster{'s' if len(sick) > 1 else ''} {', '.join(sick)} "
                         f"{'are' if len(sick) > 1 else 'is'} not healthy")
        if open_ < whole:
            parts.append(f"{whole - open_} large enough nodes are cordoned, tainted or unhealthy" if bad else
                         f"{whole - open_} large enough nodes are cordoned or tainted")
        if bad:
            parts.append(bad)
        parts.append(f"at most {open_} schedulable nodes of one healthy pool can hold a node of it, "
                     f"{job.nodes} needed")
        return "; ".join(parts)

    def _place(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...]):
        """``(offer, node indexes)`` for ``job`` among ``pools`` (ids ``pids``) now, or None (shapes known not to fit
        are cached)."""
        key = (acc, job.preemptible, pids)
        shape = (job.nodes, job.gpus_per_node, job.cpu_milli, job.memory_mib)
        released = self._released.get(acc, 0)
        failed = self._failed.get(key)
        if failed is not None and failed[0] == released:
            for fn, fg, fc, fm in failed[1]:
                if shape[0] >= fn and shape[1] >= fg and shape[2] >= fc and shape[3] >= fm:
                    return None
        found = self.book.place(job.placement(), pools)
        if found is None:
            if failed is None or failed[0] != released:
                failed = self._failed[key] = (released, [])
            lst = failed[1]
            lst[:] = [s for s in lst if not all(a >= b for a, b in zip(s, shape))]
            lst.append(shape)
        return found

    def _no_room_verdict(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...]) -> Verdict:
        key = (self._pools_key(job, acc), pids)
        cached = self._no_room.get(key)
        taken = self._taken.get(acc, 0)
        if cached is not None and cached[0] == taken:
            return cached[1]
        book = self.book
        request = job.placement()
        shown = pools[:3]
        nodes = book.pools
        verdict = no_room(job, pools, {pid: nodes[pid].free_total for pid in pids},
                          {o.node_pool_id: book.most_free(o.node_pool_id) for o in shown},
                          {o.node_pool_id: book.nodes_with_room(o.node_pool_id, request) for o in shown},
                          self._unhealthy_sentence(job, acc, request))
        self._no_room[key] = (taken, verdict)
        return verdict

    def _unhealthy_sentence(self, job: QueuedJob, acc: int, request) -> str:
        """``unhealthy_nodes`` over the accelerator's pools allowed to ``job`` (remembered by pools key: node health
        and the pools do not change within the scheduler's life)."""
        key = self._pools_key(job, acc)
        found = self._unhealthy.get(key)
        if found is None:
            found = self._unhealthy[key] = unhealthy_nodes(
                request, [o for o in self._pools.get(acc, ()) if allowed(request, o)])
        return found

    def _estimate(self, job: QueuedJob, offer: PoolOffer):
        """``job_estimate`` of ``job`` on ``offer`` (one of the snapshot's pools), remembered by what it reads: the
        job's nodes, GPUs, CPU and memory per node and run time, and the pool."""
        key = (job.nodes, job.gpus_per_node, job.cpu_milli, job.memory_mib, job.max_runtime_seconds,
               offer.node_pool_id)
        found = self._estimates.get(key)
        if found is None or found[0] is not offer:
            found = self._estimates[key] = (offer, job_estimate(job, offer))
        return found[1]

    # --- one job ------------------------------------------------------------------------

    def _never(self, job: QueuedJob) -> Verdict | None:
        """The verdict that rejects ``job`` for good on every accelerator it accepts, or None."""
        first = None
        for acc in job.accelerator_ids:
            verdict = self._never_on(job, acc)
            if verdict is None:
                return None
            first = first or verdict
        return first

    def _never_on(self, job: QueuedJob, acc: int) -> Verdict | None:
        """The verdict that rejects ``job`` for good on ``acc`` (quota never-rules, then a whole block budget).

        Cached per team, accelerator, size and run time: quotas and budget amounts do not change within a pass.
        """
        team = self.teams[job.team_id]
        amount = self._amount(job, acc, team)
        key = (job.team_id, acc, job.cpu_only, amount, job.max_runtime_seconds if team.budgets else 0,
               self._pools_key(job, acc) if team.budgets else None)
        if key in self._never_seen:
            return self._never_seen[key]
        q = team.quotas.get(acc)
        verdict = quota_verdict(job, amount, 0, q.view() if q is not None else None)
        if verdict.ok or not verdict.never:
            verdict = None
        if verdict is None and team.budgets:
            pools = self._matching_pools(job, acc)
            if pools:
                cheapest = self._estimate(job, pools[0])
                verdict = budget_never(cheapest, team.budgets)
        self._never_seen[key] = verdict
        return verdict

    @staticmethod
    def _amount(job: QueuedJob, acc: int, team: TeamState) -> int:
        """What ``job`` counts against ``team``'s quota of ``acc``: its GPUs; for a CPU-only job its pods' CPU
        millicores when the team has a CPU quota, else 0 (quota-free)."""
        if not job.cpu_only:
            return job.total_gpus
        return job.total_cpu_milli if acc in team.quotas else 0

    def evaluate(self, job: QueuedJob, *, only_pool: int | None = None) -> Decision:
        """Admission, Rejection or Waiting for ``job`` as its team's head, on the current state (nothing changes).

        The job's accelerators are tried in its order of preference; the
        first admission wins; otherwise the preferred accelerator's reason
        (one that can never run is passed over). A Waiting whose detail says
        ``never_placeable`` never blocks its team. ``only_pool``: the job may
        go to that node pool only (a preempting admission's re-check: its
        victims made room there).
        """
        if not job.alternatives:
            return self._evaluate_on(job, job.accelerator_id, only_pool)
        first_wait = None
        first_never = None
        for acc in job.accelerator_ids:
            decision = self._evaluate_on(job, acc, only_pool)
            if isinstance(decision, Admission):
                return decision
            if isinstance(decision, Waiting):
                if first_wait is None or (first_wait.detail.get("never_placeable")
                                          and not decision.detail.get("never_placeable")):
                    first_wait = decision
            elif first_never is None:
                first_never = decision
        return first_wait or first_never

    def _evaluate_on(self, job: QueuedJob, acc: int, only_pool: int | None) -> Decision:
        never = self._never_on(job, acc)
        if never is not None:
            return Rejection(job, never)
        team = self.teams[job.team_id]
        q = team.quotas.get(acc) or NO_QUOTA  # none: a quota-free CPU-only job (it passed _never_on)
        gpus = self._amount(job, acc, team)  # GPUs, or CPU millicores against a CPU quota
        used = team.used.get(acc, 0)
        qkey = (job.team_id, acc, job.cpu_only, gpus)
        known = self._quota_seen.get(qkey)
        if known is None or known[0] != used:  # the verdict depends on the team's usage only
            known = (used, quota_verdict(job, gpus, used, q.view() if gpus else None))
            self._quota_seen[qkey] = known
        if not known[1].ok:
            return Waiting.because(job, known[1])
        ckey = (team.cohort, acc)
        wkey = (job.team_id, self._pools_key(job, acc)) if only_pool is None else None
        preempts = may_preempt(job, team, q, acc)
        stamp = (used, self._released.get(acc, 0), self._cohort_version.get(ckey, 0) if preempts else None)
        seen = self._wait_seen.get(wkey) if wkey is not None else None
        if seen is not None and seen[0] == stamp:
            return Waiting.because(job, seen[1])  # nothing that could let it in changed since the same shape waited
        decision = self._place_or_wait(job, acc, only_pool, team, q, used, ckey, preempts)
        if wkey is not None and isinstance(decision, Waiting) and decision.reason == "capacity":
            self._wait_seen[wkey] = (stamp, decision.verdict())
        return decision

    def _place_or_wait(self, job: QueuedJob, acc: int, only_pool: int | None, team: TeamState, q: TeamQuota,
                       used: int, ckey: tuple, preempts: bool) -> Decision:
        """The rest of ``_evaluate_on`` once quota allows ``job``: pools, caps, the cohort, nodes, victims, budget.

        A capacity wait depends only on the team's usage, on what was released
        since (preemptions) and, for a job that may preempt, on its cohort's
        usage: admissions only take nodes away, so ``_evaluate_on`` reuses it
        for the next job of the same team and shape until one of those changes.
        """
        gpus = self._amount(job, acc, team)
        pools, fleet, pids = self._matching_entry(job, acc)
        if not pools:
            request = job.placement()
            unpriced = [o for o in self._unpriced.get(acc, ()) if matches(request, o)]
            return Waiting.because(job, no_price(job, unpriced) if unpriced else fleet)
        if team.cluster_caps:
            pools, verdict = within_cluster_caps(team, job, pools, acc)
            if not verdict.ok:
                return Waiting.because(job, verdict)
            pids = tuple(o.node_pool_id for o in pools)
        if only_pool is not None:
            pools = [o for o in pools if o.node_pool_id == only_pool]
            pids = tuple(o.node_pool_id for o in pools)
        cohort_ok = gpus == 0 or cohort_has_room(self.lendable.get(ckey, 0), self.borrowed.get(ckey, 0), used,
                                                 q.guaranteed_gpus, gpus)
        found = self._place(job, acc, pools, pids) if cohort_ok else None
        victims: tuple[RunningJob, ...] = ()
        if found is None and preempts:
            chosen = self._find_victims(job, acc, team, q, pools, pids, fits_nowhere=cohort_ok)
            if chosen is not None:
                offer, victims, nodes = chosen
                found = (offer, nodes)
        if found is None:
            if not cohort_ok:
                full = cpu_cohort_full if job.cpu_only else cohort_full
                return Waiting.because(job, full(job, used, q, self.lendable.get(ckey, 0), self.borrowed.get(ckey, 0)))
            return Waiting.because(job, self._no_room_verdict(job, acc, pools, pids))
        offer, nodes = found
        estimate = self._estimate(job, offer)
        verdict = check_budgets(estimate, team.budgets)
        if not verdict.ok:
            return Waiting.because(job, verdict)
        return Admission(job, offer, estimate, victims, self.book.names(offer.node_pool_id, nodes), acc)

    def _find_victims(self, job: QueuedJob, acc: int, team: TeamState, q: TeamQuota, pools: list[PoolOffer],
                      pids: tuple[int, ...], fits_nowhere: bool = False):
        """The fewest preemptible jobs of other teams of the cohort, each taken while its team borrows, whose end
        lets ``job`` in; with the pool and its nodes. None when there are none.

        A search that found nothing is remembered for the team and its pools
        until the usage of a team of its cohort changes (more borrowing makes
        more victims eligible; a preemption frees nodes): a job of the same
        team at least as large (nodes, GPUs, CPU, memory) finds nothing
        either until then (admissions elsewhere only take nodes away).
        """
        key = (team.team_id, acc, pids)
        shape = (job.nodes, job.gpus_per_node, job.cpu_milli, job.memory_mib)
        version = (self._cohort_version.get((team.cohort, acc), 0), self._released.get(acc, 0))
        known = self._no_victims.get(key)
        if known is not None and known[0] == version:
            if any(all(a >= b for a, b in zip(shape, s)) for s in known[1]):
                return None
        found = self._search_victims(job, acc, team, q, pools, fits_nowhere)
        if found is None:
            if known is None or known[0] != version:
                known = (version, [])
                self._no_victims[key] = known
            known[1].append(shape)
        return found

    def _search_victims(self, job: QueuedJob, acc: int, team: TeamState, q: TeamQuota, pools: list[PoolOffer],
                        fits_nowhere: bool = False):
        """``choose_victims`` for ``job`` among the cohort's candidates of other teams; ``fits_nowhere``: the job
        has room on none of ``pools`` now (its placement was just tried)."""
        gpus = job.total_gpus
        ckey = (team.cohort, acc)
        candidates = [c for c in self.candidates.get(ckey, ()) if c.team_id != team.team_id
                      and c.job_id not in self.preempted]
        if not candidates:
            return None
        used = team.used.get(acc, 0)
        g = q.guaranteed_gpus
        cohort_need = (self.borrowed.get(ckey, 0) - max(0, used - g) + max(0, used + gpus - g)
                       - self.lendable.get(ckey, 0))
        return choose_victims(candidates, pools, self.book, self.teams, acc, job.placement(), cohort_need,
                              fits_nowhere)

    def assess(self, job: QueuedJob) -> Assessment:
        """What the rules say of ``job`` before it is submitted (nothing changes): where it would run, its estimate,
        and its team's quota and budget verdicts (the quota one on the limit the team can reach: nominal +
        borrowing limit, at most what its cohort can lend; what the cohort lends now is decided at admission)."""
        team = self.teams[job.team_id]
        acc = job.accelerator_id
        pools, _, pids = self._matching_entry(job, acc)
        found = self._place(job, acc, pools, pids)
        fits_now = found is not None
        offer = found[0] if found else (pools[0] if pools else None)  # else where it would wait for capacity
        estimate = job_estimate(job, offer) if offer is not None else None
        budget = check_budgets(estimate, team.budgets) if estimate is not None else None
        q = team.quotas.get(acc)
        quota = quota_verdict(job, self._amount(job, acc, team), team.used.get(acc, 0),
                              q.view() if q is not None else None)
        return Assessment(offer, fits_now, estimate, quota, budget)

    # --- applying a decision to the in-memory state ----------------------------------------

    def admit(self, admission: Admission) -> None:
        """Book ``admission`` (an ``evaluate`` answer on this state) as a pass does: its team's usage, its nodes,
        its cluster usage and its budgets' committed money; its victims released. Later ``evaluate`` calls see it."""
        self._admit(admission)

    def _use(self, team: TeamState, acc: int, delta: int) -> None:
        q = team.quotas.get(acc)
        g = q.guaranteed_gpus if q else 0
        used = team.used.get(acc, 0)
        key = (team.cohort, acc)
        self.borrowed[key] = self.borrowed.get(key, 0) - max(0, used - g) + max(0, used + delta - g)
        team.used[acc] = used + delta
        self._cohort_version[key] = self._cohort_version.get(key, 0) + 1
        self.share[team.team_id] = dominant_share(team, self.lendable)
        self.queues[team.team_id].version += 1

    def _admit(self, a: Admission) -> None:
        self._epoch += 1
        job = a.job
        acc = a.accelerator_id or job.accelerator_id
        for v in a.victims:
            self.preempted.add(v.job_id)
            self.candidates[(self.teams[v.team_id].cohort, v.accelerator_id)].remove(v)
            self.book.release(v.node_pool_id, v.node_names, v.gpus, v.gpus_per_node, v.cpu_milli, v.memory_mib)
            self._released[v.accelerator_id] = self._released.get(v.accelerator_id, 0) + 1
            self._taken[v.accelerator_id] = self._taken.get(v.accelerator_id, 0) + 1
            owner = self.teams[v.team_id]
            self._use(owner, v.accelerator_id, -v.gpus)
            ckey = (v.accelerator_id, self.pool_cluster.get(v.node_pool_id))
            if ckey in owner.cluster_used:
                owner.cluster_used[ckey] -= v.gpus
        pool = self.book.pools[a.offer.node_pool_id]
        self.book.take(a.offer.node_pool_id, [pool.index[n] for n in a.node_names], job.placement())
        self._taken[acc] = self._taken.get(acc, 0) + 1
        team = self.teams[job.team_id]
        amount = self._amount(job, acc, team)
        if amount or not job.cpu_only:
            self._use(team, acc, amount)  # a quota-free CPU-only job counts nothing
        ckey = (acc, a.offer.cluster_id)
        if ckey in team.cluster_caps:
            team.cluster_used[ckey] = team.cluster_used.get(ckey, 0) + job.total_gpus
        if team.budgets:
            team.budgets = [dataclasses.replace(b, committed_usd=b.committed_usd + a.estimate_usd)
                            for b in team.budgets]

    # --- passes ---------------------------------------------------------------------------

    def _run(self, heap: list, out: Decisions) -> None:
        """Pop the team whose head comes first, decide that head, push the team back with its next head.

        A decision that admits nothing is remembered by what ``evaluate``
        reads of the job (its team, accelerators, shape and constraints, and
        its run time when the team has budgets: the estimate; priority,
        submission and id play no part) until the next booking (``_epoch``):
        every rule reads only the state and those fields, so the next job of
        the same key gets the same reason at once (a full queue waits in a
        few dictionary looks).
        """
        queues = self.queues
        decided = self._decided
        decided.clear()
        share = self.share
        waiting = out.waiting
        heappop, heappushpop = heapq.heappop, heapq.heappushpop
        entry = heappop(heap) if heap else None
        while entry is not None:
            _key, version, tid = entry
            tq = queues[tid]
            if tq.blocked is not None or tq.pos >= len(tq.jobs):
                entry = heappop(heap) if heap else None
                continue
            if version != tq.version:
                entry = heappushpop(heap, (self._key(tq), tq.version, tid))
                continue
            job = tq.jobs[tq.pos]
            team = tq.team
            dkey = (tid, job.accelerator_id, job.alternatives, job.shape,
                    job.max_runtime_seconds if team.budgets else 0)
            known = decided.get(dkey)
            if known is not None and known[0] == self._epoch:
                same = known[1]
                decision = (Waiting(job, same.reason, same.message, same.detail) if isinstance(same, Waiting)
                            else Rejection(job, same.verdict))
            else:
                decision = self.evaluate(job)
                if not isinstance(decision, Admission):
                    decided[dkey] = (self._epoch, decision)
            if isinstance(decision, Waiting):
                if team.strategy != STRICT_FIFO or decision.detail.get("never_placeable"):
                    tq.waiting_before.append(job)
                    waiting[job.job_id] = decision
                else:
                    tq.blocked = decision
                    waiting[job.job_id] = decision
                    entry = heappop(heap) if heap else None
                    continue
            elif isinstance(decision, Admission):
                self._admit(decision)
                out.admissions.append(decision)
            else:
                out.rejections.append(decision)
            tq.pos += 1
            if tq.pos < len(tq.jobs):
                nxt = tq.jobs[tq.pos]  # ``_key``, inline: the order between teams by their heads
                entry = heappushpop(heap, ((-nxt.priority, share[tid], nxt.submitted, nxt.job_id), tq.version, tid))
            else:
                entry = heappop(heap) if heap else None
        decided.clear()

    def _finish_team(self, tq: TeamQueue, out: Decisions) -> None:
        """Behind a blocked head: reject what can never run, the rest waits (reason ``priority``)."""
        if tq.blocked is None:
            return
        kept = tq.jobs[:tq.pos + 1]
        message = self._behind_message(tq.blocked)
        for job in tq.jobs[tq.pos + 1:]:
            never = self._never(job)
            if never is not None:
                out.rejections.append(Rejection(job, never))
                continue
            kept.append(job)
            out.waiting[job.job_id] = self._behind(job, tq.blocked, message)
        tq.jobs = kept

    def _positions(self, out: Decisions) -> None:
        """Team position (team order) and overall position (priority, then submission) of every waiting job.

        Both orders are the queue's order (``QueuedJob.key``): when every
        waiting job came from the snapshot's queue, one walk over that queue,
        sorted once when the scheduler was made, numbers both.
        """
        waiting = out.waiting
        if not self._submitted:
            get = waiting.get
            keys: list[tuple] = []
            by_team: dict[int, int] = {}
            for j in self._in_order:
                w = get(j.job_id)
                if w is not None and w.job is j:
                    keys.append(j.key)
                    w.overall_position = len(keys)
                    w.team_position = n = by_team.get(j.team_id, 0) + 1
                    by_team[j.team_id] = n
            if len(keys) == len(waiting):
                self.order = keys
                return
        for tq in self.queues.values():  # some waiting job came another way (a submission): number them afresh
            n = 0
            pending = tq.jobs[tq.pos:]
            if tq.waiting_before:
                pending = sorted(tq.waiting_before + pending, key=_ORDER_KEY)
            for job in pending:
                w = waiting.get(job.job_id)
                if w is not None:
                    n += 1
                    w.team_position = n
        self.order = sorted([w.job.key for w in waiting.values()])
        index = {k[2]: i for i, k in enumerate(self.order, 1)}
        for jid, w in waiting.items():
            w.overall_position = index[jid]

    def full_pass(self) -> Decisions:
        """Decide every queued job once; returns admissions (with victims), rejections and waiting reasons.

        The cyclic garbage collector is paused meanwhile: the pass allocates
        one reason per waiting job and creates no cycles, and generation-2
        collections over a 100,000-job heap would otherwise dominate its time.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._full_pass()
        finally:
            if was_enabled:
                gc.enable()

    def _full_pass(self) -> Decisions:
        out = Decisions()
        heap = [(self._key(tq), tq.version, tid) for tid, tq in self.queues.items() if tq.jobs]
        heapq.heapify(heap)
        self._run(heap, out)
        for tq in self.queues.values():
            self._finish_team(tq, out)
        self._positions(out)
        return out

    def submit(self, job: QueuedJob) -> Decisions:
        """Incremental pass after one new submission: only ``job``'s team is looked at again.

        Other teams' heads stay blocked (a submission only takes resources
        away). Jobs already waiting behind a blocked head keep their stored
        reason and position until the next full pass renumbers them.
        """
        out = Decisions()
        tq = self.queues.get(job.team_id)
        if tq is None:
            tq = self.queues[job.team_id] = TeamQueue(self.teams[job.team_id])
        key = job.order_key()
        at = bisect.bisect(tq.jobs, key, lo=tq.pos, key=QueuedJob.order_key)
        tq.jobs.insert(at, job)
        self._submitted = True  # positions are no longer the snapshot's order alone (kept: freeing it costs)
        if tq.blocked is not None and at > tq.pos:
            never = self._never(job)
            if never is not None:
                out.rejections.append(Rejection(job, never))
                tq.jobs.pop(at)
                return out
            out.waiting[job.job_id] = self._behind(job, tq.blocked)
        else:
            old = tq.blocked
            tq.blocked = None
            tq.version += 1
            self._run([(self._key(tq), tq.version, job.team_id)], out)
            if old is not None:
                self._drop_order(old.job.order_key())
                if tq.blocked is not None and old.job.job_id not in out.waiting:
                    out.waiting[old.job.job_id] = self._behind(old.job, tq.blocked)
        for w in out.waiting.values():
            bisect.insort(self.order, w.job.order_key())
        for w in out.waiting.values():
            k = w.job.order_key()
            w.overall_position = bisect.bisect_left(self.order, k) + 1
            w.team_position = bisect.bisect_left(tq.jobs, k, lo=tq.pos, key=QueuedJob.order_key) - tq.pos + 1
        return out

    @staticmethod
    def _behind_message(blocked: Waiting) -> str:
        return (f"Waits behind job {blocked.job.job_id}, ahead of it in its team's queue (the team queues StrictFIFO), "
                f"which waits for {blocked.reason}: {blocked.message}")[:480]

    @classmethod
    def _behind(cls, job: QueuedJob, blocked: Waiting, message: str | None = None) -> Waiting:
        """``job`` waits (reason ``priority``) because its team's head ``blocked`` waits and the team keeps its order."""
        return Waiting(job, "priority", message or cls._behind_message(blocked),
                       {"request_gpus": job.nodes * job.gpus_per_node, "behind_job_id": blocked.job.job_id,
                        "behind_reason": blocked.reason})

    def _drop_order(self, key: tuple) -> None:
        i = bisect.bisect_left(self.order, key)
        if i < len(self.order) and self.order[i] == key:
            del self.order[i]


def decide(snapshot: Snapshot) -> Decisions:
    """One full pass over ``snapshot`` (see the module docstring for the rules)."""
    return FairShareScheduler(snapshot).full_pass()


def recheck(snapshot: Snapshot, job: QueuedJob, admission: Admission) -> Decision:
    """The decision for ``job`` alone, as its team's head, on ``snapshot`` read again when ``admission`` (the pass's
    decision for it) commits: the same rules, on fresh numbers.

    The admission's victims are already ended in ``snapshot`` (their teams'
    usage and their nodes' free resources no longer count them); each
    victim's team must have been borrowing before the removal, and a
    preempting admission goes to the pool its victims freed or waits. The snapshot's own running jobs
    are candidates for preemption as in a pass (none, for a re-check that
    only verifies).
    """
    verdict = victims_were_borrowing(snapshot.teams, job, admission.victims,
                                     admission.accelerator_id or job.accelerator_id)
    if not verdict.ok:
        return Waiting.because(job, verdict)
    only_pool = admission.offer.node_pool_id if admission.victims else None
    return FairShareScheduler(snapshot).evaluate(job, only_pool=only_pool)


def assess(snapshot: Snapshot, job: QueuedJob) -> Assessment:
    """``FairShareScheduler.assess`` of a job not yet submitted, on ``snapshot`` (its team and the job's pools)."""
    return FairShareScheduler(snapshot).assess(job)
