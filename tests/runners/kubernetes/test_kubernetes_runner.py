"""The kubernetes backend over HTTP against three kmock emulators (aws, gcp, azure) with a test-side kubelet:
dispatch, end reasons, recovery, outages, cancels, credentials, logs, pool discovery and dispatch errors.

State changes go through ``jobs.scheduling.passes.try_admit``, the ``dispatch_attempt``
task body and ``jobs.reconcile.reconcile_cluster``, called directly (on-commit
callbacks do not run inside these tests' transactions). Every object the
backend sends is validated against the Kubernetes 1.33 schema.
"""

from __future__ import annotations

import logging

import pytest
import time_machine
import yaml
from django.db import connection
from django.utils import timezone

from jobs.lifecycle import cancel_job, finish_cancel
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_all, reconcile_cluster
from jobs.scheduling.passes import try_admit
from jobs.tasks import dispatch_attempt
from runners.base import PermanentDispatchError, backend_for
from runners.models import Cluster, NodePool
from tests.support.kubernetes import Kubelet

from .steps import kubelet, load, start, state, validate, watch_fail_past_the_grace

S = JobState


# --- dispatch ------------------------------------------------------------------------------------------------


def test_it_dispatches_with_the_checkpoint_claim_of_the_setting(emulated_clusters, admitted, settings):
    settings.K8S_CHECKPOINT_CLAIM = "team-checkpoints"
    attempt = admitted(nodes=2)
    assert dispatch_attempt(attempt.pk) == "dispatched"
    job = kubelet(emulated_clusters, attempt).job(attempt.pk)
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "team-checkpoints"}}]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/checkpoints", "subPath": f"job-{attempt.job_id}"}
    ]


# --- placement, dispatch, end reasons -------------------------------------------------------------------------


def test_it_runs_on_the_cheapest_cluster_then_within_constraints(emulated_clusters, admitted):
    emulators, clusters = emulated_clusters
    attempt = admitted()
    assert attempt.cluster.name == "gcp-usc1"
    k, job, pods = start(emulated_clusters, attempt)
    assert job["metadata"]["namespace"] == "cp-alpha" and job["metadata"]["name"] == attempt.object_name
    assert Kubelet(emulators.url("aws-use1")).jobs() == []  # nothing went anywhere else
    k.terminate(pods[0], 0)
    k.finish_job(job, "Complete")
    reconcile_cluster(attempt.cluster)
    assert state(attempt) == S.SUCCEEDED
    assert load(attempt.pk).end_reason == "Succeeded"

    assert admitted(placement={"providers": ["aws", "azure"]}).cluster.name == "aws-use1"
    assert admitted(placement={"regions": ["eastus"]}).cluster.name == "azure-eastus"


def test_it_sends_the_bearer_token_of_each_cluster(emulated_clusters, admitted):
    emulators, _ = emulated_clusters
    attempt = admitted()
    dispatch_attempt(attempt.pk)
    headers = [r.headers.get("Authorization") for r in emulators.requests("gcp-usc1")]
    assert headers and set(headers) == {"Bearer token-of-gcp-usc1"}


def authorization_of_a_dispatch(emulators, admitted) -> set[str | None]:
    """The Authorization headers of the requests that dispatching one newly admitted job sends to gcp-usc1."""
    seen = len(emulators.requests("gcp-usc1"))
    assert dispatch_attempt(admitted().pk) == "dispatched"
    return {r.headers.get("Authorization") for r in emulators.requests("gcp-usc1")[seen:]}


def test_a_rotated_token_is_sent_by_the_next_dispatch(emulated_clusters, admitted):
    """Dispatch reads the cluster from a per-process cache (``jobs.tasks.PLACEMENT_ROWS``); saving the cluster clears it."""
    emulators, clusters = emulated_clusters
    dispatch_attempt(admitted().pk)  # caches the cluster row and its client
    cluster = Cluster.objects.get(pk=clusters["gcp-usc1"].pk)
    cluster.api_token = "rotated-token"
    cluster.save()
    headers = authorization_of_a_dispatch(emulators, admitted)
    assert headers == {"Bearer rotated-token"}


