"""The snapshot a pass decides on, read from the database without locks; and the one-job snapshots of a locked
re-check and of the submission preview.

A pass reads the waiting jobs (in admission order), every team with its
cohort, weight, quotas (all clusters), live and decayed usage and budgets in force, the
node pools of the accelerators asked for (``offers``) and the live attempts
of preemptible jobs. On PostgreSQL waiting rows are kept per process between
passes and read again only when their row version changed (``ROW_CACHE``,
emptied by ``core.lookups.clear_all`` too).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import threading
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import F, Q, Sum, TextField
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone

from core.gpus import exact_gpus
from core.lookups import register
from costs.spend import highest_prices, lock_team_spends, period_spend, unpriced_bound_usd
from quotas.models import Budget, Quota, Team, cohort_key, cohort_levels
from runners.models import CPU_ACCELERATOR, Accelerator

from ..dependencies import unmet_dependency
from ..models import (
    HELD_GPU_MILLI,
    Job,
    JobAttempt,
    JobState,
    committed_by_team,
    estimated_runtime,
    roles_in_order,
)
from .core import UNLIMITED, BudgetView, PoolOffer, QueuedJob, RoleShape, RunningJob, Snapshot, TeamQuota, TeamState
from .offers import pool_offers
from .usage import decayed_usage, pass_entry_penalty

#: The states of a job that waits for admission.
WAITING_STATES = (JobState.QUEUED, JobState.RECOVERING)


def team_used_gpus(team_id: int, accelerator_id: int) -> int | Decimal:
    """GPUs of ``accelerator_id`` held by the team's live attempts (an attempt holds GPUs until it ends), as quotas
    count them: an int, or an exact Decimal where shares of a GPU are held (``jobs.models.held_gpu_milli``)."""
    return exact_gpus(
        JobAttempt.objects.filter(job__team_id=team_id, node_pool__accelerator_id=accelerator_id, ended_at__isnull=True)
        .aggregate(n=Sum(HELD_GPU_MILLI))["n"]
        or 0
    )


def team_quota(q: Quota) -> TeamQuota:
    """A team-wide ``Quota`` row as the core sees it: GPUs, or for a CPU quota (the CPU flavor's row, in vCPUs) CPU
    millicores (vCPUs x 1000, ``TeamQuota.cpu``)."""
    if q.is_cpu:
        lending = None if q.lending_limit_vcpus is None else q.lending_limit_vcpus * 1000
        return TeamQuota(q.nominal_vcpus * 1000, q.borrowing_limit_vcpus * 1000, lending, q.max_vcpus_per_job * 1000,
                         cpu=True)
    return TeamQuota(q.nominal_gpus, q.borrowing_limit_gpus, q.lending_limit_gpus, q.max_gpus_per_job)


def attempt_cpu_milli(placement: dict | None, nodes: int, replicas: int, resources) -> int:
    """CPU millicores an attempt's pods request together: ``placement``'s ``cpu_milli`` per node x its nodes (one
    per pod, as admission recorded them); without a recorded placement (an attempt adopted after a restore) the
    job's ``nodes x replicas`` pods x the spec's ``resources.cpu`` (``per_node_request``)."""
    placement = placement or {}
    if placement.get("roles"):
        return sum(int(r.get("cpu_milli") or 0) * len(r.get("nodes") or ()) for r in placement["roles"].values())
    if placement.get("nodes") and placement.get("cpu_milli") is not None:
        return int(placement["cpu_milli"]) * len(placement["nodes"])
    return nodes * replicas * per_node_request(resources)[0]


def cpu_used_milli(team_ids) -> dict[int, int]:
    """CPU millicores held by each team's live attempts on CPU node pools (``attempt_cpu_milli``), for the teams
    ``team_ids``; teams holding none are left out. One query."""
    used: dict[int, int] = {}
    rows = (JobAttempt.objects.filter(job__team_id__in=list(team_ids), ended_at__isnull=True,
                                      node_pool__accelerator__name=CPU_ACCELERATOR)
            .values_list("job__team_id", "placement", "job__nodes", "job__replicas",
                         KeyTransform("resources", "job__spec")))
    for team_id, placement, nodes, replicas, resources in rows:
        used[team_id] = used.get(team_id, 0) + attempt_cpu_milli(placement, nodes, replicas, resources)
    return used


def _load_quotas(teams: dict[int, TeamState], quotas) -> None:
    """Put ``quotas`` (Quota rows, accelerator selected) into ``teams``: team-wide rows as ``TeamQuota``s,
    per-cluster rows as caps; then the CPU millicores held by the teams with a CPU quota as their usage of the
    CPU flavor (a team without one runs CPU-only jobs quota-free, counting nothing)."""
    cpu_teams: dict[int, int] = {}
    for q in quotas:
        if q.cluster_id is None:
            teams[q.team_id].quotas[q.accelerator_id] = team_quota(q)
            if q.is_cpu:
                cpu_teams[q.team_id] = q.accelerator_id
        else:
            teams[q.team_id].cluster_caps[(q.accelerator_id, q.cluster_id)] = q.nominal_gpus + q.borrowing_limit_gpus
    if cpu_teams:
        used = cpu_used_milli(cpu_teams)
        for team_id, acc in cpu_teams.items():
            teams[team_id].used[acc] = used.get(team_id, 0)


def budget_views_by_team(team_ids, now: dt.datetime, *, lock: bool = False) -> dict[int, list[BudgetView]]:
    """Each team's budgets in their current period: team id -> [BudgetView], every team asked for included.

    Spent is the priced ledger plus the unknown-cost GPU-hours at the
    catalog's highest price for their accelerator; committed is what the
    team's active jobs may still spend; both as ``costs.budgets`` defines
    them (one definition for admission, status and alerts). Read from the
    running totals in a few queries for all teams together, whatever the
    ledger's length (``costs.spend.period_spend``). With ``lock`` (inside the
    admission's transaction, after the node pool locks) each team's totals
    row is locked first, in team id order, so an accrual commits wholly
    before or after the figures are read.
    """
    views: dict[int, list[BudgetView]] = {t: [] for t in team_ids}
    budgets = []
    for budget in Budget.objects.filter(team_id__in=list(views)).order_by("team_id", "pk"):
        start, end = budget.window(now)
        if start is not None and end is not None and start <= now < end:
            budgets.append((budget, start, end))
    if not budgets:
        return views
    teams = sorted({b.team_id for b, _, _ in budgets})
    if lock:
        lock_team_spends(teams)
    committed = committed_by_team(teams)
    spends = {}
    for window in {(start, end) for _, start, end in budgets}:
        spends[window] = period_spend(sorted({b.team_id for b, s, e in budgets if (s, e) == window}), *window)
    prices = highest_prices() if any(sp.unpriced_gpu_seconds for by in spends.values() for sp in by.values()) else {}
    for budget, start, end in budgets:
        spend = spends[(start, end)][budget.team_id]
        views[budget.team_id].append(BudgetView(budget.pk, budget.amount_usd,
                                                spend.cost_usd + unpriced_bound_usd(spend, prices),
                                                committed[budget.team_id], budget.action))
    return views


def budget_views(team_id: int, now: dt.datetime, *, lock: bool = False) -> list[BudgetView]:
    """The team's budgets in their current period (``budget_views_by_team`` of one team)."""
    return budget_views_by_team([team_id], now, lock=lock)[team_id]


def _constraints(placement) -> tuple[tuple, tuple, tuple]:
    """(providers, regions, clusters) of a spec's ``placement`` (anything but a dict: no constraint)."""
    placement = placement if isinstance(placement, dict) else {}
    return tuple(tuple(placement.get(k) or ()) for k in ("providers", "regions", "clusters"))


def _units(value, per: int) -> int:
    """``value`` (a positive number, or absent) x ``per``, rounded up; more than any node can have: ``UNLIMITED``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        return 0
    scaled = float(value) * per
    return UNLIMITED if not math.isfinite(scaled) or scaled >= UNLIMITED else math.ceil(round(scaled, 6))


def per_node_request(resources) -> tuple[int, int]:
    """``(CPU millicores, memory MiB)`` per node of a spec's ``resources`` (``cpu`` cores and ``memory_gib``, rounded
    up as Kubernetes quantities are: ``manifests`` asks ``round(cpu x 1000)m``; absent: 0)."""
    resources = resources if isinstance(resources, dict) else {}
    return _units(resources.get("cpu"), 1000), _units(resources.get("memory_gib"), 1024)


def _accelerator_ids() -> dict[str, int]:
    return dict(Accelerator.objects.values_list("name", "pk"))


def _resources_fields(resources, names: dict[str, int] | None) -> tuple[int, int, tuple[int, ...]]:
    """(CPU millicores, memory MiB, alternative accelerator ids) of a spec's ``resources``; ``names``: accelerator
    ids by name (None: read when the spec lists alternatives)."""
    cpu, memory = per_node_request(resources)
    alternatives = (resources or {}).get("alternatives") if isinstance(resources, dict) else None
    ids: tuple[int, ...] = ()
    if alternatives:
        names = _accelerator_ids() if names is None else names
        ids = tuple(names[a] for a in alternatives if a in names)
    return cpu, memory, ids


def pods_of(kind: str, nodes: int, replicas: int = 1) -> tuple[int, bool]:
    """``(pods, whether they may share a node)`` of a job as placement counts them: a training job's ``nodes``
    pods, each on a node of its own (one process group per node); an inference job's ``nodes x replicas`` pods,
    independent servers that may share a node with room for several (spread first: ``core.NodeBook.fit``).

    The one rule for the pass, the locked re-check, the submission preview and the submission check
    (``never.never_fits``), so what submission accepts the placement can place (ADR 0019)."""
    return nodes * max(replicas, 1), kind == Job.Kind.INFERENCE


def spot_avoidance(job_ids, now: dt.datetime) -> dict[int, tuple[int, ...]]:
    """Job id -> ids of the clusters where a spot reclaim ended one of its attempts (end reason ``SpotReclaimed``)
    within ``settings.SPOT_RECLAIM_AVOID_SECONDS`` (s) before ``now``, for the jobs ``job_ids``; jobs without such a
    reclaim are left out. One query (none when the setting is 0 or no job is asked for).

    Class of failure: "recovery returns to the failure it recovers from". Invariant: after a spot reclaim on a
    cluster the job's next placements take another cluster with room for the window (``core.room.Room.place``;
    ADR 0018)."""
    window = float(settings.SPOT_RECLAIM_AVOID_SECONDS or 0)
    job_ids = list(job_ids)
    if window <= 0 or not job_ids:
        return {}
    found: dict[int, set[int]] = {}
    for job_id, cluster_id in (JobAttempt.objects.filter(
            job_id__in=job_ids, end_reason=JobAttempt.EndReason.SPOT_RECLAIMED,
            ended_at__gt=now - dt.timedelta(seconds=window)).values_list("job_id", "cluster_id")):
        found.setdefault(job_id, set()).add(cluster_id)
    return {job_id: tuple(sorted(ids)) for job_id, ids in found.items()}


def role_shapes(roles) -> tuple[RoleShape, ...]:
    """A multi-role job's stored ``spec.roles`` (name -> role) as the core's ``RoleShape``s, in name order
    (``jobs.models.roles_in_order``):
    each role's pods (``resources.nodes``), GPUs, CPU millicores and memory MiB per pod (``per_node_request``);
    anything but a mapping: none."""
    shapes = []
    for name, role in roles_in_order(roles).items():
        resources = (role or {}).get("resources") or {}
        cpu, memory = per_node_request(resources)
        shapes.append(RoleShape(name, int(resources.get("nodes") or 0), int(resources.get("gpus_per_node") or 0),
                                cpu, memory))
    return tuple(shapes)


def _queued_job(row: dict) -> QueuedJob:
    providers, regions, clusters = row["placement"]
    cpu, memory, alternatives = row["resources"]
    pods, share = pods_of(row["kind"], row["nodes"], row["replicas"])
    return QueuedJob(
        job_id=row["pk"], team_id=row["team_id"], accelerator_id=row["accelerator_id"], nodes=pods,
        gpus_per_node=row["gpus_per_node"], priority=row["priority"], submitted=row["created_at"].timestamp(),
        preemptible=row["preemptible"], max_runtime_seconds=estimated_runtime(row["max_runtime_seconds"]),
        providers=providers, regions=regions, clusters=clusters, recovering=row["state"] == JobState.RECOVERING,
        cpu_milli=cpu, memory_mib=memory, alternatives=tuple(a for a in alternatives if a != row["accelerator_id"]),
        share_nodes=share, roles=row.get("roles") or (), share_milli=row.get("gpu_share_milli") or 0,
        mig_profile=row.get("mig_profile") or "",
    )


def queued_job(job: Job, now: dt.datetime | None = None) -> QueuedJob:
    """``job`` (a model instance, e.g. the row a re-check locked) as the core sees a waiting job; a recovering one
    with the clusters it avoids at ``now`` (default now: ``spot_avoidance``)."""
    spec = job.spec or {}
    providers, regions, clusters = _constraints(spec.get("placement"))
    cpu, memory, alternatives = _resources_fields(spec.get("resources"), None)
    pods, share = pods_of(job.kind, job.nodes, job.replicas)
    roles = role_shapes(spec.get("roles")) if job.kind == Job.Kind.MULTI_ROLE else ()
    recovering = job.state == JobState.RECOVERING
    avoid = spot_avoidance([job.pk], now or timezone.now()).get(job.pk, ()) if recovering else ()
    return QueuedJob(
        job_id=job.pk, team_id=job.team_id, accelerator_id=job.accelerator_id, nodes=pods,
        gpus_per_node=job.gpus_per_node, priority=job.priority, submitted=job.created_at.timestamp(),
        preemptible=job.preemptible, max_runtime_seconds=estimated_runtime(job.max_runtime_seconds),
        providers=providers, regions=regions, clusters=clusters, recovering=recovering,
        cpu_milli=cpu, memory_mib=memory, alternatives=tuple(a for a in alternatives if a != job.accelerator_id),
        share_nodes=share, avoid_clusters=avoid, roles=roles, share_milli=job.gpu_share_milli,
        mig_profile=job.mig_profile,
    )


@dataclasses.dataclass
class Loaded:
    """A pass's snapshot and the rows it was read from."""

    snapshot: Snapshot
    rows: dict[int, dict]  # job id -> its row as loaded ("state", "queue_info"...); read only (cached between passes)


