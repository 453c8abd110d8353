"""Replay of a production GPU trace through the scheduling core, node by node, against reference placers.

Trace: Alibaba's ``cluster-trace-gpu-v2023`` (alibaba/clusterdata), ``openb_node_list_gpu_node.csv`` (1,213 GPU
nodes) and ``openb_pod_list_multigpu50.csv`` (9,061 tasks), published with "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent" (Weng et al., USENIX ATC 2023), kept in
``benchmarks/data/openb-multigpu50`` (``--trace DIR`` for another copy) as ``nodes.csv`` and ``tasks.csv`` (columns are
read by name: ``sn``, ``cpu_milli``, ``memory_mib``, ``gpu``, ``model``; ``cpu_milli``, ``memory_mib``, ``num_gpu``,
``gpu_milli``). CPU-only tasks are counted and left out: the platform runs them on CPU pools, not on GPU nodes.

The shared fill (``shared_fill``, ``benchmarks/trace_shares.py``) replays every GPU task, whole and fractional, on
nodes whose GPUs are taken whole or in shares, through the core and against first-fit, best-fit and the paper's FGD
written in ``trace_shares``; its allocation at 130 % demand over the best reference's is ``ratio_vs_best_reference``.

The fleet of the runs below is one accelerator whose node pools are the trace's (GPU model, GPUs per node) groups,
all at one price, each node with its CPU and memory, GPUs whole only; four teams in one cohort whose nominal quotas
sum to the fleet's GPUs, each allowed to borrow up to the whole fleet. Every task is a one-node job asking its GPUs,
CPU and memory.

Two runs of whole-GPU tasks, both through ``FairShareScheduler`` as the platform calls it (a pass when a job
arrives, a full pass from a fresh snapshot when one ends):

- fill (the paper's method): tasks sampled in random order (with replacement), never ending, arrive until their
  demand reaches 100 % and then 130 % of the fleet's GPUs; allocation = allocated GPUs / all GPUs, at both
  points, over several seeds. The core places each sequence twice, with its default packing policy
  (best-fit) and with ``fgd`` (fragmentation gradient descent, the paper's policy, packing for the trace's
  whole-GPU task distribution as its expected workload, as the paper does). Two reference node-level placers
  written here, first-fit (nodes in trace order) and best-fit (the fitting node with the fewest GPUs left, then
  CPU, then memory), place the same task sequence in the same process.
- churn: tasks arrive as a Poisson process and run for log-normal durations (median ``CHURN_MEDIAN_S``,
  sigma ``CHURN_SIGMA``: heavy-tailed, mean = median x exp(sigma^2 / 2)), at an offered load of
  ``CHURN_LOAD`` x the fleet's GPUs; a share of them preemptible. Each arrival gets an incremental pass; the
  GPUs of jobs that end are given back at once and a full pass from a fresh snapshot runs at the next
  ``PASS_INTERVAL_S`` tick (the periodic pass). Reports queue wait percentiles (simulated seconds),
  preemptions, and the CPU time of each full pass against the queue's length.
- backlog (part of churn): arrivals faster than the fleet drains (``BACKLOG_PREFILL`` x the fleet's GPUs at once,
  then ``BACKLOG_LOAD``), every team StrictFIFO and then BestEffortFIFO, each without and with backfill with
  reservations (ADR 0044) on the same arrivals and run times; reports the allocation while jobs waited and queue
  wait p50/p95/p99 overall and for 8-GPU and 1-GPU jobs, ``wait_p99_ratio_8gpu_vs_1gpu``, and the 8-GPU
  jobs' by how many nodes could ever hold them (``gpus_8_by_nodes_able``) (``--backlog-only`` runs it alone).

- constrained fill (``constrained``): the whole-GPU fill with a share (``CONSTRAINED_SHARE``, 30 %) of the tasks held
  to one GPU model of the trace (each pool's cluster name is its model; the task's clusters rule names it), the
  model drawn with weight equal to the GPUs of its nodes that could hold the task (``constrain``; seeds fixed:
  ``CONSTRAINED_SEED`` plus the fill's seed), a platform that saw ``WARM_TASKS`` such tasks the day before; the
  core (best-fit, constraint-aware: ADR 0043) with all teams ``BestEffortFIFO`` and again all ``StrictFIFO``,
  against first-fit and best-fit placers honouring the same constraints (nothing queues there: a task that fits
  nowhere is dropped). ``constrained.ratio_vs_best_reference``: the core's allocation at 130 % over the best
  reference's, the worse of the two strategies; ``strict_fifo_stall_points``: the most allocation points StrictFIFO
  loses to BestEffortFIFO at 100 % or 130 % (heads waiting for a model while others' GPUs stand idle).

An independent checker keeps its own books of every node (GPUs, CPU, memory) from the admissions and preemptions
alone, and counts any admission onto a node without room, onto an unknown node or twice onto one node.

Run: ``.venv/bin/python benchmarks/trace_replay.py [--shared-seeds 3] [--seeds 3] [--constrained-seeds 3]
[--churn-jobs 20000]`` (``--quick``: one seed each, 2,000 churn jobs; ``--shared-only``: the shared fill alone, a few
minutes; ``--constrained-only``, ``--backlog-only``: those alone); a few minutes on 2 cores.
Prints a few lines and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import random
import sys
import time
from decimal import Decimal
from pathlib import Path
from statistics import mean, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import trace_shares as shares  # noqa: E402
from benchmarks.procstat import machine  # noqa: E402
from jobs.scheduling.core import (  # noqa: E402
    QUEUEING_STRATEGIES,
    FairShareScheduler,
    NodeRoom,
    PoolOffer,
    QueuedJob,
    RunningJob,
    Snapshot,
    TeamQuota,
    TeamState,
    workload_of,
)

BEST_EFFORT_FIFO, STRICT_FIFO = QUEUEING_STRATEGIES
TRACE = Path(__file__).resolve().parent / "data" / "openb-multigpu50"
TRACE_FILES = {"nodes.csv": "openb_node_list_gpu_node.csv", "tasks.csv": "openb_pod_list_multigpu50.csv"}
ACC, TEAMS, PRICE = 1, 4, Decimal("2.00")
MILLI = shares.MILLI
#: Tasks a warm platform has seen the day before the shared fill (``platform-warm``).
WARM_TASKS = 2000
#: The constrained scenario: the share of tasks held to one GPU model, and the seed of the draw (plus the fill's seed).
CONSTRAINED_SHARE, CONSTRAINED_SEED = 0.3, 5000
CHURN_MEDIAN_S, CHURN_SIGMA, CHURN_LOAD, CHURN_PREEMPTIBLE = 1800.0, 1.5, 1.6, 0.3
#: The backlog scenario (``backlog``): arrivals faster than the fleet drains (offered load ``BACKLOG_LOAD``), with and
#: without backfill, per queueing strategy; users' max run times are their jobs' run times times up to
#: ``LIMIT_OVER_RUN``; any job waiting ``RESERVE_AFTER_S`` gets a reservation (StrictFIFO heads at once).
BACKLOG_LOAD, BACKLOG_PREFILL, BACKLOG_JOBS, LIMIT_OVER_RUN, RESERVE_AFTER_S = 1.3, 1.5, 6000, 2.0, 600.0
MAX_RESERVATIONS = 64
#: The periodic full pass (``SCHEDULE_INTERVAL_SECONDS``): jobs that end within one interval share one pass.
PASS_INTERVAL_S = 10.0


# --- the trace ------------------------------------------------------------------------------------------------

def load_nodes(path: Path) -> list[tuple[str, str, int, int, int]]:
    """``(name, model, GPUs, CPU millicores, memory MiB)`` of every node with GPUs, in trace order."""
    with path.open() as f:
        return [(r["sn"], r["model"], int(r["gpu"]), int(r["cpu_milli"]), int(r["memory_mib"]))
                for r in csv.DictReader(f) if int(r["gpu"]) > 0]


def load_tasks(path: Path) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int, int]], int]:
    """Whole-GPU tasks as ``(GPUs, CPU millicores, memory MiB)``, fractional ones as ``(1, milli-GPUs, CPU
    millicores, memory MiB)``, and how many CPU-only tasks were left out."""
    whole, fractional, cpu_only = [], [], 0
    with path.open() as f:
        for r in csv.DictReader(f):
            gpus, milli = int(r["num_gpu"]), int(r["gpu_milli"])
            if gpus == 0:
                cpu_only += 1
            elif gpus == 1 and milli < 1000:
                fractional.append((1, milli, int(r["cpu_milli"]), int(r["memory_mib"])))
            else:
                whole.append((gpus, int(r["cpu_milli"]), int(r["memory_mib"])))
    return whole, fractional, cpu_only


# --- the platform's side: snapshots as the database layer would read them ---------------------------------------

class Fleet:
    """The nodes (grouped into pools by model and GPUs per node) and what live attempts hold on each."""

    def __init__(self, nodes):
        self.nodes = {n[0]: n for n in nodes}
        self.pools: dict[tuple[str, int], list[str]] = {}
        for name, model, gpus, _, _ in nodes:
            self.pools.setdefault((model, gpus), []).append(name)
        self.pool_ids = {key: i + 1 for i, key in enumerate(sorted(self.pools))}
        self.held: dict[str, list[int]] = {name: [0, 0, 0] for name in self.nodes}
        self.gpus = sum(n[2] for n in nodes)

    def hold(self, name: str, gpus: int, cpu: int, memory: int, sign: int = 1) -> None:
        h = self.held[name]
        h[0] += sign * gpus
        h[1] += sign * cpu
        h[2] += sign * memory

    def offers(self) -> list[PoolOffer]:
        """Every pool with each node's free GPUs, CPU and memory now (allocatable minus live attempts); a pool's
        cluster name is its GPU model, so the clusters rule holds a task to a model (pools are tried in the same
        order as by id: ids follow the (model, GPUs) order)."""
        out = []
        for key, names in sorted(self.pools.items()):
            rooms = []
            for name in names:
                _, _, g, c, m = self.nodes[name]
                h = self.held[name]
                rooms.append(NodeRoom(name, g, g - h[0], c, c - h[1], m, m - h[2]))
            pid = self.pool_ids[key]
            out.append(PoolOffer(pid, 1, key[0], "onprem", "trace", "on-demand", len(names), key[1],
                                 sum(r.free_gpus for r in rooms), PRICE, True, tuple(rooms), f"{key[0]}-{key[1]}"))
        return out


class Task:
    """A task's per-node shape as ``workload_of`` reads it."""

    __slots__ = ("gpus_per_node", "cpu_milli", "memory_mib")

    def __init__(self, gpus: int, cpu_milli: int, memory_mib: int):
        self.gpus_per_node, self.cpu_milli, self.memory_mib = gpus, cpu_milli, memory_mib


