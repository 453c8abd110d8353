"""The autoscaling pass: for every RUNNING serving job, read its endpoint's counters and keep what it served over the
interval (a ``ServingSample``: requests, errors, tokens, latency histogram, replicas; ``serving.figures``); for one
with ``spec.autoscaling``, also decide the replica count by the HorizontalPodAutoscaler's rule (``serving.hpa``) and apply it: scale-ups admitted one
replica at a time (``serving.replicas.add_replica``; a refusal leaves the job at its size and says why), scale-
downs released (``release_replicas``), then the cluster's runner made to run that many (``Backend.scale``).
Before any of that, a replica lost with its node is answered (``serving.replacement``): its slot released and a
replacement admitted off that node, the runner made to follow; a refusal is kept and shown as a scale-up's.

Every step is kept on the job's ``ServingScale`` row (the page and the API read it) and, for a change, a ``scale``
event; a refusal whose reason is new is a ``scale_refused`` event. One job's failure is logged and the others go
on. Celery beat runs it every ``AUTOSCALE_INTERVAL_SECONDS`` (15 s: the HorizontalPodAutoscaler's default sync
period).
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction
from django.utils import timezone

from jobs.models import Job, JobAttempt, JobEvent, JobState, ServingRollout, ServingSample, ServingScale
from runners.base import Backend, PermanentDispatchError, TransientDispatchError, backend_for

from .figures import interval_sample, parse_totals
from .hpa import bounded, load, parse_reading, recommended, stabilized
from .replacement import replace_lost
from .replicas import add_replica, release_replicas

log = logging.getLogger(__name__)

#: How long a serving job's samples are kept: a month's figures, and the weekly report's, with room to spare.
SAMPLE_RETENTION = dt.timedelta(days=35)


def serving_jobs():
    """The RUNNING serving jobs (their current attempt and cluster selected), by id."""
    return list(Job.objects.filter(kind=Job.Kind.INFERENCE, state=JobState.RUNNING, current_attempt__isnull=False)
                .select_related("current_attempt__cluster", "team").order_by("pk"))


def autoscale(now: dt.datetime | None = None) -> list[dict]:
    """One pass over ``serving_jobs`` at ``now`` (default now): each one's sample kept, each autoscaled one's count
    decided; one dict per job: ``{"job", "replicas" (after the pass), "desired", "note"}`` and, when it decided,
    the decision's numbers (``metric``, ``metric_per_replica``, ``target``, ``current``, ``recommended``); or
    ``{"job", "error"}``."""
    now = now or timezone.now()
    results = []
    for job in serving_jobs():
        try:
            results.append(scale_job(job, now))
        except Exception as exc:  # noqa: BLE001 - one job's fault must not stop the others
            log.exception("autoscaling of job %s failed", job.pk)
            results.append({"job": job.pk, "error": f"{type(exc).__name__}: {exc}"})
    return results


def target_of(scaling: dict) -> tuple[str, float]:
    """``(metric, target per replica)`` of ``spec.autoscaling``: ``in_flight`` or ``rps``."""
    if scaling.get("target_in_flight_per_replica") is not None:
        return "in_flight", float(scaling["target_in_flight_per_replica"])
    return "rps", float(scaling["target_rps_per_replica"])


def sample_job(job: Job, backend: Backend, now: dt.datetime) -> dict:
    """Read the endpoint of serving ``job`` without ``spec.autoscaling`` and keep its sample at ``now``; its result
    dict."""
    state, _ = ServingScale.objects.get_or_create(job=job)
    read = keep_sample(state, job, backend, now)
    state.save(update_fields=["sample"])
    return {"job": job.pk, "replicas": job.replicas, "desired": None,
            "note": "" if read else "no reading of the endpoint's counters"}


def keep_sample(state: ServingScale, job: Job, backend: Backend, now: dt.datetime) -> bool:
    """Read ``job``'s endpoint and keep its sample (``record_sample``), ``state.sample`` updated (not saved); False
    when the endpoint did not answer."""
    text = backend.endpoint_load(job.current_attempt)
    if text:
        state.sample = {**(state.sample or {}), **record_sample(state, job, text, now)}
    return bool(text)


def record_sample(state: ServingScale, job: Job, text: str, now: dt.datetime) -> dict:
    """Keep what ``job``'s endpoint served since the last pass (``text``: its exposition; ``state.sample``: what the
    last pass kept) as a ``ServingSample`` at ``now``, and drop the job's samples older than ``SAMPLE_RETENTION``.
    Returns what to keep for the next pass: ``{"figures": Totals.as_kept(what the last pass kept), "figures_at":
    unix seconds}``, or {} when the exposition has no figures (an endpoint that does not count them)."""
    totals = parse_totals(text)
    if totals is None:
        return {}
    kept = state.sample or {}
    since = kept.get("figures_at")
    started = job.current_attempt.started_at or now
    seconds = now.timestamp() - since if since is not None else (now - started).total_seconds()
    sample = interval_sample(totals, kept.get("figures"))
    ServingSample.objects.create(job=job, at=now, seconds=max(0.0, seconds), replicas=job.replicas,
                                 ready_replicas=totals.ready_replicas, **sample)
    ServingSample.objects.filter(job=job, at__lt=now - SAMPLE_RETENTION).delete()
    return {"figures": totals.as_kept(kept.get("figures")), "figures_at": now.timestamp()}


def scale_job(job: Job, now: dt.datetime) -> dict:
    """Read, keep the sample, decide and apply for one serving ``job`` (module docstring); its result dict."""
    scaling = (job.spec or {}).get("autoscaling")
    attempt = job.current_attempt
    backend = backend_for(attempt.cluster)
    rolling = ServingRollout.objects.filter(job=job, state=ServingRollout.State.ROLLING).exists()
    if backend.pins_replicas and backend.scales and not rolling:
        follow_node_losses(job, backend, now, autoscaled=bool(scaling))
    if not scaling:
        return sample_job(job, backend, now)
    state, _ = ServingScale.objects.get_or_create(job=job)
    if rolling:
        keep_sample(state, job, backend, now)  # it serves meanwhile
        return _noted(state, job, "a rollout to another checkpoint is under way: the replica count stays")
    if not backend.scales:
        return _noted(state, job, f"the {attempt.cluster.name} cluster's runner does not change a running job's "
                                  f"replicas yet: it keeps {job.replicas}")
    if len((attempt.runner_state or {}).get("replicas") or ()) != job.replicas * job.nodes:
        apply_replicas(backend, attempt, job.replicas)  # a change the runner did not make yet (a failed call)
    text = backend.endpoint_load(attempt)
    reading = parse_reading(text) if text else None
    if reading is None:
        return _noted(state, job, "no reading of the endpoint's counters: the replica count stays")
    kept = record_sample(state, job, text, now)
    metric, target = target_of(scaling)
    previous = state.sample
    total = load(reading, previous, metric)
    state.sample = {**reading.as_sample(), **kept}
    if job.replicas == 0:
        return _from_zero(state, job, backend, attempt, now, asked=reading.in_flight > 0 or bool(total) or bool(
            previous and reading.requests > previous.get("requests", 0)), metric=metric, target=target)
    if total is None:
        return _noted(state, job, "a first reading: a rate needs two")
    current = job.replicas
    per_replica = total / current
    raw = recommended(current, per_replica, target)
    at = now.timestamp()
    up, down = scaling.get("scale_up_delay_seconds", 0), scaling.get("scale_down_delay_seconds", 300)
    history = [(float(t), int(n)) for t, n in state.recommendations or ()]
    desired = bounded(stabilized(current, raw, history, at, up, down), scaling["min_replicas"],
                      scaling["max_replicas"])
    keep = max(up, down)
    state.recommendations = [[t, n] for t, n in history if t > at - keep] + [[at, raw]]
    state.metric, state.desired, state.note, state.decided_at = per_replica, desired, "", now
    decision = {"metric": metric, "metric_per_replica": per_replica, "target": target, "current": current,
                "recommended": raw, "desired": desired}
    if desired > current:
        _scale_up(state, job, desired - current, now, decision)
    else:
        state.refusal = {}
        if desired < current:
            release_replicas(job.pk, now, decision)
    state.save()
    job.refresh_from_db(fields=["replicas"])
    if job.replicas != current:
        apply_replicas(backend, JobAttempt.objects.select_related("job", "cluster").get(pk=attempt.pk), job.replicas)
    return {**decision, "job": job.pk, "replicas": job.replicas, "note": ""}


def follow_node_losses(job: Job, backend: Backend, now: dt.datetime, *, autoscaled: bool) -> None:
    """Answer ``job``'s replicas lost with their node (``serving.replacement.replace_lost``; retried at every
    pass for a job without autoscaling, the autoscaler's own rule going on for one with it), make the runner
    follow the booking when it changed or the runner's state does not show the booking's replica indexes yet
    (``apply_replicas``; a call that failed is made again at the next pass) and keep a refusal as a scale-up's
    (``_refused``). ``job.replicas`` and its current attempt are refreshed."""
    before = job.replicas
    released, refusal = replace_lost(job, now, retry=not autoscaled)
    job.refresh_from_db(fields=["replicas"])
    job.current_attempt.refresh_from_db(fields=["placement", "runner_state"])
    slots = (job.current_attempt.placement or {}).get("slots")
    behind = slots is not None and (job.current_attempt.runner_state or {}).get("slots") != slots
    if released or job.replicas != before or behind:  # ``behind``: a runner call that failed at an earlier pass
        job.current_attempt.refresh_from_db()
        apply_replicas(backend, JobAttempt.objects.select_related("job", "cluster").get(pk=job.current_attempt_id),
                       job.replicas)
        job.current_attempt.refresh_from_db(fields=["runner_state"])
    if released or refusal is not None or job.replicas != before:
        state, _ = ServingScale.objects.get_or_create(job=job)
        state.refusal = {} if refusal is None else state.refusal
        if refusal is not None:
            _refused(state, job, refusal, {"desired": job.replicas + 1, "replacement": True}, now)
        state.save(update_fields=["refusal"])


def _from_zero(state: ServingScale, job: Job, backend: Backend, attempt: JobAttempt, now: dt.datetime, *,
               asked: bool, metric: str, target: float) -> dict:
    """A job scaled to zero: one replica admitted when a request came (``asked``: one in flight, held by the
    endpoint, or received since the last reading), as KEDA activates a scaled object from zero on any load above
    its activation threshold of 0 (KEDA documentation, "Scaling Deployments", activation); else it stays at zero.
    A refusal is handed to the endpoint, which answers the held requests 503 with it."""
    desired = 1 if asked else 0
    decision = {"metric": metric, "metric_per_replica": None, "target": target, "current": 0, "recommended": desired,
                "desired": desired}
    state.metric, state.desired, state.note, state.decided_at = None, desired, "", now
    state.recommendations = [*(state.recommendations or ()), [now.timestamp(), desired]][-50:]
    if asked:
        _scale_up(state, job, 1, now, decision)
    else:
        state.refusal = {}
    state.save()
    job.refresh_from_db(fields=["replicas"])
    refusal = state.refusal if asked and not job.replicas else {}
    words = f"{refusal['reason']}: {refusal['message']}" if refusal else ""
    apply_replicas(backend, JobAttempt.objects.select_related("job", "cluster").get(pk=attempt.pk), job.replicas,
                   refusal=words)
    return {**decision, "job": job.pk, "replicas": job.replicas, "note": words}


def _scale_up(state: ServingScale, job: Job, count: int, now: dt.datetime, decision: dict) -> None:
    """Admit up to ``count`` replicas one by one; the first refusal stops, is kept on ``state`` and, when its reason
    or message is new, written as a ``scale_refused`` event."""
    for _ in range(count):
        verdict = add_replica(job.pk, now, decision)
        if verdict is None:
            state.refusal = {}
            continue
        _refused(state, job, verdict, decision, now)
        return


def _refused(state: ServingScale, job: Job, verdict, decision: dict, now: dt.datetime) -> None:
    """Keep ``verdict`` (a refused scale-up or replacement) on ``state`` (not saved) and, when its reason or
    message is new, write it as a ``scale_refused`` event."""
    refusal = {**{k: v for k, v in verdict.detail.items() if _plain(v)}, "reason": verdict.reason,
               "message": verdict.message, "desired": decision["desired"],
               "replicas": Job.objects.values_list("replicas", flat=True).get(pk=job.pk)}
    known = state.refusal or {}
    if (known.get("reason"), known.get("message")) != (verdict.reason, verdict.message):
        JobEvent.objects.create(job=job, kind="scale_refused", from_state=job.state, to_state=job.state,
                                reason=f"scale-up to {decision['desired']} replicas refused: {verdict.message}"[:500],
                                data={**decision, **refusal})
    state.refusal = {**refusal, "at": now.isoformat()}


def _plain(value) -> bool:
    """Whether ``value`` can be kept in JSON as it is."""
    return isinstance(value, (str, int, float, bool)) or value is None


def _noted(state: ServingScale, job: Job, note: str) -> dict:
    """Keep ``note`` (why the pass could not decide) on ``state``; the job's result dict."""
    state.note = note
    state.save()
    return {"job": job.pk, "replicas": job.replicas, "desired": state.desired, "note": note}


def apply_replicas(backend: Backend, attempt: JobAttempt, replicas: int, refusal: str = "") -> bool:
    """Make the cluster run ``replicas`` replicas of ``attempt`` (``Backend.scale``; at zero, with ``refusal``: why
    the replica a held request asked for was refused, "" for none) and keep its new runner state; True when done.
    A refusal of the runner is logged; the next pass tries again."""
    try:
        runner_state = (backend.scale(attempt, replicas, refusal=refusal) if replicas == 0 else
                        backend.scale(attempt, replicas))
    except (TransientDispatchError, PermanentDispatchError) as exc:
        log.warning("scaling %s to %s replicas failed: %s", attempt.object_name, replicas, exc)
        return False
    with transaction.atomic():
        JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(runner_state=runner_state)
    return True
