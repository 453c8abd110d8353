"""Celery tasks of the runners app: periodic node pool sync of the Kubernetes clusters and node health checks."""

from __future__ import annotations

from celery import shared_task


# Fast queue (the capacity admission reads). Every 60 s; a few calls per cluster (13 s at most each), one by one.
@shared_task(name="runners.tasks.sync_node_pools", ignore_result=True, soft_time_limit=90, time_limit=120)
def sync_node_pools() -> list[dict]:
    """Write every Kubernetes cluster's discovered GPU node pools into its NodePool rows (``NODE_POOL_SYNC_INTERVAL_SECONDS``),
    and record the local cluster's nodes again when there is one (the node inventory over time follows both).

    One cluster that does not answer is skipped and the others are synced;
    returns one result per cluster (see ``runners.kubernetes.sync.apply_pools``).
    """
    from .kubernetes.sync import sync_all
    from .local.capacity import refresh_local_inventory

    return sync_all() + refresh_local_inventory()


# Slow queue (DCGM readings from Prometheus, 30 s at most per query). Every 60 s, per cluster one by one.
@shared_task(name="runners.tasks.check_node_health", ignore_result=True, soft_time_limit=120, time_limit=150)
def check_node_health() -> list[dict]:
    """Judge every cluster's nodes from DCGM, node conditions and attempt history, and recover the work on the
    unhealthy ones (``runners.health.check_all``, every ``NODE_HEALTH_INTERVAL_SECONDS``)."""
    from .health import check_all

    return check_all()
