"""Serving on Kubernetes (docs/adr/0041-autoscaled-serving.md): the job's one endpoint is a Service named for the job
and kept across its attempts; each replica is a Deployment of its own pinned to the node admission booked for it,
so the autoscaler's admitted scale-ups and released scale-downs move exactly the booked pods; a replica's pod lost
is replaced on its node while the attempt serves on.

A cluster that behaves like one (``tests.support.kubernetes.ClusterEmulator``) with three 8-GPU nodes and a
kube-scheduler that binds by node affinity and free GPUs (``tests.support.kube_scheduler.bind``), synced as the
platform's node rows, so admission books nodes and the test sees where each pod landed.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from jobs.lifecycle import cancel_job, dispatch, finish_cancel
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.reconcile import expire_end_records, reconcile_cluster
from jobs.scheduling.passes import try_admit
from quotas.models import Quota
from runners.base import PermanentDispatchError, backend_for
from runners.kubernetes import manifests as m
from runners.kubernetes.runner import workload
from runners.kubernetes.sync import sync_cluster
from serving.autoscaler import apply_replicas
from serving.replicas import add_replica, release_replicas
from tests.support import kube_scheduler
from tests.support.clusters import load, state
from tests.support.factories import make_cluster, make_job_row
from tests.support.kubernetes import ClusterEmulator

from .steps import validate

S = JobState
H100 = "NVIDIA-H100-80GB-HBM3"
NODES = ("gpu-a", "gpu-b", "gpu-c")
SLEEP = ["python", "-c", "import time; time.sleep(600)"]


@pytest.fixture
def cluster(settings, catalog, teams):
    """``(emulator, Cluster)``: one emulated cluster of three 8-GPU H100 nodes (``NODES``) whose pods are bound
    by ``kube_scheduler.bind``, synced (a node row each), and alpha's 64-GPU quota."""
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 600
    settings.K8S_UNSCHEDULABLE_GRACE_SECONDS = 600
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 3.0
    accelerator = catalog["H100-80GB"]
    accelerator.product_label = H100
    accelerator.save()
    Quota.objects.create(team=teams[0], accelerator=accelerator, nominal_gpus=64)
    emulator = ClusterEmulator("gcp-usc1", bind=kube_scheduler.bind)
    emulator.start()
    try:
        for name in NODES:
            emulator.add_node(name, 8, {m.GPU_PRODUCT_LABEL: H100})
        row, _ = make_cluster("gcp-usc1", "gcp", "us-central1", accelerator, nodes=3, price="2.50")
        row.api_endpoint, row.api_token = emulator.url, "token"
        row.save()
        sync_cluster(row)
        yield emulator, row
    finally:
        emulator.stop()


def serving(teams, user, catalog, emulator, row, *, replicas=1, max_retries=0) -> JobAttempt:
    """A serving job of alpha (``replicas`` replicas of one 8-GPU pod, autoscaled 1..3) admitted, dispatched and
    seen RUNNING; its attempt, loaded."""
    spec = {"image": "registry.example/serve:1", "command": SLEEP, "args": [], "env": {}, "replicas": replicas,
            "port": 8000, "resources": {"accelerator": "H100-80GB", "gpus_per_node": 8, "nodes": 1},
            "placement": {}, "max_retries": max_retries,
            "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_in_flight_per_replica": 4}}
    job = make_job_row(teams[0], user, catalog["H100-80GB"], name="serve", kind="inference", spec=spec,
                       gpus_per_node=8, nodes=1, max_retries=max_retries)
    assert try_admit(job.pk) == "admitted"
    return run(emulator, row, Job.objects.get(pk=job.pk).current_attempt_id)


def run(emulator, row, attempt_id: int) -> JobAttempt:
    """Dispatch attempt ``attempt_id``, check its objects against the Kubernetes 1.33 schema and find them made,
    and reconcile until its job is RUNNING; the attempt, loaded."""
    assert dispatch(attempt_id) == "dispatched"
    objects = m.manifests(workload(load(attempt_id)))
    for obj in objects:
        validate(obj)
        assert any(o["metadata"]["name"] == obj["metadata"]["name"] for o in emulator.objects(obj["kind"]))
    reconcile_cluster(row)
    attempt = load(attempt_id)
    assert state(attempt) == S.RUNNING, Job.objects.get(pk=attempt.job_id).state_reason
    return attempt


