"""Why a job waits, named by the resource that is short (GPU, CPU, memory, whole nodes, cordon, health, price) with
the numbers, and why a later job was admitted ahead of it; expected sentences and counts worked out by hand from
the nodes, and a property checked by counting every node's free resources independently of the node book.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import (
    FairShareScheduler,
    NodeRoom,
    PoolOffer,
    QueuedJob,
    Snapshot,
    TeamState,
    overtaken_note,
)
from tests.support.scheduling import H100, admitted, decide, job, pool, team

GIB = 1024  # MiB
VCPU = 1000  # millicores


def nodes_pool(pool_id: int, rooms: list[tuple[int, int, int]], *, gpus: int = 8, cpu: int = 64 * VCPU,
               memory: int = 512 * GIB, cordoned: tuple[int, ...] = (), unhealthy: tuple[int, ...] = (),
               healthy_cluster: bool = True) -> PoolOffer:
    """A pool of nodes of ``gpus`` GPUs, ``cpu`` millicores and ``memory`` MiB, with ``rooms`` giving each node's
    free (GPUs, millicores, MiB)."""
    nodes = tuple(NodeRoom(f"{pool_id}-{i}", gpus, g, cpu, c, memory, m, "", i not in cordoned, i not in unhealthy)
                  for i, (g, c, m) in enumerate(rooms))
    return PoolOffer(pool_id, pool_id, f"c{pool_id}", "aws", "us-east-1", "on-demand", len(nodes), gpus,
                     sum(n.free_gpus for n in nodes if n.takes_work), Decimal("4.00"), healthy_cluster, nodes,
                     name="gpu")


def waiting_for(pools, want: QueuedJob, teams=None):
    d, _ = decide(teams or [team(1, 64)], pools, [want])
    assert admitted(d) == []
    return d.waiting[want.job_id]


def test_nodes_with_the_gpus_but_too_little_cpu_are_named_with_the_cpu_numbers():
    # 3 nodes with all 8 GPUs free but 16 of 64 vCPU free each; the job needs 2 nodes x (8 GPUs, 32 vCPU, 128 GiB)
    p = nodes_pool(1, [(8, 16 * VCPU, 512 * GIB)] * 3)
    w = waiting_for([p], job(1, 8, nodes=2, cpu=32 * VCPU, memory=128 * GIB))
    assert w.reason == "capacity" and w.detail["short_of"] == "cpu"
    assert "Needs 2 nodes with 8 GPUs, 32 vCPU and 128 GiB free" in w.message
    assert "c1/gpu: 24 GPUs free, at most 8 on one node; 3 nodes have the GPUs but only 16 vCPU free at most" \
        in w.message
    assert w.detail["pools"] == [{"pool": "c1/gpu", "short_of": "cpu", "free_gpus": 24, "nodes_with_gpus": 3,
                                  "nodes_with_cpu": 0, "nodes_with_room": 0, "most_free_vcpu_when_short": 16,
                                  "most_free_gib_when_short": 0.0}]


def test_one_node_with_enough_cpu_is_counted_and_the_others_best_is_given():
    p = nodes_pool(1, [(8, 40 * VCPU, 512 * GIB), (8, 8 * VCPU, 512 * GIB), (8, 12 * VCPU, 512 * GIB)])
    w = waiting_for([p], job(1, 8, nodes=2, cpu=32 * VCPU))
    assert w.detail["short_of"] == "cpu"
    assert "3 nodes have the GPUs but only 1 of them has 32 vCPU free (the others at most 12 vCPU)" in w.message


def test_too_little_memory_is_named_in_gib():
    p = nodes_pool(1, [(8, 64 * VCPU, 100 * GIB), (8, 64 * VCPU, 96 * GIB)])
    w = waiting_for([p], job(1, 8, nodes=2, cpu=32 * VCPU, memory=128 * GIB))
    assert w.detail["short_of"] == "memory"
    assert "2 nodes have the GPUs and CPU but only 100 GiB memory free at most" in w.message


def test_too_few_free_gpus_are_named_as_gpus():
    p = nodes_pool(1, [(8, 64 * VCPU, 512 * GIB), (4, 64 * VCPU, 512 * GIB), (2, 64 * VCPU, 512 * GIB)])
    w = waiting_for([p], job(1, 8, nodes=2))
    assert w.detail["short_of"] == "gpu"
    assert "14 GPUs free, at most 8 on one node; 1 of the 2 nodes needed has 8 GPUs free" in w.message


def test_one_gpu_and_one_node_read_in_the_singular():
    # 1 node with 1 GPU free of 8 but only 2 of 64 vCPU free: a 1-GPU, 4-vCPU job waits for CPU
    p = nodes_pool(1, [(1, 2 * VCPU, 512 * GIB)], cpu=64 * VCPU)
    w = waiting_for([p], job(1, 1, nodes=1, cpu=4 * VCPU))
    assert w.detail["short_of"] == "cpu"
    assert "Needs 1 node with 1 GPU and 4 vCPU free (1 node x 1 GPU (4 vCPU per node))" in w.message
    assert "c1/gpu: 1 GPU free, at most 1 on one node;" in w.message
    assert "1 GPUs" not in w.message and " CPU per node" not in w.message


def test_one_node_of_several_with_the_gpus_reads_has():
    p = nodes_pool(1, [(2, 64 * VCPU, 512 * GIB), (0, 64 * VCPU, 512 * GIB)])
    w = waiting_for([p], job(1, 1, nodes=2))
    assert "1 of the 2 nodes needed has 1 GPU free" in w.message


def test_a_team_within_its_nominal_is_not_told_the_cohort_is_borrowed():
    # team 1 (nominal 4, borrowing up to 4) uses its 4; team 2 (nominal 2) uses 1: neither borrows anything, yet
    # without lending limits both nominals form the shared pool (6), 5 of it in use: 2 more for team 1 do not fit
    teams = [team(1, 4, 4, cohort=0, used=4), team(2, 2, cohort=0, used=1)]
    w = waiting_for([pool(1, 32)], job(1, 2), teams=teams)
    assert w.reason == "quota"
    assert "the cohort's shared pool holds 6 GPUs and 5 of them are in use; 2 more do not fit" in w.message
    assert "borrowed" not in w.message


def test_a_cpu_only_job_is_told_in_vcpu_and_gib_alone():
    cpu_acc = 7
    nodes = tuple(NodeRoom(f"9-{i}", 0, 0, 16 * VCPU, c, 64 * GIB, 64 * GIB) for i, c in enumerate((2 * VCPU, 3 * VCPU)))
    offer = PoolOffer(9, 9, "cpu", "aws", "us-east-1", "on-demand", 2, 0, 0, Decimal(0), True, nodes, name="cpu",
                      usd_per_vcpu_hour=Decimal("0.03"), usd_per_gib_hour=Decimal("0.004"))
    want = QueuedJob(1, 1, cpu_acc, 1, 0, cpu_milli=4 * VCPU, memory_mib=8 * GIB)
    t = TeamState(1, None, 1.0, {}, {})
    d = FairShareScheduler(Snapshot({1: t}, {cpu_acc: [offer]}, [want])).full_pass()
    w = d.waiting[1]
    assert w.detail["short_of"] == "cpu"
    assert "Needs 1 node with 4 vCPU and 8 GiB free" in w.message
    assert "2 schedulable nodes but only 3 vCPU free at most" in w.message
    assert "GPU" not in w.message


def test_cordoned_nodes_are_named_as_the_cordon():
    p = pool(1, 16, cordoned=(1,))
    w = waiting_for([p], job(1, 8, nodes=2))
    assert w.detail["never_placeable"] and w.detail["short_of"] == "cordon"


def test_an_unhealthy_cluster_is_named_as_health():
    p = nodes_pool(1, [(8, 64 * VCPU, 512 * GIB)] * 2, healthy_cluster=False)
    w = waiting_for([p], job(1, 8, nodes=2))
    assert w.detail["short_of"] == "health" and "cluster c1 is not healthy" in w.message


def test_a_job_larger_than_every_node_is_short_of_nodes():
    p = pool(1, 16)
    w = waiting_for([p], job(1, 8, nodes=3))
    assert w.detail["short_of"] == "nodes" and "at most 2 schedulable nodes" in w.message


def test_a_pool_without_a_price_is_named_as_the_price():
    p = pool(1, 16)
    want = job(1, 8)
    d = FairShareScheduler(Snapshot({1: team(1, 64)}, {H100: []}, [want], unpriced={H100: [p]})).full_pass()
    assert d.waiting[want.job_id].detail["short_of"] == "price"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 64), st.integers(0, 256)), min_size=1, max_size=6),
       st.integers(1, 4), st.integers(1, 8), st.integers(0, 48), st.integers(0, 200))
def test_the_short_resource_is_the_first_one_too_few_nodes_have(rooms, nodes, gpus, vcpu, gib):
    p = nodes_pool(1, [(g, c * VCPU, m * GIB) for g, c, m in rooms])
    want = job(1, gpus, nodes=nodes, cpu=vcpu * VCPU, memory=gib * GIB)
    d, _ = decide([team(1, 64)], [p], [want])
    if admitted(d):
        return
    w = d.waiting[want.job_id]
    if w.detail.get("never_placeable"):
        return
    with_g = [r for r in rooms if r[0] >= gpus]
    with_c = [r for r in with_g if r[1] >= vcpu]
    with_m = [r for r in with_c if r[2] >= gib]
    expected = ("gpu" if len(with_g) < nodes else "cpu" if len(with_c) < nodes else
                "memory" if len(with_m) < nodes else "nodes")
    assert w.detail["short_of"] == expected
    assert (w.detail["pools"][0]["nodes_with_gpus"], w.detail["pools"][0]["nodes_with_cpu"],
            w.detail["pools"][0]["nodes_with_room"]) == (len(with_g), len(with_c), len(with_m))


# --- admitted ahead ----------------------------------------------------------------------------------------

def test_a_one_gpu_job_admitted_past_a_two_node_head_is_named_on_the_head():
    # 2 nodes x 8 GPUs, 4 free on each: the head needs 2 whole nodes, the next job 1 GPU
    p = pool(1, 16, node_free=[4, 4])
    head, small = job(1, 8, nodes=2, at=1.0), job(1, 1, at=2.0)
    d, _ = decide([team(1, 64)], [p], [head, small])
    assert admitted(d) == [small.job_id]
    w = d.waiting[head.job_id]
    assert w.overtaken_by == [small] and w.team_position == 1
    rows, sentence = overtaken_note(head, w.reason, w.overtaken_by)
    assert rows == [{"job_id": small.job_id, "team_id": 1, "gpus": 1, "vcpu": 0}]
    assert sentence == (f"Job {small.job_id} (1 GPU) was admitted ahead because it fits now; this job needs "
                        f"2 nodes with 8 GPUs free.")


def test_another_teams_later_job_is_named_too_but_an_earlier_one_is_not():
    p = pool(1, 16, node_free=[4, 4])
    early = job(2, 1, at=0.5)
    head = job(1, 8, nodes=2, at=1.0)
    later = job(2, 1, at=2.0)
    d, _ = decide([team(1, 64), team(2, 64)], [p], [early, head, later])
    assert set(admitted(d)) == {early.job_id, later.job_id}
    assert d.waiting[head.job_id].overtaken_by == [later]


def test_a_strict_fifo_team_is_not_overtaken_by_its_own_jobs():
    p = pool(1, 16, node_free=[4, 4])
    head, small = job(1, 8, nodes=2, at=1.0), job(1, 1, at=2.0)
    d, _ = decide([team(1, 64, strategy="StrictFIFO")], [p], [head, small])
    assert admitted(d) == [] and d.waiting[head.job_id].overtaken_by is None


def test_two_jobs_ahead_are_both_named():
    head = job(1, 8, nodes=2, at=1.0)
    a, b = job(1, 1, at=2.0), job(1, 2, at=3.0)
    _, sentence = overtaken_note(head, "capacity", [a, b])
    assert sentence == (f"Jobs {a.job_id} (1 GPU) and {b.job_id} (2 GPUs) were admitted ahead because they fit now; "
                        f"this job needs 2 nodes with 8 GPUs free.")


def test_a_head_waiting_for_its_teams_quota_is_not_passed_by_another_teams_job():
    p = pool(1, 16)
    head = job(1, 2, at=1.0)  # team 1 uses all its 4 GPUs: waits for quota
    other = job(2, 1, at=2.0)
    d, _ = decide([team(1, 4, used=4), team(2, 8)], [p], [head, other])
    assert admitted(d) == [other.job_id] and d.waiting[head.job_id].reason == "quota"
    assert d.waiting[head.job_id].overtaken_by is None
