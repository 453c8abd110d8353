"""The simulation's invariants: each a function ``check(world) -> list of messages`` with a name, computed from
what the emulated clusters and the users saw, not from the platform's own view of itself where that can be
avoided.

``STEP`` holds the invariants checked after every step, ``END`` those checked once the faults stopped and the
platform settled. A violation is ``(name, message)``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from decimal import Decimal

from django.conf import settings
from django.db.models import Q

ATTEMPT_LABEL, JOB_LABEL = "controlplane.io/attempt", "controlplane.io/job"
UID_LABEL = "controlplane.io/attempt-uid"
REPLICA_LABEL = "controlplane.io/replica"


def attempt_of(labels: dict):
    """The attempt whose objects carry ``labels``: by its uid (ids are handed out again after a restore), else its id."""
    from jobs.models import JobAttempt

    if labels.get(UID_LABEL):
        return JobAttempt.objects.filter(uid=labels[UID_LABEL]).first()
    return JobAttempt.objects.filter(pk=int(labels.get(ATTEMPT_LABEL) or 0)).first()
def slot_released(attempt, replica: str | None, moment: dt.datetime) -> bool:
    """Whether serving ``attempt`` gave back the slot of replica index ``replica`` (a ``replica_slot_released``
    event that released it, ``serving.replacement``) at or before ``moment``."""
    from jobs.models import JobEvent

    return replica is not None and replica.isdigit() and JobEvent.objects.filter(
        attempt=attempt, kind="replica_slot_released", created_at__lte=moment, data__slot=int(replica),
        data__released=True).exists()


def held_gpus(attempt) -> tuple[int, int]:
    """The fewest and the most GPUs ``attempt`` held over its life: its ``gpus`` now, and for a serving attempt
    that gave back slots of replicas lost with their node, what it held before each and after each
    (``replica_slot_released``: ``replicas_before`` and ``replicas``, one replica = nodes x GPUs per node)."""
    from jobs.models import JobEvent

    per = attempt.job.nodes * attempt.job.gpus_per_node
    counts = [attempt.gpus]
    for data in JobEvent.objects.filter(attempt=attempt, kind="replica_slot_released",
                                        data__released=True).values_list("data", flat=True):
        counts += [int(data["replicas_before"]) * per, int(data["replicas"]) * per]
    return min(counts), max(counts)


#: Seconds of slack on the dispatch deadline: the release runs in a reconcile pass, one beat interval later at
#: most, and the world's clock moves in steps of up to 5 s.
DEADLINE_SLACK_SECONDS = 30.0
#: Seconds of the attempt's pods' time, per GPU, the ledger may lie above the pods' real span or (beside one
#: reconcile interval) below the part of it the platform was shown (``billed_once``, ``billing_violation``).
BILLING_TOLERANCE_SECONDS = Decimal("1")


def no_task_crash(world) -> list[str]:
    """No task delivered to the worker raised (a retry is not a crash): a crash aborts a pass for everyone."""
    out = [f"{d.message.label()} raised: {d.error.strip().splitlines()[-1]}" for d in world.worker.errors]
    world.worker.errors.clear()
    return out


def api_always_answers(world) -> list[str]:
    """Every request a user made was answered without a server error, and a job that exists is never a 404."""
    out, world.api_errors = list(world.api_errors), []
    return out


def usage_within_reach(world) -> list[str]:
    """A team's live GPUs never exceed its nominal quota plus its borrowing limit, a cohort's never its teams'
    nominal quotas together (Kueue's ClusterQueue and cohort accounting)."""
    from jobs.models import JobAttempt
    from quotas.models import Quota

    used: dict[int, int] = defaultdict(int)
    for team_id, gpus in JobAttempt.objects.filter(ended_at__isnull=True).values_list("job__team_id", "gpus"):
        used[team_id] += gpus
    out, cohort_used, cohort_nominal = [], 0, 0
    for q in Quota.objects.filter(cluster__isnull=True, accelerator__name="H100-80GB"):
        cohort_used += used.get(q.team_id, 0)
        cohort_nominal += q.nominal_gpus
        if used.get(q.team_id, 0) > q.nominal_gpus + q.borrowing_limit_gpus and not world.quota_lowered(q.team_id):
            out.append(f"team {q.team_id} holds {used[q.team_id]} GPUs, above nominal {q.nominal_gpus} + borrowing "
                       f"{q.borrowing_limit_gpus}")
    if cohort_used > cohort_nominal and not world.quota_lowered(None):
        out.append(f"the cohort holds {cohort_used} GPUs, above its teams' nominal {cohort_nominal}")
    return out


def no_healthy_pod_deleted(world) -> list[str]:
    """The platform deleted no object of an attempt that was neither ended nor being cancelled at that moment."""
    from jobs.models import JobEvent, JobState

    out = []
    for name, emulator in world.emulators.items():
        seen = world.deletions_checked.get(name, 0)
        new = emulator.deletions[seen:]
        world.deletions_checked[name] = len(emulator.deletions)
        for at, kind, obj, labels in new:
            attempt = attempt_of(labels)
            if attempt is None:
                continue
            moment = dt.datetime.fromtimestamp(at, dt.UTC)
            if kind == "Deployment" and slot_released(attempt, labels.get(REPLICA_LABEL), moment):
                continue  # a serving replica lost with its node: its slot given back first (docs/adr/0041)
            ended = attempt.ended_at is not None and attempt.ended_at <= moment
            ending = JobEvent.objects.filter(job_id=attempt.job_id, created_at__lte=moment, attempt=attempt,
                                             to_state__in=[JobState.RECOVERING, JobState.FAILED, JobState.CANCELLED,
                                                           JobState.SUCCEEDED]).exists()
            cancelling = JobEvent.objects.filter(job_id=attempt.job_id, to_state=JobState.CANCELLING,
                                                 created_at__lte=moment).exists()
            if not (ended or ending or cancelling):
                out.append(f"{kind} {obj} of live attempt {attempt.pk} (job {attempt.job_id}) deleted on {name}")
    return out


def bounded_preemption_before_run(world) -> list[str]:
    """No job is preempted more than ``PREEMPTION_BEFORE_RUN_LIMIT`` times before one of its attempts first ran
    (reached RUNNING, as its events record): a borrower is not admitted and reclaimed for ever."""
    from jobs.models import JobAttempt, JobEvent, JobState

    first_run: dict[int, int] = {}
    for job_id, attempt_id in (JobEvent.objects.filter(to_state=JobState.RUNNING, attempt__isnull=False)
                               .order_by("attempt_id").values_list("job_id", "attempt_id")):
        first_run.setdefault(job_id, attempt_id)
    counts: dict[int, int] = defaultdict(int)
    for job_id, attempt_id in JobAttempt.objects.filter(end_reason=JobAttempt.EndReason.PREEMPTED).values_list(
            "job_id", "pk"):
        if attempt_id < first_run.get(job_id, attempt_id + 1):
            counts[job_id] += 1
    bound = settings.PREEMPTION_BEFORE_RUN_LIMIT
    return [f"job {j} preempted {n} times before it first ran (bound {bound})" for j, n in counts.items() if n > bound]


def dispatch_deadline(world) -> list[str]:
    """No attempt stays admitted without objects longer than ``DISPATCH_DEADLINE_SECONDS`` of control-plane time."""
    from jobs.models import JobAttempt

    now = world.clock.now()
    limit = dt.timedelta(seconds=settings.DISPATCH_DEADLINE_SECONDS + DEADLINE_SLACK_SECONDS)
    out = []
    for attempt in JobAttempt.objects.filter(ended_at__isnull=True, started_at__isnull=True,
                                             runner_state={}).only("pk", "job_id", "created_at"):
        if now - attempt.created_at > limit + world.control_plane_downtime_since(attempt.created_at):
            out.append(f"attempt {attempt.pk} of job {attempt.job_id} admitted {now - attempt.created_at} ago "
                       f"and never dispatched")
    return out


def loss_counted_by_cause(world) -> list[str]:
    """A job fails for used retries only when more than ``max_retries`` of its attempts failed by its own or its
    node's fault: a preemption, a spot reclaim, an attempt never dispatched or unschedulable costs no retry."""
    from jobs.models import Job, JobAttempt, JobState

    free = {JobAttempt.EndReason.PREEMPTED, JobAttempt.EndReason.NOT_DISPATCHED, JobAttempt.EndReason.UNSCHEDULABLE,
            JobAttempt.EndReason.NODE_UNHEALTHY, JobAttempt.EndReason.SPOT_RECLAIMED}
    out = []
    for job in Job.objects.filter(state=JobState.FAILED, state_reason__contains="retries used"):
        counted = 0
        for attempt in job.attempts.all():
            nodes = set((attempt.placement or {}).get("nodes") or [])
            if attempt.end_reason in free or nodes & world.reclaimed_nodes:
                continue
            counted += 1
        if counted <= job.max_retries:
            out.append(f"job {job.pk} FAILED with its retries used, but only {counted} of its attempts failed by "
                       f"its own fault (max_retries {job.max_retries}): {job.state_reason}")
    return out


def lost_on_watched_time(world) -> list[str]:
    """A cluster is judged lost only on time the control plane watched it fail: an attempt recovered because its
    cluster was unreachable ended at least ``CLUSTER_LOST_GRACE_SECONDS`` after the end of the control plane's
    last outage longer than ``CLUSTER_LOST_OBSERVED_GAP_SECONDS`` (an outage of the control plane is no verdict
    on a cluster, and the healthy pods of such a verdict would be deleted as orphans)."""
    from jobs.models import JobAttempt

    grace = dt.timedelta(seconds=settings.CLUSTER_LOST_GRACE_SECONDS)
    gap = dt.timedelta(seconds=getattr(settings, "CLUSTER_LOST_OBSERVED_GAP_SECONDS", 0))
    out = []
    for pk, job_id, ended, message in JobAttempt.objects.filter(
            end_reason=JobAttempt.EndReason.NODE_LOST, message__contains="unreachable").values_list(
            "pk", "job_id", "ended_at", "message"):
        back = [end for start, end in world.outages if end - start > gap and end <= ended]
        if back and ended - max(back) < grace:
            out.append(f"attempt {pk} (job {job_id}) recovered as lost {ended - max(back)} after the control plane "
                       f"came back: {message[:160]}")
    return out


def accepted_is_placeable(world) -> list[str]:
    """A job the API accepted (201) is never called never-placeable while the fleet is as it was built: admission
    and placement use one rule (a node lost, a cluster or node not healthy, may make it so for a while: such
    moments are left out)."""
    from jobs.models import Job
    from runners.models import Cluster, Node

    if world.disturbed or Cluster.objects.exclude(health=Cluster.Health.HEALTHY).exists() or Node.objects.filter(
            Q(unschedulable=True) | ~Q(health=Node.Health.HEALTHY) | ~Q(taints=[])).exists():
        return []  # the fleet is not as built: a job may wait for it to come back
    return [f"job {pk} was accepted but waits as never placeable: {(info or {}).get('message', '')[:200]}"
            for pk, info in Job.objects.filter(pk__in=world.submitted).values_list("pk", "queue_info")
            if (info or {}).get("never_placeable")]


def recovery_avoids_reclaimed(world) -> list[str]:
    """After a spot reclaim on cluster C, the job's next attempt within ``SPOT_RECLAIM_AVOID_SECONDS`` is not on C
    while another cluster could take it: one that never lost a node or its API server in the scenario, with nodes
    of enough GPUs, and no live attempt at the moment the next attempt was made."""
    from jobs.models import JobAttempt

    window = dt.timedelta(seconds=settings.SPOT_RECLAIM_AVOID_SECONDS)
    if not JobAttempt.objects.filter(end_reason=JobAttempt.EndReason.SPOT_RECLAIMED).exists():
        return []  # no spot reclaim yet: no attempt to follow one (one narrow read instead of every attempt)
    attempts = list(JobAttempt.objects.select_related("cluster", "job").order_by("job_id", "number"))
    out = []
    for before, after in zip(attempts, attempts[1:], strict=False):
        if (before.job_id != after.job_id or before.end_reason != JobAttempt.EndReason.SPOT_RECLAIMED
                or after.cluster_id != before.cluster_id or before.ended_at is None
                or after.created_at - before.ended_at > window):
            continue
        job = after.job
        for c in world.config.clusters:
            if c.name == before.cluster.name or c.name in world.disturbed or c.gpus_per_node < job.gpus_per_node \
                    or c.nodes < job.nodes or (c.capacity == "spot" and not job.preemptible):
                continue
            busy = any(a.cluster.name == c.name and a.created_at <= after.created_at
                       and (a.ended_at is None or a.ended_at > after.created_at) for a in attempts)
            if not busy:
                out.append(f"job {job.pk}: attempt {after.number} placed on {before.cluster.name} "
                           f"{after.created_at - before.ended_at} after its spot reclaim there, while {c.name} was free")
                break
    return out


STEP = {f.__name__: f for f in (no_task_crash, api_always_answers, usage_within_reach, no_healthy_pod_deleted,
                                bounded_preemption_before_run, dispatch_deadline, loss_counted_by_cause,
                                lost_on_watched_time, accepted_is_placeable, recovery_avoids_reclaimed)}


def liveness(world) -> list[str]:
    """Once faults stop and the platform settled, every job is final: training jobs end, inference jobs were
    cancelled. Only a job that the fleet as it is now can never hold may wait, and only where the fleet shrank (a
    node lost for good): it waits for the fleet to change, with that reason (``accepted_is_placeable``)."""
    from jobs.models import FINAL_STATES, Job

    return [f"job {j.pk} still {j.state} after the settling time: {j.state_reason or (j.queue_info or {}).get('message', '')}"
            for j in Job.objects.exclude(state__in=FINAL_STATES)
            if not (world.disturbed and (j.queue_info or {}).get("never_placeable"))]


@dataclasses.dataclass(frozen=True)
class PodHold:
    """One pod of an attempt as its cluster saw it (virtual epoch seconds): ``created``; ``stopped``, when it
    stopped holding its GPUs for real; ``shown_until``, the latest instant the answers given to the platform
    evidenced it holding them (a look that listed it not finished, its own finish read, its owner's deletion
    accepted or read; ``ClusterEmulator.pod_shown``), None when no answer ever showed it."""

    created: float
    stopped: float
    shown_until: float | None


def billing_violation(gpus: int, billed: Decimal, pods: list[PodHold], *, limit: float | None,
                      look: float, fewest_gpus: int | None = None) -> str | None:
    """Whether ``billed`` GPU-seconds of an attempt of ``gpus`` GPUs are out of what its ``pods`` allow (None:
    within; else why). The attempt holds its GPUs from its first pod's creation to its last pod's stop (a gang's
    nodes are held as one until the attempt ends, docs/design.md "Cost ledger"), at most ``limit`` seconds (the
    job's max runtime, None: none):

    - never more than that, plus ``BILLING_TOLERANCE_SECONDS`` per GPU (over-billing is never allowed);
    - never less than the part of it the platform was shown: from the first creation to the latest
      ``shown_until`` (capped at each pod's stop), minus that tolerance and ``look`` seconds (one reconcile
      interval: a look's time is its pass's, and pods that vanish between two looks are billed up to the last
      one) per GPU. Time after the last evidence the platform was given (pods running out a termination grace
      while the control plane is down or the cluster cannot be reached, then gone) is not billed
      (docs/adr/0021, docs/adr/0028), so it is not required either.

    ``gpus`` is the most the attempt held; ``fewest_gpus`` (None: ``gpus``) the fewest, which the lower bound
    counts: a serving attempt that gave back a lost replica's slot held fewer GPUs for a while.
    """
    least = gpus if fewest_gpus is None else fewest_gpus
    first = min((p.created for p in pods), default=0.0)
    last = max((p.stopped for p in pods), default=first)
    shown = max((min(p.shown_until, p.stopped) for p in pods if p.shown_until is not None), default=first)
    cap = limit if limit is not None else float("inf")
    held = Decimal(gpus) * Decimal(str(round(min(last - first, cap), 6)))
    seen = Decimal(least) * Decimal(str(round(max(0.0, min(shown - first, cap)), 6)))
    slack = BILLING_TOLERANCE_SECONDS * max(gpus, 1)
    if billed > held + slack:
        return f"over-billed: its pods held {held:.1f} GPU-s, the ledger {billed:.1f}"
    if billed < seen - slack - Decimal(str(look)) * max(gpus, 1):
        return (f"under-billed: the platform was shown {seen:.1f} GPU-s of its pods' {held:.1f}, the ledger "
                f"{billed:.1f}")
    return None


def billed_once(world) -> list[str]:
    """Every pod-second of a GPU-holding pod the platform was shown is billed once, to its attempt, and nothing
    past the pods' end: per attempt, the ledger's GPU-seconds lie within ``[shown - tolerance - one reconcile
    interval, held + tolerance]`` (``billing_violation``), where ``held`` is the attempt's GPUs times the span
    its pods really held them (first created to last stopped, at most the job's max runtime) and ``shown`` the
    part of that span up to the latest instant the clusters' answers to the platform evidenced them holding
    (``ClusterEmulator.pod_shown``), tolerance ``BILLING_TOLERANCE_SECONDS`` per GPU. Under-billing is allowed
    only by time the platform was never shown; over-billing never."""
    from costs.models import CostEntry
    from jobs.models import JobAttempt

    ledger: dict[int, Decimal] = defaultdict(Decimal)
    for attempt_id, milli, start, end in CostEntry.objects.values_list("attempt_id", "gpu_milli", "interval_start",
                                                                       "interval_end"):
        ledger[attempt_id] += Decimal(milli) / 1000 * Decimal(str((end - start).total_seconds()))
    pods: dict[int, list[PodHold]] = defaultdict(list)
    by_uid = {str(uid): pk for pk, uid in JobAttempt.objects.values_list("pk", "uid")}
    for emulator in world.emulators.values():
        for uid, (_gpus, labels, created, stopped) in emulator.pod_times.items():
            if stopped is None:
                continue
            attempt_id = by_uid.get(labels.get(UID_LABEL) or "") or int(labels[ATTEMPT_LABEL])
            evidence = [t for t in emulator.pod_shown.get(uid, ()) if t is not None]
            pods[attempt_id].append(PodHold(created, stopped, max(evidence) if evidence else None))
    look = float(settings.CELERY_BEAT_SCHEDULE["reconcile"]["schedule"])
    out = []
    for attempt in JobAttempt.objects.select_related("job"):
        # Billing stops at the job's max runtime, which every runner enforces (docs/design.md, Cost ledger): the
        # span counts up to it.
        limit = attempt.job.max_runtime_seconds
        fewest, most = held_gpus(attempt) if attempt.job.kind == "inference" else (attempt.gpus, attempt.gpus)
        why = billing_violation(most, ledger.get(attempt.pk, Decimal(0)), pods.get(attempt.pk, []),
                                limit=limit, look=look, fewest_gpus=fewest)
        if why:
            out.append(f"attempt {attempt.pk} (job {attempt.job_id}, {attempt.end_reason or 'live'}) {why}")
    return out


def no_duplicate_run(world) -> list[str]:
    """No job ever had more pods alive at once than its nodes x replicas (it never ran twice)."""
    from jobs.models import Job, JobEvent

    shape = {j.pk: j.nodes * j.replicas for j in Job.objects.all()}
    for job_id, data in JobEvent.objects.filter(kind="replica_slot_released", data__released=True).values_list(
            "job_id", "data"):  # a serving job that gave back a lost replica's slot had more replicas before
        shape[job_id] = max(shape.get(job_id, 1), int(data["replicas_before"]) * Job.objects.get(pk=job_id).nodes)
    pods: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for emulator in world.emulators.values():
        for _gpus, labels, created, stopped in emulator.pod_times.values():
            job = int(labels[JOB_LABEL])
            pods[job] += [(created, 1), (stopped if stopped is not None else float("inf"), -1)]
    out = []
    for job, edges in pods.items():
        alive = peak = 0
        for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
            alive += step
            peak = max(peak, alive)
        if peak > shape.get(job, 1):
            out.append(f"job {job} had {peak} pods alive at once, more than its {shape.get(job)}")
    return out


def _element_pods(world) -> dict[int, dict[int, list[tuple[int, float, float]]]]:
    """``{array id: {index: [(job id, created, stopped), ...]}}``: every pod the clusters ran for an element of a
    job array (virtual epoch seconds, ``inf`` while it runs), the element told by the pods' own environment
    (``World.elements``), not by the database's rows (a restore may have lost or rebuilt them)."""
    out: dict[int, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for emulator in world.emulators.values():
        for _gpus, labels, created, stopped in emulator.pod_times.values():
            if labels.get(JOB_LABEL) in world.elements:
                array, index = world.elements[labels[JOB_LABEL]]
                out[array][index].append((int(labels[JOB_LABEL]), created,
                                          stopped if stopped is not None else float("inf")))
    return out


def array_element_once(world) -> list[str]:
    """Each element of a job array is one job: no index has two rows, and no index's pods belong to two jobs."""
    from django.db.models import Count

    from jobs.models import Job

    out = [f"element {r['array_index']} of array {r['array_id']} has {r['n']} jobs"
           for r in Job.objects.filter(array__isnull=False).values("array_id", "array_index")
           .annotate(n=Count("id")).filter(n__gt=1)]
    for array, indices in _element_pods(world).items():
        for index, pods in indices.items():
            jobs = sorted({job for job, _, _ in pods})
            if len(jobs) > 1:
                out.append(f"element {index} of array {array} ran as jobs {jobs}")
    return out


def array_within_parallelism(world) -> list[str]:
    """A job array never has more elements with pods alive at once than its parallelism (the clusters' own
    times: a pod counts from its creation to its stop)."""
    from jobs.models import JobArray

    limits = dict(JobArray.objects.values_list("pk", "parallelism"))
    out = []
    for array, indices in _element_pods(world).items():
        spans = defaultdict(lambda: [float("inf"), 0.0])  # element -> its pods' first creation and last stop
        for index, pods in indices.items():
            for _job, created, stopped in pods:
                spans[index][0] = min(spans[index][0], created)
                spans[index][1] = max(spans[index][1], stopped)
        edges = sorted([(lo, 1) for lo, _ in spans.values()] + [(hi, -1) for _, hi in spans.values()],
                       key=lambda e: (e[0], e[1]))
        alive = peak = 0
        for _, step in edges:
            alive += step
            peak = max(peak, alive)
        if array in limits and peak > limits[array]:
            out.append(f"array {array} had {peak} elements running at once, more than its parallelism "
                       f"{limits[array]}")
    return out


def array_completes(world) -> list[str]:
    """Once settled, every job array is done: all its elements made and final, or it was cancelled and none of
    its elements is live."""
    from jobs.models import FINAL_STATES, Job, JobArray

    out = []
    for array in JobArray.objects.all():
        rows = list(Job.objects.filter(array=array).values_list("state", flat=True))
        live = [state for state in rows if state not in FINAL_STATES]
        if live:
            out.append(f"array {array.pk} still has {len(live)} live elements")
        elif array.state != JobArray.State.CANCELLED and len(rows) < array.count:
            out.append(f"array {array.pk} made {len(rows)} of its {array.count} elements and stopped")
    return out


def nothing_left_behind(world) -> list[str]:
    """Once settled, no cluster holds a pod, Job or Deployment of the platform's (every job is final)."""
    out = []
    for name, emulator in world.emulators.items():
        left = [p["metadata"]["name"] for p in emulator.pods()] + [
            o["metadata"]["name"] for kind in ("Job", "Deployment") for o in emulator.objects(kind)]
        if left:
            out.append(f"{name} still holds {', '.join(sorted(left)[:4])}")
    return out


def unknown_cost_shown(world) -> list[str]:
    """No money figure is 0 where the price is unknown: a job with GPU-hours of unknown cost in the ledger says so
    in its API answer (``cost_unknown``), not only a dollar figure."""
    from costs.models import CostEntry

    out = []
    for job_id in sorted(set(CostEntry.objects.filter(usd_per_gpu_hour__isnull=True).values_list("job_id", flat=True))):
        r = world.client.get(f"/api/v1/jobs/{job_id}/")
        if r.status_code == 200 and not r.json().get("cost_unknown"):
            out.append(f"job {job_id} has GPU-hours of unknown cost but its answer shows only "
                       f"${r.json().get('accrued_cost_usd')}")
    return out


def notified_once(world) -> list[str]:
    """Every job event team a's subscription asked for (all of them) has its notification and it was sent: none
    missed by the fan-out under duplicate, late and lost task deliveries, worker kills, outages and restores, and
    each one marked sent is in the mail outbox under its delivery id. (A second notification of one event cannot
    exist: the unique key.)"""
    from collections import Counter

    from django.core import mail

    from jobs.models import JobEvent
    from notifications.fanout import job_event_kind
    from notifications.models import Notification

    sub = world.subscription
    if sub is None:
        return []
    made = {n.source_id: n for n in Notification.objects.filter(subscription=sub, source="job_event")}
    mailed = Counter(m.extra_headers.get("X-Controlplane-Delivery") for m in getattr(mail, "outbox", []))
    out = []
    for event in JobEvent.objects.filter(job__team=sub.team_id).select_related("attempt").order_by("id"):
        kind = job_event_kind(event)
        if kind is None or kind not in sub.events:
            continue
        note = made.get(event.pk)
        if note is None:
            out.append(f"event {event.pk} ({kind}) of job {event.job_id} was never notified")
        elif note.status != Notification.Status.SENT:
            out.append(f"notification {note.pk} of event {event.pk} ({kind}) is {note.status}: {note.last_error}")
        elif not mailed[str(note.uid)]:
            out.append(f"notification {note.pk} of event {event.pk} is marked sent but no mail carries it")
    return out


def billed_past_end_explained(world) -> list[str]:
    """A job billed past its end says why on its timeline: an attempt whose end lies ``EXPLAINED_AFTER`` (1 s) or
    more after the event that ended it (its end moved later on the cluster's evidence) has a ``billed_past_end`` event to exactly that end, and a
    cancelled attempt billed past the cancel's request says until when on its CANCELLED line. An attempt that
    never started (no objects ever created: ``started_at`` unset) is billed nothing, whatever its end says: the
    ledger accrues from the start."""
    from jobs.lifecycle import EXPLAINED_AFTER
    from jobs.models import JobAttempt, JobEvent, JobState

    out = []
    for attempt in JobAttempt.objects.filter(ended_at__isnull=False, started_at__isnull=False):
        events = list(JobEvent.objects.filter(attempt_id=attempt.pk).order_by("created_at", "id"))
        ending = next((e for e in events if e.kind == "state" and "end_reason" in (e.data or {})), None)
        if ending is None:
            continue
        if attempt.ended_at >= ending.created_at + EXPLAINED_AFTER:
            moved = [e for e in events if e.kind == "billed_past_end"]
            if not moved or moved[-1].data.get("to") != attempt.ended_at.isoformat():
                out.append(f"attempt {attempt.pk} (job {attempt.job_id}) ends at {attempt.ended_at:%H:%M:%S}, after "
                           f"the event that ended it ({ending.created_at:%H:%M:%S}), with no billed_past_end to it")
        if ending.to_state == JobState.CANCELLED:
            asked = (JobEvent.objects.filter(job_id=attempt.job_id, to_state=JobState.CANCELLING,
                                             created_at__lte=ending.created_at)
                     .exclude(from_state=JobState.CANCELLING).order_by("-created_at").first())
            later = [e for e in events if e.kind == "billed_past_end" and e.created_at >= ending.created_at]
            billed_to = dt.datetime.fromisoformat(later[0].data["from"]) if later else attempt.ended_at
            if asked is not None and billed_to >= asked.created_at + EXPLAINED_AFTER and "billed until" not in ending.reason:
                out.append(f"job {attempt.job_id}'s cancel, asked at {asked.created_at:%H:%M:%S}, was billed to "
                           f"{billed_to:%H:%M:%S} with no word on its CANCELLED line")
    return out


END = {f.__name__: f for f in (liveness, billed_once, no_duplicate_run, nothing_left_behind, unknown_cost_shown,
                               notified_once, billed_past_end_explained, array_element_once,
                               array_within_parallelism, array_completes)}

#: Every invariant's name, in report order.
NAMES = [*STEP, *END]
