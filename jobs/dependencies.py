"""Pipelines: a job that waits for other jobs of its team to end as it asks (docs/adr/0037).

A submission's ``after`` lists ``{"job": id or name, "condition": "succeeded" | "ended" | "failed"}``; each entry is
a :class:`~jobs.models.JobDependency` row from the new job to an existing job of its team (Slurm's
``--dependency=afterok|afterany|afternotok``, Argo's ``depends``). The job is QUEUED from the start, but the
scheduler's snapshot leaves it out while any of its conditions does not hold (:func:`unmet_dependency`, one NOT
EXISTS subquery), and its ``queue_info`` says what it waits for (reason ``dependency``).

When an upstream job reaches a final state, :func:`settle` (called by ``jobs.states`` in the transaction of that
transition, whichever path ended it: an attempt's end, a cancel, recovery, reconcile, a rejection) finds its QUEUED
dependents: those whose condition can no longer hold are REJECTED with a reason naming the upstream and how it
ended (and that rejection settles their own dependents in turn, down the chain); the others get their
``queue_info`` brought up to date. A condition once met stays met (final states are final), so the scheduler
reads the edges without locks.

A serving job may also *follow* a training job (``spec.follow``, docs/adr/0041-autoscaled-serving.md): it serves
the newest SUCCEEDED run of it and rolls out to each newer run that succeeds. That is no waiting edge (the serving job
runs meanwhile) and is kept in the spec, not here; :func:`followed_runs`, :func:`newest_run` and
:func:`follow_error` read and check it, and :func:`check_and_record` refuses a run that would wait, down its chain,
for a serving job that follows it (a cycle: the server waits for the run to succeed to roll out to it, the run for
the server to end).

This module reads and decides; ``jobs.states`` performs the transitions (it sits below nothing here).
"""

from __future__ import annotations

from django.db import connection
from django.db.models import Exists, OuterRef, Q

from .models import FINAL_STATES, Job, JobDependency, JobState

C = JobDependency.Condition

#: The final states of the upstream job that meet each condition.
MEETS: dict[str, frozenset[str]] = {
    C.SUCCEEDED: frozenset({JobState.SUCCEEDED}),
    C.ENDED: frozenset(FINAL_STATES),
    C.FAILED: frozenset(FINAL_STATES - {JobState.SUCCEEDED}),
}
#: How each condition reads after "waits for job 12 (train-gpt) ".
WAITS_FOR = {C.SUCCEEDED: "to succeed", C.ENDED: "to end", C.FAILED: "to fail"}
#: The most entries one ``after`` may list.
MAX_AFTER = 20


class DependencyRefused(Exception):
    """An ``after`` entry that cannot be recorded: ``path`` is its field (``after.<index>.job``), the message why."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


def holds(condition: str, state: str) -> bool:
    """Whether an upstream job in ``state`` meets ``condition``."""
    return state in MEETS[condition]


def never_holds(condition: str, state: str) -> bool:
    """Whether ``condition`` can no longer hold: the upstream is final in a state that does not meet it."""
    return state in FINAL_STATES and state not in MEETS[condition]


def _met() -> Q:
    """The JobDependency rows whose condition holds, as a filter on the row and its upstream's state."""
    return (Q(condition=C.SUCCEEDED, upstream__state__in=sorted(MEETS[C.SUCCEEDED]))
            | Q(condition=C.ENDED, upstream__state__in=sorted(MEETS[C.ENDED]))
            | Q(condition=C.FAILED, upstream__state__in=sorted(MEETS[C.FAILED])))


def unmet_dependency() -> Exists:
    """``EXISTS`` (on a Job queryset: ``OuterRef("pk")``) a dependency of the job whose condition does not hold yet:
    the scheduler's snapshot filters on its negation. Postgres runs it as an anti-join on the dependency table's
    ``job_id`` index, so a queue of jobs without dependencies pays one index probe per job."""
    return Exists(JobDependency.objects.filter(job_id=OuterRef("pk")).exclude(_met()))


def phrase(upstream_id: int, name: str, condition: str) -> str:
    """``job 12 (train-gpt) to succeed``."""
    return f"job {upstream_id} ({name}) {WAITS_FOR[condition]}"


def waiting_info(edges: list[tuple[int, str, str, str]]) -> dict:
    """The ``queue_info`` of a job waiting for its dependencies: ``{"reason": "dependency", "message": "waits for
    job 12 (train-gpt) to succeed", "waits_for": [{"job", "name", "condition", "state"}]}`` for the edges whose
    condition does not hold yet; ``{}`` when none. ``edges``: ``(upstream id, upstream name, condition, upstream
    state)`` in ``after`` order."""
    waiting = [e for e in edges if not holds(e[2], e[3])]
    if not waiting:
        return {}
    message = "waits for " + " and ".join(phrase(u, name, c) for u, name, c, _ in waiting)
    return {"reason": "dependency", "message": message,
            "waits_for": [{"job": u, "name": name, "condition": c, "state": s} for u, name, c, s in waiting]}


