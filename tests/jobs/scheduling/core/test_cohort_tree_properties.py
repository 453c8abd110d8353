"""Property-based tests of trees of cohorts (ADR 0046) over random three-level trees and job streams (hypothesis).

An organisation (a root cohort), two or three departments, one to three teams in each; every level has a random
nominal quota, borrowing and lending limit and weight. Each example runs scheduling cycles (admissions start, victims
are requeued) until nothing changes, and after every admission an independent checker sums the running GPUs per
subtree and asserts: no level holds more than the nominal quota inside it plus its borrowing limit; the teams
outside a level never hold more than the nominal outside it plus that level's lending limit; the tree never holds
more than its nominal quota; a preemptor stays within its team's nominal and each victim's team was borrowing.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.cohorts import Level
from jobs.scheduling.core import DecisionMemo, FairShareScheduler, NullMemo, RunningJob, Snapshot, TeamQuota, TeamState
from tests.support import scheduling as pure

MEMOS = pytest.mark.parametrize("memo", [DecisionMemo, NullMemo], ids=["memo", "null-memo"])
H100 = pure.H100
ROOT = ("cohort", 1)


@st.composite
def trees(draw):
    """``(cohorts, teams, pools, jobs)``: cohorts as ``(key, parent, nominal, borrowing limit, lending limit,
    weight)``, teams as ``(id, cohort key, nominal, borrowing limit, lending limit, weight)``."""
    limit = st.one_of(st.none(), st.integers(0, 4))
    cohorts = [(ROOT, None, draw(st.integers(0, 8)), None, None, 1.0)]
    teams = []
    for d in range(draw(st.integers(2, 3))):
        key = ("cohort", 10 + d)
        cohorts.append((key, ROOT, draw(st.integers(0, 6)), draw(limit), draw(limit),
                        draw(st.sampled_from([1.0, 2.0]))))
        for _ in range(draw(st.integers(1, 3))):
            nominal = draw(st.integers(0, 6))
            teams.append((len(teams) + 1, key, nominal, draw(st.integers(0, 12)),
                          draw(st.one_of(st.none(), st.integers(0, nominal))), draw(st.sampled_from([1.0, 2.0]))))
    pools = [(p + 1, draw(st.integers(1, 4)), draw(st.sampled_from([2, 4, 8]))) for p in range(draw(st.integers(1, 3)))]
    jobs = [(j + 1, draw(st.integers(1, len(teams))), draw(st.sampled_from([1, 1, 2])),
             draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([100, 500, 1000])), draw(st.booleans()))
            for j in range(draw(st.integers(1, 25)))]
    return cohorts, teams, pools, jobs


def build(world, running: dict[int, RunningJob], queue) -> Snapshot:
    cohorts, teams_spec, pools_spec, _ = world
    levels = tuple(Level(key, parent, {H100: nominal}, {H100: bl}, {H100: ll}, weight=w)
                   for key, parent, nominal, bl, ll, w in cohorts)
    teams = [TeamState(tid, ROOT, w, {H100: TeamQuota(nominal, bl, ll)}, parent_cohort=parent)
             for tid, parent, nominal, bl, ll, w in teams_spec]
    pools = [pure.pool(pid, nodes * gpn, gpus_per_node=gpn, region="r") for pid, nodes, gpn in pools_spec]
    snap = pure.snapshot(teams, pools, queue.values(), running.values())
    snap.cohort_levels = levels
    return snap


def check_tree(world, running: dict[int, RunningJob]) -> None:
    """The independent checker: usage and nominal quota summed per subtree from the world's own description."""
    cohorts, teams_spec, _, _ = world
    used = {t[0]: 0 for t in teams_spec}
    for r in running.values():
        used[r.team_id] += r.gpus
    below = {key: [] for key, *_ in cohorts}  # cohort -> its member teams, at any depth
    for tid, parent, *_ in teams_spec:
        below[parent].append(tid)
        below[ROOT].append(tid) if parent != ROOT else None
    own = {key: nominal for key, _, nominal, *_ in cohorts}
    team_nominal = {t[0]: t[2] for t in teams_spec}
    nested = {key: [k for k, p, *_ in cohorts if p == key] for key, *_ in cohorts}

    def nominal_in(key):
        return own[key] + sum(team_nominal[t] for t in teams_spec_of(key)) + sum(own[c] for c in nested[key])

    def teams_spec_of(key):
        return below[key]

    total_nominal, total_used = nominal_in(ROOT), sum(used.values())
    assert total_used <= total_nominal, ("the tree", total_used, total_nominal)
    for key, parent, _, bl, ll, _ in cohorts:
        if parent is None:
            continue
        n, u = nominal_in(key), sum(used[t] for t in below[key])
        if bl is not None:
            assert u <= n + bl, (key, "uses", u, "over nominal", n, "+ borrowing limit", bl)
        if ll is not None:
            assert total_used - u <= total_nominal - n + ll, (key, "lends over its lending limit", ll)
    for tid, _, nominal, bl, ll, _ in teams_spec:
        assert used[tid] <= nominal + bl, (tid, used[tid], nominal, bl)
        if ll is not None:
            assert total_used - used[tid] <= total_nominal - nominal + ll, (tid, "lends over", ll)