def test_the_token_of_a_stored_kubeconfig_is_sent_by_dispatch(emulated_clusters, admitted):
    """A cluster reached through its kubeconfig (no stored token): the kubeconfig user's token goes on every
    request of the dispatch, as the client's own request building put it there."""
    emulators, clusters = emulated_clusters
    cluster = Cluster.objects.get(pk=clusters["gcp-usc1"].pk)
    cluster.kubeconfig = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "bench",
            "clusters": [{"name": "gcp", "cluster": {"server": emulators.url("gcp-usc1")}}],
            "users": [{"name": "dispatcher", "user": {"token": "token-from-kubeconfig"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "gcp", "user": "dispatcher"}}],
        }
    )
    cluster.api_token = ""
    cluster.save()
    headers = authorization_of_a_dispatch(emulators, admitted)
    assert headers == {"Bearer token-from-kubeconfig"}


def test_it_redispatches_idempotently_and_refuses_objects_of_another_attempt(emulated_clusters, admitted):
    attempt = admitted(nodes=2)
    backend = backend_for(attempt.cluster)
    first = backend.dispatch(attempt)
    second = backend.dispatch(attempt)  # every create answers 409 AlreadyExists: created before
    assert (
        first
        == second
        == {
            "namespace": "cp-alpha",
            "objects": [["Service", attempt.object_name], ["Job", attempt.object_name]],
            "endpoint": None,
            "metrics_port": 9464,
        }
    )
    k = kubelet(emulated_clusters, attempt)
    assert len(k.jobs()) == 1 and len(k.services()) == 1
    assert dispatch_attempt(attempt.pk) == "dispatched"

    other = admitted()
    other.object_name = attempt.object_name  # a name collision with an object another attempt owns
    with pytest.raises(PermanentDispatchError, match="belongs to another attempt"):
        backend.dispatch(other)


def _fail_oom(k, job, pods):
    k.terminate(pods[0], 137, "OOMKilled")
    k.finish_job(job, "Failed", "BackoffLimitExceeded")


def _fail_exit(k, job, pods):
    k.terminate(pods[0], 3, "Error")
    k.finish_job(job, "Failed", "BackoffLimitExceeded")


def _fail_deadline(k, job, pods):
    k.finish_job(job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")


@pytest.mark.parametrize(
    "fail,reason,code",
    [(_fail_oom, "OOMKilled", 137), (_fail_exit, "Failed", 3), (_fail_deadline, "DeadlineExceeded", None)],
)
def test_it_reads_the_end_reason_from_the_pods(emulated_clusters, admitted, fail, reason, code):
    attempt = admitted()
    k, job, pods = start(emulated_clusters, attempt)
    fail(k, job, pods)
    reconcile_cluster(attempt.cluster)
    assert state(attempt) == S.FAILED
    ended = load(attempt.pk)
    assert (ended.end_reason, ended.exit_code) == (reason, code)


def test_it_fails_an_image_that_cannot_be_pulled_after_the_grace_period(emulated_clusters, admitted, settings):
    attempt = admitted()
    assert dispatch_attempt(attempt.pk) == "dispatched"
    k = kubelet(emulated_clusters, attempt)
    (pod,) = k.start_pods(k.job(attempt.pk), phase="Pending")
    k.patch_pod(
        pod,
        {
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
                }
            ]
        },
    )
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 3600
    reconcile_cluster(attempt.cluster)
    assert state(attempt) == S.STARTING  # a registry hiccup may heal: still waiting
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 0
    reconcile_cluster(attempt.cluster)
    assert state(attempt) == S.FAILED and load(attempt.pk).end_reason == "ImagePullBackOff"
    reconcile_cluster(attempt.cluster)  # the ended attempt's objects are orphans now
    k.gc()
    assert k.jobs() == [] and k.pods() == []


