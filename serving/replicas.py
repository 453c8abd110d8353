"""A running serving attempt's replicas changed in the database: a scale-up admitted node-exactly under the team's
quota and budget, a scale-down that releases the replicas' booking; the ledger accrued up to the change first.

A scale-up is an admission of one more replica (``job.nodes`` pods of ``job.gpus_per_node`` GPUs each) on the
attempt's own node pool, decided by the scheduling core (``jobs.scheduling.core``) on a snapshot read under the
admission's locks (job row, team row, the accelerator's node pools, the team's totals rows: the lock order of
``jobs.scheduling.apply``): the team's quota with the job's running replicas counted, its cohort's lending, the
nodes' free room (the pods the attempt's ``placement`` records are already booked) and every budget in force,
with the added replica's estimate (its GPUs x the seconds left of the job's max runtime, or the unbounded
estimate, x the pool's price). Admitted, the attempt books the chosen nodes and GPUs, the job's estimate grows by
the replica's and ``replicas`` by one, in one transaction with a ``scale`` event. A scale-up never preempts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db import transaction

from costs import running
from costs.ledger import accrue_attempt
from jobs.models import UNBOUNDED_ESTIMATE_SECONDS, Job, JobAttempt, JobEvent, JobState
from jobs.replica_loss import (
    REPLACED,
    REPLICA_RESTART_WINDOW_SECONDS,
    replacements_in_window,
    replica_slots,
    with_slot,
)
from jobs.scheduling.core import (
    Admission,
    FairShareScheduler,
    NodeRoom,
    PoolOffer,
    QueuedJob,
    Rejection,
    Verdict,
    estimate_cost,
)
from jobs.scheduling.offers import lock_pools, pool_offers
from jobs.scheduling.snapshot import job_snapshot, queued_job
from quotas.models import Team


def remaining_seconds(job: Job, attempt: JobAttempt, now: dt.datetime) -> int:
    """Seconds a replica added at ``now`` may still run and be billed: the job's max runtime less what its attempt
    has run (at least 1; the ledger stops billing the attempt there), or ``UNBOUNDED_ESTIMATE_SECONDS`` for a
    serving job without one."""
    if not job.max_runtime_seconds:
        return UNBOUNDED_ESTIMATE_SECONDS
    ran = (now - (attempt.started_at or now)).total_seconds()
    return max(1, int(job.max_runtime_seconds - ran))


def replica_request(job: Job, attempt: JobAttempt, now: dt.datetime) -> QueuedJob:
    """One more replica of ``job`` as the core sees a waiting job: ``job.nodes`` pods (they may share a node) of
    the attempt's accelerator, run for ``remaining_seconds``."""
    return dataclasses.replace(queued_job(job, now), nodes=job.nodes, accelerator_id=attempt.node_pool.accelerator_id,
                               alternatives=(), avoid_clusters=(), recovering=False,
                               max_runtime_seconds=remaining_seconds(job, attempt, now))


def _locked_serving(job_id: int) -> tuple[Job, JobAttempt] | None:
    """The RUNNING serving job ``job_id`` locked, and its live current attempt; None when it is not that now."""
    job = Job.objects.select_for_update().filter(pk=job_id, state=JobState.RUNNING, kind=Job.Kind.INFERENCE).first()
    if job is None or job.current_attempt_id is None:
        return None
    attempt = (JobAttempt.objects.select_related("node_pool", "cluster")
               .filter(pk=job.current_attempt_id, ended_at__isnull=True).first())
    return None if attempt is None else (job, attempt)


