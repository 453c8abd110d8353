"""Node-exact admission end to end on emulated clusters: node sync records every GPU node (allocatable GPUs, CPU,
memory, pods of every owner, topology, taints, cordon), admission picks nodes with room, dispatch pins each pod to
its node, a kube-scheduler that binds by node resources (``tests.support.kube_scheduler``) runs them; a pod it
leaves Unschedulable past the grace period sends the job back to the queue with its quota and nodes released."""

from __future__ import annotations

import pytest

from jobs.lifecycle import dispatch
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import schedule_pending
from quotas.models import Quota
from runners.kubernetes.sync import sync_cluster
from runners.models import Node
from tests.support.factories import fresh, make_cluster, make_job_row
from tests.support.kube_scheduler import KubeScheduler, create_pending_pods
from tests.support.kubernetes import Emulators, Kubelet

H100 = "NVIDIA-H100-80GB-HBM3"
SLEEP = ["python", "-c", "import time; time.sleep(600)"]


def gpu_node(name: str, *, gpus: int = 8, cpu: str = "64", memory: str = "512Gi", zone: str = "us-east-1a",
             rack: str = "", cordoned: bool = False, taints=()) -> dict:
    labels = {"nvidia.com/gpu.product": H100, "topology.kubernetes.io/zone": zone}
    if rack:
        labels["topology.kubernetes.io/rack"] = rack
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": cordoned, "taints": list(taints)},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": memory},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def foreign_pod(node: str, gpus: int, name: str, cpu: str = "1", memory: str = "1Gi") -> dict:
    """A pod the platform does not own (no controlplane.io labels), bound to ``node``."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": {
                "limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": "Running"}}


@pytest.fixture
def two_clusters(settings, catalog, teams):
    """A cheap cluster and a dear one (H100 at 2.00 and 9.00 USD/GPU-h), both emulated, and alpha's 64-GPU quota;
    ``(Emulators, {name: Cluster})``."""
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 600
    settings.K8S_UNSCHEDULABLE_GRACE_SECONDS = 0
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 3.0
    catalog["H100-80GB"].product_label = H100
    catalog["H100-80GB"].save()
    Quota.objects.create(team=teams[0], accelerator=catalog["H100-80GB"], nominal_gpus=64)
    with Emulators(["cheap", "dear"]) as emulators:
        clusters = {}
        for name, price in (("cheap", "2.00"), ("dear", "9.00")):
            cluster, _ = make_cluster(name, "aws", "us-east-1", catalog["H100-80GB"], price=price, nodes=1)
            cluster.api_endpoint = emulators.url(name)
            cluster.api_token = "t"
            cluster.save()
            clusters[name] = cluster
        yield emulators, clusters


def add(emulators, cluster: str, *objects) -> None:
    """Create Nodes and pods (the ``default`` namespace first, when missing) on the emulated ``cluster``."""
    k = Kubelet(emulators.url(cluster))
    if "default" not in {n["metadata"]["name"] for n in k._req("GET", "/api/v1/namespaces")["items"]}:
        k._req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    for obj in objects:
        path = "/api/v1/nodes" if obj["kind"] == "Node" else f"/api/v1/namespaces/{obj['metadata']['namespace']}/pods"
        k._req("POST", path, obj)


def submit(teams, user, catalog, *, nodes=1, gpus=8, cpu=4, memory_gib=32, name="t") -> Job:
    spec = {"image": "registry.example/train:1", "command": SLEEP, "args": [], "env": {},
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes, "cpu": cpu,
                          "memory_gib": memory_gib}, "placement": {}}
    return make_job_row(teams[0], user, catalog["H100-80GB"], name=name, spec=spec, gpus_per_node=gpus, nodes=nodes)


def dispatch_and_schedule(emulators, cluster_name: str, attempt: JobAttempt) -> dict:
    """Dispatch the attempt (the dispatch task's work: objects created, job STARTING), create its Job's pods as the
    Job controller would, and run the kube-scheduler; pod name -> node (None: left Unschedulable)."""
    assert dispatch(attempt.pk) == "dispatched"
    url = emulators.url(cluster_name)
    job = Kubelet(url).job(attempt.pk)
    create_pending_pods(url, job)
    return KubeScheduler(url).schedule()


def test_sync_records_every_gpu_node_with_what_pods_of_every_owner_ask(two_clusters):
    emulators, clusters = two_clusters
    add(emulators, "cheap", gpu_node("a", rack="r1"), gpu_node("b", cordoned=True),
        gpu_node("c", taints=[{"key": "maintenance", "value": "1", "effect": "NoSchedule"}]),
        foreign_pod("a", 6, "other-team", cpu="3500m", memory="2Gi"))
    result = sync_cluster(clusters["cheap"])
    assert result["nodes"] == 3
    rows = {n.name: n for n in Node.objects.filter(cluster=clusters["cheap"])}
    a = rows["a"]
    assert (a.gpus, a.cpu_milli, a.memory_mib) == (8, 64_000, 512 * 1024)
    assert (a.foreign_gpus, a.foreign_cpu_milli, a.foreign_memory_mib) == (6, 3500, 2048)
    assert (a.zone, a.topology_domain, a.schedulable) == ("us-east-1a", "r1", True)
    assert (rows["b"].unschedulable, rows["b"].schedulable) == (True, False)
    assert rows["c"].schedulable is False and rows["c"].taints == [{"key": "maintenance", "value": "1",
                                                                    "effect": "NoSchedule"}]


def test_a_fragmented_cheap_pool_sends_a_whole_node_job_to_the_cluster_with_a_free_node(
        two_clusters, teams, user, catalog):
    # cheap: 4 nodes x 8 GPUs with 6 taken on each by pods the platform does not own (8 "free" GPUs in all)
    emulators, clusters = two_clusters
    add(emulators, "cheap", *[gpu_node(f"n{i}") for i in range(4)], *[foreign_pod(f"n{i}", 6, f"x{i}") for i in range(4)])
    add(emulators, "dear", gpu_node("d0"))
    for c in clusters.values():
        sync_cluster(c)
    job = submit(teams, user, catalog)
    schedule_pending()
    job = fresh(job)
    attempt = job.current_attempt
    assert job.state == JobState.ADMITTED and attempt.cluster.name == "dear"
    assert attempt.placement == {"nodes": ["d0"], "gpus_per_node": 8, "cpu_milli": 4000, "memory_mib": 32768}
    assert dispatch_and_schedule(emulators, "dear", attempt) == {f"{attempt.object_name}-0-p": "d0"}


def test_a_two_by_eight_gang_waits_on_four_half_free_nodes(two_clusters, teams, user, catalog):
    emulators, clusters = two_clusters
    add(emulators, "cheap", *[gpu_node(f"n{i}") for i in range(4)], *[foreign_pod(f"n{i}", 4, f"x{i}") for i in range(4)])
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    job = submit(teams, user, catalog, nodes=2)
    schedule_pending()
    job = fresh(job)
    assert job.state == JobState.QUEUED and job.queue_info["reason"] == "capacity"
    assert "at most 4 on one node" in job.queue_info["message"]


def test_cpu_and_memory_bound_nodes_are_passed_over(two_clusters, teams, user, catalog):
    emulators, clusters = two_clusters
    # node c0 has its GPUs free but only 2 cores left; c1 has the memory taken; c2 has room
    add(emulators, "cheap", gpu_node("c0", cpu="8"), gpu_node("c1", memory="64Gi"), gpu_node("c2"),
        foreign_pod("c0", 0, "cpu-hog", cpu="6"), foreign_pod("c1", 0, "mem-hog", memory="60Gi"))
    sync_cluster(clusters["cheap"])
    job = submit(teams, user, catalog, gpus=4, cpu=4, memory_gib=16)
    schedule_pending()
    attempt = fresh(job).current_attempt
    assert (attempt.cluster.name, attempt.placement["nodes"]) == ("cheap", ["c2"])
    assert dispatch_and_schedule(emulators, "cheap", attempt) == {f"{attempt.object_name}-0-p": "c2"}


def test_a_cordoned_node_keeps_a_gang_waiting_for_the_fleet_and_the_job_behind_it_runs(
        two_clusters, teams, user, catalog):
    # cheap: w0 free, w1 cordoned; the team queues strictly in order, yet a job that needs the cordon lifted
    # waits for the fleet without holding back the one behind it
    emulators, clusters = two_clusters
    add(emulators, "cheap", gpu_node("w0"), gpu_node("w1", cordoned=True))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    teams[0].queueing_strategy = "StrictFIFO"
    teams[0].save()
    gang = submit(teams, user, catalog, nodes=2, name="gang")
    single = submit(teams, user, catalog, name="single")
    schedule_pending()
    gang, single = fresh(gang), fresh(single)
    assert gang.state == JobState.QUEUED and gang.queue_info["fleet_change"] is True
    assert "1 large enough node is cordoned" in gang.queue_info["message"]
    attempt = single.current_attempt
    assert single.state == JobState.ADMITTED and attempt.placement["nodes"] == ["w0"]
    assert dispatch_and_schedule(emulators, "cheap", attempt) == {f"{attempt.object_name}-0-p": "w0"}


@pytest.mark.parametrize("strategy, runs", [("BestEffortFIFO", True), ("StrictFIFO", False)])
def test_a_head_without_room_now_holds_back_a_smaller_job_only_under_strict_fifo(
        two_clusters, teams, user, catalog, strategy, runs):
    # cheap: n0 free, n1 with 6 of 8 GPUs taken by another owner: a 2 x 8 head fits once n1 frees up, not now
    emulators, clusters = two_clusters
    add(emulators, "cheap", gpu_node("n0"), gpu_node("n1"), foreign_pod("n1", 6, "other"))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    teams[0].queueing_strategy = strategy
    teams[0].save()
    head = submit(teams, user, catalog, nodes=2, name="head")
    small = submit(teams, user, catalog, gpus=4, name="small")
    schedule_pending()
    head, small = fresh(head), fresh(small)
    assert head.state == JobState.QUEUED and head.queue_info["reason"] == "capacity"
    assert not head.queue_info.get("fleet_change")
    if runs:
        assert small.state == JobState.ADMITTED and small.current_attempt.placement["nodes"] == ["n0"]
    else:
        assert small.state == JobState.QUEUED and not small.attempts.exists()


def test_an_unschedulable_pod_past_the_grace_period_releases_its_attempt_and_requeues_the_job(
        two_clusters, teams, user, catalog):
    emulators, clusters = two_clusters
    add(emulators, "cheap", gpu_node("u0"))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    job = submit(teams, user, catalog)
    schedule_pending()
    attempt = fresh(job).current_attempt
    assert attempt.placement["nodes"] == ["u0"]
    add(emulators, "cheap", foreign_pod("u0", 8, "came-later"))  # after the sync: the platform could not know
    placed = dispatch_and_schedule(emulators, "cheap", attempt)
    assert placed == {f"{attempt.object_name}-0-p": None}
    pod = Kubelet(emulators.url("cheap")).pods(attempt.pk)[0]
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["reason"], scheduled["message"]) == ("Unschedulable",
                                                           "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    reconcile_cluster(clusters["cheap"])
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    job = fresh(job)
    assert attempt.ended_at is not None and attempt.end_reason == JobAttempt.EndReason.UNSCHEDULABLE
    assert job.state == JobState.RECOVERING and "Insufficient nvidia.com/gpu" in job.state_reason
    sync_cluster(clusters["cheap"])  # the node is now seen full: the job waits for capacity, holding nothing
    schedule_pending()
    job = fresh(job)
    assert job.state == JobState.RECOVERING and job.queue_info["reason"] == "capacity"
    assert not JobAttempt.objects.filter(job=job, ended_at__isnull=True).exists()


def test_serving_replicas_share_the_cheap_nodes_and_the_kube_scheduler_binds_them_all(
        two_clusters, teams, user, catalog):
    """ADR 0019: cheap has 2 free 8-GPU nodes, dear 3. An inference job of 3 replicas x 2 GPUs fits cheap's two
    nodes (replicas may share a node; spread first), so it goes there; each replica's Deployment pins its pod to
    the node booked for it, and a kube-scheduler binds every replica there."""
    emulators, clusters = two_clusters
    add(emulators, "cheap", gpu_node("c0"), gpu_node("c1"))
    add(emulators, "dear", gpu_node("d0"), gpu_node("d1"), gpu_node("d2"))
    for c in clusters.values():
        sync_cluster(c)
    spec = {"image": "registry.example/serve:1", "command": SLEEP, "args": [], "env": {}, "replicas": 3, "port": 8000,
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": 2, "nodes": 1, "cpu": 4, "memory_gib": 32},
            "placement": {}}
    job = make_job_row(teams[0], user, catalog["H100-80GB"], name="serve", kind="inference", spec=spec,
                       gpus_per_node=2, nodes=1)
    schedule_pending()
    job = fresh(job)
    attempt = job.current_attempt
    assert job.state == JobState.ADMITTED and attempt.cluster.name == "cheap" and attempt.gpus == 6
    assert len(attempt.placement["nodes"]) == 3 and set(attempt.placement["nodes"]) == {"c0", "c1"}

    assert dispatch(attempt.pk) == "dispatched"
    url = emulators.url("cheap")
    deployments = [d for d in Kubelet(url).deployments()
                   if d["metadata"]["labels"].get("controlplane.io/attempt") == str(attempt.pk)]
    assert len(deployments) == 3  # a Deployment per replica
    for deployment in deployments:
        as_pods = {"metadata": deployment["metadata"],
                   "spec": {"completions": deployment["spec"]["replicas"], "template": deployment["spec"]["template"]}}
        create_pending_pods(url, as_pods)
    bound = KubeScheduler(url).schedule()
    booked = {f"{attempt.object_name}-{i}-0-p": node for i, node in enumerate(attempt.placement["nodes"])}
    assert bound == booked
