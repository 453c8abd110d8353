"""The scheduling cycle: a snapshot of teams, quotas, pools and jobs in; admissions, rejections and waits out.

Kueue's ClusterQueue/Cohort model (nominal quota, borrowing and lending limits, BestEffortFIFO between teams,
StrictFIFO within one) plus money budgets; no Django import, so a pass over 100,000 jobs stays in memory. The
parts, each in its module:

- ``cohort``: usage, the cohorts' lendable pools, fair shares and the generations that say what changed;
- ``evaluate``: one job's evaluation (never-rules, quota, pools, cohort, nodes, victims, budget);
- ``room``: which pools could hold a job and where it fits now; ``preemption``: victim search;
- ``memo``: what the scheduler remembers, stamped with generations (``NullMemo`` remembers nothing);
- ``order``: the order between teams and within one; ``positions``: the waiting jobs' queue positions.

A full pass (``FairShareScheduler.full_pass``):

1. every team's queue, in its order, goes on a heap keyed by its head (priority, the team's dominant share,
   submission time, id) and the team's generation;
2. the team whose head comes first is popped; a stale entry (the team's generation moved on) is pushed back
   with its key now;
3. its head is decided: by a decision remembered for a job of the same key while its stamp holds
   (``memo.DecisionMemo.stamp``), else by ``evaluate.Evaluator``; a decision that admits nothing is
   remembered;
4. an admission is booked at once (its victims released, usage, nodes, per-cluster use, committed money), so
   the next decision sees it; a rejection is final; a waiting head of a StrictFIFO team blocks its team;
5. the team goes on with its next job while that job still comes before every other team's head, else it is
   pushed back on the heap;
6. when the heap is empty, the no-room verdicts of the run get the nodes' numbers as after it, the jobs
   behind a blocked head wait (or are rejected if they can never run), and every waiting job is numbered.

An incremental pass (``submit``) runs steps 2-6 for the one team that got a job. Rules: see ``rules``;
sources: Kueue docs "Cluster Queue", "Preemption", "Fair Sharing".
"""

from __future__ import annotations

import bisect
import gc
import heapq

from .cohort import CohortBook
from .evaluate import Evaluator, amount_of, may_preempt
from .fragmentation import job_milli
from .memo import DecisionMemo
from .nodebook import DEFAULT_PACKING_POLICY, NodeBook, workload_of
from .order import TeamQueue, behind, behind_message, note_overtaking, team_key
from .positions import Positions
from .preemption import VictimSearch, victims_were_borrowing
from .room import Room
from .types import Admission, Assessment, BudgetView, Decision, Decisions, QueuedJob, Rejection, Snapshot, Waiting

STRICT_FIFO = "StrictFIFO"
BEST_EFFORT_FIFO = "BestEffortFIFO"
#: Kueue's queueing strategies, the default first.
QUEUEING_STRATEGIES = (BEST_EFFORT_FIFO, STRICT_FIFO)


