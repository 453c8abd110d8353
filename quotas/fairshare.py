"""Fair-share admission as a pure core: a snapshot of teams, quotas, pools and jobs in, decisions out.

Kueue's ClusterQueue/Cohort model (nominal quota, borrowing and lending
limits, BestEffortFIFO between teams, StrictFIFO within one) plus money
budgets; no Django import, so a pass over 100,000 jobs stays in memory.

Rules (issue 4; sources: Kueue docs "Cluster Queue", "Preemption", "Fair Sharing"):

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
- Placement: ``runners.placement`` (healthy, constraints, spot only if
  preemptible, cheapest price, then most free GPUs).
- Preemption: a job that stays within its team's nominal quota but is
  blocked by the cohort pool or by capacity may preempt preemptible running
  jobs of other teams of its cohort that borrow. A victim is taken only if
  its team stays at or above its nominal after losing it (work within
  nominal is never preempted), lowest priority first, then most recently
  admitted; unneeded victims are pruned (Kueue's minimal set). Preemptors end
  within nominal and victims' teams above it, so preemption cannot cycle;
  victims are not requeued within the pass that preempted them.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import heapq
from decimal import ROUND_HALF_EVEN, Decimal

from quotas.admission import BudgetView, QuotaView, Verdict, check_budgets, check_quota
from runners.placement import PlacementRequest, PoolOffer, matches

ESTIMATE_QUANTUM = Decimal("0.000001")
_3600 = Decimal(3600)


def estimate_cost(total_gpus: int, max_runtime_seconds: int, usd_per_gpu_hour: Decimal) -> Decimal:
    """Worst-case cost of an attempt, USD: GPUs x max_runtime (s) / 3600 x price (USD/GPU-hour), to 1e-6 half-even."""
    return (Decimal(total_gpus) * Decimal(max_runtime_seconds) * usd_per_gpu_hour / _3600).quantize(
        ESTIMATE_QUANTUM, ROUND_HALF_EVEN
    )


@dataclasses.dataclass(slots=True)
class QueuedJob:
    """A waiting job: ``nodes`` x ``gpus_per_node`` GPUs of one accelerator, its priority (higher first),
    submission time (seconds, any monotonic epoch), max runtime (s) and placement constraints."""

    job_id: int
    team_id: int
    accelerator_id: int
    nodes: int
    gpus_per_node: int
    priority: int = 500
    submitted: float = 0.0
    preemptible: bool = False
    max_runtime_seconds: int = 3600
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    recovering: bool = False
    key: tuple = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.key = (-self.priority, self.submitted, self.job_id)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def order_key(self) -> tuple:
        """A team's queue order: priority high first, then submission time, then id."""
        return self.key

    def placement(self) -> PlacementRequest:
        return PlacementRequest(self.nodes, self.gpus_per_node, self.preemptible, self.providers, self.regions,
                                self.clusters)


@dataclasses.dataclass(slots=True)
class RunningJob:
    """A live attempt that holds ``gpus`` GPUs on ``node_pool_id``; ``admitted`` in seconds (same epoch as submissions)."""

    job_id: int
    attempt_id: int
    team_id: int
    accelerator_id: int
    node_pool_id: int
    gpus: int
    priority: int = 500
    admitted: float = 0.0
    preemptible: bool = False


@dataclasses.dataclass(slots=True)
class TeamQuota:
    """One team's quota for one accelerator, GPUs: nominal, borrowing limit, lending limit (None = all of
    nominal is lendable), per-job cap (0 = none)."""

    nominal_gpus: int
    borrowing_limit_gpus: int = 0
    lending_limit_gpus: int | None = None
    max_gpus_per_job: int = 0

    @property
    def lendable_gpus(self) -> int:
        if self.lending_limit_gpus is None:
            return self.nominal_gpus
        return min(self.lending_limit_gpus, self.nominal_gpus)

    @property
    def guaranteed_gpus(self) -> int:
        """The part of nominal the team never lends."""
        return self.nominal_gpus - self.lendable_gpus


@dataclasses.dataclass(slots=True)
class TeamState:
    """A team: cohort key (None = the default cohort), weight (> 0), quotas and live usage by accelerator id (GPUs),
    and its budgets in force (USD)."""

    team_id: int
    cohort: object = None
    weight: float = 1.0
    quotas: dict[int, TeamQuota] = dataclasses.field(default_factory=dict)
    used: dict[int, int] = dataclasses.field(default_factory=dict)
    budgets: list[BudgetView] = dataclasses.field(default_factory=list)
    #: Per-cluster caps, GPUs, by (accelerator id, cluster id): the team's nominal + borrowing limit there
    #: (a ``Quota`` row with a cluster). Only clusters listed are capped; the team-wide quota still applies.
    cluster_caps: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    #: Live GPUs by (accelerator id, cluster id), for the capped clusters.
    cluster_used: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Snapshot:
    """Everything one pass needs: teams by id, node pools by accelerator id (free GPUs now, price),
    the waiting jobs and the live attempts (for preemption)."""

    teams: dict[int, TeamState]
    pools: dict[int, list[PoolOffer]]
    queue: list[QueuedJob]
    running: list[RunningJob] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class Admission:
    """Admit ``job`` on ``offer`` at ``estimate_usd``, after preempting ``victims`` (usually none)."""

    job: QueuedJob
    offer: PoolOffer
    estimate_usd: Decimal
    victims: tuple[RunningJob, ...] = ()


