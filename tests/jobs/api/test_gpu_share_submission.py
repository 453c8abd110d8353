"""Submitting a job on part of one GPU (docs/adr/0040-gpu-sharing.md): ``gpus_per_node`` below 1 in steps of 0.01 or
a ``mig_profile`` of the accelerator, stored as a share in milli-GPUs; what is not possible answers 400 on its field
with the reason."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from core.gpus import MIG_PROFILES, gpus_of, milli_of
from jobs.models import Job
from quotas.models import Quota
from runners.models import Node
from tests.support.factories import make_cluster

pytestmark = pytest.mark.usefixtures("alpha_h100_quota", "shared_h100")


@pytest.fixture
def shared_h100(aws_cluster):
    """``aws_cluster``'s H100 pool with its nodes synced: a time-sliced one (8 GPUs x 4 slices) and a plain one."""
    pool, now = aws_cluster["pool"], timezone.now()
    Node.objects.create(cluster=pool.cluster, node_pool=pool, name="ts", gpus=8, cpu_milli=96000, memory_mib=1 << 20,
                        seen_at=now, gpu_sharing="time-slicing", gpu_replicas=4, whole_gpus=0,
                        slice_resource="nvidia.com/gpu")
    Node.objects.create(cluster=pool.cluster, node_pool=pool, name="plain", gpus=8, cpu_milli=96000,
                        memory_mib=1 << 20, seen_at=now)

JOBS = "/api/v1/jobs/"


def shared(submission, kind: str = "training", **resources) -> dict:
    submission["kind"] = kind
    submission["spec"]["resources"] = {"accelerator": "H100-80GB", "nodes": 1, **resources}
    return submission


@pytest.mark.parametrize(("asked", "milli"), [(0.25, 250), (0.5, 500), (0.01, 10), (0.99, 990), (0.29, 290)])
def test_a_fraction_of_a_gpu_is_stored_as_its_share_in_milli_gpus(teammate, submission, asked, milli):
    r = teammate.client.post(JOBS, shared(submission, gpus_per_node=asked), format="json")

    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["gpus_per_node"], body["gpu_share_milli"], body["mig_profile"]) == (1, milli, "")
    job = Job.objects.get(pk=body["id"])
    assert (job.gpu_share_milli, job.gpu_milli_per_node) == (milli, milli)
    assert job.spec["resources"]["gpus_per_node"] == asked  # the spec keeps what was asked


def test_a_whole_gpu_job_has_no_share(teammate, submission):
    r = teammate.client.post(JOBS, shared(submission, gpus_per_node=2), format="json")
    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert (job.gpu_share_milli, job.mig_profile, job.gpu_milli_per_node) == (0, "", 2000)


@pytest.fixture
def a100(catalog, teams):
    """An A100-80GB pool on AWS of one MIG mixed node (every profile of NVIDIA's table) and alpha's quota for it."""
    cluster, pool = make_cluster("aws-a100", "aws", "us-east-1", catalog["A100-80GB"], nodes=1, gpus_per_node=8)
    Node.objects.create(cluster=cluster, node_pool=pool, name="mig", gpus=8, cpu_milli=96000, memory_mib=1 << 20,
                        seen_at=timezone.now(), gpu_sharing="mig-mixed", whole_gpus=0,
                        mig_devices={p: 1 for p in MIG_PROFILES["A100-80GB"]})
    Quota.objects.create(team=teams[0], accelerator=catalog["A100-80GB"], nominal_gpus=8)


@pytest.mark.usefixtures("a100")
@pytest.mark.parametrize(("profile", "milli"), [("1g.10gb", 125), ("1g.20gb", 250), ("3g.40gb", 500),
                                                ("7g.80gb", 1000)])
def test_a_mig_profile_is_stored_with_the_share_of_its_memory_slices(teammate, submission, profile, milli):
    r = teammate.client.post(JOBS, shared(submission, accelerator="A100-80GB", gpus_per_node=1, mig_profile=profile),
                             format="json")

    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert (job.gpus_per_node, job.mig_profile, job.gpu_share_milli) == (1, profile, milli)


