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

1. every team's queue, in its order, goes on a heap keyed by its head (priority, the team's weighted decayed
   usage, its dominant share, submission time, id: ``order.team_key``) and the team's generation;
2. the team whose head comes first is popped; a stale entry (the team's generation moved on) is pushed back
   with its key now;
3. its head is decided: by a decision remembered for a job of the same key while its stamp holds
   (``memo.DecisionMemo.stamp``), else by ``evaluate.Evaluator``; a decision that admits nothing is
   remembered;
4. an admission is booked at once (its victims released, usage, nodes, per-cluster use, committed money), so
   the next decision sees it; a rejection is final; a waiting job of a StrictFIFO team blocks its team when it
   waits for quota, the cohort or a budget, and when it waits for nodes holds from the team's later jobs the
   pools that could ever hold it (``held``: they go on elsewhere, leaving it its quota; Slurm's main scheduler);
   with backfill on (``Snapshot.now``; ``backfill``, ADR 0044) an admission that would delay a reservation
   waits, a capacity wait may run on held nodes it leaves before their reservation's start, and a job owed a
   reservation gets one: a StrictFIFO head holding one blocks its team no longer;
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

from .backfill import Backfill, Reservation
from .cohort import CohortBook
from .evaluate import Evaluator, amount_of, may_preempt
from .fragmentation import job_milli
from .memo import DecisionMemo
from .nodebook import DEFAULT_PACKING_POLICY, NodeBook, workload_of
from .order import TeamQueue, behind, behind_message, note_overtaking, team_key
from .positions import Positions
from .preemption import VictimSearch, victims_were_borrowing
from .room import Room
from .rules import check_budgets, cohort_full, cohort_has_room, cpu_cohort_full, quota_verdict, within_cluster_caps
from .scarcity import PoolDemand
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
    everything afresh, with the same decisions); ``demand``: what jobs asked per pool set, seen so far
    (``scarcity.PoolDemand``; default: the snapshot's waiting jobs), which orders pools for constraint-aware
    placement (ADR 0043); ``skip``: whether a job the loop does not remember is first screened (``_screen``, ADR
    0048) before it is evaluated; False keeps the plain path, with the same decisions.
    """

    def __init__(self, snapshot: Snapshot, policy: str | None = None, memo: DecisionMemo | None = None,
                 demand: PoolDemand | None = None, skip: bool = True):
        #: whether the loop answers the waits it can read off the memo's tables without an evaluation
        #: (``_screen``, ADR 0048); False: the plain path, every job not remembered is evaluated (same decisions)
        self.skip = skip
        #: how many decisions the screen gave (``_screen``), over this scheduler's life
        self.screened = 0
        self.teams = snapshot.teams
        self.entry_penalty = snapshot.entry_penalty
        self.memo = memo = DecisionMemo() if memo is None else memo
        self.cohorts = CohortBook(snapshot.teams, snapshot.cohort_levels)
        policy = policy or snapshot.policy or DEFAULT_PACKING_POLICY
        workload = snapshot.workload or (workload_of([*snapshot.queue, *snapshot.running]) if policy == "fgd" else ())
        # constraint-aware placement (ADR 0043): what is asked per pool set, from the waiting jobs on
        self.demand = PoolDemand(snapshot.pools, snapshot.queue) if demand is None else demand
        self.book = NodeBook([o for offers in snapshot.pools.values() for o in offers], policy, workload,
                             seen=lambda: seen_shapes(snapshot), demand=self.demand)
        self.room = Room(snapshot.pools, snapshot.unpriced, self.book, self.cohorts, memo)
        self.victims = VictimSearch(snapshot.running, self.teams, self.book, self.cohorts, memo)
        self.evaluator = Evaluator(self.teams, self.cohorts, self.room, self.victims, memo)
        self.positions = Positions(snapshot.queue)
        # a queue for each team with queued jobs, in the snapshot's order of teams (a team's queue is made when a job
        # is submitted to it); a job of a team not in the snapshot is a KeyError
        by_team: dict[int, list[QueuedJob]] = {}
        for job in self.positions.in_order:
            by_team.setdefault(job.team_id, []).append(job)
        self.queues: dict[int, TeamQueue] = {}
        for tid, team in snapshot.teams.items():
            jobs = by_team.pop(tid, None)
            if jobs is not None:
                tq = self.queues[tid] = TeamQueue(team)
                tq.jobs = jobs
        if by_team:
            raise KeyError(next(iter(by_team)))
        self.backfill = Backfill(self.book, snapshot.now, snapshot.live or snapshot.running, snapshot.reserve_after_s,
                                 snapshot.max_reservations)
        #: team id -> (its StrictFIFO head holding a reservation, that head's Waiting): what its later jobs must
        #: not delay (nodes: the reservation's hold; quota: ``_delays_head``)
        self.strict_heads: dict[int, Waiting] = {}
        #: team id -> (its StrictFIFO head waiting for capacity, the ids of the pools that it and the team's later
        #: waiting jobs could ever run on): pools the team's later jobs may not take (``_held_decision``)
        self.held: dict[int, tuple[Waiting, frozenset]] = {}

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
        usage, nodes and per-cluster use), its team's usage, its decayed usage's entry penalty, its nodes, its
        per-cluster use and its budgets' committed money. Later decisions see it."""
        cohorts, book, teams = self.cohorts, self.book, self.teams
        job = a.job
        acc = a.accelerator_id or job.accelerator_id
        for v in a.victims:
            self.victims.take(v)
            book.release(v.node_pool_id, v.node_names, v.gpus, v.gpus_per_node, v.cpu_milli, v.memory_mib)
            cohorts.release(v.accelerator_id)
            owner = teams[v.team_id]
            cohorts.use(owner, v.accelerator_id, -v.gpus)
            ckey = (v.accelerator_id, self.book.pools.cluster_of(v.node_pool_id))
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
        if self.entry_penalty and not job.cpu_only:  # fair sharing over time: the entry penalty (``usage``)
            cohorts.penalize(team, self.entry_penalty * job.quota_gpus)
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
        share, usage = cohorts.share, cohorts.usage
        evaluate, evaluate_on, stamp = self.evaluator.evaluate, self.evaluator.evaluate_on, memo.stamp
        skip, screen = self.skip and memo.remembers, self._screen
        waiting = out.waiting
        backfill = self.backfill
        held_by = self.held
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
                entry = heappushpop(heap, (team_key(tq.jobs[tq.pos], share[tid], usage[tid]), team_gen[tid], tid))
                continue
            jobs, team, pos, last = tq.jobs, tq.team, tq.pos, len(tq.jobs) - 1
            strict = team.strategy == STRICT_FIFO
            while True:  # this team's jobs, while its next head still comes before every other team's
                job = jobs[pos]
                acc = job.accelerator_id
                held = held_by.get(tid) if held_by else None
                exclude = ()
                if held is not None:  # behind a StrictFIFO head waiting for capacity: not on the pools it holds
                    exclude = self._excluded(job, held)
                    if exclude is None:  # every pool it could use is held
                        decision = behind(job, held[0])
                        waiting[job.job_id] = decision
                        tq.waiting_before.append(job)
                        pos += 1
                        tq.pos = pos
                        if pos > last:
                            entry = heappop(heap) if heap else None
                            break
                        nxt = jobs[pos]
                        key = (-nxt.priority, usage[tid], share[tid], nxt.submitted, nxt.job_id)
                        if heap and heap[0][0] < key:
                            entry = heappushpop(heap, (key, team_gen[tid], tid))
                            break
                        continue
                dkey = (tid, acc, job.alternatives, job.shape, job.max_runtime_seconds if team.budgets else 0,
                        exclude)
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
                else:  # ``_screen``: the decision an evaluation gives, read off the memo's tables where it can
                    decision = (evaluate(job, exclude=exclude) if job.alternatives
                                else screen(job, team, acc) if skip and not exclude
                                else evaluate_on(job, acc, None, exclude))
                    if not isinstance(decision, Admission):  # nothing changed: the state it read is the state now
                        q = team.quotas.get(acc)
                        amount = amount_of(job, acc, team)
                        preempts = q is not None and may_preempt(job, team.used.get(acc, 0), amount, q)
                        decided[dkey] = (*stamp(job, team_gen[tid], decision, cohorts, amount, q, preempts), decision)
                if backfill.on and not job.alternatives and (  # backfill with reservations (``backfill``)
                        backfill.held if isinstance(decision, Admission)
                        else isinstance(decision, Waiting) and decision.reason == "capacity" and (
                            backfill.open or backfill.now + job.max_runtime_seconds <= backfill.latest)):
                    decision = self._backfill(job, team, decision,
                                              strict and tid not in headed and tid not in self.strict_heads, out,
                                              exclude)
                if held is not None:
                    decision = self._held_decision(job, decision, held, exclude)
                if isinstance(decision, Waiting):  # step 4
                    waiting[job.job_id] = decision
                    if tid not in headed and not decision.detail.get("never_placeable"):
                        headed.add(tid)
                        heads[tid] = decision  # the team's first waiting job: what a later admission overtakes
                    if strict and not decision.detail.get("never_placeable") and tid not in self.strict_heads:
                        pools = self._holds(job, decision)
                        if pools is None:
                            tq.blocked = decision
                            entry = heappop(heap) if heap else None
                            break
                        held_by[tid] = (decision, pools) if held is None else (held[0], held[1] | pools)
                    tq.waiting_before.append(job)
                elif isinstance(decision, Admission):
                    if backfill.on:
                        self._admit_planned(decision)
                    else:
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
                key = (-nxt.priority, usage[tid], share[tid], nxt.submitted, nxt.job_id)
                if heap and heap[0][0] < key:  # another team's head comes first (``heappushpop`` would return it)
                    entry = heappushpop(heap, (key, team_gen[tid], tid))
                    break
        decided.clear()

    def _screen(self, job: QueuedJob, team, acc: int) -> Decision:
        """``evaluate.Evaluator.evaluate_on(job, acc, None)`` for ``job`` (one accelerator, its team's head, in a run
        of the loop), without an evaluation where the memo's tables already hold every fact the decision reads.

        The steps are the evaluation's, in its order; a wait no booking in the run can turn into an admission is
        answered by the same verdict object or table entry the evaluation would return:

        - the never-rules (``Evaluator.never_on``, remembered): a rejection;
        - a quota wait: the team's quota verdict for the job's amount (``memo.quota``, stamped with the team's
          generation; made and remembered as the evaluation would);
        - for a job that may preempt: its team's capacity wait for the shape while the team's and its cohort's
          generations hold and nothing was released (``memo.waits``: no victims then either);
        - else, a wait for the cohort: matching pools exist (``memo.matching``), its tree of cohorts lets it take the
          amount and its cohort's lendable pool does not (``rules.cohort_has_room``): the verdict for its amount,
          its team's usage and the cohort's borrowed amount (``memo.full``); a larger amount of the team fails the
          cohort too until one of them moves (``rules.cohort_has_room`` grows with the request), unless its quota
          stops it first;
        - or a capacity wait remembered for its accelerator and shape with this run's stamp and no release since
          (``memo.waits``), the cohort having room: nodes are only taken within the run, so what did not fit still
          does not, nor anything larger (``room.Room._place`` keeps the least shapes that did not fit).

        Otherwise the evaluation goes on from where the screen stopped (``Evaluator.place_and_remember``), so a job is
        never looked at twice. A job with several roles or a zero amount, or of a team with per-cluster caps, is
        evaluated whole. What the screen writes is what an evaluation would write."""
        ev = self.evaluator
        cpu_only = job.cpu_only
        amount = job.quota_gpus if not cpu_only else job.total_cpu_milli if acc in team.quotas else 0  # amount_of
        if job.roles or team.cluster_caps or not amount:
            return ev.evaluate_on(job, acc, None)
        tid = job.team_id
        qkey = (tid, acc, cpu_only, amount)
        never = ev._never.get(qkey, ev)
        if never is ev or (never is None and team.budgets):
            never = ev.never_on(job, acc)
        if never is not None:
            return Rejection(job, never)
        q = team.quotas[acc]  # a job asking an amount of an accelerator its team has no quota for is rejected above
        used = team.used.get(acc, 0)
        gen = ev._team_gen.get(tid, 0)
        known = ev._quota.get(qkey)
        if known is None or known[0] != gen:  # as the evaluation would find and remember it
            known = ev._quota[qkey] = (gen, quota_verdict(job, amount, used, q.view()))
        verdict = known[1]
        if verdict.ok:
            ckey = (team.cohort, acc)
            released, runs = ev._released.get(acc, 0), self.cohorts.runs
            if may_preempt(job, used, amount, q):
                wkey = (tid, (acc, job.shape))
                stamp = (gen, released, ev._cohort_gen.get(ckey, 0), runs)
                seen = ev._waits.get(wkey)
                if seen is None or seen[0] != stamp:
                    return ev.place_and_remember(job, acc, None, team, q, used, amount, ckey, True, wkey, stamp)
                verdict = seen[1]
            else:
                wkey, stamp = (acc, job.shape), (released, runs)
                lendable, borrowed = ev._lendable.get(ckey, 0), ev._borrowed.get(ckey, 0)
                room = cohort_has_room(lendable, borrowed, used, q.guaranteed_gpus, amount)
                fits = self.cohorts.fits(team, acc, amount)
                if room and fits:
                    seen = ev._waits.get(wkey)
                    if seen is None or seen[0] != stamp:
                        return ev.place_and_remember(job, acc, None, team, q, used, amount, ckey, False, wkey, stamp)
                    verdict = seen[1]
                else:
                    found = self.memo.matching.get((acc, job.shape))
                    if not fits or found is None or not found[0]:
                        return ev.place_and_remember(job, acc, None, team, q, used, amount, ckey, False, wkey, stamp)
                    fkey = (tid, acc, cpu_only, amount, used, borrowed)
                    verdict = ev._full.get(fkey)
                    if verdict is None:
                        full = cpu_cohort_full if cpu_only else cohort_full
                        verdict = ev._full[fkey] = full(job, used, q, lendable, borrowed)
        self.screened += 1
        return Waiting(job, verdict.reason, verdict.message, verdict.detail)

    # --- backfill with reservations (``backfill``, ADR 0044) ------------------------------------------------

    def _backfill(self, job: QueuedJob, team, decision: Decision, strict_head: bool, out: Decisions,
                  exclude=()) -> Decision:
        """``decision`` for ``job`` with the reservations held: an admission that would delay one waits; a capacity
        wait is admitted on held nodes it leaves by their reservation's start (``Backfill.window``), else gets a
        reservation if it is owed one (``Backfill.wants``: ``strict_head``, or waited long enough, and not behind a
        head holding pools from it); never on the pools of ``exclude`` (held for a job ahead of it in its StrictFIFO
        team)."""
        backfill = self.backfill
        end = backfill.now + job.max_runtime_seconds
        if isinstance(decision, Admission):
            held = backfill.conflict(decision.offer.node_pool_id, decision.node_names, end)
            if held is not None:
                return Waiting(job, "capacity", f"The nodes with room for it are reserved for job {held.job_id} from "
                                                f"{held.start:.0f} and it would run past then",
                               {"request_gpus": job.total_gpus, "reserved_for_job_id": held.job_id})
            head = self.strict_heads.get(job.team_id)
            if head is not None and self._delays_head(head, job, decision.accelerator_id or job.accelerator_id, end):
                return behind(job, head)
            return decision
        if decision.detail.get("never_placeable"):
            return decision
        acc = job.accelerator_id
        if end > backfill.latest and not backfill.wants(job, strict_head):
            return decision  # no reservation's start is after its end, and it is owed none
        wkey = (acc, job.shape, job.max_runtime_seconds, job.team_id if team.cluster_caps else None)
        windows = end <= backfill.latest and backfill.misses.get(wkey) != backfill.version
        # a job behind its StrictFIFO team's head that holds pools from it (``exclude``) is owed no reservation: its
        # capacity wait is shown as a wait behind that head (``_held_decision``), and a reservation it held would
        # keep nodes from the pass that no Waiting names
        wants = backfill.wants(job, strict_head) and not exclude
        if not windows and not wants:
            return decision
        pools = self.room.matching_entry(job, acc)[0]
        if team.cluster_caps and pools:
            pools = within_cluster_caps(team, job, pools, acc)[0]
        if exclude:
            pools = [o for o in pools if o.node_pool_id not in exclude]
        if not pools:
            return decision
        found = backfill.window(job, pools, wkey) if windows else None
        if found is not None:
            head = self.strict_heads.get(job.team_id)
            if head is None or not self._delays_head(head, job, acc, end):
                offer, nodes = found
                estimate = self.room.estimate(job, offer)
                if check_budgets(estimate, team.budgets).ok:
                    return Admission(job, offer, estimate, (), self.book.names(offer.node_pool_id, nodes), acc)
        if wants:
            reservation = backfill.reserve(job, pools)
            if reservation is not None:
                out.reservations[job.job_id] = reservation
                decision = Waiting(job, decision.reason, decision.message, decision.detail,
                                   overtaken_by=decision.overtaken_by, reservation=reservation)
                if strict_head and team.strategy == STRICT_FIFO:
                    self.strict_heads[job.team_id] = decision
        return decision

    # --- StrictFIFO heads waiting for capacity: the pools they hold from their team's later jobs ------------------

    def _pool_ids(self, job: QueuedJob) -> frozenset:
        """The ids of the node pools ``job`` could ever run on (``room.Room.matching_entry``), over every accelerator
        it accepts."""
        ids: tuple = ()
        for acc in job.accelerator_ids:
            ids += self.room.matching_entry(job, acc)[2]
        return frozenset(ids)

    def _holds(self, job: QueuedJob, decision: Waiting) -> frozenset | None:
        """The pools a waiting job of a StrictFIFO team (without a reservation) holds from the team's later jobs:
        those it could ever run on, when it waits for nodes (``capacity``, or behind a job ahead of it that waits
        for nodes, ``_held_decision``); None when it waits for anything else (quota, cohort, budget), which stops its
        team as before."""
        if decision.reason == "capacity" or (decision.reason == "priority"
                                             and decision.detail.get("behind_reason") == "capacity"):
            return self._pool_ids(job)
        return None

    def _excluded(self, job: QueuedJob, held: tuple[Waiting, frozenset]) -> frozenset | None:
        """The pools of ``held`` (a StrictFIFO head waiting for capacity, and the pools held) that ``job``, behind it,
        could ever use: () when none (placed as if nothing were held), None when all (it waits behind the head). A
        job ahead of the head in the queue's order (a submission of higher priority) is held by nothing."""
        if job.key < held[0].job.key:
            return ()
        mine = self._pool_ids(job)
        if not mine or not (mine & held[1]):
            return ()
        if mine <= held[1]:
            return None
        return held[1] & mine

    def _held_decision(self, job: QueuedJob, decision: Decision, held: tuple[Waiting, frozenset],
                       exclude) -> Decision:
        """``decision`` for ``job``, behind its StrictFIFO team's ``held`` head (which waits for capacity) and
        evaluated off the held pools (``exclude``): a capacity wait that the held pools could end, or that found no
        pool left, waits behind the head; an admission that would keep the head's quota short once nodes free for
        it (the team's usage with both above what its quota allows, ``rules.quota_verdict``) waits behind it too."""
        head = held[0]
        if isinstance(decision, Waiting):
            if decision.reason == "capacity" and exclude and not decision.detail.get("never_placeable"):
                return behind(job, head)
            return decision
        if isinstance(decision, Admission) and job.key > head.job.key:
            acc = decision.accelerator_id or job.accelerator_id
            first = head.job
            if acc == first.accelerator_id or acc in first.alternatives:
                team = self.teams[job.team_id]
                q = team.quotas.get(acc)
                if q is not None:
                    used = team.used.get(acc, 0) + amount_of(job, acc, team)
                    if not quota_verdict(first, amount_of(first, acc, team), used, q.view()).ok:
                        return behind(job, head)
        return decision

    def _delays_head(self, head: Waiting, job: QueuedJob, acc: int, end: float) -> bool:
        """Whether admitting ``job`` (on ``acc``, running until ``end``) behind its StrictFIFO team's reserved
        ``head`` would keep the head's quota short at its reservation's start: the job still runs then and the
        team's usage with both is above what the head's quota allows (``rules.quota_verdict``)."""
        first = head.job
        reservation: Reservation = head.reservation
        if job.key <= first.key or end <= reservation.start or acc != first.accelerator_id:
            return False
        team = self.teams[job.team_id]
        q = team.quotas.get(acc)
        if q is None:
            return False
        used = team.used.get(acc, 0) + amount_of(job, acc, team)
        return not quota_verdict(first, amount_of(first, acc, team), used, q.view()).ok

    def _admit_planned(self, a: Admission) -> None:
        """``admit`` ``a`` and book it in the backfill plan: its nodes free at now + its max run time; on held nodes
        (a ``Backfill.window`` admission) the hold gives the book what it keeps, and holds what is left after;
        its victims free nothing later."""
        backfill, job = self.backfill, a.job
        for v in a.victims:
            backfill.gone.add(v.job_id)
        pid = a.offer.node_pool_id
        index = self.book.pools[pid].index
        nodes = [index[n] for n in a.node_names]
        held = sorted({i for i in nodes if (pid, i) in backfill.held})
        if held:
            backfill.unhold(pid, held)
        self.admit(a)
        if held:
            backfill.rehold(pid, held)
        if not job.roles:
            backfill.admitted(pid, nodes, job.placement(), job.job_id, backfill.now + job.max_runtime_seconds)

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
            self.held.clear()
            gens = self.cohorts.team_gen
            heap = [(team_key(tq.jobs[tq.pos], self.cohorts.share[tid], self.cohorts.usage[tid]), gens[tid], tid)  # step 1
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

    def submit(self, job: QueuedJob, now: float | None = None) -> Decisions:
        """Incremental pass after one new submission: only ``job``'s team is looked at again.

        Other teams' heads stay blocked (a submission only takes resources away). Jobs already waiting behind
        a blocked head keep their stored reason and position until the next full pass renumbers them. ``now``
        (seconds, the snapshot's epoch): the time of the submission, for the reservations held (default: the
        snapshot's ``now``).
        """
        out = Decisions()
        if now is not None and self.backfill.on:
            self.backfill.now = max(self.backfill.now, now)
        self.book.observe(job.gpus_per_node, job.share_milli, job.cpu_milli, job.memory_mib, job.submitted)
        self.demand.observe(job, job.submitted)
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
            self._run([(team_key(tq.jobs[tq.pos], self.cohorts.share[tid], self.cohorts.usage[tid]),
                        self.cohorts.team_gen[tid], tid)], out)
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