def never_reason(upstream_id: int, name: str, condition: str, state: str) -> str:
    """Why a dependent can never run: ``job 12 (train-gpt) ended FAILED; this job waited for it to succeed``."""
    return f"job {upstream_id} ({name}) ended {state}; this job waited for it {WAITS_FOR[condition]}"


def resolve(team, after: list[tuple[int | str, str]]) -> tuple[list[tuple[Job, str]], dict[str, list[str]]]:
    """The upstream jobs of a submission's ``after`` (``(reference, condition)`` pairs) for ``team``: ``([(Job,
    condition)], {})``, or ``([], errors by field path "after.<i>.job")``.

    A reference is a job id of the team, or a name: the team's most recent job of that name (by submission time).
    Another team's job reads as an unknown one (nothing reveals it exists). Refused: an unknown job, one listed
    twice, and one already final in a state its condition does not accept (it could never run). Reads only;
    :func:`check_and_record` re-reads the states under lock.
    """
    found: list[tuple[Job, str]] = []
    errors: dict[str, list[str]] = {}
    seen: dict[int, int] = {}
    jobs = Job.objects.filter(team=team).only("pk", "name", "state", "team_id")
    for index, (ref, condition) in enumerate(after):
        path = f"after.{index}.job"
        if isinstance(ref, int):
            job = jobs.filter(pk=ref).first()
            missing = f'no job {ref} in team "{team.slug}"'
        else:
            job = jobs.filter(name=ref).order_by("-created_at", "-id").first()
            missing = f'no job named "{ref}" in team "{team.slug}"; submit it first (or give its id)'
        if job is None:
            errors[path] = [missing]
            continue
        if job.pk in seen:
            errors[path] = [f"job {job.pk} ({job.name}) is already listed at after.{seen[job.pk]}"]
            continue
        seen[job.pk] = index
        if never_holds(condition, job.state):
            errors[path] = [f"job {job.pk} ({job.name}) already ended {job.state}, so the condition {condition} "
                            f"can never hold and this job could never run; resubmit job {job.pk} first, or choose "
                            f"another condition"]
            continue
        found.append((job, condition))
    return ([], errors) if errors else (found, {})


def upstream_closure(job_ids: list[int]) -> set[int]:
    """Every job that the jobs ``job_ids`` wait for, directly or down their chains (one recursive query)."""
    if not job_ids:
        return set()
    table = JobDependency._meta.db_table
    sql = (f'WITH RECURSIVE up(id) AS (SELECT upstream_id FROM "{table}" WHERE job_id = ANY(%s) '
           f'UNION SELECT d.upstream_id FROM "{table}" d JOIN up ON d.job_id = up.id) SELECT id FROM up')
    if connection.vendor != "postgresql":  # SQLite: the same walk, one query per level
        seen: set[int] = set()
        frontier = set(job_ids)
        while frontier:
            frontier = set(JobDependency.objects.filter(job_id__in=frontier).values_list("upstream_id", flat=True))
            frontier -= seen
            seen |= frontier
        return seen
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(job_ids)])
        return {row[0] for row in cursor.fetchall()}


def cycle_error(job: Job, upstreams: list[Job]) -> tuple[int, str] | None:
    """``(index in upstreams, reason)`` when making ``job`` wait for ``upstreams`` would close a cycle: one of them
    is the job itself, or waits for it (directly or down its chain); None otherwise."""
    for index, upstream in enumerate(upstreams):
        if upstream.pk == job.pk:
            return index, f"job {job.pk} ({job.name}) cannot depend on itself"
    above = upstream_closure([u.pk for u in upstreams])
    if job.pk in above:
        for index, upstream in enumerate(upstreams):
            if upstream.pk == job.pk or job.pk in upstream_closure([upstream.pk]):
                return index, (f"job {upstream.pk} ({upstream.name}) depends on job {job.pk} ({job.name}), "
                               f"directly or down its chain: waiting for it would be a cycle")
    return None


#: Arguments and environment variables through which a program is given a checkpoint location of its own (rather than
#: the job's checkpoint directory, env ``CHECKPOINT_DIR``, which is what a rollout points a replica at).
CHECKPOINT_ARGS = ("--checkpoint-dir", "--checkpoint-uri")
CHECKPOINT_ENV = ("CHECKPOINT_URI",)


