"""Workload metrics of attempts: collected from the runner (log lines, Prometheus exposition), stored per attempt
(``jobs.models.WorkloadMetrics``), and turned into the efficiency figures the API, the UI, the CLI and the
reports show: throughput (last, mean, the run's own), MFU, tokens and USD per million tokens.

The protocol and the arithmetic are pure (``jobs.efficiency``); this module reads and writes rows and asks the
backends. Collection runs from beat (``jobs.tasks.collect_workload_metrics``) over the live attempts and, once,
over each attempt that ended since, so the run's final lines are kept; node 0's log is read (rank 0 is the one
that reports, the convention of ``examples/workload_metrics.py``), and of a multi-role attempt every pod's, each
pod's last throughput kept by role (``WorkloadMetrics.pods``: each role reports for itself), and where the runner declared a metrics port
its ``/metrics`` is scraped while the attempt runs (``Backend.workload_exposition``: the local runner's
``runner_state["metrics_url"]``, the Kubernetes runner's node 0 pod through the API server's pod proxy). A scrape
that fails, answers empty or not 200 is a failed observation: the figures kept stay, the log path still counts.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from core.money import shown_usd
from costs.unknown import unpriced_hours
from runners.base import ClusterUnreachable, UnknownBackend, backend_for

from .efficiency.flops import model_flops_utilization, spec_flops_per_token, usd_per_million_tokens
from .efficiency.protocol import RunStats, last_throughput, later_throughput, parse_exposition, parse_log
from .models import Job, JobAttempt, WorkloadMetrics
from .roles import role_pods

log = logging.getLogger(__name__)

#: Lines of node 0's log read by an attempt's first collection and by the one after it ended (a log that grew
#: more meanwhile loses its oldest reports from the mean), and by the collections in between, every
#: ``WORKLOAD_METRICS_INTERVAL_SECONDS`` (a workload logging more than that per interval loses reports too).
LOG_TAIL_LINES = 5000
LOG_TAIL_LINES_RUNNING = 500
#: Ended attempts are collected once more up to this long after their end (their logs may be gone after).
ENDED_COLLECTION_WINDOW = dt.timedelta(hours=6)
#: The kinds whose workloads report training progress (a multi-role job's roles each report their own).
REPORTING_KINDS = (Job.Kind.TRAINING, Job.Kind.MULTI_ROLE)


def collect_attempt(attempt: JobAttempt, now: dt.datetime | None = None, *,
                    scrape: bool | None = None) -> WorkloadMetrics | None:
    """Read what ``attempt``'s workload reported since the last collection and store it; returns the row (None
    when the workload has reported nothing yet).

    Node 0's log tail (``LOG_TAIL_LINES``; ``LOG_TAIL_LINES_RUNNING`` between the first and the last
    collection) through the cluster's backend, then, when ``scrape`` (default: while the attempt runs), one
    scrape of the exposition on the port its runner declared (``Backend.workload_exposition``); a scrape that
    fails, or whose body is empty or not the exposition format, adds nothing. Reports already kept are not
    counted again (``_store``: collectors of the same attempt at once write one row, none loses the other's
    reports). A multi-role attempt's pods are read too (``pod_throughputs``). Raises ClusterUnreachable or
    UnknownBackend from the backend's log read.
    """
    now = now or timezone.now()
    seen = WorkloadMetrics.objects.filter(attempt=attempt).exists()
    lines = LOG_TAIL_LINES if not seen or attempt.ended_at is not None else LOG_TAIL_LINES_RUNNING
    backend = backend_for(attempt.cluster)
    logged = parse_log(backend.logs(attempt, 0, lines))
    if scrape is None:
        scrape = attempt.ended_at is None
    scraped = None
    if scrape and (body := backend.workload_exposition(attempt)):
        try:
            scraped = parse_exposition(body)
        except ValueError:
            scraped = None
    pods = pod_throughputs(attempt, backend, logged) if attempt.job.kind == Job.Kind.MULTI_ROLE else {}
    return _store(attempt, logged, scraped, now.timestamp(), pods)


def pod_throughputs(attempt: JobAttempt, backend, logged: list) -> dict[str, dict[str, dict]]:
    """The last throughput each pod of the multi-role ``attempt`` reported in its log
    (``protocol.last_throughput``): role -> pod index within the role (text) -> figures; pods that reported none
    are absent. Node 0's reports are ``logged`` (read already); every other pod's log tail
    (``LOG_TAIL_LINES_RUNNING`` lines: only its last report counts) is read through ``backend``. Raises
    ClusterUnreachable from the backend's log read."""
    found: dict[str, dict[str, dict]] = {}
    for node, (role, index) in enumerate(role_pods(attempt.job.spec)):
        reports = logged if node == 0 else parse_log(backend.logs(attempt, node, LOG_TAIL_LINES_RUNNING))
        if (last := last_throughput(reports)) is not None:
            found.setdefault(role, {})[str(index)] = last
    return found


