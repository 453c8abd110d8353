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

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from datetime import UTC

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, ExpressionWrapper, F, FloatField, Max, Q, Value, When
from django.db.models.functions import Coalesce, Least
from django.utils import timezone

from core.gpus import MILLI_PER_GPU
from jobs.models import JobAttempt, held_gpu_milli, roles_in_order
from runners.models import Cluster

from . import prometheus
from .models import ClusterMetrics, NodeUtilizationRollup, UtilizationRollup

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

def detect_cluster_shape(cluster: Cluster, at: dt.datetime | None = None, client=None,
                         lookback: dt.timedelta = DAY) -> ClusterMetrics | None:
    """Detect ``cluster``'s DCGM label shape and counter from its series in ``[at - lookback, at]`` (``at``
    default now; ``prometheus.detect_shape``) and store it; an override set by an operator is kept. A cluster
    whose series show nothing keeps what was detected before. None when the cluster has no Prometheus. Raises
    what ``prometheus.read_usage`` raises."""
    source = prometheus.source_for(cluster)
    if source is None:
        return None
    at = at or timezone.now()
    found = prometheus.detect_shape(source, at, lookback, client=client)
    row, _ = ClusterMetrics.objects.get_or_create(cluster=cluster)
    if found.kind:
        row.detected_shape, row.host_label, row.util_metric = found.kind, found.host_label, found.util_metric
    row.series, row.detected_at = dict(found.series), at
    row.save()
    return row


def cluster_shape(cluster: Cluster, at: dt.datetime | None = None, client=None) -> prometheus.Shape:
    """The label shape in force on ``cluster`` at ``at`` (default now): its override, else the detection, redone
    when it was made more than ``SHAPE_MAX_AGE`` away from ``at`` (a pass over history is a function of its
    instant, not of the clock); the pod shape when nothing was ever detected."""
    at = min(at or timezone.now(), timezone.now())
    row = ClusterMetrics.objects.filter(cluster=cluster).first()
    if row is None or not row.shape_override and (row.detected_at is None
                                                  or abs(row.detected_at - at) > SHAPE_MAX_AGE):
        # The series since the previous detection (at least SHAPE_MAX_AGE, at most a day): hourly detections
        # read each sample about once, not a day's worth every hour.
        since = at - row.detected_at if row is not None and row.detected_at and row.detected_at < at else DAY
        try:
            row = detect_cluster_shape(cluster, at, client, min(DAY, max(SHAPE_MAX_AGE, since))) or row
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


def gpu_share(attempt: JobAttempt) -> float | None:
    """The fraction of one GPU the pod of ``attempt`` holds when its job asks part of a GPU (ADR 0040): its job's
    ``gpu_share_milli`` over ``core.gpus.MILLI_PER_GPU`` (a quarter: 0.25; a MIG device: its memory slices over
    eight), the share the ledger bills; None for whole GPUs."""
    milli = int(attempt.job.gpu_share_milli or 0)
    return milli / MILLI_PER_GPU if milli else None


def allocated_gpus(attempt: JobAttempt) -> float:
    """The GPUs ``attempt`` is allocated, for its allocated GPU-seconds: what the ledger bills it
    (``jobs.models.held_gpu_milli``: its share of one GPU, else its whole GPUs) in GPUs."""
    return held_gpu_milli(attempt.gpus, attempt.job.gpu_share_milli) / MILLI_PER_GPU


def attributed(attempt: JobAttempt | None, usage: prometheus.WindowUsage,
               nodes: dict[tuple[str, str], prometheus.WindowUsage]):
    """``(usage, nodes)`` of ``attempt``'s series as the attempt is given them: unchanged for whole GPUs; for a pod
    on part of a GPU, its share of each (``WindowUsage.share``). The rule of a shared GPU (docs/design.md, "Shared
    GPUs"): dcgm-exporter reports per physical GPU (a time-sliced one: a series per pod on it, each with the GPU's
    value) or per MIG device (``GPU_I_ID``, the pod that holds it); a series goes to the pod its labels name, and
    its GPU time counts at that pod's share of the GPU, so the pods on one GPU are given at most all of its time
    and the rest is unallocated, never anyone's idle."""
    share = gpu_share(attempt) if attempt is not None else None
    if share is None:
        return usage, nodes
    return usage.share(share), {key: value.share(share) for key, value in nodes.items()}


