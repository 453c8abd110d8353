"""Admission rules: may a team start a job of this size and estimated cost now?

Pure functions over plain numbers (GPUs, USD), so the scheduler can grow
fair share and preemption around them and tests can check them by hand.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer of one rule: ``ok``, otherwise ``reason`` (``quota``, ``budget``) with the numbers in ``detail``.

    ``never`` is True when the request could not pass even with nothing else
    running or spent: the job should be rejected rather than wait.
    """

    ok: bool
    reason: str = ""
    message: str = ""
    detail: dict = dataclasses.field(default_factory=dict)
    never: bool = False


OK = Verdict(True)


@dataclasses.dataclass(frozen=True)
class QuotaView:
    """A team's quota for one accelerator: nominal and borrowing limit, GPUs; per-job cap (0 = none)."""

    nominal_gpus: int
    borrowing_limit_gpus: int = 0
    max_gpus_per_job: int = 0


def check_quota(request_gpus: int, used_gpus: int, quota: QuotaView | None) -> Verdict:
    """Admit when ``used_gpus + request_gpus <= nominal + borrowing limit`` (Kueue's ClusterQueue rule).

    A job larger than the per-job cap or than the whole limit can never run.
    """
    if quota is None:
        return Verdict(False, "quota", "the team has no quota for this accelerator", {"request_gpus": request_gpus}, never=True)
    limit = quota.nominal_gpus + quota.borrowing_limit_gpus
    # The per-job cap is in every verdict: a scheduling pass that skips jobs at least as large as one that
    # waited must still try (and reject) those over the cap.
    detail = {"request_gpus": request_gpus, "used_gpus": used_gpus, "nominal_gpus": quota.nominal_gpus,
              "borrowing_limit_gpus": quota.borrowing_limit_gpus, "max_gpus_per_job": quota.max_gpus_per_job}
    if quota.max_gpus_per_job and request_gpus > quota.max_gpus_per_job:
        return Verdict(False, "quota", f"job asks {request_gpus} GPUs, over the per-job cap of {quota.max_gpus_per_job}",
                       detail, never=True)
    if request_gpus > limit:
        return Verdict(False, "quota", f"job asks {request_gpus} GPUs, over the team's limit of {limit}", detail, never=True)
    if used_gpus + request_gpus > limit:
        return Verdict(False, "quota", f"{used_gpus} of {limit} GPUs in use; {request_gpus} more would exceed the quota", detail)
    return OK


@dataclasses.dataclass(frozen=True)
class BudgetView:
    """A budget's state in its current period, USD: amount, spent (ledger), committed (running jobs' remaining estimate)."""

    budget_id: int
    amount_usd: Decimal
    spent_usd: Decimal
    committed_usd: Decimal
    action: str

    @property
    def remaining_usd(self) -> Decimal:
        return self.amount_usd - self.spent_usd - self.committed_usd


def check_budgets(estimate_usd: Decimal, budgets: list[BudgetView]) -> Verdict:
    """Admit unless a ``block`` budget's remaining money (amount - spent - committed) is below ``estimate_usd``.

    ``alert`` budgets never stop admission. An estimate above a block
    budget's whole amount can never fit: ``never`` is set.
    """
    for b in budgets:
        if b.action != "block" or estimate_usd <= b.remaining_usd:
            continue
        detail = {"budget_id": b.budget_id, "estimate_usd": str(estimate_usd), "amount_usd": str(b.amount_usd),
                  "spent_usd": str(b.spent_usd), "committed_usd": str(b.committed_usd), "remaining_usd": str(b.remaining_usd)}
        never = estimate_usd > b.amount_usd
        msg = (f"estimated ${estimate_usd:.2f} is over the whole budget of ${b.amount_usd:.2f}" if never else
               f"estimated ${estimate_usd:.2f} is over the ${max(b.remaining_usd, Decimal(0)):.2f} left in the budget")
        return Verdict(False, "budget", msg, detail, never=never)
    return OK