_ROW_COLUMNS = ("pk", "team_id", "accelerator_id", "nodes", "gpus_per_node", "priority", "created_at", "preemptible",
                "max_runtime_seconds", "state", "queue_info", "replicas", "kind", "gpu_share_milli", "mig_profile")


class _RowCache:
    """Per process: job id -> (row version, row) of waiting jobs read by earlier passes (PostgreSQL only).

    Validated by row versions, not by a time to live; ``clear()`` forgets
    every row (tests: a rolled-back row may come back with the same version).
    """

    def __init__(self) -> None:
        self.rows: dict[int, tuple[str, dict]] = {}
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.rows.clear()


#: The waiting rows this process read; ``core.lookups.clear_all()`` empties it with the lookup caches.
ROW_CACHE = register(_RowCache())


def _row_version():
    """A PostgreSQL row version as text: ``xmin`` (the writing transaction) and ``ctid`` (where this version lies).

    Every UPDATE writes a new row version at a new ``ctid``, even a second
    UPDATE in the same transaction (which keeps ``xmin``), and a version's
    place is not reused while its transaction could still see it.
    """
    table = Job._meta.db_table
    return RawSQL(f'"{table}"."xmin"::text || \'/\' || "{table}"."ctid"::text', [])


def _full_rows(qs, *, with_version: bool = False) -> list[dict]:
    """Waiting rows of ``qs`` with ``placement`` decoded once per distinct value (and ``version``, if asked).

    Only spec.placement is read, as text: most jobs share a few placements,
    where decoding the whole spec of thousands of waiting jobs would dominate
    the pass.
    """
    extra = {"version": _row_version()} if with_version else {}
    rows = list(qs.values(*_ROW_COLUMNS, placement=Cast(KeyTransform("placement", "spec"), TextField()),
                          resources=Cast(KeyTransform("resources", "spec"), TextField()),
                          roles=Cast(KeyTransform("roles", "spec"), TextField()), **extra))
    placements: dict[str | None, tuple] = {}
    resources: dict[str | None, tuple] = {}
    names = None
    for r in rows:
        text = r["placement"]
        if text not in placements:
            placements[text] = _constraints(json.loads(text) if text else None)
        r["placement"] = placements[text]
        text = r["resources"]
        if text not in resources:
            decoded = json.loads(text) if text else None
            if names is None and isinstance(decoded, dict) and decoded.get("alternatives"):
                names = _accelerator_ids()
            resources[text] = _resources_fields(decoded, names)
        r["resources"] = resources[text]
        r["roles"] = role_shapes(json.loads(r["roles"])) if r["roles"] else ()
        r["queued"] = _queued_job(r)
    return rows


