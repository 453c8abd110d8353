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
import itertools
import logging
import math
import time

import pytest
from django.utils import timezone

from costs.ledger import accrue_attempt
from costs.models import CostEntry
from jobs.lifecycle import cancel_job, dispatch, finish_cancel
from jobs.models import Job, JobAttempt, JobEvent, JobState, ServingSample
from jobs.reconcile import expire_end_records, reconcile_cluster
from jobs.scheduling.passes import try_admit
from jobs.service import serving_status
from quotas.models import Quota
from runners.base import PermanentDispatchError, backend_for
from runners.kubernetes import manifests as m
from runners.kubernetes.runner import workload
from runners.kubernetes.sync import sync_cluster
from runners.models import Cluster
from serving.autoscaler import apply_replicas, autoscale
from serving.hpa import parse_reading
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


def serving(teams, user, catalog, emulator, row, *, replicas=1, max_retries=0, scaling=None,
            autoscaled=True) -> JobAttempt:
    """A serving job of alpha (``replicas`` replicas of one 8-GPU pod, autoscaled 1..3, or as ``scaling`` says, or
    not at all without ``autoscaled``) admitted, dispatched and seen RUNNING; its attempt, loaded."""
    spec = {"image": "registry.example/serve:1", "command": SLEEP, "args": [], "env": {}, "replicas": replicas,
            "port": 8000, "resources": {"accelerator": "H100-80GB", "gpus_per_node": 8, "nodes": 1},
            "placement": {}, "max_retries": max_retries}
    if autoscaled:
        spec["autoscaling"] = scaling or {"min_replicas": 1, "max_replicas": 3, "target_in_flight_per_replica": 4}
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


def deployment_named(emulator, attempt: JobAttempt, index: int) -> dict:
    """The live Deployment of replica ``index`` of ``attempt``."""
    (found,) = [d for d in live_deployments(emulator, attempt)
                if d["metadata"]["name"] == m.replica_name(attempt.object_name, index)]
    return found


def lose_node(emulator, name: str, seen: str) -> None:
    """Node ``name`` goes as ``seen`` says: deleted (its pods DisruptionTarget DeletionByPodGC), reclaimed as spot
    (TerminationByKubelet), or deleted with the pod GC taking its pods before any look (only the replica's pinned
    new pod is seen, pending)."""
    if seen == "a spot reclaim":
        emulator.interrupt_spot(name)
    else:
        emulator.delete_node(name)
    if seen == "the pinned replacement":
        emulator.step()


