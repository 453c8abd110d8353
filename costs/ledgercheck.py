"""Checking the ledger against the metrics: GPU-hours charged on a cluster vs kube-state-metrics' allocated GPU-hours.

The ledger (``costs.ledger``) charges an attempt from its start to its end
as the runner saw them; kube-state-metrics counts the GPUs requested by every
pod bound to a node that has not finished, Pending ones included (an image
pull, init containers: the GPUs are held from binding on, and billed), as
``costs.prometheus.allocated_gpu_hours`` reads it. Over a window the two agree within a tolerance on a healthy
cluster; ``check_ledger`` stores each comparison (``LedgerDiscrepancy``) and
exports its difference (``controlplane_ledger_discrepancy_percent``). The
periodic task is ``costs.tasks.check_ledger``.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings

from core.gpus import MILLI_PER_GPU
from runners.models import Cluster

from . import prometheus
from .metrics import LEDGER_DISCREPANCY_PERCENT
from .models import CostEntry, LedgerDiscrepancy
from .spend import ENTRY_SPAN


def ledger_gpu_hours(cluster: Cluster, start: dt.datetime, end: dt.datetime) -> float:
    """GPU-hours the ledger charged on ``cluster`` within ``[start, end)``, as kube-state-metrics counts them:
    entries' GPUs (``gpu_milli`` / 1000) x their time inside the window; an entry of a job on part of one GPU counts
    the device its pod asks (its attempt's ``gpus``, one), not its billed share (ADR 0040): kube-state-metrics counts
    the ``nvidia.com/gpu`` a time-sliced or MIG-single pod requests, whole."""
    seconds = 0.0
    # Entries are cut at every UTC hour (``costs.spend.ENTRY_SPAN``): none that overlaps the window starts earlier.
    for lo, hi, milli, share, devices in CostEntry.objects.filter(
            cluster=cluster, interval_start__gte=start - ENTRY_SPAN, interval_start__lt=end, interval_end__gt=start) \
            .values_list("interval_start", "interval_end", "gpu_milli", "job__gpu_share_milli", "attempt__gpus"):
        seconds += (devices if share else milli / MILLI_PER_GPU) * (min(hi, end) - max(lo, start)).total_seconds()
    return seconds / 3600


def check_ledger(cluster: Cluster, start: dt.datetime, end: dt.datetime,
                 tolerance_percent: float | None = None) -> LedgerDiscrepancy | None:
    """Compare ledger and kube-state-metrics GPU-hours of ``cluster`` over ``[start, end)``; store and return the check.

    Flagged when the relative difference exceeds ``tolerance_percent``
    (default ``COSTS_DISCREPANCY_TOLERANCE_PERCENT``, 1 %), or when one side
    is zero and the other is not. None when the cluster has no Prometheus.
    """
    tolerance = settings.COSTS_DISCREPANCY_TOLERANCE_PERCENT if tolerance_percent is None else tolerance_percent
    source = prometheus.source_for(cluster)
    if source is None:
        return None
    ledger = ledger_gpu_hours(cluster, start, end)
    metrics = prometheus.allocated_gpu_hours(source, start, end)
    observed = metrics or 0.0
    if ledger:
        diff = abs(observed - ledger) / ledger * 100
    else:
        diff = 0.0 if not observed else 100.0
    LEDGER_DISCREPANCY_PERCENT.labels(cluster=cluster.name).set(diff)
    return LedgerDiscrepancy.objects.create(
        cluster=cluster, window_start=start, window_end=end, ledger_gpu_hours=ledger, metrics_gpu_hours=metrics,
        difference_percent=diff, flagged=diff > tolerance,
    )
