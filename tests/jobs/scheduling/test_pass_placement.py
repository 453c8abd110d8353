"""Placement by the scheduling pass: the cheapest healthy cluster with room, spot only for preemptible jobs, the
spec's constraints obeyed, and a node shape the pool has.

Prices are cluster overrides picked here (USD per GPU-hour), so every expected estimate is worked out in the
test with Decimal arithmetic.
"""

from decimal import Decimal

import pytest

from jobs.models import JobState
from jobs.scheduling.passes import schedule_pending
from runners.models import Cluster
from tests.support.factories import fresh

S = JobState
D = Decimal

pytestmark = pytest.mark.django_db


def test_it_places_on_the_cheapest_cluster_with_room_and_estimates_at_that_price(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("dear", "azure", "eastus", h100, nodes=2, gpus_per_node=8, price="12.29")
    _, cheap_pool = cluster_factory("cheap", "gcp", "us-central1", h100, nodes=1, gpus_per_node=8, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=64)
    jobs = [queue_job(alpha, 8, max_runtime=5400) for _ in range(5)]

    schedule_pending()

    placed = [fresh(j) for j in jobs]
    clusters = [j.current_attempt.cluster.name if j.current_attempt else None for j in placed]
    # cheap fills first (8 GPUs), then mid (8), then dear (16), then nothing is left
    assert clusters == ["cheap", "mid", "dear", "dear", None]
    # 8 GPUs x 5400 s / 3600 x price: 8 x 1.5 x 4.20 = 50.40; x 6.88 = 82.56; x 12.29 = 147.48
    expected = [D(8) * D(5400) / D(3600) * D(p) for p in ("4.20", "6.88", "12.29", "12.29")]
    assert expected == [D("50.40"), D("82.56"), D("147.48"), D("147.48")]
    assert [j.estimated_cost_usd for j in placed[:4]] == expected
    assert [j.current_attempt.usd_per_gpu_hour for j in placed[:4]] == [D("4.20"), D("6.88"), D("12.29"), D("12.29")]
    last = placed[4]
    assert last.state == S.QUEUED and last.queue_info["reason"] == "capacity"
    assert last.queue_info["request_gpus"] == 8
    assert last.queue_info["free_gpus_by_pool"][str(cheap_pool.pk)] == 0


def test_a_cluster_price_override_beats_the_catalog(cluster_factory, quota_factory, h100, alpha, queue_job):
    # catalog: aws us-east-1 H100 6.88, gcp us-central1 4.20; the aws cluster's override makes it cheaper
    cluster_factory("gke", "gcp", "us-central1", h100)
    cluster_factory("eks", "aws", "us-east-1", h100, price="3.99")
    quota_factory(alpha, h100, nominal=8)
    job = queue_job(alpha, 2)
    schedule_pending()
    job = fresh(job)
    assert job.current_attempt.cluster.name == "eks"
    assert job.estimated_cost_usd == D(2) * D(3600) / D(3600) * D("3.99")


def test_spot_pools_only_take_preemptible_jobs(cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("spot", "gcp", "us-central1", h100, capacity_type="spot", price="2.99")
    cluster_factory("ondemand", "aws", "us-east-1", h100, price="6.88")
    quota_factory(alpha, h100, nominal=32)
    steady = queue_job(alpha, 4)
    cheap = queue_job(alpha, 4, preemptible=True)
    schedule_pending()
    assert fresh(steady).current_attempt.cluster.name == "ondemand"
    assert fresh(cheap).current_attempt.cluster.name == "spot"


def test_placement_constraints_of_the_spec_are_obeyed_even_when_dearer(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, price="6.88")
    cluster_factory("dear", "azure", "eastus", h100, price="12.29")
    quota_factory(alpha, h100, nominal=64)
    by_name = queue_job(alpha, 1, placement={"clusters": ["dear"]})
    by_provider = queue_job(alpha, 1, placement={"providers": ["aws", "azure"]})
    by_region = queue_job(alpha, 1, placement={"regions": ["eastus"]})
    nowhere = queue_job(alpha, 1, placement={"providers": ["oci"]})
    schedule_pending()
    assert fresh(by_name).current_attempt.cluster.name == "dear"
    assert fresh(by_provider).current_attempt.cluster.name == "mid"
    assert fresh(by_region).current_attempt.cluster.name == "dear"
    nowhere = fresh(nowhere)
    assert nowhere.state == S.QUEUED and nowhere.queue_info["reason"] == "capacity"


def test_unhealthy_clusters_get_no_jobs(cluster_factory, quota_factory, h100, alpha, queue_job):
    cheap, _ = cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, price="6.88")
    Cluster.objects.filter(pk=cheap.pk).update(health=Cluster.Health.UNREACHABLE)
    quota_factory(alpha, h100, nominal=8)
    job = queue_job(alpha, 1)
    schedule_pending()
    assert fresh(job).current_attempt.cluster.name == "mid"


def test_a_node_shape_the_pool_lacks_waits_even_with_enough_free_gpus(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    cluster_factory("fours", "aws", "us-east-1", h100, nodes=4, gpus_per_node=4, price="6.88")  # 16 GPUs
    quota_factory(alpha, h100, nominal=16)
    eights = queue_job(alpha, 8)  # needs a node with 8 GPUs
    fours = queue_job(alpha, 4, nodes=2)
    schedule_pending()
    assert fresh(eights).state == S.QUEUED and fresh(eights).queue_info["reason"] == "capacity"
    assert fresh(fours).state == S.ADMITTED
