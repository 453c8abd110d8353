"""The pure admission rules (quota, budgets) and placement, against numbers worked out by hand."""

from decimal import Decimal

from jobs.scheduling.core import (
    BudgetView,
    PlacementRequest,
    PoolOffer,
    QuotaView,
    check_budgets,
    check_quota,
    choose_pool,
)

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

def block(amount, spent="0", committed="0", budget_id=1):
    return BudgetView(budget_id, D(amount), D(spent), D(committed), "block")


def alert(amount, spent="0", committed="0", budget_id=2):
    return BudgetView(budget_id, D(amount), D(spent), D(committed), "alert")


def test_no_budget_admits_anything():
    assert check_budgets(D("1000000"), []).ok


def test_block_budget_admits_an_estimate_equal_to_what_remains():
    # 100 - 30.25 spent - 19.75 committed = 50.00 left
    assert check_budgets(D("50.00"), [block("100", "30.25", "19.75")]).ok


def test_block_budget_refuses_an_estimate_a_cent_over_what_remains():
    v = check_budgets(D("50.01"), [block("100", "30.25", "19.75")])
    assert not v.ok and not v.never and v.reason == "budget"
    assert D(v.detail["remaining_usd"]) == D("50.00")
    assert D(v.detail["estimate_usd"]) == D("50.01")
    assert D(v.detail["amount_usd"]) == D("100")


def test_alert_budget_never_stops_admission_even_when_overspent():
    assert check_budgets(D("500"), [alert("100", "250", "10")]).ok


def test_estimate_over_the_whole_block_amount_can_never_fit():
    v = check_budgets(D("100.01"), [block("100")])
    assert not v.ok and v.never


def test_estimate_equal_to_the_whole_amount_waits_when_money_is_spent_but_is_not_never():
    v = check_budgets(D("100"), [block("100", spent="0.01")])
    assert not v.ok and not v.never


def test_any_block_budget_that_is_short_refuses_even_if_others_have_room():
    v = check_budgets(D("40"), [alert("10"), block("1000", budget_id=7), block("100", spent="70", budget_id=9)])
    assert not v.ok and v.detail["budget_id"] == 9


def test_overspent_block_budget_refuses_a_tiny_estimate():
    v = check_budgets(D("0.01"), [block("100", spent="100.50")])
    assert not v.ok and not v.never


# --- placement ---------------------------------------------------------------

def offer(pool_id, price, free=16, *, cluster=None, provider="aws", region="us-east-1", capacity="on-demand",
          nodes=2, gpus_per_node=8, healthy=True):
    return PoolOffer(node_pool_id=pool_id, cluster_id=pool_id, cluster_name=cluster or f"c{pool_id}", provider=provider,
                     region=region, capacity_type=capacity, nodes=nodes, gpus_per_node=gpus_per_node, free_gpus=free,
                     usd_per_gpu_hour=D(price), healthy=healthy)


def test_placement_picks_the_cheapest_pool_with_room():
    offers = [offer(1, "12.29"), offer(2, "4.20"), offer(3, "6.88")]
    assert choose_pool(PlacementRequest(1, 8), offers).node_pool_id == 2


def test_placement_skips_the_cheapest_pool_when_it_is_full():
    offers = [offer(1, "12.29"), offer(2, "4.20", free=7), offer(3, "6.88")]
    assert choose_pool(PlacementRequest(1, 8), offers).node_pool_id == 3


def test_placement_fits_when_free_equals_request_exactly():
    assert choose_pool(PlacementRequest(2, 4), [offer(1, "1", free=8)]).node_pool_id == 1
    assert choose_pool(PlacementRequest(3, 3), [offer(1, "1", free=8)]) is None


def test_no_room_anywhere_means_none():
    assert choose_pool(PlacementRequest(1, 8), [offer(1, "1", free=4), offer(2, "2", free=0)]) is None
    assert choose_pool(PlacementRequest(1, 1), []) is None


def test_spot_is_used_only_for_preemptible_jobs():
    offers = [offer(1, "2.20", capacity="spot"), offer(2, "6.88")]
    assert choose_pool(PlacementRequest(1, 8, preemptible=False), offers).node_pool_id == 2
    assert choose_pool(PlacementRequest(1, 8, preemptible=True), offers).node_pool_id == 1


def test_preemptible_job_may_still_use_on_demand_when_cheaper_or_when_spot_is_full():
    assert choose_pool(PlacementRequest(1, 8, True), [offer(1, "3", capacity="spot"), offer(2, "2")]).node_pool_id == 2
    assert choose_pool(PlacementRequest(1, 8, True), [offer(1, "1", capacity="spot", free=0), offer(2, "2")]).node_pool_id == 2


def test_unhealthy_clusters_are_not_offered():
    offers = [offer(1, "1", healthy=False), offer(2, "9")]
    assert choose_pool(PlacementRequest(1, 1), offers).node_pool_id == 2


def test_provider_region_and_cluster_constraints_limit_the_choice():
    offers = [
        offer(1, "4.20", provider="gcp", region="us-central1", cluster="gke-a"),
        offer(2, "6.88", provider="aws", region="us-east-1", cluster="eks-a"),
        offer(3, "12.29", provider="azure", region="eastus", cluster="aks-a"),
        offer(4, "7.00", provider="aws", region="us-west-2", cluster="eks-b"),
    ]
    assert choose_pool(PlacementRequest(1, 1, providers=("aws", "azure")), offers).node_pool_id == 2
    assert choose_pool(PlacementRequest(1, 1, providers=("aws",), regions=("us-west-2",)), offers).node_pool_id == 4
    assert choose_pool(PlacementRequest(1, 1, regions=("eastus",)), offers).node_pool_id == 3
    assert choose_pool(PlacementRequest(1, 1, clusters=("aks-a", "eks-b")), offers).node_pool_id == 4
    assert choose_pool(PlacementRequest(1, 1, providers=("oci",)), offers) is None
    assert choose_pool(PlacementRequest(1, 1, providers=("gcp",), regions=("eastus",)), offers) is None


def test_more_gpus_per_node_than_the_pools_nodes_have_never_fits_even_with_enough_free_gpus():
    # 4 nodes x 4 GPUs = 16 free, but a node of 8 GPUs does not exist there
    offers = [offer(1, "1", free=16, nodes=4, gpus_per_node=4)]
    assert choose_pool(PlacementRequest(1, 8), offers) is None
    assert choose_pool(PlacementRequest(2, 4), offers).node_pool_id == 1


def test_more_nodes_than_the_pool_has_never_fits():
    assert choose_pool(PlacementRequest(3, 1), [offer(1, "1", free=16, nodes=2, gpus_per_node=8)]) is None


def test_equal_prices_go_to_the_pool_with_the_most_free_gpus():
    offers = [offer(1, "6.88", free=8), offer(2, "6.88", free=12), offer(3, "6.88", free=10)]
    assert choose_pool(PlacementRequest(1, 4), offers).node_pool_id == 2


def test_equal_price_and_free_gpus_go_to_the_cluster_name_first_in_order():
    offers = [offer(1, "6.88", free=8, cluster="zeta"), offer(2, "6.88", free=8, cluster="alpha")]
    assert choose_pool(PlacementRequest(1, 4), offers).cluster_name == "alpha"


def test_price_beats_free_gpus():
    offers = [offer(1, "6.87", free=8), offer(2, "6.88", free=16)]
    assert choose_pool(PlacementRequest(1, 4), offers).node_pool_id == 1