@dataclasses.dataclass(slots=True)
class Rejection:
    """``job`` can never run (no quota, over a cap or limit, over a whole block budget)."""

    job: QueuedJob
    verdict: Verdict


@dataclasses.dataclass(slots=True)
class Waiting:
    """``job`` stays queued: ``reason`` (quota, budget, capacity, priority), a message, the numbers, and its
    1-based position in its team's queue and among all waiting jobs."""

    job: QueuedJob
    reason: str
    message: str
    detail: dict
    team_position: int = 0
    overall_position: int = 0

    def info(self) -> dict:
        """The job's ``queue_info``: reason, message, numbers and ``position`` {team, overall}."""
        return {"reason": self.reason, "message": self.message, **self.detail,
                "position": {"team": self.team_position, "overall": self.overall_position}}


@dataclasses.dataclass
class Decisions:
    """The outcome of a pass, in decision order."""

    admissions: list[Admission] = dataclasses.field(default_factory=list)
    rejections: list[Rejection] = dataclasses.field(default_factory=list)
    waiting: dict[int, Waiting] = dataclasses.field(default_factory=dict)

    @property
    def preemptions(self) -> list[tuple[RunningJob, int]]:
        """``(victim, preemptor job id)`` pairs."""
        return [(v, a.job.job_id) for a in self.admissions for v in a.victims]


def cohort_has_room(pool_gpus: int, borrowed_gpus: int, team_used: int, team_guaranteed: int, request: int) -> bool:
    """Whether ``request`` more GPUs for a team keep the cohort's borrowed GPUs within its lendable pool.

    ``borrowed_gpus`` = sum over the cohort of max(0, used - guaranteed); the
    team's own share of it changes from max(0, used - g) to max(0, used + request - g).
    """
    after = borrowed_gpus - max(0, team_used - team_guaranteed) + max(0, team_used + request - team_guaranteed)
    return after <= pool_gpus


class _TeamQueue:
    __slots__ = ("team", "jobs", "pos", "blocked", "version", "waiting_before")

    def __init__(self, team: TeamState):
        self.team = team
        self.jobs: list[QueuedJob] = []
        self.pos = 0
        self.blocked: Waiting | None = None
        self.version = 0
        self.waiting_before: list[QueuedJob] = []  # passed over without blocking (no pool can ever hold them)


