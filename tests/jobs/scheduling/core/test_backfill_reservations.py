"""Backfill with reservations (``jobs.scheduling.core.backfill``, ADR 0044), over random fleets and queues.

Properties, each checked against books kept here from the snapshot and the pass's admissions alone:

- a reservation is never delayed: at its start every node it names has room for one pod of its job, counting
  what runs there past the start (live attempts by admitted + max run time, the pass's admissions by now + max
  run time);
- node-exactness: no admission onto a node without room, reservations on distinct nodes, one per pod;
- StrictFIFO order: behind a team's first waiting job, the team admits only what leaves the job its quota at the
  reservation's start when it holds a reservation; without one, nothing when it waits for anything but nodes, and
  when it waits for nodes only on pools that could never hold it (too few nodes, or too few GPUs on each), inside
  the quota that leaves it its own;
- the memo changes nothing: the pass with ``DecisionMemo`` and with ``NullMemo`` decides the same.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import DecisionMemo, FairShareScheduler, NullMemo, RunningJob, Snapshot
from tests.support import scheduling as pure

NOW = 10_000.0


@st.composite
def worlds(draw):
    """Teams, pools whose nodes run live attempts with known max run times, a queue, and backfill's settings."""
    n_teams = draw(st.integers(1, 3))
    teams = [(t, draw(st.integers(2, 40)), draw(st.integers(0, 24)), draw(st.sampled_from(["StrictFIFO",
                                                                                           "BestEffortFIFO"])))
             for t in range(n_teams)]
    pools, live = [], []
    rid = 0
    for pid in (1, 2)[:draw(st.integers(1, 2))]:
        gpn = draw(st.sampled_from([4, 8]))
        n_nodes = draw(st.integers(1, 4))
        node_free = []
        for i in range(n_nodes):
            left = gpn
            for _ in range(draw(st.integers(0, 3))):
                if left == 0:
                    break
                gpus = draw(st.integers(1, left))
                left -= gpus
                rid += 1
                elapsed = draw(st.integers(0, 8000))
                limit = elapsed + draw(st.integers(-500, 9000))  # some past their limit already
                live.append(RunningJob(10_000 + rid, rid, draw(st.integers(0, n_teams - 1)), pure.H100, pid, gpus,
                                       admitted=NOW - elapsed, node_names=(f"{pid}-{i}",), gpus_per_node=gpus,
                                       max_runtime_seconds=max(1, limit)))
            node_free.append(left)
        pools.append((pid, gpn, n_nodes, node_free))
    jobs = [(j + 1, draw(st.integers(0, n_teams - 1)), draw(st.sampled_from([1, 1, 2])),
             draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([500, 500, 1000])),
             draw(st.floats(0, NOW)), draw(st.sampled_from([60, 600, 3600, 7200])))
            for j in range(draw(st.integers(1, 14)))]
    return (teams, pools, live, jobs, draw(st.sampled_from([None, 0.0, 5000.0])),
            draw(st.sampled_from([1, 2, 16])))


def snapshot(world) -> Snapshot:
    teams_spec, pools_spec, live, jobs, after, limit = world
    used: dict[int, int] = {}
    for r in live:
        used[r.team_id] = used.get(r.team_id, 0) + r.gpus
    teams = [pure.team(t, nominal, borrowing, used=used.get(t, 0), strategy=strategy, cohort="c")
             for t, nominal, borrowing, strategy in teams_spec]
    pools = [pure.pool(pid, gpn * n, gpus_per_node=gpn, node_free=free) for pid, gpn, n, free in pools_spec]
    queue = [pure.job(team, gpn, nodes=nodes, priority=prio, at=at, job_id=jid, runtime=runtime)
             for jid, team, nodes, gpn, prio, at, runtime in jobs]
    snap = pure.snapshot(teams, pools, queue, [])
    snap.now, snap.live, snap.reserve_after_s, snap.max_reservations = NOW, list(live), after, limit
    return snap


def decide(world, memo):
    return FairShareScheduler(snapshot(world), memo=memo()).full_pass()


def ends_after(world, decisions, pool_id: int, name: str, at: float) -> int:
    """GPUs on node ``name`` of ``pool_id`` still held at ``at``: live attempts by admitted + max run time (one past
    its limit: now), the pass's admissions by now + max run time."""
    held = sum(r.gpus_per_node for r in world[2] if r.node_pool_id == pool_id and name in r.node_names
               and max(r.admitted + r.max_runtime_seconds, NOW) > at)
    return held + sum(a.job.gpus_per_node for a in decisions.admissions if a.offer.node_pool_id == pool_id
                      and name in a.node_names and NOW + a.job.max_runtime_seconds > at)