def attempt_roles(attempt: JobAttempt) -> tuple[str, ...]:
    """The role names of a multi-role ``attempt`` (its ``placement["roles"]``); ``()`` for an attempt of one role."""
    roles = (attempt.placement or {}).get("roles") if isinstance(attempt.placement, dict) else None
    return tuple(roles_in_order(roles))


def read_by_node(source: prometheus.Source, shape: prometheus.Shape, matchers: str | None, lo: dt.datetime,
                 hi: dt.datetime, client, attempt: JobAttempt | None = None
                 ) -> tuple[prometheus.WindowUsage, dict[tuple[str, str], prometheus.WindowUsage]]:
    """``(usage, {(node, role): usage})`` of the series matching ``matchers`` in ``[lo, hi)``: one read
    (``prometheus.read_usage_by``) grouped by the shape's host label (``Hostname`` or ``hostname``, the node
    dcgm-exporter runs on), the whole its sum. ``role`` is ``""`` unless ``attempt`` is a multi-role attempt on a
    pod-labelled cluster: then the read is grouped by the pod label too, and each pod's series go to its role
    (``prometheus.pod_role``). ``matchers`` None (not attributable): nothing read, ``NO_USAGE`` and ``{}``. Series
    without a host label count in the whole only. An attempt on part of a GPU is given its share (``attributed``).
    Raises what ``read_usage`` raises."""
    if matchers is None:
        return prometheus.NO_USAGE, {}
    roles = attempt_roles(attempt) if attempt is not None and shape.kind in prometheus.POD_LABELS else ()
    if not roles:
        groups = prometheus.read_usage_by(source, matchers, lo, hi, (shape.host_label,), client=client)
        return attributed(attempt, sum(groups.values(), prometheus.NO_USAGE),
                          {(host, ""): usage for (host,), usage in groups.items()})
    pod_label = prometheus.POD_LABELS[shape.kind][1]
    groups = prometheus.read_usage_by(source, matchers, lo, hi, (pod_label, shape.host_label), client=client)
    nodes: dict[tuple[str, str], prometheus.WindowUsage] = {}
    for (pod, host), usage in groups.items():
        key = (host, prometheus.pod_role(pod, attempt.object_name, roles))
        nodes[key] = nodes.get(key, prometheus.NO_USAGE) + usage
    return sum(groups.values(), prometheus.NO_USAGE), nodes


def write_nodes(attempt: JobAttempt, day: dt.date, nodes: dict[tuple[str, str], prometheus.WindowUsage], *,
                replace: bool) -> None:
    """Store ``nodes`` (``{(node name, role): usage}``, a read of ``attempt`` on UTC ``day``; role ``""`` where the
    series named no pod of a role) in its NodeUtilizationRollup rows: ``replace``: the read is the day's part from its start, and the rows become it; else the read follows
    what the rows hold, and is added to them. Call it in the transaction that wrote the attempt's
    UtilizationRollup row, and only when that write applied (its compare-and-set holds the attempt's row, so
    no other pass adds the same window)."""
    rows = NodeUtilizationRollup.objects.filter(attempt=attempt, day=day)
    if replace:
        rows.delete()
    for (node, role), usage in nodes.items():
        if not node or not (usage.samples or usage.observed_seconds):
            continue
        sums = {"samples": usage.samples, "util_sum": usage.util_sum,
                "observed_gpu_seconds": usage.observed_seconds, "idle_gpu_seconds": usage.idle_seconds}
        if replace or not rows.filter(node=node, role=role).update(**{f: F(f) + v for f, v in sums.items()}):
            NodeUtilizationRollup.objects.create(attempt=attempt, team_id=attempt.job.team_id,
                                                 cluster_id=attempt.cluster_id, day=day, node=node, role=role,
                                                 **sums)


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
        return self.run(attempt.cluster_id, collect)

    def run(self, cluster_id: int, collect: Callable):
        """``collect()`` (a read of cluster ``cluster_id``) unless that cluster failed earlier in this pass; None
        when it failed before or fails now (see ``isolated``)."""
        if cluster_id in self.failed:
            return None
        try:
            return collect()
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - failure domain: one cluster (docs/adr/0016)
            self.failed[cluster_id] = f"{type(exc).__name__}: {exc}"
            log.warning("cluster %s: utilization not collected in this pass: %s", cluster_id, exc)
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