def test_it_recovers_a_spot_eviction_on_another_cluster(emulated_clusters, admitted, catalog):
    emulators, clusters = emulated_clusters
    spot = NodePool.objects.create(
        cluster=clusters["aws-use1"],
        name="h100-spot",
        accelerator=catalog["H100-80GB"],
        capacity_type="spot",
        nodes=2,
        gpus_per_node=8,
    )
    attempt = admitted(preemptible=True, max_retries=1)
    assert attempt.node_pool_id == spot.pk  # spot is the cheapest for a preemptible job
    k, job, pods = start(emulated_clusters, attempt)
    affinity = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert "karpenter.sh/capacity-type" in str(affinity)
    k.patch_pod(
        pods[0],
        {
            "phase": "Failed",
            "reason": "",
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": "spot instance reclaimed",
                }
            ],
        },
    )
    k.finish_job(job, "Failed", "PodFailurePolicy")
    reconcile_cluster(attempt.cluster)
    assert state(attempt) == S.RECOVERING
    assert load(attempt.pk).end_reason == "SpotReclaimed"  # a spot pool: counted by its cause (ADR 0018)
    NodePool.objects.filter(pk=spot.pk).update(nodes=0)  # the reclaimed spot node is gone from the pool
    assert try_admit(attempt.job_id) == "admitted"
    second = load(Job.objects.get(pk=attempt.job_id).current_attempt_id)
    assert second.number == 2 and second.cluster.name == "gcp-usc1"
    start(emulated_clusters, second)
    reconcile_cluster(attempt.cluster)  # the first attempt's objects are deleted as orphans
    k.gc()
    assert k.jobs() == [] and k.pods() == []


# --- cluster outages -----------------------------------------------------------------------------------------


def test_an_outage_shorter_than_the_grace_period_touches_nothing(emulated_clusters, admitted):
    emulators, clusters = emulated_clusters
    attempt = admitted()
    k, job, pods = start(emulated_clusters, attempt)
    emulators.stop("gcp-usc1")
    healths = []
    for _ in range(4):
        reconcile_cluster(attempt.cluster)
        healths.append(Cluster.objects.get(pk=attempt.cluster_id).health)
    assert healths == ["degraded", "degraded", "unreachable", "unreachable"]
    assert state(attempt) == S.RUNNING
    emulators.start("gcp-usc1")
    reconcile_cluster(attempt.cluster)
    cluster = Cluster.objects.get(pk=attempt.cluster_id)
    assert (cluster.health, cluster.consecutive_failures) == ("healthy", 0)
    assert state(attempt) == S.RUNNING and len(k.pods(attempt.pk)) == 1 and k.job(attempt.pk) is not None


def test_an_outage_longer_than_the_grace_period_recovers_elsewhere_and_cleans_up_on_return(emulated_clusters, admitted):
    emulators, clusters = emulated_clusters
    attempt = admitted(nodes=2, max_retries=1)
    k, job, pods = start(emulated_clusters, attempt)
    emulators.stop("gcp-usc1")
    with time_machine.travel(timezone.now()) as clock:
        for _ in range(3):
            reconcile_all()
            assert state(attempt) == S.RUNNING  # degraded, then unreachable but watched failing for seconds only
        watch_fail_past_the_grace(clock, reconcile_all, 600)
    assert state(attempt) == S.RECOVERING and load(attempt.pk).end_reason == "NodeLost"
    assert try_admit(attempt.job_id) == "admitted"
    second = load(Job.objects.get(pk=attempt.job_id).current_attempt_id)
    assert second.cluster.name == "aws-use1"  # gcp is unreachable; aws is the next cheapest
    start(emulated_clusters, second)
    emulators.start("gcp-usc1")
    reconcile_all()
    k.gc()
    assert k.jobs() == [] and k.services() == [] and k.pods() == []  # the job never runs twice
    assert Cluster.objects.get(pk=attempt.cluster_id).health == "healthy"
    assert state(second) == S.RUNNING


