"""What a pass keeps with the fleet's offers (``PoolOffer.derived``: node layouts, each pool's room for a shape,
the pools matching each request, a rule's pool set) changes how fast a later pass decides, never what it decides.

A loop of passes over a fleet whose inventory changes between passes (nodes booked or given back by work the
platform does not own, cordoned or opened, a node's CPU shrunk, a cluster turning unhealthy or healthy again) is
run twice: once keeping the offers of every pool that did not change (the same objects, with all an earlier pass
kept with them, in new lists or the same), once over new objects of the same content every pass (nothing kept).
Every pass must say the same: admissions (pool, nodes, GPU, victims, price), rejections, waits (reason, message,
numbers, both positions, the jobs that overtook them). The worlds are ``benchmarks/schedule.py``'s snapshot at two
or three clusters (two or three pools per accelerator, running work to preempt, budgets, jobs on part of one GPU,
StrictFIFO, backfill with reservations).
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.schedule import backfill_snapshot, renewed
from benchmarks.schedule import build as bench_build
from jobs.scheduling.core import FairShareScheduler, PoolOffer
from jobs.scheduling.core.nodebook import KEPT_FITS, _offered_fits
from jobs.scheduling.core.placement import kept_for, matching_in_price_order, matching_offers
from tests.jobs.scheduling.core.test_skip_equivalence import said


def fresh(offer: PoolOffer) -> PoolOffer:
    """A new offer of the same content, with new nodes: nothing kept with it."""
    return dataclasses.replace(offer, node_rooms=tuple(dataclasses.replace(n) for n in offer.node_rooms))


def changed(offer: PoolOffer, rng: random.Random) -> PoolOffer:
    """``offer`` after one change of its inventory, drawn by ``rng``: a node's free GPUs, CPU and memory moved by
    pods the platform does not own, a node cordoned or opened, a node's allocatable CPU shrunk (a larger request no
    longer fits it), or the cluster's health flipped. A new offer, as the platform's loader makes one."""
    rooms = list(offer.node_rooms)
    i = rng.randrange(len(rooms))
    n = rooms[i]
    kind = rng.randrange(4)
    if kind == 3:
        return dataclasses.replace(offer, healthy=not offer.healthy)
    if kind == 0 and not n.shares:
        taken = rng.randint(-n.gpus, n.gpus)
        rooms[i] = dataclasses.replace(
            n,
            free_gpus=min(max(n.free_gpus - taken, 0), n.gpus),
            free_cpu_milli=max(n.free_cpu_milli - taken * 4000, 0),
            free_memory_mib=max(n.free_memory_mib - taken * 32_768, 0),
        )
    elif kind == 1:
        rooms[i] = dataclasses.replace(n, schedulable=not n.schedulable)
    else:
        cpu = n.cpu_milli // 2
        rooms[i] = dataclasses.replace(n, cpu_milli=cpu, free_cpu_milli=min(n.free_cpu_milli, cpu))
    return dataclasses.replace(
        offer, node_rooms=tuple(rooms), free_gpus=sum(r.free_gpus for r in rooms if r.takes_work)
    )


def passes(
    seed: int,
    clusters: int,
    jobs: int,
    fractional: float,
    strict: bool,
    backfill: bool,
    rounds: int,
    keep: bool,
    same_lists: bool,
) -> list:
    """What every pass of the loop said. Between passes each pool changes with probability a half (the same draws
    whether ``keep`` or not); the jobs a pass admitted leave the queue. ``keep``: unchanged pools pass their offers
    of the pass before (in the same lists if ``same_lists``, else in new ones); else every offer is new."""
    base = bench_build(seed, fractional, jobs=jobs, clusters=clusters)[0]
    if backfill:
        base = backfill_snapshot(base, strict)
    elif strict:
        for team in base.teams.values():
            team.strategy = "StrictFIFO"
    rng = random.Random(seed)
    pools = {acc: list(offers) for acc, offers in base.pools.items()}
    queue = list(base.queue)
    told = []
    for _ in range(rounds):
        if keep:
            given = pools if same_lists else {acc: list(offers) for acc, offers in pools.items()}
        else:
            given = {acc: [fresh(o) for o in offers] for acc, offers in pools.items()}
        snapshot = renewed(dataclasses.replace(base, pools=given, queue=queue), keep_pools=True)
        decisions = FairShareScheduler(snapshot).full_pass()
        told.append(said(decisions))
        admitted = {a.job.job_id for a in decisions.admissions}
        queue = [j for j in queue if j.job_id not in admitted]
        for offers in pools.values():
            for k, offer in enumerate(offers):
                if rng.random() < 1 / 2:
                    offers[k] = changed(offer, rng)
    return told


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 10**6),
    st.sampled_from([2, 3]),
    st.integers(10, 150),
    st.sampled_from([0.0, 0.0, 0.33]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_passes_over_kept_offers_decide_as_passes_over_new_ones_after_any_inventory_change(
    seed, clusters, jobs, fractional, strict, backfill, same_lists
):
    args = (seed, clusters, jobs, fractional, strict, backfill, 6)
    assert passes(*args, keep=True, same_lists=same_lists) == passes(*args, keep=False, same_lists=same_lists)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.sampled_from([0.0, 0.33]), st.integers(1, 8))
def test_every_figure_kept_with_the_offers_is_the_one_counted_afresh_after_any_inventory_change(
    seed, fractional, rounds
):
    # the figures themselves, after each round of changes, for requests of every shape the benchmark asks and a
    # narrow shape per round: the pools matching a request (in the list's order and in price order) and a pool's
    # room for a shape, read from offers kept since the first round and from new copies
    snapshot = bench_build(seed, fractional, jobs=40, clusters=3)[0]
    rng = random.Random(seed)
    pools = {acc: list(offers) for acc, offers in snapshot.pools.items()}
    requests = [j.placement() for j in snapshot.queue]
    requests += [dataclasses.replace(r, preemptible=not r.preemptible, nodes=r.nodes + 24) for r in requests[:10]]
    for _ in range(rounds):
        shape = (rng.choice((0.5, 1.0, 2.0, 4.0)), rng.choice((0.0, 4000.0, 48_000.0)), rng.choice((0.0, 65_536.0)))
        for offers in pools.values():
            new = [fresh(o) for o in offers]
            for request in requests:
                assert matching_offers(request, offers) == matching_offers(request, new)
                assert matching_in_price_order(request, offers) == matching_in_price_order(request, new)
            for kept, copy in zip(offers, new, strict=True):
                assert _offered_fits(kept, shape) == _offered_fits(copy, shape)
            for k, offer in enumerate(offers):
                if rng.random() < 1 / 2:
                    offers[k] = changed(offer, rng)


def test_a_list_with_another_offer_anywhere_is_matched_afresh():
    # three pools of accelerator 0, nodes of 8 GPUs, 96 cores and 1 TiB that hold any of the benchmark's jobs: a
    # pool matches when healthy and, for a job that is not preemptible, on demand
    snapshot = bench_build(1, jobs=10, clusters=3)[0]
    offers = list(snapshot.pools[0])
    request = dataclasses.replace(snapshot.queue[0].placement(), preemptible=True)
    assert matching_offers(request, offers) == tuple(offers)
    # the last pool turns unhealthy: a new offer there, the first offer (which keeps the list) unchanged
    offers[-1] = dataclasses.replace(offers[-1], healthy=False)
    assert matching_offers(request, offers) == tuple(offers[:-1])
    on_demand = dataclasses.replace(request, preemptible=False)
    assert matching_offers(on_demand, offers) == tuple(o for o in offers[:-1] if o.capacity_type != "spot")
    # a shorter list headed by the same offer is another list
    assert kept_for(offers[:1], "as given", tuple) == (offers[0],)
    assert kept_for(offers, "as given", tuple) == tuple(offers)


def test_a_pool_keeps_its_room_for_the_latest_shapes_only_and_counts_any_other_afresh():
    # node 0 of pool 1 runs a 4-GPU job (16 cores, 128 GiB taken: 4 GPUs, 80 cores, 896 GiB free), node 1 is empty
    # (8 GPUs, 96 cores, 1 TiB free): pods of g GPUs and c cores fit floor(min(free GPUs / g, free cores / c))
    offer = bench_build(1, jobs=10, clusters=1)[0].pools[0][0]
    shapes = [(1.0, 1000.0 * k, 0.0) for k in range(1, KEPT_FITS + 5)]
    for shape in shapes:
        _offered_fits(offer, shape)
    assert sum(1 for k in offer.derived if isinstance(k, tuple) and k[0] == "fits") == KEPT_FITS
    for g, c, _ in shapes:  # kept or counted again, each as worked out above
        expected = [int(min(4 / g, 80_000 / c)), int(min(8 / g, 96_000 / c))]
        assert _offered_fits(offer, (g, c, 0.0))[:2] == expected
