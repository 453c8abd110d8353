"""Node pool sync: write what a cluster's backend discovers into that cluster's NodePool rows (GPU pools, and CPU pools
of nodes labelled ``nodepools.CPU_POOL_LABEL``, accelerator ``CPU``).

``discover()`` groups GPU nodes by ``nvidia.com/gpu.product`` and capacity
type; each group becomes (or updates) one NodePool: ``nodes`` (count),
``gpus_per_node`` (allocatable ``nvidia.com/gpu``), ``capacity_type``
(``on-demand``/``spot``) and the Accelerator whose ``product_label`` equals
the node label. Products no Accelerator knows are logged and skipped.

A pool the cluster no longer reports is deleted when nothing refers to it;
one that attempts refer to (live ones, or ended ones whose history must
stay) is kept with ``nodes = 0``, so placement offers it no GPU while its
live attempts run on.

Every GPU node of a reported pool is written as a ``Node`` row (its
allocatable GPUs, CPU and memory, what pods the platform does not own
request on it, topology, taints, cordon); nodes no longer reported are
deleted. Admission places jobs on these nodes.
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction

from core import lookups

from ..base import ClusterUnreachable, NodeInfo, PoolCapacity, UnknownBackend, backend_for, each_cluster
from ..models import CPU_ACCELERATOR, Accelerator, Cluster, NodePool, cpu_flavor, store_nodes

log = logging.getLogger(__name__)


def _accelerator(pool: PoolCapacity, by_label: dict[str, Accelerator], by_name: dict[str, Accelerator]):
    """The Accelerator of a discovered pool: by ``product_label`` (Kubernetes), else by name (the local backend)."""
    found = by_label.get(pool.accelerator) or by_name.get(pool.accelerator)
    if found is None and pool.accelerator == CPU_ACCELERATOR:  # the first CPU node pool seen: the flavor appears
        found = by_name[CPU_ACCELERATOR] = cpu_flavor()
    return found


def apply_pools(cluster: Cluster, pools: list[PoolCapacity]) -> dict:
    """Make ``cluster``'s NodePool rows match ``pools`` in one transaction; returns counts.

    A discovered pool matches the row of the same name, else the only row of
    the same accelerator and capacity type (a pool an operator registered by
    hand), else a new row is created under the discovered name. Counts:
    ``created``, ``updated``, ``unchanged``, ``deleted``, ``emptied`` (kept
    with 0 nodes because attempts refer to them) and ``skipped`` (unknown
    GPU products, listed under ``unknown_products``).
    """
    accelerators = list(Accelerator.objects.all())
    by_label = {a.product_label: a for a in accelerators if a.product_label}
    by_name = {a.name: a for a in accelerators}
    counts = {"cluster": cluster.name, "created": 0, "updated": 0, "unchanged": 0, "deleted": 0, "emptied": 0,
              "skipped": 0, "unknown_products": [], "nodes": 0}
    with transaction.atomic():
        rows = {p.pk: p for p in NodePool.objects.select_for_update().filter(cluster=cluster)}
        seen: set[int] = set()
        node_rows: list[tuple[NodeInfo, NodePool, PoolCapacity]] = []
        for pool in pools:
            accelerator = _accelerator(pool, by_label, by_name)
            if accelerator is None:
                log.warning("cluster %s: pool %s has GPU product %r that no accelerator's product_label names; "
                            "skipped", cluster.name, pool.name, pool.accelerator)
                counts["skipped"] += 1
                counts["unknown_products"].append(pool.accelerator)
                continue
            row = next((r for r in rows.values() if r.name == pool.name and r.pk not in seen), None)
            if row is None:
                same = [r for r in rows.values() if r.pk not in seen and r.accelerator_id == accelerator.pk
                        and r.capacity_type == pool.capacity_type]
                row = same[0] if len(same) == 1 else None
            if row is None:
                row, created = _insert_pool(cluster, pool, accelerator)
                rows[row.pk] = row
            else:
                created = False
            if created:
                counts["created"] += 1
            else:
                wanted = {"accelerator_id": accelerator.pk, "capacity_type": pool.capacity_type,
                          "nodes": pool.nodes, "gpus_per_node": pool.gpus_per_node}
                changed = {k: v for k, v in wanted.items() if getattr(row, k) != v}
                if changed:
                    NodePool.objects.filter(pk=row.pk).update(**changed)
                    lookups.changed(NodePool)  # no signal from update(): submissions' pool sizes are cached
                    counts["updated"] += 1
                else:
                    counts["unchanged"] += 1
            seen.add(row.pk)
            node_rows += [(n, row, pool) for n in pool.node_list]
        for row in rows.values():
            if row.pk in seen:
                continue
            if row.attempts.exists():
                if row.nodes:
                    NodePool.objects.filter(pk=row.pk).update(nodes=0)
                    lookups.changed(NodePool)
                    log.info("cluster %s: pool %s is gone from the cluster; kept with 0 nodes (attempts use it)",
                             cluster.name, row.name)
                counts["emptied"] += 1
            else:
                row.delete()
                log.info("cluster %s: pool %s is gone from the cluster; deleted", cluster.name, row.name)
                counts["deleted"] += 1
        counts["nodes"] = store_nodes(cluster, [(n, row, pool.accelerator, pool.capacity_type) for n, row, pool in node_rows])
    return counts


def _insert_pool(cluster: Cluster, pool: PoolCapacity, accelerator: Accelerator) -> tuple[NodePool, bool]:
    """Insert ``cluster``'s row of the discovered ``pool``; ``(row, True)``, or ``(the row another sync of this
    cluster inserted first, False)``.

    Class of failure: concurrent writers of one derived row (two syncs of one cluster overlap: a run that waits on
    a slow cluster past the next beat, or a task delivered twice; with no row of the cluster yet, neither waits on
    the other's row locks). Invariant: a sync's insert is idempotent, it never aborts the sync: the insert runs
    in a savepoint, and on the (cluster, name) conflict the committed row is taken and updated like any other.
    """
    try:
        with transaction.atomic():  # a savepoint: a conflict rolls back only this insert
            return NodePool.objects.create(cluster=cluster, name=pool.name, accelerator=accelerator,
                                           capacity_type=pool.capacity_type, nodes=pool.nodes,
                                           gpus_per_node=pool.gpus_per_node), True
    except IntegrityError:
        return NodePool.objects.get(cluster=cluster, name=pool.name), False


def sync_cluster(cluster: Cluster) -> dict:
    """Discover ``cluster``'s GPU node pools through its backend and apply them (``apply_pools``).

    An unreachable cluster changes nothing (its health is reconcile's
    business): the result carries ``error`` instead of counts.
    """
    try:
        pools = backend_for(cluster).discover(cluster)
    except (ClusterUnreachable, UnknownBackend) as exc:
        log.warning("cluster %s: node pool sync skipped: %s", cluster.name, exc)
        return {"cluster": cluster.name, "error": str(exc)}
    return apply_pools(cluster, pools)


def sync_all(backend: str = Cluster.Backend.KUBERNETES) -> list[dict]:
    """``sync_cluster`` over every cluster of ``backend`` (the local cluster keeps its own sync), one by one; a
    cluster whose sync fails in any way gives an ``error`` result and the others are synced (``each_cluster``)."""
    return each_cluster(Cluster.objects.filter(backend=backend), sync_cluster, "node pool sync")
