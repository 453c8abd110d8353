"""What the node book remembers to place shares fast (each node's rank per request shape, read again only for the
nodes that changed; one FGD choice per node state; CPU and memory compared by the shapes' steps) changes how fast
a share is placed, never where.

Differential: random pools of nodes that share their GPUs (time-sliced, or whole and shared), random shares taken
and given back, whole GPUs taken on mixed nodes and shapes seen meanwhile; after every step the book's node and GPU
for each of several requests must be the plain reference's, written here from the rule (``NodeBook._share_node``'s
order: healthy first, least fragmentation growth, least room left on the GPU, then on the node's GPUs, least free
CPU, then memory, then the node's index) with the fragmentation computed afresh by ``fragmentation.share_fragment`` on the raw numbers."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from jobs.scheduling.core import NodeBook, NodeRoom, PlacementRequest, PoolOffer
from jobs.scheduling.core.fragmentation import NodeGpus, ShapeHistory, share_fragment, step_down
from jobs.scheduling.core.nodebook import GROWTH_DIGITS


def world(rng: random.Random) -> PoolOffer:
    rooms = []
    for i in range(rng.randint(2, 10)):
        n, whole = rng.randint(1, 4), rng.random() < 0.4
        free = tuple(rng.choice((1000, 1000, 750, 500, 200, 0)) for _ in range(n))
        slices = tuple(rng.choice((1, 2, 4, 8)) for _ in range(n))
        cpu, memory = rng.choice((8000, 16_000, 64_000)), rng.choice((16_384, 65_536, 262_144))
        gpus = sum(1 for f in free if f == 1000) if whole else 0
        rooms.append(NodeRoom(f"n{i}", n if whole else 0, gpus, cpu, cpu, memory, memory, f"r{i % 2}",
                              suspect=rng.random() < 0.15, shares=free, slices=slices))
    return PoolOffer(1, 1, "c", "aws", "us-east-1", "on-demand", len(rooms), 4, sum(r.free_gpus for r in rooms),
                     Decimal("4.00"), node_rooms=tuple(rooms))


def reference(book: NodeBook, request: PlacementRequest) -> tuple[int, int] | None:
    """(node, GPU) for ``request`` by the rule, every fragmentation computed afresh; None when no node holds it."""
    p, shapes = book.pools[1], book.milli_shapes()
    best = None
    for i in range(len(p.names)):
        c, m = p.free_c[i], p.free_m[i]
        if not p.sched[i] or c < request.cpu_milli or m < request.memory_mib:
            continue
        shares, slices = p.shares[i], p.slices[i]
        before = share_fragment(NodeGpus(shares, slices, c, m, p.mixed[i]), shapes)
        for k, free in enumerate(shares):
            if free < request.share_milli or slices[k] <= 0:
                continue
            after_s, after_l = list(shares), list(slices)
            after_s[k] -= request.share_milli
            after_l[k] -= 1
            after = share_fragment(NodeGpus(after_s, after_l, c - request.cpu_milli, m - request.memory_mib,
                                            p.mixed[i]), shapes)
            key = (i in p.suspect, round(after - before, GROWTH_DIGITS), free - request.share_milli,
                   sum(shares) - request.share_milli, c, m, i, k)
            if best is None or key < best:
                best = key
    return None if best is None else (best[6], best[7])


@pytest.mark.parametrize("seed", range(12))
def test_the_remembered_share_ranks_place_every_share_where_the_plain_rule_does(seed):
    rng = random.Random(seed)
    o = world(rng)
    history = ShapeHistory()
    for _ in range(rng.randint(1, 6)):
        history.observe(rng.choice((100, 250, 330, 500, 750, 1000, 2000)), rng.choice((1000, 4000, 12_000)),
                        rng.choice((4096, 16_384, 65_536)), 0.0)
    book = NodeBook([o], history=history)
    requests = [PlacementRequest(1, 1, cpu_milli=rng.choice((1000, 4000, 12_000)),
                                 memory_mib=rng.choice((4096, 16_384, 65_536)), share_milli=d)
                for d in (100, 250, 500, 750) for _ in range(2)]
    live: list[tuple[PlacementRequest, int, int]] = []
    checked = 0
    for step in range(60):
        for request in requests:
            expected = reference(book, request)
            found = book.fit(1, request)
            assert book._share_node_scan(book.pools[1], request) == (None if expected is None else expected[0])
            if expected is None:
                assert found is None
            else:
                assert found == [expected[0]] and book.share_gpu(1, found[0], request) == expected[1]
                checked += 1
        roll = rng.random()
        if live and roll < 0.3:  # a share ends
            request, i, k = live.pop(rng.randrange(len(live)))
            book.release(1, (book.pools[1].names[i],), 1, 1, request.cpu_milli, request.memory_mib,
                         share_milli=request.share_milli, gpu=k)
        elif roll < 0.4:  # a whole GPU taken on a node that gives whole GPUs and shares
            whole = PlacementRequest(1, 1, cpu_milli=1000, memory_mib=1024)
            nodes = book.fit(1, whole)
            if nodes is not None:
                book.take(1, nodes, whole)
        elif roll < 0.5:  # more shapes seen: the shapes scored are refreshed after a while
            for _ in range(rng.randint(1, 40)):
                book.observe(1, rng.choice((100, 250, 500, 900)), rng.choice((1000, 4000)), 8192, float(step))
        else:  # a share is taken where the book places it
            request = rng.choice(requests)
            placed = book.place(request, [o])
            if placed is not None:
                i = placed[1][0]
                k = book.share_gpu(1, i, request)
                book.take(1, [i], request, k)
                live.append((request, i, k))
    assert checked > 0


def test_a_free_amount_steps_down_to_the_largest_shape_value_at_most_it():
    steps = [1000, 4000, 12_000]
    assert [step_down(steps, v) for v in (0, 999, 1000, 3999, 4000, 50_000)] == [0, 999, 1000, 1000, 4000, 12_000]
    assert step_down([], 7) == 7
    # a node's fragmentation is the same at its free CPU and at that CPU's step: the shapes compare alike
    workload = [(500, 1000, 0, 1.0), (250, 4000, 0, 2.0), (1000, 12_000, 0, 1.0)]
    for cpu in (0, 500, 1000, 2500, 4000, 11_999, 12_000, 96_000):
        node, stepped = (NodeGpus([1000, 600, 100], [2, 2, 0], c, 0, True) for c in (cpu, step_down(steps, cpu)))
        assert share_fragment(node, workload) == share_fragment(stepped, workload)