# --- cancel and orphans --------------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["admitted", "starting", "running"])
def test_it_cancels_in_every_state(emulated_clusters, admitted, when):
    attempt = admitted(kind="inference" if when == "running" else "training")
    k = kubelet(emulated_clusters, attempt)
    if when != "admitted":
        assert dispatch_attempt(attempt.pk) == "dispatched"
        for obj in k.deployments() + k.jobs() + k.services():
            validate(obj)
    if when == "running":
        for deployment in k.deployments():  # a Deployment per replica
            k.start_pods(deployment)
        reconcile_cluster(attempt.cluster)
        assert state(attempt) == S.RUNNING
    job = Job.objects.get(pk=attempt.job_id)
    cancel_job(job)
    assert state(attempt) == S.CANCELLING
    finish_cancel(job.pk)  # the Job/Deployment is deleted (Foreground); its pods are still there
    if when == "running":
        assert state(attempt) == S.CANCELLING
        k.gc()
        finish_cancel(job.pk)
    assert state(attempt) == S.CANCELLED
    assert k.jobs() == [] and k.deployments() == [] and k.services() == [] and k.pods() == []


def test_a_cancel_on_an_unreachable_cluster_ends_at_once_and_deletes_the_objects_on_return(emulated_clusters, admitted):
    emulators, _ = emulated_clusters
    attempt = admitted()
    k, job, pods = start(emulated_clusters, attempt)
    emulators.stop("gcp-usc1")
    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert state(attempt) == S.CANCELLING
    reconcile_all()
    assert state(attempt) == S.CANCELLED  # no waiting on a cluster that does not answer
    ended = load(attempt.pk)
    assert ended.ended_at is not None and ended.end_reason == "Cancelled"  # billing stops now
    event = Job.objects.get(pk=attempt.job_id).events.filter(to_state=S.CANCELLED).get()
    assert "deletion pending" in event.reason
    assert ended.deletion_pending_since is not None  # its pods may still run
    emulators.start("gcp-usc1")
    assert k.job(attempt.pk) is not None and len(k.pods(attempt.pk)) == 1  # kept while the cluster was away
    result = reconcile_cluster(attempt.cluster)  # the orphan cleanup retries the deletion
    assert result["orphans_deleted"] == 1
    assert load(attempt.pk).deletion_pending_since is not None  # the look found them: deleted, maybe not yet gone
    k.gc()
    assert k.jobs() == [] and k.services() == [] and k.pods() == []
    assert state(attempt) == S.CANCELLED
    reconcile_cluster(attempt.cluster)
    assert load(attempt.pk).deletion_pending_since is None  # a look found them gone


@pytest.mark.parametrize("full_list_seconds", [0, 3600], ids=["full LISTs", "watched changes"])
def test_objects_found_after_their_attempt_ended_are_pending_until_a_look_finds_them_gone(
        emulated_clusters, admitted, settings, full_list_seconds):
    settings.RECONCILE_FULL_LIST_SECONDS = full_list_seconds
    attempt = admitted()
    k, job, pods = start(emulated_clusters, attempt)
    other = admitted()
    start(emulated_clusters, other)  # a look: later ones may follow the changes since it
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now())  # e.g. ended by an operator
    assert reconcile_cluster(attempt.cluster)["orphans_deleted"] == 1
    assert load(attempt.pk).deletion_pending_since is not None and load(other.pk).deletion_pending_since is None
    reconcile_cluster(attempt.cluster)  # the deleted Job's pods have not been collected yet
    assert load(attempt.pk).deletion_pending_since is not None
    k.gc()
    reconcile_cluster(attempt.cluster)
    assert load(attempt.pk).deletion_pending_since is None


def test_it_cancels_a_recovering_job_without_a_live_attempt(emulated_clusters, admitted):
    attempt = admitted(max_retries=1)
    k, job, pods = start(emulated_clusters, attempt)
    k.patch_pod(pods[0], {"phase": "Failed", "reason": "Evicted", "message": "node low on memory"})
    reconcile_cluster(attempt.cluster)
    assert state(attempt) == S.RECOVERING and load(attempt.pk).end_reason == "Evicted"
    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert state(attempt) == S.CANCELLED
    reconcile_cluster(attempt.cluster)
    k.gc()
    assert k.jobs() == [] and k.pods() == []


