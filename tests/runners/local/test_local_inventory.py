"""The local cluster's nodes are recorded again by the periodic node sync, so its capacity GPU-hours grow with the
time it is up (the demo's Capacity page), and no local cluster is made by the sync where none was registered."""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine

from costs.capacity import capacity_report
from runners.models import Cluster
from runners.tasks import sync_node_pools

pytestmark = pytest.mark.django_db



def later() -> dt.datetime:
    """A whole minute a day from now: after the fixture's own sighting (the clock only moves forward)."""
    return (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(second=0, microsecond=0)


def test_the_periodic_sync_extends_the_local_clusters_capacity(funded_local_cluster):
    gpus = sum(n.gpus for n in funded_local_cluster.gpu_nodes.all())
    assert gpus > 0
    t0 = later()
    for minute in range(4):
        with time_machine.travel(t0 + dt.timedelta(minutes=minute), tick=False):
            sync_node_pools()
    _, total = capacity_report("cluster", t0 - dt.timedelta(hours=1), t0 + dt.timedelta(hours=1))
    assert total["capacity_gpu_seconds"] == gpus * 3 * 60


def test_no_local_cluster_is_made_by_the_sync(catalog):
    sync_node_pools()
    assert not Cluster.objects.filter(backend=Cluster.Backend.LOCAL).exists()
