"""The scheduling pass: a thin database layer around the pure fair-share core (``jobs.scheduling.core``).

A pass loads a snapshot (waiting jobs, teams with cohorts, weights and
quotas, live usage, node pools with free GPUs and prices, budgets,
preemptible live attempts), asks the core for decisions, and applies each
admission in its own transaction that re-checks it (the core proposes, the
transaction verifies):

1. lock the job row (SKIP LOCKED: another scheduler owns it), then the team
   row, then the victims' job rows if it preempts (SKIP LOCKED: a victim
   another worker holds cancels this admission for now), then every node
   pool of the accelerator in id order (serialises capacity and the cohort's
   borrowing of that accelerator; one global order, so no deadlock);
2. preempt the victims (``jobs.lifecycle.preempt_attempt``), then check quota,
   cohort lending, the pool's room and the budgets again on fresh rows;
3. create the attempt and move the job to ADMITTED by compare-and-set, and
   enqueue its dispatch on commit; any failed check rolls everything back.

Waiting jobs get their reason, numbers and queue positions in ``queue_info``
(one bulk UPDATE); a ``waiting`` event is written when the reason changes.
On SQLite the IMMEDIATE transaction mode serialises whole transactions,
which gives the same guarantee.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import F, Sum, TextField
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone

from jobs import metrics
from costs.budgets import committed_usd, ledger_usd
from costs.catalog import NoPrice, price_at
from costs.models import Price
from jobs.scheduling.core import (
    ESTIMATE_QUANTUM,
    Admission,
    BudgetView,
    Decisions,
    FairShareScheduler,
    PlacementRequest,
    PoolOffer,
    QueuedJob,
    QuotaView,
    Rejection,
    RunningJob,
    Snapshot,
    TeamQuota,
    TeamState,
    Verdict,
    Waiting,
    check_budgets,
    check_quota,
    choose_pool,
    cohort_has_room,
    estimate_cost,
    fits_now,
)
from quotas.models import Budget, Quota, Team
from runners.models import Cluster, NodePool

from .models import Job, JobAttempt, JobEvent, JobState
from .states import StaleState, transition

__all__ = ["ESTIMATE_QUANTUM", "PassResult", "estimate_cost", "placement_request", "pool_offers", "schedule_coalesced",
           "schedule_pending", "team_used_gpus", "try_admit"]

log = logging.getLogger(__name__)

WAITING_STATES = (JobState.QUEUED, JobState.RECOVERING)


@dataclasses.dataclass
class PassResult:
    """Counts from one scheduling pass."""

    admitted: list[int] = dataclasses.field(default_factory=list)
    waiting: int = 0
    rejected: int = 0
    skipped: int = 0


def placement_request(job: Job) -> PlacementRequest:
    """The placement needs of ``job`` from its columns and ``spec.placement``."""
    placement = (job.spec or {}).get("placement") or {}
    return PlacementRequest(
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        preemptible=job.preemptible,
        providers=tuple(placement.get("providers") or ()),
        regions=tuple(placement.get("regions") or ()),
        clusters=tuple(placement.get("clusters") or ()),
    )


def team_used_gpus(team_id: int, accelerator_id: int) -> int:
    """GPUs of ``accelerator_id`` held by the team's live attempts (an attempt holds GPUs until it ends)."""
    return (
        JobAttempt.objects.filter(job__team_id=team_id, node_pool__accelerator_id=accelerator_id, ended_at__isnull=True)
        .aggregate(n=Sum("gpus"))["n"]
        or 0
    )


def cluster_caps(team_id: int, accelerator_id: int) -> dict[int, int]:
    """The team's per-cluster quota caps for one accelerator: cluster id -> nominal + borrowing limit (GPUs)."""
    return {cluster_id: nominal + borrowing for cluster_id, nominal, borrowing in
            Quota.objects.filter(team_id=team_id, accelerator_id=accelerator_id, cluster__isnull=False)
            .values_list("cluster_id", "nominal_gpus", "borrowing_limit_gpus")}


def team_cluster_used(team_id: int, accelerator_id: int) -> dict[int, int]:
    """GPUs the team's live attempts hold per cluster, for one accelerator."""
    return dict(JobAttempt.objects.filter(job__team_id=team_id, node_pool__accelerator_id=accelerator_id,
                                          ended_at__isnull=True)
                .values("cluster_id").annotate(n=Sum("gpus")).values_list("cluster_id", "n"))


