"""The decision memo: what a scheduler remembers within its life, each entry stamped with the generations it read.

A pass over 100,000 queued jobs decides most of them the same way as the job before of the same team and shape
(it waits), so the scheduler remembers such decisions and the facts behind them (which pools match a shape,
which shapes do not fit, where no victims were found...). Every entry carries a stamp built from the cohort
book's generation counters (``cohort.CohortBook``) at the time it was made; a lookup gives the entry back only
while the counters it names are unchanged, so invalidation is never written by hand where the state changes:
``CohortBook`` bumps counters, the memo compares them. docs/adr/0013-decision-memo-generations.md gives the rule
for each kind of entry.

``NullMemo`` has the same interface and remembers nothing: every lookup misses, so every decision is made from
the state alone. A scheduler run with each must decide every job the same way; the property tests check this on
generated worlds (``tests/jobs/scheduling/core/test_memo_equivalence.py``).

The entries are plain dictionaries (the decision loop reads them without a call); the scheduler writes each
entry with one assignment and never reads back what it has just written, which is what lets ``NullMemo`` drop
every write.
"""

from __future__ import annotations

from .types import Decision, QueuedJob, Rejection, TeamQuota

#: The memo's tables, by what they hold (key -> (stamp, value) unless said otherwise).
TABLES = (
    # Facts of the snapshot, fixed for the scheduler's life (pools and node health do not change within it).
    "matching",     # (accelerator, shape) -> (pools that could ever hold it in price order, fleet verdict, ids)
    "unhealthy",    # (accelerator, shape) -> the sentence naming unhealthy nodes
    "sick_pools",   # accelerator -> its pools with an unhealthy node
    "never",        # (team, accelerator, CPU-only, amount) -> verdict that rejects for good, or None (quotas fixed)
    "cheapest",     # (accelerator, run time, shape) -> estimate on its cheapest matching pool
    "estimates",    # (shape, run time, pool) -> (offer, USD)
    "full",         # (team, accelerator, CPU-only, amount, team's usage, cohort's borrowed) -> the wait for the cohort
    # Facts stamped with generations.
    "no_room",      # ((accelerator, shape), pool ids) -> (taken[acc], capacity verdict); stamp None: this run's
    "failed",       # (accelerator, preemptible, pool ids) -> (released[acc], least shapes that did not fit)
    "short",        # (pool ids, GPUs) -> (released[acc], changes read, the pools with that many free, their ids)
    "no_victims",   # (team, accelerator, pool ids) -> ((cohort_gen, released), least shapes that found none)
    "quota",        # (team, accelerator, CPU-only, amount) -> (team_gen, quota verdict)
    "waits",        # capacity waits: see ``evaluate.Evaluator.evaluate_on`` (stamp: team_gen, released, cohort_gen, run)
    "decided",      # decisions that admit nothing, within one run of the loop: see ``stamp``
)


class DecisionMemo:
    """Every table of ``TABLES`` as an attribute (a dict). ``remembers``: True."""

    remembers = True

    def __init__(self):
        for name in TABLES:
            setattr(self, name, {})

    @staticmethod
    def stamp(job: QueuedJob, team_gen: int, decision: Decision, cohorts, amount: int,
              quota: TeamQuota | None, preempts: bool) -> tuple:
        """What ``decision`` (one that admits ``job``, its team's head, nothing) depends on, as
        ``(team generation, releases on its accelerator, cohort key or None, that cohort's generation or None,
        most borrowed the cohort may hold or None)``; the loop reuses it for a job of the same key while every
        part still matches (``holds``). ``cohorts``: the ``CohortBook``; ``amount``: what the job counts
        against ``quota`` (GPUs, or CPU millicores); ``preempts``: whether it may preempt.

        Within a run of the loop, bookings only take room, quota and money away; only a release (a preemption)
        gives any back. So a job that waits or is rejected keeps that decision until its own team's usage or
        money changes or something is released on its accelerator, with, by what the decision read of the
        cohort: a job that may preempt, or a wait because the cohort cannot lend: until the cohort's usage
        changes (its generation); a capacity wait of a job that will not preempt, decided with room in the
        cohort: while the cohort's borrowed amount stays at most what still leaves room for the job (the last
        field: ``rules.cohort_has_room`` solved for the borrowed amount, as the team's usage is fixed by the
        team generation); a wait for the team's own quota or caps, a rejection, a wait for a price or a pool:
        nothing more. A budget wait depends on where the job would run, so on every booking, as does any
        decision of a job with accelerator alternatives: their stamp is ``(epoch, None, None, None, None)``.
        """
        if job.alternatives:
            return (cohorts.epoch, None, None, None, None)
        acc = job.accelerator_id
        released = cohorts.released.get(acc, 0)
        if isinstance(decision, Rejection):
            return (team_gen, released, None, None, None)
        if decision.reason == "budget":
            return (cohorts.epoch, None, None, None, None)
        if quota is None or not amount:
            return (team_gen, released, None, None, None)
        team = cohorts.teams[job.team_id]
        ckey = (team.cohort, acc)
        detail = decision.detail
        if (preempts or "cohort_lendable_gpus" in detail or "cohort_lendable_vcpus" in detail
                or job.team_id in cohorts.tree_teams):  # a tree's room is not one borrowed sum: its generation
            return (team_gen, released, ckey, cohorts.cohort_gen.get(ckey, 0), None)
        if decision.reason == "capacity":
            used, g = team.used.get(acc, 0), quota.guaranteed_gpus
            adds = max(0, used + amount - g) - max(0, used - g)  # what admitting it adds to the cohort's borrowed
            return (team_gen, released, ckey, None, cohorts.lendable.get(ckey, 0) - adds)
        return (team_gen, released, None, None, None)

    @staticmethod
    def holds(stamp: tuple, team_gen: int, acc: int, cohorts) -> bool:
        """Whether a decision stamped ``stamp`` (``stamp``'s shape) still holds for a job of the same key of a team
        now at ``team_gen``, on accelerator ``acc``."""
        if stamp[1] is None:
            return stamp[0] == cohorts.epoch
        if stamp[0] != team_gen or cohorts.released.get(acc, 0) != stamp[1]:
            return False
        if stamp[2] is None:
            return True
        if stamp[4] is None:
            return cohorts.cohort_gen.get(stamp[2], 0) == stamp[3]
        return cohorts.borrowed.get(stamp[2], 0) <= stamp[4]


class _Forget(dict):
    """A dict that drops every write: ``get`` always misses."""

    __slots__ = ()

    def __setitem__(self, key, value) -> None:
        return None


class NullMemo(DecisionMemo):
    """The memo that remembers nothing: every table drops its writes, so every decision is made afresh."""

    remembers = False

    def __init__(self):
        for name in TABLES:
            setattr(self, name, _Forget())
