"""A request that can never run answers 400 with the field and the reason, and stores nothing: more nodes than the
largest pool of its accelerator has, CPU or memory per node above every node's allocatable, over the per-cluster
quota on the only clusters it may use, over the limit its team can reach (nominal + what its cohort can lend), or
for a team with no quota at all for the accelerator; a request that needs only a fleet change (a cordoned node) is
accepted and waits."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.scheduling.passes import schedule_pending
from jobs.scheduling.preview import preview_submission
from quotas.models import Quota
from runners.models import Node
from tests.support.factories import fresh

JOBS = "/api/v1/jobs/"


def node_rows(pool, count, *, cpu_cores=32, memory_gib=256, cordoned=()):
    """``count`` synced nodes of ``pool`` (8 GPUs, ``cpu_cores``, ``memory_gib`` each); indexes in ``cordoned``
    are cordoned."""
    return [Node.objects.create(cluster=pool.cluster, node_pool=pool, name=f"{pool.name}-{i}", gpus=8,
                                cpu_milli=cpu_cores * 1000, memory_mib=memory_gib * 1024, seen_at=timezone.now(),
                                unschedulable=i in cordoned, schedulable=i not in cordoned)
            for i in range(count)]


@pytest.fixture
def fleet(aws_cluster, quota_factory, alpha, h100):
    """aws-use1's H100 pool: 2 synced nodes of 8 GPUs, 32 cores, 256 GiB; alpha may hold 32 GPUs."""
    quota_factory(alpha, h100, 32)
    node_rows(aws_cluster["pool"], 2)
    return aws_cluster


def submit(persona, submission, **resources):
    submission["spec"]["resources"].update(resources)
    return persona.client.post(JOBS, submission, format="json")


def test_more_nodes_than_the_largest_pool_has_is_refused(teammate, fleet, submission):
    r = submit(teammate, submission, nodes=3)
    assert r.status_code == 400
    assert r.json() == {"spec.resources.nodes": [
        "3 nodes is more than any H100-80GB node pool has that can hold a node of this job; the largest has 2"]}
    assert not Job.objects.exists()


def test_cpu_above_every_nodes_allocatable_is_refused(teammate, fleet, submission):
    r = submit(teammate, submission, cpu=48)
    assert r.status_code == 400
    assert r.json() == {"spec.resources.cpu": [
        "48 CPU cores per node is more than any H100-80GB node with 8 GPUs has; the most is 32"]}
    assert not Job.objects.exists()


def test_memory_above_every_nodes_allocatable_is_refused(teammate, fleet, submission):
    r = submit(teammate, submission, memory_gib=300)
    assert r.status_code == 400
    assert list(r.json()) == ["spec.resources.memory_gib"]
    assert "the most is 256 GiB" in r.json()["spec.resources.memory_gib"][0]
    assert not Job.objects.exists()


def test_a_job_over_what_the_team_can_reach_in_its_cohort_is_refused_and_every_view_says_the_same_limit(
        teammate, aws_cluster, submission, alpha, beta, h100):
    # "limit 8" (nominal 4 + borrowing 4) in the default cohort, where beta lends 2: alpha can reach 6
    quota = Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=4, borrowing_limit_gpus=4)
    Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=2)
    r = submit(teammate, submission, nodes=2, gpus_per_node=4)
    assert r.status_code == 400
    assert r.json() == {"spec.resources": [
        "the job asks 8 GPUs (2 x 4), over the 6 H100-80GB GPUs team alpha can reach (nominal 4 + 2 its cohort can "
        "lend; its borrowing limit is 4)"]}
    assert not Job.objects.exists()
    shown = teammate.client.get(f"/api/v1/quotas/{quota.pk}/").json()
    assert (shown["limit_gpus"], shown["reachable_gpus"]) == (8, 6)
    resources = {"accelerator": h100, "gpus_per_node": 4, "nodes": 2, "priority": 500, "preemptible": True,
                 "max_runtime_seconds": 3600}
    verdict = preview_submission(alpha, resources, {}).quota  # the submission form's preview
    assert not verdict.ok and verdict.detail["limit_gpus"] == 6 and "6 GPUs the team can reach" in verdict.message


def test_a_job_within_the_reachable_limit_is_accepted(teammate, aws_cluster, submission, alpha, beta, h100):
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=4, borrowing_limit_gpus=4)
    Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=2)
    assert submit(teammate, submission, nodes=1, gpus_per_node=6).status_code == 201


def test_over_the_per_cluster_quota_on_the_only_cluster_it_may_use_is_refused(
        teammate, fleet, submission, alpha, h100):
    Quota.objects.create(team=alpha, accelerator=h100, cluster=fleet["cluster"], nominal_gpus=8)
    r = submit(teammate, submission, nodes=2, gpus_per_node=8)
    assert r.status_code == 400
    assert r.json() == {"spec.resources": [
        "the job asks 16 H100-80GB GPUs, over the team's per-cluster quota on every cluster that could hold it "
        "(aws-use1 8)"]}


