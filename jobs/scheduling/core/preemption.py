"""Preemption (Kueue's reclaim within a cohort): which running jobs a job within its nominal quota may end.

A job that stays within its team's nominal quota but is blocked by the
cohort's lendable pool or by capacity may preempt preemptible running jobs
of other teams of its cohort. A victim is eligible while its team uses more
than its nominal quota before the removal (Kueue's ``reclaimWithinCohort``
rule), even if whole-job granularity then leaves that team below its
nominal; lowest priority first, then the team with the highest weighted
decayed usage (``order.usage_key``; Kueue's fair-sharing preemption takes from
the queue with the highest share first), then most recently admitted;
unneeded victims are pruned (Kueue's minimal set). The preemptor's nodes must have
room once the victims on its pool are gone (per node, all or nothing).

No loop: a preemptor ends within its team's nominal quota, and a victim's
team was above its nominal; a job of a team brought below its nominal can
preempt only teams still above theirs, and each preemption moves borrowed
GPUs back to a team within its nominal.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from .nodebook import NodeBook
from .placement import PlacementRequest, PoolOffer, pods_on
from .types import OK, QueuedJob, RunningJob, TeamState, Verdict
from .usage import ZERO


def victim_order(r: RunningJob, usage: Decimal = ZERO) -> tuple:
    """The order victims are taken in: lowest priority first, then the highest weighted decayed usage of the
    victim's team (``usage``: ``order.usage_key`` of it; 0 while fair sharing over time is off), then the most
    recently admitted."""
    return (r.priority, -usage, -r.admitted, -r.job_id)


def borrowing_before(owner: TeamState, accelerator_id: int, used_before: int) -> bool:
    """Whether ``owner`` uses more than its nominal quota with ``used_before`` GPUs (its work may then be taken)."""
    q = owner.quotas.get(accelerator_id)
    return used_before > (q.nominal_gpus if q else 0)


def victims_were_borrowing(teams: dict[int, TeamState], job: QueuedJob, victims: Iterable[RunningJob],
                           accelerator_id: int | None = None) -> Verdict:
    """After ``victims`` ended (``teams``' usage no longer counts them): OK when each victim's team was above its
    nominal quota before its last victim was removed (the largest one last: ``used + its GPUs > nominal``), else
    the verdict that the preemption would take work within nominal (reason ``quota``)."""
    acc = job.accelerator_id if accelerator_id is None else accelerator_id
    largest: dict[int, int] = {}
    for v in victims:
        largest[v.team_id] = max(largest.get(v.team_id, 0), v.gpus)
    for owner_id, gpus in largest.items():
        owner = teams.get(owner_id) or TeamState(owner_id)
        if not borrowing_before(owner, acc, owner.used.get(acc, 0) + gpus):
            q = owner.quotas.get(acc)
            return Verdict(False, "quota", f"Preempting team {owner_id}'s job would take work within its nominal quota "
                                           f"of {q.nominal_gpus if q else 0} GPUs; it is no longer borrowing.",
                           {"request_gpus": job.total_gpus})
    return OK


def choose_victims(candidates: list[RunningJob], pools: list[PoolOffer], book: NodeBook,
                   teams: dict[int, TeamState], accelerator_id: int, request: PlacementRequest,
                   cohort_need: int, fits_nowhere: bool = False
                   ) -> tuple[PoolOffer, tuple[RunningJob, ...], list[int]] | None:
    """The pool, the fewest victims whose end lets ``request`` in, and the nodes it gets there; or None.

    ``candidates``: preemptible running jobs of other teams of the cohort, in
    ``victim_order``; ``book``: free resources per node now (left as it was);
    ``cohort_need``: GPUs the cohort's borrowing must give back for the job
    to fit (<= 0: none); ``fits_nowhere``: the caller knows ``request`` has room on none of ``pools`` now, so
    (like a cohort that must give GPUs back) every pool needs a victim, and the first pool that needs only one
    is the answer (later pools can only tie).
    """
    best = None
    if cohort_need > 0 or fits_nowhere:
        # Every answer needs a victim, and only a job of a team above its nominal quota can be one (``_pick``):
        # the others can be left out, and when all the teams' borrowing they could give back falls short of
        # ``cohort_need``, no pool has an answer.
        borrowing = {t: borrowing_before(teams[t], accelerator_id, teams[t].used.get(accelerator_id, 0))
                     for t in {c.team_id for c in candidates}}
        candidates = [c for c in candidates if borrowing[c.team_id]]
        if not candidates:
            return None
        if cohort_need > 0 and _most_returned(teams, accelerator_id, candidates) < cohort_need:
            return None
    by_pool: dict[int, list[RunningJob]] = {}
    for c in candidates:
        by_pool.setdefault(c.node_pool_id, []).append(c)
    need = request.total_gpus
    for offer in pools:
        # Without cohort GPUs to give back only the pool's own jobs can make room there: not even all of them
        # make room for the job's GPUs when the pool's free GPUs and theirs fall short.
        mine = candidates if cohort_need > 0 else by_pool.get(offer.node_pool_id)
        if not mine or (cohort_need <= 0 and book.free_gpus(offer.node_pool_id) + sum(c.gpus for c in mine) < need):
            continue
        if not could_fit(book, offer.node_pool_id, request, by_pool.get(offer.node_pool_id, ())):
            continue  # not even the end of every candidate on the pool gives the job its nodes there
        picked = _pick(mine, teams, accelerator_id, offer.node_pool_id, book, request, cohort_need)
        if picked is not None and (best is None or len(picked[0]) < len(best[1])):
            best = (offer, tuple(picked[0]), picked[1])
            if len(best[1]) == 1 and (cohort_need > 0 or fits_nowhere):
                break
    return best


def could_fit(book: NodeBook, pool_id: int, request: PlacementRequest, on_pool: list[RunningJob]) -> bool:
    """Whether the pool's schedulable nodes would have room for the ``request.nodes`` pods of ``request`` (GPUs, CPU,
    memory; ``placement.pods_on`` each) once every job of ``on_pool`` (running there) ended: an upper bound of what any set of
    those victims can free, so False means none can. A job without node names (its GPUs go back to the fullest
    nodes) gives no bound: True."""
    p = book.pools[pool_id]
    g, c, m = request.gpus_per_node, request.cpu_milli, request.memory_mib
    add: dict[int, list[int]] = {}
    for v in on_pool:
        if not v.node_names:
            return True
        for name in v.node_names:
            i = p.index.get(name)
            if i is not None:
                a = add.get(i)
                if a is None:
                    add[i] = [v.gpus_per_node, v.cpu_milli, v.memory_mib]
                else:
                    a[0] += v.gpus_per_node
                    a[1] += v.cpu_milli
                    a[2] += v.memory_mib
    left = request.nodes
    free_g, free_c, free_m, sched = p.free_g, p.free_c, p.free_m, p.sched
    for i, a in add.items():
        if sched[i]:
            left -= pods_on(request, free_g[i] + a[0], free_c[i] + a[1], free_m[i] + a[2])
    if left <= 0:
        return True
    for k in range(g, len(p.buckets)):  # the other nodes with room now
        for fc, fm, i in p.buckets[k]:
            if fc >= c and fm >= m and i not in add:
                left -= pods_on(request, k, fc, fm)
                if left <= 0:
                    return True
    return False


def _most_returned(teams, acc: int, candidates: list[RunningJob]) -> int:
    """The most GPUs the cohort's borrowing can get back by ending any of ``candidates``: per team, what it uses
    above its guaranteed part, at most the GPUs of its candidates (``_gives_back`` summed over them)."""
    held: dict[int, int] = {}
    for c in candidates:
        held[c.team_id] = held.get(c.team_id, 0) + c.gpus
    total = 0
    for t, gpus in held.items():
        owner = teams[t]
        q = owner.quotas.get(acc)
        total += min(max(0, owner.used.get(acc, 0) - (q.guaranteed_gpus if q else 0)), gpus)
    return total


def _release(book: NodeBook, v: RunningJob) -> list[int]:
    return book.release(v.node_pool_id, v.node_names, v.gpus, v.gpus_per_node, v.cpu_milli, v.memory_mib)


def _retake(book: NodeBook, v: RunningJob, nodes: list[int]) -> None:
    p = book.pools.get(v.node_pool_id)
    if p is None:
        return
    if v.node_names:
        for i in nodes:
            p.move(i, -v.gpus_per_node, -v.cpu_milli, -v.memory_mib)
        return
    left = v.gpus
    for i in nodes:  # the fullest-first order ``release`` used
        give = min(left, p.free_g[i])
        p.move(i, -give, 0, 0)
        left -= give
    p.failed = []


def _gives_back(owner: TeamState, acc: int, before: int, gpus: int) -> int:
    """GPUs the cohort's borrowing gets back when ``owner``, already losing ``before``, loses ``gpus`` more: a team
    only gives back what it used above its guaranteed (unlendable) part."""
    q = owner.quotas.get(acc)
    above = owner.used.get(acc, 0) - (q.guaranteed_gpus if q else 0) - before
    return max(0, above) - max(0, above - gpus)


def _returned(teams, acc, taken: dict[int, int]) -> int:
    """``_gives_back`` summed over the teams of ``taken`` (team id -> GPUs it loses)."""
    return sum(_gives_back(teams[t], acc, 0, gpus) for t, gpus in taken.items())


def _pick(candidates, teams, acc, pool_id, book: NodeBook, request: PlacementRequest,
          cohort_need: int) -> tuple[list[RunningJob], list[int]] | None:
    taken: dict[int, int] = {}
    picked: list[tuple[RunningJob, list[int]]] = []
    pool = book.pools.get(pool_id)
    # Shapes known not to fit the pool now: releasing and retaking victims by node name gives the pool back exactly
    # as it was, so they (and what is learned meanwhile, with more room) still hold afterwards. A victim without
    # node names is given back to the fullest nodes and retaken from them, which need not restore every node.
    exact = all(c.node_names for c in candidates if c.node_pool_id == pool_id)
    saved = list(pool.failed) if pool is not None and exact else []
    nodes = book.fit(pool_id, request)
    short = cohort_need
    try:
        for c in candidates:
            if short <= 0 and nodes is not None:
                break
            on_pool = c.node_pool_id == pool_id
            if not (short > 0 or (nodes is None and on_pool)):
                continue
            owner = teams[c.team_id]
            before = taken.get(c.team_id, 0)
            if not borrowing_before(owner, acc, owner.used.get(acc, 0) - before):
                continue  # its team is within its nominal quota: Kueue does not reclaim from it
            picked.append((c, _release(book, c) if on_pool else []))
            taken[c.team_id] = before + c.gpus
            short -= _gives_back(owner, acc, before, c.gpus)
            if on_pool and nodes is None:
                nodes = book.fit(pool_id, request)
        if short > 0 or nodes is None:
            return None
        for c, changed in reversed(list(picked)):  # prune victims not needed
            without = {**taken, c.team_id: taken[c.team_id] - c.gpus}
            if cohort_need - _returned(teams, acc, without) > 0:
                continue
            if c.node_pool_id == pool_id:
                _retake(book, c, changed)
                still = book.fit(pool_id, request)
                if still is None:
                    _release(book, c)
                    continue
                nodes = still
            picked.remove((c, changed))
            taken = without
        return [c for c, _ in picked], nodes
    finally:
        for c, changed in picked:
            if c.node_pool_id == pool_id:
                _retake(book, c, changed)
        if saved:
            pool.failed = saved + [s for s in pool.failed if s not in saved]


def tree_order(candidates: list[RunningJob], tree, team: TeamState) -> list[RunningJob]:
    """``candidates`` (in ``victim_order``) with the farthest first: by the depth of the lowest level of the tree of
    cohorts that holds both the victim's team and ``team`` (shallower first), then as they were. So reclaiming a
    level's nominal quota ends borrowers from outside that level's subtree before borrowers inside it (ADR
    0046)."""
    mine = {k: i for i, k in enumerate(tree.path(("team", team.team_id)))}
    depth = tree.depth

    def meet(c: RunningJob) -> int:
        for k in tree.path(("team", c.team_id)):
            if k in mine:
                return depth[k]
        return -1

    return sorted(candidates, key=meet)  # stable: victim_order within one depth


def choose_tree_victims(candidates: list[RunningJob], pools: list[PoolOffer], book: NodeBook,
                        teams: dict[int, TeamState], acc: int, request: PlacementRequest, tree, team: TeamState,
                        amount: int) -> tuple[PoolOffer, tuple[RunningJob, ...], list[int]] | None:
    """``choose_victims`` for a team of a tree of cohorts (``tree``: the ``core.cohorts.CohortTree``, whose usage
    and ``book`` are left as they were): per pool, take ``candidates`` in their order (``tree_order``), each while
    its team uses more than its nominal quota and only when its end gives the job room it lacks (more of what
    the tree lets ``team`` take of ``acc``, or nodes on the pool), until every level lets ``team`` take
    ``amount`` more (``CohortTree.fits``) and ``request`` has nodes on the pool; then drop the victims not
    needed, the last taken first. The pool needing the fewest victims wins (the first on a tie; one victim ends
    the search); None when none can.

    When the end of every borrowing candidate together does not let the tree take ``amount``, no pool can: that
    is asked once, before any pool."""
    key = ("team", team.team_id)
    room_now = tree.available(key, acc)
    eligible = [c for c in candidates if borrowing_before(teams[c.team_id], acc, teams[c.team_id].used.get(acc, 0))]
    if not eligible:
        return None
    if room_now < amount:
        for c in eligible:
            tree.add(("team", c.team_id), acc, -c.gpus)
        try:
            if not tree.fits(key, acc, amount):
                return None
        finally:
            for c in eligible:
                tree.add(("team", c.team_id), acc, c.gpus)
    best = None
    for offer in pools:
        pid = offer.node_pool_id
        on_pool = [c for c in eligible if c.node_pool_id == pid]
        if not could_fit(book, pid, request, on_pool):
            continue
        taken: dict[int, int] = {}
        picked: list[tuple[RunningJob, list[int]]] = []
        pool = book.pools.get(pid)
        # as in ``_pick``: victims released and retaken by node name leave the pool as it was
        saved = list(pool.failed) if pool is not None and all(c.node_names for c in on_pool) else None
        nodes = book.fit(pid, request)
        room = room_now
        try:
            for c in (eligible if room < amount else on_pool):
                if room >= amount and nodes is not None:
                    break
                here = c.node_pool_id == pid
                if room >= amount and not here:
                    continue  # only room on the pool is missing: a job elsewhere gives none
                owner = teams[c.team_id]
                if not borrowing_before(owner, acc, owner.used.get(acc, 0) - taken.get(c.team_id, 0)):
                    continue  # its team is within its nominal quota
                tree.add(("team", c.team_id), acc, -c.gpus)
                more = tree.available(key, acc)
                if more <= room and not (here and nodes is None):
                    tree.add(("team", c.team_id), acc, c.gpus)  # its end gives the job nothing it lacks
                    continue
                room = more
                picked.append((c, _release(book, c) if here else []))
                taken[c.team_id] = taken.get(c.team_id, 0) + c.gpus
                if here and nodes is None:
                    nodes = book.fit(pid, request)
            if nodes is None or room < amount:
                continue
            for i in range(len(picked) - 1, -1, -1):  # drop victims not needed, the last taken first
                c, changed = picked[i]
                tree.add(("team", c.team_id), acc, c.gpus)
                still = nodes
                if c.node_pool_id == pid:
                    _retake(book, c, changed)
                    still = book.fit(pid, request)
                if still is None or not tree.fits(key, acc, amount):
                    tree.add(("team", c.team_id), acc, -c.gpus)
                    if c.node_pool_id == pid:
                        picked[i] = (c, _release(book, c))
                    continue
                nodes = still
                del picked[i]
            if best is None or len(picked) < len(best[1]):
                best = (offer, tuple(c for c, _ in picked), nodes)
        finally:
            for c, changed in picked:
                tree.add(("team", c.team_id), acc, c.gpus)
                if c.node_pool_id == pid:
                    _retake(book, c, changed)
            if saved is not None:
                pool.failed = saved
        if best is not None and len(best[1]) <= 1:
            break
    return best


class VictimSearch:
    """The preemption candidates of one scheduler and the search among them.

    ``running``: the snapshot's running jobs; the preemptible ones of known teams are candidates, by (cohort,
    accelerator id), in ``victim_order`` (with their team's weighted decayed usage). ``cohorts``: the ``cohort.CohortBook``; ``memo``: the scheduler's memo,
    whose ``no_victims`` table remembers a search that found nothing for the team and its pools until the usage
    of a team of its cohort changes or something is released on the accelerator (more borrowing makes more
    victims eligible; a preemption frees nodes): a job of the same team at least as large (nodes, GPUs, CPU,
    memory) finds nothing either until then, as admissions elsewhere only take nodes away.
    """

    def __init__(self, running: Iterable[RunningJob], teams: dict[int, TeamState], book: NodeBook, cohorts, memo):
        self.teams, self.book, self.cohorts = teams, book, cohorts
        self._no_victims = memo.no_victims
        self.preempted: set[int] = set()
        # grouped on the first search (a pass that preempts nothing never reads them), each group sorted on its
        # first read by the teams' usage when the pass began (``cohort.CohortBook.usage`` grows with admissions)
        self._running = tuple(running)
        self._usage = dict(cohorts.usage)
        self._groups: dict[tuple, list[RunningJob]] | None = None
        self._sorted: set[tuple] = set()

    def _of(self, ckey: tuple) -> list[RunningJob]:
        """The candidates of (cohort, accelerator id) ``ckey`` in ``victim_order`` (the list itself; empty when
        none)."""
        groups = self._groups
        if groups is None:
            groups = self._groups = {}
            teams = self.teams
            for r in self._running:
                if r.preemptible and r.team_id in teams and not (r.share_milli or r.mig_profile):
                    groups.setdefault((teams[r.team_id].cohort, r.accelerator_id), []).append(r)
        found = groups.get(ckey)
        if found is None:
            return []
        if ckey not in self._sorted:
            usage = self._usage
            found.sort(key=lambda r: victim_order(r, usage[r.team_id]))
            self._sorted.add(ckey)
        return found

    @property
    def candidates(self) -> dict[tuple, list[RunningJob]]:
        """The candidates by (cohort, accelerator id), each in ``victim_order``."""
        self._of(())
        return {ckey: self._of(ckey) for ckey in self._groups}

    def find(self, job: QueuedJob, acc: int, team: TeamState, guaranteed: int, pools: list[PoolOffer],
             pids: tuple[int, ...], fits_nowhere: bool = False):
        """The fewest preemptible jobs of other teams of ``team``'s cohort, each taken while its team borrows,
        whose end lets ``job`` in on one of ``pools`` (ids ``pids``): ``(offer, victims, node indexes)``, or None.
        ``guaranteed``: the part of the team's quota of ``acc`` it never lends; ``fits_nowhere``: the job has
        room on none of ``pools`` now (its placement was just tried)."""
        key = (team.team_id, acc, job.share_nodes, pids)
        n, g, c, m = shape = (job.nodes, job.gpus_per_node, job.cpu_milli, job.memory_mib)
        ckey = (team.cohort, acc)
        version = (self.cohorts.cohort_gen.get(ckey, 0), self.cohorts.released.get(acc, 0))
        known = self._no_victims.get(key)
        if known is not None and known[0] == version:
            for fn, fg, fc, fm in known[1]:
                if n >= fn and g >= fg and c >= fc and m >= fm:
                    return None
        candidates = [r for r in self._of(ckey) if r.team_id != team.team_id
                      and r.job_id not in self.preempted]
        found = None
        if candidates and team.team_id in self.cohorts.tree_teams:
            found = choose_tree_victims(tree_order(candidates, self.cohorts.tree, team), pools, self.book, self.teams,
                                        acc, job.placement(), self.cohorts.tree, team, job.total_gpus)
        elif candidates:
            need = self.cohorts.need(ckey, team.used.get(acc, 0), guaranteed, job.total_gpus)
            found = choose_victims(candidates, pools, self.book, self.teams, acc, job.placement(), need,
                                   fits_nowhere)
        if found is None:
            least = known[1] if known is not None and known[0] == version else []
            # the least shapes known to find none: one that covers another replaces it
            self._no_victims[key] = (version, [s for s in least if not (s[0] >= n and s[1] >= g and s[2] >= c
                                                                         and s[3] >= m)] + [shape])
        return found

    def take(self, victim: RunningJob) -> None:
        """``victim`` is preempted: it is no candidate any more."""
        self.preempted.add(victim.job_id)
        self._of((self.teams[victim.team_id].cohort, victim.accelerator_id)).remove(victim)
