"""Builders of plain snapshots for the pure core's tests (no database)."""

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
         cluster: str | None = None, free: int | None = None, healthy: bool = True) -> PoolOffer:
    """A node pool of ``gpus`` GPUs (``gpus_per_node`` per node) at ``price`` USD/GPU-hour."""
    return PoolOffer(pool_id, pool_id, cluster or f"c{pool_id}", "aws", "us-east-1", capacity_type,
                     gpus // gpus_per_node, gpus_per_node, gpus if free is None else free, Decimal(price), healthy)


def team(team_id: int, nominal: int, borrowing: int = 0, *, lending: int | None = None, cohort=None,
         weight: float = 1.0, used: int = 0, max_per_job: int = 0, budgets=()) -> TeamState:
    return TeamState(team_id, cohort, weight, {H100: TeamQuota(nominal, borrowing, lending, max_per_job)},
                     {H100: used} if used else {}, list(budgets))


def block_budget(amount: str, spent: str = "0", committed: str = "0") -> BudgetView:
    return BudgetView(1, Decimal(amount), Decimal(spent), Decimal(committed), "block")


_ids = itertools.count(1)


def job(team_id: int, gpus: int, *, nodes: int = 1, priority: int = 500, at: float | None = None, job_id=None,
        preemptible: bool = False, runtime: int = 3600) -> QueuedJob:
    """A queued job of ``nodes`` x ``gpus`` GPUs; ``at`` is its submission time (default: the order of creation)."""
    n = next(_ids)
    return QueuedJob(job_id or n, team_id, H100, nodes, gpus, priority, float(n if at is None else at), preemptible,
                     runtime)


def running(job_id: int, team_id: int, gpus: int, pool_id: int, *, priority: int = 500, admitted: float = 0.0,
            preemptible: bool = True) -> RunningJob:
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
    return [a.job.job_id for a in decisions.admissions]