@pytest.mark.parametrize("seen", ["the disruption", "the pinned replacement", "a spot reclaim"])
def test_a_replica_whose_node_is_gone_is_replaced_on_another_node_while_the_other_serves(
        cluster, teams, user, catalog, seen):
    """docs/adr/0041: the lost replica's slot leaves the booking (billing stops at the loss as seen), a
    replacement is admitted off that node as a scale-up, a Deployment of its own pinned to its new node, counted
    as a ``replica_replaced`` naming both nodes; the other replica's Deployment and pod are never touched."""
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row, replicas=2, max_retries=1)
    kept_node, gone = attempt.placement["nodes"]
    (spare,) = set(NODES) - {kept_node, gone}
    kept = deployment_named(emulator, attempt, 0)
    (kept_pod,) = replica_pods(emulator, attempt)["0"]

    lose_node(emulator, gone, seen)
    reconcile_cluster(row)
    lost = load(attempt.pk)
    assert state(attempt) == S.RUNNING and lost.ended_at is None
    (loss,) = JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_node_lost")
    assert (loss.data["slot"], loss.data["nodes"]) == (1, [gone])
    assert not JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_replaced").exists()  # nothing counted
    reconcile_cluster(row)  # seen again: recorded once
    assert JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_node_lost").count() == 1

    seen_at = dt.datetime.fromisoformat(loss.data["seen_at"])
    later = seen_at + dt.timedelta(seconds=30)
    Cluster.objects.filter(pk=row.pk).update(last_contact_at=later)  # the cluster answered up to then
    autoscale(later)  # the serving pass: released at the loss, replaced at ``later``
    replaced = load(attempt.pk)
    job = Job.objects.get(pk=attempt.job_id)
    assert replaced.placement["nodes"] == [kept_node, spare] and replaced.placement["slots"] == [0, 2]
    assert replaced.gpus == 16 and job.replicas == 2
    assert [d["metadata"]["name"] for d in live_deployments(emulator, attempt)] == [
        m.replica_name(attempt.object_name, i) for i in (0, 2)]
    untouched = deployment_named(emulator, attempt, 0)
    assert (untouched["metadata"]["uid"], untouched["metadata"]["resourceVersion"]) == (
        kept["metadata"]["uid"], kept["metadata"]["resourceVersion"])
    assert hostnames(deployment_named(emulator, attempt, 2)) == [spare]
    pods = replica_pods(emulator, attempt)
    assert [p["metadata"]["uid"] for p in pods["0"]] == [kept_pod["metadata"]["uid"]]
    assert [p["spec"]["nodeName"] for p in pods["2"]] == [spare]
    (released,) = JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_slot_released")
    assert (released.data["slot"], released.data["nodes"], released.data["released_gpus"]) == (1, [gone], 8)
    (event,) = JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_replaced")
    assert (event.data["lost_nodes"], event.data["nodes"], event.data["slot"], event.data["used"]) == (
        [gone], [spare], 2, 1)
    assert gone in event.reason and spare in event.reason

    emulator.step()
    reconcile_cluster(row)
    assert state(attempt) == S.RUNNING and load(attempt.pk).ended_at is None
    assert {k: [p["spec"]["nodeName"] for p in v] for k, v in replica_pods(emulator, attempt).items()} == {
        "0": [kept_node], "2": [spare]}

    # billed once at what was held: 16 GPUs until the loss was seen, 8 until the replacement, 16 again
    end = later + dt.timedelta(seconds=30)
    Cluster.objects.filter(pk=row.pk).update(last_contact_at=end)
    accrue_attempt(attempt.pk, end)
    entries = list(CostEntry.objects.filter(attempt_id=attempt.pk).order_by("interval_start"))
    assert all(a.interval_end == b.interval_start for a, b in itertools.pairwise(entries))  # no instant twice
    held = [(e.gpus, e.interval_start, e.interval_end) for e in entries]
    assert held[-1][0] == 16
    eight = [(s, e) for g, s, e in held if g == 8]
    assert eight == [(seen_at, later)]
    assert all(g == 16 for g, s, _ in held if s < seen_at or s >= later)


@pytest.mark.parametrize("refused", ["capacity", "retries"])
def test_a_replica_lost_with_its_node_and_not_replaceable_leaves_the_service_at_one_replica_and_says_why(
        cluster, teams, user, catalog, refused):
    """No free node (another job holds the third one), or the replacement budget spent (``max_retries`` 0): the
    slot is released, the other replica serves on alone, and the refusal is kept and shown as a scale-up's."""
    emulator, row = cluster
    if refused == "capacity":
        serving(teams, user, catalog, emulator, row, replicas=1)  # holds one of the three nodes
    attempt = serving(teams, user, catalog, emulator, row, replicas=2, max_retries=0 if refused == "retries" else 1)
    kept_node, gone = attempt.placement["nodes"]
    kept = deployment_named(emulator, attempt, 0)
    emulator.delete_node(gone)
    reconcile_cluster(row)
    autoscale()
    autoscale()  # tried again: the refusal is said once
    left = load(attempt.pk)
    job = Job.objects.get(pk=attempt.job_id)
    assert left.placement["nodes"] == [kept_node] and left.placement["slots"] == [0] and left.gpus == 8
    assert job.replicas == 1 and left.ended_at is None
    assert [d["metadata"]["uid"] for d in live_deployments(emulator, attempt)] == [kept["metadata"]["uid"]]
    refusal = serving_status(job)["autoscaling"]["refusal"]
    assert refusal["reason"] == refused and refusal["replicas"] == 1
    (event,) = JobEvent.objects.filter(job_id=job.pk, kind="scale_refused")
    assert event.data["reason"] == refused
    assert not JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_replaced").exists()
    emulator.step()
    reconcile_cluster(row)
    assert state(attempt) == S.RUNNING


