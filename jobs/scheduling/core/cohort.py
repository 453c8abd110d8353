"""Cohort accounting for one scheduler: usage, the cohorts' lendable pools and borrowed GPUs, fair shares, and the
generation counters that say what changed.

Kueue's Cohort: within a cohort each team keeps ``nominal - lending limit`` for itself; the rest of every
team's nominal forms the cohort's lendable pool, and a team's usage above its unlendable part is drawn from that
pool, which is never overdrawn (``rules.cohort_has_room``). What a team can reach is ``core.cohorts.reachable``
of its nominal, borrowing limit and what the other teams lend.

Every change of a team's usage or money goes through this class, and each bumps the generations that a
remembered decision (``memo``) may have read; a remembered decision holds while the generations it was stamped
with are unchanged (docs/adr/0013-decision-memo-generations.md). The generations:

- ``team_gen[team]``: the team's usage (any accelerator) or committed money changed;
- ``cohort_gen[(cohort, accelerator)]``: the usage of some team of that cohort changed on that accelerator;
- ``released[accelerator]``: resources were released on the accelerator's pools (a preemption), so shapes known
  not to fit there may fit again;
- ``taken[accelerator]``: resources were taken or released there (the nodes' numbers a verdict shows are stale);
- ``epoch``: bookings of any kind; ``runs``: runs of the decision loop (the state may change between runs).

All amounts are GPUs, or CPU millicores on a CPU quota (``TeamQuota.cpu``).

Trees of cohorts (ADR 0046; Kueue's hierarchical cohorts): a team whose ``TeamState.parent_cohort`` is set belongs
to a tree of ``Snapshot.cohort_levels``; its ``cohort`` key is the tree's root, so the pool above is the whole
tree's (every team's lendable part plus every cohort's nominal: a bound no admission the tree allows exceeds),
and ``tree`` (a ``core.cohorts.CohortTree`` of the cohorts and those teams) says what every level allows
(``fits``). A usage change of such a team bumps the root's generation, so every remembered decision that read
the tree is stale. Plain cohorts have no tree and are decided exactly as before trees existed.
"""

from __future__ import annotations

from core.cohorts import CohortTree, Level, lendable, reachable

from .order import dominant_share, usage_key
from .types import TeamState