def _waiting_rows(qs, limit: int | None) -> list[dict]:
    """The waiting rows of ``qs`` in its order; on PostgreSQL only rows that changed since the last pass are read.

    A storm of submissions makes every pass read the whole queue again, while
    between two passes only the new jobs and the few that changed differ.
    First one narrow query (id and the row version, which every UPDATE
    changes: ``_row_version``), then the full rows of the ids whose version this process
    has not seen, then the rest from the per-process cache. A row that left
    the waiting states between the two queries is dropped.
    """
    if connection.vendor != "postgresql":
        return _full_rows(qs[:limit] if limit else qs)
    versions = qs.values_list("pk", _row_version())
    versions = list(versions[:limit] if limit else versions)
    cache = ROW_CACHE.rows
    with ROW_CACHE.lock:  # one pass at a time per process reads and prunes the cache
        missing = [pk for pk, version in versions if cache.get(pk, ("",))[0] != version]
        for start in range(0, len(missing), 5000):
            for row in _full_rows(Job.objects.filter(pk__in=missing[start:start + 5000]).order_by(),
                                  with_version=True):
                cache[row["pk"]] = (row.pop("version"), row)
        waiting = {pk for pk, _ in versions}
        for pk in [pk for pk in cache if pk not in waiting]:
            del cache[pk]
        # A job that left the queue between the two queries has no cached row, or one in its new state.
        return [entry[1] for pk, _ in versions
                if (entry := cache.get(pk)) is not None and entry[1]["state"] in WAITING_STATES]


