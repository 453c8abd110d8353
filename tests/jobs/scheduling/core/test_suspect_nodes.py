"""Suspect nodes in the pure core: a node marked suspect (``NodeRoom.suspect``) still takes work and counts as
capacity, but every packing policy tries it last, so a job lands on it only when the pool's other nodes cannot
hold it; between pools of one price the pool that needs no suspect node wins, a cheaper pool still wins on one.
Expected placements are worked out by hand from the pools' free GPUs."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.scheduling.core import PACKING_POLICIES, NodeBook, PlacementRequest, choose_pool
from tests.support.scheduling import admitted, decide, job, pool, team


def with_suspect(offer, *indexes: int):
    """``offer`` with the nodes at ``indexes`` marked suspect."""
    rooms = tuple(dataclasses.replace(r, suspect=True) if i in indexes else r for i, r in enumerate(offer.node_rooms))
    return dataclasses.replace(offer, node_rooms=rooms)


def placed(offer, request: PlacementRequest, policy: str) -> tuple[str, ...] | None:
    book = NodeBook([offer], policy)
    nodes = book.fit(offer.node_pool_id, request)
    return None if nodes is None else book.names(offer.node_pool_id, nodes)


@pytest.mark.parametrize("policy", PACKING_POLICIES)
def test_of_two_nodes_that_fit_the_job_goes_to_the_healthy_one(policy):
    # Node 0 is the one every policy prefers when both are healthy (best-fit and fgd: the tighter, 4 GPUs
    # free; first-fit: the first), except spread (the loosest): so mark the preferred one suspect per policy.
    offer = pool(1, 16, node_free=[8, 4] if policy == "spread" else [4, 8])
    assert placed(offer, PlacementRequest(1, 4), policy) == ("1-0",)
    assert placed(with_suspect(offer, 0), PlacementRequest(1, 4), policy) == ("1-1",)


@pytest.mark.parametrize("policy", PACKING_POLICIES)
def test_when_only_the_suspect_node_fits_the_job_goes_there(policy):
    offer = with_suspect(pool(1, 16, node_free=[8, 2]), 0)  # node 1 has 2 GPUs free: too few for 4
    assert placed(offer, PlacementRequest(1, 4), policy) == ("1-0",)


@pytest.mark.parametrize("policy", PACKING_POLICIES)
def test_a_suspect_node_completes_a_gang_the_healthy_nodes_cannot_hold_alone(policy):
    offer = with_suspect(pool(1, 24, node_free=[8, 8, 8]), 1)
    assert placed(offer, PlacementRequest(2, 8), policy) == ("1-0", "1-2")
    assert sorted(placed(offer, PlacementRequest(3, 8), policy)) == ["1-0", "1-1", "1-2"]


def test_healthy_nodes_across_domains_come_before_a_domain_completed_by_a_suspect_node():
    # Rack a: 1-0 healthy, 1-1 suspect; rack b: 1-2 healthy, 1-3 busy. Two healthy nodes exist only across racks.
    offer = with_suspect(pool(1, 32, node_free=[8, 8, 8, 0], domains=["a", "a", "b", "b"]), 1)
    assert sorted(placed(offer, PlacementRequest(2, 8), "best-fit")) == ["1-0", "1-2"]
    # Without the suspect mark the rack-local pair wins, as before.
    plain = pool(1, 32, node_free=[8, 8, 8, 0], domains=["a", "a", "b", "b"])
    assert sorted(placed(plain, PlacementRequest(2, 8), "best-fit")) == ["1-0", "1-1"]


def test_suspect_nodes_count_as_capacity():
    offer = with_suspect(pool(1, 16, node_free=[8, 2]), 0)
    book = NodeBook([offer])
    assert book.free_gpus(1) == 10 and book.most_free(1) == 8
    assert book.nodes_with_room(1, PlacementRequest(1, 4)) == 1


@pytest.mark.parametrize("policy", ["best-fit", "spread", "fgd"])
def test_between_pools_of_one_price_the_one_without_a_suspect_node_wins(policy):
    # Pool 1's node is the policy's choice while both are healthy (the tighter for best-fit and fgd, the looser
    # for spread); once it is suspect, pool 2's healthy node is taken instead.
    sick_free, well_free = ([8], [4]) if policy == "spread" else ([4], [8])
    request = PlacementRequest(1, 4)
    assert choose_pool(request, [pool(1, 8, node_free=sick_free), pool(2, 8, node_free=well_free)],
                       policy).node_pool_id == 1
    sick = with_suspect(pool(1, 8, node_free=sick_free), 0)
    assert choose_pool(request, [sick, pool(2, 8, node_free=well_free)], policy).node_pool_id == 2


def test_a_cheaper_pool_wins_even_on_a_suspect_node():
    sick = with_suspect(pool(1, 8, price="2.00"), 0)
    well = pool(2, 8, price="3.00")
    assert choose_pool(PlacementRequest(1, 8), [sick, well]).node_pool_id == 1


def test_the_pass_admits_to_the_healthy_node_and_then_to_the_suspect_one():
    offer = with_suspect(pool(1, 16), 0)
    first, second = job(1, 8, at=1), job(1, 8, at=2)
    d, _ = decide([team(1, 16)], [offer], [first, second])
    assert admitted(d) == [first.job_id, second.job_id]
    assert [a.node_names for a in d.admissions] == [("1-1",), ("1-0",)]


def test_best_fit_between_pools_of_one_price_still_takes_the_tightest_after_a_healthy_fit():
    # A 2-GPU job: pool 1's node leaves 4 GPUs, pool 2's leaves 1, pool 3's leaves 0 but only on a suspect node.
    # Best-fit reads pool 1 first and must still look at pool 2 (fewer GPUs left, no suspect node) and take it.
    request = PlacementRequest(1, 2)
    loose, tight = pool(1, 8, node_free=[6]), pool(2, 8, node_free=[3])
    assert choose_pool(request, [loose, tight], "best-fit").node_pool_id == 2
    exact_but_sick = with_suspect(pool(3, 8, node_free=[2]), 0)
    assert choose_pool(request, [loose, tight, exact_but_sick], "best-fit").node_pool_id == 2
    assert choose_pool(request, [exact_but_sick, loose, tight], "best-fit").node_pool_id == 2