class CohortBook:
    """The cohorts of ``teams`` (team id -> ``TeamState``, whose ``used`` it updates in place) and their generations.

    ``lendable`` and ``borrowed`` are keyed by (cohort, accelerator id); ``share`` by team id (Kueue's dominant
    resource share, ``order.dominant_share``); ``usage`` by team id (decayed GPU-seconds / weight,
    ``order.usage_key``: the snapshot's, fixed for the pass). Building it sets every quota's ``reachable_gpus``.
    """

    __slots__ = ("teams", "lendable", "borrowed", "share", "usage", "team_gen", "cohort_gen", "released", "taken",
                 "epoch", "runs", "tree", "tree_teams")

    def __init__(self, teams: dict[int, TeamState], levels: tuple = ()):
        self.teams = teams
        self.lendable: dict[tuple, int] = {}
        self.borrowed: dict[tuple, int] = {}
        self.tree: CohortTree | None = None
        #: Ids of the teams in a tree of cohorts (``tree``'s leaves, keyed ``("team", id)``).
        self.tree_teams: set[int] = {tid for tid, t in teams.items() if t.parent_cohort is not None}
        if self.tree_teams:
            self.tree = tree_of(teams, self.tree_teams, levels)
            for lv in levels:  # a cohort's own nominal joins its tree's pool
                root = self.tree.root(lv.key)
                for acc, n in lv.nominal.items():
                    self.lendable[(root, acc)] = self.lendable.get((root, acc), 0) + n
        # One walk over the quotas (the pass's fixed cost grows with them): each quota's lendable part is read once
        # (``core.cohorts.lendable``; the guaranteed part is the nominal less it, ``TeamQuota.guaranteed_gpus``).
        lent, borrowed, tree_teams = self.lendable, self.borrowed, self.tree_teams
        quotas: list[tuple] = []  # (team, accelerator id, quota, its (cohort, accelerator) key, its lendable part)
        for t in teams.values():
            cohort, team_quotas = t.cohort, t.quotas
            for acc, q in team_quotas.items():
                key = (cohort, acc)
                n = lendable(q.nominal_gpus, q.lending_limit_gpus)
                lent[key] = lent.get(key, 0) + n
                quotas.append((t, acc, q, key, n))
            for acc, used in t.used.items():
                q = team_quotas.get(acc)
                key = (cohort, acc)
                g = q.nominal_gpus - lendable(q.nominal_gpus, q.lending_limit_gpus) if q else 0
                borrowed[key] = borrowed.get(key, 0) + max(0, used - g)
        for t, acc, q, key, n in quotas:
            q.reachable_gpus = reachable(q.nominal_gpus, q.borrowing_limit_gpus, lent[key] - n)
            if t.team_id in tree_teams:  # at most what every level above lets it hold
                q.reachable_gpus = min(q.reachable_gpus, self.tree.available(("team", t.team_id), acc, idle=True))
        self.share: dict[int, float] = {tid: self._share(t) for tid, t in teams.items()}
        self.usage: dict = {tid: usage_key(t) for tid, t in teams.items()}
        self.team_gen: dict[int, int] = dict.fromkeys(teams, 0)
        self.cohort_gen: dict[tuple, int] = {}
        self.released: dict[int, int] = {}
        self.taken: dict[int, int] = {}
        self.epoch = 0
        self.runs = 0

    def use(self, team: TeamState, acc: int, delta: int) -> None:
        """``team`` uses ``delta`` more of ``acc`` (negative: less): its usage, its cohort's borrowed amount and its
        share change, and its team and cohort generations are bumped."""
        q = team.quotas.get(acc)
        g = q.guaranteed_gpus if q else 0
        used = team.used.get(acc, 0)
        key = (team.cohort, acc)
        self.borrowed[key] = self.borrowed.get(key, 0) - max(0, used - g) + max(0, used + delta - g)
        team.used[acc] = used + delta
        self.cohort_gen[key] = self.cohort_gen.get(key, 0) + 1
        self.team_gen[team.team_id] = self.team_gen.get(team.team_id, 0) + 1
        if team.team_id in self.tree_teams:
            tree = self.tree
            levels = tree.path(team.parent_cohort)[:-1]
            before = [tree.share(level, acc) for level in levels]
            tree.add(("team", team.team_id), acc, delta)
            # a level whose share moved moves every team below it: their heap entries and remembered decisions
            # are stale
            for level, was in zip(levels, before, strict=True):
                if tree.share(level, acc) == was:
                    continue
                for k in tree.subtree(level):
                    tid = k[1] if k[0] == "team" else None
                    if tid is not None and tid != team.team_id:
                        share = self._share(self.teams[tid])
                        if share != self.share[tid]:
                            self.share[tid] = share
                            self.team_gen[tid] = self.team_gen.get(tid, 0) + 1
        self.share[team.team_id] = self._share(team)

    def _share(self, team: TeamState) -> float:
        """``order.dominant_share`` of ``team``; in a tree of cohorts, the largest of it and of every cohort's share
        on its path below the root (``CohortTree.share``: what the cohort borrows over its parent's quota, by its
        weight), so the teams of a department that borrows much come after those of one that borrows little."""
        share = dominant_share(team, self.lendable)
        if team.team_id not in self.tree_teams:
            return share
        tree = self.tree
        for level in tree.path(team.parent_cohort)[:-1]:
            for acc in team.used:
                share = max(share, tree.share(level, acc))
        return share

    def fits(self, team: TeamState, acc: int, amount) -> bool:
        """Whether every level of ``team``'s tree of cohorts lets it take ``amount`` more of ``acc``; True for a
        team of a plain cohort (``rules.cohort_has_room`` decides alone)."""
        return team.team_id not in self.tree_teams or self.tree.fits(("team", team.team_id), acc, amount)

    def penalize(self, team: TeamState, gpu_seconds) -> None:
        """``team`` was admitted work worth ``gpu_seconds`` of decayed usage (``Snapshot.entry_penalty`` x its GPUs):
        its weighted decayed usage grows by that over its weight for the rest of the pass, and its team generation
        is bumped (its heap entry is stale)."""
        if gpu_seconds <= 0:
            return
        team.fair_usage += gpu_seconds
        self.usage[team.team_id] = usage_key(team)
        self.touch(team.team_id)

    def touch(self, team_id: int) -> None:
        """What was decided of ``team_id``'s jobs is stale without a usage change (money committed by a quota-free
        job, a submission to its queue): bump its team generation."""
        self.team_gen[team_id] = self.team_gen.get(team_id, 0) + 1

    def book(self, acc: int) -> None:
        """A booking took resources on ``acc``'s pools."""
        self.epoch += 1
        self.taken[acc] = self.taken.get(acc, 0) + 1

    def release(self, acc: int) -> None:
        """A preemption released resources on ``acc``'s pools."""
        self.released[acc] = self.released.get(acc, 0) + 1
        self.taken[acc] = self.taken.get(acc, 0) + 1

    def need(self, ckey: tuple, used: int, guaranteed: int, amount: int) -> int:
        """How much the cohort ``ckey`` is short of lending ``amount`` more to a team using ``used``: what
        preemption must give back to the lendable pool (zero or less: nothing)."""
        return (self.borrowed.get(ckey, 0) - max(0, used - guaranteed) + max(0, used + amount - guaranteed)
                - self.lendable.get(ckey, 0))


def tree_of(teams: dict[int, TeamState], members: set[int], levels: tuple) -> CohortTree:
    """The ``CohortTree`` of the cohort ``levels`` (``core.cohorts.Level``s) with the teams ``members`` of
    ``teams`` as leaves (``("team", id)`` under their ``parent_cohort``): each team's nominal, borrowing and
    lending limit by accelerator (its quotas: GPUs, or CPU millicores) and its usage. ValueError for a team whose
    cohort is not among ``levels``, or a loop."""
    leaves, usage = [], {}
    for tid in members:
        t = teams[tid]
        key = ("team", tid)
        leaves.append(Level(key, t.parent_cohort, {a: q.nominal_gpus for a, q in t.quotas.items()},
                            {a: q.borrowing_limit_gpus for a, q in t.quotas.items()},
                            {a: q.lending_limit_gpus for a, q in t.quotas.items()},
                            default_borrowing_limit=0, weight=t.weight, name=f"team {tid}"))
        for acc, used in t.used.items():
            usage[(key, acc)] = used
    return CohortTree([*levels, *leaves], usage)