def budget_views(team_id: int, now: dt.datetime) -> list[BudgetView]:
    """The team's budgets in their current period, with spent (ledger) and committed (running estimates) USD.

    Spent and committed follow ``costs.budgets`` (one definition for admission, status and alerts).
    """
    views = []
    committed = None
    for budget in Budget.objects.filter(team_id=team_id):
        start, end = budget.window(now)
        if start is None or not (start <= now < end):
            continue
        if committed is None:
            committed = committed_usd(team_id)
        views.append(BudgetView(budget.pk, budget.amount_usd, ledger_usd(team_id, start, end), committed, budget.action))
    return views


def pool_offers(accelerator_id: int, now: dt.datetime, lock: bool) -> list[PoolOffer]:
    """Every node pool of the accelerator with its free GPUs and current price; locked FOR UPDATE if ``lock``."""
    pools = NodePool.objects.filter(accelerator_id=accelerator_id).select_related("cluster").order_by("pk")
    if lock:
        pools = pools.select_for_update(of=("self",))
    pools = list(pools)
    in_use = dict(
        JobAttempt.objects.filter(node_pool__in=pools, ended_at__isnull=True)
        .values_list("node_pool_id")
        .annotate(n=Sum("gpus"))
    )
    prices = list(Price.objects.filter(accelerator_id=accelerator_id, effective_from__lte=now))
    offers = []
    for pool in pools:
        relevant = [
            p for p in prices
            if p.capacity_type == pool.capacity_type
            and (p.cluster_id == pool.cluster_id
                 or (p.cluster_id is None and p.provider == pool.cluster.provider and p.region == pool.cluster.region))
        ]
        try:
            price = price_at(pool, now, relevant)
        except NoPrice:
            log.warning("node pool %s has no price in force; not offered", pool)
            continue
        offers.append(
            PoolOffer(
                node_pool_id=pool.pk, cluster_id=pool.cluster_id, cluster_name=pool.cluster.name,
                provider=pool.cluster.provider, region=pool.cluster.region, capacity_type=pool.capacity_type,
                nodes=pool.nodes, gpus_per_node=pool.gpus_per_node,
                free_gpus=pool.capacity_gpus - in_use.get(pool.pk, 0), usd_per_gpu_hour=price,
                healthy=pool.cluster.health == Cluster.Health.HEALTHY,
            )
        )
    return offers


# --- the snapshot -------------------------------------------------------------------------

def _queued_job(row: dict) -> QueuedJob:
    providers, regions, clusters = row["placement"]
    return QueuedJob(
        job_id=row["pk"], team_id=row["team_id"], accelerator_id=row["accelerator_id"], nodes=row["nodes"],
        gpus_per_node=row["gpus_per_node"], priority=row["priority"], submitted=row["created_at"].timestamp(),
        preemptible=row["preemptible"], max_runtime_seconds=row["max_runtime_seconds"],
        providers=providers, regions=regions, clusters=clusters, recovering=row["state"] == JobState.RECOVERING,
    )


@dataclasses.dataclass
class _Loaded:
    snapshot: Snapshot
    rows: dict[int, dict]  # job id -> its row as loaded ("state", "queue_info"...); read only (cached between passes)


_ROW_COLUMNS = ("pk", "team_id", "accelerator_id", "nodes", "gpus_per_node", "priority", "created_at", "preemptible",
                "max_runtime_seconds", "state", "queue_info")
#: Per process: job id -> (row version, row) of waiting jobs read by earlier passes (PostgreSQL only).
_ROW_CACHE: dict[int, tuple[str, dict]] = {}
_ROW_CACHE_LOCK = threading.Lock()