def _merge_pods(kept: dict, found: dict, at: float) -> dict | None:
    """``kept`` (``WorkloadMetrics.pods``) with each pod of ``found`` (``pod_throughputs``) that is later
    (``protocol.later_throughput``), stamped ``at``; None when nothing moved."""
    merged, changed = {role: dict(pods) for role, pods in (kept or {}).items()}, False
    for role, pods in found.items():
        for index, figures in pods.items():
            if later_throughput(merged.get(role, {}).get(index), figures):
                merged.setdefault(role, {})[index] = {**figures, "at": round(at, 3)}
                changed = True
    return merged if changed else None


def _store(attempt: JobAttempt, logged: list, scraped, at: float, pods: dict | None = None) -> WorkloadMetrics | None:
    """Merge the reports read (``logged`` from the log, ``scraped`` from one scrape or None; received at ``at``,
    seconds since the epoch; ``pods``: a multi-role attempt's ``pod_throughputs``) into ``attempt``'s row;
    returns it, or None when nothing was reported yet.

    Class of failure: concurrent writers of one derived row (beat's collection and reconcile's collection before
    a deletion, or a task delivered twice, read the same attempt at once). Invariant: the row is written
    idempotently and never aborts its caller: the existing row is merged into under its row lock (reports kept
    by another collector meanwhile are not counted again, none is lost), and a missing row is inserted in a
    savepoint; when another collector inserted it first, this one merges into that row instead of failing. A
    row once ``complete`` stays complete (a collector that loaded the attempt before it ended comes late). Raises
    RuntimeError only when the row conflicts on insert and is gone on the next read twice in a row (its attempt
    was deleted meanwhile).
    """
    for _ in range(2):
        with transaction.atomic():
            row = WorkloadMetrics.objects.select_for_update().filter(attempt=attempt).first()
            complete = attempt.ended_at is not None or (row is not None and row.complete)
            stats = RunStats.from_dict(row.stats if row else None)
            changed = stats.add_all(logged, at)
            source = row.source if row else WorkloadMetrics.Source.LOG
            if scraped is not None and stats.add(scraped, at):
                changed, source = True, WorkloadMetrics.Source.PROMETHEUS
            merged = _merge_pods(row.pods if row else {}, pods or {}, at)
            if row is not None:
                if changed or merged is not None or complete != row.complete:
                    row.stats, row.source, row.complete = stats.to_dict(), source, complete
                    row.tokens_per_s, row.flops_per_token, row.tokens = (stats.run_tokens_per_s,
                                                                         stats.flops_per_token, stats.tokens)
                    row.pods = row.pods if merged is None else merged
                    row.save()
                return row
            if not stats.reports and not stats.final and not stats.declared and merged is None:
                if not complete:
                    return None
                fields = {"complete": True}  # nothing will come: remember that, so the attempt is not read again
            else:
                fields = {"stats": stats.to_dict(), "source": source, "tokens_per_s": stats.run_tokens_per_s,
                          "flops_per_token": stats.flops_per_token, "tokens": stats.tokens, "complete": complete,
                          "pods": merged or {}}
            try:
                with transaction.atomic():  # a savepoint: a conflict rolls back only the insert
                    return WorkloadMetrics.objects.create(attempt=attempt, **fields)
            except IntegrityError:
                continue  # another collector inserted the row first: merge into it under its lock
    raise RuntimeError(f"workload metrics of attempt {attempt.pk}: the row conflicted on insert and was gone after")


