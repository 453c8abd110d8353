"""A serving booking's slots (``jobs.replica_loss``, docs/adr/0041): whatever sequence of scale-ups and replicas
lost with their node it goes through, a slot given back never moves another replica to other nodes or another
index (which on Kubernetes would rename, that is restart, its Deployment), and a new replica never takes an index
still booked. The expected booking is kept in the test as a plain map from index to nodes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.replica_loss import replica_slots, slot_nodes, with_slot, without_slot

OPS = st.lists(st.tuples(st.sampled_from(["add", "lose"]), st.integers(min_value=0, max_value=50)), max_size=30)


def booked(placement: dict, replicas: int, per: int) -> dict[int, list[str]]:
    """The booking as the functions read it: index -> nodes."""
    return {i: slot_nodes(placement, replicas, per, i) for i in replica_slots(placement, replicas)}


@settings(max_examples=200, deadline=None)
@given(ops=OPS, per=st.integers(min_value=1, max_value=3), start=st.integers(min_value=1, max_value=4))
def test_a_slot_given_back_never_moves_another_replica(ops, per, start):
    expected = {i: [f"n{i}-{k}" for k in range(per)] for i in range(start)}
    placement = {"nodes": [n for i in range(start) for n in expected[i]]}
    replicas, made = start, start
    for op, pick in ops:
        if op == "add":
            nodes = [f"m{made}-{k}" for k in range(per)]
            made += 1
            placement, index = with_slot(placement, replicas, nodes)
            assert index not in expected  # never an index still booked
            expected[index] = nodes
            replicas += 1
        elif replicas > 1:  # the last replica is never given back: the attempt is lost with it
            lost = sorted(expected)[pick % len(expected)]
            placement = without_slot(placement, replicas, per, lost)
            del expected[lost]
            replicas -= 1
        assert booked(placement, replicas, per) == expected
        assert len(placement["nodes"]) == replicas * per


def test_a_booking_without_slots_reads_as_indexes_in_order():
    placement = {"nodes": ["a", "b", "c"]}
    assert replica_slots(placement, 3) == [0, 1, 2]
    assert slot_nodes(placement, 3, 1, 1) == ["b"] and slot_nodes(placement, 3, 1, 5) == []
    given_back = without_slot(placement, 3, 1, 1)
    assert given_back == {"nodes": ["a", "c"], "slots": [0, 2], "next_slot": 3}
    assert with_slot(given_back, 2, ["d"]) == ({"nodes": ["a", "c", "d"], "slots": [0, 2, 3], "next_slot": 4}, 3)
    assert with_slot(placement, 3, ["d"]) == ({"nodes": ["a", "b", "c", "d"]}, 3)  # as before any loss
