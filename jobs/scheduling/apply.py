"""Committing the core's decisions: the admissions re-checked under row locks, together, in a fixed number of queries.

The core proposes on an unlocked snapshot; the transaction verifies:

1. lock the job rows (SKIP LOCKED: another scheduler owns them), then their
   team rows, then, for an admission that preempts, the victims' job rows
   (SKIP LOCKED: a victim another worker holds cancels this admission for
   now), then every node pool of the accelerators in id order (serialises
   capacity and the cohort's borrowing of that accelerator; one global
   order, so no deadlock);
2. preempt the victims (``jobs.lifecycle.preempt_attempt``), then read a
   snapshot from the locked rows (``snapshot.teams_snapshot``) and ask the
   core again: quota, per-cluster caps, cohort lending, the victims'
   nominal, the pool's room and the budgets (read after locking the teams'
   spend totals rows, the last locks taken), by the very rules and messages
   of the pass;
3. create the attempts and move the jobs to ADMITTED by compare-and-set, and
   enqueue their dispatch on commit; an admission whose check fails writes
   nothing and its job waits with the re-check's reason.

Admissions without victims are re-checked together: one transaction per
run of them in the pass's order, the core booking each admitted one before
it checks the next, so no run admits more than the locked state holds; a
preempting admission is committed alone, in its own transaction
(``apply_admission``). Waiting jobs get their reason, numbers and queue
positions in ``queue_info`` (one bulk UPDATE); a ``waiting`` event is
written when the reason changes. On SQLite the IMMEDIATE transaction mode
serialises whole transactions, which gives the same guarantee.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import Count

from quotas.models import Team

from ..enqueue import enqueue_dispatches
from ..lifecycle import preempt_attempt
from ..models import Job, JobAttempt, JobEvent, JobState, attempt_object_name
from ..states import Move, transition, transition_many
from .core import (
    Admission,
    Decision,
    FairShareScheduler,
    QueuedJob,
    Rejection,
    Verdict,
    Waiting,
    overtaken_note,
    price_text,
    recheck,
)
from .offers import lock_pools, pool_offers
from .snapshot import WAITING_STATES, job_snapshot, queued_job, teams_snapshot

#: States of a job that may be preempted: its current attempt is live.
LIVE_STATES = [JobState.ADMITTED, JobState.STARTING, JobState.RUNNING]


def apply_admissions(decisions: list[Admission], now: dt.datetime) -> list[tuple[str, Verdict | None]]:
    """Verify and commit ``decisions`` (in the pass's order), each ``admitted``, ``waiting`` (with why) or
    ``skipped``, as ``apply_admission`` answers one.

    Admissions without victims go together, in one transaction per run of
    them, in a fixed number of queries whatever their number: the job rows
    (SKIP LOCKED), their teams' rows, every node pool of their accelerators
    (id order) and their teams' totals rows are locked once, one snapshot of
    them is read, and the core re-checks each admission on it in order,
    booking each one it admits before the next (as a pass does); then the
    attempts, the state changes and their events are written in bulk. A
    preempting admission goes alone (``apply_admission``), after the run
    before it, so each re-check still sees every admission decided before it.
    """
    outcomes: list[tuple[str, Verdict | None]] = []
    run: list[Admission] = []
    for decision in decisions:
        if decision.victims:
            outcomes += _apply_together(run, now)
            run = []
            outcomes.append(apply_admission(decision, now))
        else:
            run.append(decision)
    return outcomes + _apply_together(run, now)


def _locked_waiting(job_ids: list[int]) -> dict[int, Job]:
    """The jobs of ``job_ids`` still waiting, locked (those another scheduler holds skipped), less the RECOVERING ones
    whose attempt is still live; job id -> row."""
    jobs = {j.pk: j for j in Job.objects.select_for_update(skip_locked=True)
            .filter(pk__in=job_ids, state__in=WAITING_STATES).order_by("pk")}
    recovering = [pk for pk, j in jobs.items() if j.state == JobState.RECOVERING]
    if recovering:
        for pk in JobAttempt.objects.filter(job_id__in=recovering, ended_at__isnull=True).values_list("job_id",
                                                                                                     flat=True):
            jobs.pop(pk, None)
    return jobs


def _apply_together(decisions: list[Admission], now: dt.datetime) -> list[tuple[str, Verdict | None]]:
    """Admissions without victims re-checked and committed in one transaction (``apply_admissions``)."""
    if not decisions:
        return []
    with transaction.atomic():
        jobs = _locked_waiting([d.job.job_id for d in decisions])
        if not jobs:
            return [("skipped", None)] * len(decisions)
        teams = {t.pk: t for t in Team.objects.select_for_update(no_key=True)
                 .filter(pk__in={j.team_id for j in jobs.values()}).order_by("pk")}
        accelerators = sorted({d.accelerator_id or jobs[d.job.job_id].accelerator_id for d in decisions
                               if d.job.job_id in jobs})
        lock_pools(*accelerators)
        snapshot = teams_snapshot(teams, {acc: pool_offers(acc, now, lock=False) for acc in accelerators}, now,
                                  lock_spend=True)
        scheduler = FairShareScheduler(snapshot)
        outcomes: list[tuple[str, Verdict | None]] = []
        admitted: list[tuple[Job, Admission]] = []
        for decision in decisions:
            job = jobs.get(decision.job.job_id)
            if job is None:
                outcomes.append(("skipped", None))
                continue
            outcome = scheduler.evaluate(_queued_on(job, decision, now))
            if not isinstance(outcome, Admission):
                outcomes.append(("waiting", _why(outcome)))
                continue
            scheduler.admit(outcome)
            admitted.append((job, outcome))
            outcomes.append(("admitted", None))
        committed = _commit(admitted)
        return [("skipped", None) if o == "admitted" and decision.job.job_id not in committed else (o, v)
                for (o, v), decision in zip(outcomes, decisions, strict=True)]


def apply_admission(decision: Admission, now: dt.datetime) -> tuple[str, Verdict | None]:
    """Verify and commit one admission (with its preemptions); ``admitted``, ``waiting`` (with why) or ``skipped``."""
    with transaction.atomic():
        job = _locked_waiting([decision.job.job_id]).get(decision.job.job_id)
        if job is None:
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
        for victim, v in zip(victims, decision.victims, strict=True):
            attempt = JobAttempt.objects.get(pk=v.attempt_id)
            preempt_attempt(victim, attempt, reason=f"preempted for job {job.pk} of team {team.slug}, "
                                                    f"within its nominal quota, while team {victim.team_id} borrows")
        outcome = _recheck(job, team, decision, now)
        if not isinstance(outcome, Admission):
            transaction.set_rollback(True)
            return "waiting", _why(outcome)
        if not _commit([(job, outcome)], decision.victims):
            transaction.set_rollback(True)
            return "skipped", None
        return "admitted", None


def _why(outcome: Decision) -> Verdict:
    """The verdict of a re-check that did not admit (a rejection's, or why it waits)."""
    return outcome.verdict if isinstance(outcome, Rejection) else outcome.verdict()


def _commit(admitted: list[tuple[Job, Admission]], victims=()) -> set[int]:
    """Write the re-checked admissions of locked jobs: their attempts, the compare-and-set move to ADMITTED with its
    event (``transition_many``; ``victims``: the jobs preempted for a lone admission, named in its event), the
    dispatches on commit; the ids of the jobs admitted (a job whose row changed meanwhile is left out, its attempt
    removed). A fixed number of queries whatever the number of jobs."""
    if not admitted:
        return set()
    numbers = dict(JobAttempt.objects.filter(job_id__in=[job.pk for job, _ in admitted]).order_by()
                   .values_list("job_id").annotate(n=Count("pk")))
    uids = [uuid.uuid4() for _ in admitted]
    attempts = JobAttempt.objects.bulk_create([
        JobAttempt(job=job, number=numbers.get(job.pk, 0) + 1, uid=uid, cluster_id=a.offer.cluster_id,
                   node_pool_id=a.offer.node_pool_id, gpus=job.total_gpus,
                   object_name=attempt_object_name(job.pk, numbers.get(job.pk, 0) + 1, uid),
                   usd_per_gpu_hour=a.offer.usd_per_gpu_hour, placement=attempt_placement(a))
        for (job, a), uid in zip(admitted, uids, strict=True)])
    moves = []
    for (job, a), attempt in zip(admitted, attempts, strict=True):
        offer = a.offer
        data = {"cluster": offer.cluster_name, "node_pool_id": offer.node_pool_id, "estimate_usd": str(a.estimate_usd)}
        if attempt.placement.get("nodes"):  # a multi-role placement on a pool without node rows has roles alone
            data["nodes"] = attempt.placement["nodes"]
        if victims:
            data["preempted_job_ids"] = [v.job_id for v in victims]
        moves.append(Move(job, reason=f"placed on {offer.cluster_name} at {price_text(offer)}",
                          attempt=attempt, data=data,
                          fields={"current_attempt": attempt,
                                  "estimated_cost_usd": job.accrued_cost_usd + a.estimate_usd}))
    moved = {job.pk for job in transition_many(moves, JobState.ADMITTED)}
    stale = [attempt.pk for (job, _), attempt in zip(admitted, attempts, strict=True) if job.pk not in moved]
    if stale:
        JobAttempt.objects.filter(pk__in=stale).delete()
    enqueue_dispatches([(attempt.pk, attempt.cluster_id) for (job, _), attempt in zip(admitted, attempts, strict=True)
                        if job.pk in moved])
    return moved


def attempt_placement(admission: Admission) -> dict:
    """What ``JobAttempt.placement`` records of an admission: its nodes and what each node holds (GPUs, CPU
    millicores, memory MiB; for a job on part of one GPU also ``share_milli`` and ``mig_profile``); {} on a pool
    without node rows (the pool's shape stands for its nodes there)."""
    job = admission.job
    if job.roles:
        return multi_role_placement(admission)
    if not admission.offer.node_rooms:
        return {}
    placement = {"nodes": list(admission.node_names), "gpus_per_node": job.gpus_per_node, "cpu_milli": job.cpu_milli,
                 "memory_mib": job.memory_mib}
    if job.share_milli or job.mig_profile:  # part of one GPU (ADR 0040): its share or MIG profile on that node
        placement.update(share_milli=job.share_milli, mig_profile=job.mig_profile)
        if admission.gpu_index is not None:  # the GPU of its node the share was booked on
            placement["gpu"] = admission.gpu_index
    return placement


def multi_role_placement(admission: Admission) -> dict:
    """``JobAttempt.placement`` of a multi-role job's admission: ``roles``, by role name in name
    order (``jobs.models.roles_in_order``), its nodes (one per pod) and what each pod holds (GPUs, CPU millicores, memory MiB), and ``nodes``, all of them
    in that order, when the pool has node rows (a pool without them: its shape stands for its nodes)."""
    shapes = {r.name: r for r in admission.job.roles}
    roles = {name: {"nodes": list(names), "gpus_per_node": shapes[name].gpus_per_node,
                    "cpu_milli": shapes[name].cpu_milli, "memory_mib": shapes[name].memory_mib}
             for name, names in admission.role_nodes}
    placement: dict = {"roles": roles}
    if admission.offer.node_rooms:
        placement["nodes"] = list(admission.node_names)
    return placement


def _queued_on(job: Job, decision: Admission, now: dt.datetime) -> QueuedJob:
    """The locked ``job`` as the core sees it at ``now`` (the clusters it avoids included), on the accelerator
    ``decision`` got (an alternative's re-check is on that accelerator alone)."""
    queued = queued_job(job, now)
    accelerator_id = decision.accelerator_id or job.accelerator_id
    if accelerator_id != queued.accelerator_id:
        queued = dataclasses.replace(queued, accelerator_id=accelerator_id, alternatives=())
    return queued


def _recheck(job: Job, team: Team, decision: Admission, now: dt.datetime) -> Decision:
    """The core's decision for the locked ``job`` on a snapshot of the locked rows, after its preemptions.

    The pools are read again (locked: their nodes' free resources now count
    the victims' release); the snapshot holds the job's team, its cohort (the
    lendable pool) and the victims' teams. A job admitted on one of its
    alternatives is re-checked on that accelerator.
    """
    queued = _queued_on(job, decision, now)
    offers = pool_offers(queued.accelerator_id, now, lock=True)
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
    ``priority``, which only says a job is behind its team's head) or where jobs were newly admitted ahead of it
    (the event says which: ``queue_info["overtaken"]``), a plain update for the rest.

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
        said = []
        if old.get("reason") != reason and reason != "priority":
            said.append(message[:500])
        if info.get("overtaken") and info["overtaken"] != old.get("overtaken"):  # on its timeline too
            said.append(info["overtaken"][:500])
        if said:
            events.extend((job_id, info, message[:500], loaded["state"], text) for text in said)
        else:
            plain.append((job_id, info, message[:500], None))
    if connection.vendor != "postgresql":
        for job_id, info, message, state, said in events:
            with transaction.atomic():
                if Job.objects.filter(pk=job_id, state=state).update(queue_info=info, state_reason=message):
                    JobEvent.objects.create(job_id=job_id, kind="waiting", reason=said, data=info,
                                            from_state=state, to_state=state)
        for job_id, info, message, _ in plain:
            Job.objects.filter(pk=job_id, state__in=WAITING_STATES).update(queue_info=info, state_reason=message)
        return
    for start in range(0, len(events), 2000):
        chunk = events[start:start + 2000]
        with transaction.atomic():
            updated = set(_update_waiting_rows(list({row[0]: row[:4] for row in chunk}.values())))
            JobEvent.objects.bulk_create([
                JobEvent(job_id=job_id, kind="waiting", reason=said, data=info, from_state=state, to_state=state)
                for job_id, info, _, state, said in chunk if job_id in updated
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


def waiting_info(w: Waiting, keep_position: dict | None = None, admitted: set[int] | None = None,
                 stored: dict | None = None) -> tuple[str, str, dict]:
    """(reason, message, queue_info) of a waiting job; ``keep_position``: its stored info, whose position is kept
    (an incremental pass does not renumber the queue).

    ``admitted``: the ids of the jobs the pass's admissions committed. Of the jobs the scheduler saw overtake this
    one (``Waiting.overtaken_by``), those committed are named in ``overtaken_by`` (job id, team id, GPUs, vCPU)
    and ``overtaken`` (the sentence of ``core.overtaken_note``); without any, the ones of ``stored`` (its stored
    info) are kept: it was overtaken while it waits, and says so until it leaves the queue."""
    info = w.info()
    if keep_position is not None:
        if keep_position.get("position"):
            info["position"] = keep_position["position"]
        else:
            info.pop("position")
    by = [j for j in w.overtaken_by or () if admitted is not None and j.job_id in admitted]
    if by:
        info["overtaken_by"], info["overtaken"] = overtaken_note(w.job, w.reason, by)
    elif stored and stored.get("overtaken"):
        info["overtaken_by"], info["overtaken"] = stored.get("overtaken_by", []), stored["overtaken"]
    message = w.message
    if w.reservation is not None:  # backfill's hold for it (ADR 0044): which nodes, and when it expects to start
        message = f"{info['reservation']['message']} Now: {message}"[:500]  # ``Job.state_reason`` holds 500
    return w.reason, message, info
