"""Celery tasks of the job lifecycle: short bodies over the services. Each takes ids only, is idempotent, and is
enqueued on commit (``jobs.enqueue``) or by beat (``CELERY_BEAT_SCHEDULE``, which names them).

Tasks that call a cluster share one policy, ``CLUSTER_CALL``: ``acks_late``
with ``reject_on_worker_lost`` (a worker that dies mid-call leaves the
message for another worker, and the backends' idempotent calls make the
second run harmless), and retries with exponential backoff on transient
backend errors and on its own soft time limit (a cluster that answered too
slowly this time).

Queues and time limits (docs/adr/0014): every task here but
``collect_workload_metrics`` is on the job lifecycle's critical path and goes to
the fast queue (``CELERY_TASK_ROUTES``). Each has a soft time limit, raised in
the task as ``SoftTimeLimitExceeded`` (state is written in transactions, which
roll back), and a hard one a little later, at which the pool process is killed.
The next beat run, a retry or reconcile's sweep redoes what a stopped task left.
"""

from __future__ import annotations

import collections
import uuid

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from runners.base import TransientDispatchError
from runners.models import Cluster

from . import enqueue, lifecycle, reconcile, workload
from .scheduling.passes import schedule_coalesced

#: The retry and delivery policy of every task that talks to a cluster.
CLUSTER_CALL = dict(
    acks_late=True, reject_on_worker_lost=True,
    autoretry_for=(TransientDispatchError, SoftTimeLimitExceeded), retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=8,
)


# A full pass over 100,000 queued jobs takes 1-5 s (benchmarks/schedule.py); beat asks for one every 10 s.
@shared_task(name="jobs.tasks.schedule_pending", ignore_result=True, soft_time_limit=60, time_limit=75)
def schedule_pending() -> dict:
    """A scheduling pass (periodic, and after each submission or end of an attempt), coalesced.

    Many submissions each enqueue a pass; one pass serves them all, so a
    task that finds another pass running returns at once (see
    ``jobs.scheduling.passes.schedule_coalesced``).
    """
    result = schedule_coalesced()
    if result is None:
        return {"coalesced": True}
    return {"admitted": len(result.admitted), "waiting": result.waiting, "rejected": result.rejected,
            "materialized": result.materialized}


# About 91 s at worst with the default client timeouts (settings: CELERY_BROKER_TRANSPORT_OPTIONS); the hard limit
# stays under the broker's visibility timeout (300 s), or a running dispatch would be delivered twice.
@shared_task(name="jobs.tasks.dispatch_attempt", ignore_result=True, soft_time_limit=120, time_limit=150,
             **CLUSTER_CALL)
def dispatch_attempt(attempt_id: int) -> str:
    """Create attempt ``attempt_id``'s objects on its cluster and move its job ADMITTED -> STARTING
    (``jobs.lifecycle.dispatch``); transient backend errors retry."""
    return lifecycle.dispatch(attempt_id)


# Up to ``jobs.enqueue.DISPATCH_BATCH`` (25) attempts of one cluster: each create takes milliseconds on a cluster that
# answers; one that does not costs its client timeout once (K8S_CONNECT_TIMEOUT_SECONDS + K8S_READ_TIMEOUT_SECONDS,
# 13 s), since its other attempts wait for the retry. Hard limit under the broker's visibility timeout, as above.
@shared_task(name="jobs.tasks.dispatch_attempts", ignore_result=True, soft_time_limit=120, time_limit=150,
             **CLUSTER_CALL)
def dispatch_attempts(attempt_ids: list[int]) -> dict:
    """Dispatch the attempts ``attempt_ids`` (``jobs.lifecycle.dispatch_many``: one read of their rows, one
    transaction per cluster recording the started); returns how many had each outcome. Any attempt left waiting
    by a transient failure retries the batch, whose attempts already STARTING are skipped."""
    outcomes = lifecycle.dispatch_many([int(attempt_id) for attempt_id in attempt_ids])
    return dict(collections.Counter(outcomes.values()))


