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
    (``jobs.lifecycle.apply_observation``). Returns what was done, one word per lost replica: ``replaced``,
    ``pending`` (recorded, the runner's call failed: the next look calls it again), ``ended`` or ``stale`` (the
    job or attempt moved on meanwhile)."""
    now = now or timezone.now()
    done: list[str] = []
    for lost in obs.lost_replicas:
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
