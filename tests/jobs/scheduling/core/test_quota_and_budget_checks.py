"""The pure admission checks (``check_quota``, ``check_budgets``) against numbers worked out by hand: what fits,
what waits, and what can never run."""

from decimal import Decimal

from jobs.scheduling.core import QuotaView, check_budgets, check_quota
from tests.support.scheduling import alert_budget, block_budget

D = Decimal


# --- quota -------------------------------------------------------------------

def test_quota_admits_when_use_plus_request_equals_nominal_plus_borrowing():
    # 8 nominal + 4 borrowing = 12; 9 used + 3 asked = 12
    assert check_quota(3, 9, QuotaView(8, 4)).ok


def test_quota_refuses_one_gpu_over_the_limit_and_says_why_with_the_numbers():
    v = check_quota(4, 9, QuotaView(8, 4))  # 13 > 12
    assert not v.ok and not v.never
    assert v.reason == "quota"
    assert v.detail["request_gpus"] == 4 and v.detail["used_gpus"] == 9
    assert v.detail["nominal_gpus"] == 8 and v.detail["borrowing_limit_gpus"] == 4


def test_a_quota_wait_carries_the_per_job_cap_so_a_pass_can_tell_never_from_not_now():
    v = check_quota(2, 8, QuotaView(8, 0, max_gpus_per_job=4))
    assert not v.ok and not v.never and v.detail["max_gpus_per_job"] == 4


def test_quota_without_borrowing_stops_at_nominal():
    assert check_quota(8, 0, QuotaView(8)).ok
    assert not check_quota(1, 8, QuotaView(8)).ok


def test_borrowing_lets_a_team_go_above_nominal():
    assert check_quota(2, 8, QuotaView(8, 2)).ok
    assert not check_quota(2, 8, QuotaView(8, 1)).ok


def test_no_quota_means_never():
    v = check_quota(1, 0, None)
    assert not v.ok and v.never and v.reason == "quota"


def test_zero_nominal_quota_refuses_any_gpu_for_ever():
    v = check_quota(1, 0, QuotaView(0))
    assert not v.ok and v.never


def test_per_job_cap_admits_at_the_cap_and_refuses_for_ever_above_it():
    assert check_quota(4, 0, QuotaView(16, 0, max_gpus_per_job=4)).ok
    v = check_quota(5, 0, QuotaView(16, 0, max_gpus_per_job=4))
    assert not v.ok and v.never and v.detail["max_gpus_per_job"] == 4


def test_per_job_cap_of_zero_means_no_cap():
    assert check_quota(16, 0, QuotaView(16, 0, max_gpus_per_job=0)).ok


def test_a_job_larger_than_the_whole_limit_can_never_run_even_on_an_idle_team():
    v = check_quota(13, 0, QuotaView(8, 4))
    assert not v.ok and v.never
    # one that fits the limit but not now only waits
    v = check_quota(12, 1, QuotaView(8, 4))
    assert not v.ok and not v.never


# --- budgets -----------------------------------------------------------------

def test_no_budget_admits_anything():
    assert check_budgets(D("1000000"), []).ok


def test_block_budget_admits_an_estimate_equal_to_what_remains():
    # 100 - 30.25 spent - 19.75 committed = 50.00 left
    assert check_budgets(D("50.00"), [block_budget("100", "30.25", "19.75")]).ok


def test_block_budget_refuses_an_estimate_a_cent_over_what_remains():
    v = check_budgets(D("50.01"), [block_budget("100", "30.25", "19.75")])
    assert not v.ok and not v.never and v.reason == "budget"
    assert D(v.detail["remaining_usd"]) == D("50.00")
    assert D(v.detail["estimate_usd"]) == D("50.01")
    assert D(v.detail["amount_usd"]) == D("100")


def test_alert_budget_never_stops_admission_even_when_overspent():
    assert check_budgets(D("500"), [alert_budget("100", "250", "10")]).ok


def test_estimate_over_the_whole_block_amount_can_never_fit():
    v = check_budgets(D("100.01"), [block_budget("100")])
    assert not v.ok and v.never


def test_estimate_equal_to_the_whole_amount_waits_when_money_is_spent_but_is_not_never():
    v = check_budgets(D("100"), [block_budget("100", spent="0.01")])
    assert not v.ok and not v.never


def test_any_block_budget_that_is_short_refuses_even_if_others_have_room():
    v = check_budgets(D("40"), [alert_budget("10"), block_budget("1000", budget_id=7), block_budget("100", spent="70", budget_id=9)])
    assert not v.ok and v.detail["budget_id"] == 9


def test_overspent_block_budget_refuses_a_tiny_estimate():
    v = check_budgets(D("0.01"), [block_budget("100", spent="100.50")])
    assert not v.ok and not v.never