def collect_before_delete(attempt: JobAttempt) -> None:
    """Read an ended training attempt's reports once more before its objects, and with them its pods' logs and
    exposition, are deleted, so the run's final line is kept: the log and, where the runner declared a port, a
    scrape (a preempted or cancelled pod may still serve its last gauges; a finished one answers no more, which
    is a failed scrape); ``attempt`` with its ``job``, ``job.team`` and ``cluster`` loaded.
    Nothing to do for a serving attempt, one that never started or one collected complete already; a cluster
    that does not answer is logged, not raised (the deletion is the caller's to try)."""
    if attempt.job.kind not in REPORTING_KINDS or attempt.started_at is None or attempt.ended_at is None:
        return
    if WorkloadMetrics.objects.filter(attempt=attempt, complete=True).exists():
        return
    try:
        collect_attempt(attempt, scrape=True)
    except (ClusterUnreachable, UnknownBackend) as exc:
        log.info("workload metrics of %s not read before its deletion: %s", attempt.object_name, exc)


def collect_workload_metrics(now: dt.datetime | None = None) -> dict:
    """One collection over every started attempt that is live, or ended within ``ENDED_COLLECTION_WINDOW``
    without a complete collection; returns ``{"collected", "unreachable"}`` counts. A cluster that does not
    answer is skipped (its attempts are read on the next collection)."""
    now = now or timezone.now()
    attempts = (JobAttempt.objects.filter(started_at__isnull=False)
                .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=now - ENDED_COLLECTION_WINDOW,
                                                     workload_metrics__isnull=True)
                        | Q(ended_at__gte=now - ENDED_COLLECTION_WINDOW, workload_metrics__complete=False))
                .filter(job__kind__in=REPORTING_KINDS).select_related("cluster", "job", "job__team"))
    collected = unreachable = 0
    down: set[int] = set()
    for attempt in attempts:
        if attempt.cluster_id in down:
            continue
        try:
            collect_attempt(attempt, now)
            collected += 1
        except (ClusterUnreachable, UnknownBackend) as exc:
            log.info("workload metrics of %s not read: %s", attempt.object_name, exc)
            down.add(attempt.cluster_id)
            unreachable += 1
    return {"collected": collected, "unreachable": unreachable}


