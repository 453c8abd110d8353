"""Node pools as admission sees them: free GPUs now (capacity minus live attempts) and the price in force.

The one ``pool_offers``: a pass's snapshot, the locked re-check of an
admission, the submission preview and the clusters page all read offers
from here; which price rows apply to a pool is ``costs.catalog``'s.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db.models import Sum

from costs.catalog import NoPrice, price_at, prices_by_pool
from costs.models import Price
from runners.models import Cluster, NodePool

from ..models import JobAttempt
from .core import PoolOffer

log = logging.getLogger(__name__)


def pool_offers(accelerator_id: int, now: dt.datetime, lock: bool,
                unpriced: list[PoolOffer] | None = None) -> list[PoolOffer]:
    """Every node pool of the accelerator with its free GPUs and the price in force at ``now`` (USD/GPU-hour),
    in pool id order; the pool rows are locked FOR UPDATE (in that order) if ``lock``.

    A pool without a price in force is left out (logged): admission never
    places a job at an unknown price. Given a list as ``unpriced``, those
    pools are appended to it (``usd_per_gpu_hour`` None), for wait reasons.
    """
    pools = NodePool.objects.filter(accelerator_id=accelerator_id).select_related("cluster").order_by("pk")
    if lock:
        pools = pools.select_for_update(of=("self",))
    pools = list(pools)
    in_use = dict(
        JobAttempt.objects.filter(node_pool__in=pools, ended_at__isnull=True)
        .values_list("node_pool_id")
        .annotate(n=Sum("gpus"))
    )
    prices = prices_by_pool(pools, Price.objects.filter(accelerator_id=accelerator_id, effective_from__lte=now))
    offers = []
    for pool in pools:
        try:
            price = price_at(pool, now, prices[pool.pk])
        except NoPrice:
            log.warning("node pool %s has no price in force; not offered", pool)
            price = None
        (offers if price is not None else unpriced if unpriced is not None else []).append(
            PoolOffer(
                node_pool_id=pool.pk, cluster_id=pool.cluster_id, cluster_name=pool.cluster.name,
                provider=pool.cluster.provider, region=pool.cluster.region, capacity_type=pool.capacity_type,
                nodes=pool.nodes, gpus_per_node=pool.gpus_per_node,
                free_gpus=pool.capacity_gpus - in_use.get(pool.pk, 0), usd_per_gpu_hour=price,
                healthy=pool.cluster.health == Cluster.Health.HEALTHY,
            )
        )
    return offers


def lock_pools(accelerator_id: int) -> None:
    """Lock every node pool row of the accelerator FOR UPDATE, in id order (the admission's lock order)."""
    list(NodePool.objects.filter(accelerator_id=accelerator_id).order_by("pk").select_for_update()
         .values_list("pk", flat=True))
