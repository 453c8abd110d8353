"""A serving job's rolling update to the checkpoint of another SUCCEEDED training job of its team, replica by replica,
with a roll back when a new replica fails readiness (docs/adr/0041-autoscaled-serving.md).

``start_rollout`` checks the request and records a ``ServingRollout`` (``rolling``) with a ``rollout_started``
event. ``step_rollouts`` (the serving beat task, every ``AUTOSCALE_INTERVAL_SECONDS``) moves each rolling one on by
the rule of a Kubernetes Deployment's RollingUpdate with ``maxSurge: 1, maxUnavailable: 0`` (Kubernetes
documentation, "Deployments", "Rolling Update Deployment"), the surge admitted like any scale-up:

1. no new replica pending: one more replica is admitted (``serving.replicas.add_replica``: quota, nodes, budget)
   and started on the new checkpoint; refused, one old replica is replaced in place instead (its slot, no
   admission) when the job keeps at least its ``min_replicas`` (``spec.autoscaling.min_replicas``, else 1)
   meanwhile, else the step waits and says why (``progress.note``);
2. the pending replica ready (its health path answers, so the endpoint routes to it): one old replica is retired
   and, after a surge, its booking released (``release_replicas``): the job keeps its size; repeat;
3. the pending replica ended, or not ready within ``SERVING_ROLLOUT_READY_SECONDS`` (600 s, a Deployment's default
   ``progressDeadlineSeconds``): rolled back: the pending replica is retired (its surge released, or an old one
   started again in its slot) and every new replica made ready so far is replaced in place by one on the old
   checkpoint; ``rollout_rolled_back``;
4. no old replica left: a pinning backend's surge retired and released (below), the job's
   ``spec.checkpoint_from`` becomes the new job (a later attempt or replica loads it), ``done``, ``rollout_done``.

On a backend that pins replica ``i`` to the node booked ``i``-th (``Backend.pins_replicas``: Kubernetes, a
Deployment per replica), retiring the oldest replica while ``release_replicas`` gives back the last booking would
leave a pod on a node its booking no longer holds. There, the surge (the last slot) stays once ready; each old
replica in turn is updated in its own slot (``start_rollout_replica(..., in_place_of=old)``, its node and booking
unchanged) and waited for; with none left the surge is retired and released (the last booking: its own). A roll
back retires and releases the surge too.

The autoscaler leaves a job alone while its rollout runs. Requests go to ready replicas only (the endpoint's
rule), so a new replica gets none until ready and a retired one none once it is out of the list.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.models import Job, JobAttempt, JobState, ServingRollout
from jobs.spec import CHECKPOINT_ARGS, CHECKPOINT_ENV
from jobs.states import record_event
from runners.base import PermanentDispatchError, TransientDispatchError, backend_for

from .replicas import add_replica, release_replicas

log = logging.getLogger(__name__)

ROLLING = ServingRollout.State.ROLLING


class RolloutError(ValueError):
    """A rollout that cannot start: ``field`` (``job`` or ``checkpoint_from_job``) and ``reason`` (a sentence)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def ready_deadline_seconds() -> float:
    """Seconds a new replica may take to become ready: ``settings.SERVING_ROLLOUT_READY_SECONDS`` (default 600, a
    Kubernetes Deployment's default ``progressDeadlineSeconds``)."""
    return float(settings.SERVING_ROLLOUT_READY_SECONDS)


def current_checkpoint_job(job: Job) -> int:
    """The training job whose checkpoint ``job``'s replicas load: ``spec.checkpoint_from``, else the job itself
    (its own checkpoint directory)."""
    return (job.spec or {}).get("checkpoint_from") or job.pk


