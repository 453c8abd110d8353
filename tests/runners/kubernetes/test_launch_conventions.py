"""Launch conventions of the generated pods: torchrun's ``PET_*`` options beside the rendezvous variables, the
platform's variables before the job's own (so a job's value may use ``$(NODE_RANK)``), and ``args`` without
``command`` running the image's ENTRYPOINT. Every manifest is validated against the Kubernetes 1.33 schema."""

from __future__ import annotations

import pytest

from jobs.lifecycle import dispatch
from jobs.models import JobState
from runners.kubernetes import manifests as m
from tests.support.clusters import state

from .steps import validate, workload


def env_list(obj: dict) -> list[dict]:
    return obj["spec"]["template"]["spec"]["containers"][0]["env"]


@pytest.mark.parametrize("nodes", [1, 4])
def test_pods_carry_torchruns_pet_options(nodes):
    w = workload(nodes=nodes, gpus_per_node=8)
    job = m.training_job(w)
    validate(job)
    env = {e["name"]: e for e in env_list(job)}
    master = "127.0.0.1" if nodes == 1 else "job-7-1-0.job-7-1.cp-alpha.svc"
    assert env["PET_NNODES"]["value"] == str(nodes) and env["PET_NPROC_PER_NODE"]["value"] == "8"
    assert env["PET_MASTER_ADDR"]["value"] == master and env["PET_MASTER_PORT"]["value"] == "29500"
    if nodes == 1:
        assert env["PET_NODE_RANK"]["value"] == "0"
    else:
        path = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == path


def test_a_job_value_can_refer_to_platform_variables_defined_before_it():
    w = workload(nodes=2, env=(("RUN_NAME", "run-$(NODE_RANK)-of-$(WORLD_SIZE)"), ("MASTER_PORT", "1")))
    job = m.training_job(w)
    validate(job)
    names = [e["name"] for e in env_list(job)]
    assert names.index("RUN_NAME") > max(names.index("NODE_RANK"), names.index("WORLD_SIZE"))
    assert names.count("MASTER_PORT") == 1  # the platform's value, once
    env = {e["name"]: e.get("value") for e in env_list(job)}
    assert env["MASTER_PORT"] == "29500" and env["RUN_NAME"] == "run-$(NODE_RANK)-of-$(WORLD_SIZE)"


@pytest.mark.parametrize("kind", ["training", "inference"])
def test_args_without_a_command_run_the_images_entrypoint(kind):
    w = workload(kind=kind, nodes=1, command=(), args=("--steps", "5"))
    for obj in m.manifests(w):
        validate(obj)
    (main,) = [o for o in m.manifests(w) if o["kind"] != "Service"]
    container = main["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container and container["args"] == ["--steps", "5"]


def test_a_job_with_args_only_is_accepted_and_runs(live_clusters, owner, catalog):
    submission = {"team": "alpha", "name": "entrypoint", "spec": {
        "image": "registry.example/train:1", "args": ["--epochs", "1"], "max_runtime_seconds": 600,
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}}}
    answer = owner.client.post("/api/v1/jobs/", submission, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["spec"]["command"] == []

    attempt = live_clusters.admit(cluster="gcp-usc1", command=(), args=("--epochs", "1"))
    assert dispatch(attempt.pk) == "dispatched"
    live_clusters.reconcile("gcp-usc1")
    assert state(attempt) == JobState.RUNNING
    (job,) = live_clusters.emulators["gcp-usc1"].objects("Job", attempt.pk)
    validate({k: v for k, v in job.items() if k != "status"} | {"metadata": {"name": job["metadata"]["name"]}})


def test_a_job_without_command_and_args_is_refused_with_the_field(owner, catalog, aws_cluster):
    submission = {"team": "alpha", "name": "nothing", "spec": {
        "image": "registry.example/train:1", "max_runtime_seconds": 600,
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}}}
    answer = owner.client.post("/api/v1/jobs/", submission, format="json")
    assert answer.status_code == 400
    assert "required unless args are given" in answer.json()["spec.command"][0]


def test_a_cpu_only_pod_requests_no_gpu_and_stays_off_gpu_nodes():
    """gpus_per_node 0: no nvidia.com/gpu limit, no accelerator selector, no toleration of the GPU nodes' taint
    (so it lands on CPU nodes), one torchrun process per node."""
    w = workload(nodes=2, gpus_per_node=0, gpu_product="", cpu=8, memory_gib=16)
    job = m.training_job(w)
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {"cpu": "8000m", "memory": "16384Mi"},
                                                 "requests": {"cpu": "8000m", "memory": "16384Mi"}}
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}["PET_NPROC_PER_NODE"] == "1"
