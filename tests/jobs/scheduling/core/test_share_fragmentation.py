"""FGD for shares of a GPU (ADR 0040; Weng et al., USENIX ATC 2023): a node's fragmentation for the shapes seen is
the expected free GPU capacity a task drawn from them could not use; a share goes where it grows least; with no
shape seen, best fit. Expected numbers are worked out by hand in the comments, or by the small reference written
here from the paper's definition (``paper_fragment``), never by the code under test."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from jobs.scheduling.core import (
    FairShareScheduler,
    NodeBook,
    NodeRoom,
    PlacementRequest,
    PoolOffer,
    QueuedJob,
    Snapshot,
    TeamQuota,
    TeamState,
)
from jobs.scheduling.core.fragmentation import NodeGpus, ShapeHistory, node_kinds, share_fragment

ACC = 1


def offer(*rooms: NodeRoom, pool: int = 1) -> PoolOffer:
    return PoolOffer(pool, 1, "c", "aws", "us-east-1", "on-demand", len(rooms), 8,
                     sum(r.free_gpus for r in rooms), Decimal("4.00"), node_rooms=rooms)


def sliced(name: str, *free: int, replicas: int = 10) -> NodeRoom:
    """A time-sliced node (no whole GPU) whose GPUs have ``free`` milli-GPUs each and ``replicas`` free slices."""
    return NodeRoom(name, 0, 0, shares=tuple(free), slices=(replicas,) * len(free))


def seen(*shapes: tuple[int, int, int, float]) -> ShapeHistory:
    """A history of ``(milli-GPUs, CPU, memory, how many)``, all seen at time 0."""
    history = ShapeHistory()
    for milli, cpu, memory, n in shapes:
        for _ in range(int(n)):
            history.observe(milli, cpu, memory, 0.0)
    return history


def paper_fragment(gpus: list[int], slices: list[int], cpu: int, memory: int, whole_ok: bool,
                   workload: list[tuple[int, int, int, float]]) -> float:
    """The paper's F_n(M), written out task by task: for a task that cannot run on the node every free milli-GPU
    counts; for one that can, every GPU it could not use (less free than a share asks, or no slice; for whole
    GPUs, every GPU not wholly free)."""
    total = sum(gpus)
    weight = sum(w for *_, w in workload)
    if total == 0 or weight == 0:
        return 0.0
    out = 0.0
    for milli, c, m, w in workload:
        usable = [g for g, s in zip(gpus, slices, strict=True) if s > 0]
        if c > cpu or m > memory:
            lost = total
        elif milli < 1000:
            lost = total if not any(g >= milli for g in usable) else total - sum(g for g in usable if g >= milli)
        else:
            wholly = sum(1 for g in usable if g == 1000) if whole_ok else 0
            lost = total if wholly < milli // 1000 else total - 1000 * wholly
        out += w * lost
    return out / weight


def test_a_nodes_share_fragmentation_by_hand():
    # GPUs with 1000, 600 and 200 free, 10 cores and 10 GiB; shapes: 1 x a 500 share, 1 x one whole GPU, 2 x a
    # 300 share that asks 20 cores.
    workload = [(500, 1000, 1024, 1.0), (1000, 1000, 1024, 1.0), (300, 20_000, 1024, 2.0)]
    node = NodeGpus([1000, 600, 200], [4, 4, 4], 10_000, 10_240, whole_ok=True)
    # 500: fits; only the GPU with 200 free cannot take it -> 200. One whole GPU: fits (one wholly free); the
    # partly used 600 and 200 are lost -> 800. The 300 share lacks CPU -> all 1800. (200 + 800 + 2 x 1800) / 4
    assert share_fragment(node, workload) == pytest.approx(1150.0)
    # where whole GPUs are never given (a time-sliced node) the whole-GPU task cannot run: (200 + 1800 + 3600) / 4
    assert share_fragment(NodeGpus([1000, 600, 200], [4, 4, 4], 10_000, 10_240, whole_ok=False),
                          workload) == pytest.approx(1400.0)
    # a GPU without a free slice is lost to every task: 600 free, no slice -> 500 fits on the 1000 GPU, loses
    # 600 + 200; whole: loses 800; the 300: all 1800 -> (800 + 800 + 3600) / 4
    assert share_fragment(NodeGpus([1000, 600, 200], [4, 0, 4], 10_000, 10_240, whole_ok=True),
                          workload) == pytest.approx(1300.0)
    assert share_fragment(NodeGpus([0, 0], [4, 4], 10_000, 10_240, True), workload) == 0.0
    assert share_fragment(node, []) == 0.0


def test_share_fragmentation_agrees_with_the_papers_definition_on_random_nodes():
    rng = random.Random(11)
    for _ in range(2000):
        n = rng.randint(1, 8)
        gpus = [rng.choice((0, 50, 200, 350, 500, 730, 1000, 1000)) for _ in range(n)]
        slices = [rng.choice((0, 1, 3)) for _ in range(n)]
        cpu, memory, whole_ok = rng.choice((0, 4000, 64_000)), rng.choice((0, 8192, 262_144)), rng.random() < 0.5
        workload = [(rng.choice((100, 250, 500, 900, 1000, 2000, 4000)), rng.choice((0, 2000, 8000)),
                     rng.choice((0, 4096, 65_536)), float(rng.randint(1, 5))) for _ in range(rng.randint(1, 6))]
        expected = paper_fragment(gpus, slices, cpu, memory, whole_ok, workload)
        assert share_fragment(NodeGpus(gpus, slices, cpu, memory, whole_ok), workload) == pytest.approx(expected)


def test_a_share_goes_where_fragmentation_grows_least_not_where_it_fits_tightest():
    # Shapes seen: 500 shares. A 400 share on "tight" (500 free) leaves 100 that no 500 share can use:
    # fragmentation 0 -> 100. On "roomy" (1000 free) it leaves 600, which still takes a 500 share: 0 -> 0.
    o = offer(sliced("tight", 500), sliced("roomy", 1000))
    book = NodeBook([o], history=seen((500, 0, 0, 3)))
    found = book.place(PlacementRequest(1, 1, share_milli=400), [o])
    assert book.names(1, found[1]) == ("roomy",)
    # With no shape seen, best fit: the least room left
    plain = NodeBook([o])
    assert plain.names(1, plain.place(PlacementRequest(1, 1, share_milli=400), [o])[1]) == ("tight",)


def test_between_gpus_of_one_node_the_share_takes_the_one_whose_fragmentation_grows_least():
    # One node, GPUs with 500 and 1000 free; shapes seen: 1 x 500, 1 x 300. A 300 share:
    # on the 500 GPU -> [200, 1000]: 500 fits (loses 200), 300 fits (loses 200): F 0 -> 200.
    # on the 1000 GPU -> [500, 700]: both fit, nothing lost: F 0 -> 0. So the 1000 GPU (index 1).
    o = offer(sliced("n", 500, 1000))
    book = NodeBook([o], history=seen((500, 0, 0, 1), (300, 0, 0, 1)))
    request = PlacementRequest(1, 1, share_milli=300)
    found = book.place(request, [o])
    assert book.share_gpu(1, found[1][0], request) == 1
    book.take(1, found[1], request)
    assert book.pools[1].shares[0] == [500, 700]


def test_shapes_seen_fade_with_a_half_life():
    history = ShapeHistory(half_life_s=100.0)
    history.observe(500, 0, 0, 0.0)
    history.observe(250, 0, 0, 100.0)  # one half-life later: the 500 share now weighs half as much
    history.observe(0, 1000, 0, 100.0)  # a CPU-only task strands no GPU: not counted
    weights = {s[0]: s[3] for s in history.shapes()}
    assert set(weights) == {500, 250}
    assert weights[500] / weights[250] == pytest.approx(0.5)
    # far later, the old shapes are forgotten (below a thousandth of one task)
    history.observe(750, 0, 0, 100.0 + 100.0 * 70)
    assert [s[0] for s in history.shapes()] == [750]


def test_a_node_giving_whole_gpus_and_shares_books_both_on_the_same_gpus():
    # 2 GPUs, whole and shared (4 slices each). A share takes GPU 0 in part: one whole GPU is left.
    mixed = NodeRoom("m", 2, 2, shares=(1000, 1000), slices=(4, 4))
    o = offer(mixed)
    book = NodeBook([o])
    p = book.pools[1]
    book.take(1, [0], PlacementRequest(1, 1, share_milli=300))
    assert (p.free_g[0], p.shares[0]) == (1, [700, 1000])
    assert book.place(PlacementRequest(1, 2), [o]) is None  # two whole GPUs: no longer
    found = book.place(PlacementRequest(1, 1), [o])
    book.take(1, found[1], PlacementRequest(1, 1))
    assert (p.free_g[0], p.shares[0], p.slices[0]) == (0, [700, 0], [3, 0])  # the whole GPU holds no share
    assert book.place(PlacementRequest(1, 1, share_milli=800), [o]) is None
    book.release(1, ("m",), 1, 1, 0, 0)  # the whole job ends: its GPU takes shares again
    assert (p.free_g[0], p.shares[0], p.slices[0]) == (1, [700, 1000], [3, 4])
    book.release(1, ("m",), 1, 1, 0, 0, share_milli=300)
    assert (p.free_g[0], p.shares[0]) == (2, [1000, 1000])


def test_the_pass_learns_shapes_from_the_snapshot_and_names_the_gpu():
    # Queue (by submission): a 400 share, then three 500 shares; seen: 1 x 400, 3 x 500. As in the test above,
    # the 400 goes to "roomy" (0 growth, against +100 on "tight"); then a 500 share: on tight [500] -> [0]:
    # nothing lost before or after, growth 0; on roomy [600] -> [100], which no shape can use: +100. So tight.
    o = offer(sliced("tight", 500), sliced("roomy", 1000))
    queue = [QueuedJob(i, 1, ACC, 1, 1, 500, float(i), share_milli=milli)
             for i, milli in ((1, 400), (2, 500), (3, 500), (4, 500))]
    teams = {1: TeamState(1, quotas={ACC: TeamQuota(8)})}
    admissions = FairShareScheduler(Snapshot(teams, {ACC: [o]}, queue)).full_pass().admissions
    placed = {a.job.job_id: (a.node_names, a.gpu_index) for a in admissions}
    assert placed[1] == (("roomy",), 0)
    assert placed[2] == (("tight",), 0)
    assert placed[3] == (("roomy",), 0)  # 600 left there: 500 fits
    assert 4 not in placed  # 0 and 100 left: no GPU holds 500


@pytest.mark.parametrize("policy", ["best-fit", "fgd"])
def test_placements_never_exceed_a_gpus_thousand_milli_or_its_slices(policy):
    """Differential: random submissions and ends on random nodes that share (time-sliced, or whole and shared),
    booked by the test's own ledger at the GPU each admission names (whole GPUs, not told apart: the lowest
    wholly free ones taken, the lowest held ones given back);
    no GPU ever holds more than 1000 milli-GPUs or more shares than slices, and a GPU held whole holds no
    share."""
    rng = random.Random(5 if policy == "fgd" else 6)
    for world in range(30):
        rooms, ledger = [], {}
        for i in range(rng.randint(1, 5)):
            n, replicas, whole = rng.randint(1, 4), rng.choice((2, 4, 7)), rng.random() < 0.5
            rooms.append(NodeRoom(f"n{i}", n if whole else 0, n if whole else 0, 64_000, 64_000, 262_144, 262_144,
                                  shares=(1000,) * n, slices=(replicas,) * n))
            ledger[f"n{i}"] = {"milli": [0] * n, "shares": [0] * n, "whole": [False] * n, "replicas": replicas}
        teams = {1: TeamState(1, quotas={ACC: TeamQuota(10_000)})}
        scheduler = FairShareScheduler(Snapshot(teams, {ACC: [offer(*rooms)]}, [], policy=policy))
        live = []
        for j in range(1, 80):
            if live and rng.random() < 0.3:  # one ends: the book and the ledger give it back
                job, name, gpus = live.pop(rng.randrange(len(live)))
                scheduler.book.release(1, (name,), job.gpus_per_node, job.gpus_per_node, job.cpu_milli,
                                       job.memory_mib, share_milli=job.share_milli,
                                       gpu=gpus[0] if job.share_milli else None)
                book = ledger[name]
                if job.share_milli:
                    book["milli"][gpus[0]] -= job.share_milli
                    book["shares"][gpus[0]] -= 1
                else:  # whole GPUs are not told apart: the lowest-numbered held ones come back
                    held = [k for k, w in enumerate(book["whole"]) if w]
                    for k in held[:job.gpus_per_node]:
                        book["whole"][k] = False
                continue
            share = rng.random() < 0.7
            job = QueuedJob(j + world * 1000, 1, ACC, 1, 1 if share else rng.randint(1, 2), 500, float(j),
                            cpu_milli=1000, memory_mib=1024,
                            share_milli=rng.choice((10, 100, 250, 330, 500, 900)) if share else 0)
            for a in scheduler.submit(job).admissions:
                (name,) = a.node_names
                book = ledger[name]
                if job.share_milli:
                    k = a.gpu_index
                    assert not book["whole"][k]
                    book["milli"][k] += job.share_milli
                    book["shares"][k] += 1
                    assert book["milli"][k] <= 1000 and book["shares"][k] <= book["replicas"]
                    gpus = (k,)
                else:
                    free = [k for k in range(len(book["milli"])) if not book["whole"][k] and book["shares"][k] == 0]
                    assert len(free) >= job.gpus_per_node
                    gpus = tuple(free[:job.gpus_per_node])
                    for k in gpus:
                        book["whole"][k] = True
                live.append((job, name, gpus))
        # the book's own numbers agree with the ledger's
        p = scheduler.book.pools[1]
        for i, name in enumerate(p.names):
            book = ledger[name]
            for k in range(len(book["milli"])):
                if book["whole"][k]:
                    assert p.shares[i][k] == 0
                else:
                    assert p.shares[i][k] == 1000 - book["milli"][k]
                    assert p.slices[i][k] == book["replicas"] - book["shares"][k]


def test_shapes_weigh_by_their_count_over_the_square_root_of_their_size():
    # Shapes seen: 1 x four whole GPUs (4000), 20 x a 500 share. A 400 share, on "whole" (four wholly free GPUs,
    # taken whole or in shares) or on "sliver" (one GPU with 500 free):
    #   whole  -> [600, 1000, 1000, 1000]: 4000 no longer fits, 0 -> 3600 lost; 500 still fits: 0 -> 0.
    #   sliver -> [100]: 4000 never fits there, 500 -> 100 lost; 500 no longer fits: 0 -> 100.
    # Weighted by count (the paper): whole 1 x 3600 = 3600, sliver 1 x -400 + 20 x 100 = 1600: sliver.
    # By count / sqrt(size): 4000 weighs 1 / 63.25 = 0.01581, 500 weighs 20 / 22.36 = 0.8944:
    #   whole 0.01581 x 3600 = 56.9, sliver 0.01581 x -400 + 0.8944 x 100 = 83.1: whole.
    o = offer(NodeRoom("whole", 4, 4, shares=(1000,) * 4, slices=(10,) * 4),
              NodeRoom("sliver", 1, 0, shares=(500,), slices=(10,)))
    book = NodeBook([o], history=seen((4000, 0, 0, 1), (500, 0, 0, 20)))
    found = book.place(PlacementRequest(1, 1, share_milli=400), [o])
    assert book.names(1, found[1]) == ("whole",)
    assert [round(s[3], 4) for s in sorted(book.milli_shapes())] == [0.8944, 0.0158]


def test_a_share_takes_the_node_and_gpu_where_size_weighted_fragmentation_grows_least():
    # Property: on random nodes (time-sliced, or giving whole GPUs and shares) and random shapes seen, the GPU a
    # share is booked on grows the paper's fragmentation, with each shape weighing its count over the square root
    # of its milli-GPUs, no more than any other GPU with room for it (computed here by ``paper_fragment``).
    rng = random.Random(23)
    for _ in range(400):
        rooms, raw = [], []
        for j in range(rng.randint(1, 6)):
            n, mixed = rng.randint(1, 4), rng.random() < 0.5
            free = tuple(rng.choice((0, 120, 300, 450, 700, 1000, 1000)) for _ in range(n))
            slices = tuple(rng.choice((0, 2, 5)) for _ in range(n))
            cpu, memory = rng.choice((4000, 16_000, 64_000)), rng.choice((8192, 65_536))
            whole = sum(1 for f, s in zip(free, slices, strict=True) if f == 1000 and s > 0) if mixed else 0
            rooms.append(NodeRoom(f"n{j}", n if mixed else 0, whole, cpu, cpu, memory, memory,
                                  shares=free, slices=slices))
            raw.append((list(free), list(slices), cpu, memory, mixed))
        shapes = {(rng.choice((100, 250, 500, 800, 1000, 2000, 4000)), rng.choice((0, 2000, 8000)),
                   rng.choice((0, 4096, 16_384))): rng.randint(1, 20) for _ in range(rng.randint(1, 6))}
        workload = [(*k, c / k[0] ** 0.5) for k, c in shapes.items()]
        request = PlacementRequest(1, 1, cpu_milli=rng.choice((0, 1000, 6000)), memory_mib=rng.choice((0, 2048)),
                                   share_milli=rng.choice((100, 300, 450, 600)))
        o = offer(*rooms)
        book = NodeBook([o], history=seen(*((*k, c) for k, c in shapes.items())))
        growths = {}
        for j, (free, slices, cpu, memory, mixed) in enumerate(raw):
            if cpu < request.cpu_milli or memory < request.memory_mib:
                continue
            before = paper_fragment(free, slices, cpu, memory, mixed, workload)
            for k in range(len(free)):
                if free[k] >= request.share_milli and slices[k] > 0:
                    after_f, after_s = list(free), list(slices)
                    after_f[k] -= request.share_milli
                    after_s[k] -= 1
                    growths[(j, k)] = paper_fragment(after_f, after_s, cpu - request.cpu_milli,
                                                     memory - request.memory_mib, mixed, workload) - before
        found = book.place(request, [o])
        if not growths:
            assert found is None
            continue
        j = found[1][0]
        k = book.share_gpu(1, j, request)
        assert growths[(j, k)] <= min(growths.values()) + 1e-6


def test_a_young_book_reads_the_shapes_again_each_time_the_jobs_seen_doubled_then_every_32():
    # Each job seen has a shape of its own (101, 102, ... milli-GPUs), so the shapes scored tell after how many jobs
    # they were last read: after 1, 2, 4, 8, 16 and 32 jobs, then every 32 (64, 96). The one node's kind (one GPU:
    # 1000) is the fleet's prior, there from the first job on.
    book = NodeBook([offer(sliced("a", 1000))])
    reads = (1, 2, 4, 8, 16, 32, 64, 96)
    for seen_now in range(1, 101):
        book.observe(1, 100 + seen_now, 0, 0, float(seen_now))
        last_read = max(r for r in reads if r <= seen_now)
        assert {s[0] for s in book.milli_shapes()} == {1000, *range(101, 101 + last_read)}, seen_now


def test_a_book_built_from_a_snapshot_of_many_jobs_reads_the_shapes_again_every_32():
    history = seen((500, 0, 0, 40))
    book = NodeBook([offer(sliced("a", 1000))], history=history)
    assert [s[0] for s in book.milli_shapes()] == [500]
    for k in range(1, 33):
        book.observe(1, 250, 0, 0, 0.0)
        assert {s[0] for s in book.milli_shapes()} == ({500, 250} if k == 32 else {500}), k


def test_the_fleets_prior_is_two_tasks_filling_a_node_of_each_kind_that_takes_shares():
    # Kinds of the nodes that take shares: 2 GPUs x 16 cores x 64 GiB (twice: one kind), 4 GPUs x 32 cores x 128
    # GiB; the whole-GPU node takes no shares and is no kind. One job seen, a 250 share of 1 core and 1 GiB.
    rooms = (NodeRoom("a", 0, 0, 16_000, 16_000, 65_536, 65_536, shares=(1000, 1000), slices=(4, 4)),
             NodeRoom("b", 0, 0, 16_000, 8_000, 65_536, 1_024, shares=(200, 1000), slices=(1, 4)),
             NodeRoom("c", 4, 4, 32_000, 32_000, 131_072, 131_072, shares=(1000,) * 4, slices=(4,) * 4),
             NodeRoom("d", 8, 8, 96_000, 96_000, 262_144, 262_144))
    o = offer(*rooms)
    assert node_kinds([o]) == ((2000, 16_000, 65_536), (4000, 32_000, 131_072))
    book = NodeBook([o], seen=lambda: [(250, 1000, 1024, 5.0)])
    # by count / sqrt(milli-GPUs): the job 1 / sqrt(250) = 0.063246; each kind one task of the two: 1 / sqrt(2000) =
    # 0.022361 and 1 / sqrt(4000) = 0.015811
    assert {s[:3]: round(s[3], 6) for s in book.milli_shapes()} == {
        (250, 1000, 1024): 0.063246, (2000, 16_000, 65_536): 0.022361, (4000, 32_000, 131_072): 0.015811}
    # the prior counts no job: the shapes are read again after one more job seen (the count doubled)
    assert book.history.version == 1


def test_with_no_job_seen_there_is_no_prior_and_a_share_goes_by_best_fit():
    o = offer(sliced("roomy", 1000), sliced("tight", 400))
    book = NodeBook([o], seen=lambda: [])
    assert book.milli_shapes() == ()
    found = book.place(PlacementRequest(1, 1, share_milli=300), [o])
    assert book.names(1, found[1]) == ("tight",)


def test_a_share_whose_growth_and_gpu_room_tie_goes_to_the_node_with_the_least_gpu_capacity_left():
    # Shapes seen: 100 shares. A 500 share on "wide" ([1000, 1000] -> [500, 1000]) or on "narrow" ([1000] -> [500])
    # strands nothing for a 100 share either way (growth 0) and leaves 500 on its GPU either way; best fit's next
    # measure, the node's free GPU capacity left, is 1,500 on "wide" and 500 on "narrow": "narrow", although
    # "wide" comes first in the pool (and in the offers' order when each is a pool of its own).
    together = offer(sliced("wide", 1000, 1000), sliced("narrow", 1000))
    book = NodeBook([together], history=seen((100, 0, 0, 2)))
    request = PlacementRequest(1, 1, share_milli=500)
    assert book.names(1, book.place(request, [together])[1]) == ("narrow",)
    apart = [offer(sliced("wide", 1000, 1000), pool=1), offer(sliced("narrow", 1000), pool=2)]
    book = NodeBook(apart, history=seen((100, 0, 0, 2)))
    found = book.place(request, apart)
    assert (found[0].node_pool_id, book.names(2, found[1])) == (2, ("narrow",))


def test_a_whole_gpu_whose_growth_ties_goes_to_the_node_with_the_least_milli_gpus_left_not_whole_gpus():
    # Nodes giving whole GPUs and shares; shapes seen: 100 shares. One whole GPU taken from "parted" ([1000, 1000,
    # 900, 900], 2 wholly free) or from "whole" ([1000, 1000, 1000], 3 wholly free) strands nothing for a 100 share
    # (no GPU is left with less than 100 free but the one taken): growth 0 on both. Counted in whole GPUs "parted"
    # has fewer free (2 against 3); counted in milli-GPUs, as the shares see them, it has more (3,800 against
    # 3,000): "whole".
    o = offer(NodeRoom("parted", 4, 2, shares=(1000, 1000, 900, 900), slices=(4,) * 4),
              NodeRoom("whole", 3, 3, shares=(1000,) * 3, slices=(4,) * 3))
    book = NodeBook([o], history=seen((100, 0, 0, 2)))
    assert book.names(1, book.place(PlacementRequest(1, 1), [o])[1]) == ("whole",)
