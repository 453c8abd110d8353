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
"""

from __future__ import annotations

from core.cohorts import reachable

from .order import dominant_share
from .types import TeamState


class CohortBook:
    """The cohorts of ``teams`` (team id -> ``TeamState``, whose ``used`` it updates in place) and their generations.

    ``lendable`` and ``borrowed`` are keyed by (cohort, accelerator id); ``share`` by team id (Kueue's dominant
    resource share, ``order.dominant_share``). Building it sets every quota's ``reachable_gpus``.
    """

    __slots__ = ("teams", "lendable", "borrowed", "share", "team_gen", "cohort_gen", "released", "taken", "epoch",
                 "runs")

    def __init__(self, teams: dict[int, TeamState]):
        self.teams = teams
        self.lendable: dict[tuple, int] = {}
        self.borrowed: dict[tuple, int] = {}
        for t in teams.values():
            for acc, q in t.quotas.items():
                key = (t.cohort, acc)
                self.lendable[key] = self.lendable.get(key, 0) + q.lendable_gpus
            for acc, used in t.used.items():
                q = t.quotas.get(acc)
                key = (t.cohort, acc)
                self.borrowed[key] = self.borrowed.get(key, 0) + max(0, used - (q.guaranteed_gpus if q else 0))
        for t in teams.values():
            for acc, q in t.quotas.items():
                q.reachable_gpus = reachable(q.nominal_gpus, q.borrowing_limit_gpus,
                                             self.lendable[(t.cohort, acc)] - q.lendable_gpus)
        self.share: dict[int, float] = {tid: dominant_share(t, self.lendable) for tid, t in teams.items()}
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
        self.share[team.team_id] = dominant_share(team, self.lendable)
        self.team_gen[team.team_id] = self.team_gen.get(team.team_id, 0) + 1

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
