"""What the API and the job's page show of a serving job: its endpoint, its replicas, its autoscaling (the spec's
bounds and target, the last decision, and why a scale-up was refused) and its figures (``jobs.serving_figures``)."""

from __future__ import annotations

from .dependencies import newest_run
from .models import Job, ServingRollout, ServingScale
from .serving_figures import recent_figures


def serving_status(job: Job) -> dict | None:
    """A serving ``job``'s ``{"endpoint", "replicas", "replica_addresses", "autoscaling", "rollout", "follow",
    "figures"}``; None for other kinds.

    ``endpoint``: ``Job.endpoint`` (stable for the job's life on the local runner; the Service's address on
    Kubernetes). ``replica_addresses``: where the current attempt's replicas listen, as its runner reports them
    ([] when it does not). ``autoscaling``: None without ``spec.autoscaling``; else its ``min_replicas``,
    ``max_replicas``, ``metric`` (``in_flight`` or ``rps``), ``target_per_replica``, the delays (s), and from
    the last pass (``jobs.models.ServingScale``) ``metric_per_replica``, ``desired``, ``decided_at``,
    ``refusal`` ({} or ``{"reason", "message", "replicas", "desired", "at", ...}``) and ``note``. One query
    for the autoscaler's row. ``rollout``: None, or the job's latest rolling update to another checkpoint
    (``jobs.models.ServingRollout``): ``{"state" (rolling, done, rolled_back), "from", "to" (training job ids),
    "replicas_updated", "reason", "note" (why a step waits), "started_at", "trigger" (the followed training job
    whose success started it; None: started by request)}``; one query. ``follow``: None without ``spec.follow``;
    else ``{"job": the followed job's id or name as given, "newest_run": the id of its newest SUCCEEDED run or
    None}`` (``jobs.dependencies.newest_run``, one query). ``figures``:
    ``jobs.serving_figures.recent_figures`` (rates, latency percentiles, error rate, replicas over time, GPU-hours
    and USD per million requests over the last hour it served), None before the first sample.
    """
    if job.kind != Job.Kind.INFERENCE:
        return None
    attempt = job.current_attempt if job.endpoint else None
    rollout = ServingRollout.objects.filter(job_id=job.pk).order_by("-id").first()
    status = {"endpoint": job.endpoint, "replicas": job.replicas,
              "replica_addresses": list((attempt.runner_state or {}).get("replicas") or ()) if attempt else [],
              "autoscaling": None, "figures": recent_figures(job),
              "rollout": None if rollout is None else {
                  "state": rollout.state, "from": rollout.from_job_id, "to": rollout.to_job_id,
                  "replicas_updated": rollout.replicas_updated, "reason": rollout.reason,
                  "note": (rollout.progress or {}).get("note", ""), "started_at": rollout.created_at,
                  "trigger": rollout.trigger_job_id}}
    followed = ((job.spec or {}).get("follow") or {}).get("job")
    newest = newest_run(job.team_id, followed) if followed is not None else None
    status["follow"] = None if followed is None else {"job": followed, "newest_run": newest.pk if newest else None}
    scaling = (job.spec or {}).get("autoscaling")
    if not scaling:
        return status
    in_flight = scaling.get("target_in_flight_per_replica") is not None
    state = ServingScale.objects.filter(job_id=job.pk).first()
    status["autoscaling"] = {
        "min_replicas": scaling["min_replicas"], "max_replicas": scaling["max_replicas"],
        "metric": "in_flight" if in_flight else "rps",
        "target_per_replica": scaling["target_in_flight_per_replica" if in_flight else "target_rps_per_replica"],
        "scale_up_delay_seconds": scaling.get("scale_up_delay_seconds", 0),
        "scale_down_delay_seconds": scaling.get("scale_down_delay_seconds", 300),
        "metric_per_replica": state.metric if state else None, "desired": state.desired if state else None,
        "decided_at": state.decided_at if state else None, "refusal": state.refusal if state else {},
        "note": state.note if state else "",
    }
    return status