def _rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def attempt_efficiency(attempt: JobAttempt, metrics: WorkloadMetrics | None, *, series: bool = False) -> dict:
    """The efficiency figures of ``attempt`` (its ``cluster`` and ``node_pool.accelerator`` loaded) from its
    ``metrics`` row (None: nothing reported), JSON-ready.

    ``tokens_per_s``: the run's throughput (its own summary, else the step-weighted mean); ``last`` and ``mean``
    of step, tokens/s, samples/s, step time (s) and loss; ``flops_per_token`` and its ``flops_source``
    (``workload`` or ``spec``); ``mfu_percent`` (``jobs.efficiency.flops.model_flops_utilization`` over
    ``attempt.gpus`` at the accelerator's catalog peak) or null with ``mfu_reason``; ``tokens``; with
    ``series``, the ``[unix seconds, step, tokens/s, loss]`` points.
    """
    stats = RunStats.from_dict(metrics.stats if metrics else None)
    flops, flops_source = stats.flops_per_token, "workload"
    if flops is None:
        flops, flops_source = spec_flops_per_token(attempt.job.spec.get("model") or {}), "spec"
    if flops is None:
        flops_source = None
    tokens_per_s = metrics.tokens_per_s if metrics else None
    accelerator = attempt.node_pool.accelerator
    mfu = model_flops_utilization(tokens_per_s, flops, attempt.gpus, accelerator.peak_bf16_tflops,
                                  on_cpu=attempt.cluster.emulated, cpu_only=accelerator.is_cpu)
    keys = ("step", "tokens_per_s", "samples_per_s", "step_time_s", "loss")
    body = {
        "attempt": attempt.number,
        "source": metrics.source if metrics and stats.reports else None,
        "gpus": attempt.gpus,
        "accelerator": accelerator.name,
        "peak_bf16_tflops": float(accelerator.peak_bf16_tflops) if accelerator.peak_bf16_tflops else None,
        "tokens_per_s": _rounded(tokens_per_s, 1),
        "last": {k: stats.last.get(k) for k in keys},
        "mean": {k: _rounded(stats.mean(k), 4) for k in keys[1:]},
        "final": stats.final,
        "flops_per_token": flops,
        "flops_source": flops_source,
        "mfu_percent": _rounded(mfu.percent, 4),
        "mfu_reason": mfu.reason,
        "tokens": metrics.tokens if metrics else None,
        "reports": stats.reports,
        "updated_at": metrics.updated_at.isoformat() if metrics else None,
    }
    if series:
        body["series"] = stats.series
    return body


def job_efficiency(job: Job, *, series: bool = False) -> dict:
    """The efficiency of ``job``: each attempt's figures (:func:`attempt_efficiency`, by number), and for the job
    the latest attempt's ``tokens_per_s``, ``mfu_percent``/``mfu_reason``, the ``tokens`` of every attempt, the
    ledger's ``cost_usd`` (cents, the job's figure everywhere) and ``usd_per_million_tokens`` (6 decimals; null
    without tokens, and while
    ``unpriced_gpu_hours``/``unpriced_vcpu_hours``, the job's hours without a price, are above 0)."""
    attempts = [] if job.current_attempt_id is None else list(  # never dispatched: no query (a fresh submission)
        job.attempts.filter(started_at__isnull=False)
        .select_related("cluster", "node_pool__accelerator", "workload_metrics").order_by("number"))
    rows = []
    for attempt in attempts:
        try:
            metrics = attempt.workload_metrics
        except WorkloadMetrics.DoesNotExist:
            metrics = None
        attempt.job = job
        rows.append(attempt_efficiency(attempt, metrics, series=series))
    reported = [r for r in rows if r["tokens_per_s"] is not None or r["reports"]]
    latest = reported[-1] if reported else (rows[-1] if rows else None)
    counted = [r["tokens"] for r in rows if r["tokens"] is not None]
    tokens = sum(counted) if counted else None
    cost = Decimal(job.accrued_cost_usd)
    gpu_unpriced, vcpu_unpriced = unpriced_hours(job=job) if attempts else (0.0, 0.0)
    # A rate over a partly priced cost would read as the job's: null while any of its hours has no price.
    per_million = None if gpu_unpriced or vcpu_unpriced else usd_per_million_tokens(cost, tokens)
    return {
        "tokens_per_s": latest["tokens_per_s"] if latest else None,
        "mfu_percent": latest["mfu_percent"] if latest else None,
        "mfu_reason": latest["mfu_reason"] if latest else "the job has not started",
        "flops_per_token": latest["flops_per_token"] if latest else None,
        "tokens": tokens,
        "cost_usd": shown_usd(cost, gpu_unpriced + vcpu_unpriced),  # the job's one figure, as its page shows it
        "usd_per_million_tokens": None if per_million is None else str(per_million.quantize(Decimal("0.000001"))),
        "unpriced_gpu_hours": gpu_unpriced,
        "unpriced_vcpu_hours": vcpu_unpriced,
        "attempts": rows,
    }
