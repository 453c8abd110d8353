"""A serving replica lost while the others serve: replaced in its booked slot within the job's retry budget, or, the
budget spent, the attempt ends with that replica's failure as before (docs/adr/0041-autoscaled-serving.md).

The budget is Kubernetes' restart rule for a Deployment's pods, counted per attempt: at most ``max_retries``
replacements (``replica_replaced`` events of the attempt) within the last ``REPLICA_RESTART_WINDOW_SECONDS``. The
window is the kubelet's: a container's restart back-off is reset once it ran 10 minutes without a crash
(Kubernetes documentation, "Pod Lifecycle", "Container restarts"), so a replica that crashes now and then is
always replaced, and one that keeps crashing ends the attempt after ``max_retries`` replacements; the attempt's
end then follows ``jobs.lifecycle.recover_or_fail`` as any failed serving attempt's (a new attempt while the
job's attempts allow). A replacement is no admission: the replica's nodes and GPUs stay booked, so
``attempt.gpus``, the job's estimate and the ledger do not change (billing goes on at the same GPUs, once).

A replica lost with its node (``LostReplica.nodes``: its booked node is gone from the cluster, on a backend that
``pins_replicas``) cannot be started again in its slot. Reconcile then ends nothing: it records the loss (a
``replica_node_lost`` event naming the slot and the nodes, once per slot and node, under the job row's lock), and
the serving pass (``serving.replacement``, a layer above: it accrues the ledger) releases the slot from the
booking and admits a replacement as a scale-up elsewhere, counted against the same budget. The attempt ends only
when no replica is left (the runner then reports the attempt itself ``lost NodeLost``).
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction
from django.utils import timezone

from runners.base import Backend, LostReplica, Observation, PermanentDispatchError, TransientDispatchError

from .lifecycle import apply_observation
from .models import Job, JobAttempt, JobEvent, JobState

log = logging.getLogger(__name__)

#: Seconds over which a serving attempt's replica replacements are counted against ``max_retries``: 10 minutes,
#: the kubelet's reset of a container's restart back-off after it ran that long without a crash (module docstring).
REPLICA_RESTART_WINDOW_SECONDS = 600
REPLACED = "replica_replaced"
#: The event of a serving replica lost with its node: ``data`` ``{"slot", "nodes", "node_pool", "seen_at",
#: "message"}``; ``serving.replacement`` answers it (``replica_slot_released``, then ``replica_replaced``).
NODE_LOST = "replica_node_lost"


def replica_slots(placement: dict | None, replicas: int) -> list[int]:
    """The replica indexes of a serving attempt in the order of its booked nodes: ``placement["slots"]`` (written
    once a slot lost with its node was released from the middle of the booking), else ``0 .. replicas-1``
    (``replicas``: the job's count). Slot ``k`` holds ``placement["nodes"][k * job.nodes:(k + 1) * job.nodes]``."""
    slots = (placement or {}).get("slots")
    return [int(s) for s in slots] if slots is not None else list(range(replicas))


def without_slot(placement: dict | None, replicas: int, nodes_per_replica: int, slot: int) -> dict:
    """A copy of serving ``placement`` with replica index ``slot`` given back: its nodes out of ``nodes``, its index
    out of ``slots`` (written from ``replica_slots`` when absent), ``next_slot`` past every index used so far; every
    other index keeps its nodes. ``replicas``: the job's count, ``nodes_per_replica``: ``job.nodes``. Raises
    ValueError when ``slot`` is not booked."""
    out = dict(placement or {})
    slots = replica_slots(out, replicas)
    at, per = slots.index(slot), max(1, nodes_per_replica)
    if out.get("nodes"):
        out["nodes"] = [*out["nodes"][:at * per], *out["nodes"][(at + 1) * per:]]
    out["next_slot"] = max(int(out.get("next_slot") or 0), max(slots) + 1)
    out["slots"] = [s for s in slots if s != slot]
    return out


def with_slot(placement: dict | None, replicas: int, node_names: list[str]) -> tuple[dict, int]:
    """A copy of serving ``placement`` with one more replica booked on ``node_names`` at its end, and that
    replica's index: ``replicas`` (the job's count before it) while the booking has no ``slots``, else the next
    unused index (``next_slot``, past every index in ``slots``), appended to ``slots``."""
    out = dict(placement or {})
    if out.get("nodes") is not None:
        out["nodes"] = [*out["nodes"], *node_names]
    if "slots" not in out:
        return out, replicas
    slots = replica_slots(out, replicas)
    index = max(int(out.get("next_slot") or 0), max(slots, default=-1) + 1)
    out["slots"], out["next_slot"] = [*slots, index], index + 1
    return out, index


def slot_nodes(placement: dict | None, replicas: int, nodes_per_replica: int, slot: int) -> list[str]:
    """The nodes booked for replica index ``slot`` (``replica_slots``); empty when it is not booked or the pool has
    no node rows."""
    slots = replica_slots(placement, replicas)
    if slot not in slots:
        return []
    at, per = slots.index(slot), max(1, nodes_per_replica)
    return list(((placement or {}).get("nodes") or [])[at * per:(at + 1) * per])


def replacements_in_window(attempt: JobAttempt, now: dt.datetime) -> int:
    """How many ``replica_replaced`` events ``attempt`` has from the last ``REPLICA_RESTART_WINDOW_SECONDS``
    before ``now`` (aware UTC)."""
    since = now - dt.timedelta(seconds=REPLICA_RESTART_WINDOW_SECONDS)
    return JobEvent.objects.filter(attempt=attempt, kind=REPLACED, created_at__gt=since).count()


def follow_lost_replicas(job: Job, attempt: JobAttempt, obs: Observation, backend: Backend,
                         now: dt.datetime | None = None) -> list[str]:
    """Act on ``obs.lost_replicas`` of serving ``attempt`` (the current attempt of ``job``, STARTING or RUNNING):
    each lost replica is replaced (``admit_replacement`` then ``backend.replace_replica``) while the budget allows;
    the first one it does not allow ends the attempt as that replica's failure would have as the attempt's own
    (``jobs.lifecycle.apply_observation``); one lost with its node is recorded (``record_node_loss``) for the
    serving pass to release and replace. Returns what was done, one word per lost replica: ``replaced``,
    ``pending`` (recorded, the runner's call failed: the next look calls it again), ``node_lost`` (recorded, or
    recorded before), ``ended`` or ``stale`` (the job or attempt moved on meanwhile, or the slot is no longer
    booked on that node)."""
    now = now or timezone.now()
    done: list[str] = []
    for lost in obs.lost_replicas:
        if lost.nodes and backend.pins_replicas:
            done.append(record_node_loss(job, attempt, lost, now))
            continue
        verdict = admit_replacement(job, attempt, lost, now)
        if verdict == "spent":
            spent = (f"{lost.message}; {job.max_retries} replica replacement(s) in the last "
                     f"{REPLICA_RESTART_WINDOW_SECONDS} s used")
            apply_observation(job, attempt, Observation(lost.phase, lost.end_reason, lost.exit_code, spent[:4000]))
            done.append("ended")
            return done
        if verdict == "stale":
            done.append("stale")
            return done
        try:
            runner_state = backend.replace_replica(attempt, lost.key)
        except (TransientDispatchError, PermanentDispatchError) as exc:
            log.warning("replacing replica %s of %s failed: %s", lost.key, attempt.object_name, exc)
            done.append("pending")
            continue
        JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(runner_state=runner_state)
        attempt.runner_state = runner_state
        done.append("replaced")
    return done


def admit_replacement(job: Job, attempt: JobAttempt, lost: LostReplica, now: dt.datetime) -> str:
    """Decide, under the job row's lock, whether lost replica ``lost`` of ``attempt`` is replaced at ``now``:
    ``replace`` (a ``replica_replaced`` event written, or one already written for that replica: the runner's
    call is repeated), ``spent`` (``max_retries`` replacements in the window already) or ``stale`` (the job is
    not STARTING/RUNNING on this attempt any more)."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(
            pk=job.pk, current_attempt_id=attempt.pk, state__in=(JobState.STARTING, JobState.RUNNING)).first()
        if locked is None or JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=False).exists():
            return "stale"
        if JobEvent.objects.filter(attempt=attempt, kind=REPLACED, data__replica=lost.key).exists():
            return "replace"
        used = replacements_in_window(attempt, now)
        if used >= locked.max_retries:
            return "spent"
        JobEvent.objects.create(
            job=locked, attempt=attempt, kind=REPLACED, from_state=locked.state, to_state=locked.state,
            reason=(f"replica {lost.key} {lost.end_reason or lost.phase}: replaced in its booked slot, replacement "
                    f"{used + 1} of {locked.max_retries} in {REPLICA_RESTART_WINDOW_SECONDS} s ({lost.message})")[:500],
            data={"replica": lost.key, "phase": lost.phase, "end_reason": lost.end_reason,
                  "exit_code": lost.exit_code, "message": lost.message[:1000], "used": used + 1,
                  "max_retries": locked.max_retries, "window_seconds": REPLICA_RESTART_WINDOW_SECONDS})
    return "replace"


def record_node_loss(job: Job, attempt: JobAttempt, lost: LostReplica, now: dt.datetime) -> str:
    """Record, under the job row's and the attempt row's locks, that replica ``lost`` of serving ``attempt`` (key
    ``<replica index>`` or ``<replica index>/<pod>``) was lost with its nodes ``lost.nodes`` at ``now``: a
    ``NODE_LOST`` event, written once per slot and nodes. Returns ``node_lost`` (written, or written before) or
    ``stale`` (the job is not STARTING/RUNNING on this attempt, or the slot is not booked on those nodes any more:
    released already)."""
    slot_word = lost.key.partition("/")[0]
    if not slot_word.isdigit():
        return "stale"
    slot = int(slot_word)
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(
            pk=job.pk, current_attempt_id=attempt.pk, state__in=(JobState.STARTING, JobState.RUNNING)).first()
        row = (JobAttempt.objects.select_for_update().filter(pk=attempt.pk, ended_at__isnull=True)
               .values("placement", "node_pool_id").first()) if locked is not None else None
        if row is None:
            return "stale"
        booked = slot_nodes(row["placement"], locked.replicas, locked.nodes, slot)
        gone = sorted(set(lost.nodes) & set(booked))
        if not gone:
            return "stale"
        if JobEvent.objects.filter(attempt=attempt, kind=NODE_LOST, data__slot=slot, data__nodes=gone).exists():
            return "node_lost"
        JobEvent.objects.create(
            job=locked, attempt=attempt, kind=NODE_LOST, from_state=locked.state, to_state=locked.state,
            reason=(f"replica {slot} lost with node {', '.join(gone)}, gone from the cluster: its slot is released "
                    f"and a replacement admitted elsewhere while the others serve ({lost.message})")[:500],
            data={"slot": slot, "nodes": gone, "node_pool": row["node_pool_id"], "seen_at": now.isoformat(),
                  "message": lost.message[:1000]})
    return "node_lost"