def start_rollout(job_id: int, *, checkpoint_from_job_id: int, actor,
                  trigger_job_id: int | None = None) -> ServingRollout:
    """Start moving serving job ``job_id`` to the checkpoint of training job ``checkpoint_from_job_id``; returns the
    ``rolling`` ServingRollout, written with a ``rollout_started`` event by ``actor`` (a user, or None).
    ``trigger_job_id``: the followed training job whose success starts it (``serving.follow``; the event names it),
    None for a request; such a rollout is refused when one to the same checkpoint was ever started for the job
    (each run is rolled out to once: a roll back or a rollout by hand to another checkpoint is not undone).

    Raises RolloutError (nothing stored) for: no such job (``job``), not a RUNNING serving job, a job whose
    arguments or environment name its checkpoint themselves (``--checkpoint-dir``, ``--checkpoint-uri``,
    ``CHECKPOINT_URI``: a replica could not be pointed elsewhere), a runner that does not roll out
    (``Backend.rolls_out``); a checkpoint job that is not a training job of the same team, not SUCCEEDED, or the
    one served now, or a rollout already rolling (``checkpoint_from_job``). The caller checks permission.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).select_related("team").first()
        if job is None:
            raise RolloutError("job", f"no job {job_id}")
        if job.kind != Job.Kind.INFERENCE:
            raise RolloutError("job", f"job {job.pk} is not a serving job ({job.kind}); only a serving job rolls out")
        if job.state != JobState.RUNNING or job.current_attempt_id is None:
            raise RolloutError("job", f"job {job.pk} is {job.state}; only a RUNNING serving job rolls out")
        words = [*(job.spec.get("command") or ()), *(job.spec.get("args") or ())]
        if any(w.split("=", 1)[0] in CHECKPOINT_ARGS for w in words) or any(
                k in (job.spec.get("env") or {}) for k in CHECKPOINT_ENV):
            raise RolloutError("job", f"job {job.pk} names its checkpoint in its arguments or environment "
                                      f"({', '.join((*CHECKPOINT_ARGS, *CHECKPOINT_ENV))}); a rollout points "
                                      f"CHECKPOINT_DIR elsewhere, which such a server does not read")
        attempt = JobAttempt.objects.select_related("cluster").get(pk=job.current_attempt_id)
        backend = backend_for(attempt.cluster)
        if not backend.rolls_out:
            raise RolloutError("job", f"the {attempt.cluster.name} cluster's runner does not roll out a running "
                                      f"job yet")
        target = Job.objects.filter(pk=checkpoint_from_job_id, team_id=job.team_id).only(
            "pk", "kind", "state").first()
        if target is None:
            raise RolloutError("checkpoint_from_job", f'no job {checkpoint_from_job_id} in team "{job.team.slug}"')
        if target.kind != Job.Kind.TRAINING:
            raise RolloutError("checkpoint_from_job", f"job {target.pk} is not a training job ({target.kind}); a "
                                                      f"checkpoint comes from a training job")
        if target.state != JobState.SUCCEEDED:
            raise RolloutError("checkpoint_from_job", f"job {target.pk} is {target.state}; only a SUCCEEDED training "
                                                      f"job's checkpoint is rolled out")
        current = current_checkpoint_job(job)
        if target.pk == current:
            raise RolloutError("checkpoint_from_job", f"the replicas serve the checkpoint of job {target.pk} already")
        rolling = ServingRollout.objects.filter(job=job, state=ROLLING).first()
        if rolling is not None:
            raise RolloutError("checkpoint_from_job", f"a rollout of job {job.pk} to the checkpoint of job "
                                                      f"{rolling.to_job_id} is under way")
        if trigger_job_id is not None and ServingRollout.objects.filter(job=job, to_job_id=target.pk).exists():
            raise RolloutError("checkpoint_from_job", f"job {job.pk} was rolled out to the checkpoint of job "
                                                      f"{target.pk} before; a followed run is rolled out to once")
        old = backend.replica_keys(attempt)
        rollout = ServingRollout.objects.create(
            job=job, from_job_id=current, to_job_id=target.pk, actor=actor, trigger_job_id=trigger_job_id,
            progress={"attempt": attempt.pk, "old": old, "new": [], "pending": None, "note": ""})
        why = "" if trigger_job_id is None else f"job {trigger_job_id}, which this job follows, SUCCEEDED: "
        data = {"rollout": rollout.pk, "from": current, "to": target.pk, "replicas": len(old)}
        if trigger_job_id is not None:
            data["trigger"] = trigger_job_id
        record_event(job, "rollout_started", f"{why}rolling {len(old)} replica(s) from the checkpoint of job "
                                             f"{current} to that of job {target.pk}", actor=actor, attempt=attempt,
                     data=data)
    return rollout


def step_rollouts(now: dt.datetime | None = None) -> list[dict]:
    """One step of every ``rolling`` rollout at ``now`` (default now; module docstring); one dict per rollout:
    ``{"rollout", "job", "state", "action"}`` or ``{"rollout", "job", "error"}``. One rollout's fault is logged
    and the others go on."""
    now = now or timezone.now()
    results = []
    for rollout in ServingRollout.objects.filter(state=ROLLING).select_related("job").order_by("pk"):
        try:
            action = step_rollout(rollout, now)
            results.append({"rollout": rollout.pk, "job": rollout.job_id, "state": rollout.state, "action": action})
        except Exception as exc:  # noqa: BLE001 - one job's fault must not stop the others
            log.exception("rollout %s of job %s failed a step", rollout.pk, rollout.job_id)
            results.append({"rollout": rollout.pk, "job": rollout.job_id, "error": f"{type(exc).__name__}: {exc}"})
    return results


def step_rollout(rollout: ServingRollout, now: dt.datetime) -> str:
    """One step of ``rollout`` (module docstring); what it did: ``waiting``, ``started``, ``updated``, ``done``,
    ``rolled_back``. Raises what the runner raises (TransientDispatchError: the next step tries again)."""
    job = Job.objects.get(pk=rollout.job_id)
    progress = rollout.progress
    attempt = (JobAttempt.objects.select_related("job", "cluster", "node_pool")
               .filter(pk=progress["attempt"], ended_at__isnull=True).first())
    if job.state != JobState.RUNNING or attempt is None or job.current_attempt_id != attempt.pk:
        return _finish(rollout, job, None, ServingRollout.State.ROLLED_BACK,
                       f"the attempt it rolled ended (job {job.state}); the next attempt loads the checkpoint of "
                       f"job {rollout.from_job_id}")
    backend = backend_for(attempt.cluster)
    pending = progress.get("pending")
    if pending:
        status = backend.settle_rollout_replica(attempt, pending["key"])
        if status == "failed":
            return _roll_back(rollout, job, attempt, backend, now, f"new replica {pending['key']} ended before it "
                                                                   f"was ready")
        since = dt.datetime.fromisoformat(pending["since"])
        if status != "ready":
            if (now - since).total_seconds() > ready_deadline_seconds():
                return _roll_back(rollout, job, attempt, backend, now, f"new replica {pending['key']} not ready "
                                                                       f"within {ready_deadline_seconds():.0f} s")
            return _save(rollout, "waiting", note=f"new replica {pending['key']} starting")
        live = set(backend.replica_keys(attempt))
        if pending.get("surge") and backend.pins_replicas:  # kept until every old replica is updated in place
            progress["surge"] = pending["key"]
            progress["pending"] = None
            return _save(rollout, "updated")
        if pending.get("surge"):
            old = next((k for k in progress["old"] if k in live), None)
            if old is not None:
                progress["old"].remove(old)
                _keep(attempt, backend.retire_replica(attempt, old))
                release_replicas(job.pk, now, {"desired": job.replicas - 1, "rollout": rollout.pk})
        progress["new"].append(pending["key"])
        progress["pending"] = None
        rollout.replicas_updated += 1
        return _save(rollout, "updated")
    live = backend.replica_keys(attempt)
    surge = progress.get("surge")
    # A lost old replica's replacement is old too; a pinning backend's surge is neither old nor kept.
    progress["old"] = [k for k in live if k not in progress["new"] and k != surge]
    if not progress["old"]:
        _retire_surge(rollout, job, attempt, backend, now)
        _keep(attempt, backend.finish_rollout(attempt, rollout.to_job_id))
        return _finish(rollout, job, attempt, ServingRollout.State.DONE,
                       f"{rollout.replicas_updated} replica(s) serve the checkpoint of job {rollout.to_job_id}")
    if surge:  # a pinning backend: the surge keeps the capacity while each old replica is updated in its slot
        old = progress["old"].pop(0)
        key = backend.start_rollout_replica(attempt, rollout.to_job_id, in_place_of=old)
        progress["pending"] = {"key": key, "since": now.isoformat(), "surge": False, "in_place_of": old}
        return _save(rollout, "started", note="")
    booked = progress.get("booked")
    if not booked:
        verdict = add_replica(job.pk, now, {"desired": job.replicas + 1, "rollout": rollout.pk})
        booked = verdict is None
        if booked:
            progress["booked"] = True  # kept until the replica starts: a failed start is tried again, not re-admitted
    if booked:
        key = backend.start_rollout_replica(attempt, rollout.to_job_id)
        progress["booked"] = False
        progress["pending"] = {"key": key, "since": now.isoformat(), "surge": True}
        return _save(rollout, "started", note="")
    floor = ((job.spec or {}).get("autoscaling") or {}).get("min_replicas") or 1
    if job.replicas - 1 < floor:
        return _save(rollout, "waiting", note=f"no room for one more replica ({verdict.message}), and replacing one "
                                              f"in place would leave fewer than {floor} serving")
    old = progress["old"].pop(0)
    key = backend.start_rollout_replica(attempt, rollout.to_job_id, in_place_of=old)
    progress["pending"] = {"key": key, "since": now.isoformat(), "surge": False, "in_place_of": old}
    return _save(rollout, "started", note=f"no room for one more replica ({verdict.message}): replacing "
                                         f"replica {old} in place")


def _roll_back(rollout: ServingRollout, job: Job, attempt: JobAttempt, backend, now: dt.datetime, why: str) -> str:
    """Undo ``rollout``: the pending replica retired (its surge released, or one on the old checkpoint started in
    its slot), every new replica replaced in place by one on the old checkpoint; ``rolled_back`` with ``why``."""
    progress = rollout.progress
    pending = progress.get("pending")
    if pending and pending.get("surge"):
        _keep(attempt, backend.retire_replica(attempt, pending["key"]))
        release_replicas(job.pk, now, {"desired": job.replicas - 1, "rollout": rollout.pk})
    elif pending:
        _settled(backend, attempt, backend.start_rollout_replica(attempt, rollout.from_job_id,
                                                                 in_place_of=pending["key"]))
    for key in progress["new"]:
        _settled(backend, attempt, backend.start_rollout_replica(attempt, rollout.from_job_id, in_place_of=key))
    progress["pending"] = None
    _retire_surge(rollout, job, attempt, backend, now)
    return _finish(rollout, job, attempt, ServingRollout.State.ROLLED_BACK,
                   f"{why}; the replicas serve the checkpoint of job {rollout.from_job_id} again")


def _retire_surge(rollout: ServingRollout, job: Job, attempt: JobAttempt, backend, now: dt.datetime) -> None:
    """A pinning backend's surge replica (``progress["surge"]``, the last slot), if any: retired, then its booking
    released (``release_replicas`` gives back the last booked node: the surge's, so booking and pods agree)."""
    surge = rollout.progress.get("surge")
    if not surge:
        return
    _keep(attempt, backend.retire_replica(attempt, surge))
    release_replicas(job.pk, now, {"desired": job.replicas - 1, "rollout": rollout.pk})
    rollout.progress["surge"] = None


def _settled(backend, attempt: JobAttempt, key: str) -> None:
    """Take a replica started on the old checkpoint off probation at once: it serves what served before, so its
    death is a lost replica's (replaced), not the rollout's."""
    try:
        backend.settle_rollout_replica(attempt, key)
    except (TransientDispatchError, PermanentDispatchError):
        log.warning("replica %s of %s stays on probation", key, attempt.object_name)


def _keep(attempt: JobAttempt, runner_state: dict) -> None:
    """Store the runner's new ``runner_state`` of ``attempt`` (its replicas' addresses)."""
    JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(runner_state=runner_state)


def _save(rollout: ServingRollout, action: str, note: str | None = None) -> str:
    if note is not None:
        rollout.progress["note"] = note
    rollout.save(update_fields=["progress", "replicas_updated", "updated_at"])
    return action


def _finish(rollout: ServingRollout, job: Job, attempt: JobAttempt | None, state: str, reason: str) -> str:
    """End ``rollout`` in ``state`` with ``reason`` and its event (``rollout_done``: the job's ``checkpoint_from``
    becomes the new job; ``rollout_rolled_back``), compare-and-set on ``rolling``."""
    with transaction.atomic():
        moved = ServingRollout.objects.filter(pk=rollout.pk, state=ROLLING).update(
            state=state, reason=reason[:500], progress=rollout.progress, replicas_updated=rollout.replicas_updated,
            updated_at=timezone.now())
        if not moved:
            return "stale"
        done = state == ServingRollout.State.DONE
        if done:
            locked = Job.objects.select_for_update().get(pk=job.pk)
            Job.objects.filter(pk=job.pk).update(spec={**locked.spec, "checkpoint_from": rollout.to_job_id})
        record_event(job, "rollout_done" if done else "rollout_rolled_back", reason, attempt=attempt,
                     data={"rollout": rollout.pk, "from": rollout.from_job_id, "to": rollout.to_job_id,
                           "replicas_updated": rollout.replicas_updated})
    rollout.state, rollout.reason = state, reason[:500]
    return "done" if done else "rolled_back"
