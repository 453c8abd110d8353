"""Celery tasks of the runners app: periodic node pool sync of the Kubernetes clusters."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="runners.tasks.sync_node_pools", ignore_result=True)
def sync_node_pools() -> list[dict]:
    """Write every Kubernetes cluster's discovered GPU node pools into its NodePool rows (``NODE_POOL_SYNC_INTERVAL_SECONDS``).

    One cluster that does not answer is skipped and the others are synced;
    returns one result per cluster (see ``runners.kubernetes.sync.apply_pools``).
    """
    from .kubernetes.sync import sync_all

    return sync_all()