# A few DELETEs, each at most K8S_CONNECT_TIMEOUT_SECONDS + K8S_READ_TIMEOUT_SECONDS (13 s).
@shared_task(name="jobs.tasks.cancel_job_objects", ignore_result=True, soft_time_limit=60, time_limit=75)
def cancel_job_objects(job_id: int) -> bool:
    """Delete a CANCELLING job's objects; until the cluster confirms, periodic reconcile retries."""
    return lifecycle.finish_cancel(job_id)


# One GET and at most three PUTs of a ConfigMap, each at most K8S_CONNECT_TIMEOUT_SECONDS + K8S_READ_TIMEOUT_SECONDS.
@shared_task(name="jobs.tasks.record_attempt_end", ignore_result=True, soft_time_limit=60, time_limit=75,
             **CLUSTER_CALL)
def record_attempt_end(attempt_id: int) -> bool:
    """Move an ended attempt's end record on its cluster forward to the attempt's end
    (``jobs.lifecycle.record_end``); transient backend errors retry."""
    return lifecycle.record_end(attempt_id)


# Every 5 s: a fan-out of one reconcile_cluster task per cluster over the fast queue's workers, so adding workers
# adds reconcile capacity, and a slow or unreachable cluster holds one worker, never another cluster's pass.
@shared_task(name="jobs.tasks.reconcile_all", ignore_result=True, soft_time_limit=60, time_limit=90)
def reconcile_all() -> dict:
    """Periodic: publish ``reconcile_cluster`` for every cluster, then finish the cancels of jobs that have no
    objects to delete (``jobs.reconcile.finish_unstarted_cancels``). Returns how many of each."""
    cluster_ids = list(Cluster.objects.values_list("pk", flat=True))
    for cluster_id in cluster_ids:
        reconcile_cluster.delay(cluster_id)
    return {"clusters": len(cluster_ids), "cancelling": reconcile.finish_unstarted_cancels()}


# One cluster's LIST(s) (each at most K8S_CONNECT_TIMEOUT_SECONDS + K8S_READ_TIMEOUT_SECONDS) and its changes:
# 1,000 attempts take about 0.4 s (benchmarks/dispatch.py). The hard limit is the lease's length.
@shared_task(name="jobs.tasks.reconcile_cluster", bind=True, ignore_result=True, soft_time_limit=60,
             time_limit=reconcile.RECONCILE_LEASE_SECONDS)
def reconcile_cluster(self, cluster_id: int) -> dict:
    """Reconcile cluster ``cluster_id`` under its lease (``jobs.reconcile.reconcile_leased``: never twice at once),
    then ask for a scheduling pass when the pass may have freed capacity (an attempt ended, an orphan deleted, the
    cluster's health changed: any result but a quiet, healthy answer)."""
    result = reconcile.reconcile_leased(cluster_id, holder=self.request.id or f"direct-{uuid.uuid4()}")
    quiet = "skipped" in result or (not result.get("ended") and not result.get("orphans_deleted")
                                    and "unreachable" not in result and "error" not in result)
    if not quiet:
        schedule_pending.delay()
    return result


@shared_task(name="jobs.tasks.delete_attempt_objects", ignore_result=True, soft_time_limit=60, time_limit=75,
             **CLUSTER_CALL)
def delete_attempt_objects(attempt_id: int) -> bool:
    """Delete the objects of an ended (preempted) attempt (``jobs.lifecycle.delete_ended_attempt``); transient
    backend errors retry."""
    return lifecycle.delete_ended_attempt(attempt_id)


# Slow queue: one call through the API server per training attempt (13 s at most each); every 15 s.
@shared_task(name="jobs.tasks.collect_workload_metrics", ignore_result=True, soft_time_limit=120, time_limit=150)
def collect_workload_metrics() -> dict:
    """Periodic: read what the training attempts' workloads reported (``jobs.workload.collect_workload_metrics``)."""
    return workload.collect_workload_metrics()


# Up to 500 publishes of milliseconds each; every 15 s.
@shared_task(name="jobs.tasks.send_outbox", ignore_result=True, soft_time_limit=30, time_limit=45)
def send_outbox() -> int:
    """Publish the tasks kept while the broker was unreachable (``jobs.enqueue.send_outbox``); periodic."""
    return enqueue.send_outbox()
