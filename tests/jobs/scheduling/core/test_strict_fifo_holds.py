"""A StrictFIFO team's waiting job holds, from the team's later jobs, the node pools it could ever run on; a job
behind it goes on elsewhere (Slurm's main scheduler: a job that cannot start takes its partition's nodes out of
what lower-priority jobs may use). A wait for quota, the cohort or a budget still stops the team.

The property checks every full pass over random worlds (StrictFIFO teams, placement rules, alternatives, spot,
CPU and memory per node), with the pass's memo and with the one that remembers nothing: no admission of a
StrictFIFO team lands on a pool that could ever hold a job of that team ahead of it that waits for nodes, and
nothing of the team ahead of which a job waits for anything else is admitted. The pools a job could ever run on
are computed here from the world's plain tuples, not by the core.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from jobs.scheduling.core import DecisionMemo, FairShareScheduler, NullMemo, QueuedJob
from tests.support import scheduling as pure
from tests.support.scheduling_worlds import CPU, NODE_CPU, NODE_MEMORY, build, queued, worlds


def could_ever_hold(world, job: QueuedJob) -> set[int]:
    """The ids of the world's pools whose nodes, all free, could hold ``job``: an accelerator it accepts, its
    clusters rule, the spot rule, nodes large enough and enough of them."""
    _, pools_spec, _, _ = world
    out = set()
    for pid, acc, nodes, gpn, _price, ctype, _domains in pools_spec:
        if acc not in job.accelerator_ids or (job.clusters and f"c{pid}" not in job.clusters):
            continue
        if ctype == "spot" and not job.preemptible:
            continue
        if (acc != CPU) != (job.gpus_per_node > 0):
            continue  # a GPU job needs GPU nodes; a CPU-only job's pools are the CPU flavor's
        if gpn < job.gpus_per_node or NODE_CPU < job.cpu_milli or NODE_MEMORY < job.memory_mib or nodes < job.nodes:
            continue
        out.add(pid)
    return out


def waits_for_nodes(w) -> bool:
    """A wait for nodes: capacity, or behind a job ahead of it in its team that waits for capacity."""
    return w.reason == "capacity" or (w.reason == "priority" and w.detail.get("behind_reason") == "capacity")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_a_strict_fifo_team_admits_nothing_where_a_job_ahead_of_it_waits_for_nodes(world):
    teams_spec = world[0]
    strict = {t for t, _, _, _, strategy, _ in teams_spec if strategy == "StrictFIFO"}
    for memo in (DecisionMemo, NullMemo):
        queue = [queued(j) for j in world[3]]
        decisions = FairShareScheduler(build(world, queue), memo=memo()).full_pass()
        for a in decisions.admissions:
            job = a.job
            if job.team_id not in strict:
                continue
            ahead = [w for w in decisions.waiting.values()
                     if w.job.team_id == job.team_id and w.job.key < job.key and not w.detail.get("never_placeable")]
            for w in ahead:
                assert waits_for_nodes(w), (job.job_id, w.job.job_id, w.reason)
                assert a.offer.node_pool_id not in could_ever_hold(world, w.job), (job.job_id, w.job.job_id)


def fleet():
    """Pool 1: two 8-GPU nodes, one with 1 GPU free (the tightest fit for a 1-GPU job); pool 2: two 2-GPU nodes, all
    free (cluster c2)."""
    return [pure.pool(1, 16, node_free=[1, 0], cluster="c1"), pure.pool(2, 4, gpus_per_node=2, cluster="c2")]


def held_to(job: QueuedJob, cluster: str) -> QueuedJob:
    """``job`` held to ``cluster`` by its placement rule."""
    from dataclasses import replace
    return replace(job, clusters=(cluster,))


def test_behind_a_head_waiting_for_an_empty_8_gpu_node_a_small_job_runs_on_the_pool_the_head_cannot_use():
    head = pure.job(1, 8, at=1.0)
    small = pure.job(1, 1, at=2.0)
    only_big = held_to(pure.job(1, 1, at=3.0), "c1")  # fits node 1-0 now, which could hold the head once empty
    decisions, _ = pure.decide([pure.team(1, 32, strategy="StrictFIFO")], fleet(), [head, small, only_big])
    # best fit alone would put the small job on node 1-0 (no GPU left there); the head holds pool 1
    assert pure.admitted(decisions) == [small.job_id]
    assert decisions.admissions[0].offer.node_pool_id == 2
    assert decisions.waiting[head.job_id].reason == "capacity"
    behind = decisions.waiting[only_big.job_id]
    assert (behind.reason, behind.detail["behind_job_id"]) == ("priority", head.job_id)
    # under BestEffortFIFO the small job takes node 1-0's last GPU, best fit's choice
    decisions, _ = pure.decide([pure.team(1, 32)], fleet(), [pure.job(1, 8, at=1.0), pure.job(1, 1, at=2.0)])
    assert [(a.offer.node_pool_id, a.node_names) for a in decisions.admissions] == [(1, ("1-0",))]


def test_behind_a_head_waiting_for_quota_nothing_of_its_team_runs():
    head = pure.job(1, 8, at=1.0)
    small = pure.job(1, 1, at=2.0)
    # 6 of its 8 GPUs in use elsewhere: the head waits for its quota
    decisions, _ = pure.decide([pure.team(1, 8, used=6, strategy="StrictFIFO")], fleet(), [head, small])
    assert pure.admitted(decisions) == []
    assert decisions.waiting[head.job_id].reason == "quota"
    assert decisions.waiting[small.job_id].detail["behind_job_id"] == head.job_id


def test_a_later_job_that_would_leave_the_held_head_short_of_quota_waits_behind_it():
    # quota 10: the head (8) would fit the quota with 2 more GPUs in use, not with 3
    head = pure.job(1, 8, at=1.0)
    two, one = pure.job(1, 2, at=2.0), pure.job(1, 1, at=3.0)  # each fits pool 2
    decisions, _ = pure.decide([pure.team(1, 10, strategy="StrictFIFO")], fleet(), [head, two, one])
    assert pure.admitted(decisions) == [two.job_id]
    assert decisions.waiting[one.job_id].detail["behind_job_id"] == head.job_id


def test_incremental_submissions_behind_a_held_head_follow_the_same_rule():
    head = pure.job(1, 8, at=1.0)
    scheduler = FairShareScheduler(pure.snapshot([pure.team(1, 32, strategy="StrictFIFO")], fleet(), [head]))
    assert scheduler.full_pass().waiting[head.job_id].reason == "capacity"
    small = pure.job(1, 1, at=2.0)
    assert [a.offer.node_pool_id for a in scheduler.submit(small).admissions] == [2]
    only_big = held_to(pure.job(1, 1, at=3.0), "c1")
    out = scheduler.submit(only_big)
    assert out.admissions == [] and out.waiting[only_big.job_id].detail["behind_job_id"] == head.job_id