def load_snapshot(now: dt.datetime, *, job_ids: list[int] | None = None, limit: int | None = None,
                  skip_empty: bool = False) -> Loaded:
    """Read everything a pass needs, without locks: waiting jobs (in admission order, first ``limit``, or just
    ``job_ids``; a job waiting for its dependencies is left out), every team with its cohort, weight, quotas (all clusters), live usage, decayed usage (``usage.decayed_usage``) and budgets in force, node pools
    of the accelerators asked for (free GPUs, price now), and the live attempts of preemptible jobs.

    ``skip_empty``: when no job waits, read nothing more and return a snapshot with an empty queue and no teams,
    pools or attempts (a pass over an empty queue decides nothing; callers that read the teams of an empty queue
    leave it False)."""
    # A job whose dependencies do not all hold yet is not in the queue at all (jobs.dependencies, ADR 0037).
    qs = (Job.objects.filter(state__in=WAITING_STATES).filter(~unmet_dependency())
          .order_by("-priority", "created_at", "pk"))
    if job_ids is not None:
        rows = _full_rows(qs.filter(pk__in=job_ids))
    else:
        rows = _waiting_rows(qs, limit)
    recovering = [r["pk"] for r in rows if r["state"] == JobState.RECOVERING]
    avoid: dict[int, tuple[int, ...]] = {}
    if recovering:
        live = set(JobAttempt.objects.filter(job_id__in=recovering, ended_at__isnull=True).values_list("job_id", flat=True))
        rows = [r for r in rows if r["pk"] not in live]
        avoid = spot_avoidance([pk for pk in recovering if pk not in live], now)
    # The cached rows' jobs stay as read: the clusters a job avoids change with the clock, not with its row.
    queue = [dataclasses.replace(r["queued"], avoid_clusters=avoid[r["pk"]]) if r["pk"] in avoid else r["queued"]
             for r in rows]
    if skip_empty and not queue:
        return Loaded(Snapshot({}, {}, [], [], {}, settings.SCHEDULING_PACKING_POLICY), {})

    levels, root_of = cohort_levels()
    teams = {t.pk: team_state(t.pk, t.cohort_id, t.weight, t.queueing_strategy, root_of) for t in Team.objects.all()}
    for team_id, gpu_seconds in decayed_usage(now).items():  # fair sharing over time (ADR 0045)
        if team_id in teams:
            teams[team_id].fair_usage = gpu_seconds
    for team_id, acc, gpus in (JobAttempt.objects.filter(ended_at__isnull=True)
                               .values_list("job__team_id", "node_pool__accelerator_id").annotate(n=Sum(HELD_GPU_MILLI))):
        teams[team_id].used[acc] = exact_gpus(gpus)
    _load_quotas(teams, Quota.objects.select_related("accelerator"))
    if any(t.cluster_caps for t in teams.values()):
        for team_id, acc, cluster_id, gpus in (
                JobAttempt.objects.filter(ended_at__isnull=True)
                .values_list("job__team_id", "node_pool__accelerator_id", "cluster_id").annotate(n=Sum(HELD_GPU_MILLI))):
            if (acc, cluster_id) in teams[team_id].cluster_caps:
                teams[team_id].cluster_used[(acc, cluster_id)] = exact_gpus(gpus)
    queued_teams = {j.team_id for j in queue}
    for team_id, views in budget_views_by_team(queued_teams, now).items():
        if views:
            teams[team_id].budgets = views

    accelerators = {a for j in queue for a in j.accelerator_ids}
    unpriced: dict[int, list[PoolOffer]] = {acc: [] for acc in accelerators}
    pools = {acc: pool_offers(acc, now, lock=False, unpriced=unpriced[acc]) for acc in accelerators}
    running = [
        running_job(job_id, attempt_id, team_id, acc, pool_id, gpus, priority, (admitted_at or created_at).timestamp(),
                    placement)
        for attempt_id, job_id, team_id, acc, pool_id, gpus, priority, admitted_at, created_at, placement in
        protected_attempts(JobAttempt.objects.filter(
            ended_at__isnull=True, job__preemptible=True, job__current_attempt_id=F("pk"),
            job__state__in=[JobState.ADMITTED, JobState.STARTING, JobState.RUNNING]), now, exclude=True)
        .values_list("pk", "job_id", "job__team_id", "node_pool__accelerator_id", "node_pool_id", "gpus",
                     "job__priority", "job__admitted_at", "created_at", "placement")
    ] if accelerators else []
    snapshot = Snapshot(teams, pools, queue, running, unpriced, settings.SCHEDULING_PACKING_POLICY,
                        cohort_levels=tuple(levels.values()), entry_penalty=pass_entry_penalty())
    if settings.SCHEDULING_BACKFILL and accelerators:
        snapshot.now, snapshot.live = now.timestamp(), live_attempts(now)
        snapshot.reserve_after_s = settings.SCHEDULING_BACKFILL_RESERVE_AFTER_SECONDS
        snapshot.max_reservations = settings.SCHEDULING_BACKFILL_MAX_RESERVATIONS
    return Loaded(snapshot, {r["pk"]: r for r in rows})


