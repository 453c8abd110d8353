"""The node book's shares of a GPU (ADR 0040): a share goes to one physical GPU with room (and a free slice on a
time-sliced node), a MIG job to a free device of its profile; whole-GPU jobs take whole GPUs only, never a shared
node's. Expected placements are worked out by hand in each test."""

from __future__ import annotations

from decimal import Decimal

from jobs.scheduling.core import NodeBook, NodeRoom, PlacementRequest, PoolOffer, matches


def offer(*rooms: NodeRoom, pool: int = 1) -> PoolOffer:
    return PoolOffer(node_pool_id=pool, cluster_id=1, cluster_name="c", provider="aws", region="us-east-1",
                     capacity_type="on-demand", nodes=len(rooms), gpus_per_node=8,
                     free_gpus=sum(r.free_gpus for r in rooms), usd_per_gpu_hour=Decimal("4.00"), node_rooms=rooms)


def sliced(name: str, *free: int, slices: tuple[int, ...] | None = None) -> NodeRoom:
    """A time-sliced node whose GPUs have ``free`` milli-GPUs each (4 slices each unless ``slices``); no whole GPU."""
    return NodeRoom(name, 0, 0, shares=tuple(free), slices=slices or (4,) * len(free))


def share(milli: int) -> PlacementRequest:
    return PlacementRequest(1, 1, share_milli=milli)


def place_and_take(book: NodeBook, o: PoolOffer, request: PlacementRequest) -> str | None:
    found = book.place(request, [o])
    if found is None:
        return None
    book.take(o.node_pool_id, found[1], request)
    return book.names(o.node_pool_id, found[1])[0]


def test_shares_go_to_one_gpu_with_room_and_one_equal_to_what_is_left_fits():
    o = offer(sliced("ts", 1000, 1000))
    book = NodeBook([o])
    p = book.pools[1]

    assert place_and_take(book, o, share(300)) == "ts"
    assert p.shares[0] == [700, 1000]  # the first GPU of the two equally free ones
    assert place_and_take(book, o, share(800)) == "ts"
    assert p.shares[0] == [700, 200]  # 800 does not fit the 700 left: the other GPU
    assert place_and_take(book, o, share(700)) == "ts"
    assert p.shares[0] == [0, 200]  # exactly what was left
    assert book.place(share(300), [o]) is None  # 0 and 200 left: no GPU holds 300
    assert place_and_take(book, o, share(200)) == "ts"
    assert p.slices[0] == [2, 2]  # each share took one of its GPU's 4 slices


def test_a_time_sliced_gpu_holds_no_more_shares_than_it_has_slices():
    o = offer(sliced("ts", 1000, slices=(4,)))
    book = NodeBook([o])
    for _ in range(4):
        assert place_and_take(book, o, share(100)) == "ts"
    assert book.pools[1].shares[0] == [600]  # 600 milli-GPU left, but no slice
    assert book.place(share(100), [o]) is None


def test_the_gpu_with_the_least_room_that_holds_it_is_chosen():
    o = offer(sliced("roomy", 1000), sliced("tight", 400), sliced("too-small", 200))
    book = NodeBook([o])
    assert place_and_take(book, o, share(300)) == "tight"  # 100 left there, against 700 on roomy


def test_whole_gpu_jobs_never_take_a_shared_node():
    plain = NodeRoom("plain", 8, 8)
    o = offer(sliced("ts", 1000, 1000), plain)
    book = NodeBook([o])
    found = book.place(PlacementRequest(1, 2), [o])
    assert book.names(1, found[1]) == ("plain",)
    only_shared = offer(sliced("ts", 1000, 1000), pool=2)
    assert NodeBook([only_shared]).place(PlacementRequest(1, 1), [only_shared]) is None
    assert not matches(PlacementRequest(1, 1), only_shared)


def test_a_share_is_never_placed_on_a_node_that_does_not_share():
    o = offer(NodeRoom("plain", 8, 8))
    assert not matches(share(250), o)
    assert NodeBook([o]).place(share(250), [o]) is None


def test_a_mig_job_takes_a_free_device_of_its_profile_and_gives_it_back():
    mig = NodeRoom("mig", 2, 2, mig_free=(("1g.10gb", 2), ("3g.40gb", 1)))
    o = offer(mig)
    book = NodeBook([o])
    small = PlacementRequest(1, 1, mig_profile="1g.10gb")

    assert matches(small, o) and not matches(PlacementRequest(1, 1, mig_profile="2g.20gb"), o)
    assert place_and_take(book, o, small) == "mig"
    assert place_and_take(book, o, small) == "mig"
    assert book.place(small, [o]) is None  # both 1g.10gb devices taken; the 3g.40gb one is not this profile
    assert book.pools[1].mig[0] == {"1g.10gb": 0, "3g.40gb": 1}
    assert book.pools[1].free_g[0] == 2  # the whole GPUs of a mixed node are untouched

    book.release(1, ("mig",), 1, 1, 0, 0, mig_profile="1g.10gb")
    assert book.place(small, [o]) is not None


def test_a_mig_device_given_back_on_a_pool_without_any_counts_on_its_node_alone():
    # every node offers no MIG device (all taken): a running MIG job's device given back on "a" is "a"'s only, and
    # neither the other node nor a later book of the same offer (its layout kept with the offer) sees it
    o = offer(NodeRoom("a", 2, 2), NodeRoom("b", 2, 2))
    small = PlacementRequest(1, 1, mig_profile="1g.10gb")
    for _ in range(3):  # the first book lays the offer out, the second keeps the layout, the third reads it kept
        book = NodeBook([o])
        assert book.place(small, [o]) is None
        book.release(1, ("a",), 1, 1, 0, 0, mig_profile="1g.10gb")
        assert [dict(m) for m in book.pools[1].mig] == [{"1g.10gb": 1}, {}]
        assert place_and_take(book, o, small) == "a"
        assert [dict(m) for m in book.pools[1].mig] == [{"1g.10gb": 0}, {}]


def test_a_released_share_makes_room_again():
    o = offer(sliced("ts", 1000))
    book = NodeBook([o])
    assert place_and_take(book, o, share(600)) == "ts"
    assert book.place(share(600), [o]) is None
    book.release(1, ("ts",), 1, 1, 0, 0, share_milli=600)
    assert book.pools[1].shares[0] == [1000] and book.pools[1].slices[0] == [4]
    assert place_and_take(book, o, share(600)) == "ts"


def test_a_share_needs_its_cpu_and_memory_on_the_node():
    small = NodeRoom("small", 0, 0, cpu_milli=2000, free_cpu_milli=1000, shares=(1000,), slices=(4,))
    big = NodeRoom("big", 0, 0, shares=(100,), slices=(4,))
    o = offer(small, big)
    request = PlacementRequest(1, 1, cpu_milli=1500, share_milli=500)
    assert NodeBook([o]).place(request, [o]) is None  # small lacks CPU, big lacks share
