"""GPU sharing end to end on an emulated Kubernetes cluster (ADR 0040): a node whose GPU the device plugin
time-slices four ways, a node under the MIG mixed strategy and a node of whole GPUs, labelled as GPU feature
discovery labels them. A quarter of a GPU, a 1g.10gb MIG device and a whole GPU are submitted through the API,
admitted side by side, dispatched (each pod pinned to its node, asking what the node advertises, told what it
holds), bound by a
kube-scheduler that counts every extended resource, run and ended with exit code 0: all three SUCCEEDED.
A second 1g.10gb job fits the node's other device; a third finds none there and waits."""

from __future__ import annotations

import pytest

from jobs.lifecycle import dispatch
from jobs.models import Job, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import schedule_pending
from quotas.models import Quota
from runners.kubernetes.sync import sync_cluster
from runners.models import Node
from tests.support.factories import make_cluster
from tests.support.kube_scheduler import KubeScheduler, create_pending_pods
from tests.support.kubernetes import Emulators, Kubelet

from .steps import validate

H100 = "NVIDIA-H100-80GB-HBM3"
SLEEP = ["python", "-c", "import time; time.sleep(600)"]


def node(name: str, labels: dict, allocatable: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "us-east-1a", **labels}},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **allocatable},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


#: The three nodes as the NVIDIA device plugin and GPU feature discovery describe them (k8s-device-plugin README,
#: "Shared Access to GPUs" and "Catalog of Labels"; GPU feature discovery's MIG strategies).
NODES = [
    node("sliced", {"nvidia.com/gpu.product": f"{H100}-SHARED", "nvidia.com/gpu.count": "1",
                    "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
         {"nvidia.com/gpu": "4"}),
    node("migged", {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "1", "nvidia.com/mig.strategy": "mixed",
                    "nvidia.com/mig-1g.10gb.count": "2", "nvidia.com/mig-3g.40gb.count": "1"},
         {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"}),
    node("whole", {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "2"}, {"nvidia.com/gpu": "2"}),
]


@pytest.fixture
def shared_cluster(settings, catalog, teams):
    """One emulated cluster with ``NODES`` synced, H100s at 3.00 USD/GPU-h, alpha's 16-GPU quota."""
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 600
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 3.0
    catalog["H100-80GB"].product_label = H100
    catalog["H100-80GB"].save()
    Quota.objects.create(team=teams[0], accelerator=catalog["H100-80GB"], nominal_gpus=16)
    with Emulators(["shared"]) as emulators:
        cluster, _ = make_cluster("shared", "aws", "us-east-1", catalog["H100-80GB"], price="3.00", nodes=1)
        cluster.api_endpoint = emulators.url("shared")
        cluster.api_token = "t"
        cluster.save()
        k = Kubelet(emulators.url("shared"))
        for obj in NODES:
            k._req("POST", "/api/v1/nodes", obj)
        sync_cluster(cluster)
        yield emulators, cluster


def submit(persona, submission: dict, name: str, **resources) -> int:
    submission = {**submission, "name": name, "spec": {**submission["spec"], "command": SLEEP, "args": [],
                                                       "resources": {"accelerator": "H100-80GB", "nodes": 1,
                                                                     **resources}}}
    answer = persona.client.post("/api/v1/jobs/", submission, content_type="application/json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def test_a_fraction_a_mig_device_and_a_whole_gpu_run_side_by_side_to_success(shared_cluster, teammate, submission):
    emulators, cluster = shared_cluster
    shapes = {n.name: (n.gpus, n.gpu_sharing, n.gpu_replicas, n.mig_devices, n.whole_gpus)
              for n in Node.objects.filter(cluster=cluster)}
    assert shapes == {"sliced": (1, "time-slicing", 4, {}, 0),
                      "migged": (1, "mig-mixed", 1, {"1g.10gb": 2, "3g.40gb": 1}, 0),
                      "whole": (2, "none", 1, {}, None)}
    ids = {"quarter": submit(teammate, submission, "quarter", gpus_per_node=0.25),
           "mig": submit(teammate, submission, "mig", gpus_per_node=1, mig_profile="1g.10gb"),
           "whole": submit(teammate, submission, "whole", gpus_per_node=1)}

    schedule_pending()

    jobs = {key: Job.objects.select_related("current_attempt").get(pk=pk) for key, pk in ids.items()}
    assert {key: job.state for key, job in jobs.items()} == dict.fromkeys(ids, JobState.ADMITTED)
    assert {key: job.current_attempt.placement["nodes"] for key, job in jobs.items()} == {
        "quarter": ["sliced"], "mig": ["migged"], "whole": ["whole"]}

    url = emulators.url("shared")
    k = Kubelet(url)
    for job in jobs.values():
        assert dispatch(job.current_attempt_id) == "dispatched"
        created = k.job(job.current_attempt_id)
        validate(created)
        create_pending_pods(url, created)
    bound = KubeScheduler(url).schedule()

    # Each pod asks one device of what its node advertises and the kube-scheduler binds it there.
    asked, told = {}, {}
    for key, job in jobs.items():
        attempt = job.current_attempt
        (pod,) = k.pods(attempt.pk)
        container = pod["spec"]["containers"][0]
        asked[key] = {r: v for r, v in container["resources"]["limits"].items() if r.startswith("nvidia.com/")}
        told[key] = {e["name"]: e.get("value") for e in container.get("env") or []
                     if e["name"].startswith(("CONTROLPLANE_GPU", "CONTROLPLANE_MIG"))}
        assert bound[pod["metadata"]["name"]] == attempt.placement["nodes"][0]
    assert asked == {"quarter": {"nvidia.com/gpu": "1"}, "mig": {"nvidia.com/mig-1g.10gb": "1"},
                     "whole": {"nvidia.com/gpu": "1"}}
    # Each pod is told what it holds, as the local runner tells its processes.
    assert told == {
        "quarter": {"CONTROLPLANE_GPU_SHARING": "time-slicing", "CONTROLPLANE_GPU_SHARE": "0.25",
                    "CONTROLPLANE_GPU_SHARE_MILLI": "250", "CONTROLPLANE_GPU_NODE": "sliced"},
        "mig": {"CONTROLPLANE_GPU_SHARING": "mig-mixed", "CONTROLPLANE_GPU_SHARE": "0.125",
                "CONTROLPLANE_GPU_SHARE_MILLI": "125", "CONTROLPLANE_GPU_NODE": "migged",
                "CONTROLPLANE_MIG_PROFILE": "1g.10gb"},
        "whole": {}}

    reconcile_cluster(cluster)
    assert {key: Job.objects.get(pk=pk).state for key, pk in ids.items()} == dict.fromkeys(ids, JobState.RUNNING)
    for job in jobs.values():
        (pod,) = k.pods(job.current_attempt_id)
        k.terminate(pod, 0)
        k.finish_job(k.job(job.current_attempt_id), "Complete")
    reconcile_cluster(cluster)
    assert {key: Job.objects.get(pk=pk).state for key, pk in ids.items()} == dict.fromkeys(ids, JobState.SUCCEEDED)


def test_mig_devices_are_given_out_one_pod_each(shared_cluster, teammate, submission):
    emulators, cluster = shared_cluster
    first = submit(teammate, submission, "mig-a", gpus_per_node=1, mig_profile="1g.10gb")
    second = submit(teammate, submission, "mig-b", gpus_per_node=1, mig_profile="1g.10gb")
    third = submit(teammate, submission, "mig-c", gpus_per_node=1, mig_profile="1g.10gb")

    schedule_pending()

    states = {pk: Job.objects.get(pk=pk) for pk in (first, second, third)}
    assert [states[pk].state for pk in (first, second)] == [JobState.ADMITTED, JobState.ADMITTED]
    assert states[third].state == JobState.QUEUED and states[third].queue_info["reason"] == "capacity"
    url = emulators.url("shared")
    for pk in (first, second):
        attempt_id = states[pk].current_attempt_id
        assert dispatch(attempt_id) == "dispatched"
        create_pending_pods(url, Kubelet(url).job(attempt_id))
    bound = KubeScheduler(url).schedule()
    assert sorted(bound.values()) == ["migged", "migged"]  # the node's two 1g.10gb devices, one pod each
