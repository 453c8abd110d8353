"""The node book's layout of a pool is kept with its offer (``PoolOffer.derived``) from one pass to the next: a pass
over an offer seen before starts from the nodes as offered, never from what an earlier pass booked, and an offer
whose nodes changed (a new offer) is laid out from its own nodes. Expected placements worked out by hand: best fit
takes the node with the fewest free GPUs that still holds the job.
"""

from __future__ import annotations

import dataclasses

from jobs.scheduling.core import FairShareScheduler, Snapshot
from tests.support.scheduling import H100, job, pool, team


def _pass(offers, queue):
    """One full pass of a new scheduler over ``offers`` (the objects themselves, as a loop that keeps its fleet's
    offers passes them) with a new team of 16 GPUs; returns the admissions as (job id, pool id, node names)."""
    snapshot = Snapshot({1: team(1, 16)}, {H100: list(offers)}, list(queue))
    return [(a.job.job_id, a.offer.node_pool_id, a.node_names)
            for a in FairShareScheduler(snapshot).full_pass().admissions]


def test_a_pass_starts_from_the_nodes_as_offered_not_from_what_the_pass_before_booked():
    # node 1-0 has 8 GPUs free, 1-1 has 4: a 4-GPU job fits 1-1 best, and fills it
    offer = pool(1, 16, node_free=[8, 4])
    assert _pass([offer], [job(1, 4, job_id=1)]) == [(1, 1, ("1-1",))]
    # the same offer again: 1-1 is free as offered (the first pass's booking was its own), so best fit takes it
    # again; had the booking leaked into the kept layout, 1-1 would be full and the job would go to 1-0
    assert _pass([offer], [job(1, 4, job_id=2)]) == [(2, 1, ("1-1",))]
    # two jobs in one pass: the second finds 1-1 full and goes to 1-0, and the next pass sees both free again
    assert _pass([offer], [job(1, 4, job_id=3, at=0), job(1, 4, job_id=4, at=1)]) == [
        (3, 1, ("1-1",)), (4, 1, ("1-0",))]
    assert _pass([offer], [job(1, 4, job_id=5)]) == [(5, 1, ("1-1",))]


def test_an_offer_whose_nodes_changed_is_laid_out_from_its_own_nodes():
    offer = pool(1, 16, node_free=[8, 4])
    assert _pass([offer], [job(1, 4, job_id=1)]) == [(1, 1, ("1-1",))]  # the first offer laid out and kept
    # node 1-1 now busy (the inventory changed): a new offer of the same pool, whose layout is its own
    rooms = (offer.node_rooms[0], dataclasses.replace(offer.node_rooms[1], free_gpus=0))
    changed = dataclasses.replace(offer, node_rooms=rooms, free_gpus=8)
    assert _pass([changed], [job(1, 4, job_id=2)]) == [(2, 1, ("1-0",))]
    # two nodes of 4 GPUs each: only 1-0 has 4 free now, so the job waits (with the first offer's layout, 1-0 and
    # 1-1 would hold it)
    assert _pass([changed], [job(1, 4, job_id=3, nodes=2)]) == []
    assert _pass([offer], [job(1, 4, job_id=4, nodes=2)]) == [(4, 1, ("1-1", "1-0"))]  # the tightest first
    # the first offer is as it was: its own kept layout, both nodes free as it offers them
    assert _pass([offer], [job(1, 8, job_id=5, at=0), job(1, 4, job_id=6, at=1)]) == [
        (5, 1, ("1-0",)), (6, 1, ("1-1",))]
