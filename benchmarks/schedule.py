"""Benchmark of the pure fair-share core: one full pass and one incremental pass over a synthetic snapshot.

100,000 queued jobs, 40 teams, 50 clusters with 200 node pools (4 accelerators) of 25 nodes each: 5,000 nodes
of 8 GPUs, 96 CPU cores and 1 TiB, in 5 racks per pool, a third of them partly busy with running jobs pinned to
their nodes; jobs ask CPU and memory per node. Built as plain data; no database. Prints a few lines and ends
with one JSON line. Run: ``.venv/bin/python benchmarks/schedule.py [--fractional-share 0.33] [--decayed-usage]``
(that share of the queued jobs ask part of one GPU, placed on time-sliced pools: ``build``; every team with a
decayed usage of its own and the default entry penalty, fair sharing over time).

Next to the wall times, the CPU time of this process (the only one involved) per pass and per job decided,
and two ratios that hold on a shared machine: the full pass over a baseline measured in the same run (the
sort of the 100,000 queued jobs into the queue's order, the first step of every full pass: it scales with
the machine's speed as the pass does), and the incremental pass over the full one. Teams queue BestEffortFIFO
(the default), so every waiting job is evaluated; the same snapshot with every team StrictFIFO is timed too.
Both are timed again with backfill with reservations on (``backfill_snapshot``: the pass's time, every running
job's max run time, reservations for StrictFIFO heads and for jobs waiting ``RESERVE_AFTER_S`` or longer), in the
same run as the plain passes.

The pass with 10 queued jobs (``small_pass_cpu_ms``) is a full pass over the same fleet of 5,000 nodes, teams and
running jobs, every one over the same state. ``pass_cpu_ms_queue_10`` is the cold pass: a new snapshot each time
(new teams, pools, nodes and jobs of the same content), as the platform's scheduling loop reads one from its
database every pass; that is the figure the platform pays and the one the goal is for. ``pass_cpu_ms_queue_10_warm``
is the same pass over the node pools of the pass before (the same offer objects, what is kept with them reused:
``PoolOffer.derived``), for a loop that keeps its fleet's offers while the inventory does not change.

``--jobs N`` and ``--nodes M`` (defaults 100,000 and 5,000) set the queue's length and the fleet's size: M nodes are
M / 100 clusters of the same four pools of 25 nodes (the pools, racks, prices and running jobs per pool as above;
the teams' quotas are the same share of the larger capacity). The full pass is timed with the skip of the waits the
memo's tables already decide (``FairShareScheduler.skip``, ADR 0048) and without it, alternated ``--repeat`` times
(default 3): ``full_pass_over_plain`` and ``same_decisions_as_plain`` (a digest of every decision, message and
position). ``core_peak_memory_mib`` is tracemalloc's peak over one scheduler's construction and full pass (the
snapshot apart); ``peak_rss_mib`` the process's maximum resident set (``ru_maxrss``: the builds and every pass);
``build_cpu_s`` and ``scheduler_init_cpu_s`` the snapshot's build and the scheduler's construction, floors of a pass
with the sort and ``baseline_one_wait_per_job_cpu_s`` (one ``Waiting`` per queued job made, stored and numbered, nothing
decided: what a pass that names every waiting job pays at least).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import random
import resource
import sys
import time
import tracemalloc
from decimal import Decimal
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.procstat import machine  # noqa: E402
from jobs.scheduling.core import (  # noqa: E402
    BudgetView,
    FairShareScheduler,
    NodeRoom,
    PoolOffer,
    QueuedJob,
    RunningJob,
    Snapshot,
    TeamQuota,
    TeamState,
    Waiting,
)
from jobs.scheduling.core.usage import entry_penalty  # noqa: E402

JOBS, TEAMS, CLUSTERS, POOLS_PER_CLUSTER, ACCELERATORS = 100_000, 40, 50, 4, 4
NODES_PER_POOL, GPUS_PER_NODE, NODE_CPU_MILLI, NODE_MEMORY_MIB, RACKS = 25, 8, 96_000, 1_048_576, 5
PROVIDERS = ("aws", "gcp", "azure", "oci", "onprem")
PRICES = (Decimal("2.99"), Decimal("4.20"), Decimal("6.88"), Decimal("12.29"))
#: With ``--fractional-share``: the pools time-slicing their GPUs (pool ``SHARED_POOL`` of every cluster), replicas
#: per GPU, and the shares (milli-GPUs) the fractional jobs ask, with their CPU and memory.
SHARED_POOL, REPLICAS = 1, 8
SHARES_MILLI = (125, 250, 340, 500, 750)
#: Backfill's setting in the timed passes with reservations (``backfill_snapshot``): seconds waited before any job
#: waiting for capacity gets one (the queue's submissions are one second apart).
RESERVE_AFTER_S = 3600.0
#: The short queue's pass (``small_pass_cpu_ms``): queued jobs kept, and passes timed (the least counts: one pass
#: is a few milliseconds, which a shared machine's other work stretches several times).
SMALL_QUEUE, SMALL_REPEAT = 10, 200


def build(seed: int = 4, fractional: float = 0.0, decayed: bool = False, jobs: int = JOBS,
          clusters: int = CLUSTERS) -> tuple[Snapshot, list[QueuedJob]]:
    """The synthetic snapshot and two jobs to submit afterwards (incremental passes): one of normal priority, one
    that becomes its team's head (high priority); both are evaluated. ``jobs`` queued jobs (default 100,000) and
    ``clusters`` clusters (default 50) of ``POOLS_PER_CLUSTER`` pools of ``NODES_PER_POOL`` nodes each: a larger
    fleet is more clusters of the same pools (``--nodes``), the teams' quotas a share of its capacity as ever.

    ``fractional`` (0 to 1): that share of the queued jobs ask part of one GPU (``SHARES_MILLI``), and pool
    ``SHARED_POOL`` of every cluster time-slices its GPUs ``REPLICAS`` ways (no whole GPU there, as the platform's
    inventory counts such a node); drawn from a random stream of their own, so the rest of the snapshot is the
    same as without."""
    rng = random.Random(seed)
    frng = random.Random(seed + 1)
    pools: dict[int, list[PoolOffer]] = {a: [] for a in range(ACCELERATORS)}
    free: dict[int, list[int]] = {}
    pid = 0
    for c in range(clusters):
        for k in range(POOLS_PER_CLUSTER):
            pid += 1
            acc = (c + k) % ACCELERATORS
            spot = "spot" if k == 3 else "on-demand"
            sliced = fractional > 0 and k == SHARED_POOL
            rooms = tuple(NodeRoom(f"p{pid}-n{i}", 0 if sliced else GPUS_PER_NODE, 0 if sliced else GPUS_PER_NODE,
                                   NODE_CPU_MILLI, NODE_CPU_MILLI, NODE_MEMORY_MIB, NODE_MEMORY_MIB, f"rack-{i % RACKS}",
                                   shares=(1000,) * GPUS_PER_NODE if sliced else (),
                                   slices=(REPLICAS,) * GPUS_PER_NODE if sliced else ())
                          for i in range(NODES_PER_POOL))
            free[pid] = [GPUS_PER_NODE] * NODES_PER_POOL
            pools[acc].append(PoolOffer(pid, c, f"c{c:02d}", PROVIDERS[c % 5], f"r{c % 7}", spot, NODES_PER_POOL,
                                        GPUS_PER_NODE, sum(r.free_gpus for r in rooms), rng.choice(PRICES),
                                        healthy=(c % 17 != 16), node_rooms=rooms))
    capacity = sum(o.free_gpus for lst in pools.values() for o in lst)
    teams = {}
    for t in range(TEAMS):
        quotas = {a: TeamQuota(capacity // ACCELERATORS // TEAMS, 16, None if t % 3 else 8, 64)
                  for a in range(ACCELERATORS)}
        budgets = [BudgetView(t, Decimal("50000"), Decimal("1000"), Decimal(0), "block")] if t % 4 == 0 else []
        teams[t] = TeamState(t, cohort=t % 2, weight=1.0 + (t % 3), quotas=quotas, budgets=budgets,
                             fair_usage=Decimal((t * 7919) % 1000) * 3600 if decayed else Decimal(0))
    queue = []
    for j in range(jobs):
        gpn = rng.choice((1, 2, 4, 8))
        job = QueuedJob(j + 1, rng.randrange(TEAMS), rng.randrange(ACCELERATORS), rng.choice((1, 1, 1, 2)),
                        gpn, rng.choice((100, 500, 500, 1000)), float(j), rng.random() < 0.3,
                        rng.choice((1800, 3600, 7200)), cpu_milli=gpn * rng.choice((4000, 8000, 12000)),
                        memory_mib=gpn * rng.choice((32_768, 65_536, 131_072)))
        if fractional and frng.random() < fractional:  # one pod on part of one GPU, not preemptible
            job = dataclasses.replace(job, nodes=1, gpus_per_node=1, preemptible=False,
                                      share_milli=frng.choice(SHARES_MILLI), cpu_milli=frng.choice((2000, 4000)),
                                      memory_mib=frng.choice((16_384, 32_768)))
        queue.append(job)
    # A third of every pool's nodes already run a 4-GPU job (half of them preemptible), so preemption is looked for.
    running, rid = [], 0
    for acc, offers in pools.items():
        for i, o in enumerate(offers):
            rooms = list(o.node_rooms)
            if rooms[0].shares:  # a time-sliced pool: nothing runs there yet
                continue
            for n in range(0, NODES_PER_POOL, 3):
                rid += 1
                t = rng.randrange(TEAMS)
                running.append(RunningJob(10**7 + rid, rid, t, acc, o.node_pool_id, 4, rng.choice((100, 500)),
                                          -float(rid), rng.random() < 0.5, (rooms[n].name,), 4, 16_000, 131_072))
                teams[t].used[acc] = teams[t].used.get(acc, 0) + 4
                rooms[n] = dataclasses.replace(rooms[n], free_gpus=4, free_cpu_milli=NODE_CPU_MILLI - 16_000,
                                               free_memory_mib=NODE_MEMORY_MIB - 131_072)
            offers[i] = dataclasses.replace(o, free_gpus=sum(r.free_gpus for r in rooms), node_rooms=tuple(rooms))
    extra = [QueuedJob(jobs + 1, 7, 1, 1, 4, 500, float(jobs), False, 3600),  # lands behind its team's jobs
             QueuedJob(jobs + 2, 9, 2, 1, 2, 1000, float(jobs + 1), True, 3600)]  # its team's new head
    penalty = entry_penalty(300, 604800) if decayed else Decimal(0)  # the defaults' (ADR 0045)
    return Snapshot(teams, pools, queue, running, entry_penalty=penalty), extra


def backfill_snapshot(snapshot: Snapshot, strict: bool = False) -> Snapshot:
    """``snapshot`` with backfill with reservations on: the pass one second after the last submission, every
    running job with a max run time of 1 to 6 hours of which a random part has passed, reservations after
    ``RESERVE_AFTER_S``; every team ``StrictFIFO`` if ``strict``."""
    rng = random.Random(11)
    now = float(len(snapshot.queue) + 1)
    live = []
    for r in snapshot.running:
        limit = rng.choice((3600, 7200, 14_400, 21_600))
        live.append(dataclasses.replace(r, admitted=now - rng.uniform(0, limit), max_runtime_seconds=limit))
    if strict:
        for team in snapshot.teams.values():
            team.strategy = "StrictFIFO"
    return dataclasses.replace(snapshot, now=now, live=live, reserve_after_s=RESERVE_AFTER_S)


def sort_baseline(queue: list[QueuedJob], repeat: int = 3) -> float:
    """Least CPU seconds (of ``repeat``) to sort ``queue`` into the queue's order (``QueuedJob.order_key``), the
    first step of every full pass."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        sorted(queue, key=QueuedJob.order_key)
        times.append(time.process_time() - t0)
    return min(times)