def live_attempts(now: dt.datetime) -> list[RunningJob]:
    """Every live current attempt as backfill plans with it (``Snapshot.live``): its nodes, and its max run time from
    its start (one not started yet: from ``now``, the earliest it can start); a job without a max run time frees its
    nodes at no planned time (``RunningJob.max_runtime_seconds`` 0)."""
    rows = (JobAttempt.objects.filter(ended_at__isnull=True, job__current_attempt_id=F("pk"))
            .values_list("pk", "job_id", "job__team_id", "node_pool__accelerator_id", "node_pool_id", "gpus",
                         "job__priority", "started_at", "placement", "job__max_runtime_seconds", "job__preemptible"))
    out = []
    for attempt_id, job_id, team_id, acc, pool_id, gpus, priority, started, placement, limit, preemptible in rows:
        r = running_job(job_id, attempt_id, team_id, acc, pool_id, gpus, priority, (started or now).timestamp(),
                        placement)
        out.append(dataclasses.replace(r, preemptible=preemptible, max_runtime_seconds=limit or 0))
    return out


def team_state(team_id: int, cohort_id: int | None, weight, strategy: str, root_of: dict[int, tuple]) -> TeamState:
    """A team as the core sees it, without quotas and usage: of a plain cohort (key: the cohort id; None: the
    default cohort), or of a tree of cohorts (``root_of``: ``quotas.hierarchy.cohort_levels``'s; key: the tree's
    root, ``parent_cohort``: its own cohort's key)."""
    if cohort_id in root_of:
        return TeamState(team_id, cohort=root_of[cohort_id], weight=float(weight), strategy=strategy,
                         parent_cohort=cohort_key(cohort_id))
    return TeamState(team_id, cohort=cohort_id, weight=float(weight), strategy=strategy)