def teams(fleet_gpus: int, strategy: str = BEST_EFFORT_FIFO) -> dict[int, TeamState]:
    """Four teams of one cohort: nominal quotas summing to the fleet, each may borrow up to the whole fleet; each
    queues by ``strategy`` (``BestEffortFIFO`` or ``StrictFIFO``)."""
    share = [fleet_gpus // TEAMS + (1 if t < fleet_gpus % TEAMS else 0) for t in range(TEAMS)]
    return {t: TeamState(t, cohort="trace", quotas={ACC: TeamQuota(share[t], fleet_gpus)}, strategy=strategy)
            for t in range(TEAMS)}


def queued(job_id: int, team: int, task, at: float, preemptible: bool = False, limit: int = 3600,
           model: str = "") -> QueuedJob:
    """The task (``(GPUs, CPU millicores, memory MiB)``) as a one-node job of ``team`` submitted at ``at`` with a max
    run time of ``limit`` seconds, held to GPU ``model`` when given."""
    gpus, cpu, memory = task[:3]
    return QueuedJob(job_id, team, ACC, 1, gpus, 500, at, preemptible, limit, cpu_milli=cpu, memory_mib=memory,
                     clusters=(model,) if model else ())


# --- the independent checker ----------------------------------------------------------------------------------

class Checker:
    """Books of its own: what is left on every node, from the admissions and preemptions it is shown."""

    def __init__(self, nodes):
        self.left = {n[0]: [n[2], n[3], n[4]] for n in nodes}
        self.without_room = 0

    def admit(self, node_names, gpus: int, cpu: int, memory: int) -> None:
        if len(set(node_names)) != len(node_names):
            self.without_room += 1
        for name in node_names:
            left = self.left.get(name)
            if left is None:
                self.without_room += 1
                continue
            left[0] -= gpus
            left[1] -= cpu
            left[2] -= memory
            if min(left) < 0:
                self.without_room += 1

    def release(self, node_names, gpus: int, cpu: int, memory: int) -> None:
        for name in node_names:
            left = self.left[name]
            left[0] += gpus
            left[1] += cpu
            left[2] += memory


# --- reference placers ------------------------------------------------------------------------------------------

def reference_fill(nodes, sequence, policy: str, marks: tuple[int, ...]) -> list[float]:
    """Allocation (allocated GPUs / all GPUs) of ``policy`` (``first-fit`` or ``best-fit``) placing ``sequence``
    (tasks that never end: ``(GPUs, CPU millicores, memory MiB)``, or with a fourth item, the GPU model the task is
    held to, "" for any) at each demand mark (cumulative GPUs asked)."""
    free = [[n[2], n[3], n[4]] for n in nodes]
    models = [n[1] for n in nodes]
    total = sum(n[2] for n in nodes)
    allocated, demand, out, mark = 0, 0, [], 0
    for task in sequence:
        gpus, cpu, memory = task[:3]
        model = task[3] if len(task) > 3 else ""
        demand += gpus
        best, best_key = None, None
        for i, (g, c, m) in enumerate(free):
            if g >= gpus and c >= cpu and m >= memory and (not model or models[i] == model):
                if policy == "first-fit":
                    best = i
                    break
                key = (g - gpus, c - cpu, m - memory)
                if best_key is None or key < best_key:
                    best, best_key = i, key
        if best is not None:
            free[best][0] -= gpus
            free[best][1] -= cpu
            free[best][2] -= memory
            allocated += gpus
        while mark < len(marks) and demand >= marks[mark]:
            out.append(allocated / total)
            mark += 1
    return out


# --- the fill run ----------------------------------------------------------------------------------------------

def fill_sequence(tasks, fleet_gpus: int, share: float, rng: random.Random, gpus=lambda t: t[0]) -> list:
    """Tasks sampled at random (with replacement) until their GPUs (``gpus`` of a task) reach ``share`` of the
    fleet."""
    out, demand = [], 0
    while demand < share * fleet_gpus:
        task = tasks[rng.randrange(len(tasks))]
        out.append(task)
        demand += gpus(task)
    return out


def shared_fill(nodes, whole, fractional, seeds: int) -> dict:
    """The fill on nodes that give whole GPUs and shares (``trace_shares``): every GPU task of the trace, whole and
    fractional, sampled until 130 % of the fleet's GPUs; the core with its default packing (best-fit, shares
    scored by FGD for the shapes it has seen, starting with none but the fleet's prior) and with ``fgd``, and the default again after a
    day of ``WARM_TASKS`` other tasks of the trace (``platform-warm``: a platform that ran before), against
    first-fit, best-fit and the paper's FGD written in ``trace_shares``, same sequences, same process."""
    tasks = [(g, 0, c, m) for g, c, m in whole] + list(fractional)
    fleet_gpus = sum(n[2] for n in nodes)
    marks = (fleet_gpus * MILLI, math.ceil(1.3 * fleet_gpus * MILLI))
    workload = shares.Workload(tasks)
    names = ("platform", "platform-fgd", "platform-warm", "first-fit", "best-fit", "fgd")
    runs: dict[str, list] = {name: [] for name in names}
    stranded: dict[str, list] = {name: [] for name in runs}
    bad, replayed, passes = 0, 0, []
    for seed in range(seeds):
        sequence = fill_sequence(tasks, fleet_gpus * MILLI, 1.3, random.Random(100 + seed), shares.milli_of)
        replayed += sum(1 for t in sequence if t[1])
        # platform-warm: the platform after a day of other submissions (WARM_TASKS drawn from the trace)
        warm = fill_sequence(tasks, WARM_TASKS * MILLI, 1.0, random.Random(900 + seed), lambda t: MILLI)
        for name, policy, before in (("platform", "best-fit", ()), ("platform-fgd", "fgd", ()),
                                     ("platform-warm", "best-fit", warm)):
            alloc, checker, fill_passes, _ = shares.platform(nodes, sequence, marks, ACC, PRICE, TEAMS, policy,
                                                             before)
            runs[name].append(alloc)
            bad += checker.without_room
            stranded[name].append(shares.stranded_gpus(checker.state(), workload))
            if name == "platform":
                passes += fill_passes
        for name in ("first-fit", "best-fit", "fgd"):
            alloc, state = shares.reference(nodes, sequence, marks, name, workload if name == "fgd" else None)
            runs[name].append(alloc)
            stranded[name].append(shares.stranded_gpus(state, workload))
        print(f"shared fill seed {seed}: " + ", ".join(f"{k} {v[-1][1]:.4f}" for k, v in runs.items())
              + " at 130 %", file=sys.stderr)
    at = {name: (mean(a[0] for a in v), mean(a[1] for a in v)) for name, v in runs.items()}
    refs = ("first-fit", "best-fit", "fgd")
    best_ref = max(refs, key=lambda r: at[r][1])
    return {
        "fractional_tasks_replayed": replayed, "seeds": seeds, "replicas_per_gpu": shares.REPLICAS,
        "admitted_without_room": bad,
        "allocation": {name: {"at_100": round(a[0], 4), "at_130": round(a[1], 4),
                              "at_130_by_seed": [round(x[1], 4) for x in runs[name]],
                              "stranded_gpus_130": round(mean(s[0] for s in stranded[name]), 1),
                              "free_gpus_130": round(mean(s[1] for s in stranded[name]), 1)}
                       for name, a in at.items()},
        "best_reference": best_ref,
        "ratio_vs_best_reference": round(at["platform"][1] / at[best_ref][1], 4) if at[best_ref][1] else None,
        "fgd_policy_ratio_vs_best_reference": (round(at["platform-fgd"][1] / at[best_ref][1], 4)
                                               if at[best_ref][1] else None),
        "warm_ratio_vs_best_reference": (round(at["platform-warm"][1] / at[best_ref][1], 4)
                                         if at[best_ref][1] else None),
        "warm_tasks_seen_before": WARM_TASKS,
        "fill_pass_p50_ms": round(median(passes), 3), "fill_pass_p99_ms": round(percentile(passes, 99), 3),
    }


def platform_fill(nodes, sequence, marks, rng: random.Random, policy: str = "best-fit",
                  workload=(), strategy: str = BEST_EFFORT_FIFO, seen_before=()) -> tuple[list[float], Checker,
                                                                                        list[float]]:
    """The core placing ``sequence`` (one pass per arrival, as a submission does; nothing ends; a task with a fourth
    item is held to that GPU model) with packing ``policy`` (``fgd`` packs for ``workload``), the teams queueing by
    ``strategy``; allocation at each mark, the checker, and the CPU milliseconds of each pass."""
    fleet = Fleet(nodes)
    scheduler = FairShareScheduler(Snapshot(teams(fleet.gpus, strategy), {ACC: fleet.offers()}, [], policy=policy,
                                            workload=tuple(workload)))
    for i, task in enumerate(seen_before):  # seen a day before the fill (``shares.SEEN_BEFORE_S``)
        scheduler.demand.observe(queued(-1 - i, 0, task, -shares.SEEN_BEFORE_S, model=task[3] if len(task) > 3 else ""),
                                 -shares.SEEN_BEFORE_S)
    checker = Checker(nodes)
    allocated, demand, out, mark, passes = 0, 0, [], 0, []
    for i, task in enumerate(sequence):
        demand += task[0]
        c0 = time.process_time()
        decisions = scheduler.submit(queued(i + 1, rng.randrange(TEAMS), task, float(i),
                                            model=task[3] if len(task) > 3 else ""))
        passes.append((time.process_time() - c0) * 1000)
        for a in decisions.admissions:
            checker.admit(a.node_names, a.job.gpus_per_node, a.job.cpu_milli, a.job.memory_mib)
            allocated += a.job.total_gpus
        while mark < len(marks) and demand >= marks[mark]:
            out.append(allocated / fleet.gpus)
            mark += 1
    return out, checker, passes


# --- the constrained fill -------------------------------------------------------------------------------------

def constrain(nodes, sequence, rng: random.Random, share: float | None = None) -> list[tuple]:
    """``sequence`` with ``share`` of its tasks (each drawn with that chance) held to one GPU model of the trace: the
    model is drawn with weight equal to the GPUs of its nodes that could hold the task (enough GPUs, CPU and memory),
    so each model is asked for in proportion to the capacity able to run the task and no task is held to a model
    that could never hold it. Other tasks accept any model (a fourth item "")."""
    share = CONSTRAINED_SHARE if share is None else share
    out = []
    for gpus, cpu, memory in sequence:
        model = ""
        if rng.random() < share:
            weights: dict[str, int] = {}
            for _, node_model, g, c, m in nodes:
                if g >= gpus and c >= cpu and m >= memory:
                    weights[node_model] = weights.get(node_model, 0) + g
            names = sorted(weights)
            model = rng.choices(names, [weights[n] for n in names])[0]
        out.append((gpus, cpu, memory, model))
    return out


def constrained_fill(nodes, tasks, seeds: int) -> dict:
    """The whole-GPU fill with GPU-model constraints (``constrain``) under both queueing strategies: the core with
    best-fit (constraint-aware), against first-fit and best-fit reference placers that honour the same constraints
    (a task no node of its model holds is dropped; nothing queues), same sequences, same process. Allocation at 100 %
    and 130 % demand; the ratio to the best reference (worst of both strategies, at 130 %) and the stall (the most
    allocation points StrictFIFO loses to BestEffortFIFO at either mark, while jobs wait)."""
    fleet_gpus = sum(n[2] for n in nodes)
    marks = (fleet_gpus, math.ceil(1.3 * fleet_gpus))
    names = (BEST_EFFORT_FIFO, STRICT_FIFO, "first-fit", "best-fit")
    runs: dict[str, list] = {name: [] for name in names}
    bad, held = 0, 0
    for seed in range(seeds):
        sequence = constrain(nodes, fill_sequence(tasks, fleet_gpus, 1.3, random.Random(seed)),
                             random.Random(CONSTRAINED_SEED + seed))
        held += sum(1 for t in sequence if t[3])
        warm = constrain(nodes, fill_sequence(tasks, WARM_TASKS, 1.0, random.Random(900 + seed), lambda t: 1),
                         random.Random(CONSTRAINED_SEED + 900 + seed))
        for strategy in (BEST_EFFORT_FIFO, STRICT_FIFO):
            alloc, checker, _ = platform_fill(nodes, sequence, marks, random.Random(1000 + seed), strategy=strategy,
                                              seen_before=warm)
            runs[strategy].append(alloc)
            bad += checker.without_room
        for policy in ("first-fit", "best-fit"):
            runs[policy].append(reference_fill(nodes, sequence, policy, marks))
        print(f"constrained seed {seed}: " + ", ".join(f"{k} {v[-1][0]:.4f} / {v[-1][1]:.4f}" for k, v in runs.items())
              + " at 100 / 130 %", file=sys.stderr)
    at = {name: (mean(a[0] for a in v), mean(a[1] for a in v)) for name, v in runs.items()}
    best_ref = max(("first-fit", "best-fit"), key=lambda r: at[r][1])
    ratio = {k: round(at[k][1] / at[best_ref][1], 4) for k in (BEST_EFFORT_FIFO, STRICT_FIFO)}
    ratio_100 = {k: round(at[k][0] / max(at["first-fit"][0], at["best-fit"][0]), 4)
                 for k in (BEST_EFFORT_FIFO, STRICT_FIFO)}
    stall = max(at[BEST_EFFORT_FIFO][i] - at[STRICT_FIFO][i] for i in range(2)) * 100
    return {
        "seeds": seeds, "constrained_share": CONSTRAINED_SHARE, "tasks_held_to_a_model": held,
        "constraint": "a share of the tasks held to one GPU model, drawn by the GPUs able to hold the task",
        "admitted_without_room": bad,
        "allocation": {name: {"at_100": round(a[0], 4), "at_130": round(a[1], 4),
                              "at_130_by_seed": [round(x[1], 4) for x in runs[name]]} for name, a in at.items()},
        "best_reference": best_ref,
        "ratio_vs_best_reference_by_strategy": ratio,
        "ratio_vs_best_reference_at_100_by_strategy": ratio_100,
        "ratio_vs_best_reference": min(ratio.values()),
        "strict_fifo_stall_points": round(stall, 2),
    }


# --- the churn run ---------------------------------------------------------------------------------------------

def churn(nodes, tasks, jobs: int, rng: random.Random, load: float = CHURN_LOAD, strategy: str = "BestEffortFIFO",
          backfill: bool = False, reserve_after_s: float | None = None, prefill: float = 0.0,
          max_reservations: int = 16) -> dict:
    """Poisson arrivals, log-normal run times, a full pass from a fresh snapshot whenever a job ends (or is
    preempted), a pass per arrival; returns waits (with each job's GPUs, and its GPUs, CPU and memory per node in
    ``shapes``), preemptions, pass times by queue length, the checker and the allocation while jobs waited
    (GPU-seconds allocated over fleet GPU-seconds, over the time the queue was not empty).

    ``load``: offered load (x the fleet's GPUs); ``strategy``: every team's queueing strategy. With ``backfill``
    every job's max run time is its run time times a uniform factor from 1 to ``LIMIT_OVER_RUN`` (users ask more
    than they use), rounded up to a minute, and each pass plans reservations (``Snapshot.now``, every live
    attempt, ``reserve_after_s``, at most ``max_reservations``); without, the max run time is 3600 s and nothing is planned. Both draw the same
    random numbers, so one seed gives the same arrivals either way. ``prefill``: the first jobs, as many as ask
    that share of the fleet's GPUs, arrive in the first minute (a fleet full and a queue waiting when the run
    starts), the rest as above."""
    fleet = Fleet(nodes)
    checker = Checker(nodes)
    mean_gpus = mean(t[0] for t in tasks)
    mean_s = CHURN_MEDIAN_S * math.exp(CHURN_SIGMA ** 2 / 2)
    rate = load * fleet.gpus / (mean_gpus * mean_s)  # arrivals per second
    mu = math.log(CHURN_MEDIAN_S)
    events: list[tuple[float, int, int]] = []  # (time, kind 0 = end 1 = arrival 2 = full pass, job id)
    t = 0.0
    spec: dict[int, tuple] = {}
    limits: dict[int, int] = {}
    plan = {"strategy": strategy, "now": None, "reserve_after_s": reserve_after_s,
            "max_reservations": max_reservations} if backfill else {
        "strategy": strategy}
    asked = 0
    for j in range(1, jobs + 1):
        if asked < prefill * fleet.gpus:
            t = 60.0 * asked / (prefill * fleet.gpus)
        else:
            t += rng.expovariate(rate)
        task = tasks[rng.randrange(len(tasks))]
        spec[j] = (task, rng.randrange(TEAMS), t, rng.random() < CHURN_PREEMPTIBLE, rng.lognormvariate(mu, CHURN_SIGMA))
        asked += task[0]
        over = rng.uniform(1.0, LIMIT_OVER_RUN)
        limits[j] = math.ceil(spec[j][4] * over / 60) * 60 if backfill else 3600
        heapq.heappush(events, (t, 1, j))
    queue: dict[int, QueuedJob] = {}
    running: dict[int, tuple[RunningJob, float]] = {}  # job id -> (live attempt, end time)
    ends: dict[int, float] = {}
    waits, preemptions, passes = [], 0, []
    shapes: list[tuple[int, int, int]] = []  # per entry of ``waits``: the job's GPUs, CPU and memory per node
    tstate = teams(fleet.gpus)
    scheduler = None
    attempt = 0

    def admit(decisions, now: float) -> None:
        nonlocal preemptions, attempt
        for a in decisions.admissions:
            if any(v.job_id not in running for v in a.victims):
                continue  # a victim ended since the snapshot: the locked re-check refuses; the job stays queued
            for v in a.victims:
                preemptions += 1
                r, _ = running.pop(v.job_id)
                for name in r.node_names:
                    fleet.hold(name, r.gpus_per_node, r.cpu_milli, r.memory_mib, -1)
                checker.release(r.node_names, r.gpus_per_node, r.cpu_milli, r.memory_mib)
                tstate[r.team_id].used[ACC] -= r.gpus
                task, team, at, pre, _ = spec[v.job_id]
                queue[v.job_id] = queued(v.job_id, team, task, at, pre, limits[v.job_id])  # its submission time kept
            j = a.job
            queue.pop(j.job_id, None)
            checker.admit(a.node_names, j.gpus_per_node, j.cpu_milli, j.memory_mib)
            for name in a.node_names:
                fleet.hold(name, j.gpus_per_node, j.cpu_milli, j.memory_mib)
            tstate[j.team_id].used[ACC] = tstate[j.team_id].used.get(ACC, 0) + j.total_gpus
            attempt += 1
            end = now + spec[j.job_id][4]
            running[j.job_id] = (RunningJob(j.job_id, attempt, j.team_id, ACC, a.offer.node_pool_id, j.total_gpus,
                                            j.priority, now, j.preemptible, a.node_names, j.gpus_per_node,
                                            j.cpu_milli, j.memory_mib, max_runtime_seconds=j.max_runtime_seconds),
                                 end)
            ends[j.job_id] = end
            heapq.heappush(events, (end, 0, j.job_id))
            if j.job_id not in waited:
                waits.append((now - spec[j.job_id][2], j.total_gpus))
                shapes.append((j.gpus_per_node, j.cpu_milli, j.memory_mib))
                waited.add(j.job_id)

    waited: set[int] = set()
    pass_at = None
    last, busy_s, held_gpu_s = 0.0, 0.0, 0.0
    while events:
        now, kind, j = heapq.heappop(events)
        if queue:  # allocation while jobs wait: the GPUs held over the time the queue was not empty
            busy_s += now - last
            held_gpu_s += (now - last) * sum(r.gpus for r, _ in running.values())
        last = now
        if backfill:
            plan["now"] = now
        if kind == 2:
            pass_at = None
            scheduler, decisions = full_pass(fleet, tstate, queue, running, passes, plan)
            admit(decisions, now)
            continue
        if kind == 1:
            task, team, at, pre, _ = spec[j]
            queue[j] = queued(j, team, task, at, pre, limits[j])
            if scheduler is None:
                scheduler = full_pass(fleet, tstate, queue, running, passes, plan)
                admit(scheduler[1], now)
                scheduler = scheduler[0]
            else:
                admit(scheduler.submit(queue[j], now if backfill else None), now)
            continue
        if j not in running or ends.get(j) != now:
            continue  # preempted meanwhile: this end is stale
        r, _ = running.pop(j)
        for name in r.node_names:
            fleet.hold(name, r.gpus_per_node, r.cpu_milli, r.memory_mib, -1)
        checker.release(r.node_names, r.gpus_per_node, r.cpu_milli, r.memory_mib)
        tstate[r.team_id].used[ACC] -= r.gpus
        if pass_at is None and queue:
            pass_at = (math.floor(now / PASS_INTERVAL_S) + 1) * PASS_INTERVAL_S
            heapq.heappush(events, (pass_at, 2, 0))
    return {"waits": [w for w, _ in waits], "waits_by_gpus": waits, "shapes": shapes, "preemptions": preemptions,
            "passes": passes, "checker": checker, "rate": rate, "mean_s": mean_s, "left_waiting": len(queue),
            "allocation_while_waiting": held_gpu_s / (busy_s * fleet.gpus) if busy_s else None}


def wait_stats(waits: list[tuple[float, int]], gpus: int | None = None) -> dict:
    """Queue wait p50/p95/p99 (simulated seconds) of the jobs asking ``gpus`` GPUs (None: all), and how many."""
    picked = [w for w, g in waits if gpus is None or g == gpus]
    return {"jobs": len(picked), **{f"wait_p{p}_s": (round(percentile(picked, p), 1) if picked else None)
                                    for p in (50, 95, 99)}}


def nodes_able(nodes, gpus_per_node: int, cpu_milli: int, memory_mib: int) -> int:
    """How many of ``nodes`` (``load_nodes``' tuples) could ever hold one pod of the shape (GPUs, CPU millicores,
    memory MiB)."""
    return sum(1 for n in nodes if n[2] >= gpus_per_node and n[3] >= cpu_milli and n[4] >= memory_mib)


def backlog(nodes, tasks, jobs: int) -> dict:
    """The backlog scenario: ``jobs`` arrivals, ``BACKLOG_PREFILL`` x the fleet's GPUs at once (``churn``'s
    ``prefill``) and the rest at
    ``BACKLOG_LOAD`` x what the fleet drains, every team StrictFIFO and
    then every team BestEffortFIFO, each without and with backfill (same arrivals, same run times); per run the
    allocation while jobs waited and the queue wait percentiles overall and of 8-GPU and 1-GPU jobs,
    ``wait_p99_ratio_8gpu_vs_1gpu``, and the 8-GPU jobs' percentiles by how many of the fleet's nodes could ever
    hold them (``gpus_8_by_nodes_able``: the trace's 120-core 8-GPU tasks fit only its 39 G3 nodes)."""
    out = {"jobs": jobs, "offered_load": BACKLOG_LOAD, "prefill": BACKLOG_PREFILL, "limit_over_run": LIMIT_OVER_RUN,
           "reserve_after_s": RESERVE_AFTER_S, "max_reservations": MAX_RESERVATIONS}
    for strategy in ("StrictFIFO", "BestEffortFIFO"):
        runs = {}
        for name, on in (("plain", False), ("backfill", True)):
            c0 = time.process_time()
            run = churn(nodes, tasks, jobs, random.Random(17), BACKLOG_LOAD, strategy, on, RESERVE_AFTER_S,
                        prefill=BACKLOG_PREFILL, max_reservations=MAX_RESERVATIONS)
            by = run["waits_by_gpus"]
            eight, one = wait_stats(by, 8), wait_stats(by, 1)
            by_able: dict[int, list[tuple[float, int]]] = {}
            for (w, g), (gpn, cpu, memory) in zip(by, run["shapes"], strict=True):
                if g == 8:
                    by_able.setdefault(nodes_able(nodes, gpn, cpu, memory), []).append((w, g))
            runs[name] = {
                # None: no job ever waited (arrivals fewer than the prefill's)
                "allocation_while_waiting": (None if run["allocation_while_waiting"] is None
                                             else round(run["allocation_while_waiting"], 4)),
                **wait_stats(by), "gpus_8": eight, "gpus_1": one,
                "wait_p99_ratio_8gpu_vs_1gpu": (round(eight["wait_p99_s"] / one["wait_p99_s"], 3)
                                                if eight["wait_p99_s"] and one["wait_p99_s"] else None),
                "gpus_8_by_nodes_able": {str(k): wait_stats(v) for k, v in sorted(by_able.items())},
                "left_waiting": run["left_waiting"], "admitted_without_room": run["checker"].without_room,
                "pass_p99_ms": round(percentile([ms for _, ms in run["passes"]], 99), 3),
                "cpu_s": round(time.process_time() - c0, 1)}
            print(f"backlog {strategy} {name}: allocation {runs[name]['allocation_while_waiting']}, wait p99 "
                  f"{runs[name]['wait_p99_s']} s, 8-GPU p99 {eight['wait_p99_s']} s, 1-GPU p99 {one['wait_p99_s']} s",
                  file=sys.stderr)
        kept = (runs["backfill"]["allocation_while_waiting"], runs["plain"]["allocation_while_waiting"])
        runs["allocation_kept"] = None if None in kept else kept[0] >= kept[1]
        out[strategy] = runs
    return out


def full_pass(fleet: Fleet, tstate, queue, running, passes, plan: dict | None = None
              ) -> tuple[FairShareScheduler, object]:
    """A fresh snapshot (the teams' usage, each node's free resources, the queue, the live preemptible attempts)
    and one full pass over it; its CPU milliseconds are appended to ``passes`` with the queue's length. ``plan``:
    the teams' ``strategy``, and for backfill the pass's ``now`` and ``reserve_after_s`` (every live attempt goes
    in the snapshot's ``live``)."""
    plan = plan or {}
    snapshot_teams = {tid: TeamState(tid, t.cohort, t.weight, {ACC: TeamQuota(t.quotas[ACC].nominal_gpus,
                                                                              t.quotas[ACC].borrowing_limit_gpus)},
                                     dict(t.used), strategy=plan.get("strategy", "BestEffortFIFO"))
                      for tid, t in tstate.items()}
    c0 = time.process_time()
    snapshot = Snapshot(snapshot_teams, {ACC: fleet.offers()}, list(queue.values()),
                        [r for r, _ in running.values() if r.preemptible], now=plan.get("now"),
                        live=[r for r, _ in running.values()] if plan.get("now") is not None else [],
                        reserve_after_s=plan.get("reserve_after_s"), max_reservations=plan.get("max_reservations", 16))
    scheduler = FairShareScheduler(snapshot)
    decisions = scheduler.full_pass()
    passes.append((len(queue), (time.process_time() - c0) * 1000))
    return scheduler, decisions


def percentile(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="fill runs (random task orders)")
    parser.add_argument("--churn-jobs", type=int, default=20000, help="arrivals in the churn run")
    parser.add_argument("--shared-seeds", type=int, default=3,
                        help="fill runs of whole and fractional tasks on nodes that share their GPUs")
    parser.add_argument("--constrained-seeds", type=int, default=3,
                        help="fill runs with GPU-model constraints, under BestEffortFIFO and StrictFIFO")
    parser.add_argument("--quick", action="store_true",
                        help="one seed of each fill and 2,000 churn jobs (a check, not the figures)")
    parser.add_argument("--constrained-only", action="store_true",
                        help="only the constrained fill (its JSON keys and the checker's count)")
    parser.add_argument("--shared-only", action="store_true",
                        help="only the shared fill (whole and fractional tasks on nodes that share GPUs; its JSON keys "
                             "and the checker's count)")
    parser.add_argument("--backlog-jobs", type=int, default=BACKLOG_JOBS,
                        help="arrivals in each run of the backlog scenario (arrivals faster than the fleet drains)")
    parser.add_argument("--backlog-only", action="store_true",
                        help="run the backlog scenario alone (its JSON line has the backlog part only)")
    parser.add_argument("--trace", type=Path, default=TRACE, help="directory holding nodes.csv and tasks.csv")
    args = parser.parse_args()
    if args.quick:
        args.seeds = args.shared_seeds = args.constrained_seeds = 1
        args.churn_jobs = min(args.churn_jobs, 2000)
    missing = [f"{name} (the trace's {original})" for name, original in TRACE_FILES.items()
               if not (args.trace / name).is_file()]
    if missing:
        sys.exit(f"trace_replay: {args.trace} lacks {', '.join(missing)}; get them from the public repository "
                 f"alibaba/clusterdata, cluster-trace-gpu-v2023/csv/, or pass --trace DIR")
    nodes = load_nodes(args.trace / "nodes.csv")
    tasks, fractional, cpu_only = load_tasks(args.trace / "tasks.csv")
    if args.backlog_only:
        print(json.dumps({"benchmark": "trace_replay", "part": "backlog", "nodes": len(nodes),
                          "fleet_gpus": sum(n[2] for n in nodes), "backlog": backlog(nodes, tasks, args.backlog_jobs),
                          **machine(), "goals": {"wait_p99_ratio_8gpu_vs_1gpu": 3.0, "allocation_kept": True}}))
        return
    if args.shared_only:
        shared = shared_fill(nodes, tasks, fractional, args.shared_seeds)
        best_ref = shared["best_reference"]
        print(json.dumps({
            "benchmark": "trace_replay", "part": "shared",
            "trace": "alibaba cluster-trace-gpu-v2023 openb_pod_list_multigpu50", "nodes": len(nodes),
            "fleet_gpus": sum(n[2] for n in nodes), "fractional_gpu_tasks": len(fractional),
            "fractional_tasks_replayed": shared["fractional_tasks_replayed"],
            "admitted_without_room": shared["admitted_without_room"],
            "allocation_100": shared["allocation"]["platform"]["at_100"],
            "allocation_130": shared["allocation"]["platform"]["at_130"],
            "best_reference": best_ref, "best_reference_allocation_130": shared["allocation"][best_ref]["at_130"],
            "ratio_vs_best_reference": shared["ratio_vs_best_reference"], "shared_fill": shared, **machine(),
            "goals": {"admitted_without_room": 0, "ratio_vs_best_reference": 1.0}}))
        return
    constrained = constrained_fill(nodes, tasks, args.constrained_seeds)
    if args.constrained_only:
        print(json.dumps({
            "benchmark": "trace_replay", "part": "constrained",
            "trace": "alibaba cluster-trace-gpu-v2023 openb_pod_list_multigpu50", "nodes": len(nodes),
            "admitted_without_room": constrained["admitted_without_room"], "constrained": constrained,
            "strict_fifo_stall_points": constrained["strict_fifo_stall_points"], **machine(),
            "goals": {"admitted_without_room": 0, "constrained.ratio_vs_best_reference": 1.0,
                      "strict_fifo_stall_points": 5.0}}))
        return
    shared = shared_fill(nodes, tasks, fractional, args.shared_seeds)
    fleet_gpus = sum(n[2] for n in nodes)
    marks = (fleet_gpus, math.ceil(1.3 * fleet_gpus))
    # fgd's expected workload: the trace's whole-GPU tasks, each (GPUs, CPU, memory) weighted by its count
    workload = workload_of(Task(*t) for t in tasks)
    mine, fgd, first, best, bad, fill_passes, fgd_passes = [], [], [], [], 0, [], []
    for seed in range(args.seeds):
        sequence = fill_sequence(tasks, fleet_gpus, 1.3, random.Random(seed))
        alloc, checker, passes = platform_fill(nodes, sequence, marks, random.Random(1000 + seed))
        mine.append(alloc)
        bad += checker.without_room
        fill_passes += passes
        alloc, checker, passes = platform_fill(nodes, sequence, marks, random.Random(1000 + seed), "fgd", workload)
        fgd.append(alloc)
        bad += checker.without_room
        fgd_passes += passes
        first.append(reference_fill(nodes, sequence, "first-fit", marks))
        best.append(reference_fill(nodes, sequence, "best-fit", marks))
        print(f"seed {seed}: platform best-fit {mine[-1][0]:.4f} / {mine[-1][1]:.4f}, fgd {fgd[-1][0]:.4f} / "
              f"{fgd[-1][1]:.4f}, first-fit {first[-1][1]:.4f}, best-fit {best[-1][1]:.4f} at 130 %", file=sys.stderr)
    run = churn(nodes, tasks, args.churn_jobs, random.Random(7))
    queued_backlog = backlog(nodes, tasks, args.backlog_jobs)
    bad += run["checker"].without_room + shared["admitted_without_room"] + constrained["admitted_without_room"]
    pass_ms = [ms for _, ms in run["passes"]]
    by_queue = {}
    for low, high in ((0, 100), (100, 1000), (1000, 10**9)):
        inside = [ms for q, ms in run["passes"] if low <= q < high]
        if inside:
            by_queue[f"{low}-{high if high < 10**9 else 'up'}"] = {"passes": len(inside),
                                                                    "p50_ms": round(median(inside), 3),
                                                                    "p99_ms": round(percentile(inside, 99), 3)}
    a100, a130 = mean(a[0] for a in mine), mean(a[1] for a in mine)
    f100, f130 = mean(a[0] for a in fgd), mean(a[1] for a in fgd)
    ref = {"first-fit": mean(a[1] for a in first), "best-fit": mean(a[1] for a in best)}
    best_name = max(ref, key=ref.get)
    print(f"churn: {len(run['waits'])} admitted, {run['preemptions']} preemptions, {len(run['passes'])} full passes",
          file=sys.stderr)
    print(json.dumps({
        "benchmark": "trace_replay", "trace": "alibaba cluster-trace-gpu-v2023 openb_pod_list_multigpu50",
        "nodes": len(nodes), "fleet_gpus": fleet_gpus, "whole_gpu_tasks": len(tasks),
        "fractional_gpu_tasks": len(fractional), "left_out_cpu_only_tasks": cpu_only,
        "fractional_tasks_replayed": shared["fractional_tasks_replayed"],
        "admitted_without_room": bad,
        "packing_policy": "best-fit",
        "allocation_100": shared["allocation"]["platform"]["at_100"],
        "allocation_130": shared["allocation"]["platform"]["at_130"],
        "best_reference": shared["best_reference"],
        "best_reference_allocation_130": shared["allocation"][shared["best_reference"]]["at_130"],
        "ratio_vs_best_reference": shared["ratio_vs_best_reference"],
        "stranded_gpus_130": shared["allocation"]["platform"]["stranded_gpus_130"],
        "best_reference_stranded_gpus_130": shared["allocation"][shared["best_reference"]]["stranded_gpus_130"],
        "shared_fill": shared,
        "constrained": constrained,
        "strict_fifo_stall_points": constrained["strict_fifo_stall_points"],
        "whole_gpu_fill": {
            "nodes": "whole GPUs only (no sharing)", "seeds": args.seeds,
            "allocation_100": round(a100, 4), "allocation_130": round(a130, 4),
            "allocation_130_by_seed": [round(a[1], 4) for a in mine],
            "first_fit_allocation_100": round(mean(a[0] for a in first), 4),
            "first_fit_allocation_130": round(ref["first-fit"], 4),
            "best_fit_allocation_100": round(mean(a[0] for a in best), 4),
            "best_fit_allocation_130": round(ref["best-fit"], 4),
            "best_reference": best_name, "best_reference_allocation_130": round(ref[best_name], 4),
            "ratio_vs_best_reference": round(a130 / ref[best_name], 4) if ref[best_name] else None,
            "fill_pass_p50_ms": round(median(fill_passes), 4),
            "fill_pass_p99_ms": round(percentile(fill_passes, 99), 4),
            "fgd": {"workload_shapes": len(workload),
                    "allocation_100": round(f100, 4), "allocation_130": round(f130, 4),
                    "allocation_130_by_seed": [round(a[1], 4) for a in fgd],
                    "ratio_vs_best_fit_core": round(f130 / a130, 4) if a130 else None,
                    "ratio_vs_best_fit_core_100": round(f100 / a100, 4) if a100 else None,
                    "ratio_vs_best_reference": round(f130 / ref[best_name], 4) if ref[best_name] else None,
                    "fill_pass_p50_ms": round(median(fgd_passes), 4),
                    "fill_pass_p99_ms": round(percentile(fgd_passes, 99), 4)}},
        "churn": {"jobs": args.churn_jobs, "arrival_rate_per_s": round(run["rate"], 5),
                  "duration": f"log-normal, median {CHURN_MEDIAN_S:g} s, sigma {CHURN_SIGMA:g} "
                              f"(mean {run['mean_s']:.0f} s)",
                  "offered_load": CHURN_LOAD, "preemptible_share": CHURN_PREEMPTIBLE,
                  "left_waiting": run["left_waiting"], "pass_ms_by_queue_length": by_queue,
                  "backlog": queued_backlog},
        "wait_p50_s": round(percentile(run["waits"], 50), 1), "wait_p95_s": round(percentile(run["waits"], 95), 1),
        "wait_p99_s": round(percentile(run["waits"], 99), 1),
        "preemptions": run["preemptions"],
        "pass_p50_ms": round(median(pass_ms), 3), "pass_p99_ms": round(percentile(pass_ms, 99), 3),
        **machine(),
        "goals": {"admitted_without_room": 0, "ratio_vs_best_reference": 1.0,
                  "constrained.ratio_vs_best_reference": 1.0, "strict_fifo_stall_points": 5.0,
                  "wait_p99_ratio_8gpu_vs_1gpu": 3.0},
    }))


if __name__ == "__main__":
    main()