def crash_until_ended(emulator, row, attempt: JobAttempt) -> int:
    """Crash ``attempt``'s server (exit 134) and reconcile, again on each replacement, until the retry budget is
    spent and the attempt ends; how many crashes that took."""
    for crashes in range(1, 10):
        pod = next(p for p in emulator.pods(attempt.pk) if not p["metadata"].get("deletionTimestamp"))
        emulator.crash_pod(pod["metadata"]["name"], exit_code=134)
        reconcile_cluster(row)
        if load(attempt.pk).ended_at is not None:
            return crashes
    raise AssertionError("the attempt never ended")


def replica_pods(emulator, attempt: JobAttempt) -> dict[str, list[dict]]:
    """The attempt's pods not being deleted, by replica index label."""
    out: dict[str, list[dict]] = {}
    for pod in emulator.pods(attempt.pk):
        if not pod["metadata"].get("deletionTimestamp"):
            out.setdefault(pod["metadata"]["labels"][m.LABEL_REPLICA], []).append(pod)
    return out


def hostnames(deployment: dict) -> list[str]:
    """The nodes a Deployment's pod template requires (``kubernetes.io/hostname`` In, in every term)."""
    terms = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    values = {tuple(e["values"]) for t in terms for e in t["matchExpressions"] if e["key"] == "kubernetes.io/hostname"}
    assert len(values) == 1
    return list(values.pop())


def live_deployments(emulator, attempt: JobAttempt) -> list[dict]:
    return sorted((d for d in emulator.objects("Deployment", attempt.pk) if not d["metadata"].get("deletionTimestamp")),
                  key=lambda d: d["metadata"]["name"])


def test_the_endpoint_is_the_job_s_service_and_stays_across_a_recovery(cluster, teams, user, catalog, owner):
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row, max_retries=1)
    job_id = attempt.job_id
    endpoint = owner.client.get(f"/api/v1/jobs/{job_id}/").json()["endpoint"]
    assert endpoint == f"http://job-{job_id}.cp-alpha.svc:8000"  # named for the job, not the attempt
    (service,) = emulator.objects("Service")
    assert service["metadata"]["name"] == f"job-{job_id}" and service["spec"]["type"] == "ClusterIP"

    assert crash_until_ended(emulator, row, attempt) == 2  # replaced once (max_retries 1), then the attempt ends
    assert state(attempt) == S.RECOVERING
    assert emulator.objects("Deployment", attempt.pk) == []  # the attempt's replicas went with it...
    (kept,) = emulator.objects("Service")
    assert kept["metadata"]["uid"] == service["metadata"]["uid"]  # ...its job's endpoint did not

    assert try_admit(job_id) == "admitted"
    second = run(emulator, row, Job.objects.get(pk=job_id).current_attempt_id)
    assert second.number == 2
    assert owner.client.get(f"/api/v1/jobs/{job_id}/").json()["endpoint"] == endpoint
    (same,) = emulator.objects("Service")
    assert same["metadata"]["uid"] == service["metadata"]["uid"]
    pods = emulator.pods(second.pk)
    assert pods and all(same["spec"]["selector"].items() <= p["metadata"]["labels"].items() for p in pods)

    cancel_job(Job.objects.get(pk=job_id))
    finish_cancel(job_id)
    emulator.step()
    finish_cancel(job_id)
    assert state(second) == S.CANCELLED
    assert emulator.objects("Service") == [] and emulator.objects("Deployment") == []  # the job ended: all gone


