"""The trace's whole AND fractional GPU tasks on nodes whose GPUs are taken whole or in shares, for
``benchmarks/trace_replay.py``: the platform's core placing them, three reference placers written here from their
definitions (first-fit, best-fit, and FGD from Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent", USENIX ATC 2023), an independent checker of every GPU share, and
the fragmentation each leaves.

A node of the replay time-shares each of its GPUs ``REPLICAS`` ways and also gives whole GPUs (the paper's
cluster, and the core's ``NodeRoom`` with both ``gpus`` and ``shares``): a whole-GPU task takes wholly free GPUs, a
fractional one ``gpu_milli`` of one GPU. The references share nothing with the core but the trace.
"""

from __future__ import annotations

import time

import numpy as np

from jobs.scheduling.core import FairShareScheduler, NodeRoom, PoolOffer, QueuedJob, Snapshot, TeamQuota, TeamState

MILLI = 1000
#: Time-slicing replicas per GPU in the replay: 1000 / 50, the trace's smallest share, so slices never bind and the
#: comparison with the references (which know no slices) is of placement alone.
REPLICAS = 20

#: How long before the fill the tasks of a warm platform were seen (one day, the shapes' half-life).
SEEN_BEFORE_S = 86_400.0

#: A task: (whole GPUs, share in milli-GPUs (0: whole GPUs), CPU millicores, memory MiB).
Task = tuple[int, int, int, int]


def milli_of(task: Task) -> int:
    """GPU capacity a task holds, milli-GPUs."""
    return task[1] if task[1] else task[0] * MILLI


# --- the platform's side -----------------------------------------------------------------------------------------

def offers(nodes, acc: int, price) -> list[PoolOffer]:
    """Pools by (model, GPUs per node), every node empty, its GPUs whole and shared (``REPLICAS`` slices each)."""
    pools: dict[tuple[str, int], list] = {}
    for n in nodes:
        pools.setdefault((n[1], n[2]), []).append(n)
    out = []
    for pid, (key, members) in enumerate(sorted(pools.items()), start=1):
        rooms = tuple(NodeRoom(name, g, g, c, c, m, m, shares=(MILLI,) * g, slices=(REPLICAS,) * g)
                      for name, _, g, c, m in members)
        out.append(PoolOffer(pid, 1, "openb", "onprem", "trace", "on-demand", len(rooms), key[1],
                             sum(r.gpus for r in rooms), price, True, rooms, f"{key[0]}-{key[1]}-shared"))
    return out


def platform(nodes, sequence: list[Task], marks, acc: int, price, teams: int, policy: str = "best-fit",
             seen_before: list[Task] = ()):
    """The core placing ``sequence`` (one incremental pass per arrival, nothing ends) with packing ``policy``:
    allocation at each demand mark (milli-GPUs asked), the checker, the CPU milliseconds of each pass, the
    checker's books at the end (for the fragmentation left) and how many shares were placed. Quotas never bind
    here (each team's nominal quota is the whole fleet twice over): placement is what is compared.
    ``seen_before``: tasks the platform saw a day (``SEEN_BEFORE_S``) before the fill, as a platform that ran
    before would have counted them (``NodeBook.observe``); none by default, a platform starting empty."""
    fleet_gpus = sum(n[2] for n in nodes)
    state = {t: TeamState(t, cohort="trace", quotas={acc: TeamQuota(2 * fleet_gpus, 2 * fleet_gpus)})
             for t in range(teams)}
    scheduler = FairShareScheduler(Snapshot(state, {acc: offers(nodes, acc, price)}, [], policy=policy))
    for g, share, cpu, memory in seen_before:
        scheduler.book.observe(g, share, cpu, memory, -SEEN_BEFORE_S)
    checker = ShareChecker(nodes)
    allocated = demand = mark = shares = 0
    out, passes = [], []
    for i, task in enumerate(sequence):
        g, share, cpu, memory = task
        demand += milli_of(task)
        job = QueuedJob(i + 1, i % teams, acc, 1, g, 500, float(i), False, 3600, cpu_milli=cpu, memory_mib=memory,
                        share_milli=share)
        c0 = time.process_time()
        decisions = scheduler.submit(job)
        passes.append((time.process_time() - c0) * 1000)
        for a in decisions.admissions:
            if share:
                checker.admit_share(a.node_names, a.gpu_index, share, cpu, memory)
                shares += 1
            else:
                checker.admit_whole(a.node_names, g, cpu, memory)
            allocated += milli_of(task)
        while mark < len(marks) and demand >= marks[mark]:
            out.append(allocated / (fleet_gpus * MILLI))
            mark += 1
    return out, checker, passes, shares