def test_a_job_that_needs_a_cordoned_node_is_accepted_and_waits_for_the_fleet(
        teammate, aws_cluster, quota_factory, alpha, h100, submission):
    quota_factory(alpha, h100, 32)
    node_rows(aws_cluster["pool"], 2, cordoned=(1,))
    r = submit(teammate, submission, nodes=2, gpus_per_node=8)
    assert r.status_code == 201, r.content
    schedule_pending()
    job = fresh(Job.objects.get())
    assert job.state == "QUEUED" and job.queue_info["fleet_change"] is True
    assert "1 large enough node is cordoned" in job.queue_info["message"]


def test_a_team_without_any_quota_for_the_accelerator_is_refused_on_the_accelerator(
        teammate, aws_cluster, quota_factory, alpha, catalog, submission):
    quota_factory(alpha, catalog["A100-80GB"], 64)  # a quota, but for another accelerator
    r = submit(teammate, submission)
    assert r.status_code == 400
    assert r.json() == {"spec.resources.accelerator": [
        "team alpha has no quota for H100-80GB GPUs: no nominal quota and nothing to borrow, so a job of 16 GPUs "
        "(2 x 8) could never run"]}
    assert not Job.objects.exists()


def test_a_team_with_only_per_cluster_quota_for_the_accelerator_is_refused(
        teammate, aws_cluster, alpha, h100, submission):
    Quota.objects.create(team=alpha, accelerator=h100, cluster=aws_cluster["cluster"], nominal_gpus=16)
    r = submit(teammate, submission)
    assert r.status_code == 400
    assert r.json() == {"spec.resources.accelerator": [
        "team alpha has no quota for H100-80GB GPUs (its per-cluster quotas need a team-wide one): no nominal quota "
        "and nothing to borrow, so a job of 16 GPUs (2 x 8) could never run"]}
    assert not Job.objects.exists()


def test_a_team_whose_quota_reaches_no_gpu_is_refused_on_the_accelerator(
        teammate, aws_cluster, alpha, h100, submission):
    # nominal 0, may borrow 8, but no other team has a quota of H100 to lend: it can reach 0
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=0, borrowing_limit_gpus=8)
    r = submit(teammate, submission, nodes=1, gpus_per_node=1)
    assert r.status_code == 400
    assert r.json() == {"spec.resources.accelerator": [
        "team alpha can reach no H100-80GB GPUs (nominal 0, its borrowing limit is 8 but its cohort lends none), "
        "so a job of 1 GPUs (1 x 1) could never run"]}
    assert not Job.objects.exists()


def test_a_team_that_may_only_borrow_is_accepted_when_its_cohort_lends(
        teammate, aws_cluster, alpha, beta, h100, submission):
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=0, borrowing_limit_gpus=8)
    Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=8)
    assert submit(teammate, submission, nodes=1, gpus_per_node=8).status_code == 201


def test_no_quota_for_the_accelerator_is_accepted_when_an_alternative_has_quota(
        teammate, aws_cluster, cluster_factory, quota_factory, alpha, catalog, submission):
    a100 = catalog["A100-80GB"]
    cluster_factory("gcp-a100", "gcp", "us-central1", a100, nodes=2, gpus_per_node=8)
    quota_factory(alpha, a100, 16)
    r = submit(teammate, submission, alternatives=["A100-80GB"])
    assert r.status_code == 201, r.content


def test_more_gpus_per_node_than_any_synced_node_has_allocatable_is_refused(
        teammate, aws_cluster, quota_factory, alpha, h100, submission):
    # the pool says 8 GPUs per node; its synced nodes report 6 allocatable (2 held back by the device plugin)
    quota_factory(alpha, h100, 32)
    for node in node_rows(aws_cluster["pool"], 2):
        node.gpus = 6
        node.save()
    r = submit(teammate, submission, nodes=1, gpus_per_node=8)
    assert r.status_code == 400
    assert r.json() == {"spec.resources.gpus_per_node": [
        "8 GPUs per node is more than any H100-80GB node has allocatable; the most is 6"]}
    assert not Job.objects.exists()


def test_a_job_that_is_not_preemptible_on_a_fleet_of_spot_pools_only_is_refused(teammate, fleet, submission):
    """Class "accepted but never placeable": spot capacity takes preemptible jobs only, so on a fleet whose every
    pool of the accelerator is spot a non-preemptible job would wait for ever; it is refused on
    ``spec.preemptible``, and the same job marked preemptible is accepted."""
    pool = fleet["pool"]
    pool.capacity_type = "spot"
    pool.save()  # through the model: the fleet's lookup cache is invalidated by its signal
    submission["spec"]["preemptible"] = False
    r = submit(teammate, submission)
    assert r.status_code == 400
    assert list(r.json()) == ["spec.preemptible"]
    assert "spot capacity" in r.json()["spec.preemptible"][0]
    assert not Job.objects.exists()
    submission["spec"]["preemptible"] = True
    assert submit(teammate, submission).status_code == 201
