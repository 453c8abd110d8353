"""Node-exact admission in the pure core: every node of a job on a distinct node with room for its GPUs, CPU and
memory, packing that keeps whole nodes free, topology preference, cordoned nodes, reclaim within a cohort and
accelerator alternatives; expected placements worked out by hand, and a property checked by an independent
bookkeeper of every node's resources.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import FairShareScheduler, NodeRoom, PoolOffer, Snapshot, TeamQuota, TeamState
from tests.support.scheduling import H100, admitted, decide, job, pool, running, snapshot, team

L4 = 2


def test_a_fragmented_pool_with_eight_free_gpus_does_not_take_a_whole_node_job():
    # 4 nodes x 8 GPUs, 6 used on each (8 free in all) on the cheap cluster; a whole free node on the dear one
    fragmented = pool(1, 32, price="2.00", node_free=[2, 2, 2, 2])
    whole = pool(2, 8, price="9.00")
    want = job(1, 8)
    d, _ = decide([team(1, 16)], [fragmented, whole], [want])
    assert [(a.offer.node_pool_id, a.node_names) for a in d.admissions] == [(2, ("2-0",))]


def test_a_fragmented_pool_alone_makes_the_job_wait_with_the_numbers():
    want = job(1, 8)
    d, _ = decide([team(1, 16)], [pool(1, 32, node_free=[2, 2, 2, 2], cluster="eks")], [want])
    w = d.waiting[want.job_id]
    assert w.reason == "capacity" and w.detail["free_gpus_by_pool"] == {"1": 8}
    assert w.detail["most_free_gpus_on_a_node_by_pool"] == {"1": 2}
    assert "1 node x 8 GPUs" in w.message and "8 GPUs free, at most 2 on one node" in w.message
    assert w.detail["short_of"] == "gpu" and "0 of the 1 nodes needed have 8 GPUs free" in w.message


def test_a_two_by_eight_gang_does_not_fit_on_four_half_free_nodes():
    gang = job(1, 8, nodes=2)
    d, _ = decide([team(1, 32)], [pool(1, 32, node_free=[4, 4, 4, 4])], [gang])
    assert admitted(d) == [] and d.waiting[gang.job_id].reason == "capacity"
    d, _ = decide([team(1, 32)], [pool(1, 32, node_free=[4, 8, 4, 8])], [gang])
    assert [a.node_names for a in d.admissions] == [("1-1", "1-3")]


def test_cpu_bound_nodes_hold_no_job_whose_cpu_is_over_their_free_cpu():
    # two nodes with 8 free GPUs each, 32 cores allocatable; node 0 has 4 cores free, node 1 all 32
    offer = pool(1, 16, cpu=32_000, cpu_free=[4000, 32_000])
    want = job(1, 4, cpu=8000)
    d, _ = decide([team(1, 16)], [offer], [want])
    assert [a.node_names for a in d.admissions] == [("1-1",)]
    # more CPU than any node has: no pool can ever hold it; it waits for the fleet without blocking the team
    huge, small = job(1, 1, cpu=64_000, at=1), job(1, 1, at=2)
    d, _ = decide([team(1, 16, strategy="StrictFIFO")], [offer], [huge, small])
    assert admitted(d) == [small.job_id] and d.waiting[huge.job_id].detail["never_placeable"]


def test_memory_bound_nodes_leave_a_job_waiting_when_no_node_has_the_memory_free():
    offer = pool(1, 16, memory=262_144)  # 256 GiB per node
    want = job(1, 1, memory=300 * 1024)
    d, _ = decide([team(1, 16)], [offer], [want])
    assert admitted(d) == [] and d.waiting[want.job_id].detail["never_placeable"]
    ok = job(1, 1, memory=200 * 1024)
    d, _ = decide([team(1, 16)], [offer], [ok])
    assert admitted(d) == [ok.job_id]


def test_a_cordoned_node_makes_a_job_wait_for_the_fleet_without_blocking_its_team():
    # 2 nodes x 8, node 1 cordoned: a 2 x 8 job needs the cordon lifted; the 1 x 8 behind it runs on node 0
    offer = pool(1, 16, cordoned=(1,))
    gang, single = job(1, 8, nodes=2, at=1), job(1, 8, at=2)
    d, _ = decide([team(1, 16, strategy="StrictFIFO")], [offer], [gang, single])
    assert [a.node_names for a in d.admissions] == [("1-0",)]
    w = d.waiting[gang.job_id]
    assert w.detail["fleet_change"] and "1 large enough node is cordoned" in w.message
    assert "at most 1 schedulable node of one healthy pool can hold a node of it, 2 needed" in w.message, w.message


def test_an_unhealthy_cluster_makes_a_job_wait_for_the_fleet():
    want = job(1, 8)
    d, _ = decide([team(1, 16)], [pool(1, 16, healthy=False, cluster="gke-a")], [want])
    w = d.waiting[want.job_id]
    assert w.detail["fleet_change"] and "cluster gke-a is not healthy" in w.message


def test_best_fit_keeps_a_whole_node_free_for_a_large_job():
    # node 0 has 2 free, node 1 all 8: four 1-GPU jobs... the first two fill node 0, then an 8-GPU job fits node 1
    ones = [job(1, 1, at=i) for i in range(2)]
    big = job(1, 8, at=10)
    d, _ = decide([team(1, 16)], [pool(1, 16, node_free=[2, 8])], ones + [big])
    assert [a.node_names for a in d.admissions] == [("1-0",), ("1-0",), ("1-1",)]
    # spreading (the old tie-break) would have put the first 1-GPU job on node 1 and left no node for the 8
    spread = FairShareScheduler(snapshot([team(1, 16)], [pool(1, 16, node_free=[2, 8])], ones + [big]), "spread")
    assert big.job_id not in admitted(spread.full_pass())


def test_a_multi_node_job_prefers_nodes_of_one_topology_domain():
    # rack a: nodes 0 and 2, rack b: nodes 1 and 3; all free
    offer = pool(1, 32, domains=["a", "b", "a", "b"])
    gang = job(1, 8, nodes=2)
    d, _ = decide([team(1, 32)], [offer], [gang])
    assert [a.node_names for a in d.admissions] == [("1-0", "1-2")]
    # with room in no single rack, it still runs across racks
    offer = pool(1, 32, domains=["a", "b", "a", "b"], node_free=[8, 8, 0, 0])
    d, _ = decide([team(1, 32)], [offer], [gang])
    assert [a.node_names for a in d.admissions] == [("1-0", "1-1")]


def test_reclaim_takes_borrowed_work_even_if_the_lender_ends_below_its_nominal():
    # a 12-GPU pool; teams a, b, c with nominal 4 each; a may borrow 8 and runs two preemptible
    # 6-GPU jobs (2 nodes x 3); b and c each ask for 4
    # (2 nodes x 6 GPUs: one 6-GPU job per node)
    offer = pool(1, 12, gpus_per_node=6, nodes=2)
    runs = [running(1, 1, 6, 1, node_names=("1-0",), admitted=1), running(2, 1, 6, 1, node_names=("1-1",), admitted=2)]
    b, c = job(2, 4, at=10), job(3, 4, at=11)
    teams = [team(1, 4, 8), team(2, 4), team(3, 4)]
    d, _ = decide(teams, [offer], [b, c], runs)
    assert sorted(admitted(d)) == sorted([b.job_id, c.job_id])
    assert sorted(v.job_id for a in d.admissions for v in a.victims) == [1, 2]  # a falls to 0, below its nominal


def test_reclaim_takes_no_work_from_a_team_within_its_nominal():
    offer = pool(1, 8)
    runs = [running(1, 1, 4, 1, node_names=("1-0",)), running(2, 2, 4, 1, node_names=("1-0",))]
    want = job(3, 8)  # team 3's nominal is 8 but teams 1 and 2 each use exactly their nominal 4
    d, _ = decide([team(1, 4, 4), team(2, 4, 4), team(3, 8)], [offer], [want], runs)
    assert admitted(d) == [] and d.preemptions == []


def test_an_accelerator_alternative_is_used_when_the_preferred_one_is_full_and_charged_there():
    h100 = pool(1, 8, node_free=[0])
    l4 = pool(2, 8, price="1.00")
    t = TeamState(1, quotas={H100: TeamQuota(8), L4: TeamQuota(8)})
    want = job(1, 4, alternatives=(L4,))
    s = Snapshot({1: t}, {H100: [h100], L4: [l4]}, [want])
    scheduler = FairShareScheduler(s)
    d = scheduler.full_pass()
    assert [(a.offer.node_pool_id, a.accelerator_id) for a in d.admissions] == [(2, L4)]
    assert scheduler.teams[1].used == {L4: 4}


def test_the_preferred_accelerator_wins_when_both_have_room():
    t = TeamState(1, quotas={H100: TeamQuota(8), L4: TeamQuota(8)})
    want = job(1, 4, alternatives=(L4,))
    d = FairShareScheduler(Snapshot({1: t}, {H100: [pool(1, 8, price="9")], L4: [pool(2, 8, price="1")]},
                                    [want])).full_pass()
    assert [a.accelerator_id for a in d.admissions] == [H100]


# --- a property, checked by an independent bookkeeper --------------------------------------------------------

@st.composite
def fleets(draw):
    nodes = draw(st.lists(st.tuples(st.sampled_from([2, 4, 8]), st.sampled_from([16, 32, 64]),
                                    st.sampled_from([64, 128, 256])), min_size=1, max_size=6))
    jobs = draw(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([1, 1, 2, 3]), st.sampled_from([1, 2, 4, 8]),
                                   st.sampled_from([0, 4, 16, 48]), st.sampled_from([0, 32, 100, 200])),
                         min_size=1, max_size=30))
    quotas = draw(st.lists(st.tuples(st.integers(0, 16), st.integers(0, 16)), min_size=3, max_size=3))
    policy = draw(st.sampled_from(["best-fit", "first-fit", "spread", "fgd"]))
    return nodes, jobs, quotas, policy


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_no_node_is_ever_given_more_gpus_cpu_or_memory_than_it_has_and_no_team_more_than_its_limit(fleet):
    shapes, jobs_spec, quotas, policy = fleet
    rooms = tuple(NodeRoom(f"n{i}", g, g, c * 1000, c * 1000, m * 1024, m * 1024) for i, (g, c, m) in enumerate(shapes))
    offer = PoolOffer(1, 1, "c1", "aws", "r", "on-demand", len(rooms), max(r.gpus for r in rooms),
                      sum(r.gpus for r in rooms), Decimal("1"), True, rooms)
    teams = {t: TeamState(t, quotas={H100: TeamQuota(n, b)}) for t, (n, b) in enumerate(quotas)}
    queue = [job(t, g, nodes=n, cpu=c * 1000, memory=m * 1024, at=float(i))
             for i, (t, n, g, c, m) in enumerate(jobs_spec)]
    d = FairShareScheduler(Snapshot(teams, {H100: [offer]}, queue), policy).full_pass()
    # the checker's own books, from the shapes drawn: what is left on each node
    left = {f"n{i}": [g, c * 1000, m * 1024] for i, (g, c, m) in enumerate(shapes)}
    used = {t: 0 for t in teams}
    for a in d.admissions:
        j = a.job
        assert len(a.node_names) == j.nodes == len(set(a.node_names))  # the whole gang, distinct nodes
        for name in a.node_names:
            left[name][0] -= j.gpus_per_node
            left[name][1] -= j.cpu_milli
            left[name][2] -= j.memory_mib
            assert min(left[name]) >= 0, (name, left[name])
        used[j.team_id] += j.total_gpus
    total_nominal = sum(n for n, _ in quotas)
    for t, (n, b) in enumerate(quotas):
        assert used[t] <= n + min(b, total_nominal - n)  # nominal + borrowing, at most what others lend
    # nothing that waits for capacity would have fit on the nodes as the checker sees them (strict best effort)
    for w in d.waiting.values():
        j = w.job
        if w.reason == "capacity" and not w.detail.get("never_placeable"):
            fitting = [n for n, (g, c, m) in left.items() if g >= j.gpus_per_node and c >= j.cpu_milli
                       and m >= j.memory_mib]
            assert len(fitting) < j.nodes


def test_a_victim_gives_back_to_the_cohort_only_what_it_borrowed():
    # cohort lendable 0 + 4 + 0 = 4 (team 3 lends none of its nominal 5); team 1 borrows 1, team 3 holds 8 (3 above
    # its guaranteed 5). Team 2 asks its nominal 4: preempting team 3's job gives back 3, not 8: 1 + 4 > 4, it waits
    pools = [pool(1, 8, gpus_per_node=1, nodes=8), pool(2, 8)]
    runs = [running(1, 1, 1, 1, preemptible=False), running(2, 3, 8, 2)]
    want = job(2, 4)
    d, _ = decide([team(1, 0, 1), team(2, 4), team(3, 5, 3, lending=0)], pools, [want], runs)
    assert admitted(d) == [] and d.preemptions == [] and d.waiting[want.job_id].reason == "quota"