class ShareChecker:
    """Books of its own of every node's GPUs (free milli-GPUs and slices of each), CPU and memory, from the
    admissions alone; counts every admission onto an unknown node, onto several nodes, onto a GPU without room
    or without a free slice, or without the CPU, memory or wholly free GPUs asked. A whole GPU it books is the
    lowest-numbered wholly free one (the model the core's books keep); a share, the GPU its admission names."""

    def __init__(self, nodes):
        self.gpus = {n[0]: [MILLI] * n[2] for n in nodes}
        self.slices = {n[0]: [REPLICAS] * n[2] for n in nodes}
        self.rest = {n[0]: [n[3], n[4]] for n in nodes}
        self.without_room = 0

    def _cpu_memory(self, name: str, cpu: int, memory: int) -> None:
        rest = self.rest[name]
        rest[0] -= cpu
        rest[1] -= memory
        if rest[0] < 0 or rest[1] < 0:
            self.without_room += 1

    def admit_whole(self, names, g: int, cpu: int, memory: int) -> None:
        if len(names) != 1 or names[0] not in self.gpus:
            self.without_room += 1
            return
        name = names[0]
        free = [k for k, f in enumerate(self.gpus[name]) if f == MILLI and self.slices[name][k] == REPLICAS]
        if len(free) < g:
            self.without_room += 1
        for k in free[:g]:
            self.gpus[name][k], self.slices[name][k] = 0, 0
        self._cpu_memory(name, cpu, memory)

    def admit_share(self, names, gpu, milli: int, cpu: int, memory: int) -> None:
        if len(names) != 1 or names[0] not in self.gpus or gpu is None or not 0 <= gpu < len(self.gpus[names[0]]):
            self.without_room += 1
            return
        name = names[0]
        self.gpus[name][gpu] -= milli
        self.slices[name][gpu] -= 1
        if self.gpus[name][gpu] < 0 or self.slices[name][gpu] < 0:
            self.without_room += 1
        self._cpu_memory(name, cpu, memory)

    def state(self) -> list[tuple[list[int], int, int]]:
        """Each node's free milli-GPUs per GPU, free CPU and memory, in trace order."""
        return [(list(self.gpus[name]), *self.rest[name]) for name in self.gpus]


# --- the references -------------------------------------------------------------------------------------------

class Workload:
    """The trace's GPU task distribution as arrays (the paper packs for the known distribution): per distinct
    (milli-GPUs, CPU, memory) shape its share of the tasks."""

    def __init__(self, tasks: list[Task]):
        counts: dict[tuple[int, int, int], int] = {}
        for t in tasks:
            key = (milli_of(t), t[2], t[3])
            counts[key] = counts.get(key, 0) + 1
        keys = sorted(counts)
        self.milli = np.array([k[0] for k in keys])
        self.cpu = np.array([k[1] for k in keys])
        self.memory = np.array([k[2] for k in keys])
        total = sum(counts.values())
        self.p = np.array([counts[k] / total for k in keys])
        self.distinct = sorted(set(self.milli.tolist()))
        self.index = np.array([self.distinct.index(x) for x in self.milli.tolist()])

    def fragment(self, gpus: tuple[int, ...], cpu: int, memory: int) -> float:
        """F_n(M) of the paper: expected milli-GPUs of a node with free ``gpus`` (per GPU), ``cpu``, ``memory``
        that a task drawn from the distribution could not use. For each task: everything free if it cannot run
        on the node (CPU, memory, no GPU with its share free, fewer wholly free GPUs than it asks), else the free
        capacity of the GPUs it cannot use (less free than its share; for whole GPUs, those partly used)."""
        total = sum(gpus)
        if total == 0:
            return 0.0
        most = max(gpus)
        whole = sum(1 for f in gpus if f == MILLI)
        partial = sum(f for f in gpus if f < MILLI)
        per_milli = np.empty(len(self.distinct))
        for j, d in enumerate(self.distinct):
            if d < MILLI:
                per_milli[j] = sum(f for f in gpus if f < d) if most >= d else total
            else:
                per_milli[j] = partial if whole >= d // MILLI else total
        frag = np.where((self.cpu <= cpu) & (self.memory <= memory), per_milli[self.index], total)
        return float(np.dot(self.p, frag))