class FairShareScheduler:
    """The pure scheduler over one Snapshot: ``full_pass()``, then ``submit(job)`` for incremental passes.

    The snapshot's ``used`` and pool free GPUs are updated in place as
    decisions are made, so a later ``submit`` sees the state after them.
    """

    def __init__(self, snapshot: Snapshot):
        self.teams = snapshot.teams
        self.queues: dict[int, _TeamQueue] = {tid: _TeamQueue(t) for tid, t in snapshot.teams.items()}
        self._pools: dict[int, list[PoolOffer]] = snapshot.pools
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
        self.share: dict[int, float] = {tid: self._dominant_share(t) for tid, t in self.teams.items()}
        for job in sorted(snapshot.queue, key=QueuedJob.order_key):
            self.queues[job.team_id].jobs.append(job)
        # Preemption candidates by (cohort, accelerator), in victim order: lowest priority, then latest admitted.
        self.candidates: dict[tuple, list[RunningJob]] = {}
        for r in snapshot.running:
            if r.preemptible and r.team_id in self.teams:
                self.candidates.setdefault((self.teams[r.team_id].cohort, r.accelerator_id), []).append(r)
        for lst in self.candidates.values():
            lst.sort(key=lambda r: (r.priority, -r.admitted, -r.job_id))
        self.order: list[tuple] = []  # waiting jobs' overall order keys (priority, submission, id)
        self.preempted: set[int] = set()

    # --- shares and order -----------------------------------------------------------------

    def _dominant_share(self, team: TeamState) -> float:
        """max over accelerators of borrowed / cohort lendable, divided by weight (Kueue's DRS)."""
        share = 0.0
        for acc, used in team.used.items():
            q = team.quotas.get(acc)
            above = used - (q.nominal_gpus if q else 0)
            if above > 0:
                pool = self.lendable.get((team.cohort, acc), 0)
                share = max(share, above / pool if pool else float("inf"))
        return share / team.weight if team.weight > 0 else float("inf")

    def _team_key(self, tq: _TeamQueue) -> tuple:
        head = tq.jobs[tq.pos]
        return (-head.priority, self.share[tq.team.team_id], head.submitted, head.job_id)

    # --- placement ------------------------------------------------------------------------

    def _matching_pools(self, job: QueuedJob) -> list[PoolOffer]:
        key = (job.accelerator_id, job.nodes, job.gpus_per_node, job.preemptible, job.providers, job.regions,
               job.clusters)
        found = self._matching.get(key)
        if found is None:
            request = job.placement()
            found = sorted((o for o in self._pools.get(job.accelerator_id, ()) if matches(request, o)),
                           key=lambda o: (o.usd_per_gpu_hour, o.cluster_name, o.node_pool_id))
            self._matching[key] = found
        return found

    def _choose(self, pools: list[PoolOffer], gpus: int) -> PoolOffer | None:
        """``runners.placement.choose_pool`` over a price-sorted list: cheapest with room, then most free GPUs."""
        best = None
        free = self.free
        for o in pools:
            if best is not None and o.usd_per_gpu_hour != best.usd_per_gpu_hour:
                break
            f = free[o.node_pool_id]
            if f >= gpus and (best is None or f > free[best.node_pool_id]):
                best = o
        return best

    # --- one job ------------------------------------------------------------------------

    def _never(self, job: QueuedJob) -> Verdict | None:
        """The verdict that rejects ``job`` for good, or None (quota never-rules, then a whole block budget)."""
        team = self.teams[job.team_id]
        q = team.quotas.get(job.accelerator_id)
        gpus = job.total_gpus
        if q is None:
            return check_quota(gpus, 0, None)
        limit = q.nominal_gpus + q.borrowing_limit_gpus
        if gpus > limit or (q.max_gpus_per_job and gpus > q.max_gpus_per_job):
            return check_quota(gpus, team.used.get(job.accelerator_id, 0), _view(q))
        if team.budgets:
            pools = self._matching_pools(job)
            if pools:
                cheapest = estimate_cost(gpus, job.max_runtime_seconds, pools[0].usd_per_gpu_hour)
                for b in team.budgets:
                    if b.action == "block" and cheapest > b.amount_usd:
                        v = check_budgets(cheapest, [b])
                        return dataclasses.replace(v, never=True)
        return None

    def _evaluate(self, job: QueuedJob):
        """Admission, Rejection or Waiting for a team's head job (a Waiting blocks the team unless never placeable)."""
        never = self._never(job)
        if never is not None:
            return Rejection(job, never)
        team = self.teams[job.team_id]
        acc = job.accelerator_id
        q = team.quotas[acc]
        gpus = job.total_gpus
        used = team.used.get(acc, 0)
        verdict = check_quota(gpus, used, _view(q))
        if not verdict.ok:
            return Waiting(job, verdict.reason, verdict.message, verdict.detail)
        pools = self._matching_pools(job)
        if not pools:
            return Waiting(job, "capacity", "no node pool can ever hold this job",
                           {"request_gpus": gpus, "free_gpus_by_pool": {}, "never_placeable": True})
        if team.cluster_caps:
            allowed = [o for o in pools if self._cluster_room(team, acc, o.cluster_id, gpus)]
            if not allowed:
                capped = sorted({o.cluster_name for o in pools})
                return Waiting(job, "quota", f"the team's per-cluster quota leaves no room for {gpus} GPUs on "
                                             f"{', '.join(capped)}",
                               {"request_gpus": gpus, "clusters": capped,
                                "cluster_quota_gpus": {o.cluster_name: team.cluster_caps[(acc, o.cluster_id)]
                                                       for o in pools if (acc, o.cluster_id) in team.cluster_caps},
                                "cluster_used_gpus": {o.cluster_name: team.cluster_used.get((acc, o.cluster_id), 0)
                                                      for o in pools if (acc, o.cluster_id) in team.cluster_caps}})
            pools = allowed
        ckey = (team.cohort, acc)
        cohort_ok = cohort_has_room(self.lendable.get(ckey, 0), self.borrowed.get(ckey, 0), used, q.guaranteed_gpus,
                                    gpus)
        offer = self._choose(pools, gpus) if cohort_ok else None
        victims: tuple[RunningJob, ...] = ()
        if offer is None and used + gpus <= q.nominal_gpus:
            found = self._find_victims(job, team, q, pools)
            if found is not None:
                offer, victims = found
        if offer is None:
            if not cohort_ok:
                pool, borrowed = self.lendable.get(ckey, 0), self.borrowed.get(ckey, 0)
                return Waiting(job, "quota",
                               f"the cohort lends {pool} GPUs and {borrowed} are borrowed; {gpus} more do not fit",
                               {"request_gpus": gpus, "used_gpus": used, "nominal_gpus": q.nominal_gpus,
                                "borrowing_limit_gpus": q.borrowing_limit_gpus,
                                "lending_limit_gpus": q.lending_limit_gpus, "cohort_lendable_gpus": pool,
                                "cohort_borrowed_gpus": borrowed})
            return Waiting(job, "capacity", "no healthy node pool matching the job has room now",
                           {"request_gpus": gpus,
                            "free_gpus_by_pool": {str(o.node_pool_id): self.free[o.node_pool_id] for o in pools}})
        estimate = estimate_cost(gpus, job.max_runtime_seconds, offer.usd_per_gpu_hour)
        verdict = check_budgets(estimate, team.budgets)
        if not verdict.ok:
            return Waiting(job, verdict.reason, verdict.message, verdict.detail)
        return Admission(job, offer, estimate, victims)

    def _find_victims(self, job, team, q, pools) -> tuple[PoolOffer, tuple[RunningJob, ...]] | None:
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
        best = None
        for offer in pools:
            cap_need = gpus - self.free[offer.node_pool_id]
            picked = self._pick(candidates, acc, offer.node_pool_id, cohort_need, cap_need)
            if picked is not None and (best is None or len(picked) < len(best[1])):
                best = (offer, tuple(picked))
        return best

    def _pick(self, candidates, acc, pool_id, cohort_need, cap_need) -> list[RunningJob] | None:
        taken: dict[int, int] = {}
        picked: list[RunningJob] = []
        for c in candidates:
            if cohort_need <= 0 and cap_need <= 0:
                break
            helps_pool = cap_need > 0 and c.node_pool_id == pool_id
            if not (cohort_need > 0 or helps_pool):
                continue
            owner = self.teams[c.team_id]
            oq = owner.quotas.get(acc)
            left = owner.used.get(acc, 0) - taken.get(c.team_id, 0) - c.gpus
            if left < (oq.nominal_gpus if oq else 0):
                continue  # would preempt work within its team's nominal quota
            picked.append(c)
            taken[c.team_id] = taken.get(c.team_id, 0) + c.gpus
            cohort_need -= c.gpus
            if c.node_pool_id == pool_id:
                cap_need -= c.gpus
        if cohort_need > 0 or cap_need > 0:
            return None
        for c in reversed(list(picked)):  # prune victims not needed (removing one never makes others ineligible)
            pool_gain = c.gpus if c.node_pool_id == pool_id else 0
            if cohort_need + c.gpus <= 0 and cap_need + pool_gain <= 0:
                picked.remove(c)
                cohort_need += c.gpus
                cap_need += pool_gain
        return picked

    @staticmethod
    def _cluster_room(team: TeamState, acc: int, cluster_id: int, gpus: int) -> bool:
        """Whether ``gpus`` more fit under the team's cap on ``cluster_id`` (no cap: yes)."""
        cap = team.cluster_caps.get((acc, cluster_id))
        return cap is None or team.cluster_used.get((acc, cluster_id), 0) + gpus <= cap

    # --- applying a decision to the in-memory state ----------------------------------------

    def _use(self, team: TeamState, acc: int, delta: int) -> None:
        q = team.quotas.get(acc)
        g = q.guaranteed_gpus if q else 0
        used = team.used.get(acc, 0)
        key = (team.cohort, acc)
        self.borrowed[key] = self.borrowed.get(key, 0) - max(0, used - g) + max(0, used + delta - g)
        team.used[acc] = used + delta
        self.share[team.team_id] = self._dominant_share(team)
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
                heapq.heappush(heap, (self._team_key(tq), tq.version, tid))
                continue
            job = tq.jobs[tq.pos]
            decision = self._evaluate(job)
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
                heapq.heappush(heap, (self._team_key(tq), tq.version, tid))

    def _finish_team(self, tq: _TeamQueue, out: Decisions) -> None:
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
        heap = [(self._team_key(tq), tq.version, tid) for tid, tq in self.queues.items() if tq.jobs]
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
            tq = self.queues[job.team_id] = _TeamQueue(self.teams[job.team_id])
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
            self._run([(self._team_key(tq), tq.version, job.team_id)], out)
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


def _view(q: TeamQuota) -> QuotaView:
    return QuotaView(q.nominal_gpus, q.borrowing_limit_gpus, q.max_gpus_per_job)


def decide(snapshot: Snapshot) -> Decisions:
    """One full pass over ``snapshot`` (see the module docstring for the rules)."""
    return FairShareScheduler(snapshot).full_pass()