@MEMOS
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_every_level_of_a_three_level_tree_holds_over_repeated_cycles(memo, world):
    _, teams_spec, pools_spec, jobs_spec = world
    nominal = {t[0]: t[2] for t in teams_spec}
    gpn_of = {p[0]: p[2] for p in pools_spec}
    queue = {jid: pure.job(team, gpn, nodes=nodes, priority=prio, at=float(jid), job_id=jid, preemptible=pre)
             for jid, team, nodes, gpn, prio, pre in jobs_spec}
    running: dict[int, RunningJob] = {}
    clock, quiet = 100.0, 0
    for _cycle in range(2 * len(jobs_spec) + 4):
        decisions = FairShareScheduler(build(world, running, queue), memo=memo()).full_pass()
        for a in decisions.admissions:
            job = a.job
            if a.victims:
                team_used = sum(r.gpus for r in running.values() if r.team_id == job.team_id)
                assert team_used + job.total_gpus <= nominal[job.team_id]
            for v in sorted(a.victims, key=lambda v: v.gpus):
                before = sum(r.gpus for r in running.values() if r.team_id == v.team_id)
                assert v.preemptible and before > nominal[v.team_id]
                del running[v.job_id]
                _, team, nodes, gpn, prio, pre = jobs_spec[v.job_id - 1]
                queue[v.job_id] = pure.job(team, gpn, nodes=nodes, priority=prio, at=float(v.job_id),
                                           job_id=v.job_id, preemptible=pre)
            clock += 1
            del queue[job.job_id]
            assert job.gpus_per_node <= gpn_of[a.offer.node_pool_id]
            running[job.job_id] = pure.running(job.job_id, job.team_id, job.total_gpus, a.offer.node_pool_id,
                                               priority=job.priority, admitted=clock, preemptible=job.preemptible,
                                               nodes=job.nodes, node_names=a.node_names)
            check_tree(world, running)
        for r in decisions.rejections:
            del queue[r.job.job_id]
        quiet = quiet + 1 if not decisions.admissions and not decisions.rejections else 0
        if quiet >= 2:
            break
    assert quiet >= 2, "no fixed point: the scheduler keeps changing its mind"


def test_a_department_at_its_borrowing_limit_keeps_its_team_waiting_while_another_department_has_room():
    # org (0) > dept A (borrowing limit 2) > team 1 (nominal 4, borrowing 10); dept B > team 2 (nominal 8)
    levels = (Level(ROOT), Level(("cohort", 10), ROOT, {H100: 0}, {H100: 2}, name="dept-a"),
              Level(("cohort", 11), ROOT, name="dept-b"))
    teams = [TeamState(1, ROOT, 1.0, {H100: TeamQuota(4, 10)}, parent_cohort=("cohort", 10)),
             TeamState(2, ROOT, 1.0, {H100: TeamQuota(8, 0)}, parent_cohort=("cohort", 11))]
    snap = pure.snapshot(teams, [pure.pool(1, 32, gpus_per_node=8)],
                         [pure.job(1, 4, job_id=1, at=1.0), pure.job(1, 2, job_id=2, at=2.0),
                          pure.job(1, 1, job_id=3, at=3.0), pure.job(2, 8, job_id=4, at=4.0)])
    snap.cohort_levels = levels
    d = FairShareScheduler(snap).full_pass()
    # team 1 reaches 4 (nominal) + 2 (its department's borrowing limit), not 4 + 8 (what dept B could lend)
    assert sorted(a.job.job_id for a in d.admissions) == [1, 2]
    assert d.waiting[3].reason == "quota" and d.waiting[3].detail["limit_gpus"] == 6
    assert d.waiting[4].reason == "quota"  # 2 of team 2's 8 are lent to dept A


