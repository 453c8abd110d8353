"""Placement (``jobs.scheduling.core.choose_pool``): the cheapest healthy pool with room for every node of the job,
spot only for preemptible jobs, the spec's providers, regions and clusters obeyed, ties broken by free GPUs then
by cluster name; numbers worked out by hand."""

from jobs.scheduling.core import PlacementRequest, choose_pool
from tests.support.scheduling import pool


def test_placement_picks_the_cheapest_pool_with_room():
    offers = [pool(1, price="12.29"), pool(2, price="4.20"), pool(3, price="6.88")]
    assert choose_pool(PlacementRequest(1, 8), offers).node_pool_id == 2


def test_placement_skips_the_cheapest_pool_when_it_is_full():
    offers = [pool(1, price="12.29"), pool(2, price="4.20", free=7), pool(3, price="6.88")]
    assert choose_pool(PlacementRequest(1, 8), offers).node_pool_id == 3


def test_placement_fits_when_free_equals_request_exactly_on_each_node():
    assert choose_pool(PlacementRequest(2, 4), [pool(1, price="1", node_free=[4, 4])]).node_pool_id == 1
    assert choose_pool(PlacementRequest(2, 4), [pool(1, price="1", node_free=[8, 0])]) is None  # 8 free, one node
    assert choose_pool(PlacementRequest(3, 3), [pool(1, price="1", free=8)]) is None


def test_no_room_anywhere_means_none():
    assert choose_pool(PlacementRequest(1, 8), [pool(1, price="1", free=4), pool(2, price="2", free=0)]) is None
    assert choose_pool(PlacementRequest(1, 1), []) is None


def test_spot_is_used_only_for_preemptible_jobs():
    offers = [pool(1, price="2.20", capacity_type="spot"), pool(2, price="6.88")]
    assert choose_pool(PlacementRequest(1, 8, preemptible=False), offers).node_pool_id == 2
    assert choose_pool(PlacementRequest(1, 8, preemptible=True), offers).node_pool_id == 1


def test_preemptible_job_may_still_use_on_demand_when_cheaper_or_when_spot_is_full():
    dearer_spot = [pool(1, price="3", capacity_type="spot"), pool(2, price="2")]
    assert choose_pool(PlacementRequest(1, 8, True), dearer_spot).node_pool_id == 2
    full_spot = [pool(1, price="1", capacity_type="spot", free=0), pool(2, price="2")]
    assert choose_pool(PlacementRequest(1, 8, True), full_spot).node_pool_id == 2


def test_unhealthy_clusters_are_not_offered():
    offers = [pool(1, price="1", healthy=False), pool(2, price="9")]
    assert choose_pool(PlacementRequest(1, 1), offers).node_pool_id == 2


def test_provider_region_and_cluster_constraints_limit_the_choice():
    offers = [
        pool(1, price="4.20", provider="gcp", region="us-central1", cluster="gke-a"),
        pool(2, price="6.88", provider="aws", region="us-east-1", cluster="eks-a"),
        pool(3, price="12.29", provider="azure", region="eastus", cluster="aks-a"),
        pool(4, price="7.00", provider="aws", region="us-west-2", cluster="eks-b"),
    ]
    assert choose_pool(PlacementRequest(1, 1, providers=("aws", "azure")), offers).node_pool_id == 2
    assert choose_pool(PlacementRequest(1, 1, providers=("aws",), regions=("us-west-2",)), offers).node_pool_id == 4
    assert choose_pool(PlacementRequest(1, 1, regions=("eastus",)), offers).node_pool_id == 3
    assert choose_pool(PlacementRequest(1, 1, clusters=("aks-a", "eks-b")), offers).node_pool_id == 4
    assert choose_pool(PlacementRequest(1, 1, providers=("oci",)), offers) is None
    assert choose_pool(PlacementRequest(1, 1, providers=("gcp",), regions=("eastus",)), offers) is None


def test_more_gpus_per_node_than_the_pools_nodes_have_never_fits_even_with_enough_free_gpus():
    # 4 nodes x 4 GPUs = 16 free, but a node of 8 GPUs does not exist there
    offers = [pool(1, price="1", free=16, nodes=4, gpus_per_node=4)]
    assert choose_pool(PlacementRequest(1, 8), offers) is None
    assert choose_pool(PlacementRequest(2, 4), offers).node_pool_id == 1


def test_more_nodes_than_the_pool_has_never_fits():
    assert choose_pool(PlacementRequest(3, 1), [pool(1, price="1", free=16, nodes=2, gpus_per_node=8)]) is None


def test_equal_prices_go_to_the_pool_whose_node_fits_tightest():
    # free per node: pool 1 [0, 8], pool 2 [4, 8], pool 3 [2, 8]: a 4-GPU node fits pool 2's first node exactly
    offers = [pool(1, price="6.88", free=8), pool(2, price="6.88", free=12), pool(3, price="6.88", free=10)]
    assert choose_pool(PlacementRequest(1, 4), offers).node_pool_id == 2
    # the spread policy (the old "most free GPUs" tie-break) takes the emptiest pool instead
    whole, tight = pool(1, price="6.88", node_free=[8, 8]), pool(2, price="6.88", node_free=[4, 0])
    assert choose_pool(PlacementRequest(1, 4), [whole, tight]).node_pool_id == 2
    assert choose_pool(PlacementRequest(1, 4), [whole, tight], "spread").node_pool_id == 1
    assert choose_pool(PlacementRequest(1, 4), [whole, tight], "first-fit").node_pool_id == 1


def test_equal_price_and_free_gpus_go_to_the_cluster_name_first_in_order():
    offers = [pool(1, price="6.88", free=8, cluster="zeta"), pool(2, price="6.88", free=8, cluster="alpha")]
    assert choose_pool(PlacementRequest(1, 4), offers).cluster_name == "alpha"


def test_price_beats_free_gpus():
    offers = [pool(1, price="6.87", free=8), pool(2, price="6.88", free=16)]
    assert choose_pool(PlacementRequest(1, 4), offers).node_pool_id == 1
