"""Property-based tests of the pure core over random teams, quotas, pools and job streams (hypothesis).

Each example runs scheduling cycles (a full pass, then its admissions start and its victims are requeued) until
nothing changes, checking after every decision: never above nominal + borrowing, never above the cohort's
lendable pool (so never above the cohort's nominal), never above a pool's GPUs, gangs whole on one pool, no
preemption of non-preemptible work or of work within its team's nominal quota, preemptors within nominal, and
no loop: a fixed point is reached and then stays.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import DecisionMemo, FairShareScheduler, NullMemo, QueuedJob, RunningJob, Snapshot
from tests.support import scheduling as pure

#: Every property runs with the memo a pass uses and with the one that remembers nothing.
MEMOS = pytest.mark.parametrize("memo", [DecisionMemo, NullMemo], ids=["memo", "null-memo"])

PRICES = [Decimal("2.99"), Decimal("4.20"), Decimal("6.88")]


@st.composite
def worlds(draw):
    n_teams = draw(st.integers(2, 5))
    teams = []
    for t in range(n_teams):
        nominal = draw(st.integers(0, 16))
        lending = draw(st.one_of(st.none(), st.integers(0, nominal)))
        teams.append((t, nominal, draw(st.integers(0, 16)), lending, draw(st.integers(0, 1)),
                      draw(st.sampled_from([1.0, 2.0, 3.0]))))
    pools = []
    for p in range(draw(st.integers(1, 4))):
        gpn = draw(st.sampled_from([2, 4, 8]))
        pools.append((p + 1, draw(st.integers(1, 4)), gpn, draw(st.sampled_from(PRICES)),
                      draw(st.sampled_from(["on-demand", "on-demand", "spot"]))))
    jobs = []
    for j in range(draw(st.integers(1, 25))):
        jobs.append((j + 1, draw(st.integers(0, n_teams - 1)), draw(st.sampled_from([1, 1, 2])),
                     draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([100, 500, 500, 1000])),
                     draw(st.booleans())))
    return teams, pools, jobs


def build(world, running: dict[int, RunningJob], queue: dict[int, QueuedJob]) -> Snapshot:
    """The world's teams and pools with the ``running`` attempts counted in, and the ``queue``."""
    teams_spec, pools_spec, _ = world
    teams = [pure.team(t, nominal, borrowing, lending=lending, cohort=cohort, weight=weight)
             for t, nominal, borrowing, lending, cohort, weight in teams_spec]
    pools = [pure.pool(pid, nodes * gpn, gpus_per_node=gpn, price=price, capacity_type=ctype, region="r")
             for pid, nodes, gpn, price, ctype in pools_spec]
    return pure.snapshot(teams, pools, queue.values(), running.values())


def check_state(world, running: dict[int, RunningJob]) -> None:
    teams_spec, pools_spec, _ = world
    used = {t[0]: 0 for t in teams_spec}
    for r in running.values():
        used[r.team_id] += r.gpus
    for t, nominal, borrowing, _lending, _cohort, _ in teams_spec:
        assert used[t] <= nominal + borrowing, (t, used[t], nominal, borrowing)
    for cohort in (0, 1):
        members = [t for t in teams_spec if t[4] == cohort]
        lendable = sum(nominal if lending is None else min(lending, nominal) for _, nominal, _, lending, _, _ in members)
        borrowed = sum(max(0, used[t] - (nominal - (nominal if lending is None else min(lending, nominal))))
                       for t, nominal, _, lending, _, _ in members)
        assert borrowed <= lendable
        assert sum(used[t[0]] for t in members) <= sum(t[1] for t in members)
    for pid, nodes, gpn, _, _ in pools_spec:
        assert sum(r.gpus for r in running.values() if r.node_pool_id == pid) <= nodes * gpn
        on_node: dict[str, int] = {}  # the checker's own books: GPUs per node from the admissions' node names
        for r in running.values():
            if r.node_pool_id == pid:
                for name in r.node_names:
                    on_node[name] = on_node.get(name, 0) + r.gpus // len(r.node_names)
        assert all(used <= gpn for used in on_node.values()), on_node


