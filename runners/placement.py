"""Placement: choose the node pool for a job among offers, by fit and then by price.

Pure functions over plain data, so the scheduler can call them in a tight
loop and tests can compute expected choices by hand.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal


@dataclasses.dataclass(frozen=True)
class PoolOffer:
    """A node pool as admission sees it: where it is, its shape, free GPUs now and its price (USD/GPU-hour)."""

    node_pool_id: int
    cluster_id: int
    cluster_name: str
    provider: str
    region: str
    capacity_type: str
    nodes: int
    gpus_per_node: int
    free_gpus: int
    usd_per_gpu_hour: Decimal
    healthy: bool = True


@dataclasses.dataclass(frozen=True)
class PlacementRequest:
    """What a job needs: ``nodes`` nodes of ``gpus_per_node`` GPUs, spot allowed if ``preemptible``,
    and optional lists of allowed providers, regions and cluster names (empty: any)."""

    nodes: int
    gpus_per_node: int
    preemptible: bool = False
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def matches(request: PlacementRequest, offer: PoolOffer) -> bool:
    """Whether ``offer`` could ever hold ``request``: health, constraints, spot rule and node shape."""
    return (
        offer.healthy
        and (not request.providers or offer.provider in request.providers)
        and (not request.regions or offer.region in request.regions)
        and (not request.clusters or offer.cluster_name in request.clusters)
        and (request.preemptible or offer.capacity_type != "spot")
        and request.gpus_per_node <= offer.gpus_per_node
        and request.nodes <= offer.nodes
    )


def fits_now(request: PlacementRequest, offer: PoolOffer) -> bool:
    """Whether ``offer`` has room for the whole job now (all nodes or none).

    Free GPUs are counted per pool, not per node: the local runner and the
    first admission treat a pool as one bin; the Kubernetes runner checks
    per-node room on its own.
    """
    return matches(request, offer) and offer.free_gpus >= request.total_gpus


def choose_pool(request: PlacementRequest, offers: list[PoolOffer]) -> PoolOffer | None:
    """The cheapest matching offer with room now; ties go to the most free GPUs, then the cluster name.

    Returns None when no offer has room.
    """
    candidates = [o for o in offers if fits_now(request, o)]
    if not candidates:
        return None
    return min(candidates, key=lambda o: (o.usd_per_gpu_hour, -o.free_gpus, o.cluster_name, o.node_pool_id))