def test_it_deletes_objects_no_live_attempt_owns(emulated_clusters, admitted):
    attempt = admitted()
    k, job, pods = start(emulated_clusters, attempt)
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now())  # e.g. ended by an operator
    result = reconcile_cluster(attempt.cluster)
    assert result["orphans_deleted"] == 1
    k.gc()
    assert k.jobs() == [] and k.pods() == []


# --- credentials ---------------------------------------------------------------------------------------------


def test_credentials_are_encrypted_write_only_and_never_logged(emulated_clusters, teams, caplog, admitted, staff):
    secret = "sup3r-s3cret-bearer-token"
    caplog.set_level(logging.DEBUG)
    answer = staff.client.post(
        "/api/v1/clusters/",
        {
            "name": "oci-fra",
            "provider": "oci",
            "region": "eu-frankfurt-1",
            "backend": "kubernetes",
            "api_endpoint": "https://k8s.example:6443",
            "api_token": secret,
            "ca_cert": "-----BEGIN CERTIFICATE-----",
        },
        format="json",
    )
    assert answer.status_code == 201, answer.content
    assert secret not in answer.content.decode() and "BEGIN CERTIFICATE" not in answer.content.decode()
    assert answer.json()["auth_configured"] is True
    cluster = Cluster.objects.get(name="oci-fra")
    assert cluster.api_token == secret and secret not in repr(cluster.api_token)
    with connection.cursor() as cursor:
        cursor.execute("SELECT api_token, ca_cert FROM runners_cluster WHERE name = 'oci-fra'")
        raw_token, raw_ca = cursor.fetchone()
    assert raw_token.startswith("fernet:") and secret not in raw_token and "BEGIN" not in raw_ca
    for path in ("/api/v1/clusters/", f"/api/v1/clusters/{cluster.pk}/"):
        body = staff.client.get(path).content.decode()
        assert secret not in body and "fernet:" not in body
    attempt = admitted()
    dispatch_attempt(attempt.pk)
    reconcile_all()
    assert secret not in caplog.text and "token-of-gcp-usc1" not in caplog.text


# --- logs and node pool discovery ----------------------------------------------------------------------------


def test_the_logs_endpoint_returns_the_tail_of_a_node_pod(emulated_clusters, admitted, owner):
    emulators, _ = emulated_clusters
    attempt = admitted(nodes=2)
    k, job, pods = start(emulated_clusters, attempt)
    second = next(p for p in pods if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    path = f"/api/v1/namespaces/cp-alpha/pods/{second['metadata']['name']}/log"

    async def serve_log():
        emulators.handlers["gcp-usc1"][f"get {path}"] << b"step 10 loss 2.1\nstep 20 loss 1.7\n"

    emulators.run(serve_log())
    answer = owner.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?node=1&tail=50")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"node": 1, "attempt": 1, "text": "step 10 loss 2.1\nstep 20 loss 1.7\n"}
    log_requests = [r for r in emulators.requests("gcp-usc1") if r.url.path == path]
    assert log_requests and log_requests[-1].params.get("tailLines") == "50"


def test_it_discovers_gpu_node_pools_with_free_gpus(emulated_clusters):
    emulators, clusters = emulated_clusters
    k = Kubelet(emulators.url("azure-eastus"))

    def node(name, product, spot, gpus):
        labels = {"nvidia.com/gpu.product": product}
        if spot:
            labels["kubernetes.azure.com/scalesetpriority"] = "spot"
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    for body in (
        node("n1", "NVIDIA-H100-80GB-HBM3", False, 8),
        node("n2", "NVIDIA-H100-80GB-HBM3", False, 8),
        node("n3", "NVIDIA-H100-80GB-HBM3", True, 8),
        node("cpu", "", False, 0),
    ):
        k._req("POST", "/api/v1/nodes", body)
    k._req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cp-x"}})
    k._req(
        "POST",
        "/api/v1/namespaces/cp-x/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "busy", "namespace": "cp-x"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
            "status": {"phase": "Running"},
        },
    )
    pools = backend_for(clusters["azure-eastus"]).discover(clusters["azure-eastus"])
    shapes = {(p.accelerator, p.capacity_type): (p.nodes, p.gpus_per_node, p.free_gpus) for p in pools}
    assert shapes == {("NVIDIA-H100-80GB-HBM3", "on-demand"): (2, 8, 13), ("NVIDIA-H100-80GB-HBM3", "spot"): (1, 8, 8)}


