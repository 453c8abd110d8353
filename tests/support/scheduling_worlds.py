"""Random worlds for the pure scheduler's property tests: two accelerators and a CPU flavor, cohorts, budgets,
per-cluster caps, StrictFIFO teams, preemptible running work, CPU and memory per node, accelerator alternatives;
every name and number small enough to collide often. ``worlds()`` draws one as plain tuples, ``build`` makes its
snapshot, ``by_job`` says what a pass decided of each job (positions apart).
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import strategies as st

from jobs.scheduling.core import (
    Admission,
    NodeRoom,
    PoolOffer,
    QueuedJob,
    Rejection,
    RunningJob,
    Snapshot,
    TeamQuota,
    TeamState,
)
from tests.support import scheduling as pure

A100, H100 = 2, 1
CPU = 9  # the CPU flavor's accelerator id in these worlds
NODE_CPU, NODE_MEMORY = 64_000, 262_144


@st.composite
def worlds(draw):
    """(teams, pools, running, queue) as plain tuples; every name and number small enough to collide often."""
    n_teams = draw(st.integers(2, 4))
    teams = []
    for t in range(1, n_teams + 1):
        quotas = {}
        for acc in (H100, A100):
            if draw(st.integers(0, 5)):
                nominal = draw(st.sampled_from([0, 2, 4, 8, 16]))
                quotas[acc] = (nominal, draw(st.sampled_from([0, 4, 8, 16])),
                               draw(st.sampled_from([None, None, 0, nominal // 2])))
        if draw(st.booleans()):
            quotas[CPU] = (draw(st.sampled_from([0, 8_000, 32_000])), draw(st.sampled_from([0, 16_000])), None)
        budget = draw(st.sampled_from([None, None, ("40", "0"), ("40", "25"), ("120", "90"), ("2000", "0")]))
        teams.append((t, draw(st.sampled_from([0, 0, 1])), quotas, budget,
                      draw(st.sampled_from(["BestEffortFIFO", "BestEffortFIFO", "StrictFIFO"])),
                      draw(st.sampled_from([None, None, 4, 8]))))
    pools = []
    for p in range(1, draw(st.integers(2, 5)) + 1):
        acc = draw(st.sampled_from([H100, H100, A100, CPU]))
        gpn = 0 if acc == CPU else draw(st.sampled_from([2, 4, 8]))
        pools.append((p, acc, draw(st.integers(1, 3)), gpn, draw(st.sampled_from(["2.99", "4.20", "6.88"])),
                      draw(st.sampled_from(["on-demand", "on-demand", "spot"])), draw(st.integers(1, 2))))
    running = []
    for r in range(draw(st.integers(0, 4))):
        pid, acc, nodes, gpn, _, _, _ = draw(st.sampled_from(pools))
        if gpn:
            running.append((900 + r, draw(st.integers(1, n_teams)), pid, acc, draw(st.integers(0, nodes - 1)),
                            draw(st.sampled_from([1, gpn // 2, gpn])), draw(st.booleans())))
    shapes = []  # a few shapes, so that many jobs share one (and what was remembered of it)
    for _ in range(draw(st.integers(1, 4))):
        acc = draw(st.sampled_from([H100, H100, A100, CPU]))
        gpn = 0 if acc == CPU else draw(st.sampled_from([1, 2, 4, 8]))
        alts = (A100,) if acc == H100 and draw(st.integers(0, 4)) == 0 else ()
        shapes.append((acc, draw(st.sampled_from([1, 1, 2])), gpn, draw(st.booleans()),
                       draw(st.sampled_from([3600, 3600, 36_000])), draw(st.sampled_from([0, 8_000, 32_000])),
                       draw(st.sampled_from([0, 65_536])), alts, draw(st.sampled_from([(), (), ("c1",)]))))
    queue = []
    for j in range(1, draw(st.integers(1, 30)) + 1):
        acc, nodes, gpn, pre, runtime, cpu, mem, alts, clusters = draw(st.sampled_from(shapes))
        queue.append((j, draw(st.integers(1, n_teams)), acc, nodes, gpn, draw(st.sampled_from([100, 500, 500, 1000])),
                      pre, runtime, cpu, mem, alts, clusters))
    return teams, pools, running, queue


def queued(spec, at: float | None = None) -> QueuedJob:
    jid, team, acc, nodes, gpn, prio, pre, runtime, cpu, mem, alts, clusters = spec
    return QueuedJob(jid, team, acc, nodes, gpn, prio, float(jid if at is None else at), pre, runtime,
                     clusters=clusters, cpu_milli=cpu if gpn or cpu else 1_000, memory_mib=mem, alternatives=alts)


def build(world, queue: list[QueuedJob]) -> Snapshot:
    """The world's snapshot with ``queue``: running work on its nodes, counted in its teams' usage."""
    teams_spec, pools_spec, running_spec, _ = world
    teams = {}
    for t, cohort, quotas, budget, strategy, cap in teams_spec:
        state = TeamState(t, cohort, 1.0, {acc: TeamQuota(n, b, lend, 0) for acc, (n, b, lend) in quotas.items()},
                          budgets=[pure.block_budget(*budget, budget_id=t)] if budget else [], strategy=strategy)
        if cap is not None and H100 in quotas:
            state.cluster_caps[(H100, 1)] = cap  # pools 1.. are on clusters of their id: a cap on cluster 1
        teams[t] = state
    free = {(pid, i): gpn for pid, _, nodes, gpn, *_ in pools_spec for i in range(nodes)}
    runs = []
    for rid, team, pid, acc, node, gpus, pre in running_spec:
        if free[(pid, node)] < gpus or acc not in teams[team].quotas:
            continue
        free[(pid, node)] -= gpus
        teams[team].used[acc] = teams[team].used.get(acc, 0) + gpus
        if (acc, pid) in teams[team].cluster_caps:
            teams[team].cluster_used[(acc, pid)] = teams[team].cluster_used.get((acc, pid), 0) + gpus
        runs.append(RunningJob(rid, rid + 10_000, team, acc, pid, gpus, 500, -float(rid), pre, (f"{pid}-{node}",),
                               gpus, 0, 0))
    pools: dict[int, list[PoolOffer]] = {}
    for pid, acc, nodes, gpn, price, ctype, domains in pools_spec:
        rooms = tuple(NodeRoom(f"{pid}-{i}", gpn, free[(pid, i)], NODE_CPU, NODE_CPU, NODE_MEMORY, NODE_MEMORY,
                               f"d{i % domains}") for i in range(nodes))
        cpu_priced = acc == CPU
        pools.setdefault(acc, []).append(PoolOffer(
            pid, pid, f"c{pid}", "aws", "r", ctype, nodes, gpn, sum(r.free_gpus for r in rooms),
            Decimal(0) if cpu_priced else Decimal(price), True, rooms,
            usd_per_vcpu_hour=Decimal("0.03") if cpu_priced else None,
            usd_per_gib_hour=Decimal("0.004") if cpu_priced else None))
    return Snapshot(teams, pools, queue, runs)


def seen(decision) -> tuple:
    """What a decision says, positions left out (they count the other waiting jobs)."""
    if isinstance(decision, Admission):
        return ("admitted", decision.offer.node_pool_id, decision.node_names, decision.accelerator_id,
                decision.estimate_usd, tuple(v.job_id for v in decision.victims))
    if isinstance(decision, Rejection):
        v = decision.verdict
        return ("rejected", v.reason, v.message, v.detail)
    return ("waiting", decision.reason, decision.message, decision.detail)


def by_job(decisions) -> dict:
    out = {a.job.job_id: seen(a) for a in decisions.admissions}
    out.update({r.job.job_id: seen(r) for r in decisions.rejections})
    out.update({jid: seen(w) for jid, w in decisions.waiting.items()})
    return out


@st.composite
def crowded_worlds(draw):
    """Worlds where preemption is common, in ``worlds()``'s shape: every team of one cohort with an H100 quota, the
    nodes busy with running work (mostly preemptible) of teams that may borrow, and jobs of every size queued."""
    n_teams = draw(st.integers(2, 3))
    teams = [(t, 0, {H100: (draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([4, 8, 16])),
                            draw(st.sampled_from([None, None, 2])))},
              draw(st.sampled_from([None, None, ("40", "0")])), draw(st.sampled_from(["BestEffortFIFO", "StrictFIFO"])),
              None) for t in range(1, n_teams + 1)]
    pools = [(p, H100, draw(st.integers(1, 2)), 8, draw(st.sampled_from(["2.99", "4.20"])), "on-demand", 1)
             for p in range(1, draw(st.integers(1, 3)) + 1)]
    running = []
    for pid, _, nodes, _gpn, *_ in pools:
        for node in range(nodes):
            for _ in range(draw(st.integers(0, 2))):
                running.append((900 + len(running), draw(st.integers(1, n_teams)), pid, H100, node,
                                draw(st.sampled_from([2, 4, 8])), draw(st.integers(0, 3)) > 0))
    shapes = draw(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.booleans()), min_size=1, max_size=3))
    queue = []
    for j in range(1, draw(st.integers(1, 24)) + 1):
        gpus, preemptible = draw(st.sampled_from(shapes))
        queue.append((j, draw(st.integers(1, n_teams)), H100, 1, gpus, draw(st.sampled_from([100, 500, 1000])),
                      preemptible, 3600, 0, 0, (), ()))
    return teams, pools, running, queue
