"""Reconcile: compare what each cluster runs with what the database says, and move job states.

One backend call per cluster (``observe_all``: observations and owned
attempt ids from one look) for all its live attempts, not one per job;
attempts whose state does not change cost no query of their own. Objects
on a cluster that no live attempt owns are orphans and are deleted, so
nothing keeps running or billing after its job ended.

The pass is also the cluster's health probe: one failure makes it
``degraded``, ``CLUSTER_UNREACHABLE_AFTER_FAILURES`` in a row ``unreachable``;
its jobs are left alone until ``CLUSTER_LOST_GRACE_SECONDS`` after the last
contact, then their attempts are recovered elsewhere (a control plane that
loses contact never kills healthy work before that).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import logging
import time

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from controlplane.metrics import observe_reconcile
from runners.base import ClusterUnreachable, UnknownBackend, backend_for
from runners.models import Cluster

from .lifecycle import apply_observation, finish_cancel, recover_or_fail
from .models import Job, JobAttempt, JobState
from .states import StaleState

log = logging.getLogger(__name__)


@observe_reconcile
def reconcile_cluster(cluster: Cluster) -> dict:
    """One reconcile pass over ``cluster``; returns counts (observed, orphans deleted, seconds)."""
    started = time.monotonic()
    backend = backend_for(cluster)
    with paused_gc():
        attempts = list(
            JobAttempt.objects.filter(cluster=cluster, ended_at__isnull=True, started_at__isnull=False)
            .select_related("job", "cluster", "node_pool")
        )
        try:
            observations, owned = backend.observe_all(cluster, attempts)
        except ClusterUnreachable as exc:
            log.warning("cluster %s did not answer: %s", cluster.name, exc)
            return _record_failure(cluster, attempts)
    Cluster.objects.filter(pk=cluster.pk).update(last_contact_at=timezone.now(), consecutive_failures=0,
                                                 health=Cluster.Health.HEALTHY)

    for attempt in attempts:
        job = attempt.job
        if job.current_attempt_id != attempt.pk:
            continue
        if job.state == JobState.CANCELLING:
            _finish_cancel(job.pk)
            continue
        obs = observations.get(attempt.pk)
        if obs is not None:
            apply_observation(job, attempt, obs)

    live_ids = set(JobAttempt.objects.filter(pk__in=owned, ended_at__isnull=True).values_list("pk", flat=True))
    orphans = 0
    for attempt in JobAttempt.objects.filter(pk__in=owned - live_ids).select_related("cluster"):
        log.info("deleting orphaned objects of %s on %s", attempt.object_name, cluster.name)
        try:
            backend.delete(attempt)
        except ClusterUnreachable as exc:  # the next pass retries
            log.warning("cluster %s: deleting %s failed: %s", cluster.name, attempt.object_name, exc)
            break
        orphans += 1
    return {"cluster": cluster.name, "observed": len(attempts), "orphans_deleted": orphans,
            "seconds": round(time.monotonic() - started, 4)}


@contextlib.contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while a pass builds its snapshot (restored after, also on errors).

    Per 1,000 attempts the snapshot allocates some 10^5 acyclic objects
    (four model instances per attempt, the parsed LIST bodies); with the
    collector on, those allocations trigger repeated full collections over
    the whole heap, which measured as half of a pass. Reference counting
    still frees everything; the collector runs again once the pass is done.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _record_failure(cluster: Cluster, attempts: list[JobAttempt]) -> dict:
    """Count a failed probe; mark ``unreachable`` after enough in a row; past the grace period recover its attempts."""
    Cluster.objects.filter(pk=cluster.pk).update(consecutive_failures=F("consecutive_failures") + 1)
    cluster.refresh_from_db(fields=["consecutive_failures", "last_contact_at", "health"])
    unreachable = cluster.consecutive_failures >= settings.CLUSTER_UNREACHABLE_AFTER_FAILURES
    health = Cluster.Health.UNREACHABLE if unreachable else Cluster.Health.DEGRADED
    if cluster.health != health:
        Cluster.objects.filter(pk=cluster.pk).update(health=health)
        log.warning("cluster %s is %s after %d failed probe(s)", cluster.name, health, cluster.consecutive_failures)
    result = {"cluster": cluster.name, "unreachable": True, "health": str(health),
              "consecutive_failures": cluster.consecutive_failures, "recovered": 0}
    if unreachable:
        result["recovered"] = recover_lost_cluster(cluster, attempts)
    return result


def recover_lost_cluster(cluster: Cluster, attempts: list[JobAttempt], now: dt.datetime | None = None) -> int:
    """Recover the STARTING/RUNNING attempts of an unreachable ``cluster`` once ``CLUSTER_LOST_GRACE_SECONDS`` passed.

    The grace period runs from the last successful contact (or the cluster's
    creation). Returns how many attempts were ended (RECOVERING, or FAILED
    when no retry is left). Cancels on an unreachable cluster end CANCELLED
    with deletion pending (``jobs.lifecycle.finish_cancel``); the objects of
    those and of recovered attempts are deleted as orphans when the cluster
    answers again.
    """
    now = now or timezone.now()
    since = cluster.last_contact_at or cluster.created_at
    if (now - since).total_seconds() < settings.CLUSTER_LOST_GRACE_SECONDS:
        return 0
    recovered = 0
    for attempt in attempts:
        job = attempt.job
        if job.current_attempt_id != attempt.pk or job.state not in (JobState.STARTING, JobState.RUNNING):
            continue
        try:
            recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.NODE_LOST,
                            message=f"cluster {cluster.name} unreachable since {since.isoformat()}")
            recovered += 1
        except StaleState:
            log.info("job %s changed under reconcile; leaving it to the winner", job.pk)
    return recovered


def _finish_cancel(job_id: int) -> None:
    """``finish_cancel`` that logs instead of raising when the cluster's backend is missing (retried next pass)."""
    try:
        finish_cancel(job_id)
    except (ClusterUnreachable, UnknownBackend) as exc:
        log.warning("job %s: cancel not finished: %s", job_id, exc)


def reconcile_all() -> list[dict]:
    """Reconcile every cluster, then finish cancels whose attempt never started."""
    results = []
    for cluster in Cluster.objects.all():
        try:
            results.append(reconcile_cluster(cluster))
        except UnknownBackend as exc:  # one misconfigured cluster must not stop the others' reconcile
            log.error("%s", exc)
            results.append({"cluster": cluster.name, "error": str(exc)})
    for job_id in Job.objects.filter(state=JobState.CANCELLING).values_list("pk", flat=True):
        _finish_cancel(job_id)
    return results