def test_a_fixed_size_service_replaces_its_lost_replica_once_room_comes_back(cluster, teams, user, catalog):
    """Without autoscaling nothing else would ask for the replica again: the serving pass tries the replacement at
    every pass, refused (said once) while another job holds the only free node, admitted on that node once the
    other job is cancelled."""
    emulator, row = cluster
    other = serving(teams, user, catalog, emulator, row, replicas=1)
    attempt = serving(teams, user, catalog, emulator, row, replicas=2, max_retries=1, autoscaled=False)
    kept_node, gone = attempt.placement["nodes"]
    (freed,) = other.placement["nodes"]
    emulator.delete_node(gone)
    reconcile_cluster(row)
    autoscale()
    autoscale()
    job = Job.objects.get(pk=attempt.job_id)
    assert job.replicas == 1 and load(attempt.pk).placement["nodes"] == [kept_node]
    (refused,) = JobEvent.objects.filter(job_id=job.pk, kind="scale_refused")
    assert refused.data["reason"] == "capacity"

    cancel_job(Job.objects.get(pk=other.job_id))
    finish_cancel(other.job_id)
    emulator.step()
    finish_cancel(other.job_id)
    assert state(other) == S.CANCELLED
    autoscale()
    replaced = load(attempt.pk)
    assert replaced.placement["nodes"] == [kept_node, freed] and replaced.gpus == 16
    assert Job.objects.get(pk=job.pk).replicas == 2
    (event,) = JobEvent.objects.filter(attempt_id=attempt.pk, kind="replica_replaced")
    assert (event.data["lost_nodes"], event.data["nodes"]) == ([gone], [freed])
    assert hostnames(deployment_named(emulator, attempt, 2)) == [freed]
    emulator.step()
    reconcile_cluster(row)
    assert state(attempt) == S.RUNNING
    assert {k: [p["spec"]["nodeName"] for p in v] for k, v in replica_pods(emulator, attempt).items()} == {
        "0": [kept_node], "2": [freed]}


def test_the_attempt_ends_lost_with_its_nodes_only_when_no_replica_is_left(cluster, teams, user, catalog):
    """Both replicas' nodes gone: no replica serves, so the attempt is lost ``NodeLost`` naming both nodes and the
    job is placed again, as any attempt lost with its node."""
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row, replicas=2, max_retries=1)
    booked = attempt.placement["nodes"]
    for name in booked:
        emulator.delete_node(name)
    reconcile_cluster(row)
    ended = load(attempt.pk)
    assert ended.ended_at is not None and ended.end_reason == "NodeLost" and sorted(ended.bad_nodes) == sorted(booked)
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


class ReplicaServers:
    """The servers of a serving attempt's emulated replicas: each ready pod reports its counters on its serving port
    at ``/metrics`` (the names ``examples/serve.py`` serves), under a load the test sets, spread evenly over them."""

    def __init__(self, emulator, attempt: JobAttempt):
        self.emulator, self.attempt = emulator, attempt
        self.totals: dict[str, list[float]] = {}  # pod name -> [requests, request-seconds in flight]

    def ready(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.emulator.pods(self.attempt.pk)
                      if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))

    def report(self, at: float, mean: float, now: float, seconds: float = 15.0) -> list[str]:
        """The interval of ``seconds`` up to ``at`` (Unix seconds) had ``mean`` requests in flight on average over
        all ready replicas (each served its share for the whole interval, as many requests as request-seconds) and
        ``now`` are in flight at ``at``; the pods that report, by name."""
        names = self.ready()
        for name in names:
            totals = self.totals.setdefault(name, [0.0, 0.0])
            totals[0] += mean / len(names) * seconds
            totals[1] += mean / len(names) * seconds
            self.emulator.serve_metrics(name, server_metrics(totals[0], now / len(names), totals[1], at), port=8000)
        return names