def pool_shape(world, pool_id: int) -> tuple[int, int]:
    """``(GPUs per node, nodes)`` of the world's pool ``pool_id``."""
    return next((gpn, n) for pid, gpn, n, _ in world[1] if pid == pool_id)


def capacity(world) -> dict[tuple[int, str], int]:
    return {(pid, f"{pid}-{i}"): gpn for pid, gpn, n, _ in world[1] for i in range(n)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_a_reservation_is_never_delayed_by_a_backfilled_job(world):
    decisions = decide(world, DecisionMemo)
    gpus = capacity(world)
    seen: set[tuple[int, str]] = set()
    for job_id, r in decisions.reservations.items():
        job = decisions.waiting[job_id].job
        assert decisions.waiting[job_id].reservation is r
        assert len(r.node_names) == len(set(r.node_names)) == job.nodes
        assert r.start >= NOW
        for name in r.node_names:
            key = (r.offer.node_pool_id, name)
            assert key not in seen, "two reservations on one node"
            seen.add(key)
            free_at_start = gpus[key] - ends_after(world, decisions, r.offer.node_pool_id, name, r.start)
            assert free_at_start >= job.gpus_per_node, (job_id, name, r.start, free_at_start)
        info = decisions.waiting[job_id].info()["reservation"]
        assert info["nodes"] == list(r.node_names) and info["expected_start"] == r.start


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_admissions_stay_node_exact_with_reservations(world):
    decisions = decide(world, DecisionMemo)
    left = capacity(world)
    for r in world[2]:
        for name in r.node_names:
            left[(r.node_pool_id, name)] -= r.gpus_per_node
    for a in decisions.admissions:
        assert len(set(a.node_names)) == a.job.nodes
        for name in a.node_names:
            left[(a.offer.node_pool_id, name)] -= a.job.gpus_per_node
    assert min(left.values()) >= 0, left


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_strict_fifo_admits_behind_its_head_only_what_cannot_delay_it(world):
    decisions = decide(world, DecisionMemo)
    admitted = {a.job.job_id: a for a in decisions.admissions}
    snap = snapshot(world)
    for tid, nominal, borrowing, strategy in world[0]:
        if strategy != "StrictFIFO":
            continue
        order = sorted((j for j in snap.queue if j.team_id == tid), key=lambda j: j.key)
        head = next((j for j in order if j.job_id not in admitted
                     and not (j.job_id in decisions.waiting
                              and decisions.waiting[j.job_id].detail.get("never_placeable"))
                     and j.job_id not in {r.job.job_id for r in decisions.rejections}), None)
        if head is None:
            continue
        behind = [j for j in order if j.key > head.key and j.job_id in admitted]
        held = decisions.reservations.get(head.job_id)
        if held is None:
            if decisions.waiting[head.job_id].reason != "capacity":
                assert not behind, (head.job_id, [j.job_id for j in behind])
                continue
            # waiting for nodes with no reservation, the head holds from its team the pools that could ever hold it
            # (as many nodes as it asks, each with its GPUs): what runs behind it runs elsewhere, inside the quota
            # that leaves the head its own
            for j in behind:
                gpn, n_nodes = pool_shape(world, admitted[j.job_id].offer.node_pool_id)
                assert n_nodes < head.nodes or gpn < head.gpus_per_node, (head.job_id, j.job_id)
            live = sum(r.gpus for r in world[2] if r.team_id == tid)
            ahead = sum(j.total_gpus for j in order if j.key < head.key and j.job_id in admitted)
            taken = sum(j.total_gpus for j in behind)
            assert live + ahead + taken + head.total_gpus <= nominal + borrowing or not behind
            continue
        live = sum(r.gpus for r in world[2] if r.team_id == tid)
        ahead = sum(j.total_gpus for j in order if j.key < head.key and j.job_id in admitted)
        still = sum(j.total_gpus for j in behind if NOW + j.max_runtime_seconds > held.start)
        if decisions.waiting[head.job_id].reason == "capacity":
            assert live + ahead + still + head.total_gpus <= nominal + borrowing or still == 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_reservations_are_the_same_with_and_without_the_memo(world):
    kept, fresh = decide(world, DecisionMemo), decide(world, NullMemo)
    assert ([(a.job.job_id, a.node_names) for a in kept.admissions]
            == [(a.job.job_id, a.node_names) for a in fresh.admissions])
    assert ({j: (r.node_names, r.start) for j, r in kept.reservations.items()}
            == {j: (r.node_names, r.start) for j, r in fresh.reservations.items()})


def test_a_strict_fifo_head_gets_the_node_that_frees_first_and_short_jobs_run_meanwhile():
    """One pool of two 8-GPU nodes: node 0 holds 4 GPUs until 100 s from now, node 1 one GPU for an hour. The
    StrictFIFO head asks 8 GPUs: node 0 is reserved from then; a 4-GPU job of an hour waits (it would hold node
    1's room past nothing, but node 0 is held and node 1 has 7 free: it runs there), a 4-GPU job of 50 s runs on the
    held node (it ends before the start), and a second 4-GPU job of an hour waits."""
    now = 1000.0
    offer = pure.pool(1, 16, node_free=[4, 7])
    live = [RunningJob(90, 1, 0, pure.H100, 1, 4, admitted=now, node_names=("1-0",), gpus_per_node=4,
                       max_runtime_seconds=100),
            RunningJob(91, 2, 0, pure.H100, 1, 1, admitted=now, node_names=("1-1",), gpus_per_node=1,
                       max_runtime_seconds=3600)]
    head = pure.job(0, 8, at=1, job_id=1)
    long1 = pure.job(0, 4, at=2, job_id=2, runtime=3600)
    long2 = pure.job(0, 4, at=3, job_id=3, runtime=3600)
    short = pure.job(0, 4, at=4, job_id=4, runtime=50)
    snap = pure.snapshot([pure.team(0, 64, used=5, strategy="StrictFIFO")], [offer], [head, long1, long2, short], [])
    snap.now, snap.live = now, live
    decisions = FairShareScheduler(snap).full_pass()
    assert {a.job.job_id: a.node_names for a in decisions.admissions} == {2: ("1-1",), 4: ("1-0",)}
    reservation = decisions.reservations[1]
    assert (reservation.node_names, reservation.start) == (("1-0",), now + 100)
    info = decisions.waiting[1].info()["reservation"]
    assert info["expected_start_in_seconds"] == 100 and "1-0" in info["message"]
    assert decisions.waiting[3].reason == "capacity"


def test_without_a_pass_time_a_strict_fifo_head_blocks_its_team():
    """The same fleet with no ``now``: no reservation, and StrictFIFO keeps everything behind its head."""
    offer = pure.pool(1, 16, node_free=[4, 7])
    snap = pure.snapshot([pure.team(0, 64, used=5, strategy="StrictFIFO")], [offer],
                         [pure.job(0, 8, at=1, job_id=1), pure.job(0, 4, at=2, job_id=2)], [])
    decisions = FairShareScheduler(snap).full_pass()
    assert not decisions.admissions and not decisions.reservations
    assert decisions.waiting[2].reason == "priority"


def test_a_job_behind_a_head_that_holds_pools_from_it_gets_no_reservation_of_its_own():
    """Team 0 queues StrictFIFO: pool 1 (two 4-GPU nodes, full until 1 s from now) is reserved for team 1's 2-node
    job, so team 0's 2-node job 6 waits with no reservation and holds pool 1 from the team; pool 2 (one node) takes
    team 0's four 1-GPU jobs. Job 7 behind job 6 waits behind it, and no reservation holds a node for it: every
    reservation the pass keeps is one a waiting job shows."""
    live = [RunningJob(10_001 + i, i + 1, 0, pure.H100, 1, gpus, admitted=NOW, node_names=(node,), gpus_per_node=gpus,
                       max_runtime_seconds=1)
            for i, (node, gpus) in enumerate([("1-0", 4), ("1-1", 2), ("1-1", 2)])]
    jobs = [(1, 0, 1, 1, 500, 0.0, 60), (2, 1, 2, 1, 500, 0.0, 60), (3, 0, 1, 1, 500, 0.0, 60),
            (4, 0, 1, 1, 500, 0.0, 60), (5, 0, 1, 1, 500, 0.0, 60), (6, 0, 2, 1, 500, 0.0, 60),
            (7, 0, 1, 1, 500, 0.0, 60)]
    world = ([(0, 10, 4, "StrictFIFO"), (1, 2, 0, "StrictFIFO"), (2, 2, 0, "StrictFIFO")],
             [(1, 4, 2, [0, 0]), (2, 4, 1, [4])], live, jobs, 0.0, 2)
    decisions = decide(world, DecisionMemo)
    assert sorted((a.job.job_id, a.node_names) for a in decisions.admissions) == [
        (1, ("2-0",)), (3, ("2-0",)), (4, ("2-0",)), (5, ("2-0",))]
    assert {j: r.node_names for j, r in decisions.reservations.items()} == {2: ("1-0", "1-1")}
    assert decisions.waiting[6].reason == "capacity" and decisions.waiting[6].reservation is None
    assert decisions.waiting[7].reason == "priority" and decisions.waiting[7].detail["behind_job_id"] == 6
    assert decisions.waiting[7].reservation is None
    assert all(decisions.waiting[j].reservation is r for j, r in decisions.reservations.items())
