"""Reconcile: compare what each cluster runs with what the database says, and move job states.

One backend call per cluster (``observe``) for all its live attempts, not
one per job. Objects on a cluster that no live attempt owns are orphans and
are deleted, so nothing keeps running or billing after its job ended.
"""

from __future__ import annotations

import logging
import time

from django.db.models import F
from django.utils import timezone

from runners.base import ClusterUnreachable, UnknownBackend, backend_for
from runners.models import Cluster

from .lifecycle import apply_observation, finish_cancel
from .models import JobAttempt, JobState

log = logging.getLogger(__name__)


def reconcile_cluster(cluster: Cluster) -> dict:
    """One reconcile pass over ``cluster``; returns counts (observed, orphans deleted, seconds)."""
    started = time.monotonic()
    backend = backend_for(cluster)
    attempts = list(
        JobAttempt.objects.filter(cluster=cluster, ended_at__isnull=True, started_at__isnull=False)
        .select_related("job", "cluster", "node_pool")
    )
    try:
        observations = backend.observe(cluster, attempts)
        owned = backend.owned_attempt_ids(cluster)
    except ClusterUnreachable as exc:
        Cluster.objects.filter(pk=cluster.pk).update(consecutive_failures=F("consecutive_failures") + 1)
        log.warning("cluster %s unreachable: %s", cluster.name, exc)
        return {"cluster": cluster.name, "unreachable": True}
    Cluster.objects.filter(pk=cluster.pk).update(last_contact_at=timezone.now(), consecutive_failures=0)

    for attempt in attempts:
        job = attempt.job
        if job.current_attempt_id != attempt.pk:
            continue
        if job.state == JobState.CANCELLING:
            finish_cancel(job.pk)
            continue
        obs = observations.get(attempt.pk)
        if obs is not None:
            apply_observation(job, attempt, obs)

    live_ids = set(JobAttempt.objects.filter(pk__in=owned, ended_at__isnull=True).values_list("pk", flat=True))
    orphans = 0
    for attempt in JobAttempt.objects.filter(pk__in=owned - live_ids).select_related("cluster"):
        log.info("deleting orphaned objects of %s on %s", attempt.object_name, cluster.name)
        backend.delete(attempt)
        orphans += 1
    return {"cluster": cluster.name, "observed": len(attempts), "orphans_deleted": orphans,
            "seconds": round(time.monotonic() - started, 4)}


def reconcile_all() -> list[dict]:
    """Reconcile every cluster, then finish cancels whose attempt never started."""
    results = []
    for cluster in Cluster.objects.all():
        try:
            results.append(reconcile_cluster(cluster))
        except UnknownBackend as exc:  # one misconfigured cluster must not stop the others' reconcile
            log.error("%s", exc)
            results.append({"cluster": cluster.name, "error": str(exc)})
    from .models import Job

    for job_id in Job.objects.filter(state=JobState.CANCELLING).values_list("pk", flat=True):
        finish_cancel(job_id)
    return results
