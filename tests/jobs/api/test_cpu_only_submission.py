"""Submitting a CPU-only job (``gpus_per_node: 0``): accelerator left out means CPU, ``cpu`` is required, the CPU
flavor has no GPUs and a GPU accelerator is not asked for none; a request larger than every CPU node is refused
with the numbers; without any CPU node pool it could never run (400). The job holds 0 GPUs and its preview prices
its CPU and memory."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from costs.seed import seed_cpu_prices
from jobs.models import Job
from runners.models import Node, cpu_flavor
from tests.support.factories import make_cluster

JOBS = "/api/v1/jobs/"


@pytest.fixture
def cpu_pool(catalog):
    """gcp-usc1 with a CPU node pool of two synced nodes of 16 cores and 64 GiB; the CPU prices seeded."""
    seed_cpu_prices()
    _, pool = make_cluster("gcp-usc1", "gcp", "us-central1", cpu_flavor(), nodes=2, gpus_per_node=0)
    for i in range(2):
        Node.objects.create(cluster=pool.cluster, node_pool=pool, name=f"cpu-{i}", gpus=0, cpu_milli=16000,
                            memory_mib=64 * 1024, seen_at=timezone.now())
    return pool


def cpu_submission(submission, **resources) -> dict:
    submission["spec"]["resources"] = {"gpus_per_node": 0, "nodes": 1, "cpu": 4, "memory_gib": 8, **resources}
    submission["spec"]["placement"] = {}
    submission["spec"]["preemptible"] = False
    return submission


def test_a_cpu_only_job_is_accepted_without_an_accelerator_and_holds_no_gpus(teammate, cpu_pool, submission):
    r = teammate.client.post(JOBS, cpu_submission(submission), format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["accelerator"], body["gpus_per_node"], body["total_gpus"]) == ("CPU", 0, 0)
    job = Job.objects.get(pk=body["id"])
    assert job.spec["resources"]["accelerator"] == "CPU" and job.accelerator.is_cpu


@pytest.mark.parametrize("resources, field, message", [
    ({"cpu": None}, "spec.resources.cpu", "required for a CPU-only job"),
    ({"accelerator": "CPU", "gpus_per_node": 2}, "spec.resources.gpus_per_node", "CPU node pools have no GPUs"),
    ({"accelerator": "H100-80GB"}, "spec.resources.gpus_per_node", "0 GPUs is a CPU-only job"),
    ({"gpus_per_node": 1}, "spec.resources.accelerator", "required unless gpus_per_node is 0"),
    ({"alternatives": ["H100-80GB"]}, "spec.resources.alternatives", "no alternatives"),
    ({"cpu": 24}, "spec.resources.cpu", "24 CPU cores per node is more than any CPU node has; the most is 16"),
], ids=["no-cpu", "gpus-on-cpu", "gpu-accelerator-zero-gpus", "gpus-without-accelerator", "alternatives",
        "cpu-over-every-node"])
def test_a_cpu_only_job_that_breaks_a_rule_is_refused_on_its_field(teammate, cpu_pool, submission, resources,
                                                                    field, message):
    document = cpu_submission(submission, **{k: v for k, v in resources.items() if v is not None})
    for key in [k for k, v in resources.items() if v is None]:
        del document["spec"]["resources"][key]
    r = teammate.client.post(JOBS, document, format="json")
    assert r.status_code == 400, r.content
    assert any(message in m for m in r.json()[field]), r.json()
    assert not Job.objects.exists()


def test_without_a_cpu_node_pool_a_cpu_only_job_could_never_run(teammate, aws_cluster, submission):
    cpu_flavor()
    r = teammate.client.post(JOBS, cpu_submission(submission), format="json")
    assert r.status_code == 400
    assert r.json()["spec.resources.accelerator"] == ["no CPU node pool has nodes, so a CPU-only job could never run"]


def test_the_preview_prices_a_cpu_only_job_by_its_cpu_and_memory(alpha, cpu_pool):
    from jobs.scheduling.preview import preview_submission

    resources = {"accelerator": cpu_pool.accelerator, "gpus_per_node": 0, "nodes": 2, "cpu": 3, "memory_gib": 10,
                 "priority": 500, "preemptible": False, "max_runtime_seconds": 7200}
    assessment = preview_submission(alpha, resources, {})
    # 2 nodes x (3 vCPU x 0.031611 + 10 GiB x 0.004237) USD/h x 2 h
    expected = (2 * (3 * Decimal("0.031611") + 10 * Decimal("0.004237")) * 2).quantize(Decimal("0.000001"))
    assert assessment.fits_now and assessment.offer.node_pool_id == cpu_pool.pk
    assert assessment.estimate_usd == expected and assessment.quota.ok
