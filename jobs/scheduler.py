"""The scheduling pass: admit waiting jobs against quota, budget and capacity, and place them.

For each waiting job (QUEUED, or RECOVERING without a live attempt) in
priority order, then submission order, one transaction:

1. lock the job row (SKIP LOCKED: another scheduler owns it), then the
   team row (serialises every admission of one team, so quota and budget
   checks see all the team's reservations), then the candidate node pools in
   id order (serialises capacity; one global order, so no deadlock);
2. ask the pure rules (``quotas.admission``, ``runners.placement``);
3. create the attempt and move the job to ADMITTED by compare-and-set, and
   enqueue its dispatch on commit.

On SQLite the IMMEDIATE transaction mode serialises whole transactions,
which gives the same guarantee.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from decimal import ROUND_HALF_EVEN, Decimal

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from costs.catalog import NoPrice, price_at
from costs.models import CostEntry, Price
from quotas.admission import OK, BudgetView, QuotaView, Verdict, check_budgets, check_quota
from quotas.models import Budget, Quota, Team
from runners.models import Cluster, NodePool
from runners.placement import PlacementRequest, PoolOffer, choose_pool, matches

from .models import ACTIVE_STATES, Job, JobAttempt, JobState
from .states import StaleState, record_event, transition

log = logging.getLogger(__name__)

WAITING_STATES = (JobState.QUEUED, JobState.RECOVERING)
ESTIMATE_QUANTUM = Decimal("0.000001")


@dataclasses.dataclass
class PassResult:
    """Counts from one scheduling pass."""

    admitted: list[int] = dataclasses.field(default_factory=list)
    waiting: int = 0
    rejected: int = 0
    skipped: int = 0


def estimate_cost(total_gpus: int, max_runtime_seconds: int, usd_per_gpu_hour: Decimal) -> Decimal:
    """Worst-case cost of an attempt, USD: GPUs x max_runtime (s) / 3600 x price, to 1e-6 half-even."""
    return (Decimal(total_gpus) * Decimal(max_runtime_seconds) * usd_per_gpu_hour / Decimal(3600)).quantize(
        ESTIMATE_QUANTUM, ROUND_HALF_EVEN
    )


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


def budget_views(team_id: int, now: dt.datetime) -> list[BudgetView]:
    """The team's budgets in their current period, with spent (ledger) and committed (running estimates) USD."""
    views = []
    remaining_estimates = Job.objects.filter(team_id=team_id, state__in=ACTIVE_STATES).values_list(
        "estimated_cost_usd", "accrued_cost_usd"
    )
    committed_usd = sum((max(est - acc, Decimal(0)) for est, acc in remaining_estimates), Decimal(0))
    for budget in Budget.objects.filter(team_id=team_id):
        start, end = budget.window(now)
        if start is None or not (start <= now < end):
            continue
        spent = (
            CostEntry.objects.filter(team_id=team_id, interval_start__gte=start, interval_start__lt=end)
            .aggregate(s=Sum("amount_usd"))["s"]
            or Decimal(0)
        )
        views.append(BudgetView(budget.pk, budget.amount_usd, spent, committed_usd, budget.action))
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


def _wait(job: Job, verdict: Verdict) -> None:
    """Keep ``job`` waiting and record why: queue_info gets the numbers; an event only when the reason changes."""
    info = {"reason": verdict.reason, "message": verdict.message, **verdict.detail}
    if job.queue_info != info:
        Job.objects.filter(pk=job.pk, state=job.state).update(queue_info=info, state_reason=verdict.message[:500])
    if job.queue_info.get("reason") != verdict.reason:
        record_event(job, "waiting", verdict.message, data=info)


