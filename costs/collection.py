"""Collecting per-attempt, per-day GPU utilization from Prometheus into UtilizationRollup.

Each attempt is read only within its running interval ``[started_at,
ended_at or now)``, cut at UTC midnight; one pushed-down query per piece.
What a piece holds is counted, never scaled: allocated GPU-seconds (GPUs x
seconds running), observed GPU-seconds (the instants, one per scrape
interval, at which a GPU's latest sample is within Prometheus' lookback:
a sample counts until the next one or until the lookback runs out), idle
GPU-seconds (those instants whose sample is under the idle threshold) and
the unobserved rest. A gap longer than the lookback stays unobserved past
it, and the instants of adjacent pieces never overlap, so the pieces of an
attempt add up to the same totals wherever midnight falls. The kWh the
GPUs drew (dcgm-exporter's energy counter, Prometheus' ``increase``) are
kept beside them, null where the exporter reports no energy.

Series are attributed to an attempt by the cluster's label shape
(``costs.prometheus.SHAPES``), detected from its series and kept in
``ClusterMetrics`` (an operator may override it). Utilization is collected
periodically, when an attempt ends (``collect_ended``, so short and cancelled
jobs have it), and on reading a running job (``refresh_running``, at most
every ``COSTS_LIVE_CACHE_SECONDS``). The rows are aggregated by
``costs.aggregation``; the ledger is checked against the metrics by
``costs.ledgercheck``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from datetime import UTC

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from jobs.models import JobAttempt
from runners.models import Cluster

from . import prometheus
from .models import ClusterMetrics, UtilizationRollup

log = logging.getLogger(__name__)
DAY = dt.timedelta(days=1)
# A detected label shape is re-detected from the series after this long.
SHAPE_MAX_AGE = dt.timedelta(hours=1)


def utc_days(start: dt.datetime, end: dt.datetime) -> list[tuple[dt.date, dt.datetime, dt.datetime]]:
    """``[start, end)`` cut at UTC midnights: ``[(day, piece_start, piece_end)]``."""
    pieces = []
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    while start < end:
        midnight = dt.datetime.combine(start.date(), dt.time(), UTC) + DAY
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


# --- label shapes ---------------------------------------------------------------------------------------------

def detect_cluster_shape(cluster: Cluster, at: dt.datetime | None = None, client=None) -> ClusterMetrics | None:
    """Detect ``cluster``'s DCGM label shape and counter from its series now (``prometheus.detect_shape``) and
    store it; an override set by an operator is kept. A cluster whose series show nothing keeps what was
    detected before. None when the cluster has no Prometheus. Raises what ``prometheus.read_usage`` raises."""
    source = prometheus.source_for(cluster)
    if source is None:
        return None
    at = at or timezone.now()
    found = prometheus.detect_shape(source, at, client=client)
    row, _ = ClusterMetrics.objects.get_or_create(cluster=cluster)
    if found.kind:
        row.detected_shape, row.host_label, row.util_metric = found.kind, found.host_label, found.util_metric
    row.series, row.detected_at = dict(found.series), at
    row.save()
    return row


def cluster_shape(cluster: Cluster, at: dt.datetime | None = None, client=None) -> prometheus.Shape:
    """The label shape in force on ``cluster``: its override, else the detection (redone after ``SHAPE_MAX_AGE``);
    the pod shape when nothing was ever detected."""
    now = timezone.now()
    row = ClusterMetrics.objects.filter(cluster=cluster).first()
    if row is None or not row.shape_override and (row.detected_at is None or row.detected_at < now - SHAPE_MAX_AGE):
        try:
            row = detect_cluster_shape(cluster, min(at or now, now), client) or row
        except SoftTimeLimitExceeded:  # the task's time is up, not Prometheus
            raise
        except Exception as exc:  # noqa: BLE001 (Prometheus unreachable: keep what is known)
            log.warning("label shape of cluster %s not detected: %s", cluster, exc)
    if row is None or not row.shape:
        return prometheus.Shape(prometheus.SHAPE_POD)
    return prometheus.Shape(row.shape, row.host_label, row.util_metric)


def attempt_matchers(attempt: JobAttempt, shape: prometheus.Shape, source: prometheus.Source, lo: dt.datetime,
                     hi: dt.datetime, client) -> str | None:
    """The matchers of ``attempt``'s GPU series within ``[lo, hi)`` under ``shape``; None if not attributable.

    Host shape: the nodes of its pods (kube-state-metrics), restricted to the
    GPU UUIDs the runner recorded (``runner_state["gpu_uuids"]``); without
    them only an attempt holding its nodes whole is attributable.
    """
    team, name = attempt.job.team.slug, attempt.object_name
    if shape.kind != prometheus.SHAPE_HOST:
        return prometheus.shape_matchers(shape, team, name)
    hosts = prometheus.attempt_hosts(source, team, name, lo, hi, client=client)
    uuids = tuple(attempt.runner_state.get("gpu_uuids") or ()) if isinstance(attempt.runner_state, dict) else ()
    if not hosts:
        return None
    if not uuids and sum(hosts.values()) < prometheus.host_gpus(source, shape, tuple(hosts), hi, hi - lo,
                                                                   client=client):
        return None
    return prometheus.shape_matchers(shape, team, name, tuple(hosts), uuids)


# --- collection -----------------------------------------------------------------------------------------------

class _Sources:
    """Per-cluster Prometheus source, client and label shape, looked up once per collection pass."""

    def __init__(self, timeout: float | None = None):
        self._by_cluster: dict[int, tuple] = {}
        self._timeout = timeout
        #: Clusters whose collection failed in this pass (cluster id -> why): their other attempts wait for the next.
        self.failed: dict[int, str] = {}

    def isolated(self, attempt: JobAttempt, collect: Callable[[], int]) -> int | None:
        """``collect()`` (one attempt's collection) unless ``attempt``'s cluster failed earlier in this pass.

        Class of failure: one cluster's fault stops every cluster. Invariant:
        a Prometheus that does not answer, or a basic-auth credential that
        cannot be decrypted (``CredentialUnreadable``), costs its own
        cluster's collection in this pass and no other's: the failure is
        logged, the cluster skipped for the rest of the pass, and None
        returned. The task's soft time limit still stops the pass.
        """
        if attempt.cluster_id in self.failed:
            return None
        try:
            return collect()
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - failure domain: one cluster (docs/adr/0016)
            self.failed[attempt.cluster_id] = f"{type(exc).__name__}: {exc}"
            log.warning("cluster %s: utilization not collected in this pass: %s", attempt.cluster_id, exc)
            return None

    def get(self, cluster: Cluster, at: dt.datetime):
        if cluster.pk not in self._by_cluster:
            source = prometheus.source_for(cluster)
            if source is None:
                log.warning("cluster %s has no Prometheus; utilization not collected", cluster)
                self._by_cluster[cluster.pk] = (None, None, None)
            else:
                client = source.client(self._timeout)
                self._by_cluster[cluster.pk] = (source, client, cluster_shape(cluster, at, client))
        return self._by_cluster[cluster.pk]


def collect_attempt(attempt: JobAttempt, start: dt.datetime, end: dt.datetime, sources: _Sources | None = None) -> int:
    """Read ``attempt``'s utilization within ``[start, end)`` (cut to its run and at UTC midnights) and upsert
    its UtilizationRollup rows; returns rows written (0 without a Prometheus). Call it with whole UTC days or
    the attempt's whole run: a day's row is replaced by what this window holds of it."""
    sources = sources or _Sources()
    interval = running_interval(attempt, start, end)
    source, client, shape = sources.get(attempt.cluster, end)
    if source is None or interval is None:
        return 0
    step = settings.COSTS_SCRAPE_INTERVAL_SECONDS
    rows = {}
    for day, lo, hi in utc_days(*interval):
        matchers = attempt_matchers(attempt, shape, source, lo, hi, client)
        usage = prometheus.NO_USAGE if matchers is None else prometheus.read_usage(source, matchers, lo, hi,
                                                                                    client=client)
        gpu_seconds = attempt.gpus * (hi - lo).total_seconds()
        idle = usage.idle
        rows[day] = dict(
            job_id=attempt.job_id, team_id=attempt.job.team_id, cluster_id=attempt.cluster_id,
            accelerator_id=attempt.node_pool.accelerator_id, gpu_seconds=gpu_seconds,
            samples=usage.samples, expected_samples=gpu_seconds / step, util_sum=usage.util_sum,
            avg_gpu_util_percent=usage.avg_util_percent, memory_samples=usage.memory_samples,
            avg_memory_used_mib=usage.avg_memory_mib,
            observed_gpu_seconds=min(gpu_seconds, usage.observed_seconds),
            idle_gpu_seconds=None if idle is None else min(gpu_seconds, idle),
            util_metric=usage.util_metric, label_shape=shape.kind if matchers is not None else "",
            energy_kwh=usage.energy_kwh,
        )
    # Every day of the window read before any is written, then written together: a collection stopped in between
    # (a Prometheus error, the task's time limit) writes none, and collect_ended reads the attempt again.
    with transaction.atomic():
        for day, defaults in rows.items():
            UtilizationRollup.objects.update_or_create(attempt=attempt, day=day, defaults=defaults)
    return len(rows)


def collect_utilization(start: dt.datetime, end: dt.datetime | None = None, clusters=None) -> int:
    """Read utilization of every attempt that ran in ``[start, end)`` and upsert its UtilizationRollup rows.

    ``end`` defaults to now. Idempotent: a (attempt, day) row is recomputed
    from Prometheus each time, for the part of the day inside the window, so
    call it with whole UTC days (the periodic task does). Returns rows written.
    Clusters without a Prometheus source are skipped with a warning; a cluster whose collection fails is
    skipped for the rest of the pass (``_Sources.isolated``), the others are read.
    """
    end = end or timezone.now()
    sources = _Sources()
    return sum(sources.isolated(a, lambda a=a: collect_attempt(a, start, end, sources)) or 0
               for a in attempts_between(start, end, clusters))


def lookback_start(now: dt.datetime) -> dt.datetime:
    """The UTC midnight at or before ``now - COSTS_COLLECT_LOOKBACK_SECONDS``: where a periodic re-read begins."""
    start = now.astimezone(UTC) - dt.timedelta(seconds=settings.COSTS_COLLECT_LOOKBACK_SECONDS)
    return start.replace(hour=0, minute=0, second=0, microsecond=0)


def periodic_pass(now: dt.datetime) -> int:
    """What the periodic collection (``costs.tasks.collect_utilization``, every ``UTILIZATION_INTERVAL_SECONDS``)
    does at ``now`` (aware): re-read the last ``COSTS_COLLECT_LOOKBACK_SECONDS``, from a UTC midnight, up to
    ``now``. Returns rollup rows written. Raises what ``collect_utilization`` raises."""
    return collect_utilization(lookback_start(now), now)


def settle_seconds() -> float:
    """How long after an attempt's end its last scrape is in Prometheus: two scrape intervals, seconds."""
    return 2 * settings.COSTS_SCRAPE_INTERVAL_SECONDS


def collect_ended(now: dt.datetime | None = None) -> int:
    """Collect the whole run of every attempt that ended in the lookback window (``COSTS_COLLECT_LOOKBACK_SECONDS``)
    at least ``settle_seconds()`` ago and was not collected since; returns the attempts collected.

    Runs every minute, so a job of a few minutes, a cancelled one, has its
    utilization as soon as its last scrape is in.
    """
    now = now or timezone.now()
    settle = dt.timedelta(seconds=settle_seconds())
    due = (JobAttempt.objects.filter(started_at__isnull=False, ended_at__lte=now - settle,
                                     ended_at__gt=now - dt.timedelta(seconds=settings.COSTS_COLLECT_LOOKBACK_SECONDS))
           .annotate(last=Max("utilization_rollups__collected_at"))
           .select_related("job__team", "node_pool", "cluster").order_by("pk"))
    sources, count = _Sources(), 0
    for attempt in due:
        if attempt.last is not None and attempt.last >= attempt.ended_at + settle:
            continue
        if sources.isolated(attempt, lambda a=attempt: collect_attempt(a, a.started_at, a.ended_at, sources)) is None:
            continue  # its cluster failed: read again by the next pass (not collected since)
        count += 1
    return count


def refresh_running(attempts, now: dt.datetime | None = None) -> int:
    """Re-read the running ``attempts`` (JobAttempt rows) whose rollups are older than ``COSTS_LIVE_CACHE_SECONDS``:
    their whole run when they have no rollup, else today's piece. Returns the attempts read. Each query waits
    at most ``COSTS_LIVE_TIMEOUT_SECONDS``, without retry; a Prometheus error is logged and leaves the rollups as
    they were (the page still answers)."""
    now = now or timezone.now()
    fresh_after = now - dt.timedelta(seconds=settings.COSTS_LIVE_CACHE_SECONDS)
    sources, count = _Sources(timeout=settings.COSTS_LIVE_TIMEOUT_SECONDS), 0
    for attempt in attempts:
        if attempt.started_at is None or attempt.ended_at is not None:
            continue
        last = attempt.utilization_rollups.aggregate(m=Max("collected_at"))["m"]
        if last is not None and last >= fresh_after:
            continue
        midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        try:
            collect_attempt(attempt, attempt.started_at if last is None else midnight, now, sources)
        except Exception as exc:  # noqa: BLE001 (Prometheus down: the stored rollups answer)
            log.warning("live utilization of %s not read: %s", attempt, exc)
            continue
        count += 1
    return count
