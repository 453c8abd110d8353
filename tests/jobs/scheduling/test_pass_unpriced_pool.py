"""A job pinned to a node pool the price catalog has no price for waits with a reason naming that price."""

import pytest

from jobs.models import JobState
from jobs.scheduling.passes import schedule_pending
from tests.support.factories import fresh

pytestmark = pytest.mark.django_db


def test_a_job_pinned_to_an_unpriced_pool_waits_for_its_price_by_name(cluster_factory, quota_factory, h100, alpha,
                                                                      queue_job):
    cluster_factory("priced", "aws", "us-east-1", h100)  # the catalog prices aws us-east-1 H100
    _, moved_pool = cluster_factory("moved", "aws", "eu-nowhere-1", h100)  # a region the catalog does not know
    quota_factory(alpha, h100, nominal=16)
    pinned = queue_job(alpha, 1, placement={"clusters": ["moved"]})
    anywhere = queue_job(alpha, 1, placement={"providers": ["oci"]})  # no pool at all, priced or not
    schedule_pending()
    pinned, anywhere = fresh(pinned), fresh(anywhere)
    assert pinned.state == JobState.QUEUED
    assert pinned.queue_info["message"] == ("no price for node pool moved (aws eu-nowhere-1, on-demand): "
                                            "the price catalog has none in force")
    assert pinned.queue_info["unpriced_pools"] == [moved_pool.pk]
    assert anywhere.queue_info["message"].startswith("Asks 1 node x 1 GPU, which no node pool can hold")
    assert "price" not in anywhere.queue_info["message"]
