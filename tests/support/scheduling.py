"""Builders of plain values for the pure scheduling core's tests (no database): pool offers, teams, budgets,
queued and running jobs, snapshots, and one full pass.

One accelerator (``H100``); teams are numbered; GPU counts are whole GPUs; prices USD per GPU-hour (strings).
"""

from __future__ import annotations

import dataclasses
import itertools
from decimal import Decimal

from jobs.scheduling.core import (
    UNLIMITED,
    BudgetView,
    FairShareScheduler,
    NodeRoom,
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
         region: str = "us-east-1", nodes: int | None = None, node_free: list[int] | None = None,
         cpu: int = UNLIMITED, memory: int = UNLIMITED, cordoned: tuple[int, ...] = (),
         domains: list[str] | None = None, cpu_free: list[int] | None = None) -> PoolOffer:
    """The offer of a node pool of ``gpus`` GPUs (``gpus_per_node`` per node, or ``nodes`` of them) at ``price``
    USD/GPU-hour, on cluster ``cluster`` (default ``c<pool_id>``, whose id is ``pool_id``).

    Its nodes are named ``<pool_id>-<i>``; ``node_free`` gives each node's free GPUs, else ``free`` GPUs
    (default all) are free with the used ones filling the first nodes. ``cpu`` (millicores) and ``memory``
    (MiB) are each node's allocatable, all free unless ``cpu_free`` says each node's free CPU; ``cordoned``: indexes of nodes that take no new pod;
    ``domains``: each node's topology domain.
    """
    nodes = gpus // gpus_per_node if nodes is None else nodes
    if node_free is None:
        used = nodes * gpus_per_node - (nodes * gpus_per_node if free is None else free)
        node_free = []
        for _ in range(nodes):
            taken = min(used, gpus_per_node)
            used -= taken
            node_free.append(gpus_per_node - taken)
    rooms = tuple(NodeRoom(f"{pool_id}-{i}", gpus_per_node, f, cpu, cpu_free[i] if cpu_free else cpu, memory, memory,
                           domains[i] if domains else "", i not in cordoned) for i, f in enumerate(node_free))
    return PoolOffer(pool_id, pool_id, cluster or f"c{pool_id}", provider, region, capacity_type,
                     nodes, gpus_per_node, sum(r.free_gpus for r in rooms if r.schedulable), Decimal(price), healthy,
                     rooms)


def team(team_id: int, nominal: int, borrowing: int = 0, *, lending: int | None = None, cohort=None,
         weight: float = 1.0, used: int = 0, max_per_job: int = 0, budgets=(), strategy: str = "BestEffortFIFO",
         accelerator: int = H100) -> TeamState:
    """A team with a quota of ``accelerator`` (default H100: ``nominal`` + ``borrowing``, ``lending`` limit) using
    ``used`` GPUs, queueing by ``strategy``."""
    return TeamState(team_id, cohort, weight, {accelerator: TeamQuota(nominal, borrowing, lending, max_per_job)},
                     {accelerator: used} if used else {}, list(budgets), strategy=strategy)


def block_budget(amount: str, spent: str = "0", committed: str = "0", budget_id: int = 1) -> BudgetView:
    """A budget that blocks admission at ``amount`` USD, ``spent`` and ``committed`` already."""
    return BudgetView(budget_id, Decimal(amount), Decimal(spent), Decimal(committed), "block")


def alert_budget(amount: str, spent: str = "0", committed: str = "0", budget_id: int = 2) -> BudgetView:
    """A budget that only alerts at ``amount`` USD."""
    return BudgetView(budget_id, Decimal(amount), Decimal(spent), Decimal(committed), "alert")


_ids = itertools.count(1)


def job(team_id: int, gpus: int, *, nodes: int = 1, priority: int = 500, at: float | None = None, job_id=None,
        preemptible: bool = False, runtime: int = 3600, cpu: int = 0, memory: int = 0,
        alternatives: tuple[int, ...] = ()) -> QueuedJob:
    """A queued H100 job of ``nodes`` x ``gpus`` GPUs with ``cpu`` millicores and ``memory`` MiB per node (or one of
    the ``alternatives`` accelerators); ``at`` is its submission time (default: the order of creation)."""
    n = next(_ids)
    return QueuedJob(job_id or n, team_id, H100, nodes, gpus, priority, float(n if at is None else at), preemptible,
                     runtime, cpu_milli=cpu, memory_mib=memory, alternatives=alternatives)


def running(job_id: int, team_id: int, gpus: int, pool_id: int, *, priority: int = 500, admitted: float = 0.0,
            preemptible: bool = True, nodes: int = 1, node_names: tuple[str, ...] = (),
            accelerator: int = H100) -> RunningJob:
    """A live attempt (id ``1000 + job_id``) of ``gpus`` GPUs over ``nodes`` nodes of ``pool_id``, admitted at
    ``admitted``; on ``node_names``, else ``snapshot`` puts it on the pool's first nodes with room."""
    return RunningJob(job_id, 1000 + job_id, team_id, accelerator, pool_id, gpus, priority, admitted, preemptible,
                      tuple(node_names), gpus // nodes)


def snapshot(teams, pools, queue, runs=(), *, accelerator: int = H100) -> Snapshot:
    """A snapshot whose teams' usage and nodes' free GPUs already count the ``runs`` (live attempts); a run without
    node names is given the first nodes of its pool with room, in node order."""
    teams = {t.team_id: t for t in teams}
    by_id = {p.node_pool_id: p for p in pools}
    free = {p.node_pool_id: {r.name: r.free_gpus for r in p.rooms()} for p in pools}
    placed = []
    for r in runs:
        teams[r.team_id].used[r.accelerator_id] = teams[r.team_id].used.get(r.accelerator_id, 0) + r.gpus
        names = r.node_names
        if names:
            for n in names:
                free[r.node_pool_id][n] -= r.gpus_per_node
        else:  # whole nodes' worth first where the run's nodes fit, else GPUs poured onto the first nodes with room
            count = r.gpus // r.gpus_per_node if r.gpus_per_node else 1
            names = tuple([n for n, f in free[r.node_pool_id].items() if f >= r.gpus_per_node][:count])
            if len(names) == count:
                for n in names:
                    free[r.node_pool_id][n] -= r.gpus_per_node
            else:
                left, names = r.gpus, []
                for n, f in free[r.node_pool_id].items():
                    take = min(f, left)
                    if take:
                        free[r.node_pool_id][n] -= take
                        names.append(n)
                        left -= take
                assert left == 0, f"no room for running job {r.job_id} on pool {r.node_pool_id}"
                per = r.gpus // len(names)
                assert per * len(names) == r.gpus or not r.preemptible, "a preemptible run must hold equal nodes"
                names = tuple(names)
                r = dataclasses.replace(r, gpus_per_node=per)
            r = dataclasses.replace(r, node_names=names)
        placed.append(r)
    offers = []
    for pid, p in by_id.items():
        rooms = tuple(dataclasses.replace(n, free_gpus=free[pid][n.name]) for n in p.rooms())
        offers.append(dataclasses.replace(p, node_rooms=rooms,
                                          free_gpus=sum(n.free_gpus for n in rooms if n.schedulable)))
    return Snapshot(teams, {accelerator: offers}, list(queue), placed)


def decide(teams, pools, queue, runs=()):
    """One full pass; returns (decisions, scheduler)."""
    scheduler = FairShareScheduler(snapshot(teams, pools, queue, runs))
    return scheduler.full_pass(), scheduler


def admitted(decisions) -> list[int]:
    """The ids of the jobs a pass admitted, in order."""
    return [a.job.job_id for a in decisions.admissions]