@pytest.mark.parametrize("status,outcome", [(422, "failed"), (403, "failed"), (429, "retry"), (503, "retry")])
def test_dispatch_errors_are_permanent_or_transient_by_status(emulated_clusters, admitted, status, outcome):
    import kmock

    from runners.base import TransientDispatchError

    emulators, _ = emulated_clusters
    attempt = admitted()

    async def refuse():
        emulators.handlers["gcp-usc1"]["post /apis/batch/v1/namespaces/cp-alpha/jobs"] << kmock.KubernetesError(
            status=status, reason="Refused", message=f"the server says {status}"
        )

    emulators.run(refuse())
    if outcome == "retry":
        with pytest.raises(TransientDispatchError, match=f"HTTP {status}"):
            backend_for(attempt.cluster).dispatch(attempt)
        assert state(attempt) == S.ADMITTED
    else:
        assert dispatch_attempt(attempt.pk) == "failed"
        ended = load(attempt.pk)
        assert state(attempt) == S.FAILED and ended.end_reason == "DispatchError"
        assert f"the server says {status}" in ended.message


def test_reconcile_of_attempts_that_stay_running_costs_a_constant_number_of_queries(
    emulated_clusters, admitted, settings
):
    """Attempts whose state does not change cost no query of their own: the pass's queries do not grow with N, on
    passes that LIST everything."""
    from django.test.utils import CaptureQueriesContext

    settings.RECONCILE_FULL_LIST_SECONDS = 0

    only_aws = {"clusters": ["aws-use1"]}

    def queries_of_a_steady_pass(count: int) -> int:
        for _ in range(count):
            start(emulated_clusters, admitted(placement=only_aws))
        cluster = Cluster.objects.get(name="aws-use1")
        reconcile_cluster(cluster)
        with CaptureQueriesContext(connection) as captured:
            result = reconcile_cluster(cluster)
        assert result["orphans_deleted"] == 0
        assert not Job.objects.filter(current_attempt__cluster=cluster).exclude(state=S.RUNNING).exists()
        return result["observed"], len(captured.captured_queries)

    few = queries_of_a_steady_pass(2)
    many = queries_of_a_steady_pass(6)  # 8 running in all
    assert (few[0], many[0]) == (2, 8)
    assert many[1] == few[1]


def test_dispatch_creates_a_team_namespace_once_per_cluster_client(emulated_clusters, admitted):
    """The namespace create (409 after the first) is skipped once the cluster's client saw the namespace exist."""
    emulators, _ = emulated_clusters
    only_aws = {"clusters": ["aws-use1"]}
    for _ in range(3):
        assert dispatch_attempt(admitted(placement=only_aws).pk) == "dispatched"
    assert emulators.fronts["aws-use1"].namespace_creates == 1
    assert list(emulators.fronts["aws-use1"].namespaces) == ["cp-alpha"]
    assert (
        len(kubelet(emulated_clusters, load(Job.objects.filter(state=S.STARTING).first().current_attempt_id)).jobs())
        == 3
    )


def test_dispatch_creates_the_namespace_again_when_it_was_deleted_behind_its_back(emulated_clusters, admitted):
    """The cached "namespace exists" is dropped when an object create answers 404; the namespace is created again."""
    emulators, _ = emulated_clusters
    only_aws = {"clusters": ["aws-use1"]}
    first = admitted(placement=only_aws)
    assert dispatch_attempt(first.pk) == "dispatched"
    k = kubelet(emulated_clusters, first)
    k._req("DELETE", "/api/v1/namespaces/cp-alpha")

    assert dispatch_attempt(admitted(placement=only_aws).pk) == "dispatched"

    assert emulators.fronts["aws-use1"].namespace_creates == 2
    assert "cp-alpha" in emulators.fronts["aws-use1"].namespaces and len(k.jobs()) == 2