class Reference:
    """A reference placer over plain per-node books: ``first-fit`` (the first node in trace order, its first GPU
    that holds the share), ``best-fit`` (the least left: for a share, on the GPU, then on the node's GPUs, CPU,
    memory; for whole GPUs, on the node's GPUs, then CPU, memory) or ``fgd`` (the paper: the node, and GPU, where
    ``Workload.fragment`` grows least; ties by best-fit's order)."""

    def __init__(self, nodes, policy: str, workload: Workload | None = None):
        self.free = [[MILLI] * n[2] for n in nodes]
        self.cpu = [n[3] for n in nodes]
        self.memory = [n[4] for n in nodes]
        self.policy, self.workload = policy, workload
        self._frag: dict[tuple, float] = {}

    def _fragment(self, gpus, cpu, memory) -> float:
        key = (tuple(sorted(gpus)), cpu, memory)
        found = self._frag.get(key)
        if found is None:
            found = self._frag[key] = self.workload.fragment(key[0], cpu, memory)
        return found

    def _options(self, i: int, task: Task):
        """Where on node ``i`` the task could go: ``(GPUs after, GPU indexes taken)`` per distinct choice."""
        g, share, cpu, memory = task
        free = self.free[i]
        if self.cpu[i] < cpu or self.memory[i] < memory:
            return
        if share:
            seen = set()
            for k, f in enumerate(free):
                if f >= share and f not in seen:
                    seen.add(f)
                    after = list(free)
                    after[k] -= share
                    yield after, (k,)
        else:
            whole = [k for k, f in enumerate(free) if f == MILLI]
            if len(whole) >= g:
                after = list(free)
                for k in whole[:g]:
                    after[k] = 0
                yield after, tuple(whole[:g])

    def place(self, task: Task) -> bool:
        g, share, cpu, memory = task
        best = best_key = None
        for i in range(len(self.free)):
            for after, taken in self._options(i, task):
                if self.policy == "first-fit":
                    best = (i, after)
                    break
                left = (after[taken[0]],) if share else ()
                key = (*left, sum(after), self.cpu[i] - cpu, self.memory[i] - memory, i)
                if self.policy == "fgd":
                    growth = (self._fragment(after, self.cpu[i] - cpu, self.memory[i] - memory)
                              - self._fragment(self.free[i], self.cpu[i], self.memory[i]))
                    key = (round(growth, 9), *key)
                if best_key is None or key < best_key:
                    best, best_key = (i, after), key
            if best is not None and self.policy == "first-fit":
                break
        if best is None:
            return False
        i, after = best
        self.free[i] = after
        self.cpu[i] -= cpu
        self.memory[i] -= memory
        return True

    def state(self) -> list[tuple[list[int], int, int]]:
        return [(list(f), c, m) for f, c, m in zip(self.free, self.cpu, self.memory, strict=True)]


def reference(nodes, sequence: list[Task], marks, policy: str, workload: Workload | None = None):
    """Allocation of a ``Reference`` placing ``sequence`` at each demand mark (milli-GPUs asked), and its books."""
    placer = Reference(nodes, policy, workload)
    total = sum(n[2] for n in nodes) * MILLI
    allocated = demand = mark = 0
    out = []
    for task in sequence:
        demand += milli_of(task)
        if placer.place(task):
            allocated += milli_of(task)
        while mark < len(marks) and demand >= marks[mark]:
            out.append(allocated / total)
            mark += 1
    return out, placer.state()


def stranded_gpus(state, workload: Workload) -> tuple[float, float]:
    """The fragmentation a placement leaves: GPUs (sum over nodes of ``Workload.fragment``, milli-GPUs / 1000)
    that a task of the trace's distribution could not use, and all free GPUs."""
    stranded = sum(workload.fragment(tuple(sorted(g)), c, m) for g, c, m in state)
    return stranded / MILLI, sum(sum(g) for g, _, _ in state) / MILLI
