"""A serving replica lost with its node, answered while the other replicas serve: its slot released from the
booking, then a replacement admitted as a scale-up off that node (docs/adr/0041-autoscaled-serving.md).

Reconcile records the loss (``jobs.replica_loss.record_node_loss``: a ``replica_node_lost`` event naming the
replica's index, its gone nodes and when the loss was seen); the serving pass answers each loss of a job's live
attempt not answered yet, in two steps, each one transaction under the job row's lock:

1. ``release_slot``: the ledger accrues the attempt up to the moment the loss was seen (``costs.ledger.
   accrue_attempt``; a ledger that accrued past it already is not rewound), then the slot leaves the booking
   (its nodes out of ``placement["nodes"]``, its index out of ``placement["slots"]``), ``attempt.gpus`` and
   ``job.replicas`` fall by one replica's, the job's estimate by what that replica would still have cost, with a
   ``replica_slot_released`` event; the runner then deletes the slot's Deployment (``Backend.scale``), the
   others untouched. From the release on the ledger bills the GPUs still held.
2. the replacement: ``serving.replicas.add_replica`` with ``replacing``: the scheduling core on the attempt's
   pool with the lost nodes taking no work, quota, per-job cap and budget as for any scale-up, within the job's
   replacement budget (``max_retries`` in ``REPLICA_RESTART_WINDOW_SECONDS``, shared with the replacements of
   replicas lost in their slot), node-exact, with a ``replica_replaced`` event naming the lost node and the new
   one; the runner then starts it pinned to its new node. A refusal (no room, quota, budget, or the replacement
   budget spent) leaves the service at fewer replicas and is kept and shown as a scale-up refusal is
   (``ServingScale.refusal``, a ``scale_refused`` event when it changes). For a job with ``spec.autoscaling``
   the autoscaler then goes on from the count left (it asks for more replicas when the load per replica says so);
   for one without, the replacement is tried again at each pass until the job has the replicas it had before the
   loss.

A replica's nodes are all one pool's (the attempt's: one accelerator and price), so the replacement avoids the
lost node, not the pool; on a spot pool it lands on another node of it, where the core finds room.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction

from costs import running
from costs.ledger import accrue_attempt
from jobs.models import Job, JobAttempt, JobEvent
from jobs.replica_loss import NODE_LOST, REPLACED, replica_slots, without_slot
from jobs.scheduling.core import Verdict, estimate_cost

from .replicas import _locked_serving, add_replica, remaining_seconds

log = logging.getLogger(__name__)

RELEASED = "replica_slot_released"


def pending_losses(attempt: JobAttempt) -> list[JobEvent]:
    """The ``replica_node_lost`` events of ``attempt`` not released yet (no ``replica_slot_released`` event names
    them), oldest first."""
    answered = set(JobEvent.objects.filter(attempt=attempt, kind=RELEASED).values_list("data__loss_event", flat=True))
    return [e for e in JobEvent.objects.filter(attempt=attempt, kind=NODE_LOST).order_by("id") if e.pk not in answered]


def unreplaced_releases(attempt: JobAttempt) -> list[JobEvent]:
    """The ``replica_slot_released`` events of ``attempt`` that released a slot and whose loss no
    ``replica_replaced`` event answers yet, oldest first."""
    replaced = set(JobEvent.objects.filter(attempt=attempt, kind=REPLACED, data__has_key="loss_event")
                   .values_list("data__loss_event", flat=True))
    return [e for e in JobEvent.objects.filter(attempt=attempt, kind=RELEASED).order_by("id")
            if e.data.get("released") and e.data.get("loss_event") not in replaced]


def release_slot(job_id: int, loss: JobEvent, now: dt.datetime) -> JobEvent | None:
    """Release the slot of the replica that ``loss`` (a ``replica_node_lost`` event of the job's current attempt)
    names, at ``now`` (step 1 of the module docstring). Returns the ``replica_slot_released`` event when the
    booking changed, else None. A loss whose slot is not booked on those nodes any more (a scale-down released it
    first) is answered with a ``replica_slot_released`` event with ``released`` false; the job's last replica is
    never released (the runner reports the attempt itself lost then)."""
    slot, nodes = int(loss.data["slot"]), list(loss.data["nodes"])
    seen = dt.datetime.fromisoformat(loss.data["seen_at"])
    with transaction.atomic():
        locked = _locked_serving(job_id)
        if locked is None or locked[1].pk != loss.attempt_id:
            return None
        job, attempt = locked
        if JobEvent.objects.filter(attempt=attempt, kind=RELEASED, data__loss_event=loss.pk).exists():
            return None
        placement = dict(attempt.placement or {})
        slots = replica_slots(placement, job.replicas)
        per = max(1, job.nodes)
        at = slots.index(slot) if slot in slots else -1
        booked = list((placement.get("nodes") or [])[at * per:(at + 1) * per]) if at >= 0 else []
        if at < 0 or not set(nodes) & set(booked):
            JobEvent.objects.create(
                job=job, attempt=attempt, kind=RELEASED, from_state=job.state, to_state=job.state,
                reason=f"replica {slot} is no longer booked on {', '.join(nodes)}: nothing to release",
                data={"loss_event": loss.pk, "slot": slot, "nodes": nodes, "released": False})
            return None
        if len(slots) <= 1:
            return None
        accrue_attempt(attempt.pk, min(seen, now))  # billed at the replicas it held until the loss was seen
        attempt.refresh_from_db(fields=["gpus"])
        job.refresh_from_db(fields=["accrued_cost_usd", "estimated_cost_usd"])
        gpus = per * job.gpus_per_node
        placement = without_slot(placement, job.replicas, job.nodes, slot)
        updated = JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True, gpus=attempt.gpus).update(
            gpus=max(0, attempt.gpus - gpus), placement=placement)
        if updated != 1:
            raise RuntimeError(f"attempt {attempt.pk} changed under its job row's lock")
        running.reattribute(attempt.pk, attempt.gpus, attempt.placement)  # its node series follow the placement
        saved = estimate_cost(gpus, remaining_seconds(job, attempt, now), attempt.usd_per_gpu_hour)
        replicas = job.replicas - 1
        Job.objects.filter(pk=job.pk).update(
            replicas=replicas, estimated_cost_usd=max(job.accrued_cost_usd, job.estimated_cost_usd - saved))
        return JobEvent.objects.create(
            job=job, attempt=attempt, kind=RELEASED, from_state=job.state, to_state=job.state,
            reason=(f"replica {slot} released with node {', '.join(nodes)}: {replicas} replica(s) serve on "
                    f"(estimate -${saved})")[:500],
            data={"loss_event": loss.pk, "slot": slot, "nodes": nodes, "released": True, "released_gpus": gpus,
                  "replicas": replicas, "replicas_before": job.replicas, "estimate_usd": str(-saved)})


def replace_lost(job: Job, now: dt.datetime, *, retry: bool) -> tuple[int, Verdict | None]:
    """Answer the losses with their node of serving ``job``'s current attempt at ``now`` (module docstring):
    release each pending slot, then admit a replacement for each slot released now and, with ``retry`` (a job
    without autoscaling), for each released at an earlier pass and not replaced yet while the job has fewer
    replicas than before that loss. Returns ``(slots released now, the first refusal or None)``; the caller makes
    the runner follow the booking."""
    attempt = job.current_attempt
    if not JobEvent.objects.filter(attempt=attempt, kind=NODE_LOST).exists():
        return 0, None  # the common case: one query per job and pass
    now_released = [e for e in (release_slot(job.pk, loss, now) for loss in pending_losses(attempt)) if e]
    todo = unreplaced_releases(attempt) if retry else now_released
    refusal = None
    for event in todo:
        verdict = add_replica(job.pk, now, {"desired": int(event.data["replicas_before"]), "replacement": True},
                              replacing={"loss_event": event.data["loss_event"], "slot": event.data["slot"],
                                         "nodes": event.data["nodes"]})
        if verdict is not None:
            refusal = refusal or verdict
            log.info("job %s: replica %s lost with node %s not replaced: %s: %s", job.pk, event.data["slot"],
                     ", ".join(event.data["nodes"]), verdict.reason, verdict.message)
    return len(now_released), refusal