def _reject(job: Job, verdict: Verdict) -> None:
    if job.state == JobState.QUEUED:
        transition(job, JobState.REJECTED, reason=verdict.message, data={"reason": verdict.reason, **verdict.detail},
                   queue_info={})
    else:  # a RECOVERING job that no longer fits (quota lowered): it fails rather than waits forever
        transition(job, JobState.FAILED, reason=verdict.message, data={"reason": verdict.reason, **verdict.detail})


def try_admit(job_id: int, now: dt.datetime | None = None) -> str:
    """One admission attempt for one job; returns ``admitted``, ``waiting``, ``rejected`` or ``skipped``.

    ``skipped`` means the job is no longer waiting or another scheduler holds it.
    """
    return _try_admit(job_id, now)[0]


def _try_admit(job_id: int, now: dt.datetime | None = None) -> tuple[str, Verdict]:
    """``try_admit`` that also returns the verdict that keeps a job waiting (or OK)."""
    from .tasks import enqueue_dispatch

    now = now or timezone.now()
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(skip_locked=True)
            .filter(pk=job_id, state__in=WAITING_STATES)
            .first()
        )
        if job is None or (job.state == JobState.RECOVERING and _has_live_attempt(job)):
            return "skipped", OK
        Team.objects.select_for_update().filter(pk=job.team_id).first()

        quota_row = Quota.objects.filter(team_id=job.team_id, accelerator_id=job.accelerator_id, cluster__isnull=True).first()
        quota = quota_row and QuotaView(quota_row.nominal_gpus, quota_row.borrowing_limit_gpus, quota_row.max_gpus_per_job)
        verdict = check_quota(job.total_gpus, team_used_gpus(job.team_id, job.accelerator_id), quota)
        if not verdict.ok:
            (_reject if verdict.never else _wait)(job, verdict)
            return ("rejected" if verdict.never else "waiting"), verdict

        request = placement_request(job)
        offers = pool_offers(job.accelerator_id, now, lock=True)
        offer = choose_pool(request, offers)
        if offer is None:
            matching = [o for o in offers if matches(request, o)]
            verdict = Verdict(
                False, "capacity",
                "no healthy node pool matching the job has room now" if matching else "no node pool can ever hold this job",
                {"request_gpus": request.total_gpus, "free_gpus_by_pool": {str(o.node_pool_id): o.free_gpus for o in matching}},
            )
            _wait(job, verdict)
            return "waiting", verdict

        estimate = estimate_cost(job.total_gpus, job.max_runtime_seconds, offer.usd_per_gpu_hour)
        cheapest = min(o.usd_per_gpu_hour for o in offers if matches(request, o))
        verdict = check_budgets(estimate, budget_views(job.team_id, now))
        if not verdict.ok:
            never = verdict.never and estimate_cost(job.total_gpus, job.max_runtime_seconds, cheapest) > Decimal(
                verdict.detail["amount_usd"]
            )
            verdict = dataclasses.replace(verdict, never=never)
            (_reject if never else _wait)(job, verdict)
            return ("rejected" if never else "waiting"), verdict

        number = job.attempts.count() + 1
        attempt = JobAttempt.objects.create(
            job=job, number=number, cluster_id=offer.cluster_id, node_pool_id=offer.node_pool_id,
            gpus=job.total_gpus, object_name=f"job-{job.pk}-{number}", usd_per_gpu_hour=offer.usd_per_gpu_hour,
        )
        try:
            transition(
                job, JobState.ADMITTED, reason=f"placed on {offer.cluster_name} at ${offer.usd_per_gpu_hour}/GPU-h",
                attempt=attempt, current_attempt=attempt, estimated_cost_usd=job.accrued_cost_usd + estimate,
                data={"cluster": offer.cluster_name, "node_pool_id": offer.node_pool_id, "estimate_usd": str(estimate)},
            )
        except StaleState:
            transaction.set_rollback(True)
            return "skipped", OK
        enqueue_dispatch(attempt.pk)
        return "admitted", OK


def _has_live_attempt(job: Job) -> bool:
    return job.attempts.filter(ended_at__isnull=True).exists()


