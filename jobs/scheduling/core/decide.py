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
- Order: priority (high first), then the team's dominant share (borrowed
  GPUs / cohort lendable GPUs, max over accelerators, / weight) lowest first,
  then submission time. A team whose head job cannot be admitted now stops
  (its own order is kept); other teams go on (best-effort FIFO). Jobs that
  can never run are rejected and do not block; nor do jobs no node pool can
  ever hold (they wait for a pool to appear).
- Gang admission: a job is placed whole on one node pool or not at all.
- Placement: healthy, constraints, spot only if preemptible, cheapest price,
  then most free GPUs.
- Preemption: see ``preemption``; victims are not requeued within the pass
  that preempted them.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import heapq

from .order import TeamQueue, dominant_share, team_key
from .placement import PoolOffer, cheapest_with_room, matches, price_order
from .preemption import choose_victims, may_preempt, victim_order, victims_keep_nominal
from .rules import (
    budget_never,
    check_budgets,
    check_quota,
    cohort_full,
    cohort_has_room,
    estimate_cost,
    never_placeable,
    no_room,
    quota_never,
    team_quota_verdict,
    within_cluster_caps,
)
from .types import (
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


class FairShareScheduler:
    """The pure scheduler over one Snapshot: ``full_pass()``, then ``submit(job)`` for incremental passes.

    The snapshot's ``used`` and pool free GPUs are updated in place as
    decisions are made, so a later ``submit`` sees the state after them.
    """

    def __init__(self, snapshot: Snapshot):
        self.teams = snapshot.teams
        self.queues: dict[int, TeamQueue] = {tid: TeamQueue(t) for tid, t in snapshot.teams.items()}
        self._pools: dict[int, list[PoolOffer]] = snapshot.pools
        self._unpriced: dict[int, list[PoolOffer]] = snapshot.unpriced
        self.free: dict[int, int] = {o.node_pool_id: o.free_gpus for offers in snapshot.pools.values() for o in offers}
        self.pool_cluster: dict[int, int] = {o.node_pool_id: o.cluster_id for offers in snapshot.pools.values()
                                             for o in offers}
        self._matching: dict[tuple, list[PoolOffer]] = {}
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
        self.share: dict[int, float] = {tid: dominant_share(t, self.lendable) for tid, t in self.teams.items()}
        for job in sorted(snapshot.queue, key=QueuedJob.order_key):
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

    def _matching_pools(self, job: QueuedJob) -> list[PoolOffer]:
        """The pools that could ever hold ``job``, in ``price_order`` (cached per job shape and constraints)."""
        key = (job.accelerator_id, job.nodes, job.gpus_per_node, job.preemptible, job.providers, job.regions,
               job.clusters)
        found = self._matching.get(key)
        if found is None:
            request = job.placement()
            found = sorted((o for o in self._pools.get(job.accelerator_id, ()) if matches(request, o)), key=price_order)
            self._matching[key] = found
        return found

    # --- one job ------------------------------------------------------------------------

    def _never(self, job: QueuedJob) -> Verdict | None:
        """The verdict that rejects ``job`` for good, or None (quota never-rules, then a whole block budget)."""
        team = self.teams[job.team_id]
        verdict = quota_never(team, job)
        if verdict is None and team.budgets:
            pools = self._matching_pools(job)
            if pools:
                cheapest = estimate_cost(job.total_gpus, job.max_runtime_seconds, pools[0].usd_per_gpu_hour)
                verdict = budget_never(cheapest, team.budgets)
        return verdict

    def evaluate(self, job: QueuedJob, *, only_pool: int | None = None) -> Decision:
        """Admission, Rejection or Waiting for ``job`` as its team's head, on the current state (nothing changes).

        A Waiting blocks the team in a pass unless its detail says
        ``never_placeable``. ``only_pool``: the job may go to that node pool
        only (a preempting admission's re-check: its victims made room there).
        """
        never = self._never(job)
        if never is not None:
            return Rejection(job, never)
        team = self.teams[job.team_id]
        acc = job.accelerator_id
        q = team.quotas[acc]
        gpus = job.total_gpus
        used = team.used.get(acc, 0)
        verdict = check_quota(gpus, used, q.view())
        if not verdict.ok:
            return Waiting.because(job, verdict)
        pools = self._matching_pools(job)
        if not pools:
            request = job.placement()
            return Waiting.because(job, never_placeable(
                job, [o for o in self._unpriced.get(job.accelerator_id, ()) if matches(request, o)]))
        if team.cluster_caps:
            pools, verdict = within_cluster_caps(team, job, pools)
            if not verdict.ok:
                return Waiting.because(job, verdict)
        if only_pool is not None:
            pools = [o for o in pools if o.node_pool_id == only_pool]
        ckey = (team.cohort, acc)
        cohort_ok = cohort_has_room(self.lendable.get(ckey, 0), self.borrowed.get(ckey, 0), used, q.guaranteed_gpus,
                                    gpus)
        offer = cheapest_with_room(pools, gpus, self.free) if cohort_ok else None
        victims: tuple[RunningJob, ...] = ()
        if offer is None and may_preempt(job, team, q):
            found = self._find_victims(job, team, q, pools)
            if found is not None:
                offer, victims = found
        if offer is None:
            if not cohort_ok:
                return Waiting.because(job, cohort_full(job, used, q, self.lendable.get(ckey, 0),
                                                        self.borrowed.get(ckey, 0)))
            return Waiting.because(job, no_room(job, pools, self.free))
        estimate = estimate_cost(gpus, job.max_runtime_seconds, offer.usd_per_gpu_hour)
        verdict = check_budgets(estimate, team.budgets)
        if not verdict.ok:
            return Waiting.because(job, verdict)
        return Admission(job, offer, estimate, victims)

    def _find_victims(self, job: QueuedJob, team: TeamState, q: TeamQuota,
                      pools: list[PoolOffer]) -> tuple[PoolOffer, tuple[RunningJob, ...]] | None:
        """The fewest preemptible borrowing jobs of other teams in the cohort whose end lets ``job`` in, and its pool."""
        acc, gpus = job.accelerator_id, job.total_gpus
        ckey = (team.cohort, acc)
        candidates = [c for c in self.candidates.get(ckey, ()) if c.team_id != team.team_id
                      and c.job_id not in self.preempted]
        if not candidates:
            return None
        used = team.used.get(acc, 0)
        g = q.guaranteed_gpus
        cohort_need = (self.borrowed.get(ckey, 0) - max(0, used - g) + max(0, used + gpus - g)
                       - self.lendable.get(ckey, 0))
        return choose_victims(candidates, pools, self.free, self.teams, acc, gpus, cohort_need)

    def assess(self, job: QueuedJob) -> Assessment:
        """What the rules say of ``job`` before it is submitted (nothing changes): where it would run, its estimate,
        and its team's quota and budget verdicts (the quota one on the team's own limit: what the cohort lends is
        decided at admission)."""
        team = self.teams[job.team_id]
        pools = self._matching_pools(job)
        offer = cheapest_with_room(pools, job.total_gpus, self.free)
        fits_now = offer is not None
        if offer is None and pools:
            offer = pools[0]  # the cheapest that could ever hold it: where it would wait for capacity
        estimate = (estimate_cost(job.total_gpus, job.max_runtime_seconds, offer.usd_per_gpu_hour)
                    if offer is not None else None)
        budget = check_budgets(estimate, team.budgets) if estimate is not None else None
        return Assessment(offer, fits_now, estimate, team_quota_verdict(team, job), budget)

    # --- applying a decision to the in-memory state ----------------------------------------

    def _use(self, team: TeamState, acc: int, delta: int) -> None:
        q = team.quotas.get(acc)
        g = q.guaranteed_gpus if q else 0
        used = team.used.get(acc, 0)
        key = (team.cohort, acc)
        self.borrowed[key] = self.borrowed.get(key, 0) - max(0, used - g) + max(0, used + delta - g)
        team.used[acc] = used + delta
        self.share[team.team_id] = dominant_share(team, self.lendable)
        self.queues[team.team_id].version += 1

    def _admit(self, a: Admission) -> None:
        job = a.job
        for v in a.victims:
            self.preempted.add(v.job_id)
            self.candidates[(self.teams[v.team_id].cohort, v.accelerator_id)].remove(v)
            self.free[v.node_pool_id] += v.gpus
            owner = self.teams[v.team_id]
            self._use(owner, v.accelerator_id, -v.gpus)
            ckey = (v.accelerator_id, self.pool_cluster.get(v.node_pool_id))
            if ckey in owner.cluster_used:
                owner.cluster_used[ckey] -= v.gpus
        self.free[a.offer.node_pool_id] -= job.total_gpus
        team = self.teams[job.team_id]
        self._use(team, job.accelerator_id, job.total_gpus)
        ckey = (job.accelerator_id, a.offer.cluster_id)
        if ckey in team.cluster_caps:
            team.cluster_used[ckey] = team.cluster_used.get(ckey, 0) + job.total_gpus
        if team.budgets:
            team.budgets = [dataclasses.replace(b, committed_usd=b.committed_usd + a.estimate_usd)
                            for b in team.budgets]

    # --- passes ---------------------------------------------------------------------------

    def _run(self, heap: list, out: Decisions) -> None:
        queues = self.queues
        while heap:
            _key, version, tid = heapq.heappop(heap)
            tq = queues[tid]
            if tq.blocked is not None or tq.pos >= len(tq.jobs):
                continue
            if version != tq.version:
                heapq.heappush(heap, (self._key(tq), tq.version, tid))
                continue
            job = tq.jobs[tq.pos]
            decision = self.evaluate(job)
            if isinstance(decision, Waiting):
                if decision.detail.get("never_placeable"):
                    tq.waiting_before.append(job)
                    out.waiting[job.job_id] = decision
                else:
                    tq.blocked = decision
                    out.waiting[job.job_id] = decision
                    continue
            elif isinstance(decision, Admission):
                self._admit(decision)
                out.admissions.append(decision)
            else:
                out.rejections.append(decision)
            tq.pos += 1
            if tq.pos < len(tq.jobs):
                heapq.heappush(heap, (self._key(tq), tq.version, tid))

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
        """Team position (team order) and overall position (priority, then submission) of every waiting job."""
        waiting = out.waiting
        for tq in self.queues.values():
            n = 0
            pending = tq.jobs[tq.pos:]
            if tq.waiting_before:
                pending = sorted(tq.waiting_before + pending, key=QueuedJob.order_key)
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
        return f"waits behind job {blocked.job.job_id}, ahead of it in its team's queue ({blocked.reason})"

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
    usage and their pool's free GPUs no longer count them); each victim's
    team must still hold its nominal quota, and a preempting admission goes
    to the pool its victims freed or waits. The snapshot's own running jobs
    are candidates for preemption as in a pass (none, for a re-check that
    only verifies).
    """
    verdict = victims_keep_nominal(snapshot.teams, job, admission.victims)
    if not verdict.ok:
        return Waiting.because(job, verdict)
    only_pool = admission.offer.node_pool_id if admission.victims else None
    return FairShareScheduler(snapshot).evaluate(job, only_pool=only_pool)


def assess(snapshot: Snapshot, job: QueuedJob) -> Assessment:
    """``FairShareScheduler.assess`` of a job not yet submitted, on ``snapshot`` (its team and the job's pools)."""
    return FairShareScheduler(snapshot).assess(job)