def own_checkpoint_location(spec: dict) -> str | None:
    """The argument or environment variable through which the stored single-role ``spec`` names a checkpoint
    location of its own (:data:`CHECKPOINT_ARGS`, :data:`CHECKPOINT_ENV`), or None when it uses the job's checkpoint
    directory (``CHECKPOINT_DIR``)."""
    words = [*(spec.get("command") or ()), *(spec.get("args") or ())]
    named = next((w.split("=", 1)[0] for w in words if w.split("=", 1)[0] in CHECKPOINT_ARGS), None)
    return named or next((k for k in CHECKPOINT_ENV if k in (spec.get("env") or {})), None)


def followed_runs(team_id: int, ref: int | str):
    """The training jobs of team ``team_id`` that a ``spec.follow.job`` of ``ref`` follows, as a queryset: the job
    ``ref`` (an id), or every training job named ``ref`` (a name: each run of it, e.g. a nightly retraining
    resubmitted under one name)."""
    runs = Job.objects.filter(team_id=team_id, kind=Job.Kind.TRAINING)
    return runs.filter(pk=ref) if isinstance(ref, int) else runs.filter(name=ref)


def newest_run(team_id: int, ref: int | str) -> Job | None:
    """The newest SUCCEEDED run of ``ref`` (:func:`followed_runs`): the highest id, ids growing with submission
    time; None while none has succeeded."""
    return (followed_runs(team_id, ref).filter(state=JobState.SUCCEEDED).only("pk", "name", "spec", "team_id")
            .order_by("-pk").first())


def follow_error(team, ref: int | str, waits_for: list[Job],
                 start: int | None = None) -> tuple[int | None, str | None]:
    """Check a serving job's ``spec.follow.job`` ``ref`` for ``team``: ``(checkpoint job id, None)``, the run it
    starts from, or ``(None, reason)``.

    Refused: no job ``ref`` in the team (another team's reads as unknown), one that is not a training job (a
    checkpoint comes from a training job), one whose spec names its own checkpoint location
    (:func:`own_checkpoint_location`: nothing would be in its checkpoint directory to roll out), and a ``ref``
    none of whose runs has SUCCEEDED yet when the serving job names no checkpoint to start from (``start``, its
    ``checkpoint_from``) and waits for none of them (``waits_for``, its ``after`` jobs): its replicas would have no
    checkpoint to load. The run it starts from: the newest SUCCEEDED one, else ``start``, else the newest it waits
    for.
    """
    runs = followed_runs(team.pk, ref)
    latest = runs.only("pk", "name", "spec", "state").order_by("-pk").first()
    if latest is None:
        other = Job.objects.filter(team=team, **({"pk": ref} if isinstance(ref, int) else {"name": ref})).only(
            "pk", "kind").order_by("-pk").first()
        if other is not None:
            return None, (f"job {other.pk} is not a training job ({other.kind}); follow names a training job, whose runs write "
                          f"the checkpoints a serving job rolls out to")
        return None, (f'no job {ref} in team "{team.slug}"' if isinstance(ref, int) else
                      f'no training job named "{ref}" in team "{team.slug}"; submit it first (or give its id)')
    own = own_checkpoint_location(latest.spec or {})
    if own is not None:
        return None, (f"job {latest.pk} ({latest.name}) writes its checkpoint where its {own} says, not to its "
                      f"checkpoint directory (CHECKPOINT_DIR), so a run of it leaves nothing to roll out to")
    newest = newest_run(team.pk, ref)
    if newest is not None:
        return newest.pk, None
    if start is not None:
        return start, None
    waited = sorted((j.pk for j in waits_for if runs.filter(pk=j.pk).exists()), reverse=True)
    if waited:
        return waited[0], None
    if latest.state in FINAL_STATES:
        return None, (f"job {latest.pk} ({latest.name}) ended {latest.state} and no run of {ref} has SUCCEEDED, so "
                      f"the replicas would have no checkpoint to load; give checkpoint_from, or follow a run that "
                      f"will succeed")
    return None, (f"no run of {ref} has SUCCEEDED yet, so the replicas would have no checkpoint to load; wait for "
                  f"one (after: [{{job: {latest.pk}}}]) or give checkpoint_from")


def follow_cycle_error(job: Job, upstreams: list[Job]) -> tuple[int, str] | None:
    """``(index in upstreams, reason)`` when training job ``job`` waiting for ``upstreams`` would close a cycle
    through a follow: one of them, or a job down its chain (its ``after`` edges, and the runs each serving job on
    the way follows), is a serving job that follows ``job`` (by its name); None otherwise. One recursive query per
    serving job that follows something on the way."""
    if job.kind != Job.Kind.TRAINING:
        return None
    for index, upstream in enumerate(upstreams):
        seen: set[int] = set()
        frontier = {upstream.pk}
        while frontier:
            seen |= frontier
            reached = frontier | upstream_closure(sorted(frontier))
            seen |= reached
            frontier = set()
            for follower in (Job.objects.filter(pk__in=reached, kind=Job.Kind.INFERENCE, spec__has_key="follow")
                             .only("pk", "name", "spec", "team_id")):
                ref = (follower.spec.get("follow") or {}).get("job")
                if follower.team_id == job.team_id and ref == job.name:
                    return index, (f"job {follower.pk} ({follower.name}) follows the runs of {job.name} and job "
                                   f"{upstream.pk} ({upstream.name}) is it or waits for it: this run would wait "
                                   f"for a server that waits for this run to roll out to it (a cycle)")
                if ref is not None:
                    frontier |= set(followed_runs(follower.team_id, ref).values_list("pk", flat=True)) - seen
    return None