def waiting_jobs(limit: int | None = None) -> list[tuple]:
    """Waiting jobs in admission order (priority, high first, then submission time).

    Rows of ``(id, team_id, accelerator_id, GPUs per node, total GPUs, preemptible, placement)``.
    """
    qs = (
        Job.objects.filter(state__in=WAITING_STATES)
        .order_by("-priority", "created_at", "pk")
        .values_list("pk", "team_id", "accelerator_id", "nodes", "gpus_per_node", "preemptible", "spec__placement")
    )
    rows = qs[:limit] if limit else qs
    return [(pk, team, acc, gpn, nodes * gpn, pre, repr(placement)) for pk, team, acc, nodes, gpn, pre, placement in rows]


def schedule_pending(limit: int | None = None) -> PassResult:
    """One scheduling pass over every waiting job (or the first ``limit``); safe to run concurrently.

    Within a pass, usage only grows, so once a job of ``n`` GPUs waits for
    its team's quota, no job of that team and accelerator asking ``n`` or
    more can be admitted in the same pass; likewise for capacity, for jobs
    of the same node shape (GPUs per node) and placement. Such jobs are skipped without a transaction, which keeps
    a pass over a long queue cheap. They are looked at again next pass.
    """
    result = PassResult()
    now = timezone.now()
    # (team, accelerator) -> (smallest GPU count that waited for quota, limit, per-job cap); jobs
    # above the limit or cap are still tried, because they must be rejected, not skipped.
    quota_floor: dict[tuple, tuple[int, int, int]] = {}
    capacity_floor: dict[tuple, int] = {}
    for job_id, team_id, accelerator_id, per_node, gpus, preemptible, placement in waiting_jobs(limit):
        quota_key = (team_id, accelerator_id)
        capacity_key = (accelerator_id, per_node, preemptible, placement)
        floor, quota_limit, cap = quota_floor.get(quota_key, (gpus + 1, 0, 0))
        if (floor <= gpus <= quota_limit and (not cap or gpus <= cap)) or gpus >= capacity_floor.get(capacity_key, gpus + 1):
            result.waiting += 1
            continue
        outcome, verdict = _try_admit(job_id, now)
        if outcome == "admitted":
            result.admitted.append(job_id)
        elif outcome == "waiting":
            result.waiting += 1
            if verdict.reason == "quota":
                d = verdict.detail
                quota_floor[quota_key] = (min(gpus, floor), d["nominal_gpus"] + d["borrowing_limit_gpus"],
                                          d.get("max_gpus_per_job", 0))
            elif verdict.reason == "capacity":
                capacity_floor[capacity_key] = min(gpus, capacity_floor.get(capacity_key, gpus))
        elif outcome == "rejected":
            result.rejected += 1
        else:
            result.skipped += 1
    return result


# Key of the PostgreSQL advisory lock held by the pass that serves queued submissions.
SCHEDULER_LOCK_KEY = 0x6A6F6273  # "jobs"


def schedule_coalesced() -> PassResult | None:
    """Run passes until no job arrived during the last one, unless another process is already doing so.

    Returns None when another pass holds the lock (it re-checks for jobs
    submitted while it ran, and the periodic pass catches any left). Without
    PostgreSQL (SQLite, one worker) it simply runs one pass. Correctness
    never depends on this lock: ``try_admit`` holds its own row locks.
    """
    if connection.vendor != "postgresql":
        return schedule_pending()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [SCHEDULER_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return None
    try:
        total = PassResult()
        while True:
            # Ids grow with submission: any id above the newest seen now arrived during the pass.
            newest = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            result = schedule_pending()
            total.admitted += result.admitted
            total.waiting, total.rejected = result.waiting, total.rejected + result.rejected
            if not Job.objects.filter(state=JobState.QUEUED, pk__gt=newest).exists():
                return total
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [SCHEDULER_LOCK_KEY])
