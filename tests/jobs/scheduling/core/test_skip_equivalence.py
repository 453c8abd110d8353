"""The screen of the decision loop (``FairShareScheduler.skip``, ADR 0048) changes how fast a pass decides, never
what it decides.

Every generated world is scheduled with the screen and on the plain path (``skip=False``): a full pass, then
submissions of any team, priority and shape, then a full pass over the jobs left waiting on a fresh snapshot. Each
step must give the same admissions (nodes, GPU, victims), rejections, waits (reason, message, numbers, both
positions, the jobs that overtook them, reservations) in the same order. The worlds are the property tests' small
ones (cohorts, budgets, per-cluster caps, StrictFIFO, preemption, accelerator alternatives, CPU-only jobs) and
scaled-down snapshots of ``benchmarks/schedule.py`` (one cluster of four pools, 40 teams in two cohorts that
borrow, running work to preempt, budgets, jobs on part of one GPU, decayed usage, StrictFIFO, backfill with
reservations).
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.schedule import backfill_snapshot
from benchmarks.schedule import build as bench_build
from jobs.scheduling.core import FairShareScheduler
from tests.support.scheduling_worlds import build, crowded_worlds, queued, seen, worlds


def said(decisions) -> list:
    """What a pass said, in its order: admissions, rejections, then waits with positions, overtakers and
    reservations."""
    out = [seen(a) + (a.job.job_id, a.gpu_index) for a in decisions.admissions]
    out += [(r.job.job_id, *seen(r)) for r in decisions.rejections]
    out += [(jid, *seen(w), w.team_position, w.overall_position, tuple(j.job_id for j in w.overtaken_by or ()),
             None if w.reservation is None else w.reservation.info()) for jid, w in decisions.waiting.items()]
    return out


def run(snapshot_of, queue, submissions, skip: bool) -> tuple[list, int]:
    """Everything a scheduler (``skip`` or not) says over ``queue`` and ``submissions``, and how many decisions its
    screen gave. ``snapshot_of(queue)``: a fresh snapshot with that queue."""
    scheduler = FairShareScheduler(snapshot_of(queue), skip=skip)
    told = [said(scheduler.full_pass())]
    for job in submissions:
        told.append(said(scheduler.submit(job)))
    waiting_ids = {t[0] for step in told for t in step if len(t) > 5 and t[1] == "waiting"}
    again = FairShareScheduler(snapshot_of([j for j in queue + submissions if j.job_id in waiting_ids]), skip=skip)
    told.append(said(again.full_pass()))
    return told, scheduler.screened + again.screened


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(worlds(), crowded_worlds()),
       st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 4), st.sampled_from([0, 500, 1000])), max_size=4))
def test_the_screen_and_the_plain_path_decide_every_small_world_the_same(world, picks):
    teams = [t[0] for t in world[0]]
    queue = [queued(j) for j in world[3]]
    submissions = [dataclasses.replace(queued(world[3][pick % len(world[3])], at=100.0 + n), job_id=10_000 + n,
                                       team_id=teams[team % len(teams)], priority=priority)
                   for n, (pick, team, priority) in enumerate(picks)]
    snapshot_of = lambda q: build(world, q)  # noqa: E731
    assert run(snapshot_of, queue, submissions, True)[0] == run(snapshot_of, queue, submissions, False)[0]


def bench_world(seed: int, jobs: int, fractional: float, decayed: bool, strict: bool, backfill: bool):
    """``benchmarks/schedule.py``'s snapshot at one cluster (100 nodes) and ``jobs`` queued jobs, as a function of
    the queue (a fresh snapshot each time: a pass books in place), and its two extra submissions."""
    def snapshot_of(queue):
        snapshot = bench_build(seed, fractional, decayed, jobs=jobs, clusters=1)[0]
        if backfill:
            snapshot = backfill_snapshot(snapshot, strict)
        elif strict:
            for team in snapshot.teams.values():
                team.strategy = "StrictFIFO"
        return dataclasses.replace(snapshot, queue=queue)
    snapshot, extra = bench_build(seed, fractional, decayed, jobs=jobs, clusters=1)
    return snapshot_of, snapshot.queue, extra


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.integers(20, 400), st.sampled_from([0.0, 0.0, 0.33, 1.0]), st.booleans(),
       st.booleans(), st.booleans())
def test_the_screen_and_the_plain_path_decide_the_benchmarks_snapshot_the_same(seed, jobs, fractional, decayed,
                                                                               strict, backfill):
    snapshot_of, queue, extra = bench_world(seed, jobs, fractional, decayed, strict, backfill)
    assert run(snapshot_of, queue, extra, True)[0] == run(snapshot_of, queue, extra, False)[0]


def test_the_screen_answers_most_waits_of_a_crowded_queue_with_the_plain_decisions():
    # 2,000 jobs on 100 nodes: most wait for quota, for the cohort or for capacity; the screen answers thousands
    # of them, the plain path none, with the same decisions
    for fractional in (0.0, 0.33):
        snapshot_of, queue, extra = bench_world(4, 2_000, fractional, False, False, False)
        with_screen, screened = run(snapshot_of, queue, extra, True)
        plain, plain_screened = run(snapshot_of, queue, extra, False)
        assert with_screen == plain
        assert plain_screened == 0
        waits = sum(1 for t in with_screen[0] if len(t) > 5 and t[1] == "waiting")
        assert waits > 1_000 and screened > waits // 4