def protected_attempts(attempts, now: dt.datetime, *, exclude: bool = False):
    """The live attempts of ``attempts`` (a JobAttempt queryset) that no preemption may end now (``exclude``: the
    others): their job was preempted ``PREEMPTION_BEFORE_RUN_LIMIT`` times in a row before any attempt ran, and
    this attempt was dispatched less than ``PREEMPTION_PROTECTION_SECONDS`` ago, or not yet.

    Class: a borrower admitted and reclaimed before it ever runs, again and again (an admit/preempt loop); invariant:
    a job is preempted at most ``PREEMPTION_BEFORE_RUN_LIMIT`` times before it runs (docs/adr/0015).
    """
    since = now - dt.timedelta(seconds=settings.PREEMPTION_PROTECTION_SECONDS)
    protected = Q(job__preempted_before_run__gte=settings.PREEMPTION_BEFORE_RUN_LIMIT) & (
        Q(started_at__isnull=True) | Q(started_at__gt=since))
    return attempts.exclude(protected) if exclude else attempts.filter(protected)


def running_job(job_id: int, attempt_id: int, team_id: int, accelerator_id: int, pool_id: int, gpus: int,
                priority: int, admitted: float, placement: dict | None) -> RunningJob:
    """A live preemptible attempt as the core sees it, with the nodes its ``placement`` records."""
    placement = placement or {}
    return RunningJob(job_id, attempt_id, team_id, accelerator_id, pool_id, gpus, priority, admitted, True,
                      tuple(placement.get("nodes") or ()), int(placement.get("gpus_per_node") or 0),
                      int(placement.get("cpu_milli") or 0), int(placement.get("memory_mib") or 0),
                      int(placement.get("share_milli") or 0), str(placement.get("mig_profile") or ""))


