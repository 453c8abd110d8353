"""Concurrent writers of one derived row: two node pool syncs of one cluster that overlap (a run waiting on a slow
cluster past the next beat, or one task delivered twice) write each pool and node once and neither raises.

Class of failure: concurrent writers of one derived row. Invariant: a row that periodic tasks derive is written
idempotently (the pool's insert in a savepoint that takes the committed row on conflict, the nodes' an upsert);
a duplicate delivery or a race never aborts a sync.

Real PostgreSQL in autocommit (``transaction=True``); the cluster has no pool yet in each round, so neither sync
waits on the other's row locks before inserting.
"""

from __future__ import annotations

import pytest

from runners.base import NodeInfo, PoolCapacity
from runners.kubernetes.sync import apply_pools
from runners.models import Cluster, Node, NodePool
from tests.support.racing import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)


def discovered(pools: int, nodes: int) -> list[PoolCapacity]:
    """What a cluster's discovery reports: ``pools`` H100 pools (on-demand, then spot) of ``nodes`` 8-GPU nodes."""
    return [PoolCapacity(name=f"pool-{p}", accelerator="H100-80GB", capacity_type=("on-demand", "spot")[p % 2],
                         nodes=nodes, gpus_per_node=8,
                         node_list=tuple(NodeInfo(name=f"node-{p}-{n}", gpus=8, cpu_milli=96000, memory_mib=1 << 20)
                                         for n in range(nodes)))
            for p in range(pools)]


@pytest.mark.parametrize("syncs", [2, 3])
@pytest.mark.parametrize("pools,nodes", [(1, 1), (2, 4)])
def test_overlapping_syncs_of_one_cluster_write_each_pool_and_node_once(catalog, syncs, pools, nodes):
    """Eight rounds: the cluster's pools and nodes are removed, then ``syncs`` syncs apply the same discovery at
    once. Every round: no exception, one row per pool and per node, as discovered."""
    cluster = Cluster.objects.create(name="k8s-race", provider="aws", region="us-east-1", backend="kubernetes")
    found = discovered(pools, nodes)
    for round_ in range(8):
        Node.objects.filter(cluster=cluster).delete()
        NodePool.objects.filter(cluster=cluster).delete()
        results, errors = run_concurrently(*[lambda: apply_pools(cluster, found)] * syncs)
        assert errors == [], f"round {round_}: {errors!r}"
        assert sum(r["created"] for r in results) == pools, results
        assert sorted(NodePool.objects.filter(cluster=cluster).values_list("name", "nodes")) == [
            (p.name, nodes) for p in found]
        assert sorted(Node.objects.filter(cluster=cluster).values_list("name", flat=True)) == sorted(
            n.name for p in found for n in p.node_list)
