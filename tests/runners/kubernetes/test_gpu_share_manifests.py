"""What the pods of a job on part of one GPU ask of their node (ADR 0040): one slice on a time-sliced node
(``nvidia.com/gpu: 1``, or ``nvidia.com/gpu.shared: 1`` when the device plugin renames it), one MIG device of the
profile under the mixed strategy (``nvidia.com/mig-1g.10gb: 1``), ``nvidia.com/gpu: 1`` under the single strategy;
and the node's own product label, which the pinned node carries. Expected resources are written from the NVIDIA
device plugin's docs, not read from the module."""

from __future__ import annotations

import pytest
from django.utils import timezone

from runners.kubernetes import manifests as m
from runners.kubernetes.runner import workload as attempt_workload
from runners.models import Node
from tests.support.factories import make_attempt, make_cluster, make_job_row

from .steps import validate, workload

H100 = "NVIDIA-H100-80GB-HBM3"


def gpu_limits(w: m.Workload) -> dict:
    *_, job = m.manifests(w)
    for obj in m.manifests(w):
        validate(obj)
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {k: v for k, v in container["resources"]["limits"].items() if k.startswith("nvidia.com/")}


@pytest.mark.parametrize(("sharing", "slice_resource", "profile", "resource"), [
    ("time-slicing", "nvidia.com/gpu", "", "nvidia.com/gpu"),
    ("time-slicing", "nvidia.com/gpu.shared", "", "nvidia.com/gpu.shared"),
    ("mps", "nvidia.com/gpu", "", "nvidia.com/gpu"),
    ("mig-mixed", "", "1g.10gb", "nvidia.com/mig-1g.10gb"),
    ("mig-single", "", "1g.10gb", "nvidia.com/gpu"),
])
def test_a_shared_pod_asks_one_device_of_what_its_node_advertises(sharing, slice_resource, profile, resource):
    asked = m.shared_gpu_resource(sharing, slice_resource, profile)
    assert asked == resource
    limits = gpu_limits(workload(nodes=1, gpus_per_node=1, gpu_resource=asked))
    assert limits == {resource: "1"}  # one device, limit only (extended resources: request = limit)


def test_a_whole_gpu_pod_is_unchanged():
    assert gpu_limits(workload(nodes=1)) == {"nvidia.com/gpu": "8"}


@pytest.mark.parametrize(("labels", "sharing", "columns", "profile", "resource", "product"), [
    ({"nvidia.com/gpu.product": f"{H100}-SHARED"}, "time-slicing",
     {"gpu_replicas": 4, "slice_resource": "nvidia.com/gpu"}, "", "nvidia.com/gpu", f"{H100}-SHARED"),
    ({"nvidia.com/gpu.product": H100}, "mig-mixed", {"mig_devices": {"1g.10gb": 7}}, "1g.10gb",
     "nvidia.com/mig-1g.10gb", H100),
])
def test_dispatch_of_a_shared_attempt_asks_its_node_s_device(catalog, teams, user, labels, sharing, columns,
                                                               profile, resource, product):
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"], nodes=1)
    Node.objects.create(cluster=cluster, node_pool=pool, name="n1", gpus=8, cpu_milli=96000, memory_mib=1 << 20,
                        seen_at=timezone.now(), gpu_sharing=sharing, whole_gpus=0, labels=labels, **columns)
    job = make_job_row(teams[0], user, catalog["H100-80GB"], gpus_per_node=1, gpu_share_milli=125 if profile else 250,
                       mig_profile=profile)
    attempt = make_attempt(job, cluster, pool)
    attempt.placement = {"nodes": ["n1"], "gpus_per_node": 1, "cpu_milli": 0, "memory_mib": 0,
                         "share_milli": job.gpu_share_milli, "mig_profile": profile}
    attempt.save()

    w = attempt_workload(attempt)

    assert (w.gpu_resource, w.gpu_product, w.gpus_per_node) == (resource, product, 1)
    assert gpu_limits(w) == {resource: "1"}
