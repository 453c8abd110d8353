"""Placement (Kueue's resource flavors): which node pools could ever hold a job, which has room now, which is cheapest.

Pure functions over plain data, so the decision loop can call them in a
tight loop and tests can compute expected choices by hand.
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
    """What a job needs: ``nodes`` nodes of ``gpus_per_node`` GPUs, each copied ``replicas`` times (serving
    replicas; their pods may share nodes), spot allowed if ``preemptible``, and optional lists of allowed
    providers, regions and cluster names (empty: any)."""

    nodes: int
    gpus_per_node: int
    preemptible: bool = False
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    replicas: int = 1

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node * self.replicas


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


def price_order(offer: PoolOffer) -> tuple:
    """The order pools are tried in: cheapest first, then by cluster name and pool id (stable between passes)."""
    return (offer.usd_per_gpu_hour, offer.cluster_name, offer.node_pool_id)


def cheapest_with_room(offers: list[PoolOffer], gpus: int, free: dict[int, int]) -> PoolOffer | None:
    """``choose_pool`` over offers already in ``price_order`` whose free GPUs (by pool id) are ``free``, not the
    offers' own ``free_gpus``: the cheapest with room for ``gpus``, ties to the most free GPUs; None when none has room.
    """
    best = None
    for o in offers:
        if best is not None and o.usd_per_gpu_hour != best.usd_per_gpu_hour:
            break
        f = free[o.node_pool_id]
        if f >= gpus and (best is None or f > free[best.node_pool_id]):
            best = o
    return best