def clear_row_cache() -> None:
    """Forget the waiting rows this process read (tests: a rolled-back row may come back with the same version)."""
    with _ROW_CACHE_LOCK:
        _ROW_CACHE.clear()


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
    rows = list(qs.values(*_ROW_COLUMNS, placement=Cast(KeyTransform("placement", "spec"), TextField()), **extra))
    placements: dict[str | None, tuple] = {}
    for r in rows:
        text = r["placement"]
        if text not in placements:
            placement = json.loads(text) if text else None
            placement = placement if isinstance(placement, dict) else {}
            placements[text] = tuple(tuple(placement.get(k) or ()) for k in ("providers", "regions", "clusters"))
        r["placement"] = placements[text]
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
    with _ROW_CACHE_LOCK:  # one pass at a time per process reads and prunes the cache
        missing = [pk for pk, version in versions if _ROW_CACHE.get(pk, ("",))[0] != version]
        for start in range(0, len(missing), 5000):
            for row in _full_rows(Job.objects.filter(pk__in=missing[start:start + 5000]).order_by(),
                                  with_version=True):
                _ROW_CACHE[row["pk"]] = (row.pop("version"), row)
        waiting = {pk for pk, _ in versions}
        for pk in [pk for pk in _ROW_CACHE if pk not in waiting]:
            del _ROW_CACHE[pk]
        # A job that left the queue between the two queries has no cached row, or one in its new state.
        return [entry[1] for pk, _ in versions
                if (entry := _ROW_CACHE.get(pk)) is not None and entry[1]["state"] in WAITING_STATES]


def load_snapshot(now: dt.datetime, *, job_ids: list[int] | None = None, limit: int | None = None) -> _Loaded:
    """Read everything a pass needs, without locks: waiting jobs (in admission order, first ``limit``, or just
    ``job_ids``), every team with its cohort, weight, quotas (all clusters), live usage and budgets in force, node pools
    of the accelerators asked for (free GPUs, price now), and the live attempts of preemptible jobs."""
    qs = Job.objects.filter(state__in=WAITING_STATES).order_by("-priority", "created_at", "pk")
    if job_ids is not None:
        rows = _full_rows(qs.filter(pk__in=job_ids))
    else:
        rows = _waiting_rows(qs, limit)
    recovering = [r["pk"] for r in rows if r["state"] == JobState.RECOVERING]
    if recovering:
        live = set(JobAttempt.objects.filter(job_id__in=recovering, ended_at__isnull=True).values_list("job_id", flat=True))
        rows = [r for r in rows if r["pk"] not in live]
    queue = [r["queued"] for r in rows]

    teams = {t.pk: TeamState(t.pk, cohort=t.cohort_id, weight=float(t.weight)) for t in Team.objects.all()}
    for q in Quota.objects.all():
        if q.cluster_id is None:
            teams[q.team_id].quotas[q.accelerator_id] = TeamQuota(q.nominal_gpus, q.borrowing_limit_gpus,
                                                                  q.lending_limit_gpus, q.max_gpus_per_job)
        else:
            teams[q.team_id].cluster_caps[(q.accelerator_id, q.cluster_id)] = q.nominal_gpus + q.borrowing_limit_gpus
    if any(t.cluster_caps for t in teams.values()):
        for team_id, acc, cluster_id, gpus in (
                JobAttempt.objects.filter(ended_at__isnull=True)
                .values_list("job__team_id", "node_pool__accelerator_id", "cluster_id").annotate(n=Sum("gpus"))):
            if (acc, cluster_id) in teams[team_id].cluster_caps:
                teams[team_id].cluster_used[(acc, cluster_id)] = gpus
    for team_id, acc, gpus in (JobAttempt.objects.filter(ended_at__isnull=True)
                               .values_list("job__team_id", "node_pool__accelerator_id").annotate(n=Sum("gpus"))):
        teams[team_id].used[acc] = gpus
    queued_teams = {j.team_id for j in queue}
    for team_id in set(Budget.objects.filter(team_id__in=queued_teams).values_list("team_id", flat=True)):
        teams[team_id].budgets = budget_views(team_id, now)

    accelerators = {j.accelerator_id for j in queue}
    pools = {acc: pool_offers(acc, now, lock=False) for acc in accelerators}
    running = [
        RunningJob(job_id, attempt_id, team_id, acc, pool_id, gpus, priority,
                   (admitted_at or created_at).timestamp(), True)
        for attempt_id, job_id, team_id, acc, pool_id, gpus, priority, admitted_at, created_at in
        JobAttempt.objects.filter(ended_at__isnull=True, job__preemptible=True, job__current_attempt_id=F("pk"),
                                  job__state__in=[JobState.ADMITTED, JobState.STARTING, JobState.RUNNING])
        .values_list("pk", "job_id", "job__team_id", "node_pool__accelerator_id", "node_pool_id", "gpus",
                     "job__priority", "job__admitted_at", "created_at")
    ] if accelerators else []
    return _Loaded(Snapshot(teams, pools, queue, running), {r["pk"]: r for r in rows})