def server_metrics(requests: float, in_flight: float, in_flight_seconds: float, clock: float) -> str:
    """A replica server's ``/metrics`` body, written out here in the Prometheus text format."""
    return (f"# TYPE controlplane_server_requests counter\ncontrolplane_server_requests_total {requests}\n"
            f"# TYPE controlplane_server_in_flight gauge\ncontrolplane_server_in_flight {in_flight}\n"
            f"# TYPE controlplane_server_in_flight_seconds counter\n"
            f"controlplane_server_in_flight_seconds_total {in_flight_seconds}\n"
            f"# TYPE controlplane_server_clock_seconds gauge\ncontrolplane_server_clock_seconds {clock}\n")


def hpa_recommendation(current: int, metric: float, target: float) -> int:
    """The HorizontalPodAutoscaler's formula, written out here: ceil(current x metric / target), unchanged within
    a tolerance of 0.1 of the target (kubernetes.io, Horizontal Pod Autoscaling, Algorithm details)."""
    ratio = metric / target
    return current if abs(ratio - 1) <= 0.1 else math.ceil(round(current * ratio, 9))


def test_the_autoscaler_reads_the_replicas_counters_and_scales_1_3_1_by_the_hpa_rule(cluster, teams, user, catalog):
    emulator, row = cluster
    scaling = {"min_replicas": 1, "max_replicas": 3, "target_in_flight_per_replica": 4, "scale_up_delay_seconds": 0,
               "scale_down_delay_seconds": 30}
    attempt = serving(teams, user, catalog, emulator, row, scaling=scaling)
    servers = ReplicaServers(emulator, attempt)
    clock = timezone.now()
    history: list[tuple[dt.datetime, int]] = []
    previous: list[str] = []

    def step(mean: float, now: float) -> dict:
        """The replicas report an interval of ``mean`` in flight and ``now`` at its end; one pass 15 s later; its
        decision checked against the rule computed here from what they reported."""
        nonlocal clock, previous
        clock += dt.timedelta(seconds=15)
        reporting = servers.report(clock.timestamp(), mean, now)
        current = Job.objects.get(pk=attempt.job_id).replicas
        assert len(reporting) == current
        Cluster.objects.filter(pk=row.pk).update(last_contact_at=clock)  # the cluster answered
        [result] = autoscale(clock)
        assert result["current"] == current, result
        # the sums went back (a replica left) or there is no earlier reading: the requests in flight now; else the
        # mean over the interval, from the increase of the summed integral over the clock's
        metric = now if not previous or not set(previous) <= set(reporting) else mean
        assert result["metric_per_replica"] == pytest.approx(metric / current)
        expected = hpa_recommendation(current, metric / current, 4)
        assert result["recommended"] == expected
        window = [n for at, n in history if at > clock - dt.timedelta(seconds=30)] + [expected]
        assert result["desired"] == max(1, min(3, min(max(current, expected), max(window)))), (result, history)
        history.append((clock, expected))
        previous = reporting
        attempt_now = load(attempt.pk)
        assert len(attempt_now.runner_state["replicas"]) == result["replicas"] == Job.objects.get(
            pk=attempt.job_id).replicas
        return result

    assert step(2, 2)["replicas"] == 1  # the first reading: 2 in flight, half the target
    assert step(12, 12)["replicas"] == 3  # 12 in flight on one replica: ceil(1 x 12 / 4) = 3
    booked = load(attempt.pk).placement["nodes"]
    assert len(booked) == 3 and [hostnames(d) for d in live_deployments(emulator, attempt)] == [[n] for n in booked]
    assert step(12, 12)["replicas"] == 3  # 4 per replica: the target
    assert step(2, 2)["replicas"] == 3  # recommends 1, but 3 was recommended within the 30 s window
    assert step(2, 2)["replicas"] == 1  # the window passed: down to 1
    assert [d["metadata"]["name"] for d in live_deployments(emulator, attempt)] == [f"{attempt.object_name}-0"]
    assert step(2, 3)["replicas"] == 1  # the sums went back: the 3 in flight now, on one replica
    assert [e.data["replicas"] for e in JobEvent.objects.filter(job_id=attempt.job_id, kind="scale")
            .order_by("id")] == [2, 3, 1]