def test_replicas_scale_1_3_1_on_their_booked_nodes_and_a_released_replica_s_end_fails_nothing(
        cluster, teams, user, catalog):
    emulator, row = cluster
    emulator.termination_grace = 30.0  # released pods run out a grace, as a server draining on SIGTERM
    attempt = serving(teams, user, catalog, emulator, row)
    backend = backend_for(attempt.cluster)
    assert backend.scales
    (first,) = attempt.placement["nodes"]
    assert replica_pods(emulator, attempt)["0"][0]["spec"]["nodeName"] == first

    now = timezone.now()
    for _ in range(2):
        assert add_replica(attempt.job_id, now, {"desired": 3}) is None  # admitted, node-exact
    attempt = load(attempt.pk)
    booked = attempt.placement["nodes"]
    assert len(booked) == 3 and set(booked) == set(NODES) and booked[0] == first  # 8-GPU replicas: a node each
    assert attempt.gpus == 24 and Job.objects.get(pk=attempt.job_id).replicas == 3
    assert apply_replicas(backend, attempt, 3)
    deployments = live_deployments(emulator, attempt)
    assert [d["metadata"]["name"] for d in deployments] == [f"{attempt.object_name}-{i}" for i in range(3)]
    assert all(d["spec"]["replicas"] == 1 for d in deployments)
    assert [hostnames(d) for d in deployments] == [[node] for node in booked]  # each pinned to its own booking
    pods = replica_pods(emulator, attempt)
    assert {i: [p["spec"]["nodeName"] for p in pods[str(i)]] for i in range(3)} == {i: [booked[i]] for i in range(3)}
    assert load(attempt.pk).runner_state["replicas"] == [d["metadata"]["name"] for d in deployments]
    reconcile_cluster(row)
    assert state(attempt) == S.RUNNING

    assert release_replicas(attempt.job_id, now + dt.timedelta(seconds=60), {"desired": 1}) == 1
    attempt = load(attempt.pk)
    assert attempt.placement["nodes"] == [first] and attempt.gpus == 8
    assert apply_replicas(backend, attempt, 1)
    assert [d["metadata"]["name"] for d in live_deployments(emulator, attempt)] == [f"{attempt.object_name}-0"]
    retiring = [p for p in emulator.pods(attempt.pk) if p["metadata"].get("deletionTimestamp")]
    assert sorted(p["spec"]["nodeName"] for p in retiring) == sorted(booked[1:])
    for pod in retiring:  # they stop on SIGTERM with the code a killed server exits with
        emulator.finish_pod(pod["metadata"]["name"], exit_code=143)
    reconcile_cluster(row)
    ended = load(attempt.pk)
    assert state(attempt) == S.RUNNING and ended.ended_at is None  # no end of the attempt
    emulator.step(now=time.time() + 31)  # their grace is over
    reconcile_cluster(row)
    assert state(attempt) == S.RUNNING
    assert {k: [p["spec"]["nodeName"] for p in v] for k, v in replica_pods(emulator, attempt).items()} == {
        "0": [first]}
    assert [e.data["replicas"] for e in JobEvent.objects.filter(job_id=attempt.job_id, kind="scale")
            .order_by("id")] == [2, 3, 1]


def test_a_replica_s_pod_deleted_evicted_or_crashed_is_replaced_on_its_node_within_the_retry_budget(
        cluster, teams, user, catalog):
    """docs/adr/0041: a lost replica is replaced in its booked slot (its Deployment's new pod on the same node)
    while the other serves, a ``replica_replaced`` event each, at most ``max_retries`` in 600 s; the next loss
    ends the attempt with that replica's failure."""
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row, replicas=2, max_retries=3)
    booked = attempt.placement["nodes"]
    lost = replica_pods(emulator, attempt)["1"][0]
    emulator.delete_pod(lost["metadata"]["name"])  # someone's kubectl delete pod
    reconcile_cluster(row)
    assert state(attempt) == S.RUNNING  # replica 0 serves on
    emulator.step()  # the pod goes; its Deployment makes another, pinned to the same node
    reconcile_cluster(row)
    (replacement,) = replica_pods(emulator, attempt)["1"]
    assert replacement["metadata"]["uid"] != lost["metadata"]["uid"]
    assert replacement["spec"]["nodeName"] == booked[1] and replacement["status"]["phase"] == "Running"

    evicted = replica_pods(emulator, attempt)["0"][0]
    emulator.evict(evicted["metadata"]["name"])  # a drain
    reconcile_cluster(row)
    emulator.step()
    reconcile_cluster(row)

    crashed = replica_pods(emulator, attempt)["1"][0]
    emulator.crash_pod(crashed["metadata"]["name"], exit_code=137, reason="OOMKilled")  # the kubelet restarts it
    reconcile_cluster(row)  # the platform replaces it: the pod is deleted, its Deployment makes another
    assert crashed["metadata"]["uid"] not in {p["metadata"]["uid"] for p in emulator.pods(attempt.pk)}
    reconcile_cluster(row)
    assert state(attempt) == S.RUNNING and load(attempt.pk).ended_at is None
    assert {k: [p["spec"]["nodeName"] for p in v] for k, v in replica_pods(emulator, attempt).items()} == {
        "0": [booked[0]], "1": [booked[1]]}
    events = list(JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_replaced").order_by("id"))
    assert [(e.data["replica"], e.data["end_reason"], e.data["used"]) for e in events] == [
        (f"1/{lost['metadata']['name']}", "PodDeleted", 1), (f"0/{evicted['metadata']['name']}", "Evicted", 2),
        (f"1/{crashed['metadata']['name']}", "OOMKilled", 3)]
    ended = load(attempt.pk)
    assert ended.gpus == 16 and ended.placement["nodes"] == booked  # the same booked slots: nothing admitted

    last = replica_pods(emulator, attempt)["0"][0]
    emulator.crash_pod(last["metadata"]["name"], exit_code=2)  # a fourth loss in 600 s: past max_retries 3
    reconcile_cluster(row)
    ended = load(attempt.pk)
    assert ended.ended_at is not None and (ended.end_reason, ended.exit_code) == ("Failed", 2)
    assert "3 replica replacement(s) in the last 600 s used" in ended.message
    assert state(attempt) == S.RECOVERING  # a failed serving attempt: a new one while retries allow


@pytest.mark.parametrize("seen", ["the disruption", "the pinned replacement"])
def test_a_replica_whose_node_is_gone_ends_the_attempt_lost_with_its_node(cluster, teams, user, catalog, seen):
    """Its replacement would be pinned to a node that no longer exists: the attempt is lost ``NodeLost`` naming
    the node (placed again, off that node), whether a look saw its pod's disruption or only the pinned
    replacement waiting."""
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row, replicas=2, max_retries=1)
    gone = attempt.placement["nodes"][1]
    emulator.delete_node(gone)  # its pod: DisruptionTarget DeletionByPodGC, Terminating
    if seen == "the pinned replacement":
        emulator.step()  # the pod GC took the pod before any look: only its pinned replacement is seen, pending
        assert any(not p["spec"].get("nodeName") for p in emulator.pods(attempt.pk))
    reconcile_cluster(row)
    ended = load(attempt.pk)
    assert ended.ended_at is not None and ended.end_reason == "NodeLost" and ended.bad_nodes == [gone]
    assert state(attempt) == S.RECOVERING