@pytest.mark.usefixtures("a100")
@pytest.mark.parametrize(("resources", "field", "message"), [
    ({"gpus_per_node": 0.25, "nodes": 2}, "spec.resources.nodes", "runs on one node: nodes must be 1 (got 2)"),
    ({"gpus_per_node": 0.333}, "spec.resources.gpus_per_node", "in steps of 0.01"),
    ({"gpus_per_node": 1.5}, "spec.resources.gpus_per_node", "more than one GPU is a whole number"),
    ({"gpus_per_node": 2.0}, "spec.resources.gpus_per_node", "more than one GPU is a whole number"),
    ({"gpus_per_node": 0.0}, "spec.resources.gpus_per_node", "between 0.01 and 0.99"),
    ({"gpus_per_node": "0.5"}, "spec.resources.gpus_per_node", "A valid integer is required"),
    ({"gpus_per_node": 0.5, "alternatives": ["A100-80GB"]}, "spec.resources.alternatives", "no alternatives"),
    ({"gpus_per_node": 1, "mig_profile": "1g.10gb"}, "spec.resources.mig_profile",
     'H100-80GB has no MIG profile "1g.5gb"'),
    ({"accelerator": "A100-80GB", "gpus_per_node": 1, "mig_profile": "1g.5gb"}, "spec.resources.mig_profile",
     'A100-80GB has no MIG profile "1g.5gb"; its profiles: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb'),
    ({"accelerator": "L4", "gpus_per_node": 1, "mig_profile": "1g.10gb"}, "spec.resources.mig_profile",
     "L4 has no MIG profiles; MIG is offered on A100-40GB, A100-80GB, H100-80GB"),
    ({"accelerator": "A100-80GB", "gpus_per_node": 2, "mig_profile": "1g.10gb"}, "spec.resources.gpus_per_node",
     "gpus_per_node must be 1 (got 2)"),
    ({"accelerator": "A100-80GB", "gpus_per_node": 0.5, "mig_profile": "1g.10gb"}, "spec.resources.mig_profile",
     "not both"),
], ids=["fraction-on-two-nodes", "finer-than-a-hundredth", "one-and-a-half", "float-two", "zero-float",
        "string", "alternatives", "h100-profile-of-a100-40", "a100-unknown-profile", "no-mig-table",
        "two-mig-devices", "fraction-and-profile"])
def test_what_a_share_cannot_be_is_refused_on_its_field(teammate, submission, catalog, resources, field, message):
    if resources.get("accelerator") == "L4":
        make_cluster("aws-l4", "aws", "us-east-1", catalog["L4"], nodes=1, gpus_per_node=8)
    if resources.get("mig_profile") == "1g.10gb" and "accelerator" not in resources:
        resources = {**resources, "mig_profile": "1g.5gb"}  # H100-80GB's table has no 1g.5gb
    before = Job.objects.count()

    r = teammate.client.post(JOBS, shared(submission, **resources), format="json")

    assert r.status_code == 400, r.content
    assert any(message in m for m in r.json()[field]), r.json()
    assert Job.objects.count() == before


def test_a_fractional_server_runs_one_replica(teammate, submission):
    document = shared(submission, kind="inference", gpus_per_node=0.5)
    document["spec"]["replicas"] = 2
    document["spec"].pop("max_runtime_seconds", None)

    r = teammate.client.post(JOBS, document, format="json")

    assert r.status_code == 400, r.content
    assert any("replicas must be 1 (got 2)" in m for m in r.json()["spec.replicas"])


def test_a_fractional_server_is_not_autoscaled(teammate, submission):
    document = shared(submission, kind="inference", gpus_per_node=0.5)
    document["spec"].pop("max_runtime_seconds", None)
    document["spec"]["autoscaling"] = {"min_replicas": 1, "max_replicas": 3, "target_in_flight_per_replica": 4}

    r = teammate.client.post(JOBS, document, format="json")

    assert r.status_code == 400, r.content
    assert any("max_replicas must be 1 (got 3)" in m for m in r.json()["spec.autoscaling.max_replicas"])


def test_a_role_of_a_multi_role_job_asks_whole_gpus(teammate):
    role = {"image": "python:3.11", "command": ["python", "x.py"],
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": 0.5, "nodes": 1}}
    document = {"team": "alpha", "name": "rl", "kind": "multi-role",
                "spec": {"roles": {"learner": role}, "max_runtime_seconds": 3600,
                         "placement": {"providers": ["aws"]}}}

    r = teammate.client.post(JOBS, document, format="json")

    assert r.status_code == 400, r.content
    assert any("fractions and MIG profiles are for single-role jobs" in m
               for m in r.json()["spec.roles.learner.resources.gpus_per_node"])


def test_the_mig_table_shares_are_exact_eighths_and_fit_a_gpu():
    # NVIDIA's table: one GPU holds `instances` of a profile; their memory slices never pass the GPU's eight.
    for accelerator, profiles in MIG_PROFILES.items():
        for p in profiles.values():
            assert p.share_milli * 8 == p.memory_slices * 1000, (accelerator, p.name)
            assert p.instances * p.memory_slices <= 8 and p.instances * p.compute_slices <= 7, (accelerator, p.name)


@pytest.mark.parametrize(("gpus", "milli"), [("0.01", 10), (0.29, 290), (1, 1000), ("2.50", 2500)])
def test_milli_gpus_are_exact(gpus, milli):
    assert milli_of(gpus) == milli
    assert gpus_of(milli) == Decimal(str(gpus))


@pytest.mark.parametrize("gpus", ["0.005", 0.333, "x", float("nan")])
def test_milli_gpus_refuse_what_is_not_a_hundredth(gpus):
    with pytest.raises(ValueError):
        milli_of(gpus)