def add_replica(job_id: int, now: dt.datetime, decision: dict, *, replacing: dict | None = None) -> Verdict | None:
    """Admit one more replica of serving job ``job_id`` at ``now`` (module docstring) unless it already has
    ``decision["desired"]`` (another pass got there first); None when admitted or not needed, else the verdict that
    refused it (``reason`` quota, budget or capacity, its message and numbers). ``decision``: the autoscaler's
    numbers, kept on the ``scale`` event.

    ``replacing``: the replacement of a replica lost with its node (``serving.replacement``): ``{"loss_event": id
    of its ``replica_node_lost`` event, "slot", "nodes": the lost nodes}``. Then the admission avoids those nodes
    (they take no work in the offer the core sees: the pool is the attempt's, its price and accelerator), is
    counted against the job's replacement budget (``max_retries`` ``replica_replaced`` events in
    ``REPLICA_RESTART_WINDOW_SECONDS``; spent: the verdict ``retries``), is not repeated for a loss replaced
    already, and writes a ``replica_replaced`` event naming the lost nodes and the new ones instead of ``scale``."""
    with transaction.atomic():
        locked = _locked_serving(job_id)
        if locked is None:
            return Verdict(False, "state", "the job is not running")
        job, attempt = locked
        if job.replicas >= decision["desired"]:
            return None
        used = 0
        if replacing is not None:
            if JobEvent.objects.filter(attempt=attempt, kind=REPLACED,
                                       data__loss_event=replacing["loss_event"]).exists():
                return None
            used = replacements_in_window(attempt, now)
            if used >= job.max_retries:
                return Verdict(False, "retries", f"replica {replacing['slot']} lost with node "
                               f"{', '.join(replacing['nodes'])} is not replaced: {job.max_retries} replica "
                               f"replacement(s) in the last {REPLICA_RESTART_WINDOW_SECONDS} s used",
                               {"max_retries": job.max_retries, "window_seconds": REPLICA_RESTART_WINDOW_SECONDS})
        team = Team.objects.select_for_update(no_key=True).get(pk=job.team_id)
        request = replica_request(job, attempt, now)
        lock_pools(request.accelerator_id)
        offers = pool_offers(request.accelerator_id, now, lock=True)
        if replacing is not None:
            offers = avoiding(offers, attempt.node_pool_id, set(replacing["nodes"]))
        snapshot = job_snapshot(team, request, now, offers, lock_spend=True)
        quota = snapshot.teams[team.pk].quotas.get(request.accelerator_id)
        held = attempt.gpus  # what the replicas hold now (job.total_gpus counts one replica at zero)
        if quota is not None and quota.max_gpus_per_job and held + request.total_gpus > quota.max_gpus_per_job:
            return Verdict(False, "quota", f"{held + request.total_gpus} GPUs would be more than the "
                           f"{quota.max_gpus_per_job} GPUs a job of team {team.slug} may hold",
                           {"max_gpus_per_job": quota.max_gpus_per_job})
        outcome = FairShareScheduler(snapshot).evaluate(request, only_pool=attempt.node_pool_id)
        if not isinstance(outcome, Admission):
            return outcome.verdict if isinstance(outcome, Rejection) else outcome.verdict()
        accrue_attempt(attempt.pk, now)  # what ran so far is billed at the replicas it ran with
        placement, index = with_slot(attempt.placement, job.replicas, list(outcome.node_names))
        updated = JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True, gpus=attempt.gpus).update(
            gpus=attempt.gpus + request.total_gpus, placement=placement)
        if updated != 1:
            raise RuntimeError(f"attempt {attempt.pk} changed under its job row's lock")
        running.reattribute(attempt.pk, attempt.gpus, attempt.placement)  # its node series follow the placement
        replicas = job.replicas + 1
        Job.objects.filter(pk=job.pk).update(replicas=replicas,
                                             estimated_cost_usd=job.estimated_cost_usd + outcome.estimate_usd)
        where = ", ".join(outcome.node_names) or "the pool"
        if replacing is None:
            JobEvent.objects.create(
                job=job, attempt=attempt, kind="scale", from_state=job.state, to_state=job.state,
                reason=f"scaled up to {replicas} replicas: one more admitted on {where}"
                       f" (estimate +${outcome.estimate_usd})"[:500],
                data={**decision, "replicas": replicas, "nodes": list(outcome.node_names),
                      "estimate_usd": str(outcome.estimate_usd)})
        else:
            lost = ", ".join(replacing["nodes"])
            JobEvent.objects.create(
                job=job, attempt=attempt, kind=REPLACED, from_state=job.state, to_state=job.state,
                reason=(f"replica {replacing['slot']} lost with node {lost}: replaced by replica {index} on {where}, "
                        f"replacement {used + 1} of {job.max_retries} in {REPLICA_RESTART_WINDOW_SECONDS} s "
                        f"(estimate +${outcome.estimate_usd})")[:500],
                data={**decision, "replica": f"{replacing['slot']}@{lost}", "loss_event": replacing["loss_event"],
                      "lost_slot": replacing["slot"], "lost_nodes": list(replacing["nodes"]), "slot": index,
                      "nodes": list(outcome.node_names), "replicas": replicas, "end_reason": "NodeLost",
                      "used": used + 1, "max_retries": job.max_retries,
                      "window_seconds": REPLICA_RESTART_WINDOW_SECONDS, "estimate_usd": str(outcome.estimate_usd)})
    return None


