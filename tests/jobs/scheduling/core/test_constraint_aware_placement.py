"""Constraint-aware placement (ADR 0043): a job that may go to several pools of one price goes where it takes least
from jobs that can run only there; where no job is narrower than another, the choice is best fit's, unchanged.
Expected placements worked out by hand from the pools' sizes."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import FairShareScheduler, NodeBook, PoolOffer, QueuedJob
from jobs.scheduling.core.scarcity import PoolDemand, level
from tests.support.scheduling import H100, job, pool, snapshot, team


def held_to(cluster: str, gpus: int, *, at: float, job_id: int, preemptible: bool = False) -> QueuedJob:
    """A one-node H100 job of ``gpus`` GPUs that only cluster ``cluster`` may run."""
    return QueuedJob(job_id, 1, H100, 1, gpus, 500, at, preemptible, 3600, clusters=(cluster,))


def two_pools() -> list[PoolOffer]:
    """One price, two pools: ``old`` (pool 1: 2 nodes of 2 GPUs) and ``new`` (pool 2: 2 nodes of 8 GPUs)."""
    return [pool(1, 4, gpus_per_node=2, cluster="old"), pool(2, 16, gpus_per_node=8, cluster="new")]


def test_with_only_flexible_jobs_best_fit_fills_the_small_nodes_first():
    # best fit: 2 GPUs on a 2-GPU node leave 0, on an 8-GPU node 6
    flexible = job(1, 2, at=1)
    scheduler = FairShareScheduler(snapshot([team(1, 32)], two_pools(), [flexible]))
    d = scheduler.full_pass()
    assert [(a.offer.node_pool_id, a.node_names) for a in d.admissions] == [(1, ("1-0",))]


def test_a_flexible_job_leaves_the_old_pool_to_the_jobs_held_to_it():
    # Two jobs held to the old pool wait behind a flexible one (submitted first). Best fit alone would put the
    # flexible job on the old pool, leaving one of the held jobs without room; the held jobs' demand sends it to new.
    flexible = job(1, 2, at=1, job_id=1)
    held = [held_to("old", 2, at=2, job_id=2), held_to("old", 2, at=3, job_id=3)]
    d = FairShareScheduler(snapshot([team(1, 32)], two_pools(), [flexible, *held])).full_pass()
    placed = {a.job.job_id: (a.offer.node_pool_id, a.node_names) for a in d.admissions}
    assert placed == {1: (2, ("2-0",)), 2: (1, ("1-0",)), 3: (1, ("1-1",))}


def test_submissions_seen_teach_the_demand_online():
    # nothing waits at first; a job held to the old pool is submitted, then a flexible one: it goes to new
    scheduler = FairShareScheduler(snapshot([team(1, 32)], two_pools(), []))
    d = scheduler.submit(held_to("old", 2, at=1, job_id=1))
    assert [(a.offer.node_pool_id, a.node_names) for a in d.admissions] == [(1, ("1-0",))]
    d = scheduler.submit(job(1, 2, at=2, job_id=2))
    assert [(a.offer.node_pool_id, a.node_names) for a in d.admissions] == [(2, ("2-0",))]


def test_a_cheaper_pool_still_comes_first():
    # the old pool is cheaper: the price order is the user's, scarcity only orders pools of one price
    pools = [pool(1, 4, gpus_per_node=2, cluster="old", price="1.00"), pool(2, 16, gpus_per_node=8, cluster="new")]
    flexible = job(1, 2, at=1, job_id=1)
    d = FairShareScheduler(snapshot([team(1, 32)], pools, [flexible, held_to("old", 2, at=2, job_id=2)])).full_pass()
    assert {a.job.job_id: a.offer.node_pool_id for a in d.admissions} == {1: 1, 2: 1}


def test_a_preemptible_job_takes_spot_before_the_on_demand_pool_others_need():
    # one price for both; best fit alone picks the on-demand pool (2-GPU nodes); the jobs that may not run on spot
    # want it, so the preemptible job takes the spot pool
    on_demand = pool(1, 4, gpus_per_node=2)
    spot = pool(2, 16, gpus_per_node=8, capacity_type="spot")
    preemptible = job(1, 2, at=1, job_id=1, preemptible=True)
    firm = job(1, 2, at=2, job_id=2)
    d = FairShareScheduler(snapshot([team(1, 32)], [on_demand, spot], [preemptible, firm])).full_pass()
    assert {a.job.job_id: a.offer.node_pool_id for a in d.admissions} == {1: 2, 2: 1}


def test_a_cpu_only_job_takes_the_cpu_pool_and_leaves_the_gpu_nodes_to_gpu_jobs():
    # one accelerator, one price: a GPU pool (one 8-GPU node, 16 cores) and a CPU pool (one node, no GPUs, 64 cores).
    # The GPU node would be the tighter fit in CPU (8 of 16 cores left against 56 of 64), but a CPU-only job there
    # would leave the GPU job of 12 cores without room: it goes to the CPU pool, alone or with the GPU job waiting.
    gpu_pool = pool(1, 8, gpus_per_node=8, cpu=16_000)
    cpu_pool = dataclasses.replace(pool(2, 0, gpus_per_node=0, nodes=1, cpu=64_000), gpus_per_node=0)
    cpu_job = job(1, 0, cpu=8000, at=1, job_id=1)
    gpu_job = job(1, 8, cpu=12_000, at=2, job_id=2)
    roomy = team(1, 1_000_000)  # its quota counts the CPU-only job's millicores too (one accelerator here)
    alone = FairShareScheduler(snapshot([roomy], [gpu_pool, cpu_pool], [cpu_job])).full_pass()
    assert [a.offer.node_pool_id for a in alone.admissions] == [2]
    d = FairShareScheduler(snapshot([team(1, 1_000_000)], [gpu_pool, cpu_pool], [cpu_job, gpu_job])).full_pass()
    assert {a.job.job_id: (a.offer.node_pool_id, a.node_names) for a in d.admissions} == {1: (2, ("2-0",)),
                                                                                       2: (1, ("1-0",))}


def test_without_a_narrower_job_the_book_places_as_plain_best_fit():
    # the same requests through a book with the demand of equally flexible jobs and through one without any
    pools = two_pools()
    demand = PoolDemand({H100: pools}, [job(1, 1, at=0), job(1, 4, at=1)])
    with_demand, plain = NodeBook(pools, demand=demand), NodeBook(pools)
    for gpus in (2, 1, 1, 4, 2, 8):
        request = job(1, gpus).placement()
        a, b = with_demand.place(request, pools), plain.place(request, pools)
        assert (a[0].node_pool_id, a[1]) == (b[0].node_pool_id, b[1])
        with_demand.take(a[0].node_pool_id, a[1], request)
        plain.take(b[0].node_pool_id, b[1], request)
    assert not demand.narrowed()


def test_demand_counts_decay_by_half_a_day_later():
    pools = two_pools()
    demand = PoolDemand({H100: pools})
    demand.observe(held_to("old", 2, at=0, job_id=1), 0.0)
    demand.observe(held_to("old", 2, at=86_400, job_id=2), 86_400.0)
    (count,) = demand.counts.values()
    # the first weighs 1 at the reference time, the second 2 (one half-life later): pods 3, GPUs 6
    assert count[:2] == [3.0, 6.0]
    assert demand.exclusive(frozenset({1, 2})) == {1: (3.0, 6.0, 0.0, 0.0)}


def test_levels_rise_with_demand_over_room():
    assert level(0.0, 10) < level(1.0, 10) < level(20.0, 10)
    assert level(5.0, 10) == level(5.2, 10)  # within a level: best fit decides between such pools


def big_and_small() -> list[PoolOffer]:
    """One price, two pools of one 8-GPU node each: ``big`` (pool 1, 128 cores, one GPU in use) and ``small`` (pool 2,
    96 cores)."""
    return [pool(1, 8, gpus_per_node=8, cluster="big", cpu=128_000, node_free=[7]),
            pool(2, 8, gpus_per_node=8, cluster="small", cpu=96_000)]


def test_once_rules_narrow_some_jobs_a_job_too_large_for_other_nodes_counts_as_narrow_too():
    # Seen: one job held to each cluster (rules: the level is on), and three 8-GPU jobs of 120 cores held to nothing,
    # which only the big node can hold. Best fit alone puts a 1-GPU job on the big node (6 GPUs left against 7);
    # counted by the pools able to hold them, the three large jobs make the big pool the more wanted one.
    pools = big_and_small()
    seen = [held_to("big", 1, at=1, job_id=1), held_to("small", 1, at=2, job_id=2),
            *(job(1, 8, cpu=120_000, at=3 + i, job_id=3 + i) for i in range(3))]
    request = job(1, 1, cpu=8000, at=9, job_id=9).placement()
    assert NodeBook(pools).place(request, pools)[0].node_pool_id == 1
    assert NodeBook(pools, demand=PoolDemand({H100: pools}, seen)).place(request, pools)[0].node_pool_id == 2


def test_without_rules_node_sizes_alone_change_nothing():
    # the same jobs, none held by a rule: sizes alone do not turn the level on
    pools = big_and_small()
    seen = [job(1, 1, at=1, job_id=1), *(job(1, 8, cpu=120_000, at=2 + i, job_id=2 + i) for i in range(3))]
    demand = PoolDemand({H100: pools}, seen)
    request = job(1, 1, cpu=8000, at=9, job_id=9).placement()
    assert NodeBook(pools, demand=demand).place(request, pools)[0].node_pool_id == 1
    assert not demand.narrowed()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([2, 4, 8]), st.sampled_from([16_000, 64_000, 128_000]),
                          st.integers(1, 3)), min_size=2, max_size=4),
       st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 8_000, 12_000, 60_000, 120_000])),
                min_size=1, max_size=30))
def test_a_fleet_without_rules_is_placed_as_plain_best_fit_whatever_its_node_sizes(pool_specs, jobs):
    # pools of one price and different node sizes; jobs of any shape, none with a rule: every choice is best fit's
    pools = [pool(i + 1, gpn * n, gpus_per_node=gpn, cpu=cpu) for i, (gpn, cpu, n) in enumerate(pool_specs)]
    queue = [job(1, g, cpu=c, at=k, job_id=k + 1) for k, (g, c) in enumerate(jobs)]
    with_demand, plain = NodeBook(pools, demand=PoolDemand({H100: pools}, queue)), NodeBook(pools)
    for j in queue:
        request = j.placement()
        a, b = with_demand.place(request, pools), plain.place(request, pools)
        assert (a is None) == (b is None)
        if a is None:
            continue
        assert (a[0].node_pool_id, a[1]) == (b[0].node_pool_id, b[1])
        with_demand.take(a[0].node_pool_id, a[1], request)
        plain.take(b[0].node_pool_id, b[1], request)


# --- leftovers the narrower jobs cannot use ------------------------------------------------------------------------

def old_and_new(old_free: list[int], old_cpu_free: list[int]) -> list[PoolOffer]:
    """One price, two pools: ``old`` (pool 1: nodes of 2 GPUs and 16 cores, each with the free GPUs and CPU given) and
    ``new`` (pool 2: one empty node of 8 GPUs and 96 cores)."""
    return [pool(1, 2 * len(old_free), gpus_per_node=2, cluster="old", node_free=old_free, cpu=16_000,
                 cpu_free=old_cpu_free),
            pool(2, 8, gpus_per_node=8, cluster="new", cpu=96_000)]


def narrow_jobs_seen(scheduler: FairShareScheduler, cpu: int, count: int = 20) -> None:
    """``count`` one-GPU jobs of ``cpu`` millicores held to the old pool, seen before (submitted, then gone)."""
    for i in range(count):
        narrow = dataclasses.replace(held_to("old", 1, at=-100.0 - i, job_id=-1 - i), cpu_milli=cpu)
        scheduler.demand.observe(narrow, narrow.submitted)


def test_a_flexible_job_takes_a_leftover_of_the_old_pool_that_no_job_held_there_could_use():
    # Jobs held to old ask 1 GPU and 11 cores. Node 1-0 has 1 GPU and 4 cores free: none of them fits there, now or
    # while its work runs. A flexible job of 1 GPU and 3 cores fits it exactly (0 GPUs left, against 7 on the new
    # node), and takes nothing the held jobs could use: it goes there. Node 1-1 (both GPUs, 16 cores free) holds one
    # held job and stays untouched.
    scheduler = FairShareScheduler(snapshot([team(1, 32)], old_and_new([1, 2], [4000, 16_000]), []))
    narrow_jobs_seen(scheduler, 11_000)
    d = scheduler.submit(job(1, 1, cpu=3000, at=1, job_id=1))
    assert [(a.offer.node_pool_id, a.node_names) for a in d.admissions] == [(1, ("1-0",))]


def test_a_leftover_that_a_held_job_could_use_is_still_left_to_it():
    # the same, with 12 cores free on node 1-0: one held job of 11 cores fits there, so the flexible job goes to new
    scheduler = FairShareScheduler(snapshot([team(1, 32)], old_and_new([1, 2], [12_000, 16_000]), []))
    narrow_jobs_seen(scheduler, 11_000)
    d = scheduler.submit(job(1, 1, cpu=3000, at=1, job_id=1))
    assert [(a.offer.node_pool_id, a.node_names) for a in d.admissions] == [(2, ("2-0",))]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 160)), min_size=1, max_size=4),
       st.integers(10, 160), st.integers(5, 80))
def test_a_flexible_job_takes_a_leftover_of_the_old_pool_only_where_no_held_job_could_use_it(old_nodes, narrow_cpu,
                                                                                              flexible_cpu):
    # Jobs held to old are seen asking 1 GPU and ``narrow_cpu`` x 100 millicores; the new pool always has room for
    # the flexible job (1 GPU, ``flexible_cpu`` x 100 millicores). Wherever it lands in old, that node had room for
    # no held job before it came (fewer cores free than they ask, read off the nodes here). And when best fit's node
    # in old (fewest free GPUs, then least free CPU, then the first) is such a leftover, it lands there: 0 or 1 GPU
    # left against 7 on the new node.
    free = [g for g, _ in old_nodes]
    cpu_free = [min(c * 100, 16_000) for _, c in old_nodes]
    narrow, flexible = narrow_cpu * 100, flexible_cpu * 100
    scheduler = FairShareScheduler(snapshot([team(1, 32)], old_and_new(free, cpu_free), []))
    narrow_jobs_seen(scheduler, narrow)
    d = scheduler.submit(job(1, 1, cpu=flexible, at=1, job_id=1))
    assert len(d.admissions) == 1
    a = d.admissions[0]
    if a.offer.node_pool_id == 1:
        (name,) = a.node_names
        i = int(name.split("-")[1])
        assert cpu_free[i] < narrow, (name, free[i], cpu_free[i])
    fitting = [(free[i], cpu_free[i], i) for i in range(len(free)) if free[i] >= 1 and cpu_free[i] >= flexible]
    if fitting and min(fitting)[1] < narrow:
        assert (a.offer.node_pool_id, a.node_names) == (1, (f"1-{min(fitting)[2]}",))
