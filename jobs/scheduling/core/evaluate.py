"""One job's evaluation: Admission, Rejection or Waiting for a job as its team's head, on the state now.

The steps, in the order a job meets them (the rules themselves are in ``rules``):

1. never: on every accelerator the job accepts, a quota never-rule (no quota, over the per-job cap or the
   most the team can reach) or a whole block budget rejects it for good;
2. quota: the team's usage plus the job within what it can reach (``rules.quota_verdict``), else it waits;
3. pools: the pools that could ever hold it (``room.Room.matching_entry``), within the team's per-cluster caps;
4. cohort: the cohort's lendable pool has room for what the job borrows (``rules.cohort_has_room``);
5. nodes: gang placement on the nodes of one pool (``room.Room.place``); else, for a job within its nominal
   quota, victims (``preemption.VictimSearch``); else it waits for capacity or for the cohort;
6. budget: the estimate on the pool it got is within every budget in force (``rules.check_budgets``).

A job with accelerator alternatives is evaluated on each in its order of preference; the first admission wins.
Nothing changes while a job is evaluated: ``cycle.FairShareScheduler`` books what it admits.
"""

from __future__ import annotations

from .cohort import CohortBook
from .preemption import VictimSearch
from .room import DEFERRED, Room
from .rules import (
    budget_never,
    check_budgets,
    cohort_full,
    cohort_has_room,
    cpu_cohort_full,
    job_estimate,
    quota_verdict,
    tree_full,
    within_cluster_caps,
)
from .types import (
    NO_QUOTA,
    Admission,
    Assessment,
    Decision,
    QueuedJob,
    Rejection,
    TeamQuota,
    TeamState,
    Verdict,
    Waiting,
)


def amount_of(job: QueuedJob, acc: int, team: TeamState) -> int:
    """What ``job`` counts against ``team``'s quota of ``acc``: its GPUs (``QueuedJob.quota_gpus``: a share of one
    GPU exactly, ADR 0040); for a CPU-only job its pods' CPU millicores when the team has a CPU quota, else 0
    (quota-free)."""
    if not job.cpu_only:
        return job.quota_gpus
    return job.total_cpu_milli if acc in team.quotas else 0


def may_preempt(job: QueuedJob, used: int, amount: int, quota: TeamQuota) -> bool:
    """Whether ``job`` (``amount`` GPUs, its team using ``used`` of ``quota``'s accelerator) may preempt: only a job
    that stays within its team's nominal quota does (``preemption``); a CPU-only job never does (ADR 0012), nor a
    multi-role job (ADR 0039), nor a job on part of one GPU (ADR 0040)."""
    return (not job.cpu_only and not job.roles and not job.share_milli and not job.mig_profile
            and used + amount <= quota.nominal_gpus)