def test_a_replica_that_does_not_answer_is_left_out_of_the_sum_and_said_so(cluster, teams, user, catalog, caplog):
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row)
    backend = backend_for(attempt.cluster)
    now = timezone.now()
    assert add_replica(attempt.job_id, now, {"desired": 2}) is None
    assert apply_replicas(backend, load(attempt.pk), 2)
    first, second = ReplicaServers(emulator, attempt).ready()
    emulator.serve_metrics(first, server_metrics(10, 1, 7.5, 1000.0), port=8000)
    emulator.serve_metrics(second, server_metrics(4, 2, 2.5, 1001.0), port=8000)
    reading = parse_reading(backend.endpoint_load(load(attempt.pk)))
    assert (reading.requests, reading.in_flight, reading.in_flight_seconds, reading.clock) == (14, 3, 10, 1001)

    emulator.stop_serving(second)  # its server stopped listening: the API server's proxy answers 503
    with caplog.at_level(logging.WARNING, logger="runners.kubernetes.runner"):
        text = backend.endpoint_load(load(attempt.pk))
    reading = parse_reading(text)
    assert (reading.requests, reading.in_flight, reading.in_flight_seconds, reading.clock) == (10, 1, 7.5, 1000)
    assert "controlplane_endpoint_ready_replicas 1.0" in text and "controlplane_endpoint_replicas 2.0" in text
    assert second in caplog.text and "left out" in caplog.text

    emulator.serve_metrics(second, server_metrics(4, 2, 2.5, 1001.0), port=8000)
    slow = emulator.hold("GET", f"/pods/{second}")  # its node does not answer the API server in time
    try:
        reading = parse_reading(backend.endpoint_load(load(attempt.pk)))
    finally:
        slow.set()
    assert (reading.requests, reading.in_flight, reading.in_flight_seconds, reading.clock) == (10, 1, 7.5, 1000)

    emulator.serve_metrics(second, "# a server that reports no counters\n", port=8000)
    emulator.stop_serving(first)
    assert backend.endpoint_load(load(attempt.pk)) is None  # none answered with counters: no reading


#: The bounds of the latency histogram the replicas and the endpoint show (seconds), written out here.
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0, 120.0, 300.0)


def figure_metrics(latencies: list[float], errors: int, tokens: int, clock: float) -> str:
    """A replica server's ``/metrics`` body with its figures: it answered ``latencies`` (seconds, one a request),
    ``errors`` of them with a 5xx, ``tokens`` generated; cumulative buckets counted here from the latencies."""
    buckets = "".join(f'controlplane_server_request_duration_seconds_bucket{{le="{le}"}} '
                      f"{sum(1 for s in latencies if s <= le)}\n" for le in BOUNDS)
    return (server_metrics(len(latencies), 0, sum(latencies), clock)
            + f"# TYPE controlplane_server_errors counter\ncontrolplane_server_errors_total {errors}\n"
            f"# TYPE controlplane_server_generated_tokens counter\ncontrolplane_server_generated_tokens_total {tokens}\n"
            "# TYPE controlplane_server_request_duration_seconds histogram\n" + buckets
            + f'controlplane_server_request_duration_seconds_bucket{{le="+Inf"}} {len(latencies)}\n'
            f"controlplane_server_request_duration_seconds_sum {sum(latencies)}\n"
            f"controlplane_server_request_duration_seconds_count {len(latencies)}\n")


def quantile(q: float, latencies: list[float]) -> float:
    """Prometheus' ``histogram_quantile`` of ``latencies`` bucketed by ``BOUNDS``, written out here: the rank
    ``q`` x count falls in the first bucket whose cumulative count reaches it, and is placed linearly between the
    bucket's lower and upper bound by how far into the bucket's count it is."""
    rank = q * len(latencies)
    lower, below = 0.0, 0
    for upper in BOUNDS:
        count = sum(1 for s in latencies if s <= upper)
        if count >= rank:
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return BOUNDS[-1]