def test_a_team_within_its_own_limits_waits_for_its_department_and_is_told_which_level():
    # org > dept A (nominal 0, borrowing limit 2) > teams 1 and 2 (nominal 2, borrowing 10 each); dept B > team 3 (8)
    levels = (Level(ROOT, name="org"), Level(("cohort", 10), ROOT, {H100: 0}, {H100: 2}, name="dept-a"),
              Level(("cohort", 11), ROOT, name="dept-b"))
    teams = [TeamState(1, ROOT, 1.0, {H100: TeamQuota(2, 10)}, parent_cohort=("cohort", 10)),
             TeamState(2, ROOT, 1.0, {H100: TeamQuota(2, 10)}, parent_cohort=("cohort", 10)),
             TeamState(3, ROOT, 1.0, {H100: TeamQuota(8, 0)}, parent_cohort=("cohort", 11))]
    runs = [pure.running(9, 1, 5, 1, preemptible=False)]
    snap = pure.snapshot(teams, [pure.pool(1, 32, gpus_per_node=8)], [pure.job(2, 2, job_id=1)], runs)
    snap.cohort_levels = levels
    d = FairShareScheduler(snap).full_pass()
    # dept A holds 5 of its 4 + 2: one more GPU, not two, though team 2 itself could borrow 10
    w = d.waiting[1]
    assert w.reason == "quota" and w.detail["short_level"] == "dept-a" and w.detail["available"] == 1
    assert [lv["level"] for lv in w.detail["levels"]] == ["team 2", "dept-a", "org"]


def test_reclaim_takes_a_borrower_from_outside_the_department_first():
    # org > dept A > teams 1 and 2, dept B > team 3; team 1 reclaims its nominal 4; teams 2 and 3 borrow
    levels = (Level(ROOT), Level(("cohort", 10), ROOT, name="a"), Level(("cohort", 11), ROOT, name="b"))
    teams = [TeamState(1, ROOT, 1.0, {H100: TeamQuota(4, 0)}, parent_cohort=("cohort", 10)),
             TeamState(2, ROOT, 1.0, {H100: TeamQuota(2, 8)}, parent_cohort=("cohort", 10)),
             TeamState(3, ROOT, 1.0, {H100: TeamQuota(2, 8)}, parent_cohort=("cohort", 11))]
    # team 2 (inside A) borrows 2 with a low-priority job; team 3 (outside A) borrows 2 with a normal one
    runs = [pure.running(10, 2, 4, 1, priority=100, admitted=1.0, node_names=("1-0",), nodes=1),
            pure.running(11, 3, 4, 1, priority=500, admitted=2.0, node_names=("1-1",), nodes=1)]
    runs = [RunningJob(r.job_id, r.attempt_id, r.team_id, r.accelerator_id, r.node_pool_id, r.gpus, r.priority,
                       r.admitted, True, r.node_names, 4) for r in runs]
    snap = pure.snapshot(teams, [pure.pool(1, 8, gpus_per_node=4)], [pure.job(1, 4, job_id=1, at=5.0)], runs)
    snap.cohort_levels = levels
    d = FairShareScheduler(snap).full_pass()
    assert [a.job.job_id for a in d.admissions] == [1]
    # the flat order would take the low-priority job of team 2 first; the tree takes team 3's, outside dept A
    assert [v.job_id for v in d.admissions[0].victims] == [11]


def test_decimal_shares_sum_exactly_in_the_tree():
    levels = (Level(ROOT), Level(("cohort", 10), ROOT, {H100: 1}, {H100: 0}))
    teams = [TeamState(1, ROOT, 1.0, {H100: TeamQuota(0, 1)}, {H100: Decimal("0.75")}, parent_cohort=("cohort", 10))]
    snap = pure.snapshot(teams, [pure.pool(1, 8)], [pure.job(1, 1, job_id=1)])
    snap.cohort_levels = levels
    d = FairShareScheduler(snap).full_pass()
    assert d.waiting[1].reason == "quota"  # 0.75 + 1 > the department's 1 GPU
