"""A pass remembers decisions that admit nothing (``memo.DecisionMemo``) and capacity waits; what it remembers
must never differ from what deciding the job afresh would say.

Two properties over random worlds (two accelerators, cohorts, budgets, per-cluster caps, StrictFIFO teams,
preemptible running work, CPU and memory per node, accelerator alternatives), each checked against a second
pass over another queue rather than against the scheduler's own caches:

- a job that waits admits nothing, so taking waiting jobs of BestEffortFIFO teams out of the queue changes no
  other job's decision (the job after them of the same shape is then decided afresh), the demand seen being the
  same (the jobs taken out were seen: constraint-aware placement counts them, ADR 0043);
- a submission that comes last in every order is decided as a full pass over the queue with it would decide it,
  numbers included, even after earlier submissions were admitted.

And the cases where a remembered decision went stale: a budget wait after another team's booking, the cohort's
numbers in a cohort-full wait, a capacity wait once the cohort cannot lend, the free GPUs told to a submission,
and money committed by a quota-free CPU-only admission.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import (
    DecisionMemo,
    FairShareScheduler,
    NodeRoom,
    NullMemo,
    PoolOffer,
    QueuedJob,
    Snapshot,
    TeamQuota,
    TeamState,
)
from jobs.scheduling.core.scarcity import PoolDemand
from tests.support import scheduling as pure
from tests.support.scheduling_worlds import CPU, H100, NODE_CPU, NODE_MEMORY, build, by_job, queued, worlds

#: Every property runs with the memo a pass uses and with the one that remembers nothing.
MEMOS = pytest.mark.parametrize("memo", [DecisionMemo, NullMemo], ids=["memo", "null-memo"])


@MEMOS
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.data())
def test_taking_waiting_jobs_out_of_the_queue_changes_no_other_decision(memo, world, data):
    queue = [queued(j) for j in world[3]]
    full = by_job(FairShareScheduler(build(world, queue), memo=memo()).full_pass())
    strategy = {t[0]: t[4] for t in world[0]}
    out = [jid for jid, d in full.items() if d[0] == "waiting" and strategy[next(j.team_id for j in queue
                                                                               if j.job_id == jid)] != "StrictFIFO"]
    removed = set(data.draw(st.lists(st.sampled_from(out), unique=True), label="removed")) if out else set()
    # the jobs taken out were seen all the same: the demand that orders pools (ADR 0043) counts them in both passes
    snapshot = build(world, [j for j in queue if j.job_id not in removed])
    seen = PoolDemand(snapshot.pools, queue)
    rest = by_job(FairShareScheduler(snapshot, memo=memo(), demand=seen).full_pass())
    assert rest == {jid: d for jid, d in full.items() if jid not in removed}


@MEMOS
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.lists(st.integers(0, 10**6), min_size=1, max_size=3))
def test_a_submission_last_in_every_order_is_decided_as_a_full_pass_would(memo, world, picks):
    # each submission copies a queued job's shape for one team, with the lowest priority and the latest time: a
    # full pass over the queue with the submissions so far decides it last (after every other team's jobs, whatever
    # the teams' shares, and after the team's earlier submissions), on the state every earlier decision left
    queue = [queued(j) for j in world[3]]
    team = queue[picks[0] % len(queue)].team_id
    if next(t[4] for t in world[0] if t[0] == team) == "StrictFIFO":
        return  # behind a blocked head a submission waits undecided
    scheduler = FairShareScheduler(build(world, queue), memo=memo())
    scheduler.full_pass()
    submitted = []
    for n, pick in enumerate(picks):
        job = dataclasses.replace(queued(world[3][pick % len(world[3])], at=1e6 + n), job_id=10_000 + n,
                                  team_id=team, priority=0)
        submitted.append(job)
        got = by_job(scheduler.submit(job))[job.job_id]
        full = by_job(FairShareScheduler(build(world, queue + submitted), memo=memo()).full_pass())[job.job_id]
        assert got == full, job


# --- the cases -----------------------------------------------------------------------------------------------

def test_a_budget_wait_is_decided_afresh_after_another_team_fills_the_pool():
    # team 1 has $10 left; one 8-GPU pool at $4.00: job 1 (1 GPU x 3 h = $12) waits for the budget; team 2 then
    # fills the pool; job 3, the same shape as job 1, has no room anywhere: it waits for capacity, not money
    t1 = pure.team(1, 16, budgets=[pure.block_budget("20", committed="10")])
    t2 = pure.team(2, 16, cohort=1)
    first, filler, same = (pure.job(1, 1, runtime=10_800, at=0), pure.job(2, 8, at=1),
                           pure.job(1, 1, runtime=10_800, at=2))
    d, _ = pure.decide([t1, t2], [pure.pool(1, 8)], [first, filler, same])
    assert pure.admitted(d) == [filler.job_id]
    assert d.waiting[first.job_id].reason == "budget"
    assert d.waiting[same.job_id].reason == "capacity"


def test_a_budget_wait_is_decided_afresh_when_a_cheaper_pool_opens_by_preemption():
    # pool 1 ($2.99) is full of team 3's preemptible borrowed work, pool 2 ($4.00) is empty. Team 1 ($10 left)
    # asks 1 GPU for 3 h: $12 on pool 2 is over its budget, so it waits. Team 2 (another cohort) then fills pool 2.
    # The same job again has room only by preempting team 3 on pool 1, at $8.97: it is admitted.
    t1 = pure.team(1, 16, cohort=0, budgets=[pure.block_budget("20", committed="10")])
    t2 = pure.team(2, 16, cohort=1)
    t3 = pure.team(3, 0, 16, cohort=0)
    victim = pure.running(900, 3, 8, 1, preemptible=True, node_names=("1-0",))
    first, filler, same = (pure.job(1, 1, runtime=10_800, at=0), pure.job(2, 8, at=1),
                           pure.job(1, 1, runtime=10_800, at=2))
    d, _ = pure.decide([t1, t2, t3], [pure.pool(1, 8, price="2.99"), pure.pool(2, 8, price="4.00")],
                       [first, filler, same], [victim])
    assert d.waiting[first.job_id].reason == "budget"
    assert pure.admitted(d) == [filler.job_id, same.job_id]
    again = next(a for a in d.admissions if a.job.job_id == same.job_id)
    assert again.offer.node_pool_id == 1 and [v.job_id for v in again.victims] == [900]
    assert again.estimate_usd == Decimal("2.99") * 3


def test_a_cohort_full_wait_gives_the_cohort_numbers_when_it_is_decided():
    # teams 1 and 2 (nominal 0) share a cohort whose lender (team 3) lends 12. Team 2 borrows 6 with c; team 1's
    # b (8: within the 12 it can reach) finds 6 borrowed and waits for the cohort; team 2 borrows 4 more with e;
    # d (team 1, b's shape) must be told 10 borrowed, not b's 6
    teams = [pure.team(1, 0, 16, cohort=0), pure.team(2, 0, 16, cohort=0), pure.team(3, 12, cohort=0)]
    c, b, e, d_ = (pure.job(2, 6, at=0, priority=900), pure.job(1, 8, at=1, priority=800),
                   pure.job(2, 4, at=2, priority=700), pure.job(1, 8, at=3, priority=600))
    d, _ = pure.decide(teams, [pure.pool(1, 32)], [c, b, e, d_])
    assert pure.admitted(d) == [c.job_id, e.job_id]
    for waiting, borrowed in ((b, c.total_gpus), (d_, c.total_gpus + e.total_gpus)):
        w = d.waiting[waiting.job_id]
        assert w.reason == "quota" and w.detail["cohort_borrowed_gpus"] == borrowed
        assert f"{borrowed} of them are in use" in w.message


def test_a_capacity_wait_becomes_a_cohort_wait_once_the_cohort_cannot_lend():
    # team 1 (nominal 0, borrowing up to 16) and team 2 share a cohort whose lender (team 3) lends 8. Team 1's
    # job may run only on cluster c1, whose pool is held by work the platform does not own: it waits for room
    # (the cohort could lend it). Team 2 then borrows all 8 on c2. Team 1's next job of the same shape waits for
    # the cohort, as a fresh decision says, not for room as the first one did.
    teams = [pure.team(1, 0, 16, cohort=0), pure.team(2, 0, 16, cohort=0), pure.team(3, 8, cohort=0)]
    full = pure.pool(1, 8, free=0, price="2.99")  # held by work the platform does not own
    other = pure.pool(2, 8, price="6.88", cluster="c2")
    first = pure.job(1, 4, at=0, priority=900)
    first = dataclasses.replace(first, clusters=("c1",))  # only the full pool's cluster
    taker = pure.job(2, 8, at=1, priority=800)
    same = dataclasses.replace(pure.job(1, 4, at=2, priority=700), clusters=("c1",))
    d, _ = pure.decide(teams, [full, other], [first, taker, same])
    assert pure.admitted(d) == [taker.job_id]
    assert d.waiting[first.job_id].reason == "capacity"
    assert d.waiting[same.job_id].reason == "quota"
    assert d.waiting[same.job_id].detail["cohort_borrowed_gpus"] == taker.total_gpus


def test_each_submission_is_told_the_free_gpus_after_the_earlier_ones():
    # one node of 8 GPUs, 6 free; teams in two cohorts (one's booking changes nothing else the other reads): an
    # 8-GPU submission waits with 6 free, a 1-GPU one of the other team is admitted, the next 8-GPU one is told 5
    teams = [pure.team(1, 16, cohort=1), pure.team(2, 16, cohort=2)]
    scheduler = FairShareScheduler(pure.snapshot(teams, [pure.pool(1, 8, free=6)], []))
    scheduler.full_pass()
    big = pure.job(2, 8, at=1)
    assert scheduler.submit(big).waiting[big.job_id].detail["free_gpus_by_pool"] == {"1": 6}
    small = pure.job(1, 1, at=2)
    assert pure.admitted(scheduler.submit(small)) == [small.job_id]
    again = pure.job(2, 8, at=3)
    w = scheduler.submit(again).waiting[again.job_id]
    assert w.detail["free_gpus_by_pool"] == {"1": 6 - small.total_gpus}
    assert f"{6 - small.total_gpus} GPUs free" in w.message


def test_money_committed_by_a_quota_free_cpu_only_admission_is_read_by_the_next_budget_decision():
    # team 1 has no CPU quota (its CPU-only jobs count no quota) and a $50 block budget, $15 committed. A CPU-only
    # job commits money; a later GPU job whose whole cost is over the budget is rejected with the money as it is
    # then, not as it was when an earlier job of its shape was rejected.
    cpu_pool = PoolOffer(5, 5, "c5", "aws", "r", "on-demand", 1, 0, 0, Decimal(0), True,
                         (NodeRoom("5-0", 0, 0, NODE_CPU, NODE_CPU, NODE_MEMORY, NODE_MEMORY),),
                         usd_per_vcpu_hour=Decimal("0.50"), usd_per_gib_hour=None)
    gpu_pool = pure.pool(1, 8, price="4.00")
    team = TeamState(1, None, 1.0, {H100: TeamQuota(16, 0, None, 0)},
                     budgets=[pure.block_budget("50", committed="15")])
    huge_1 = pure.job(1, 8, runtime=36_000, at=0, priority=900)  # $1,152: never within $50
    cpu_job = QueuedJob(2, 1, CPU, 1, 0, 800, 1.0, False, 3600, cpu_milli=2_000)  # 2 vCPU x 1 h x $0.50 = $1
    huge_2 = pure.job(1, 8, runtime=36_000, at=2, priority=700)
    d = FairShareScheduler(Snapshot({1: team}, {H100: [gpu_pool], CPU: [cpu_pool]},
                                    [huge_1, cpu_job, huge_2], [])).full_pass()
    assert pure.admitted(d) == [cpu_job.job_id]
    committed = {r.job.job_id: Decimal(r.verdict.detail["committed_usd"]) for r in d.rejections}
    assert committed == {huge_1.job_id: Decimal(15), huge_2.job_id: Decimal(15) + Decimal(1)}