# --- applying decisions ---------------------------------------------------------------------

def _cohort_usage(team: Team, accelerator_id: int) -> tuple[int, int]:
    """(lendable GPUs, borrowed GPUs) of ``team``'s cohort for one accelerator, from fresh rows."""
    members = Team.objects.filter(cohort_id=team.cohort_id) if team.cohort_id else Team.objects.filter(cohort__isnull=True)
    quotas = {q.team_id: q for q in Quota.objects.filter(team__in=members, accelerator_id=accelerator_id,
                                                        cluster__isnull=True)}
    used = dict(JobAttempt.objects.filter(job__team__in=members, node_pool__accelerator_id=accelerator_id,
                                          ended_at__isnull=True).values_list("job__team_id").annotate(n=Sum("gpus")))
    lendable = borrowed = 0
    for team_id in set(quotas) | set(used):
        q = quotas.get(team_id)
        view = TeamQuota(q.nominal_gpus, q.borrowing_limit_gpus, q.lending_limit_gpus) if q else TeamQuota(0)
        lendable += view.lendable_gpus
        borrowed += max(0, used.get(team_id, 0) - view.guaranteed_gpus)
    return lendable, borrowed


def _apply_admission(decision: Admission, now: dt.datetime) -> tuple[str, Verdict | None]:
    """Verify and commit one admission (with its preemptions); ``admitted``, ``waiting`` (with why) or ``skipped``."""
    from .lifecycle import preempt_attempt
    from .tasks import enqueue_dispatch

    with transaction.atomic():
        job = Job.objects.select_for_update(skip_locked=True).filter(pk=decision.job.job_id,
                                                                      state__in=WAITING_STATES).first()
        if job is None or (job.state == JobState.RECOVERING and _has_live_attempt(job)):
            return "skipped", None
        team = Team.objects.select_for_update().get(pk=job.team_id)
        victims = []
        for v in decision.victims:
            victim = (Job.objects.select_for_update(skip_locked=True)
                      .filter(pk=v.job_id, current_attempt_id=v.attempt_id,
                              state__in=[JobState.ADMITTED, JobState.STARTING, JobState.RUNNING]).first())
            if victim is None:
                transaction.set_rollback(True)
                return "waiting", Verdict(False, "capacity", "a job to preempt changed meanwhile; retried next pass",
                                          {"request_gpus": job.total_gpus})
            victims.append(victim)
        pool_offers(job.accelerator_id, now, lock=True)  # lock every pool of the accelerator, in id order
        for victim, v in zip(victims, decision.victims):
            attempt = JobAttempt.objects.get(pk=v.attempt_id)
            preempt_attempt(victim, attempt, reason=f"preempted for job {job.pk} of team {team.slug}, "
                                                    f"within its nominal quota, while team {victim.team_id} borrows")
        verdict, offer, estimate = _verify(job, team, decision, now)
        if not verdict.ok:
            transaction.set_rollback(True)
            return "waiting", verdict
        number = job.attempts.count() + 1
        attempt = JobAttempt.objects.create(
            job=job, number=number, cluster_id=offer.cluster_id, node_pool_id=offer.node_pool_id,
            gpus=job.total_gpus, object_name=f"job-{job.pk}-{number}", usd_per_gpu_hour=offer.usd_per_gpu_hour,
        )
        data = {"cluster": offer.cluster_name, "node_pool_id": offer.node_pool_id, "estimate_usd": str(estimate)}
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