def waits_baseline(queue: list[QueuedJob], repeat: int = 3) -> float:
    """Least CPU seconds (of ``repeat``) to write one wait per job of ``queue`` (a ``Waiting`` with a reason, a
    message and a detail, stored by job id, numbered in the queue's order) and nothing else: what a pass that names
    every waiting job pays at least, whatever it decides (the queue is taken as already in order)."""
    times = []
    detail = {"request_gpus": 8}
    for _ in range(repeat):
        gc.collect()
        was = gc.isenabled()
        gc.disable()  # as the pass runs
        t0 = time.process_time()
        out = {}
        for n, job in enumerate(queue, 1):
            w = out[job.job_id] = Waiting(job, "capacity", "No pool has room", detail)
            w.overall_position = n
        times.append(time.process_time() - t0)
        out = None
        if was:
            gc.enable()
    return min(times)


def renewed(snapshot: Snapshot, keep_pools: bool = False) -> Snapshot:
    """``snapshot`` as new objects of the same content, as the platform reads one from its database every pass: its
    teams (quotas, usage, budgets, caps), node pools with their nodes, running and queued jobs. ``keep_pools``: the
    node pools are ``snapshot``'s own objects instead (a fleet whose inventory did not change since the pass
    before, its offers kept: what they carry from earlier passes, ``PoolOffer.derived``, is reused)."""
    teams = {tid: dataclasses.replace(t, quotas={a: dataclasses.replace(q, reachable_gpus=None)
                                                 for a, q in t.quotas.items()},
                                      used=dict(t.used), budgets=list(t.budgets), cluster_caps=dict(t.cluster_caps),
                                      cluster_used=dict(t.cluster_used))
             for tid, t in snapshot.teams.items()}
    pools = snapshot.pools if keep_pools else {
        acc: [dataclasses.replace(o, node_rooms=tuple(dataclasses.replace(n) for n in o.node_rooms)) for o in offers]
        for acc, offers in snapshot.pools.items()}
    return dataclasses.replace(snapshot, teams=teams, pools=pools,
                               queue=[dataclasses.replace(j) for j in snapshot.queue],
                               running=[dataclasses.replace(r) for r in snapshot.running])