class Evaluator:
    """Evaluates jobs against ``teams`` (team id -> ``TeamState``), the ``cohorts``, the fleet's ``room`` and the
    ``victims`` search, remembering in ``memo`` what the state it read lets it remember."""

    def __init__(self, teams: dict[int, TeamState], cohorts: CohortBook, room: Room, victims: VictimSearch, memo):
        self.teams, self.cohorts, self.room, self.victims = teams, cohorts, room, victims
        self._never, self._cheapest, self._quota, self._waits = memo.never, memo.cheapest, memo.quota, memo.waits
        self._full = memo.full
        # the cohort book's tables (it never replaces them), read in the hot path without an attribute look-up
        self._team_gen, self._released, self._cohort_gen = cohorts.team_gen, cohorts.released, cohorts.cohort_gen
        self._lendable, self._borrowed = cohorts.lendable, cohorts.borrowed

    def never(self, job: QueuedJob) -> Verdict | None:
        """The verdict that rejects ``job`` for good on every accelerator it accepts, or None."""
        first = None
        for acc in job.accelerator_ids:
            verdict = self.never_on(job, acc)
            if verdict is None:
                return None
            first = first or verdict
        return first

    def never_on(self, job: QueuedJob, acc: int) -> Verdict | None:
        """The verdict that rejects ``job`` for good on ``acc`` (quota never-rules, then a whole block budget by the
        cheapest pool for the job's shape), or None. Quotas and budget amounts do not change within a pass."""
        team = self.teams[job.team_id]
        amount = amount_of(job, acc, team)
        key = (job.team_id, acc, job.cpu_only, amount)
        verdict = self._never.get(key, self)
        if verdict is self:
            q = team.quotas.get(acc)
            verdict = quota_verdict(job, amount, 0, q.view() if q is not None else None)
            if verdict.ok or not verdict.never:
                verdict = None
            self._never[key] = verdict
        if verdict is None and team.budgets:
            ekey = (acc, job.max_runtime_seconds, job.shape)  # whatever the team: its budgets are compared after
            cheapest = self._cheapest.get(ekey, self)
            if cheapest is self:
                pools = self.room.matching_entry(job, acc)[0]
                cheapest = self.room.estimate(job, pools[0]) if pools else None
                self._cheapest[ekey] = cheapest
            if cheapest is not None:
                verdict = budget_never(cheapest, team.budgets)
        return verdict

    def evaluate(self, job: QueuedJob, *, only_pool: int | None = None, exclude: frozenset = frozenset()) -> Decision:
        """Admission, Rejection or Waiting for ``job`` as its team's head, on the current state (nothing changes).

        The job's accelerators are tried in its order of preference; the first admission wins; otherwise the
        preferred accelerator's reason (one that can never run is passed over). A Waiting whose detail says
        ``never_placeable`` never blocks its team. ``only_pool``: the job may go to that node pool only (a
        preempting admission's re-check: its victims made room there). ``exclude``: node pool ids the job may not
        go to (held for a job ahead of it in its StrictFIFO team: ``cycle.FairShareScheduler``).
        """
        if not job.alternatives:
            return self.evaluate_on(job, job.accelerator_id, only_pool, exclude)
        first_wait = None
        first_never = None
        for acc in job.accelerator_ids:
            decision = self.evaluate_on(job, acc, only_pool, exclude)
            if isinstance(decision, Admission):
                return decision
            if isinstance(decision, Waiting):
                if first_wait is None or (first_wait.detail.get("never_placeable")
                                          and not decision.detail.get("never_placeable")):
                    first_wait = decision
            elif first_never is None:
                first_never = decision
        return first_wait or first_never

    def evaluate_on(self, job: QueuedJob, acc: int, only_pool: int | None,
                    exclude: frozenset = frozenset()) -> Decision:
        """``evaluate`` on accelerator ``acc`` alone: steps 1 and 2, then a remembered capacity wait or the rest.

        A capacity wait depends only on the team's usage, on what was released since (preemptions) and, for a
        job that may preempt, on its cohort's usage: admissions only take nodes away, so it is remembered for
        the next job of the same team and shape until one of those changes. For a job that will not preempt,
        of a team without per-cluster caps, it depends on the nodes alone once the cohort has room for it: it
        is remembered for every such team's job of the same shape until a release on the accelerator. With
        ``exclude`` (pool ids it may not go to) nothing is remembered or read of capacity waits: they hold for the
        whole fleet.
        """
        team = self.teams[job.team_id]
        cpu_only = job.cpu_only
        amount = job.quota_gpus if not cpu_only else job.total_cpu_milli if acc in team.quotas else 0  # amount_of
        qkey = (job.team_id, acc, cpu_only, amount)  # also ``never_on``'s key for its quota never-rules
        never = self._never.get(qkey, self)
        if never is self or (never is None and team.budgets):
            never = self.never_on(job, acc)
        if never is not None:
            return Rejection(job, never)
        q = team.quotas.get(acc) or NO_QUOTA  # none: a quota-free CPU-only job (it passed never_on)
        gen = self._team_gen.get(job.team_id, 0)
        known = self._quota.get(qkey)
        used = team.used.get(acc, 0)
        if known is None or known[0] != gen:  # the verdict depends on the team's usage only
            known = (gen, quota_verdict(job, amount, used, q.view() if amount else None))
            self._quota[qkey] = known
        if not known[1].ok:
            return Waiting.because(job, known[1])
        ckey = (team.cohort, acc)
        preempts = may_preempt(job, used, amount, q)
        released = self._released.get(acc, 0)
        if only_pool is not None or exclude:
            wkey = stamp = None
        elif preempts or team.cluster_caps:
            wkey = (job.team_id, (acc, job.shape))
            stamp = (gen, released, self._cohort_gen.get(ckey, 0) if preempts else None, self.cohorts.runs)
        else:  # what it waits for is the fleet's alone: shared by every team whose cohort could lend it the GPUs
            wkey = (acc, job.shape)
            stamp = (released, self.cohorts.runs)
        seen = self._waits.get(wkey) if wkey is not None else None
        # Without the cohort's generation in its stamp (a job that will not preempt), a capacity wait holds only
        # while the cohort still has room for the job (else it waits for the cohort: ``cohort_full``).
        if seen is not None and seen[0] == stamp and (
                preempts or amount == 0 or (cohort_has_room(self._lendable.get(ckey, 0), self._borrowed.get(ckey, 0),
                                                            used, q.guaranteed_gpus, amount)
                                            and self.cohorts.fits(team, acc, amount))):
            return Waiting.because(job, seen[1])
        return self.place_and_remember(job, acc, only_pool, team, q, used, amount, ckey, preempts, wkey, stamp,
                                       exclude)

    def place_and_remember(self, job: QueuedJob, acc: int, only_pool: int | None, team: TeamState, q: TeamQuota,
                           used, amount, ckey: tuple, preempts: bool, wkey: tuple | None, stamp: tuple | None,
                           exclude: frozenset = frozenset()) -> Decision:
        """``evaluate_on``'s steps 3 to 6 for ``job`` once its never-rules and quota passed and no capacity wait
        was remembered: ``used`` and ``amount`` as ``amount_of`` counts them, ``ckey`` its (cohort, accelerator),
        ``preempts`` as ``may_preempt`` says, off the pools of ``exclude``; a capacity wait is remembered under
        ``wkey`` with ``stamp`` (None: not remembered, an ``only_pool`` or ``exclude`` evaluation)."""
        decision = self._place_or_wait(job, acc, only_pool, team, q, used, amount, ckey, preempts, exclude)
        if wkey is not None and isinstance(decision, Waiting) and decision.reason == "capacity":
            self._waits[wkey] = (stamp, decision.verdict())
            if decision.message is DEFERRED:
                self.room.deferred_waits.append(wkey)
        return decision

    def _place_or_wait(self, job: QueuedJob, acc: int, only_pool: int | None, team: TeamState, q: TeamQuota,
                       used: int, amount: int, ckey: tuple, preempts: bool,
                       exclude: frozenset = frozenset()) -> Decision:
        """Steps 3 to 6 of ``job`` on ``acc`` once its quota allows it, on its pools but those of ``exclude``. A
        multi-role job is placed as one gang (``room.Room.place_gang``: every role on one pool, or nothing), never
        with victims."""
        room = self.room
        pools, fleet, pids = room.matching_entry(job, acc)
        if not pools:
            return Waiting.because(job, room.no_price(job, acc, fleet))
        if team.cluster_caps:
            pools, verdict = within_cluster_caps(team, job, pools, acc)
            if not verdict.ok:
                return Waiting.because(job, verdict)
            pids = tuple(o.node_pool_id for o in pools)
        if only_pool is not None:
            pools = [o for o in pools if o.node_pool_id == only_pool]
            pids = tuple(o.node_pool_id for o in pools)
        if exclude:
            pools = [o for o in pools if o.node_pool_id not in exclude]
            pids = tuple(o.node_pool_id for o in pools)
            if not pools:  # every pool it could use is held: the caller says for which job
                return Waiting(job, "capacity", "", {"request_gpus": job.total_gpus, "held_pools": True})
        cohort_ok = amount == 0 or cohort_has_room(self._lendable.get(ckey, 0), self._borrowed.get(ckey, 0), used,
                                                   q.guaranteed_gpus, amount)
        tree_ok = amount == 0 or self.cohorts.fits(team, acc, amount)  # every level of a tree of cohorts (ADR 0046)
        cohort_ok = cohort_ok and tree_ok
        failed_role = None
        if job.roles:  # a multi-role job: every role on one pool at once, else the role that fits nowhere
            found, failed_role = room.place_gang(job, pools) if cohort_ok else (None, None)
        else:
            found = room.place(job, acc, pools, pids) if cohort_ok else None
        victims = ()
        if found is None and preempts:
            chosen = self.victims.find(job, acc, team, q.guaranteed_gpus, pools, pids, fits_nowhere=cohort_ok)
            if chosen is not None:
                offer, victims, nodes = chosen
                found = (offer, nodes)
        if found is None:
            if not tree_ok:  # not remembered: a tree's room is not one borrowed sum
                return Waiting.because(job, tree_full(job, used, q, self.cohorts.tree, ("team", team.team_id), acc,
                                                      amount))
            if not cohort_ok:
                # the same verdict for every job of the team asking as much while the cohort's borrowed amount
                # and the team's usage stay (the lendable pool and the team's quota are fixed)
                borrowed = self._borrowed.get(ckey, 0)
                fkey = (job.team_id, acc, job.cpu_only, amount, used, borrowed)
                verdict = self._full.get(fkey)
                if verdict is None:
                    full = cpu_cohort_full if job.cpu_only else cohort_full
                    verdict = self._full[fkey] = full(job, used, q, self._lendable.get(ckey, 0), borrowed)
                return Waiting.because(job, verdict)
            if failed_role is not None:  # it holds nothing meanwhile, and its reason names the role
                return Waiting.because(job, room.gang_no_room(job, acc, pools, failed_role))
            return Waiting.because(job, room.no_room_verdict(job, acc, pools, pids))
        offer, nodes = found
        estimate = room.estimate(job, offer)
        verdict = check_budgets(estimate, team.budgets)
        if not verdict.ok:
            return Waiting.because(job, verdict)
        if job.roles:
            by_role = tuple((name, room.book.names(offer.node_pool_id, list(n))) for name, n in nodes)
            return Admission(job, offer, estimate, (), tuple(x for _, names in by_role for x in names), acc, by_role)
        gpu = room.book.share_gpu(offer.node_pool_id, nodes[0], job.placement()) if job.share_milli else None
        return Admission(job, offer, estimate, victims, room.book.names(offer.node_pool_id, nodes), acc, gpu_index=gpu)

    def assess(self, job: QueuedJob) -> Assessment:
        """What the rules say of ``job`` before it is submitted (nothing changes): where it would run, its estimate,
        and its team's quota and budget verdicts (the quota one on the limit the team can reach: nominal +
        borrowing limit, at most what its cohort can lend; what the cohort lends now is decided at admission)."""
        team = self.teams[job.team_id]
        acc = job.accelerator_id
        pools, fleet, pids = self.room.matching_entry(job, acc)
        failed_role = None
        if job.roles:  # a multi-role job: every role on one pool (``room.Room.place_gang``)
            found, failed_role = self.room.place_gang(job, pools)
        else:
            found = self.room.place(job, acc, pools, pids)
        fits_now = found is not None
        offer = found[0] if found else (pools[0] if pools else None)  # else where it would wait for capacity
        priced = offer if offer is not None else self.room.whole_fleet_pool(job, acc)
        estimate = job_estimate(job, priced) if priced is not None else None
        budget = check_budgets(estimate, team.budgets) if estimate is not None else None
        q = team.quotas.get(acc)
        quota = quota_verdict(job, amount_of(job, acc, team), team.used.get(acc, 0),
                              q.view() if q is not None else None)
        unplaced = None if pools else self.room.no_price(job, acc, fleet)
        capacity = (None if fits_now or not pools else self.room.gang_no_room(job, acc, pools, failed_role)
                    if failed_role is not None else self.room.no_room_verdict(job, acc, pools, pids))
        return Assessment(offer, fits_now, estimate, quota, budget, unplaced, priced, capacity)