def _verify(job: Job, team: Team, decision: Admission, now: dt.datetime) -> tuple[Verdict, PoolOffer | None, Decimal]:
    """Re-check quota, cohort lending, victims' nominal, the pool's room and the budgets on fresh (locked) rows."""
    acc = job.accelerator_id
    quota_row = Quota.objects.filter(team_id=job.team_id, accelerator_id=acc, cluster__isnull=True).first()
    quota = quota_row and QuotaView(quota_row.nominal_gpus, quota_row.borrowing_limit_gpus, quota_row.max_gpus_per_job)
    used = team_used_gpus(job.team_id, acc)
    verdict = check_quota(job.total_gpus, used, quota)
    if not verdict.ok:
        return verdict, None, Decimal(0)
    q = TeamQuota(quota_row.nominal_gpus, quota_row.borrowing_limit_gpus, quota_row.lending_limit_gpus)
    lendable, borrowed = _cohort_usage(team, acc)
    if not cohort_has_room(lendable, borrowed, used, q.guaranteed_gpus, job.total_gpus):
        return Verdict(False, "quota", f"the cohort lends {lendable} GPUs and {borrowed} are borrowed; "
                                       f"{job.total_gpus} more do not fit",
                       {"request_gpus": job.total_gpus, "used_gpus": used, "cohort_lendable_gpus": lendable,
                        "cohort_borrowed_gpus": borrowed}), None, Decimal(0)
    for owner_id in {v.team_id for v in decision.victims}:
        owner_quota = Quota.objects.filter(team_id=owner_id, accelerator_id=acc, cluster__isnull=True).first()
        if team_used_gpus(owner_id, acc) < (owner_quota.nominal_gpus if owner_quota else 0):
            return Verdict(False, "quota", "preemption would reach into another team's nominal quota",
                           {"request_gpus": job.total_gpus}), None, Decimal(0)
    request = placement_request(job)
    offers = pool_offers(acc, now, lock=True)
    caps = cluster_caps(job.team_id, acc)
    if caps:  # the team row is locked: no other admission of this team counts meanwhile
        used_on = team_cluster_used(job.team_id, acc)
        capped = [o for o in offers if o.cluster_id in caps and used_on.get(o.cluster_id, 0) + job.total_gpus > caps[o.cluster_id]]
        offers = [o for o in offers if o not in capped]
        if not offers:
            names = sorted({o.cluster_name for o in capped})
            return Verdict(False, "quota", f"the team's per-cluster quota leaves no room for {job.total_gpus} GPUs on "
                                           f"{', '.join(names)}",
                           {"request_gpus": job.total_gpus, "clusters": names}), None, Decimal(0)
    if decision.victims:
        chosen = next((o for o in offers if o.node_pool_id == decision.offer.node_pool_id and fits_now(request, o)), None)
    else:
        chosen = choose_pool(request, offers)
    if chosen is None:
        return Verdict(False, "capacity", "no healthy node pool matching the job has room now",
                       {"request_gpus": job.total_gpus}), None, Decimal(0)
    estimate = estimate_cost(job.total_gpus, job.max_runtime_seconds, chosen.usd_per_gpu_hour)
    verdict = check_budgets(estimate, budget_views(job.team_id, now))
    return verdict, chosen, estimate


def _apply_rejection(decision: Rejection) -> bool:
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


def _store_waiting(infos: dict[int, tuple[str, str, dict]], rows: dict[int, dict]) -> None:
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


def _waiting_info(w: Waiting, keep_position: dict | None = None) -> tuple[str, str, dict]:
    info = w.info()
    if keep_position is not None:
        if keep_position.get("position"):
            info["position"] = keep_position["position"]
        else:
            info.pop("position")
    return w.reason, w.message, info


def _run_pass(loaded: _Loaded, decisions: Decisions, now: dt.datetime, *, positions: bool = True) -> PassResult:
    result = PassResult()
    infos: dict[int, tuple[str, str, dict]] = {}
    for decision in decisions.admissions:
        outcome, verdict = _apply_admission(decision, now)
        if outcome == "admitted":
            result.admitted.append(decision.job.job_id)
            metrics.ADMISSIONS.inc()
            metrics.PREEMPTIONS.inc(len(decision.victims))
        elif outcome == "waiting":
            result.waiting += 1
            infos[decision.job.job_id] = (verdict.reason, verdict.message,
                                          {"reason": verdict.reason, "message": verdict.message, **verdict.detail})
        else:
            result.skipped += 1
    for decision in decisions.rejections:
        if _apply_rejection(decision):
            result.rejected += 1
            metrics.REJECTIONS.labels(reason=decision.verdict.reason).inc()
        else:
            result.skipped += 1
    for job_id, w in decisions.waiting.items():
        result.waiting += 1
        infos[job_id] = _waiting_info(w, None if positions else loaded.rows[job_id]["queue_info"] or {})
    _store_waiting(infos, loaded.rows)
    return result


