"""Unhealthy nodes in the pure core: a node marked unhealthy (``NodeRoom.healthy`` False) takes no work whatever room
it has, its free GPUs do not count, and the wait reason names it; expected placements worked out by hand."""

from __future__ import annotations

import dataclasses

from jobs.scheduling.core import NodeBook, PlacementRequest
from tests.support.scheduling import admitted, decide, job, pool, team


def with_unhealthy(offer, *indexes: int):
    """``offer`` with the nodes at ``indexes`` marked unhealthy."""
    rooms = tuple(dataclasses.replace(r, healthy=False) if i in indexes else r for i, r in enumerate(offer.node_rooms))
    return dataclasses.replace(offer, node_rooms=rooms)


def test_the_node_book_never_hands_out_an_unhealthy_node_nor_counts_its_gpus():
    offer = with_unhealthy(pool(1, 24, node_free=[8, 8, 2]), 0)  # node 0: all free, unhealthy
    book = NodeBook([offer])
    assert book.free_gpus(1) == 10 and book.most_free(1) == 8
    assert book.names(1, book.fit(1, PlacementRequest(1, 8))) == ("1-1",)
    assert book.fit(1, PlacementRequest(2, 8)) is None


def test_a_job_waits_rather_than_run_on_the_only_free_node_when_it_is_unhealthy_and_the_reason_names_it():
    offer = with_unhealthy(pool(1, 16, node_free=[8, 0], cluster="eks"), 0)
    want = job(1, 8)
    d, _ = decide([team(1, 16)], [offer], [want])
    w = d.waiting[want.job_id]
    assert admitted(d) == [] and w.reason == "capacity" and not w.detail.get("fleet_change")
    assert "1 large enough node is unhealthy and left out (GPU errors or attempts lost there): eks/1/1-0" in w.message


def test_a_gang_that_needs_the_unhealthy_node_waits_for_the_fleet_to_change_without_blocking_its_team():
    offer = with_unhealthy(pool(1, 16, cluster="eks"), 1)
    gang, small = job(1, 8, nodes=2, at=1), job(1, 8, at=2)
    d, _ = decide([team(1, 16, strategy="StrictFIFO")], [offer], [gang, small])
    assert admitted(d) == [small.job_id]
    w = d.waiting[gang.job_id]
    assert w.detail["fleet_change"]
    assert "1 large enough node is cordoned, tainted or unhealthy" in w.message and "eks/1/1-1" in w.message
