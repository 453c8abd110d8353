"""Committing the core's decisions: each admission in its own transaction that re-checks it under row locks.

The core proposes on an unlocked snapshot; the transaction verifies:

1. lock the job row (SKIP LOCKED: another scheduler owns it), then the team
   row, then the victims' job rows if it preempts (SKIP LOCKED: a victim
   another worker holds cancels this admission for now), then every node
   pool of the accelerator in id order (serialises capacity and the cohort's
   borrowing of that accelerator; one global order, so no deadlock);
2. preempt the victims (``jobs.lifecycle.preempt_attempt``), then read a
   one-job snapshot from the locked rows (``snapshot.job_snapshot``) and ask
   the core again (``core.recheck``): quota, per-cluster caps, cohort
   lending, the victims' nominal, the pool's room and the budgets (read
   after locking the team's spend totals row, the last lock taken), by the
   very rules and messages of the pass;
3. create the attempt and move the job to ADMITTED by compare-and-set, and
   enqueue its dispatch on commit; any failed check rolls everything back
   and the job waits with the re-check's reason.

Waiting jobs get their reason, numbers and queue positions in ``queue_info``
(one bulk UPDATE); a ``waiting`` event is written when the reason changes.
On SQLite the IMMEDIATE transaction mode serialises whole transactions,
which gives the same guarantee.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from decimal import Decimal

from django.db import connection, transaction

from quotas.models import Team

from ..enqueue import enqueue_dispatch
from ..lifecycle import preempt_attempt
from ..models import Job, JobAttempt, JobEvent, JobState, attempt_object_name
from ..states import StaleState, transition
from .core import Admission, Decision, Rejection, Verdict, Waiting, recheck
from .offers import lock_pools, pool_offers
from .snapshot import WAITING_STATES, job_snapshot, queued_job

#: States of a job that may be preempted: its current attempt is live.
LIVE_STATES = [JobState.ADMITTED, JobState.STARTING, JobState.RUNNING]


def apply_admission(decision: Admission, now: dt.datetime) -> tuple[str, Verdict | None]:
    """Verify and commit one admission (with its preemptions); ``admitted``, ``waiting`` (with why) or ``skipped``."""
    with transaction.atomic():
        job = Job.objects.select_for_update(skip_locked=True).filter(pk=decision.job.job_id,
                                                                      state__in=WAITING_STATES).first()
        if job is None or (job.state == JobState.RECOVERING and _has_live_attempt(job)):
            return "skipped", None
        team = Team.objects.select_for_update(no_key=True).get(pk=job.team_id)
        victims = []
        for v in decision.victims:
            victim = (Job.objects.select_for_update(skip_locked=True)
                      .filter(pk=v.job_id, current_attempt_id=v.attempt_id, state__in=LIVE_STATES).first())
            if victim is None:
                transaction.set_rollback(True)
                return "waiting", Verdict(False, "capacity", "a job to preempt changed meanwhile; retried next pass",
                                          {"request_gpus": job.total_gpus})
            victims.append(victim)
        accelerator_id = decision.accelerator_id or job.accelerator_id
        lock_pools(accelerator_id)
        for victim, v in zip(victims, decision.victims):
            attempt = JobAttempt.objects.get(pk=v.attempt_id)
            preempt_attempt(victim, attempt, reason=f"preempted for job {job.pk} of team {team.slug}, "
                                                    f"within its nominal quota, while team {victim.team_id} borrows")
        outcome = _recheck(job, team, decision, now)
        if not isinstance(outcome, Admission):
            transaction.set_rollback(True)
            return "waiting", outcome.verdict if isinstance(outcome, Rejection) else outcome.verdict()
        offer, estimate = outcome.offer, outcome.estimate_usd
        number = job.attempts.count() + 1
        uid = uuid.uuid4()
        attempt = JobAttempt.objects.create(
            job=job, number=number, uid=uid, cluster_id=offer.cluster_id, node_pool_id=offer.node_pool_id,
            gpus=job.total_gpus, object_name=attempt_object_name(job.pk, number, uid), usd_per_gpu_hour=offer.usd_per_gpu_hour,
            placement=attempt_placement(outcome),
        )
        data = {"cluster": offer.cluster_name, "node_pool_id": offer.node_pool_id, "estimate_usd": str(estimate)}
        if attempt.placement:
            data["nodes"] = attempt.placement["nodes"]
        if decision.victims:
            data["preempted_job_ids"] = [v.job_id for v in decision.victims]
        try:
            transition(job, JobState.ADMITTED, reason=f"placed on {offer.cluster_name} at ${offer.usd_per_gpu_hour}/GPU-h",
                       attempt=attempt, current_attempt=attempt, estimated_cost_usd=job.accrued_cost_usd + estimate,
                       data=data)
        except StaleState:
            transaction.set_rollback(True)
            return "skipped", None
        enqueue_dispatch(attempt.pk)
        return "admitted", None


def attempt_placement(admission: Admission) -> dict:
    """What ``JobAttempt.placement`` records of an admission: its nodes and what each node holds (GPUs, CPU
    millicores, memory MiB); {} on a pool without node rows (the pool's shape stands for its nodes there)."""
    if not admission.offer.node_rooms:
        return {}
    job = admission.job
    return {"nodes": list(admission.node_names), "gpus_per_node": job.gpus_per_node, "cpu_milli": job.cpu_milli,
            "memory_mib": job.memory_mib}


def _recheck(job: Job, team: Team, decision: Admission, now: dt.datetime) -> Decision:
    """The core's decision for the locked ``job`` on a snapshot of the locked rows, after its preemptions.

    The pools are read again (locked: their nodes' free resources now count
    the victims' release); the snapshot holds the job's team, its cohort (the
    lendable pool) and the victims' teams. A job admitted on one of its
    alternatives is re-checked on that accelerator.
    """
    queued = queued_job(job)
    accelerator_id = decision.accelerator_id or job.accelerator_id
    if accelerator_id != queued.accelerator_id:
        queued = dataclasses.replace(queued, accelerator_id=accelerator_id, alternatives=())
    offers = pool_offers(accelerator_id, now, lock=True)
    snapshot = job_snapshot(team, queued, now, offers, also=tuple({v.team_id for v in decision.victims}),
                            lock_spend=True)
    return recheck(snapshot, queued, decision)


def apply_rejection(decision: Rejection) -> bool:
    """REJECTED (a QUEUED job) or FAILED (a RECOVERING job whose quota was lowered), if it still waits."""
    verdict = decision.verdict
    with transaction.atomic():
        job = Job.objects.select_for_update(skip_locked=True).filter(pk=decision.job.job_id,
                                                                      state__in=WAITING_STATES).first()
        if job is None or (job.state == JobState.RECOVERING and _has_live_attempt(job)):
            return False
        data = {"reason": verdict.reason, **verdict.detail}
        if job.state == JobState.QUEUED:
            # A budget refusal carries the estimate it refused (the price of the pool it would have run on).
            estimate = {"estimated_cost_usd": Decimal(verdict.detail["estimate_usd"])} \
                if "estimate_usd" in verdict.detail else {}
            transition(job, JobState.REJECTED, reason=verdict.message, data=data, queue_info={}, **estimate)
        else:
            transition(job, JobState.FAILED, reason=verdict.message, data=data)
    return True


def store_waiting(infos: dict[int, tuple[str, str, dict]], rows: dict[int, dict]) -> None:
    """Write ``queue_info`` of waiting jobs whose info changed: a ``waiting`` event where the reason changed (except
    ``priority``, which only says a job is behind its team's head), a plain update for the rest.

    On PostgreSQL each kind is one statement per 2,000 jobs, whatever the queue's length: a burst of
    submissions that all wait for quota costs one UPDATE and one INSERT of events, not a transaction per job.
    An event is written only for a job still in the state the pass loaded (compare and set), in the same
    transaction as its update.
    """
    events, plain = [], []
    for job_id, (reason, message, info) in infos.items():
        loaded = rows[job_id]
        old = loaded["queue_info"] or {}
        if old == info:
            continue
        if old.get("reason") != reason and reason != "priority":
            events.append((job_id, info, message[:500], loaded["state"]))
        else:
            plain.append((job_id, info, message[:500], None))
    if connection.vendor != "postgresql":
        for job_id, info, message, state in events:
            with transaction.atomic():
                if Job.objects.filter(pk=job_id, state=state).update(queue_info=info, state_reason=message):
                    JobEvent.objects.create(job_id=job_id, kind="waiting", reason=message, data=info,
                                            from_state=state, to_state=state)
        for job_id, info, message, _ in plain:
            Job.objects.filter(pk=job_id, state__in=WAITING_STATES).update(queue_info=info, state_reason=message)
        return
    for start in range(0, len(events), 2000):
        chunk = events[start:start + 2000]
        with transaction.atomic():
            updated = set(_update_waiting_rows(chunk))
            JobEvent.objects.bulk_create([
                JobEvent(job_id=job_id, kind="waiting", reason=message, data=info, from_state=state, to_state=state)
                for job_id, info, message, state in chunk if job_id in updated
            ])
    for start in range(0, len(plain), 2000):
        _update_waiting_rows(plain[start:start + 2000])


def _update_waiting_rows(chunk: list[tuple[int, dict, str, str | None]]) -> list[int]:
    """One UPDATE of ``(job id, queue_info, state_reason, expected state or None)`` rows; returns the updated ids.

    Only jobs still waiting (and in the expected state, where one is given) change. Rows are locked in id
    order and those another worker holds are skipped: concurrent passes updating overlapping rows in
    different orders would deadlock; the skipped rows get their info from that worker.
    """
    table = Job._meta.db_table
    values = ", ".join(["(%s, %s, %s, %s)"] * len(chunk))
    params = [p for job_id, info, message, state in chunk for p in (job_id, json.dumps(info), message, state)]
    with connection.cursor() as cursor:
        cursor.execute(
            f'WITH locked AS (SELECT id FROM "{table}" WHERE id = ANY(%s) AND state IN (%s, %s) '
            f"ORDER BY id FOR UPDATE SKIP LOCKED) "
            f'UPDATE "{table}" AS j SET queue_info = v.info::jsonb, state_reason = v.msg '
            f"FROM (VALUES {values}) AS v(id, info, msg, state), locked "
            f"WHERE j.id = v.id::bigint AND j.id = locked.id AND (v.state IS NULL OR j.state = v.state::text) "
            f"RETURNING j.id",
            [[job_id for job_id, _, _, _ in chunk], JobState.QUEUED, JobState.RECOVERING] + params,
        )
        return [row[0] for row in cursor.fetchall()]


def _has_live_attempt(job: Job) -> bool:
    return job.attempts.filter(ended_at__isnull=True).exists()


def waiting_info(w: Waiting, keep_position: dict | None = None) -> tuple[str, str, dict]:
    """(reason, message, queue_info) of a waiting job; ``keep_position``: its stored info, whose position is kept
    (an incremental pass does not renumber the queue)."""
    info = w.info()
    if keep_position is not None:
        if keep_position.get("position"):
            info["position"] = keep_position["position"]
        else:
            info.pop("position")
    return w.reason, w.message, info
