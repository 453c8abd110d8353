"""Builders of plain values for the pure scheduling core's tests (no database): pool offers, teams, budgets,
queued and running jobs, snapshots, and one full pass.

One accelerator (``H100``); teams are numbered; GPU counts are whole GPUs; prices USD per GPU-hour (strings).
"""

from __future__ import annotations

import dataclasses
import itertools
from decimal import Decimal

from jobs.scheduling.core import (
    BudgetView,
    FairShareScheduler,
    PoolOffer,
    QueuedJob,
    RunningJob,
    Snapshot,
    TeamQuota,
    TeamState,
)

H100 = 1


def pool(pool_id: int, gpus: int = 16, *, gpus_per_node: int = 8, price: str = "4.00", capacity_type: str = "on-demand",
         cluster: str | None = None, free: int | None = None, healthy: bool = True, provider: str = "aws",
         region: str = "us-east-1", nodes: int | None = None) -> PoolOffer:
    """The offer of a node pool of ``gpus`` GPUs (``gpus_per_node`` per node, or ``nodes`` of them) at ``price``
    USD/GPU-hour, on cluster ``cluster`` (default ``c<pool_id>``, whose id is ``pool_id``); ``free`` GPUs
    (default all)."""
    nodes = gpus // gpus_per_node if nodes is None else nodes
    return PoolOffer(pool_id, pool_id, cluster or f"c{pool_id}", provider, region, capacity_type,
                     nodes, gpus_per_node, gpus if free is None else free, Decimal(price), healthy)


def team(team_id: int, nominal: int, borrowing: int = 0, *, lending: int | None = None, cohort=None,
         weight: float = 1.0, used: int = 0, max_per_job: int = 0, budgets=()) -> TeamState:
    """A team with an H100 quota (``nominal`` + ``borrowing``, ``lending`` limit) using ``used`` GPUs."""
    return TeamState(team_id, cohort, weight, {H100: TeamQuota(nominal, borrowing, lending, max_per_job)},
                     {H100: used} if used else {}, list(budgets))


def block_budget(amount: str, spent: str = "0", committed: str = "0", budget_id: int = 1) -> BudgetView:
    """A budget that blocks admission at ``amount`` USD, ``spent`` and ``committed`` already."""
    return BudgetView(budget_id, Decimal(amount), Decimal(spent), Decimal(committed), "block")


def alert_budget(amount: str, spent: str = "0", committed: str = "0", budget_id: int = 2) -> BudgetView:
    """A budget that only alerts at ``amount`` USD."""
    return BudgetView(budget_id, Decimal(amount), Decimal(spent), Decimal(committed), "alert")


_ids = itertools.count(1)


def job(team_id: int, gpus: int, *, nodes: int = 1, priority: int = 500, at: float | None = None, job_id=None,
        preemptible: bool = False, runtime: int = 3600) -> QueuedJob:
    """A queued job of ``nodes`` x ``gpus`` GPUs; ``at`` is its submission time (default: the order of creation)."""
    n = next(_ids)
    return QueuedJob(job_id or n, team_id, H100, nodes, gpus, priority, float(n if at is None else at), preemptible,
                     runtime)


def running(job_id: int, team_id: int, gpus: int, pool_id: int, *, priority: int = 500, admitted: float = 0.0,
            preemptible: bool = True) -> RunningJob:
    """A live attempt (id ``1000 + job_id``) of ``gpus`` GPUs on ``pool_id``, admitted at ``admitted``."""
    return RunningJob(job_id, 1000 + job_id, team_id, H100, pool_id, gpus, priority, admitted, preemptible)


def snapshot(teams, pools, queue, runs=()) -> Snapshot:
    """A snapshot whose teams' usage and pools' free GPUs already count the ``runs`` (live attempts)."""
    teams = {t.team_id: t for t in teams}
    held: dict[int, int] = {}
    for r in runs:
        teams[r.team_id].used[H100] = teams[r.team_id].used.get(H100, 0) + r.gpus
        held[r.node_pool_id] = held.get(r.node_pool_id, 0) + r.gpus
    offers = [dataclasses.replace(p, free_gpus=p.free_gpus - held.get(p.node_pool_id, 0)) for p in pools]
    return Snapshot(teams, {H100: offers}, list(queue), list(runs))


def decide(teams, pools, queue, runs=()):
    """One full pass; returns (decisions, scheduler)."""
    scheduler = FairShareScheduler(snapshot(teams, pools, queue, runs))
    return scheduler.full_pass(), scheduler


def admitted(decisions) -> list[int]:
    """The ids of the jobs a pass admitted, in order."""
    return [a.job.job_id for a in decisions.admissions]