def check_and_record(job: Job, edges: list[tuple[Job, str]]) -> dict:
    """Record ``job``'s dependencies ``edges`` (``(upstream Job, condition)``, in ``after`` order) and return the
    ``queue_info`` it starts with. Call inside the transaction that stored ``job``.

    The upstream rows are locked (``FOR UPDATE``, in id order) and read again first: an upstream that reached a
    final state since validation and no longer meets its condition is refused like at validation, and one that
    ends after this commits waits for the lock, so its :func:`settle` sees these rows. Raises DependencyRefused
    (path ``after.<i>.job``) for a cycle (of ``after`` edges, or through a serving job that follows ``job``:
    :func:`follow_cycle_error`) or a condition that can no longer hold; the caller's transaction then
    rolls back.
    """
    ids = [u.pk for u, _ in edges]
    states = dict(Job.objects.select_for_update().filter(pk__in=ids).order_by("pk")
                  .values_list("pk", "state")) if ids else {}
    cycle = cycle_error(job, [u for u, _ in edges]) or follow_cycle_error(job, [u for u, _ in edges])
    if cycle is not None:
        raise DependencyRefused(f"after.{cycle[0]}.job", cycle[1])
    rows = []
    for index, (upstream, condition) in enumerate(edges):
        state = states.get(upstream.pk)
        if state is None:
            raise DependencyRefused(f"after.{index}.job", f"job {upstream.pk} no longer exists")
        upstream.state = state
        if never_holds(condition, state):
            raise DependencyRefused(f"after.{index}.job", f"job {upstream.pk} ({upstream.name}) already ended "
                                                          f"{state}, so the condition {condition} can never hold")
        rows.append(JobDependency(job_id=job.pk, upstream_id=upstream.pk, condition=condition, position=index))
    JobDependency.objects.bulk_create(rows)
    return waiting_info([(u.pk, u.name, c, u.state) for u, c in edges])


def settle(ended_ids: list[int]) -> tuple[list[tuple[Job, str, dict]], dict[int, dict]]:
    """What the end of the jobs ``ended_ids`` (now final) does to their QUEUED dependents: ``(rejections, infos)``.

    ``rejections``: ``(dependent Job, reason, event data)`` of each dependent one of whose conditions can no longer
    hold (the first such edge in ``after`` order is named); ``infos``: dependent id -> its new ``queue_info``
    (``{}`` once every condition holds) for the others. Two queries when there are dependents, one otherwise.
    """
    direct = set(JobDependency.objects.filter(upstream_id__in=ended_ids, job__state=JobState.QUEUED)
                 .values_list("job_id", flat=True))
    if not direct:
        return [], {}
    edges: dict[int, list[tuple[int, str, str, str]]] = {}
    jobs: dict[int, Job] = {}
    for dep in (JobDependency.objects.filter(job_id__in=direct, job__state=JobState.QUEUED)
                .select_related("job", "upstream").only("job_id", "upstream_id", "condition", "position",
                                                        "job__state", "job__name", "job__started_at",
                                                        "upstream__name", "upstream__state")
                .order_by("job_id", "position")):
        jobs[dep.job_id] = dep.job
        edges.setdefault(dep.job_id, []).append((dep.upstream_id, dep.upstream.name, dep.condition,
                                                 dep.upstream.state))
    rejections, infos = [], {}
    for job_id, its in edges.items():
        broken = next((e for e in its if never_holds(e[2], e[3])), None)
        if broken is not None:
            upstream_id, name, condition, state = broken
            rejections.append((jobs[job_id], never_reason(*broken),
                               {"reason": "dependency", "upstream": upstream_id, "upstream_state": state,
                                "condition": condition}))
        else:
            infos[job_id] = waiting_info(its)
    return rejections, infos


def edges_of(job: Job) -> list[dict]:
    """``job``'s ``after`` as the API shows it: ``[{"job", "name", "condition", "state", "met"}]`` in ``after``
    order (one query)."""
    return [{"job": d.upstream_id, "name": d.upstream.name, "condition": d.condition, "state": d.upstream.state,
             "met": holds(d.condition, d.upstream.state)}
            for d in job.dependencies.select_related("upstream").only(
                "upstream_id", "condition", "position", "job_id", "upstream__name", "upstream__state")
            .order_by("position")]
