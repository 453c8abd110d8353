"""The loader keeps a node pool's offer from one read to the next while nothing it shows changed
(``offers.kept_offer``): the same object, with what passes kept with it. A node's free resources, a cordon, a live
attempt placed on the pool, the cluster's health or the price in force make a new offer of that pool only, laid out
afresh by the next pass; the other pools keep theirs.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.models import JobState
from jobs.scheduling.core import FairShareScheduler, NodeRoom, PoolOffer, Snapshot
from jobs.scheduling.offers import kept_offer, pool_offers
from jobs.scheduling.passes import schedule_pending
from runners.models import Cluster, Node
from tests.support.factories import fresh
from tests.support.scheduling import H100, job, team

pytestmark = pytest.mark.django_db


def _nodes(pool, count: int) -> None:
    """``count`` synced nodes of 8 GPUs, 96 cores and 1 TiB, named ``<cluster>-<i>``."""
    for i in range(count):
        Node.objects.create(
            cluster=pool.cluster,
            node_pool=pool,
            name=f"{pool.cluster.name}-{i}",
            gpus=8,
            cpu_milli=96_000,
            memory_mib=1_048_576,
            seen_at=timezone.now(),
        )


def _read(accelerator) -> dict[int, PoolOffer]:
    return {o.node_pool_id: o for o in pool_offers(accelerator.pk, timezone.now(), lock=False)}


def test_an_unchanged_pool_keeps_its_offer_and_a_changed_one_gets_a_new_one(
    cluster_factory, quota_factory, h100, alpha, queue_job
):
    _, a = cluster_factory("a", "gcp", "us-central1", h100, nodes=2, gpus_per_node=8, price="4.20")
    b_cluster, b = cluster_factory("b", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="6.88")
    _nodes(a, 2)
    _nodes(b, 2)
    first = _read(h100)
    again = _read(h100)
    assert again[a.pk] is first[a.pk] and again[b.pk] is first[b.pk]

    # a pass admits a 4-GPU job on the cheaper pool a: its nodes changed, b's did not
    quota_factory(alpha, h100, nominal=16)
    placed = queue_job(alpha, 4)
    schedule_pending()
    assert fresh(placed).state == JobState.ADMITTED
    after = _read(h100)
    assert after[a.pk] is not first[a.pk] and after[b.pk] is first[b.pk]
    assert sorted(r.free_gpus for r in after[a.pk].node_rooms) == [4, 8]  # best fit: one node, 4 of its 8 GPUs

    # a node of b cordoned, then the cluster of b unhealthy: a new offer each time, a's kept
    Node.objects.filter(node_pool=b, name="b-0").update(cordoned=True)
    cordoned = _read(h100)
    assert cordoned[b.pk] is not after[b.pk] and cordoned[a.pk] is after[a.pk]
    assert [r.schedulable for r in cordoned[b.pk].node_rooms] == [False, True]
    Cluster.objects.filter(pk=b_cluster.pk).update(health=Cluster.Health.UNREACHABLE)
    sick = _read(h100)
    assert sick[b.pk] is not cordoned[b.pk] and not sick[b.pk].healthy and sick[a.pk] is after[a.pk]


def test_an_offer_is_kept_only_when_equal_in_every_field_and_its_prices_to_the_digit():
    rooms = (NodeRoom("n-0", 8, 8, 96_000, 96_000, 1_048_576, 1_048_576),)
    offer = PoolOffer(9_999_001, 1, "c", "aws", "us-east-1", "on-demand", 1, 8, 8, Decimal("4.20"), node_rooms=rooms)
    assert kept_offer(offer) is offer
    same = dataclasses.replace(offer, node_rooms=tuple(dataclasses.replace(n) for n in rooms))
    assert kept_offer(same) is offer
    # 4.2 equals 4.20 but prints otherwise (an estimate's message): a new offer
    fewer_digits = dataclasses.replace(offer, usd_per_gpu_hour=Decimal("4.2"))
    assert kept_offer(fewer_digits) is fewer_digits
    busier = dataclasses.replace(fewer_digits, node_rooms=(dataclasses.replace(rooms[0], free_cpu_milli=95_000),))
    assert kept_offer(busier) is busier
    assert kept_offer(dataclasses.replace(busier)) is busier


def test_a_pass_over_a_kept_offer_decides_as_one_over_a_new_offer(cluster_factory, h100):
    # the offer read twice is the same object: a pass over it (its layout kept by the pass before) places a 4-GPU
    # job on the node with 4 GPUs free, as a pass over a new copy does (best fit: the tightest node)
    _, pool = cluster_factory("a", "gcp", "us-central1", h100, nodes=2, gpus_per_node=8, price="4.20")
    _nodes(pool, 2)
    Node.objects.filter(node_pool=pool, name="a-1").update(foreign_gpus=4)
    offer = _read(h100)[pool.pk]
    assert _read(h100)[pool.pk] is offer

    def placed(given: PoolOffer):
        snapshot = Snapshot({1: team(1, 16)}, {H100: [given]}, [job(1, 4, job_id=1)])
        return [(a.offer.node_pool_id, a.node_names) for a in FairShareScheduler(snapshot).full_pass().admissions]

    copy = dataclasses.replace(offer, node_rooms=tuple(dataclasses.replace(n) for n in offer.node_rooms))
    assert placed(offer) == placed(offer) == placed(copy) == [(pool.pk, ("a-1",))]
