"""What the submission form shows before a job exists: where it would run now, its estimated cost, and whether its
team's quota and budget allow it, as the core's rules say (``core.assess``); with every node pool that was a
candidate, its price and why it was not chosen (SkyPilot's optimizer table)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

from django.utils import timezone

from core.money import price_per_hour
from quotas.models import Team

from ..models import estimated_runtime
from .core import (
    Assessment,
    BudgetView,
    FairShareScheduler,
    PoolOffer,
    QueuedJob,
    allowed,
    assess,
    capable_nodes,
    job_estimate,
    price_order,
)
from .offers import pool_offers
from .snapshot import job_snapshot, per_node_request, pods_of


def _queued_job(team: Team, resources: dict, placement: dict, now: dt.datetime, kind: str) -> QueuedJob:
    """The not yet stored job as the core reads it (``preview_submission``'s arguments)."""
    accelerator = resources["accelerator"]
    cpu, memory = per_node_request(resources)
    pods, share = pods_of(kind, resources["nodes"], resources.get("replicas", 1))
    return QueuedJob(
        job_id=0, team_id=team.pk, accelerator_id=accelerator.pk, nodes=pods, share_nodes=share,
        gpus_per_node=resources["gpus_per_node"], priority=resources["priority"], submitted=now.timestamp(),
        preemptible=resources["preemptible"], max_runtime_seconds=estimated_runtime(resources["max_runtime_seconds"]),
        providers=tuple(placement.get("providers") or ()), regions=tuple(placement.get("regions") or ()),
        clusters=tuple(placement.get("clusters") or ()), cpu_milli=cpu, memory_mib=memory,
        roles=resources.get("roles") or (), share_milli=int(resources.get("gpu_share_milli") or 0),
        mig_profile=resources.get("mig_profile") or "",
    )


def preview_submission(team: Team, resources: dict, placement: dict, now: dt.datetime | None = None,
                       kind: str = "training") -> Assessment:
    """The core's assessment of a job not yet stored, for ``team``.

    ``resources``: the validated submission's ``accelerator`` (instance),
    ``gpus_per_node``, ``nodes``, ``priority``, ``preemptible`` and
    ``max_runtime_seconds`` (s), and optional ``cpu`` (cores) and
    ``memory_gib`` per node and ``replicas`` (default 1); ``placement``: its
    ``providers``, ``regions`` and ``clusters`` lists; ``kind``: training or
    inference (whose replicas may share a node: ``snapshot.pods_of``). Placement is the scheduler's (cheapest matching
    pool with nodes with room; if none has room, the cheapest that matches,
    where it would wait for capacity); the estimate is GPUs x max runtime x
    that pool's price (USD); the quota verdict is on the limit the team can
    reach (nominal + borrowing limit, at most what its cohort can lend: the
    number every view shows); how much the cohort lends now is decided at
    admission.
    """
    now = now or timezone.now()
    job = _queued_job(team, resources, placement, now, kind)
    unpriced: list = []
    snapshot = job_snapshot(team, job, now, pool_offers(resources["accelerator"].pk, now, lock=False,
                                                        unpriced=unpriced))
    snapshot.unpriced = {job.accelerator_id: unpriced}  # so a job only unpriced pools could hold is told so
    return assess(snapshot, job)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One node pool the job could be placed on, as the preview lists it: the pool (``offer``; its price None when
    the catalog has none), the ``accelerator`` name, the job's ``pods`` on it, USD per hour of the whole job there
    and its estimate for the max runtime (USD; None without a price), whether it ``could_hold`` the job once its
    running work ends and ``fits_now``, whether it is the ``chosen`` one, and ``why_not`` (empty when chosen)."""

    offer: PoolOffer
    accelerator: str
    pods: int
    usd_per_hour: Decimal | None
    estimate_usd: Decimal | None
    could_hold: bool
    fits_now: bool
    chosen: bool = False
    why_not: str = ""


@dataclasses.dataclass(frozen=True)
class Placement:
    """``preview_placement``'s answer: the chosen accelerator's ``assessment`` (``core.assess``), every pool of the
    accelerators the job accepts as a ``Candidate`` (in order of preference, then price), and the team's budgets
    in force (``core.BudgetView``)."""

    assessment: Assessment
    accelerator: str
    candidates: list[Candidate]
    budgets: list[BudgetView]

    @property
    def cheapest_usd(self) -> Decimal | None:
        """The lowest estimate (USD) among the pools that could hold the job; None when none has a price."""
        return min((c.estimate_usd for c in self.candidates if c.could_hold and c.estimate_usd is not None),
                   default=None)


def _unmatched_reason(job: QueuedJob, offer: PoolOffer) -> str:
    """Why ``offer`` could never hold ``job`` as the fleet stands (placement, spot rule, health, size), or "" (a
    multi-role job: the first role it could not, named)."""
    for role in job.roles:
        reason = _unmatched_reason(job.role_job(role.name), offer)
        if reason:
            return f"role {role.name}: {reason}"
    if job.roles:
        return ""
    request = job.placement()
    if job.providers and offer.provider not in job.providers:
        return f"provider {offer.provider} is not in spec.placement.providers"
    if job.regions and offer.region not in job.regions:
        return f"region {offer.region} is not in spec.placement.regions"
    if job.clusters and offer.cluster_name not in job.clusters:
        return f"cluster {offer.cluster_name} is not in spec.placement.clusters"
    if not allowed(request, offer):
        return "spot capacity takes preemptible jobs only (spec.preemptible is false)"
    if not offer.healthy:
        return f"cluster {offer.cluster_name} is not healthy"
    if job.gpus_per_node > offer.gpus_per_node:
        return f"its nodes have {offer.gpus_per_node} GPUs, the job asks {job.gpus_per_node} per node"
    ever = capable_nodes(request, offer, schedulable_only=False)
    if ever < job.nodes:
        return f"its nodes can hold {ever} of the job's {job.nodes} pods (GPUs, CPU or memory per node)"
    open_ = capable_nodes(request, offer, schedulable_only=True)
    if open_ < job.nodes:
        return (f"cordoned or tainted nodes leave room for {open_} of the job's {job.nodes} pods; "
                f"it could run here once they take work again")
    return ""


def _per_hour(job: QueuedJob, offer: PoolOffer) -> Decimal:
    """USD per hour of the whole job on ``offer`` (its estimate for 3600 s)."""
    return job_estimate(dataclasses.replace(job, max_runtime_seconds=3600), offer)


def _candidates(scheduler: FairShareScheduler, job: QueuedJob, accelerator: str, offers: list[PoolOffer],
                unpriced: list[PoolOffer]) -> list[Candidate]:
    """``accelerator``'s pools as ``Candidate``s, priced ones in the order placement tries them, then the unpriced."""
    room, rows = scheduler.evaluator.room, []
    for offer in sorted(offers, key=price_order):
        reason = _unmatched_reason(job, offer)
        if job.roles:
            fits = not reason and room.place_gang(job, [offer])[0] is not None
        else:
            fits = not reason and room.place(job, job.accelerator_id, [offer], (offer.node_pool_id,)) is not None
        rows.append(Candidate(offer, accelerator, job.nodes, _per_hour(job, offer), job_estimate(job, offer),
                              could_hold=not reason, fits_now=fits, why_not=reason))
    for offer in unpriced:
        rows.append(Candidate(offer, accelerator, job.nodes, None, None, could_hold=False, fits_now=False,
                              why_not="the price catalog has no price in force for this pool"))
    return rows


def _why_not(row: Candidate, chosen: Candidate) -> str:
    """Why ``row`` (which could hold the job) is not the ``chosen`` pool."""
    if row.accelerator != chosen.accelerator:
        return f"{chosen.accelerator} comes first in the job's order of preference"
    if chosen.fits_now and not row.fits_now:
        return f"no room now ({row.offer.free_gpus} GPUs free)"
    if row.usd_per_hour is not None and chosen.usd_per_hour is not None and row.usd_per_hour > chosen.usd_per_hour:
        return (f"${price_per_hour(row.usd_per_hour)}/hour, more than the chosen "
                f"${price_per_hour(chosen.usd_per_hour)}/hour")
    return f"same price; {chosen.offer.label} comes first (cluster name, then pool)"


def preview_placement(team: Team, resources: dict, placement: dict, *, kind: str = "training",
                      alternatives: tuple = (), now: dt.datetime | None = None) -> Placement:
    """``preview_submission`` with every candidate pool: the job is assessed on its accelerator and on each of its
    ``alternatives`` (Accelerator instances, in order of preference) as the scheduler tries them (the first where
    it fits now wins; else the first with a pool that could hold it), and every pool of those accelerators is
    listed with its price, estimate (USD) and why it was not chosen. Arguments as ``preview_submission``'s."""
    now = now or timezone.now()
    base = _queued_job(team, resources, placement, now, kind)
    tried: list[tuple[Assessment, str, list[Candidate]]] = []
    budgets: list[BudgetView] = []
    for accelerator in (resources["accelerator"], *alternatives):
        job = dataclasses.replace(base, accelerator_id=accelerator.pk)
        unpriced: list[PoolOffer] = []
        offers = pool_offers(accelerator.pk, now, lock=False, unpriced=unpriced)
        snapshot = job_snapshot(team, job, now, offers)
        snapshot.unpriced = {accelerator.pk: unpriced}  # so a job only unpriced pools could hold is told so
        scheduler = FairShareScheduler(snapshot)
        budgets = budgets or snapshot.teams[team.pk].budgets
        tried.append((scheduler.assess(job), accelerator.name, _candidates(scheduler, job, accelerator.name, offers,
                                                                           unpriced)))
    assessment, name, _ = next((t for t in tried if t[0].fits_now), None) or next(
        (t for t in tried if t[0].offer is not None), tried[0])
    rows = [row for _, _, found in tried for row in found]
    chosen = next((r for r in rows if assessment.offer is not None and r.accelerator == name
                   and r.offer.node_pool_id == assessment.offer.node_pool_id), None)
    if chosen is not None:
        rows = [dataclasses.replace(r, chosen=True) if r is chosen else
                r if r.why_not else dataclasses.replace(r, why_not=_why_not(r, chosen)) for r in rows]
    return Placement(assessment, name, rows, budgets)