def avoiding(offers: list[PoolOffer], pool_id: int, nodes: set[str]) -> list[PoolOffer]:
    """``offers`` with ``nodes`` of pool ``pool_id`` taking no work (``NodeRoom.schedulable`` False) and their free
    GPUs taken off the pool's: a replacement is never placed on the node its replica was just lost with, even while
    the node's row outlives it until the next inventory sync."""
    out = []
    for offer in offers:
        if offer.node_pool_id == pool_id and any(r.name in nodes for r in offer.node_rooms):
            rooms: tuple[NodeRoom, ...] = tuple(dataclasses.replace(r, schedulable=False) if r.name in nodes else r
                                                for r in offer.node_rooms)
            offer = dataclasses.replace(offer, node_rooms=rooms,
                                        free_gpus=sum(r.free_gpus for r in rooms if r.takes_work))
        out.append(offer)
    return out


def fewest_replicas(job: Job) -> int:
    """The fewest replicas ``job`` may run: 0 when its ``spec.autoscaling`` has ``scale_to_zero``, else 1."""
    return 0 if ((job.spec or {}).get("autoscaling") or {}).get("scale_to_zero") else 1


def release_replicas(job_id: int, now: dt.datetime, decision: dict) -> int:
    """Release replicas of serving job ``job_id`` at ``now`` down to ``decision["desired"]`` (at least
    ``fewest_replicas``: one, or none for a job that scales to zero, whose GPUs and billing then stop): the
    ledger accrues up to now, the attempt's GPUs and its last pods' nodes are given back, the job's estimate
    shrinks by what those replicas would still have cost at the attempt's price (never below what it accrued); a
    ``scale`` event says so. Returns the replicas left (0 when the job is not running any more)."""
    with transaction.atomic():
        locked = _locked_serving(job_id)
        if locked is None:
            return 0
        job, attempt = locked
        count = job.replicas - max(fewest_replicas(job), decision["desired"])
        if count <= 0:
            return job.replicas
        accrue_attempt(attempt.pk, now)
        job.refresh_from_db(fields=["accrued_cost_usd", "estimated_cost_usd"])
        pods = count * job.nodes
        gpus = pods * job.gpus_per_node
        placement = dict(attempt.placement or {})
        if placement.get("nodes"):
            placement["nodes"] = placement["nodes"][:-pods]
        if "slots" in placement:
            placement["slots"] = replica_slots(placement, job.replicas)[:-count]
        JobAttempt.objects.filter(pk=attempt.pk).update(gpus=max(0, attempt.gpus - gpus), placement=placement)
        running.reattribute(attempt.pk, attempt.gpus, attempt.placement)
        saved = estimate_cost(gpus, remaining_seconds(job, attempt, now), attempt.usd_per_gpu_hour)
        replicas = job.replicas - count
        Job.objects.filter(pk=job.pk).update(
            replicas=replicas, estimated_cost_usd=max(job.accrued_cost_usd, job.estimated_cost_usd - saved))
        JobEvent.objects.create(
            job=job, attempt=attempt, kind="scale", from_state=job.state, to_state=job.state,
            reason=f"scaled down to {replicas} replicas: {count} released (estimate -${saved})",
            data={**decision, "replicas": replicas, "released_gpus": gpus, "estimate_usd": str(-saved)})
    return replicas
