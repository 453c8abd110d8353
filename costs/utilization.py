"""Collecting per-attempt, per-day GPU utilization into UtilizationRollup, and checking the ledger against metrics.

Each attempt is read only within its running interval ``[started_at,
ended_at or now)``, cut at UTC midnight; one pushed-down query per piece.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.models import JobAttempt
from runners.models import Cluster

from . import prometheus
from .metrics import LEDGER_DISCREPANCY_PERCENT
from .models import CostEntry, LedgerDiscrepancy, UtilizationRollup

log = logging.getLogger(__name__)
DAY = dt.timedelta(days=1)


def utc_days(start: dt.datetime, end: dt.datetime) -> list[tuple[dt.date, dt.datetime, dt.datetime]]:
    """``[start, end)`` cut at UTC midnights: ``[(day, piece_start, piece_end)]``."""
    pieces = []
    start, end = start.astimezone(dt.timezone.utc), end.astimezone(dt.timezone.utc)
    while start < end:
        midnight = dt.datetime.combine(start.date(), dt.time(), dt.timezone.utc) + DAY
        pieces.append((start.date(), start, min(end, midnight)))
        start = pieces[-1][2]
    return pieces


def running_interval(attempt: JobAttempt, start: dt.datetime, end: dt.datetime):
    """The part of ``[start, end)`` in which ``attempt`` ran, or None."""
    if attempt.started_at is None:
        return None
    lo = max(start, attempt.started_at)
    hi = min(end, attempt.ended_at or end)
    return (lo, hi) if lo < hi else None


def attempts_between(start: dt.datetime, end: dt.datetime, clusters=None):
    """Attempts that ran some time in ``[start, end)`` (optionally on ``clusters``)."""
    qs = JobAttempt.objects.filter(started_at__isnull=False, started_at__lt=end).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=start)
    ).select_related("job__team", "node_pool", "cluster")
    if clusters is not None:
        qs = qs.filter(cluster__in=clusters)
    return qs.order_by("pk")


def collect_utilization(start: dt.datetime, end: dt.datetime | None = None, clusters=None) -> int:
    """Read utilization of every attempt that ran in ``[start, end)`` and upsert its UtilizationRollup rows.

    ``end`` defaults to now. Idempotent: a (attempt, day) row is recomputed
    from Prometheus each time, for the part of the day inside the window, so
    call it with whole UTC days (the periodic task does). Returns rows written.
    Clusters without a Prometheus source are skipped with a warning.
    """
    end = end or timezone.now()
    step = settings.COSTS_SCRAPE_INTERVAL_SECONDS
    clients: dict[int, tuple] = {}
    written = 0
    for attempt in attempts_between(start, end, clusters):
        if attempt.cluster_id not in clients:
            source = prometheus.source_for(attempt.cluster)
            if source is None:
                log.warning("cluster %s has no Prometheus; utilization not collected", attempt.cluster)
            clients[attempt.cluster_id] = (source, source and source.client())
        source, client = clients[attempt.cluster_id]
        interval = running_interval(attempt, start, end)
        if source is None or interval is None:
            continue
        matchers = prometheus.attempt_pod_matchers(attempt.job.team.slug, attempt.object_name)
        for day, lo, hi in utc_days(*interval):
            usage = prometheus.read_usage(source, matchers, lo, hi, client=client)
            gpu_seconds = attempt.gpus * (hi - lo).total_seconds()
            idle = usage.idle_fraction
            UtilizationRollup.objects.update_or_create(
                attempt=attempt, day=day,
                defaults=dict(
                    job_id=attempt.job_id, team_id=attempt.job.team_id, cluster_id=attempt.cluster_id,
                    accelerator_id=attempt.node_pool.accelerator_id, gpu_seconds=gpu_seconds,
                    samples=usage.samples, expected_samples=gpu_seconds / step, util_sum=usage.util_sum,
                    avg_gpu_util_percent=usage.avg_util_percent, memory_samples=usage.memory_samples,
                    avg_memory_used_mib=usage.avg_memory_mib,
                    idle_gpu_seconds=None if idle is None else gpu_seconds * idle,
                ),
            )
            written += 1
    return written


def ledger_gpu_hours(cluster: Cluster, start: dt.datetime, end: dt.datetime) -> float:
    """GPU-hours the ledger charged on ``cluster`` within ``[start, end)``: entries' GPUs x their time inside the window."""
    seconds = 0.0
    for lo, hi, gpus in CostEntry.objects.filter(cluster=cluster, interval_start__lt=end, interval_end__gt=start) \
            .values_list("interval_start", "interval_end", "gpus"):
        seconds += gpus * (min(hi, end) - max(lo, start)).total_seconds()
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
