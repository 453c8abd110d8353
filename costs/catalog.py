"""Price lookup: the USD per GPU-hour in force for a node pool at an instant or over an interval.

A per-cluster override beats the catalog row for the cluster's provider and
region; among rows of one kind, the latest ``effective_from`` not after the
instant wins. Prices never apply before their effective time.
"""

import datetime as dt
from decimal import Decimal

from django.db.models import Q

from .models import Price


class NoPrice(LookupError):
    """No catalog row covers this node pool at this instant."""


def _rows(node_pool):
    cluster = node_pool.cluster
    return Price.objects.filter(
        accelerator_id=node_pool.accelerator_id, capacity_type=node_pool.capacity_type
    ).filter(
        # Overrides for this cluster, or catalog rows for its provider and region.
        Q(cluster=cluster) | Q(cluster__isnull=True, provider=cluster.provider, region=cluster.region)
    )


def price_at(node_pool, at: dt.datetime, rows=None) -> Decimal:
    """USD per GPU-hour for ``node_pool`` at instant ``at`` (aware datetime).

    ``rows`` may pass preloaded Price rows of this pool to avoid a query.
    Raises NoPrice when neither an override nor a catalog row is in force.
    """
    rows = list(_rows(node_pool)) if rows is None else rows
    in_force = [r for r in rows if r.effective_from <= at]
    overrides = [r for r in in_force if r.cluster_id is not None]
    pool = overrides or in_force
    if not pool:
        raise NoPrice(f"no price for {node_pool} ({node_pool.accelerator}, {node_pool.capacity_type}) at {at.isoformat()}")
    return max(pool, key=lambda r: r.effective_from).usd_per_gpu_hour


def price_segments(node_pool, start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime, Decimal]]:
    """Split ``[start, end)`` where the price in force changes; returns ``[(seg_start, seg_end, usd_per_gpu_hour)]``.

    Raises NoPrice when some part of the interval has no price in force.
    """
    rows = list(_rows(node_pool))
    cuts = sorted({start, end} | {r.effective_from for r in rows if start < r.effective_from < end})
    segments: list[tuple[dt.datetime, dt.datetime, Decimal]] = []
    for seg_start, seg_end in zip(cuts, cuts[1:]):
        price = price_at(node_pool, seg_start, rows)
        if segments and segments[-1][2] == price:
            segments[-1] = (segments[-1][0], seg_end, price)
        else:
            segments.append((seg_start, seg_end, price))
    return segments
