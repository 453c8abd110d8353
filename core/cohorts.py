"""Cohort arithmetic of Kueue's ClusterQueue/Cohort model, written once: what part of a nominal quota a team
lends, and the most a team can reach.

Pure functions over whole numbers (GPUs, or vCPUs / CPU millicores for a CPU quota: the unit is the caller's and
the same on every argument). The scheduling core (``jobs.scheduling.core.cohort``) and the quota rows
(``quotas.models.Quota``) both ask these, so the API, the UI, the submission checks and admission say the same
number. Sources: Kueue's "Cluster Queue" and "Cohort" concepts (nominalQuota, borrowingLimit, lendingLimit);
docs/adr/0003-borrowing-from-idle-nominal-quota.md.
"""

from __future__ import annotations


def lendable(nominal: int, lending_limit: int | None) -> int:
    """The part of ``nominal`` the other teams of the cohort may borrow: all of it without a lending limit, else at
    most the lending limit (Kueue's ``lendingLimit``). Never negative for non-negative arguments."""
    return nominal if lending_limit is None else min(lending_limit, nominal)


def reachable(nominal: int, borrowing_limit: int, lendable_by_others: int) -> int:
    """The most a team can ever hold: its nominal, plus what it may borrow, which is at most what the other teams
    of its cohort can lend: ``nominal + min(borrowing_limit, max(lendable_by_others, 0))``."""
    return nominal + min(borrowing_limit, max(lendable_by_others, 0))
