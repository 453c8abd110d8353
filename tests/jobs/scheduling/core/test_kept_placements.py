"""What the node book and the room keep between placements (a pool's best-fit answer per request shape until the
pool changes, ``nodebook._PoolNodes.fits``; the pools with enough free GPUs per pool list until a release,
``room.Room._with_room``; a pool's room for the narrower jobs' mean shape until it changes,
``nodebook._PoolNodes.narrow``) never changes a placement: at every step of random bookings and releases, the answer
with what was kept is the answer of the same book with nothing kept, over every pool of the list.

The waiting jobs' counts per pool set (``scarcity.PoolDemand.observe_all``, counted per class of job) are the
plain per-job sums, each count's additions in the jobs' order, compared exactly.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import FairShareScheduler, Snapshot
from jobs.scheduling.core.fragmentation import SHAPE_HALF_LIFE_S
from jobs.scheduling.core.scarcity import PoolDemand
from tests.support.scheduling import H100, job, pool, team

PRICES = ("2.00", "2.00", "3.00")


@st.composite
def fleets(draw):
    """Pools of 2 to 4 nodes of 8 GPUs, each node with its own free GPUs and CPU, at one of two prices, some
    spot."""
    offers = []
    for pid in range(1, draw(st.integers(2, 6)) + 1):
        n = draw(st.integers(2, 4))
        offers.append(
            pool(
                pid,
                8 * n,
                nodes=n,
                price=draw(st.sampled_from(PRICES)),
                capacity_type=draw(st.sampled_from(("on-demand", "spot"))),
                node_free=draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)),
                cpu=64_000,
                cpu_free=draw(st.lists(st.sampled_from((8_000, 32_000, 64_000)), min_size=n, max_size=n)),
            )
        )
    return offers


steps = st.lists(
    st.tuples(
        st.sampled_from(("place", "place", "place", "release")),
        st.integers(1, 2),
        st.sampled_from((1, 2, 4, 8)),
        st.sampled_from((0, 8_000, 16_000)),
        st.booleans(),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=30,
)


def fresh(book, request, offers):
    """``NodeBook.place`` of ``request`` over all ``offers`` with nothing kept from earlier placements."""
    for p in book.pools.values():
        p.fits.clear()
        p.narrow = None
    return book.place(request, offers)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), steps)
def test_kept_answers_place_every_job_where_a_fresh_look_does(offers, plan):
    # jobs held to one cluster each wait: a pool wanted by them scores higher for a job that can go anywhere
    narrow = [dataclasses.replace(job(1, 8, nodes=4, job_id=10**6 + pid), clusters=(f"c{pid}",)) for pid in (1, 2, 3)]
    scheduler = FairShareScheduler(Snapshot({1: team(1, 1000)}, {H100: offers}, narrow))
    room, book = scheduler.room, scheduler.book
    released = 0
    for n, (op, nodes, gpus, cpu, spot, pick) in enumerate(plan):
        if op == "release":  # a node's GPUs in use given back: what was kept for the accelerator is read afresh
            pid = offers[pick % len(offers)].node_pool_id
            p = book.pools[pid]
            i = pick % len(p.names)
            used = p.gpus[i] - p.free_g[i]
            if used:
                book.release(pid, (p.names[i],), used, used, 0, 0)
                released += 1
            continue
        queued = job(1, gpus, nodes=nodes, cpu=cpu, job_id=n + 1, preemptible=spot)
        pools, _, pids = room.matching_entry(queued, H100)
        request = queued.placement()
        kept = book.place(request, room._with_room(pools, pids, request.total_gpus, released))
        assert kept == fresh(book, request, pools)
        if kept is not None:
            book.take(kept[0].node_pool_id, kept[1], request)


FLEET = {H100: [pool(1, 16), pool(2, 32, capacity_type="spot"), pool(3, 16, gpus_per_node=2)]}


def plain_counts(jobs, half_life_s):
    """Per pool set and per sized pool set, the decayed pods, GPUs, CPU and memory of ``jobs`` (oldest first), one
    job at a time, weighed ``2 ** (age in half lives)`` from the first one counted (every job here is within
    ``fragmentation.RESCALE_HALF_LIVES`` of it)."""
    demand = PoolDemand(FLEET)
    counts: dict = {}
    sized: dict = {}
    ref = None
    for j in sorted(jobs, key=lambda j: j.submitted):
        gpus = j.total_gpus
        if gpus <= 0:
            continue
        ref = j.submitted if ref is None else ref
        weight = math.pow(2.0, (j.submitted - ref) / half_life_s)
        for table, key in ((counts, demand.pool_set(j)), (sized, demand.sized_pool_set(j))):
            count = table.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            for k, amount in enumerate((j.nodes, gpus, j.nodes * j.cpu_milli, j.nodes * j.memory_mib)):
                count[k] += amount * weight
    return counts, sized


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 3),
            st.sampled_from((0, 1, 2, 8)),
            st.sampled_from((0, 4_000, 12_000)),
            st.floats(0, 3 * SHAPE_HALF_LIFE_S),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_the_counts_of_the_waiting_jobs_are_the_plain_sums_exactly(specs):
    jobs = [
        job(1, gpus, nodes=nodes, cpu=cpu, at=at, job_id=n + 1, preemptible=spot)
        for n, (nodes, gpus, cpu, at, spot) in enumerate(specs)
    ]
    demand = PoolDemand(FLEET, jobs)
    demand.narrowed()  # counts the waiting jobs
    counts, sized = plain_counts(jobs, demand.half_life_s)
    assert demand.counts == counts and list(demand.counts) == list(counts)  # in the order first counted
    assert demand.sized == sized and list(demand.sized) == list(sized)


def test_a_pool_left_out_for_want_of_room_comes_back_when_its_gpus_are_given_back():
    cheap, dear = pool(1, 8, price="2.00"), pool(2, 8, price="3.00")  # one node of 8 GPUs each
    scheduler = FairShareScheduler(Snapshot({1: team(1, 1000)}, {H100: [cheap, dear]}, []))
    room, book = scheduler.room, scheduler.book
    queued = job(1, 8)
    pools, _, pids = room.matching_entry(queued, H100)
    request = queued.placement()

    def place(released):
        found = book.place(request, room._with_room(pools, pids, 8, released))
        if found is not None:
            book.take(found[0].node_pool_id, found[1], request)
        return None if found is None else found[0].node_pool_id

    assert [place(0), place(0), place(0)] == [1, 2, None]  # the cheaper pool first, then the other; then none
    book.release(1, ("1-0",), 8, 8, 0, 0)  # the cheaper pool's node is free again (one release)
    assert place(1) == 1


def test_a_pool_booked_since_is_scored_by_its_room_now():
    # jobs held to one cluster each wait for whole nodes of pools 1 and 2: the fuller of the two is the more
    # wanted by them for its room, so a job that can go to either moves to the other as the first fills
    offers = [pool(1, 32, nodes=4), pool(2, 32, nodes=4)]
    narrow = [dataclasses.replace(job(1, 8, nodes=4, job_id=10**6 + pid), clusters=(f"c{pid}",)) for pid in (1, 2)]
    scheduler = FairShareScheduler(Snapshot({1: team(1, 1000)}, {H100: offers}, narrow))
    room, book = scheduler.room, scheduler.book
    for n in range(9):
        queued = job(1, 8, job_id=n + 1)
        pools, _, _ = room.matching_entry(queued, H100)
        request = queued.placement()
        kept = book.place(request, pools)
        assert kept == fresh(book, request, pools)
        if kept is not None:
            book.take(kept[0].node_pool_id, kept[1], request)
    assert all(p.free_total == 0 for p in book.pools.values())
