"""Serving jobs that follow a training job (``spec.follow``): a rollout to each newer run of it that succeeds
(docs/adr/0041-autoscaled-serving.md).

Level-triggered, as a Kubernetes controller is: every pass of the serving beat task (``AUTOSCALE_INTERVAL_SECONDS``,
before the rollouts step) compares, for each serving job with ``spec.follow`` that has not ended, the newest
SUCCEEDED run of the followed job (``jobs.dependencies.newest_run``) with the checkpoint its replicas load
(``spec.checkpoint_from``). When they differ and the job was never rolled out to that run before (a roll back, or a
rollout by hand to another checkpoint, is not undone):

- a RUNNING job rolls out to it (``serving.rollout.start_rollout`` with ``trigger_job_id``: one surge replica at a
  time, ``min_replicas`` kept, rolled back when a new replica is not ready), the ``rollout_started`` event naming
  the run that triggered it; a job already rolling waits for that rollout to end;
- a QUEUED job (not admitted yet, or waiting for its next attempt) starts from it: its ``spec.checkpoint_from``
  becomes the run, compare-and-set under the job row's lock (admission takes the same lock and moves the job out of
  QUEUED, so an attempt reads either the old spec or the new one whole), with a ``checkpoint_followed`` event;
- a job in any other state (ADMITTED, STARTING, RECOVERING, CANCELLING) is left for a later pass.

A missed pass (a worker down) is caught up by the next: the decision reads only the rows.
"""

from __future__ import annotations

import logging

from django.db import transaction

from jobs.dependencies import newest_run
from jobs.models import FINAL_STATES, Job, JobState, ServingRollout
from jobs.states import record_event

from .rollout import RolloutError, current_checkpoint_job, start_rollout

log = logging.getLogger(__name__)


def follow_checkpoints() -> list[dict]:
    """One pass over the serving jobs with ``spec.follow`` that have not ended (module docstring); one dict per job
    that did or waits for something: ``{"job", "follow": action, "run"}`` with action ``rollout_started``,
    ``start_checkpoint_set``, ``waiting`` (with ``note``) or ``refused`` (with ``note``: the rollout's
    refusal), or ``{"job", "error"}``. One job's fault is logged and the others go on."""
    results = []
    followers = (Job.objects.filter(kind=Job.Kind.INFERENCE, spec__has_key="follow")
                 .exclude(state__in=sorted(FINAL_STATES)).only("pk", "team_id", "state", "spec").order_by("pk"))
    for job in followers:
        try:
            result = follow(job)
        except Exception as exc:  # noqa: BLE001 - one job's fault must not stop the others
            log.exception("following the checkpoints of job %s failed", job.pk)
            result = {"job": job.pk, "error": f"{type(exc).__name__}: {exc}"}
        if result is not None:
            results.append(result)
    return results


def follow(job: Job) -> dict | None:
    """Act on one follower ``job`` (a Job with ``spec``, ``team_id`` and ``state``; module docstring). Returns the
    result dict, or None when the job serves the newest run already (or none has succeeded)."""
    ref = ((job.spec or {}).get("follow") or {}).get("job")
    run = newest_run(job.team_id, ref) if ref is not None else None
    if run is None or run.pk == current_checkpoint_job(job):
        return None
    if ServingRollout.objects.filter(job_id=job.pk, to_job_id=run.pk).exists():
        return None  # rolled out to once (a roll back, or a rollout by hand since, stands)
    if job.state == JobState.QUEUED:
        return _start_from(job.pk, run)
    if job.state != JobState.RUNNING:
        return {"job": job.pk, "follow": "waiting", "run": run.pk, "note": f"the job is {job.state}"}
    if ServingRollout.objects.filter(job_id=job.pk, state=ServingRollout.State.ROLLING).exists():
        return {"job": job.pk, "follow": "waiting", "run": run.pk, "note": "a rollout is under way"}
    try:
        start_rollout(job.pk, checkpoint_from_job_id=run.pk, actor=None, trigger_job_id=run.pk)
    except RolloutError as exc:  # the job moved on meanwhile, or its runner does not roll out
        return {"job": job.pk, "follow": "refused", "run": run.pk, "note": f"{exc.field}: {exc.reason}"}
    return {"job": job.pk, "follow": "rollout_started", "run": run.pk}


def _start_from(job_id: int, run: Job) -> dict | None:
    """Make QUEUED serving job ``job_id`` start from training job ``run``'s checkpoint: ``spec.checkpoint_from``
    set and a ``checkpoint_followed`` event, in one transaction under the job row's lock, only while it is still
    QUEUED and loads another checkpoint (else None: admission or another pass came first)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, state=JobState.QUEUED).first()
        if job is None or current_checkpoint_job(job) == run.pk:
            return None
        before = current_checkpoint_job(job)
        Job.objects.filter(pk=job.pk).update(spec={**job.spec, "checkpoint_from": run.pk})
        record_event(job, "checkpoint_followed", f"job {run.pk} ({run.name}), which this job follows, SUCCEEDED: "
                                                 f"it will start from that job's checkpoint, not job {before}'s",
                     data={"trigger": run.pk, "from": before, "to": run.pk})
    return {"job": job_id, "follow": "start_checkpoint_set", "run": run.pk}