def small_pass_cpu_ms(fractional: float = 0.0, decayed: bool = False, queued: int = SMALL_QUEUE,
                      repeat: int = SMALL_REPEAT, clusters: int = CLUSTERS) -> dict[str, tuple[float, float]]:
    """CPU milliseconds of one full pass, a new scheduler each, over ``build``'s fleet, teams and running jobs with
    only the first ``queued`` of its queued jobs: the fixed cost a pass pays whatever the queue's length. Least and
    median of ``repeat`` passes each way, every pass over the same state (the same 10 jobs decided the same way):

    - ``cold``: each pass over a new snapshot (``renewed``: new teams, pools, nodes and jobs), as the platform's
      loop reads one from its database every pass: what the platform pays;
    - ``warm``: each pass over new teams and jobs but the node pools of the pass before (``renewed`` with
      ``keep_pools``): what a pass pays when its fleet's offers are kept from one pass to the next.

    The copies are made before the clock starts; garbage is collected before each pass, so a collection of earlier
    passes' is not charged to it. Returns ``{"cold": (least, median), "warm": (least, median)}``."""
    snapshot, _ = build(fractional=fractional, decayed=decayed, clusters=clusters)
    small = dataclasses.replace(snapshot, queue=snapshot.queue[:queued])
    snapshot = None
    out = {}
    for kind in ("cold", "warm"):
        if kind == "warm":  # the passes before: an offer's layout is kept from its second pass on
            for _ in range(2):
                FairShareScheduler(renewed(small, keep_pools=True)).full_pass()
        times = []
        for _ in range(repeat):
            state = renewed(small, keep_pools=kind == "warm")
            gc.collect()
            c0 = time.process_time()
            FairShareScheduler(state).full_pass()
            times.append(time.process_time() - c0)
            state = None
        out[kind] = (min(times) * 1000, median(times) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fractional-share", type=float, default=0.0,
                        help="share of the queued jobs that ask part of one GPU (0 to 1; default 0)")
    parser.add_argument("--decayed-usage", action="store_true",
                        help="give every team a decayed usage (fair sharing over time, ADR 0045), all different")
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"queued jobs (default {JOBS:,})")
    per_cluster = POOLS_PER_CLUSTER * NODES_PER_POOL
    parser.add_argument("--nodes", type=int, default=CLUSTERS * per_cluster,
                        help=f"nodes, a multiple of {per_cluster}: that many clusters of {POOLS_PER_CLUSTER} pools of "
                             f"{NODES_PER_POOL} nodes (default {CLUSTERS * per_cluster:,})")
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed full passes with the skip and without it, alternated (default 3)")
    args = parser.parse_args()
    fractional, decayed, jobs, repeat = args.fractional_share, args.decayed_usage, args.jobs, args.repeat
    if not 0 <= fractional <= 1:
        parser.error("--fractional-share is a share between 0 and 1")
    if args.nodes <= 0 or args.nodes % per_cluster:
        parser.error(f"--nodes is a positive multiple of {per_cluster}")
    if jobs <= 0 or repeat <= 0:
        parser.error("--jobs and --repeat are positive")
    clusters = args.nodes // per_cluster

    def fresh() -> tuple[Snapshot, list[QueuedJob]]:
        return build(fractional=fractional, decayed=decayed, jobs=jobs, clusters=clusters)

    small = small_pass_cpu_ms(fractional, decayed, clusters=clusters)
    c0 = time.process_time()
    snapshot, extra = fresh()
    build_cpu_s = time.process_time() - c0
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    scheduler = FairShareScheduler(snapshot)
    decisions = scheduler.full_pass()
    full_s = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # timed again without tracemalloc (which slows allocation several times): best and median of ``repeat``, the
    # pass with the skip (``FairShareScheduler.skip``, ADR 0048) and the plain one alternated, since the machine
    # is shared; the plain pass's decisions must be the same
    times, cpu_times, plain_cpu_times, init_cpu_times = [], [], [], []
    for _ in range(repeat):
        for skip in (False, True):
            # the previous pass's scheduler and decisions are let go first, as the platform makes one scheduler a pass
            scheduler = decisions = snapshot = extra = None
            snapshot, extra = fresh()
            gc.collect()
            t0, c0 = time.perf_counter(), time.process_time()
            scheduler = FairShareScheduler(snapshot, skip=skip)
            c1 = time.process_time()
            decisions = scheduler.full_pass()
            if skip:
                times.append(time.perf_counter() - t0)
                cpu_times.append(time.process_time() - c0)
                init_cpu_times.append(c1 - c0)
            else:
                plain_cpu_times.append(time.process_time() - c0)
                plain = digest(decisions)
    same_as_plain = digest(decisions) == plain
    full_s, median_s = min(times), median(times)
    full_cpu_s, plain_cpu_s = min(cpu_times), min(plain_cpu_times)
    t1, c1 = time.perf_counter(), time.process_time()
    incremental = scheduler.submit(extra[0])
    incremental_s, incremental_cpu_s = time.perf_counter() - t1, time.process_time() - c1
    t2, c2 = time.perf_counter(), time.process_time()
    head = scheduler.submit(extra[1])
    head_s, head_cpu_s = time.perf_counter() - t2, time.process_time() - c2
    sort_cpu_s = sort_baseline(snapshot.queue)
    waits_cpu_s = waits_baseline(snapshot.queue)
    strict, _ = fresh()  # the same snapshot with every team StrictFIFO: a team stops at its first waiting job
    for team in strict.teams.values():
        team.strategy = "StrictFIFO"
    c3 = time.process_time()
    strict_decisions = FairShareScheduler(strict).full_pass()
    strict_cpu_s = time.process_time() - c3
    strict = None
    backfill_cpu = {}
    for strategy in ("BestEffortFIFO", "StrictFIFO"):
        planned = backfill_snapshot(build(fractional=fractional, jobs=jobs, clusters=clusters)[0],
                                    strategy == "StrictFIFO")
        gc.collect()
        c4 = time.process_time()
        planned_decisions = FairShareScheduler(planned).full_pass()
        backfill_cpu[strategy] = (time.process_time() - c4, planned_decisions)
        planned = None
    admitted = len(decisions.admissions)
    nodes = clusters * POOLS_PER_CLUSTER * NODES_PER_POOL
    print(f"full pass: {full_s * 1000:.1f} ms, {admitted} admitted, {len(decisions.waiting)} waiting, "
          f"{len(decisions.rejections)} rejected; incremental: {incremental_s * 1000:.3f} ms", file=sys.stderr)
    print(json.dumps({
        "benchmark": "schedule", "queued_jobs": jobs, "running_jobs": len(snapshot.running),
        "preempted": len(decisions.preemptions), "teams": TEAMS, "clusters": clusters,
        "node_pools": clusters * POOLS_PER_CLUSTER, "nodes": nodes,
        "packing_policy": scheduler.book.policy, "fractional_share": fractional, "decayed_usage": decayed,
        "fractional_jobs": sum(1 for j in snapshot.queue if j.share_milli),
        "shares_admitted": sum(1 for a in decisions.admissions if a.job.share_milli), "full_pass_s": round(full_s, 4), "full_pass_median_s": round(median_s, 4),
        "incremental_pass_ms": round(incremental_s * 1000, 3), "incremental_new_head_pass_ms": round(head_s * 1000, 3),
        "new_head_outcome": "admitted" if head.admissions else "waiting" if head.waiting else "rejected",
        "admitted": admitted,
        "waiting": len(decisions.waiting), "rejected": len(decisions.rejections),
        "admissions_per_s": round(admitted / full_s, 1), "jobs_decided_per_s": round(jobs / full_s, 1),
        "incremental_outcome": ("admitted" if incremental.admissions else "waiting" if incremental.waiting
                                else "rejected"),
        "core_peak_memory_mib": round(peak / 2**20, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "full_pass_cpu_s": round(full_cpu_s, 4), "full_pass_cpu_median_s": round(median(cpu_times), 4),
        "full_pass_cpu_us_per_job": round(full_cpu_s * 1e6 / jobs, 3),
        "plain_full_pass_cpu_s": round(plain_cpu_s, 4),
        "full_pass_over_plain": round(full_cpu_s / plain_cpu_s, 3) if plain_cpu_s else None,
        "same_decisions_as_plain": same_as_plain,
        "scheduler_init_cpu_s": round(min(init_cpu_times), 4), "build_cpu_s": round(build_cpu_s, 4),
        "incremental_pass_cpu_ms": round(incremental_cpu_s * 1000, 3),
        "incremental_new_head_pass_cpu_ms": round(head_cpu_s * 1000, 3),
        "pass_cpu_ms_queue_10": round(small["cold"][0], 3), "pass_cpu_ms_queue_10_median": round(small["cold"][1], 3),
        "pass_cpu_ms_queue_10_warm": round(small["warm"][0], 3),
        "pass_cpu_ms_queue_10_warm_median": round(small["warm"][1], 3),
        "baseline_sort_cpu_s": round(sort_cpu_s, 4), "baseline_one_wait_per_job_cpu_s": round(waits_cpu_s, 4),
        "strict_fifo_full_pass_cpu_s": round(strict_cpu_s, 4), "strict_fifo_admitted": len(strict_decisions.admissions),
        "backfill_full_pass_cpu_s": round(backfill_cpu["BestEffortFIFO"][0], 4),
        "backfill_admitted": len(backfill_cpu["BestEffortFIFO"][1].admissions),
        "backfill_reservations": len(backfill_cpu["BestEffortFIFO"][1].reservations),
        "strict_fifo_backfill_full_pass_cpu_s": round(backfill_cpu["StrictFIFO"][0], 4),
        "strict_fifo_backfill_admitted": len(backfill_cpu["StrictFIFO"][1].admissions),
        "strict_fifo_backfill_reservations": len(backfill_cpu["StrictFIFO"][1].reservations),
        "full_pass_over_sort": round(full_cpu_s / sort_cpu_s, 2) if sort_cpu_s else None,
        "incremental_over_full": round(incremental_cpu_s / full_cpu_s, 6) if full_cpu_s else None,
        **machine(),
        "goals": {"full_pass_s": 1.0, "backfill_full_pass_cpu_s": 1.0, "strict_fifo_backfill_full_pass_cpu_s": 1.0, "incremental_pass_ms": 10.0, "core_peak_memory_mib": 256,
                  "pass_cpu_ms_queue_10": 0.5, "full_pass_cpu_s_1m_jobs_50k_nodes": 2.0, "peak_rss_mib_1m_jobs": 2048},
    }))


def digest(decisions) -> str:
    """SHA-256 of what a pass decided, in its order: every admission (job, pool, nodes, GPU, victims), rejection
    (job, verdict) and wait (job, reason, message, detail, both positions, the jobs that overtook it)."""
    h = hashlib.sha256()
    for a in decisions.admissions:
        h.update(repr((a.job.job_id, a.offer.node_pool_id, a.node_names, a.gpu_index, a.accelerator_id,
                       tuple(v.job_id for v in a.victims), a.estimate_usd)).encode())
    for r in decisions.rejections:
        h.update(repr((r.job.job_id, r.verdict)).encode())
    for jid, w in decisions.waiting.items():
        h.update(repr((jid, w.reason, w.message, sorted(w.detail.items(), key=str), w.team_position,
                       w.overall_position, tuple(j.job_id for j in w.overtaken_by or ()))).encode())
    return h.hexdigest()


if __name__ == "__main__":
    main()