def job_snapshot(team: Team, job: QueuedJob, now: dt.datetime, offers: list[PoolOffer], *, cohort: bool = True,
                 also: tuple[int, ...] = (), lock_spend: bool = False) -> Snapshot:
    """A snapshot to decide ``job`` alone, read now: its ``team`` with the quotas of the job's accelerator (team-wide
    and per cluster), live usage and budgets in force; with ``cohort`` every team of its cohort (their quotas and
    usage make the cohort's lendable pool and its borrowing); the teams in ``also`` too; ``offers`` as the job's
    pools; no running jobs (nothing more to preempt).

    Read inside the admission's transaction, after its locks, it is what the
    core re-checks the admission on (``apply``); with ``cohort=False`` it is
    what the submission preview assesses (``preview``). ``lock_spend`` (the
    re-check) reads the budgets from the team's locked totals row.
    """
    acc = job.accelerator_id  # an alternative's re-check passes the job with that accelerator
    return teams_snapshot({team.pk: team}, {acc: offers}, now, cohort=cohort, also=also, lock_spend=lock_spend,
                          queue=[job])


def teams_snapshot(locked: dict[int, Team], offers: dict[int, list[PoolOffer]], now: dt.datetime, *,
                   cohort: bool = True, also: tuple[int, ...] = (), lock_spend: bool = False,
                   queue: list[QueuedJob] | None = None) -> Snapshot:
    """A snapshot to decide some jobs of the teams ``locked`` (team id -> the row as read, e.g. locked) on the
    accelerators of ``offers`` (accelerator id -> its pools), read now in a fixed number of queries whatever the
    number of teams: each team's quotas of those accelerators (team-wide and per cluster), live usage and budgets
    in force; with ``cohort`` every team of their cohorts (quotas and usage: the cohorts' lendable pools and
    borrowing); the teams in ``also`` too; ``queue`` as the waiting jobs (default none); no running jobs (nothing
    more to preempt). ``lock_spend``: the budgets are read after locking the teams' totals rows (team id order).
    """
    accs = list(offers)
    members = Q(pk__in=list(locked)) | Q(pk__in=also)
    levels, root_of = cohort_levels() if cohort else ({}, {})
    if cohort:
        cohorts = {t.cohort_id for t in locked.values()}
        roots = {root_of[c] for c in cohorts if c in root_of}
        cohorts |= {c for c, r in root_of.items() if r in roots}  # a tree's every team lends and borrows in it
        if None in cohorts:
            members |= Q(cohort__isnull=True)
        if cohorts - {None}:
            members |= Q(cohort_id__in=cohorts - {None})
    teams = {pk: team_state(pk, cohort_id, weight, strategy, root_of)
             for pk, cohort_id, weight, strategy in
             Team.objects.filter(members).values_list("pk", "cohort_id", "weight", "queueing_strategy")}
    for team in locked.values():  # the rows as locked
        teams[team.pk] = team_state(team.pk, team.cohort_id, team.weight, team.queueing_strategy, root_of)
    live = JobAttempt.objects.filter(job__team_id__in=teams, node_pool__accelerator_id__in=accs, ended_at__isnull=True)
    for team_id, acc, gpus in live.values_list("job__team_id", "node_pool__accelerator_id").annotate(n=Sum(HELD_GPU_MILLI)):
        teams[team_id].used[acc] = exact_gpus(gpus)
    _load_quotas(teams, Quota.objects.filter(team_id__in=teams, accelerator_id__in=accs).select_related("accelerator"))
    capped = [pk for pk in locked if teams[pk].cluster_caps]
    if capped:
        for team_id, acc, cluster_id, gpus in (live.filter(job__team_id__in=capped)
                                               .values_list("job__team_id", "node_pool__accelerator_id", "cluster_id")
                                               .annotate(n=Sum(HELD_GPU_MILLI))):
            if (acc, cluster_id) in teams[team_id].cluster_caps:
                teams[team_id].cluster_used[(acc, cluster_id)] = exact_gpus(gpus)
    for team_id, views in budget_views_by_team(sorted(locked), now, lock=lock_spend).items():
        teams[team_id].budgets = views
    used_roots = {t.cohort for t in teams.values() if t.parent_cohort is not None}
    return Snapshot(teams, dict(offers), list(queue or ()), policy=settings.SCHEDULING_PACKING_POLICY,
                    cohort_levels=tuple(lv for k, lv in levels.items() if root_of[k[1]] in used_roots))
