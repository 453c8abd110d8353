"""Celery tasks of the job lifecycle: short bodies over the services. Each takes ids only, is idempotent, and is
enqueued on commit (``jobs.enqueue``) or by beat (``CELERY_BEAT_SCHEDULE``, which names them).

Tasks that call a cluster share one policy, ``CLUSTER_CALL``: ``acks_late``
with ``reject_on_worker_lost`` (a worker that dies mid-call leaves the
message for another worker, and the backends' idempotent calls make the
second run harmless), and retries with exponential backoff on transient
backend errors only.
"""

from __future__ import annotations

from celery import shared_task

from runners.base import TransientDispatchError

from . import enqueue, lifecycle, reconcile, workload
from .scheduling.passes import schedule_coalesced

#: The retry and delivery policy of every task that talks to a cluster.
CLUSTER_CALL = dict(
    acks_late=True, reject_on_worker_lost=True,
    autoretry_for=(TransientDispatchError,), retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=8,
)


@shared_task(name="jobs.tasks.schedule_pending", ignore_result=True)
def schedule_pending() -> dict:
    """A scheduling pass (periodic, and after each submission or end of an attempt), coalesced.

    Many submissions each enqueue a pass; one pass serves them all, so a
    task that finds another pass running returns at once (see
    ``jobs.scheduling.passes.schedule_coalesced``).
    """
    result = schedule_coalesced()
    if result is None:
        return {"coalesced": True}
    return {"admitted": len(result.admitted), "waiting": result.waiting, "rejected": result.rejected}


@shared_task(name="jobs.tasks.dispatch_attempt", ignore_result=True, **CLUSTER_CALL)
def dispatch_attempt(attempt_id: int) -> str:
    """Create attempt ``attempt_id``'s objects on its cluster and move its job ADMITTED -> STARTING
    (``jobs.lifecycle.dispatch``); transient backend errors retry."""
    return lifecycle.dispatch(attempt_id)


@shared_task(name="jobs.tasks.cancel_job_objects", ignore_result=True)
def cancel_job_objects(job_id: int) -> bool:
    """Delete a CANCELLING job's objects; until the cluster confirms, periodic reconcile retries."""
    return lifecycle.finish_cancel(job_id)


@shared_task(name="jobs.tasks.reconcile_all", ignore_result=True)
def reconcile_all() -> list:
    """Periodic reconcile of every cluster, then a scheduling pass for the capacity it freed."""
    results = reconcile.reconcile_all()
    schedule_pending.delay()
    return results


@shared_task(name="jobs.tasks.delete_attempt_objects", ignore_result=True, **CLUSTER_CALL)
def delete_attempt_objects(attempt_id: int) -> bool:
    """Delete the objects of an ended (preempted) attempt (``jobs.lifecycle.delete_ended_attempt``); transient
    backend errors retry."""
    return lifecycle.delete_ended_attempt(attempt_id)


@shared_task(name="jobs.tasks.collect_workload_metrics", ignore_result=True)
def collect_workload_metrics() -> dict:
    """Periodic: read what the training attempts' workloads reported (``jobs.workload.collect_workload_metrics``)."""
    return workload.collect_workload_metrics()


@shared_task(name="jobs.tasks.send_outbox", ignore_result=True)
def send_outbox() -> int:
    """Publish the tasks kept while the broker was unreachable (``jobs.enqueue.send_outbox``); periodic."""
    return enqueue.send_outbox()