class FairShareScheduler:
    """The pure scheduler over one Snapshot: ``full_pass()``, then ``submit(job)`` for incremental passes.

    The snapshot's ``used`` and the nodes' free resources (``book``) are updated in place as decisions are made,
    so a later ``submit`` sees the state after them. ``policy``: the packing policy (default: the snapshot's);
    ``memo``: what to remember decisions in (default: a new ``memo.DecisionMemo``; ``memo.NullMemo()`` decides
    everything afresh, with the same decisions).
    """

    def __init__(self, snapshot: Snapshot, policy: str | None = None, memo: DecisionMemo | None = None):
        self.teams = snapshot.teams
        self.memo = memo = DecisionMemo() if memo is None else memo
        self.cohorts = CohortBook(snapshot.teams)
        self.queues: dict[int, TeamQueue] = {tid: TeamQueue(t) for tid, t in snapshot.teams.items()}
        policy = policy or snapshot.policy or DEFAULT_PACKING_POLICY
        workload = snapshot.workload or (workload_of([*snapshot.queue, *snapshot.running]) if policy == "fgd" else ())
        self.book = NodeBook([o for offers in snapshot.pools.values() for o in offers], policy, workload,
                             seen=lambda: seen_shapes(snapshot))
        self.pool_cluster: dict[int, int] = {o.node_pool_id: o.cluster_id for offers in snapshot.pools.values()
                                             for o in offers}
        self.room = Room(snapshot.pools, snapshot.unpriced, self.book, self.cohorts, memo)
        self.victims = VictimSearch(snapshot.running, self.teams, self.book, self.cohorts, memo)
        self.evaluator = Evaluator(self.teams, self.cohorts, self.room, self.victims, memo)
        self.positions = Positions(snapshot.queue)
        for job in self.positions.in_order:
            self.queues[job.team_id].jobs.append(job)

    @property
    def share(self) -> dict[int, float]:
        """Dominant share by team id (``order.dominant_share``)."""
        return self.cohorts.share

    @property
    def order(self) -> list[tuple]:
        """The waiting jobs' overall order keys (priority, submission, id), sorted."""
        return self.positions.order

    @property
    def preempted(self) -> set[int]:
        """Ids of the running jobs this scheduler's admissions preempted."""
        return self.victims.preempted

    def evaluate(self, job: QueuedJob, *, only_pool: int | None = None) -> Decision:
        """``evaluate.Evaluator.evaluate`` on the state now (nothing changes)."""
        return self.evaluator.evaluate(job, only_pool=only_pool)

    def assess(self, job: QueuedJob) -> Assessment:
        """``evaluate.Evaluator.assess`` on the state now (nothing changes)."""
        return self.evaluator.assess(job)

    # --- booking a decision ----------------------------------------------------------------------------

    def admit(self, a: Admission) -> None:
        """Book ``a`` (an ``evaluate`` answer on this state) as a pass does: its victims released (their teams'
        usage, nodes and per-cluster use), its team's usage, its nodes, its per-cluster use and its budgets'
        committed money. Later decisions see it."""
        cohorts, book, teams = self.cohorts, self.book, self.teams
        job = a.job
        acc = a.accelerator_id or job.accelerator_id
        for v in a.victims:
            self.victims.take(v)
            book.release(v.node_pool_id, v.node_names, v.gpus, v.gpus_per_node, v.cpu_milli, v.memory_mib)
            cohorts.release(v.accelerator_id)
            owner = teams[v.team_id]
            cohorts.use(owner, v.accelerator_id, -v.gpus)
            ckey = (v.accelerator_id, self.pool_cluster.get(v.node_pool_id))
            if ckey in owner.cluster_used:
                owner.cluster_used[ckey] -= v.gpus
        pool = book.pools[a.offer.node_pool_id]
        if job.roles:  # a multi-role job: each role's nodes with its own shape
            requests = dict(job.role_requests())
            for name, names in a.role_nodes:
                book.take(a.offer.node_pool_id, [pool.index[n] for n in names], requests[name])
        else:
            book.take(a.offer.node_pool_id, [pool.index[n] for n in a.node_names], job.placement(), a.gpu_index)
        cohorts.book(acc)
        team = teams[job.team_id]
        amount = amount_of(job, acc, team)
        if amount or not job.cpu_only:
            cohorts.use(team, acc, amount)  # a quota-free CPU-only job counts nothing
        elif team.budgets:
            cohorts.touch(team.team_id)  # but its money is committed: what read the budgets is stale
        ckey = (acc, a.offer.cluster_id)
        if ckey in team.cluster_caps:
            team.cluster_used[ckey] = team.cluster_used.get(ckey, 0) + job.quota_gpus
        if team.budgets:
            team.budgets = [BudgetView(b.budget_id, b.amount_usd, b.spent_usd, b.committed_usd + a.estimate_usd,
                                       b.action) for b in team.budgets]

    # --- the loop ---------------------------------------------------------------------------------------

    def _run(self, heap: list, out: Decisions) -> None:
        """Steps 2 to 5 until the heap is empty, then the first part of step 6."""
        self.room.start_run()
        try:
            self._loop(heap, out)
        finally:
            self.room.end_run(out.waiting)

    def _loop(self, heap: list, out: Decisions) -> None:
        """``_run``'s loop. A decision that admits nothing is remembered by what the evaluation reads of the job
        (its team, accelerators, shape and constraints, and its run time when the team has budgets: the
        estimate; priority, submission and id play no part), so a full queue waits in a few dictionary looks."""
        queues, cohorts, memo = self.queues, self.cohorts, self.memo
        decided = memo.decided
        decided.clear()
        team_gen, released, cohort_gen, borrowed = (cohorts.team_gen, cohorts.released, cohorts.cohort_gen,
                                                    cohorts.borrowed)
        cohorts.runs += 1  # a capacity wait's numbers are a run's: the state may change between runs
        share = cohorts.share
        evaluate, evaluate_on, stamp = self.evaluator.evaluate, self.evaluator.evaluate_on, memo.stamp
        waiting = out.waiting
        heads: dict[int, Waiting] = {}  # team id -> its first waiting job in this run (``note_overtaking``)
        headed: set[int] = set()  # the teams that had one
        heappop, heappushpop = heapq.heappop, heapq.heappushpop
        entry = heappop(heap) if heap else None
        while entry is not None:
            _key, gen, tid = entry
            tq = queues[tid]
            if tq.blocked is not None or tq.pos >= len(tq.jobs):
                entry = heappop(heap) if heap else None
                continue
            if gen != team_gen[tid]:  # step 2: stale
                entry = heappushpop(heap, (team_key(tq.jobs[tq.pos], share[tid]), team_gen[tid], tid))
                continue
            jobs, team, pos, last = tq.jobs, tq.team, tq.pos, len(tq.jobs) - 1
            strict = team.strategy == STRICT_FIFO
            while True:  # this team's jobs, while its next head still comes before every other team's
                job = jobs[pos]
                acc = job.accelerator_id
                dkey = (tid, acc, job.alternatives, job.shape, job.max_runtime_seconds if team.budgets else 0)
                known = decided.get(dkey)
                # step 3; ``DecisionMemo.holds``, inline
                if known is not None and (
                        known[0] == team_gen[tid] and released.get(acc, 0) == known[1]
                        and (known[2] is None or (cohort_gen.get(known[2], 0) == known[3] if known[4] is None
                                                  else borrowed.get(known[2], 0) <= known[4]))
                        if known[1] is not None else known[0] == cohorts.epoch):
                    same = known[5]
                    decision = (Waiting(job, same.reason, same.message, same.detail) if isinstance(same, Waiting)
                                else Rejection(job, same.verdict))
                else:
                    decision = evaluate(job) if job.alternatives else evaluate_on(job, acc, None)
                    if not isinstance(decision, Admission):  # nothing changed: the state it read is the state now
                        q = team.quotas.get(acc)
                        amount = amount_of(job, acc, team)
                        preempts = q is not None and may_preempt(job, team.used.get(acc, 0), amount, q)
                        decided[dkey] = (*stamp(job, team_gen[tid], decision, cohorts, amount, q, preempts), decision)
                if isinstance(decision, Waiting):  # step 4
                    waiting[job.job_id] = decision
                    if tid not in headed and not decision.detail.get("never_placeable"):
                        headed.add(tid)
                        heads[tid] = decision  # the team's first waiting job: what a later admission overtakes
                    if strict and not decision.detail.get("never_placeable"):
                        tq.blocked = decision
                        entry = heappop(heap) if heap else None
                        break
                    tq.waiting_before.append(job)
                elif isinstance(decision, Admission):
                    self.admit(decision)
                    out.admissions.append(decision)
                    if heads:
                        note_overtaking(decision, heads)
                else:
                    out.rejections.append(decision)
                pos += 1
                tq.pos = pos
                if pos > last:
                    entry = heappop(heap) if heap else None
                    break
                nxt = jobs[pos]  # step 5: ``order.team_key``, inline
                key = (-nxt.priority, share[tid], nxt.submitted, nxt.job_id)
                if heap and heap[0][0] < key:  # another team's head comes first (``heappushpop`` would return it)
                    entry = heappushpop(heap, (key, team_gen[tid], tid))
                    break
        decided.clear()

    def _finish_team(self, tq: TeamQueue, out: Decisions) -> None:
        """Step 6: behind a blocked head, reject what can never run; the rest waits (reason ``priority``)."""
        if tq.blocked is None:
            return
        kept = tq.jobs[:tq.pos + 1]
        message = behind_message(tq.blocked)
        for job in tq.jobs[tq.pos + 1:]:
            never = self.evaluator.never(job)
            if never is not None:
                out.rejections.append(Rejection(job, never))
                continue
            kept.append(job)
            out.waiting[job.job_id] = behind(job, tq.blocked, message)
        tq.jobs = kept

    # --- passes -----------------------------------------------------------------------------------------

    def full_pass(self) -> Decisions:
        """Decide every queued job once; returns admissions (with victims), rejections and waiting reasons.

        The cyclic garbage collector is paused meanwhile: the pass allocates one reason per waiting job and
        creates no cycles, and generation-2 collections over a 100,000-job heap would otherwise dominate its time.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            out = Decisions()
            gens = self.cohorts.team_gen
            heap = [(team_key(tq.jobs[tq.pos], self.cohorts.share[tid]), gens[tid], tid)  # step 1
                    for tid, tq in self.queues.items() if tq.jobs]
            heapq.heapify(heap)
            self._run(heap, out)
            for tq in self.queues.values():
                self._finish_team(tq, out)
            self.positions.number(out, self.queues)
            return out
        finally:
            if was_enabled:
                gc.enable()

    def submit(self, job: QueuedJob) -> Decisions:
        """Incremental pass after one new submission: only ``job``'s team is looked at again.

        Other teams' heads stay blocked (a submission only takes resources away). Jobs already waiting behind
        a blocked head keep their stored reason and position until the next full pass renumbers them.
        """
        out = Decisions()
        self.book.observe(job.gpus_per_node, job.share_milli, job.cpu_milli, job.memory_mib, job.submitted)
        tid = job.team_id
        tq = self.queues.get(tid)
        if tq is None:
            tq = self.queues[tid] = TeamQueue(self.teams[tid])
        at = bisect.bisect(tq.jobs, job.order_key(), lo=tq.pos, key=QueuedJob.order_key)
        tq.jobs.insert(at, job)
        self.positions.submitted = True
        if tq.blocked is not None and at > tq.pos:
            never = self.evaluator.never(job)
            if never is not None:
                out.rejections.append(Rejection(job, never))
                tq.jobs.pop(at)
                return out
            out.waiting[job.job_id] = behind(job, tq.blocked)
        else:
            old = tq.blocked
            tq.blocked = None
            self.cohorts.touch(tid)
            self._run([(team_key(tq.jobs[tq.pos], self.cohorts.share[tid]), self.cohorts.team_gen[tid], tid)], out)
            if old is not None:
                self.positions.drop(old.job.order_key())
                if tq.blocked is not None and old.job.job_id not in out.waiting:
                    out.waiting[old.job.job_id] = behind(old.job, tq.blocked)
        self.positions.number_new(out, tq)
        return out


def decide(snapshot: Snapshot, memo: DecisionMemo | None = None) -> Decisions:
    """One full pass over ``snapshot`` (see the module docstring for the steps, ``rules`` for the rules)."""
    return FairShareScheduler(snapshot, memo=memo).full_pass()


def recheck(snapshot: Snapshot, job: QueuedJob, admission: Admission) -> Decision:
    """The decision for ``job`` alone, as its team's head, on ``snapshot`` read again when ``admission`` (the pass's
    decision for it) commits: the same rules, on fresh numbers.

    The admission's victims are already ended in ``snapshot`` (their teams' usage and their nodes' free
    resources no longer count them); each victim's team must have been borrowing before the removal, and a
    preempting admission goes to the pool its victims freed or waits. The snapshot's own running jobs are
    candidates for preemption as in a pass (none, for a re-check that only verifies).
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


def seen_shapes(snapshot: Snapshot):
    """What the platform has seen of GPU task shapes, from a snapshot: ``(milli-GPUs per pod, CPU millicores per
    pod, memory MiB per pod, seen at)`` of every waiting job (at its submission) and every live one (at its
    admission), for ``fragmentation.ShapeHistory.of_jobs``. A multi-role job counts each role."""
    for job in snapshot.queue:
        if job.roles:
            for r in job.roles:
                yield r.gpus_per_node * 1000, r.cpu_milli, r.memory_mib, job.submitted
        else:
            yield job_milli(job.gpus_per_node, job.share_milli), job.cpu_milli, job.memory_mib, job.submitted
    for r in snapshot.running:
        yield job_milli(r.gpus_per_node, r.share_milli), r.cpu_milli, r.memory_mib, r.admitted
