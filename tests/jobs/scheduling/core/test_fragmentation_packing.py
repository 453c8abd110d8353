"""The ``fgd`` packing policy (fragmentation gradient descent, Weng et al., USENIX ATC 2023): a node's fragmentation
is its free GPUs times the share of the expected workload that no longer fits on it; a job goes to the nodes whose
fragmentation grows least. Every expected number below is worked out by hand in the comments.
"""

from __future__ import annotations

import pytest

from jobs.scheduling.core import FairShareScheduler, NodeBook, PlacementRequest, Snapshot, fragment_gpus
from tests.support.scheduling import H100, pool, team
from tests.support.scheduling import job as queued_job


def test_a_nodes_fragmentation_is_its_free_gpus_times_the_share_of_the_workload_that_no_longer_fits():
    # workload: 3 parts of 1 GPU / 2 cores / 8 GiB, 1 part of 4 GPUs / 16 cores / 64 GiB
    workload = [(1, 2000, 8192, 3.0), (4, 16_000, 65_536, 1.0)]
    # 8 GPUs, 64 cores, 256 GiB free: both kinds fit, nothing is stranded
    assert fragment_gpus(8, 64_000, 262_144, workload) == 0.0
    # 2 GPUs free: the 4-GPU kind (1 in 4) does not fit, so 2 x 1/4 of a GPU is stranded
    assert fragment_gpus(2, 64_000, 262_144, workload) == pytest.approx(0.5)
    # 8 GPUs but 1 core free: neither kind fits, all 8 GPUs are stranded
    assert fragment_gpus(8, 1000, 262_144, workload) == pytest.approx(8.0)
    # 8 GPUs, 64 cores, 32 GiB free: the 4-GPU kind lacks memory: 8 x 1/4
    assert fragment_gpus(8, 64_000, 32_768, workload) == pytest.approx(2.0)
    # no free GPU strands nothing; nor does an empty workload, nor kinds that ask no GPU
    assert fragment_gpus(0, 0, 0, workload) == 0.0
    assert fragment_gpus(4, 0, 0, []) == 0.0
    assert fragment_gpus(4, 0, 0, [(0, 64_000, 0, 5.0)]) == 0.0


def fgd_pass(offer, queue, workload=()):
    """One full pass under ``fgd`` for one 32-GPU team; returns {job id: node names}."""
    snapshot = Snapshot({1: team(1, 32)}, {H100: [offer]}, queue, policy="fgd", workload=tuple(workload))
    return {a.job.job_id: a.node_names for a in FairShareScheduler(snapshot).full_pass().admissions}


def test_fgd_leaves_gpus_next_to_enough_cpu_where_best_fit_strands_one():
    # node 0: 2 GPUs and 4 cores free; node 1: 3 GPUs and 64 cores free. Workload: 1 GPU with 4 cores.
    # best-fit takes node 0 (fewer GPUs left) and strands its last GPU without cores: growth +1 GPU there.
    # fgd: node 0 goes from 0 stranded to 1 (its last GPU, 0 cores): +1; node 1 keeps 2 GPUs, 60 cores: +0.
    offer = pool(1, 16, node_free=[2, 3], cpu=64_000, cpu_free=[4000, 64_000])
    want = queued_job(1, 1, cpu=4000)
    assert fgd_pass(offer, [want], [(1, 4000, 0, 1.0)]) == {want.job_id: ("1-1",)}
    best = FairShareScheduler(Snapshot({1: team(1, 32)}, {H100: [offer]}, [want], policy="best-fit")).full_pass()
    assert [a.node_names for a in best.admissions] == [("1-0",)]


def test_fgd_keeps_a_whole_node_free_for_the_large_jobs_of_the_workload():
    # workload: 3 parts 1 GPU, 1 part 8 GPUs. Node 0 has 8 free, node 1 has 2 free.
    # node 0: 0 stranded before, 7 x 1/4 = 1.75 after (the 8-GPU kind no longer fits): +1.75
    # node 1: 2 x 1/4 = 0.5 before, 1 x 1/4 = 0.25 after: -0.25, the least growth
    offer = pool(1, 16, node_free=[8, 2])
    want = queued_job(1, 1)
    assert fgd_pass(offer, [want], [(1, 0, 0, 3.0), (8, 0, 0, 1.0)]) == {want.job_id: ("1-1",)}


def test_without_a_workload_fgd_packs_for_the_waiting_jobs_shapes():
    # waiting: a (1 GPU, 4 cores) then b (2 GPUs, 8 cores): the workload is half each.
    # a: node 0 (2 GPUs, 8 cores) would keep 1 GPU / 4 cores, where b no longer fits: 1 x 1/2 = +0.5;
    #    node 1 (4 GPUs, 64 cores) keeps 3 / 60, where both fit: +0. a goes to node 1.
    # b: node 0 ends with nothing free (0 -> 0: +0); node 1 would keep 1 GPU where b does not fit (+0.5). node 0.
    # best-fit would put a on node 0 and leave 1 GPU there and 2 on node 1 instead of 3 on one node.
    offer = pool(1, 16, node_free=[2, 4], cpu=64_000, cpu_free=[8000, 64_000])
    a, b = queued_job(1, 1, cpu=4000, at=1), queued_job(1, 2, cpu=8000, at=2)
    assert fgd_pass(offer, [a, b]) == {a.job_id: ("1-1",), b.job_id: ("1-0",)}


def test_fgd_puts_a_gang_on_the_nodes_whose_fragmentation_grows_least():
    # workload: 1 part 2 GPUs, 1 part 8 GPUs; nodes free 8, 4, 2, 4. A 2 x 2 job:
    # node with 8: 0 -> 6 x 1/2 = 3 (+3); with 4: 4 x 1/2 = 2 -> 2 x 1/2 = 1 (-1); with 2: 1 -> 0 (-1).
    # Least growth: the 4s and the 2 tie at -1; ties go to the fewest free GPUs (best-fit), then node order:
    # the 2 (node 2), then the first 4 (node 1).
    offer = pool(1, 32, node_free=[8, 4, 2, 4])
    gang = queued_job(1, 2, nodes=2)
    assert fgd_pass(offer, [gang], [(2, 0, 0, 1.0), (8, 0, 0, 1.0)]) == {gang.job_id: ("1-2", "1-1")}


def test_between_pools_of_one_price_fgd_takes_the_one_whose_fragmentation_grows_least():
    # workload: 1 GPU and 8 GPUs, half each. Pool 1: one node, 8 free; pool 2: one node, 5 free.
    # pool 1: 0 -> 7 x 1/2 = 3.5 (+3.5); pool 2: 5 x 1/2 = 2.5 -> 4 x 1/2 = 2 (-0.5): pool 2.
    book = NodeBook([pool(1, 8), pool(2, 8, node_free=[5])], "fgd", ((1, 0, 0, 1.0), (8, 0, 0, 1.0)))
    request = PlacementRequest(1, 1)
    offer, nodes = book.place(request, [pool(1, 8), pool(2, 8, node_free=[5])])
    assert (offer.node_pool_id, book.names(offer.node_pool_id, nodes)) == (2, ("2-0",))
    assert book.fragment_growth(1, 0, request) == pytest.approx(3.5)
    assert book.fragment_growth(2, 0, request) == pytest.approx(-0.5)
