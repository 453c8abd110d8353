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
from .preemption import choose_victims, victim_order, victims_were_borrowing
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
    BudgetView,
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

#: The message of a no-room verdict until the end of the run of the loop that made it (``_fill_deferred``).
_DEFERRED = "(numbers as after this pass)"
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
        self._no_room: dict[tuple, tuple[int | None, Verdict]] = {}
        # Within a run of the loop: the no-room verdicts to fill in at its end (``_fill_deferred``); else None.
        self._deferred: list[tuple] | None = None
        self._deferred_seen: list[tuple] = []  # the keys of ``_wait_seen`` given such a verdict in this run
        self._failed: dict[tuple, tuple[int, list[tuple[int, int, int, int]]]] = {}
        # (pools ids, GPUs asked) -> (releases, how many pools in front have fewer free GPUs than that): ``_place``.
        self._short: dict[tuple, tuple[int, int]] = {}
        self._taken: dict[int, int] = {}  # by accelerator: bumped by every booking (its pools' cached numbers are stale)
        # By accelerator: bumped by every release on its pools (shapes known not to fit there may fit again).
        self._released: dict[int, int] = {}
        self._no_victims: dict[tuple, tuple[int, list[tuple[int, int, int, int]]]] = {}
        self._never_seen: dict[tuple, Verdict | None] = {}
        self._cheapest: dict[tuple, object] = {}  # (accelerator, run time, shape) -> estimate on its cheapest pool
        self._quota_seen: dict[tuple, tuple[int, Verdict]] = {}
        # Capacity waits (``_evaluate_on``): (team, pools key) -> ((used, releases, cohort version, run), verdict), or
        # for a job that will not preempt, of a team without per-cluster caps, pools key -> ((releases, run), verdict).
        self._wait_seen: dict[tuple, tuple[tuple, Verdict]] = {}
        self._cohort_version: dict[tuple, int] = {}  # (cohort, accelerator) -> changes of its teams' usage
        self._estimates: dict[tuple, tuple[PoolOffer, object]] = {}  # ``_estimate``: (offer, USD) by job size and pool
        self._unhealthy: dict[tuple, str] = {}  # pools key -> ``unhealthy_nodes`` sentence (health is fixed)
        self._sick_pools: dict[int, list[PoolOffer]] = {}  # by accelerator: its pools with an unhealthy node
        # A pass's decisions that admitted nothing, by what they depend on (``_run``), with the state they read
        # (``_stamp``): while it holds, a job of the same key gets the same decision. Emptied at the start of each
        # run of the loop, as the state may be changed between runs. ``_epoch``: the number of bookings.
        self._decided: dict[tuple, tuple] = {}
        self._epoch = 0
        self._runs = 0  # runs of the loop (``_loop``): a full pass, then one per submission
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
        # The pools in front with fewer free GPUs than the job asks, passed over by ``place``: they stay so until
        # a release on the accelerator (bookings only take GPUs), so the next such job starts after them.
        need = job.total_gpus
        skey = (pids, need)
        skip = self._short.get(skey)
        start = skip[1] if skip is not None and skip[0] == released else 0
        nodes = self.book.pools
        end = len(pools)
        while start < end and nodes[pools[start].node_pool_id].free_total < need:
            start += 1
        self._short[skey] = (released, start)
        found = self.book.place(job.placement(), pools[start:] if start else pools)
        if found is None:
            if failed is None or failed[0] != released:
                failed = self._failed[key] = (released, [])
            lst = failed[1]
            lst[:] = [s for s in lst if not (s[0] >= shape[0] and s[1] >= shape[1] and s[2] >= shape[2]
                                             and s[3] >= shape[3])]
            lst.append(shape)
        return found

    def _no_room_verdict(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...]) -> Verdict:
        """``no_room`` for ``job`` on ``pools`` (ids ``pids``) with the nodes' numbers now, remembered until the
        next booking on ``acc``. Within a run of the loop (``_deferred`` set) the numbers are those after the run:
        the verdict's message and detail are filled in by ``_fill_deferred`` once per pools key, however many
        bookings the run makes meanwhile."""
        key = (self._pools_key(job, acc), pids)
        cached = self._no_room.get(key)
        taken = self._taken.get(acc, 0)
        if cached is not None and cached[0] == taken:
            return cached[1]
        deferred = self._deferred
        if deferred is not None:
            if cached is not None and cached[0] is None:
                return cached[1]  # already to be filled in at the end of this run
            detail: dict = {}
            verdict = Verdict(False, "capacity", _DEFERRED, detail)
            deferred.append((detail, key, job, acc, pools, pids))
            self._no_room[key] = (None, verdict)
            return verdict
        return self._no_room_now(job, acc, pools, pids, key, taken)

    def _no_room_now(self, job: QueuedJob, acc: int, pools: list[PoolOffer], pids: tuple[int, ...], key: tuple,
                     taken: int) -> Verdict:
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

    def _fill_deferred(self, out: Decisions) -> None:
        """Give the no-room verdicts of a run of the loop (``_no_room_verdict``) their message and numbers as the
        nodes are after it: in every waiting decision of ``out`` and in the remembered capacity waits."""
        deferred, self._deferred = self._deferred, None
        if not deferred:
            return
        messages: dict[int, str] = {}
        for detail, key, job, acc, pools, pids in deferred:
            verdict = self._no_room_now(job, acc, pools, pids, key, self._taken.get(acc, 0))
            detail.update(verdict.detail)  # the same dict every decision of the run holds
            messages[id(detail)] = verdict.message
            self._no_room[key] = (self._taken.get(acc, 0), Verdict(False, "capacity", verdict.message, detail))
        for w in out.waiting.values():
            if w.message is _DEFERRED:
                w.message = messages[id(w.detail)]
        seen = self._wait_seen
        for k in self._deferred_seen:
            stamp, verdict = seen[k]
            if verdict.message is _DEFERRED:
                seen[k] = (stamp, Verdict(False, verdict.reason, messages[id(verdict.detail)], verdict.detail))
        self._deferred_seen.clear()

    def _unhealthy_sentence(self, job: QueuedJob, acc: int, request) -> str:
        """``unhealthy_nodes`` over the accelerator's pools allowed to ``job`` (remembered by pools key: node health
        and the pools do not change within the scheduler's life)."""
        key = self._pools_key(job, acc)
        found = self._unhealthy.get(key)
        if found is None:
            sick = self._sick_pools.get(acc)
            if sick is None:  # the accelerator's pools with an unhealthy node, once: most fleets have none
                sick = self._sick_pools[acc] = [o for o in self._pools.get(acc, ())
                                                if any(not n.healthy for n in o.node_rooms)]
            found = self._unhealthy[key] = unhealthy_nodes(request, [o for o in sick if allowed(request, o)])
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
        key = (job.team_id, acc, job.cpu_only, amount)
        verdict = self._never_seen.get(key, self)
        if verdict is self:
            q = team.quotas.get(acc)
            verdict = quota_verdict(job, amount, 0, q.view() if q is not None else None)
            if verdict.ok or not verdict.never:
                verdict = None
            self._never_seen[key] = verdict
        if verdict is None and team.budgets:  # a whole block budget: by the cheapest pool for the job's shape
            ekey = (acc, job.max_runtime_seconds, job.shape)  # whatever the team: its budgets are compared after
            cheapest = self._cheapest.get(ekey, self)
            if cheapest is self:
                pools = self._matching_pools(job, acc)
                cheapest = self._cheapest[ekey] = self._estimate(job, pools[0]) if pools else None
            if cheapest is not None:
                verdict = budget_never(cheapest, team.budgets)
        return verdict

    @staticmethod
    def _amount(job: QueuedJob, acc: int, team: TeamState) -> int:
        """What ``job`` counts against ``team``'s quota of ``acc``: its GPUs; for a CPU-only job its pods' CPU
        millicores when the team has a CPU quota, else 0 (quota-free)."""
        if not job.cpu_only:
            return job.total_gpus
        return job.total_cpu_milli if acc in team.quotas else 0

    @staticmethod
    def _preempts(job: QueuedJob, used: int, amount: int, quota: TeamQuota) -> bool:
        """Whether ``job`` (``amount`` GPUs, its team using ``used`` of ``quota``'s accelerator) may preempt: only a
        job that stays within its team's nominal quota does (``preemption``); a CPU-only job never does (ADR 0012)."""
        return not job.cpu_only and used + amount <= quota.nominal_gpus

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
        team = self.teams[job.team_id]
        cpu_only = job.cpu_only
        # ``_amount``: GPUs, or CPU millicores against a CPU quota
        gpus = job.total_gpus if not cpu_only else job.total_cpu_milli if acc in team.quotas else 0
        qkey = (job.team_id, acc, cpu_only, gpus)  # also ``_never_on``'s key for its quota never-rules
        never = self._never_seen.get(qkey, self)
        if never is self or (never is None and team.budgets):
            never = self._never_on(job, acc)
        if never is not None:
            return Rejection(job, never)
        q = team.quotas.get(acc) or NO_QUOTA  # none: a quota-free CPU-only job (it passed _never_on)
        used = team.used.get(acc, 0)
        known = self._quota_seen.get(qkey)
        if known is None or known[0] != used:  # the verdict depends on the team's usage only
            known = (used, quota_verdict(job, gpus, used, q.view() if gpus else None))
            self._quota_seen[qkey] = known
        if not known[1].ok:
            return Waiting.because(job, known[1])
        ckey = (team.cohort, acc)
        preempts = self._preempts(job, used, gpus, q)
        if only_pool is not None:
            wkey = stamp = None
        elif preempts or team.cluster_caps:
            wkey = (job.team_id, self._pools_key(job, acc))
            stamp = (used, self._released.get(acc, 0), self._cohort_version.get(ckey, 0) if preempts else None,
                     self._runs)
        else:  # what it waits for is the fleet's alone: shared by every team whose cohort could lend it the GPUs
            wkey = self._pools_key(job, acc)
            stamp = (self._released.get(acc, 0), self._runs)
        seen = self._wait_seen.get(wkey) if wkey is not None else None
        # A capacity wait was decided with room in the cohort; without the cohort's version in its stamp (a job that
        # will not preempt), it holds only while the cohort still has room for the job (else: ``cohort_full``).
        if seen is not None and seen[0] == stamp and (
                preempts or gpus == 0 or cohort_has_room(self.lendable.get(ckey, 0), self.borrowed.get(ckey, 0),
                                                         used, q.guaranteed_gpus, gpus)):
            return Waiting.because(job, seen[1])  # nothing that could let it in changed since the same shape waited
        decision = self._place_or_wait(job, acc, only_pool, team, q, used, ckey, preempts)
        if wkey is not None and isinstance(decision, Waiting) and decision.reason == "capacity":
            self._wait_seen[wkey] = (stamp, decision.verdict())
            if decision.message is _DEFERRED:
                self._deferred_seen.append(wkey)
        return decision

    def _place_or_wait(self, job: QueuedJob, acc: int, only_pool: int | None, team: TeamState, q: TeamQuota,
                       used: int, ckey: tuple, preempts: bool) -> Decision:
        """The rest of ``_evaluate_on`` once quota allows ``job``: pools, caps, the cohort, nodes, victims, budget.

        A capacity wait depends only on the team's usage, on what was released
        since (preemptions) and, for a job that may preempt, on its cohort's
        usage: admissions only take nodes away, so ``_evaluate_on`` reuses it
        for the next job of the same team and shape until one of those changes.
        For a job that will not preempt, of a team without per-cluster caps,
        it depends on the nodes alone once the cohort has room for the GPUs:
        it is reused for every such team's job of the same shape until a
        release on the accelerator.
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
        n, g, c, m = shape
        if known is not None and known[0] == version:
            for fn, fg, fc, fm in known[1]:
                if n >= fn and g >= fg and c >= fc and m >= fm:
                    return None
        found = self._search_victims(job, acc, team, q, pools, fits_nowhere)
        if found is None:
            if known is None or known[0] != version:
                known = (version, [])
                self._no_victims[key] = known
            lst = known[1]  # the least shapes known to find none: one that covers another replaces it
            lst[:] = [s for s in lst if not (s[0] >= n and s[1] >= g and s[2] >= c and s[3] >= m)]
            lst.append(shape)
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
        elif team.budgets:
            self.queues[team.team_id].version += 1  # but its money is committed: what read the budgets is stale
        ckey = (acc, a.offer.cluster_id)
        if ckey in team.cluster_caps:
            team.cluster_used[ckey] = team.cluster_used.get(ckey, 0) + job.total_gpus
        if team.budgets:
            team.budgets = [BudgetView(b.budget_id, b.amount_usd, b.spent_usd, b.committed_usd + a.estimate_usd,
                                       b.action) for b in team.budgets]

    # --- passes ---------------------------------------------------------------------------

    def _run(self, heap: list, out: Decisions) -> None:
        """Pop the team whose head comes first, decide that head, push the team back with its next head.

        A decision that admits nothing is remembered by what ``evaluate``
        reads of the job (its team, accelerators, shape and constraints, and
        its run time when the team has budgets: the estimate; priority,
        submission and id play no part), with what it read of the state
        (``_stamp``); the next job of the same key gets the same decision at
        once (a full queue waits in a few dictionary looks) while that stamp
        holds.
        """
        self._deferred = []
        try:
            self._loop(heap, out)
        finally:
            self._fill_deferred(out)

    def _loop(self, heap: list, out: Decisions) -> None:
        """``_run``'s loop."""
        queues = self.queues
        decided = self._decided
        decided.clear()
        released, cohort_version, borrowed = self._released, self._cohort_version, self.borrowed
        self._runs += 1  # a capacity wait's numbers are a run's (``_evaluate_on``): the state may change between runs
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
            jobs, team, pos, last = tq.jobs, tq.team, tq.pos, len(tq.jobs) - 1
            strict = team.strategy == STRICT_FIFO
            while True:  # this team's jobs, while its next head still comes before every other team's
                job = jobs[pos]
                dkey = (tid, job.accelerator_id, job.alternatives, job.shape,
                        job.max_runtime_seconds if team.budgets else 0)
                known = decided.get(dkey)
                if known is not None and (
                        known[0] == tq.version and released.get(job.accelerator_id, 0) == known[1]
                        and (known[2] is None or (cohort_version.get(known[2], 0) == known[3] if known[4] is None
                                                  else borrowed.get(known[2], 0) <= known[4]))
                        if known[1] is not None else known[0] == self._epoch):
                    same = known[5]
                    decision = (Waiting(job, same.reason, same.message, same.detail) if isinstance(same, Waiting)
                                else Rejection(job, same.verdict))
                else:
                    decision = (self.evaluate(job) if job.alternatives
                                else self._evaluate_on(job, job.accelerator_id, None))
                    if not isinstance(decision, Admission):  # nothing changed: the state it read is the state now
                        decided[dkey] = (*self._stamp(job, tq, decision), decision)
                if isinstance(decision, Waiting):
                    waiting[job.job_id] = decision
                    if strict and not decision.detail.get("never_placeable"):
                        tq.blocked = decision
                        entry = heappop(heap) if heap else None
                        break
                    tq.waiting_before.append(job)
                elif isinstance(decision, Admission):
                    self._admit(decision)
                    out.admissions.append(decision)
                else:
                    out.rejections.append(decision)
                pos += 1
                tq.pos = pos
                if pos > last:
                    entry = heappop(heap) if heap else None
                    break
                nxt = jobs[pos]  # ``_key``, inline: the order between teams by their heads
                key = (-nxt.priority, share[tid], nxt.submitted, nxt.job_id)
                if heap and heap[0][0] < key:  # another team's head comes first (``heappushpop`` would return it)
                    entry = heappushpop(heap, (key, tq.version, tid))
                    break
        decided.clear()

    def _stamp(self, job: QueuedJob, tq: TeamQueue, decision: Decision) -> tuple:
        """What ``decision`` (one that admits ``job``, its team's head of queue ``tq``, nothing) depends on, as
        ``(team version, releases on its accelerator, cohort key or None, that cohort's version or None, most
        borrowed GPUs the cohort may hold or None)``; the loop reuses it for a job of the same key while the state
        still matches.

        Within a run of the loop, bookings only take room, quota and money
        away; only a release (a preemption: ``_released``) gives any back. So
        a job that waits or is rejected keeps that decision until its own
        team's usage or money changes (``TeamQueue.version``) or something is
        released on its accelerator, with, by what the decision read of the
        cohort:

        - a job within its nominal quota (one that may preempt: more teams
          borrowing make more victims eligible), or a wait because the
          cohort cannot lend (its message gives the cohort's numbers): until
          the cohort's usage changes (its version);
        - a capacity wait of a job that will not preempt, decided with room
          in the cohort: while the cohort's borrowed GPUs stay at most what
          still leaves room for the job (else it waits for the cohort);
        - a wait for the team's own quota or per-cluster caps, a rejection,
          a wait for a price or a node pool that matches: none.

        A budget wait depends on where the job would run (the estimate of the
        cheapest pool with room, or of a pool freed by victims), so on every
        booking; as does any decision of a job with accelerator alternatives,
        which reads several accelerators: their stamp is the number of
        bookings (``(epoch, None, None, None, None)``).
        """
        if job.alternatives:
            return (self._epoch, None, None, None, None)
        acc = job.accelerator_id
        released = self._released.get(acc, 0)
        if isinstance(decision, Rejection):
            return (tq.version, released, None, None, None)
        if decision.reason == "budget":
            return (self._epoch, None, None, None, None)
        team = tq.team
        q = team.quotas.get(acc)
        gpus = self._amount(job, acc, team)
        if q is None or not gpus:
            return (tq.version, released, None, None, None)
        ckey = (team.cohort, acc)
        used = team.used.get(acc, 0)
        detail = decision.detail
        if (self._preempts(job, used, gpus, q)
                or "cohort_lendable_gpus" in detail or "cohort_lendable_vcpus" in detail):
            return (tq.version, released, ckey, self._cohort_version.get(ckey, 0), None)
        if decision.reason == "capacity":
            g = q.guaranteed_gpus
            needs = max(0, used + gpus - g) - max(0, used - g)  # what admitting it adds to the cohort's borrowed
            return (tq.version, released, ckey, None, self.lendable.get(ckey, 0) - needs)
        return (tq.version, released, None, None, None)

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