def test_two_replicas_counters_are_summed_into_the_job_s_figures(cluster, teams, user, catalog, owner):
    emulator, row = cluster
    scaling = {"min_replicas": 2, "max_replicas": 2, "target_in_flight_per_replica": 4}
    attempt = serving(teams, user, catalog, emulator, row, scaling=scaling)
    backend = backend_for(attempt.cluster)
    clock = timezone.now()
    assert add_replica(attempt.job_id, clock, {"desired": 2}) is None
    assert apply_replicas(backend, load(attempt.pk), 2)
    first, second = ReplicaServers(emulator, attempt).ready()
    fed = {first: [0.004, 0.02, 0.02, 0.3, 0.6, 1.5, 1.5, 0.09], second: [0.03, 0.03, 0.08, 0.2, 8.0]}
    errors, tokens = {first: 1, second: 2}, {first: 512, second: 320}
    for more in ({first: [0.7, 0.7, 0.012], second: [0.04, 3.0, 0.3, 0.3]}, {first: [0.06], second: [20.0, 0.2]}):
        for name in (first, second):
            emulator.serve_metrics(name, figure_metrics(fed[name], errors[name], tokens[name], clock.timestamp()),
                                   port=8000)
        clock += dt.timedelta(seconds=15)
        Cluster.objects.filter(pk=row.pk).update(last_contact_at=clock)
        [result] = autoscale(clock)
        assert "error" not in result, result
        for name in (first, second):  # served more before the next pass
            fed[name] += more[name]
            errors[name] += 1
            tokens[name] += 64

    accrue_attempt(attempt.pk, clock)  # the ledger up to the last pass: the figures' window ends there
    figures = owner.client.get(f"/api/v1/jobs/{attempt.job_id}/").json()["serving"]["figures"]
    answered = [s for name in (first, second) for s in fed[name][:-len(more[name])]]  # what the last pass read
    assert figures["requests"] == len(answered) == 8 + 5 + 3 + 4
    assert figures["errors"] == 1 + 2 + 2 and figures["tokens"] == 512 + 320 + 2 * 64
    assert figures["latency_p50_ms"] == pytest.approx(1000 * quantile(0.5, answered), abs=1e-3)
    assert figures["latency_p99_ms"] == pytest.approx(1000 * quantile(0.99, answered), abs=1e-3)
    assert figures["error_rate_percent"] == pytest.approx(100 * 5 / 20, abs=1e-4)

    def last_sample(served: dict[str, tuple[list[float], int, int]]) -> ServingSample:
        """The replicas in ``served`` report ``(latencies, errors, tokens)``, the others do not answer; one pass."""
        nonlocal clock
        for name in (first, second):
            if name in served:
                emulator.serve_metrics(name, figure_metrics(*served[name], clock.timestamp()), port=8000)
            else:
                emulator.stop_serving(name)
        clock += dt.timedelta(seconds=15)
        Cluster.objects.filter(pk=row.pk).update(last_contact_at=clock)
        autoscale(clock)
        return ServingSample.objects.filter(job_id=attempt.job_id).latest("at")

    # the second replica does not answer (as one that left): the sums go down, yet the first's increase alone is
    # what was served (its 1 request not read yet and 2 more), not its whole count again as a reset of the sum
    fed[first] += [0.5, 0.5]
    left = last_sample({first: (fed[first], errors[first], tokens[first])})
    assert (left.requests, left.errors, left.tokens) == (3, 1, 64)
    assert left.latency_buckets["0.1"] == 1 and left.latency_buckets["0.5"] == left.latency_buckets["+Inf"] == 3
    # it answers again: what it served since it was last read (2 requests, 1 error, 64 tokens), not its whole count
    back = last_sample({first: (fed[first], errors[first], tokens[first]),
                        second: (fed[second], errors[second], tokens[second])})
    assert (back.requests, back.errors, back.tokens) == (2, 1, 64)
    assert back.latency_buckets["0.25"] == 1 and back.latency_buckets["30.0"] == back.latency_buckets["+Inf"] == 2
    # the first restarts: its counters begin again, and what it served since is counted from 0
    restarted = last_sample({first: ([0.02, 9.0], 1, 5)})
    assert (restarted.requests, restarted.errors, restarted.tokens) == (2, 1, 5)
    assert restarted.latency_buckets["0.025"] == 1 and restarted.latency_buckets["10.0"] == 2
