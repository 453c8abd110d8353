"""The submission's budget rule (ADR 0036): refused when a block budget can never cover the cheapest estimate
(over its whole amount, or over amount - spent this period); money committed to running jobs comes back, so a job
that fits once they end is not refused; alert budgets never refuse."""

from __future__ import annotations

from decimal import Decimal

from jobs.scheduling.core import BudgetView, budget_refusal


def view(amount: str, spent: str, committed: str = "0", action: str = "block") -> BudgetView:
    return BudgetView(7, Decimal(amount), Decimal(spent), Decimal(committed), action)


def test_over_what_the_budget_can_still_give_this_period_is_refused_with_the_numbers():
    verdict = budget_refusal(Decimal("10.01"), [view("100", "90")])
    assert verdict is not None and verdict.never and verdict.reason == "budget"
    assert verdict.detail["can_give_usd"] == "10" and verdict.detail["budget_id"] == 7
    assert "over the $10.00 the budget can still give this period ($100.00, $90.00 spent)" in verdict.message


def test_over_the_whole_amount_is_refused_even_with_nothing_spent():
    verdict = budget_refusal(Decimal("100.01"), [view("100", "0")])
    assert verdict is not None and "over the whole budget of $100.00" in verdict.message


def test_committed_money_does_not_refuse_and_alert_budgets_never_do():
    assert budget_refusal(Decimal("10"), [view("100", "90", committed="50")]) is None
    assert budget_refusal(Decimal("500"), [view("100", "90", action="alert")]) is None