@MEMOS
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_invariants_hold_over_repeated_cycles_and_a_fixed_point_is_reached(memo, world):
    teams_spec, pools_spec, jobs_spec = world
    nominal = {t[0]: t[1] for t in teams_spec}
    pools = {p[0]: p for p in pools_spec}
    queue = {jid: queued(jid, team, nodes, gpn, prio, pre) for jid, team, nodes, gpn, prio, pre in jobs_spec}
    running: dict[int, RunningJob] = {}
    clock = 100.0
    quiet = 0
    for _cycle in range(2 * len(jobs_spec) + 4):
        decisions = FairShareScheduler(build(world, running, queue), memo=memo()).full_pass()
        decided = {a.job.job_id for a in decisions.admissions} | {r.job.job_id for r in decisions.rejections}
        assert set(decisions.waiting) == set(queue) - decided  # every job left waiting has a reason
        for a in decisions.admissions:
            job = a.job
            pid, nodes, gpn, _, ctype = pools[a.offer.node_pool_id]
            assert job.nodes <= nodes and job.gpus_per_node <= gpn  # the gang fits the pool's nodes, whole
            assert job.preemptible or ctype != "spot"
            if a.victims:
                team_used = sum(r.gpus for r in running.values() if r.team_id == job.team_id)
                assert team_used + job.total_gpus <= nominal[job.team_id]  # the preemptor stays within nominal
            for v in sorted(a.victims, key=lambda v: v.gpus):  # the largest last: the most favourable order
                assert v.preemptible and v.team_id != job.team_id
                before = sum(r.gpus for r in running.values() if r.team_id == v.team_id)
                assert before > nominal[v.team_id]  # reclaimWithinCohort: its team borrowed before the removal
                del running[v.job_id]
                queue[v.job_id] = queued(v.job_id, v.team_id, *_shape(jobs_spec, v.job_id))
            clock += 1
            del queue[job.job_id]
            assert len(set(a.node_names)) == job.nodes  # a gang on distinct nodes, all of them
            running[job.job_id] = pure.running(job.job_id, job.team_id, job.total_gpus, a.offer.node_pool_id,
                                               priority=job.priority, admitted=clock, preemptible=job.preemptible,
                                               nodes=job.nodes, node_names=a.node_names)
            check_state(world, running)
        for r in decisions.rejections:
            del queue[r.job.job_id]
        quiet = quiet + 1 if not decisions.admissions and not decisions.rejections else 0
        if quiet >= 2:
            break
    assert quiet >= 2, "no fixed point: the scheduler keeps changing its mind"


def queued(job_id, team_id, nodes, gpus_per_node, priority, preemptible) -> QueuedJob:
    """The world's job ``job_id``, submitted at time ``job_id``."""
    return pure.job(team_id, gpus_per_node, nodes=nodes, priority=priority, at=float(job_id), job_id=job_id,
                    preemptible=preemptible)


def _shape(jobs_spec, job_id):
    _, _, nodes, gpn, prio, pre = jobs_spec[job_id - 1]
    return nodes, gpn, prio, pre


@MEMOS
@settings(max_examples=100, deadline=None)
@given(worlds())
def test_positions_number_every_waiting_job_once_in_each_team_and_overall(memo, world):
    queue = {jid: queued(jid, team, nodes, gpn, prio, pre) for jid, team, nodes, gpn, prio, pre in world[2]}
    d = FairShareScheduler(build(world, {}, queue), memo=memo()).full_pass()
    overall = sorted(w.overall_position for w in d.waiting.values())
    assert overall == list(range(1, len(d.waiting) + 1))
    for t in {w.job.team_id for w in d.waiting.values()}:
        mine = sorted(w.team_position for w in d.waiting.values() if w.job.team_id == t)
        assert mine == list(range(1, len(mine) + 1))
