"""The decision memo changes how fast a pass decides, never what it decides.

Every generated world is scheduled twice, once with the memo a pass uses (``DecisionMemo``) and once with the
one that remembers nothing (``NullMemo``): a full pass, then submissions of any team, priority and shape, then
a full pass over the jobs left waiting on a fresh snapshot, and an evaluation of each on the state the first
scheduler reached. Each step must give
the same decisions, messages, numbers and queue positions.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import DecisionMemo, FairShareScheduler, NullMemo
from tests.support.scheduling_worlds import build, crowded_worlds, queued, seen, worlds


def said(decisions) -> dict:
    """What a pass said of each job, positions included."""
    out = {a.job.job_id: seen(a) for a in decisions.admissions}
    out.update({r.job.job_id: seen(r) for r in decisions.rejections})
    out.update({jid: (*seen(w), w.team_position, w.overall_position) for jid, w in decisions.waiting.items()})
    return out


def run(world, submissions, memo) -> list:
    """Everything a scheduler with ``memo`` says over the world's queue and ``submissions``, in order."""
    queue = [queued(j) for j in world[3]]
    scheduler = FairShareScheduler(build(world, queue), memo=memo)
    told = [said(scheduler.full_pass())]
    for job in submissions:
        told.append(said(scheduler.submit(job)))
    # a full pass over the jobs left waiting, on a fresh snapshot of the world, and each of them evaluated on the
    # state the first scheduler reached
    snapshot = build(world, [])
    waiting = [j for j in queue + submissions if any(j.job_id in t and t[j.job_id][0] == "waiting" for t in told)]
    again = FairShareScheduler(dataclasses.replace(snapshot, queue=waiting), memo=type(memo)())
    told.append(said(again.full_pass()))
    told.append({j.job_id: seen(scheduler.evaluate(j)) for j in waiting})
    return told


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(worlds(), crowded_worlds()), st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 4), st.sampled_from([0, 500, 1000])),
                          max_size=4))
def test_the_memo_and_the_null_memo_decide_every_world_the_same(world, picks):
    teams = [t[0] for t in world[0]]
    submissions = [dataclasses.replace(queued(world[3][pick % len(world[3])], at=100.0 + n), job_id=10_000 + n,
                                       team_id=teams[team % len(teams)], priority=priority)
                   for n, (pick, team, priority) in enumerate(picks)]
    assert run(world, submissions, DecisionMemo()) == run(world, submissions, NullMemo())


def test_the_null_memo_remembers_nothing():
    memo = NullMemo()
    memo.decided["key"] = "value"
    memo.waits["key"] = "value"
    assert memo.decided.get("key") is None and "key" not in memo.waits and not memo.remembers


def test_a_world_where_the_memo_is_used_gives_the_same_answers_without_it():
    # 30 jobs of one shape for one pool that holds 2: the memo answers 28 of them from the first wait
    world = ([(1, 0, {1: (64, 0, None)}, None, "BestEffortFIFO", None)],
             [(1, 1, 1, 8, "4.20", "on-demand", 1)], [],
             [(j, 1, 1, 1, 4, 500, False, 3600, 0, 0, (), ()) for j in range(1, 31)])
    with_memo, without = run(world, [], DecisionMemo()), run(world, [], NullMemo())
    assert with_memo == without
    first = with_memo[0]
    assert sum(1 for d in first.values() if d[0] == "admitted") == 2
    assert sum(1 for d in first.values() if d[0] == "waiting" and d[1] == "capacity") == 28
