"""Price lookup: the USD per GPU-hour (and, on CPU node pools, per vCPU-hour and GiB-hour) in force for a node pool
at an instant or over an interval, and the USD per kWh of electricity in force for a cluster.

A per-cluster override beats the catalog row for the cluster's provider and
region; among rows of one kind, the latest ``effective_from`` not after the
instant wins. Prices never apply before their effective time.
"""

import datetime as dt
from decimal import Decimal
from itertools import pairwise
from typing import NamedTuple

from .models import ElectricityPrice, Price


class NoPrice(LookupError):
    """No catalog row covers this node pool at this instant."""


def _row_key(price: Price) -> tuple:
    if price.cluster_id is not None:  # a per-cluster override
        return ("cluster", price.accelerator_id, price.capacity_type, price.cluster_id)
    return ("catalog", price.accelerator_id, price.capacity_type, price.provider, price.region)


def _pool_keys(node_pool) -> tuple[tuple, tuple]:
    cluster = node_pool.cluster
    return (("cluster", node_pool.accelerator_id, node_pool.capacity_type, node_pool.cluster_id),
            ("catalog", node_pool.accelerator_id, node_pool.capacity_type, cluster.provider, cluster.region))


def prices_by_pool(node_pools, rows) -> dict[int, list[Price]]:
    """Which of the Price ``rows`` apply to each of ``node_pools``: pool id -> its rows (every pool has a list).

    A row applies to a pool of its accelerator and capacity type when it is
    an override for the pool's cluster, or a catalog row (no cluster) of the
    cluster's provider and region. The one definition of it: ``price_at``,
    ``price_segments``, admission's offers and the fleet API all use it.
    ``node_pools`` need ``cluster`` loaded.
    """
    by_key: dict[tuple, list[Price]] = {}
    for row in rows:
        by_key.setdefault(_row_key(row), []).append(row)
    found = {}
    for pool in node_pools:
        override, catalog = _pool_keys(pool)
        found[pool.pk] = by_key.get(override, []) + by_key.get(catalog, [])
    return found


def _rows(node_pool) -> list[Price]:
    """The Price rows of ``node_pool`` (``prices_by_pool`` of it), from the database."""
    rows = Price.objects.filter(accelerator_id=node_pool.accelerator_id, capacity_type=node_pool.capacity_type)
    return prices_by_pool([node_pool], rows)[node_pool.pk]


class Rates(NamedTuple):
    """The prices of one Price row: USD per GPU-hour, and for a CPU node pool USD per vCPU-hour and per GiB-hour of
    memory (None: not priced by CPU)."""

    gpu: Decimal
    vcpu: Decimal | None = None
    gib: Decimal | None = None


def row_at(node_pool, at: dt.datetime, rows=None) -> Price:
    """The Price row in force for ``node_pool`` at instant ``at`` (aware datetime): the latest override of the
    pool's cluster, else the latest catalog row. ``rows``: preloaded rows (``prices_by_pool``) to avoid a query.
    Raises NoPrice when none is in force."""
    rows = _rows(node_pool) if rows is None else rows
    in_force = [r for r in rows if r.effective_from <= at]
    overrides = [r for r in in_force if r.cluster_id is not None]
    pool = overrides or in_force
    if not pool:
        raise NoPrice(f"no price for {node_pool} ({node_pool.accelerator}, {node_pool.capacity_type}) at {at.isoformat()}")
    return max(pool, key=lambda r: r.effective_from)


def price_at(node_pool, at: dt.datetime, rows=None) -> Decimal:
    """USD per GPU-hour for ``node_pool`` at instant ``at`` (``row_at``'s row). Raises NoPrice."""
    return row_at(node_pool, at, rows).usd_per_gpu_hour


def rates_at(node_pool, at: dt.datetime, rows=None) -> Rates:
    """Every price of the row in force for ``node_pool`` at ``at`` (``row_at``). Raises NoPrice."""
    row = row_at(node_pool, at, rows)
    return Rates(row.usd_per_gpu_hour, row.usd_per_vcpu_hour, row.usd_per_gib_hour)


def price_segments(node_pool, start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime, Decimal]]:
    """Split ``[start, end)`` where the price in force changes; returns ``[(seg_start, seg_end, usd_per_gpu_hour)]``.

    Raises NoPrice when some part of the interval has no price in force.
    """
    rows = _rows(node_pool)
    cuts = sorted({start, end} | {r.effective_from for r in rows if start < r.effective_from < end})
    segments: list[tuple[dt.datetime, dt.datetime, Decimal]] = []
    for seg_start, seg_end in pairwise(cuts):
        price = price_at(node_pool, seg_start, rows)
        if segments and segments[-1][2] == price:
            segments[-1] = (segments[-1][0], seg_end, price)
        else:
            segments.append((seg_start, seg_end, price))
    return segments


def electricity_rows(clusters) -> dict[int, list[ElectricityPrice]]:
    """The ElectricityPrice rows that apply to each of ``clusters`` (cluster id -> rows; every cluster has a list):
    its own overrides and the rows of its provider and region. Two queries."""
    clusters = list(clusters)
    rows = list(ElectricityPrice.objects.filter(cluster__isnull=True, provider__in={c.provider for c in clusters})) \
        + list(ElectricityPrice.objects.filter(cluster__in=clusters))
    return {c.pk: [r for r in rows if r.cluster_id == c.pk
                   or r.cluster_id is None and (r.provider, r.region) == (c.provider, c.region)] for c in clusters}


def electricity_price_at(rows: list[ElectricityPrice], at: dt.datetime) -> Decimal | None:
    """USD per kWh in force at ``at`` among one cluster's ``rows`` (``electricity_rows``): the latest override of
    the cluster, else the latest row of its provider and region, not after ``at``; None: unknown (never 0)."""
    in_force = [r for r in rows if r.effective_from <= at]
    pool = [r for r in in_force if r.cluster_id is not None] or in_force
    return max(pool, key=lambda r: r.effective_from).usd_per_kwh if pool else None