def day_part(attempt: JobAttempt, day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """``[lo, hi)``: the part of UTC ``day`` in which ``attempt`` ran (``hi`` the day's end while it runs)."""
    midnight = dt.datetime.combine(day, dt.time(), UTC)
    lo = max(midnight, attempt.started_at)
    return lo, min(midnight + DAY, attempt.ended_at) if attempt.ended_at else midnight + DAY


def seal_after() -> dt.timedelta:
    """How long after a day's part of a run ends its row is sealed (final: no pass reads it again; it is not read
    whole again either, as its sums add up over the windows that made it): ``COSTS_SEAL_AFTER_SECONDS``, at least
    ``settle_seconds()``."""
    return dt.timedelta(seconds=max(settings.COSTS_SEAL_AFTER_SECONDS, settle_seconds()))


def _row_values(attempt: JobAttempt, shape_kind: str, attributable: bool, lo: dt.datetime, hi: dt.datetime,
                usage: prometheus.WindowUsage) -> dict:
    """A rollup's fields holding ``usage``, the sums of ``[lo, hi)`` (the day's part of the run from its start);
    allocated GPU-seconds count a share of one GPU as that share (``allocated_gpus``)."""
    gpu_seconds = allocated_gpus(attempt) * (hi - lo).total_seconds()
    idle = usage.idle
    return dict(
        job_id=attempt.job_id, team_id=attempt.job.team_id, cluster_id=attempt.cluster_id,
        accelerator_id=attempt.node_pool.accelerator_id, gpu_seconds=gpu_seconds,
        samples=usage.samples, expected_samples=gpu_seconds / settings.COSTS_SCRAPE_INTERVAL_SECONDS,
        util_sum=usage.util_sum, avg_gpu_util_percent=usage.avg_util_percent, memory_samples=usage.memory_samples,
        memory_sum=usage.memory_sum, avg_memory_used_mib=usage.avg_memory_mib, prof_samples=usage.prof_samples,
        observed_gpu_seconds=min(gpu_seconds, usage.observed_seconds),
        idle_gpu_seconds=None if idle is None else min(gpu_seconds, idle),
        util_metric=usage.util_metric, label_shape=shape_kind if attributable else "",
        energy_kwh=usage.energy_kwh,
    )


def collect_attempt(attempt: JobAttempt, start: dt.datetime, end: dt.datetime, sources: _Sources | None = None,
                    now: dt.datetime | None = None) -> int:
    """Read ``attempt``'s utilization within ``[start, end)`` (cut to its run and at UTC midnights) and upsert
    its UtilizationRollup rows; returns rows written (0 without a Prometheus). Call it with whole UTC days or
    the attempt's whole run: a day's row is replaced by what this window holds of it.

    Each row's ``covered_until`` is the end of its piece when the piece starts where the day's part of the run
    does (else null: its coverage is not a prefix of the day, and the periodic pass reads the day whole again);
    it is ``sealed`` when the piece is the whole part and ``now`` (default: the current time) is at least
    ``seal_after()`` past its end. Raises what ``prometheus.read_usage`` raises."""
    sources = sources or _Sources()
    now = now or timezone.now()
    interval = running_interval(attempt, start, end)
    source, client, shape = sources.get(attempt.cluster, end)
    if source is None or interval is None:
        return 0
    rows, nodes = {}, {}
    for day, lo, hi in utc_days(*interval):
        matchers = attempt_matchers(attempt, shape, source, lo, hi, client)
        usage, nodes[day] = read_by_node(source, shape, matchers, lo, hi, client, attempt)
        part_lo, part_hi = day_part(attempt, day)
        rows[day] = dict(_row_values(attempt, shape.kind, matchers is not None, lo, hi, usage),
                         covered_until=hi if lo == part_lo else None,
                         sealed=lo == part_lo and hi == part_hi and now >= hi + seal_after())
    # Every day of the window read before any is written, then written together: a collection stopped in between
    # (a Prometheus error, the task's time limit) writes none, and collect_ended reads the attempt again.
    with transaction.atomic():
        for day, defaults in rows.items():
            UtilizationRollup.objects.update_or_create(attempt=attempt, day=day, defaults=defaults)
            write_nodes(attempt, day, nodes[day], replace=True)
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


def grid_floor(at: dt.datetime, step_seconds: float) -> dt.datetime:
    """The latest multiple of ``step_seconds`` since the Unix epoch at or before ``at`` (ms resolution): where
    Prometheus evaluates the lookback instants (``prometheus.lookback_instants``)."""
    step = round(step_seconds * 1000)
    return dt.datetime.fromtimestamp(round(at.timestamp() * 1000) // step * step / 1000, UTC)


def collection_target(now: dt.datetime) -> dt.datetime:
    """How far a periodic pass at ``now`` reads: ``now - settle_seconds()`` (scrapes still arriving), floored to
    the scrape-step grid so that the next pass's window starts on it and the windows add up exactly."""
    return grid_floor(now - dt.timedelta(seconds=settle_seconds()), settings.COSTS_SCRAPE_INTERVAL_SECONDS)


@dataclasses.dataclass
class Piece:
    """One read of a periodic pass: ``attempt``'s series in ``[start, end)`` of UTC ``day``, whose part of the run
    begins at ``lo``. ``covered`` None: the row is replaced by the read (``start == lo``), sealed if ``seal``;
    else the read is added to the row whose watermark is ``covered`` (``== start``), only if it still is."""

    attempt: JobAttempt
    day: dt.date
    lo: dt.datetime
    start: dt.datetime
    end: dt.datetime
    covered: dt.datetime | None = None
    seal: bool = False


def pass_pieces(now: dt.datetime) -> list[Piece]:
    """What a periodic pass at ``now`` reads: for each attempt and UTC day of its run since ``lookback_start(now)``
    up to ``collection_target(now)``, the part its row does not hold yet.

    A row not sealed whose part of the day ended at least ``seal_after()``
    before ``now``: what it lacks of the part (nothing, usually: an empty
    piece), added and sealed; the whole part, replacing the row, where its
    watermark is unknown. A row missing, or whose watermark is unknown or past the part's end: from the
    part's start (an attempt's first read starts at ``started_at``). Else
    from the row's watermark. Sealed rows and rows already at the target
    are left alone, so a pass repeated at the same ``now`` reads nothing.
    """
    start, target = lookback_start(now), collection_target(now)
    attempts = list(attempts_between(start, target))
    rows = {(r["attempt_id"], r["day"]): r for r in UtilizationRollup.objects.filter(
        attempt__in=[a.pk for a in attempts], day__gte=start.date()).values("attempt_id", "day", "covered_until",
                                                                             "sealed")}
    return [piece for attempt in attempts for piece in attempt_pieces(attempt, rows, start, target, now)]


def attempt_pieces(attempt: JobAttempt, rows: dict, start: dt.datetime, target: dt.datetime,
                   now: dt.datetime) -> list[Piece]:
    """The pieces of ``attempt``'s run in ``[start, target)`` that its rows lack, by the rules of ``pass_pieces``;
    ``rows``: ``{(attempt id, day): {"covered_until": ..., "sealed": ...}}`` of its rows."""
    interval = running_interval(attempt, start, target)
    if interval is None:
        return []  # no running time inside the window (e.g. ended at a last contact before it started)
    pieces = []
    for day, _, hi in utc_days(*interval):
        lo, part_end = day_part(attempt, day)
        row = rows.get((attempt.pk, day))
        covered = row and row["covered_until"]
        if row and row["sealed"]:
            continue
        if part_end <= now - seal_after():
            if covered and lo <= covered <= part_end:  # what it lacks, if anything, then sealed
                pieces.append(Piece(attempt, day, lo, covered, part_end, covered=covered, seal=True))
            else:
                pieces.append(Piece(attempt, day, lo, lo, part_end, seal=True))
        elif not covered or covered > part_end or covered < lo:
            pieces.append(Piece(attempt, day, lo, lo, hi))
        elif covered < hi:
            pieces.append(Piece(attempt, day, lo, covered, hi, covered=covered))
    return pieces


def _group_reads(pieces: list[Piece], sources: _Sources, now: dt.datetime):
    """``(cluster id, [(piece, usage, attributable, shape kind, {(node, role): usage})])`` per read: the pieces of a
    pod-labelled cluster that share a window are read in one query grouped by the pod labels and the host label
    (``read_usage_by``) and told apart in Python (``prometheus.pod_of_attempt``, the semantics of
    ``attempt_pod_matchers``; a multi-role attempt's pods by role, ``prometheus.pod_role``); a host-shaped cluster's pieces are read one by one (their hosts and GPUs are the
    attempt's), grouped by the host label. A piece's usage is the sum of its nodes'. Yields lazily, so that a
    failed read costs only its own cluster (``_Sources.run``)."""
    groups: dict[tuple, list[Piece]] = {}
    for piece in pieces:
        groups.setdefault((piece.attempt.cluster_id, piece.start, piece.end), []).append(piece)
    for (cluster_id, start, end), members in groups.items():
        def read(members=members, start=start, end=end):
            if start >= end:  # a seal of a row read to its end: nothing to read
                return [(p, prometheus.NO_USAGE, False, "", {}) for p in members]
            source, client, shape = sources.get(members[0].attempt.cluster, now)
            if source is None:
                return []
            if shape.kind not in prometheus.POD_LABELS:
                out = []
                for p in members:
                    matchers = attempt_matchers(p.attempt, shape, source, start, end, client)
                    usage, nodes = read_by_node(source, shape, matchers, start, end, client, p.attempt)
                    out.append((p, usage, matchers is not None, shape.kind, nodes))
                return out
            names = [(p.attempt.job.team.slug, p.attempt.object_name) for p in members]
            found = prometheus.read_usage_by(source, prometheus.attempts_pod_matchers(names, shape.kind), start, end,
                                             (*prometheus.POD_LABELS[shape.kind], shape.host_label), client=client)
            out = []
            for p, (team, name) in zip(members, names, strict=True):
                usage, nodes, roles = prometheus.NO_USAGE, {}, attempt_roles(p.attempt)
                for (namespace, pod, host), group in found.items():
                    if prometheus.pod_of_attempt(namespace, pod, team, name):
                        usage = usage + group
                        key = (host, prometheus.pod_role(pod, name, roles) if roles else "")
                        nodes[key] = nodes.get(key, prometheus.NO_USAGE) + group
                usage, nodes = attributed(p.attempt, usage, nodes)
                out.append((p, usage, True, shape.kind, nodes))
            return out
        yield cluster_id, read


def _add(piece: Piece, usage: prometheus.WindowUsage, attributable: bool, shape_kind: str) -> int:
    """Add ``usage`` (the sums of ``[piece.start, piece.end)``) to the row whose watermark is still
    ``piece.covered`` and move the watermark to ``piece.end`` (sealing the row if ``piece.seal``), in one
    compare-and-set UPDATE; 1 if it applied, 0 if the row moved on (a duplicate or concurrent read: nothing is
    added twice). Allocated and expected samples
    are those of ``[piece.lo, piece.end)``; the averages and the counter name are recomputed from the new sums."""
    gpu_seconds = allocated_gpus(piece.attempt) * (piece.end - piece.lo).total_seconds()
    n, p = usage.samples, usage.prof_samples
    values = dict(
        covered_until=piece.end, gpu_seconds=gpu_seconds,
        expected_samples=gpu_seconds / settings.COSTS_SCRAPE_INTERVAL_SECONDS,
        samples=F("samples") + n, util_sum=F("util_sum") + usage.util_sum, prof_samples=F("prof_samples") + p,
        memory_samples=F("memory_samples") + usage.memory_samples, memory_sum=F("memory_sum") + usage.memory_sum,
        observed_gpu_seconds=Least(F("observed_gpu_seconds") + usage.observed_seconds, Value(gpu_seconds)),
        collected_at=timezone.now(), sealed=piece.seal,
    )
    if n:
        values["avg_gpu_util_percent"] = ExpressionWrapper((F("util_sum") + usage.util_sum) / (F("samples") + n),
                                                           output_field=FloatField())
        # Summed over the row: the profiling counter only, the plain one only, or both ("mixed").
        values["util_metric"] = (Case(When(prof_samples=F("samples") + (n - p), then=Value(prometheus.GR_ENGINE_ACTIVE)),
                                      default=Value("mixed")) if p else
                                 Case(When(prof_samples=0, then=Value(prometheus.UTIL_PERCENT)), default=Value("mixed")))
    if usage.memory_samples:
        values["avg_memory_used_mib"] = ExpressionWrapper(
            (F("memory_sum") + usage.memory_sum) / (F("memory_samples") + usage.memory_samples),
            output_field=FloatField())
    if usage.observed_seconds:
        values["idle_gpu_seconds"] = Least(Coalesce(F("idle_gpu_seconds"), Value(0.0)) + usage.idle_seconds,
                                           Value(gpu_seconds))
    if usage.energy_mj is not None:
        values["energy_kwh"] = Coalesce(F("energy_kwh"), Value(0.0)) + usage.energy_kwh
    if attributable:
        values["label_shape"] = shape_kind
    return UtilizationRollup.objects.filter(attempt=piece.attempt, day=piece.day, covered_until=piece.covered,
                                            sealed=False).update(**values)


def _replace(piece: Piece, usage: prometheus.WindowUsage, attributable: bool, shape_kind: str) -> int:
    """Write the row of ``piece`` (read from the part's start) whole, over a row not sealed (a slower pass never
    undoes a seal) and not already at ``piece.end`` (the same read delivered twice). Returns 1 if written."""
    values = dict(_row_values(piece.attempt, shape_kind, attributable, piece.lo, piece.end, usage),
                  covered_until=piece.end, sealed=piece.seal, collected_at=timezone.now())
    rows = UtilizationRollup.objects.filter(attempt=piece.attempt, day=piece.day, sealed=False)
    if (rows if piece.seal else rows.exclude(covered_until=piece.end)).update(**values):
        return 1
    try:
        with transaction.atomic():
            UtilizationRollup.objects.create(attempt=piece.attempt, day=piece.day, **values)
    except IntegrityError:  # created by a concurrent pass meanwhile: the next pass reads on from its watermark
        return 0
    return 1


def periodic_pass(now: dt.datetime) -> int:
    """What the periodic collection (``costs.tasks.collect_utilization``, every ``UTILIZATION_INTERVAL_SECONDS``)
    does at ``now`` (aware; nothing else of the clock is read): read what each attempt-day row of the last
    ``COSTS_COLLECT_LOOKBACK_SECONDS`` lacks up to ``collection_target(now)`` and add it (``pass_pieces``,
    docs/adr/0026). Returns rollup rows written.

    Sums of samples, utilization, memory, observed and idle instants and
    energy add up exactly over windows cut on the scrape-step grid, so a row
    grows by its new window only (compare-and-set on its watermark: a
    repeated or concurrent pass adds nothing twice). A window reads up to
    ``settle_seconds()`` before ``now``: a scrape that arrives later than
    that is missed (``COSTS_COLLECT_SETTLE_SECONDS`` covers remote-write
    backlogs). The seal marks a row final ``seal_after()`` after its part
    ended, without reading it again. Windows shared by a pod-labelled
    cluster's attempts (every row at the last pass's target, the usual case)
    cost one grouped query per cluster, of raw samples summed in Python for
    a window up to ``prometheus.RAW_WINDOW`` (``read_usage_by``). A cluster
    whose reads fail is skipped for the rest of the pass (``_Sources.run``).
    """
    return apply_reads(read_pieces(pass_pieces(now), now))


def read_pieces(pieces: list[Piece], now: dt.datetime, sources: _Sources | None = None) -> list[list[tuple]]:
    """Read ``pieces`` (``pass_pieces``) from Prometheus, grouped (``_group_reads``): per read, a list of
    ``(piece, WindowUsage, attributable, shape kind, {(node, role): WindowUsage})``. A cluster whose read fails is logged and left out with
    its other reads (``_Sources.run``); nothing is written."""
    sources = sources or _Sources()
    return [found for cluster_id, read in _group_reads(pieces, sources, now) if (found := sources.run(cluster_id, read))]


def apply_reads(reads: list[list[tuple]]) -> int:
    """Write ``reads`` (``read_pieces``), each read's rows in one transaction: added to their row if its
    watermark is still where the read began, else replacing it, and the per-node rows with them
    (``write_nodes``). Applying the same reads twice (a duplicate or concurrent pass) writes nothing the second
    time. Returns attempt rows written."""
    written = 0
    for found in reads:
        with transaction.atomic():
            for piece, usage, attributable, shape_kind, nodes in found:
                adding = piece.covered is not None
                if (_add if adding else _replace)(piece, usage, attributable, shape_kind):
                    write_nodes(piece.attempt, piece.day, nodes, replace=not adding)
                    written += 1
    return written


def settle_seconds() -> float:
    """How long after a scrape's instant it is in Prometheus, seconds: ``COSTS_COLLECT_SETTLE_SECONDS``, at least
    two scrape intervals. Collection reads no closer to the clock than this, and never reads a window again."""
    return max(settings.COSTS_COLLECT_SETTLE_SECONDS, 2 * settings.COSTS_SCRAPE_INTERVAL_SECONDS)


def collect_ended(now: dt.datetime | None = None) -> int:
    """Collect the whole run of every attempt that ended in the lookback window (``COSTS_COLLECT_LOOKBACK_SECONDS``)
    at least ``settle_seconds()`` ago and was not collected since; returns the attempts collected.

    Runs every minute, so a job of a few minutes, a cancelled one, has its
    utilization as soon as its last scrape is in. "Collected" means its
    last row's watermark (``covered_until``) is its end. Each day's row
    gets what it lacks up to the end, by the rules of the periodic pass
    (``attempt_pieces``): a row the passes read up to their last target
    gets the minutes since, a missing row its whole part; the periodic pass
    seals the last day later (``seal_after()``).
    """
    now = now or timezone.now()
    settle = dt.timedelta(seconds=settle_seconds())
    due = (JobAttempt.objects.filter(started_at__isnull=False, ended_at__lte=now - settle,
                                     ended_at__gt=now - dt.timedelta(seconds=settings.COSTS_COLLECT_LOOKBACK_SECONDS))
           .annotate(last=Max("utilization_rollups__covered_until"))
           .select_related("job__team", "node_pool", "cluster").order_by("pk"))
    sources, count = _Sources(), 0
    for attempt in due:
        # Read up to its end already (by this or a periodic pass, both after ``settle``): nothing to do. A
        # watermark past the end (a live read before the end was known) is read again.
        if attempt.last == attempt.ended_at:
            continue
        rows = {(attempt.pk, r["day"]): r for r in attempt.utilization_rollups.values("day", "covered_until",
                                                                                        "sealed")}
        reads = read_pieces(attempt_pieces(attempt, rows, attempt.started_at, attempt.ended_at, now), now, sources)
        if attempt.cluster_id in sources.failed:
            continue  # its cluster failed: read again by the next pass (not collected since)
        with transaction.atomic():
            apply_reads(reads)
        count += 1
    return count


def refresh_running(attempts, now: dt.datetime | None = None) -> int:
    """Re-read the running ``attempts`` (JobAttempt rows) whose rollups are older than ``COSTS_LIVE_CACHE_SECONDS``:
    their whole run when they have no rollup, else today's piece. Returns the attempts read. Each query waits
    at most ``COSTS_LIVE_TIMEOUT_SECONDS``, without retry; a Prometheus error is logged and leaves the rollups as
    they were (the page still answers).

    Today's row is replaced by the read of its part up to
    ``collection_target(now)`` (the scrapes settled by then, on the
    scrape-step grid), its watermark set there: the periodic pass goes on
    from there."""
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
            collect_attempt(attempt, attempt.started_at if last is None else midnight, collection_target(now),
                            sources, now)
        except Exception as exc:  # noqa: BLE001 (Prometheus down: the stored rollups answer)
            log.warning("live utilization of %s not read: %s", attempt, exc)
            continue
        count += 1
    return count