def test_the_endpoint_of_a_job_that_ended_while_queued_is_swept_and_a_live_one_s_kept(cluster, teams, user, catalog,
                                                                                       settings):
    """A serving job that ends while it waits in the queue for its next attempt has no attempt whose deletion
    takes its Service: the end record sweep deletes it; a running job's Service is kept."""
    emulator, row = cluster
    settings.END_RECORD_SWEEP_SECONDS = 0
    waiting = serving(teams, user, catalog, emulator, row, max_retries=1)
    crash_until_ended(emulator, row, waiting)
    assert state(waiting) == S.RECOVERING
    running = serving(teams, user, catalog, emulator, row)
    cancel_job(Job.objects.get(pk=waiting.job_id))  # nothing runs: CANCELLED at once, no deletion to make
    assert state(waiting) == S.CANCELLED
    assert {s["metadata"]["name"] for s in emulator.objects("Service")} == {f"job-{waiting.job_id}",
                                                                           f"job-{running.job_id}"}
    expire_end_records()
    assert [s["metadata"]["name"] for s in emulator.objects("Service")] == [f"job-{running.job_id}"]


def test_a_slot_booked_again_while_its_old_replica_still_goes_is_made_anew_on_the_new_booking(
        cluster, teams, user, catalog):
    """Scaled 3 -> 1, the released replicas' pods run out their grace; a scale-up to 2 meanwhile books replica 1
    again: its old Deployment, still being deleted, is not taken for the new one (the runner says to try again),
    and once it is gone the new one is made, pinned to the node the new booking names. Scale to zero is refused."""
    emulator, row = cluster
    emulator.termination_grace = 30.0
    attempt = serving(teams, user, catalog, emulator, row)
    backend = backend_for(attempt.cluster)
    now = timezone.now()
    for _ in range(2):
        assert add_replica(attempt.job_id, now, {"desired": 3}) is None
    assert apply_replicas(backend, load(attempt.pk), 3)
    assert release_replicas(attempt.job_id, now, {"desired": 1}) == 1
    assert apply_replicas(backend, load(attempt.pk), 1)

    assert add_replica(attempt.job_id, now, {"desired": 2}) is None
    attempt = load(attempt.pk)
    rebooked = attempt.placement["nodes"][1]
    assert not apply_replicas(backend, attempt, 2)  # replica 1's old Deployment is still being deleted
    emulator.step(now=time.time() + 31)  # the old pods' grace is over: they and their Deployments are gone
    assert apply_replicas(backend, attempt, 2)
    (deployment,) = [d for d in live_deployments(emulator, attempt) if d["metadata"]["name"].endswith("-1")]
    assert hostnames(deployment) == [rebooked]
    assert [p["spec"]["nodeName"] for p in replica_pods(emulator, attempt)["1"]] == [rebooked]
    with pytest.raises(PermanentDispatchError):
        backend.scale(attempt, 0)