def try_admit(job_id: int, now: dt.datetime | None = None) -> str:
    """One admission attempt for one job; returns ``admitted``, ``waiting``, ``rejected`` or ``skipped``.

    ``skipped`` means the job is no longer waiting or another scheduler holds it.
    The rules are the pass's, with only this job in the queue; its stored
    queue positions are kept until the next pass.
    """
    now = now or timezone.now()
    loaded = load_snapshot(now, job_ids=[job_id])
    if not loaded.snapshot.queue:
        return "skipped"
    result = _run_pass(loaded, FairShareScheduler(loaded.snapshot).full_pass(), now, positions=False)
    if result.admitted:
        return "admitted"
    if result.rejected:
        return "rejected"
    return "waiting" if result.waiting else "skipped"


def schedule_pending(limit: int | None = None) -> PassResult:
    """One scheduling pass over every waiting job (or the first ``limit`` in priority order); safe to run concurrently.

    The fair-share core decides on a snapshot; each admission is then
    verified and committed in its own transaction (see the module docstring).
    """
    now = timezone.now()
    loaded = load_snapshot(now, limit=limit)
    if not loaded.snapshot.queue:
        return PassResult()
    return _run_pass(loaded, FairShareScheduler(loaded.snapshot).full_pass(), now)


# Key of the PostgreSQL advisory lock held by the pass that serves queued submissions.
SCHEDULER_LOCK_KEY = 0x6A6F6273  # "jobs"


def schedule_coalesced() -> PassResult | None:
    """Run passes until no job arrived during the last one, unless another process is already doing so.

    Returns None when another pass holds the lock (it re-checks for jobs
    submitted while it ran, and the periodic pass catches any left) or when
    this pass was deferred (below). Without PostgreSQL (SQLite, one worker)
    it simply runs one pass. Correctness never depends on this lock:
    ``try_admit`` holds its own row locks.

    First it clears the Redis flag ``controlplane:schedule-pending`` (see
    ``jobs.tasks.publish_schedule``), *before* reading the queue. Ordering
    argument: a submission whose ``SET NX`` fails found the flag set; its job
    committed before that SET, so before the DELETE that clears this
    particular flag value, and that DELETE is followed by this pass's read of
    the queue, which therefore sees the job. A submission arriving after the
    DELETE sets the flag anew and publishes its own pass. A lost task leaves
    the flag for at most 30 s (its expiry); meanwhile the periodic pass
    (every 10 s) admits the jobs.

    Pacing (Redis broker only): a pass reads every waiting job, so under a
    storm of submissions back-to-back passes would cost the queue's length
    per handful of new jobs. After a pass of ``d`` seconds the next one waits
    ``min(d x SCHEDULE_PASS_PAUSE_FACTOR, SCHEDULE_PASS_PAUSE_MAX_SECONDS)``
    (Slurm's ``sched_min_interval`` plays the same part): a pass that comes
    too early publishes itself again with that countdown, leaving the flag
    set so that submissions meanwhile publish nothing, and returns. The
    deferred copy clears the flag when it runs, so the ordering argument
    above holds for it. With the defaults (factor 6) the scheduler uses at
    most a seventh of a core, new jobs wait at most 2 s for a pass, and a
    pass over a short queue (under 20 ms) delays nothing.
    """
    from .tasks import clear_schedule_flag, defer_schedule, pass_pause_remaining, record_pass

    if connection.vendor != "postgresql":
        clear_schedule_flag()
        return schedule_pending()
    wait = pass_pause_remaining()
    if wait > 0:
        defer_schedule(wait, own_flag=True)
        return None
    clear_schedule_flag()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [SCHEDULER_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return None
    try:
        total = PassResult()
        while True:
            # Ids grow with submission: any id above the newest seen now arrived during the pass.
            newest = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            started = time.monotonic()
            result = schedule_pending()
            pause = record_pass(time.monotonic() - started)
            total.admitted += result.admitted
            total.waiting, total.rejected = result.waiting, total.rejected + result.rejected
            if not Job.objects.filter(state=JobState.QUEUED, pk__gt=newest).exists():
                return total
            if pause > 0:  # jobs arrived: a paced pass serves them, and this worker is free meanwhile
                defer_schedule(pause, own_flag=False)
                return total
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [SCHEDULER_LOCK_KEY])
