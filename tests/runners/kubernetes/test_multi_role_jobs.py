"""Multi-role jobs on a Kubernetes cluster (ADR 0039): a headless Service and an Indexed Job per role, or one JobSet
of them where the cluster serves ``jobset.x-k8s.io/v1alpha2``, pinned to the nodes admission booked for each role;
every pod told its role, its index, every role's pods' stable DNS names and its role's own rendezvous. The
attempt succeeds when the roles with completion succeed (the servers are then deleted), fails when any pod fails
(named by role and index, every role deleted), is lost when a pod is taken away, starts every role again by the
job's retries, is billed from the first role's creation until its last pod stopped, and a control plane that
restarts keeps a running attempt's objects. Every test runs on both kinds of cluster.

The cluster: ``gcp-usc1`` of ``live_clusters`` (``tests.support.clusters``: two Ready 8-GPU H100 nodes, emulated by
``ClusterEmulator``), its nodes synced so admission books node by node, its pods bound by the test kube-scheduler
(``tests.support.kube_scheduler.bind``: node affinity, anti-affinity and resources as Kubernetes documents them).
The job: a learner (1 pod x 2 GPUs, completion), two rollouts (1 GPU each, port 8000, servers) and a reward server
(1 pod x 1 GPU, port 9000); the spec has every role on the job's one accelerator, as ADR 0039 requires.
"""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal

import pytest

from jobs.lifecycle import cancel_job, dispatch, finish_cancel
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from runners.base import backend_for
from runners.kubernetes import client as kube_client
from runners.kubernetes.sync import sync_cluster
from runners.models import Cluster
from tests.support import kube_scheduler
from tests.support.clusters import ledger_gpu_seconds, load, state
from tests.support.factories import make_job_row

from .steps import validate

S = JobState
NOTHING = {"JobSet": [], "Job": [], "Service": [], "Pod": []}
ROLE_LABEL = "controlplane.io/role"
INDEX = "batch.kubernetes.io/job-completion-index"
LEARNER, ROLLOUT, REWARD = "learner", "rollout", "reward"


def role(command: str, *, pods: int = 1, gpus: int = 1, port: int | None = None, completion: bool = True,
         env: dict | None = None) -> dict:
    spec = {"image": f"registry.example/{command}:1", "command": ["python", f"{command}.py"], "args": ["--seed", "1"],
            "env": env or {}, "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": pods},
            "completion": completion}
    if port is not None:
        spec["port"] = port
    return spec


ROLES = {LEARNER: role("learn", gpus=2, env={"WHO": "learner"}),
         ROLLOUT: role("rollout", pods=2, port=8000, completion=False, env={"WHO": "rollout"}),
         REWARD: role("reward", port=9000, completion=False)}


@pytest.fixture(params=["jobs", "jobset"])
def grpo(request, live_clusters):
    """``(world, make)``: ``make(max_retries=0)`` admits the three-role job to gcp-usc1 (its nodes synced, its pods
    bound by the test kube-scheduler) and dispatches it, returning its attempt. Run twice: on a cluster without
    the JobSet API (a Job and a Service per role) and on one that serves it (one JobSet; the emulator's JobSet
    controller makes the child Jobs and the Service)."""
    world = live_clusters
    world.emulators["gcp-usc1"].bind = kube_scheduler.bind
    world.emulators["gcp-usc1"].jobset = request.param == "jobset"
    sync_cluster(world.clusters["gcp-usc1"])

    def make(max_retries: int = 0) -> JobAttempt:
        spec = {"roles": ROLES, "priority": "normal", "max_runtime_seconds": 3600, "preemptible": False,
                "placement": {"clusters": ["gcp-usc1"]}, "max_retries": max_retries}
        job = make_job_row(world.team, world.user, world.accelerator, name="grpo", kind="multi-role", spec=spec,
                           nodes=4, gpus_per_node=2, max_runtime=3600, max_retries=max_retries)
        assert try_admit(job.pk) == "admitted", Job.objects.get(pk=job.pk).queue_info
        attempt = load(Job.objects.get(pk=job.pk).current_attempt_id)
        assert dispatch(attempt.pk) == "dispatched"
        return load(attempt.pk)
    return world, make


def parse_time(value: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp the cluster wrote."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def in_jobset(world) -> bool:
    """Whether gcp-usc1 serves the JobSet API in this run."""
    return world.emulators["gcp-usc1"].jobset


def names(world, attempt: JobAttempt, role_name: str) -> tuple[str, str]:
    """``(Job, Service)`` names of ``role_name``'s pods: ``<attempt>-<role>`` both; in a JobSet the child Job
    ``<jobset>-<replicated job>-0`` under the JobSet's Service, named as the JobSet (JobSet's naming rules)."""
    if in_jobset(world):
        return f"{attempt.object_name}-{role_name}-0", attempt.object_name
    return f"{attempt.object_name}-{role_name}", f"{attempt.object_name}-{role_name}"


def objects(emulator, attempt: JobAttempt) -> dict[str, list[str]]:
    """The names of the attempt's JobSets, Jobs, Services and pods on ``emulator`` (sorted): those labelled with
    the attempt, and the Service a JobSet's controller made (named as the JobSet, labelled by JobSet alone)."""
    def of(kind: str) -> list[dict]:
        if kind == "Pod":
            return emulator.pods(attempt.pk)
        found = emulator.objects(kind, attempt.pk)
        if kind == "Service":
            found += [o for o in emulator.objects(kind) if o["metadata"]["name"] == attempt.object_name]
        return found
    return {kind: sorted(o["metadata"]["name"] for o in of(kind)) for kind in ("JobSet", "Job", "Service", "Pod")}


def pods_of(emulator, attempt: JobAttempt, name: str) -> list[dict]:
    """The pods of role ``name``, by completion index."""
    return sorted((p for p in emulator.pods(attempt.pk) if p["metadata"]["labels"].get(ROLE_LABEL) == name),
                  key=lambda p: int(p["metadata"]["annotations"][INDEX]))


def resolved_env(pod: dict) -> dict[str, str]:
    """The main container's environment as the kubelet makes it: literal values, and ``fieldRef`` to one of the
    pod's annotations (the downward API) read from the pod."""
    env = {}
    for var in pod["spec"]["containers"][0]["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        path = var["valueFrom"]["fieldRef"]["fieldPath"]
        assert path.startswith("metadata.annotations['") and path.endswith("']"), path
        env[var["name"]] = pod["metadata"]["annotations"][path[len("metadata.annotations['"):-2]]
    return env


def test_each_role_is_an_indexed_job_with_a_headless_service_on_its_booked_nodes_told_where_the_others_are(grpo):
    world, make = grpo
    attempt = make()
    gcp = world.emulators["gcp-usc1"]
    booked = attempt.placement["roles"]

    jobs = {j["metadata"]["labels"][ROLE_LABEL]: j for j in gcp.objects("Job", attempt.pk)}
    services = {s["metadata"]["name"]: s for s in gcp.objects("Service")}
    assert set(jobs) == {LEARNER, ROLLOUT, REWARD}
    for obj in [*jobs.values(), *services.values()]:
        validate({k: v for k, v in obj.items() if k != "status"})
    namespace = jobs[LEARNER]["metadata"]["namespace"]
    if in_jobset(world):
        (jobset,) = gcp.objects("JobSet", attempt.pk)
        assert jobset["metadata"]["name"] == attempt.object_name
        assert jobset["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": attempt.object_name,
                                             "publishNotReadyAddresses": True}
        assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}  # the platform owns retries
        assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": [LEARNER]}
        for replicated in jobset["spec"]["replicatedJobs"]:
            assert replicated["replicas"] == 1
            validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x", **replicated["template"][
                "metadata"]}, "spec": replicated["template"]["spec"]})
    else:
        assert gcp.objects("JobSet") == []

    def dns(role_name: str, index: int) -> str:  # <job>-<index>.<service>.<namespace>.svc
        job, service = names(world, attempt, role_name)
        return f"{job}-{index}.{service}.{namespace}.svc"

    # the spec's order is the order of the stored spec's roles (what the local runner and the job's answer use too)
    name_order = sorted(ROLES)  # the roles in name order, on every database (jobs.models.roles_in_order)
    rollouts = f"{dns(ROLLOUT, 0)}:8000,{dns(ROLLOUT, 1)}:8000"
    reward = f"{dns(REWARD, 0)}:9000"
    for role_name, spec in ROLES.items():
        job_name, service_name = names(world, attempt, role_name)
        job, service = jobs[role_name], services[service_name]
        pods = spec["resources"]["nodes"]
        assert job["metadata"]["name"] == job_name
        assert job["metadata"]["labels"]["controlplane.io/attempt-uid"] == str(attempt.uid)
        assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"],
                job["spec"]["backoffLimit"]) == ("Indexed", pods, pods, 0)
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert (container["image"], container["command"], container["args"]) == (
            spec["image"], spec["command"], spec["args"])
        assert container["resources"]["limits"]["nvidia.com/gpu"] == str(spec["resources"]["gpus_per_node"])

        running = pods_of(gcp, attempt, role_name)
        assert len(running) == pods and all(p["status"]["phase"] == "Running" for p in running)
        # each pod on a node admission booked for its role, one pod of the role per node
        assert sorted(p["spec"]["nodeName"] for p in running) == sorted(booked[role_name]["nodes"])
        # the Service the pods are named under selects them (a role's own selects no other role's pods)
        selected = {p["metadata"]["name"] for p in gcp.pods(attempt.pk)
                    if all(p["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())}
        assert {p["metadata"]["name"] for p in running} <= selected
        assert in_jobset(world) or selected == {p["metadata"]["name"] for p in running}
        for index, pod in enumerate(running):
            assert f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}.{namespace}.svc" == dns(role_name, index)
            env = resolved_env(pod)
            assert (env["CONTROLPLANE_ROLE"], env["CONTROLPLANE_ROLE_INDEX"]) == (role_name, str(index))
            assert env["CONTROLPLANE_ROLES"] == ",".join(name_order) == "learner,reward,rollout"
            assert env["CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES"] == rollouts
            assert env["CONTROLPLANE_ROLE_REWARD_ADDRESSES"] == reward
            assert "CONTROLPLANE_ROLE_LEARNER_ADDRESSES" not in env  # the learner declares no port
            assert env.get("PORT") == (str(spec["port"]) if "port" in spec else None)
            assert env.get("WHO") == spec["env"].get("WHO")
            # each role is its own process group: pod 0 of the role is its master, its pods its world
            assert (env["MASTER_ADDR"], env["WORLD_SIZE"], env["RANK"]) == (
                dns(role_name, 0) if pods > 1 else "127.0.0.1", str(pods), str(index))
            assert env["CONTROLPLANE_ATTEMPT"] == "1"


def test_the_job_succeeds_when_the_learner_does_and_the_servers_are_deleted(grpo):
    world, make = grpo
    attempt = make()
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RUNNING
    gcp.finish_pod(pods_of(gcp, attempt, ROLLOUT)[0]["metadata"]["name"], 0)  # a server exiting 0 ends nothing
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RUNNING

    gcp.finish_pod(pods_of(gcp, attempt, LEARNER)[0]["metadata"]["name"], 0)
    world.reconcile("gcp-usc1")

    assert state(attempt) == S.SUCCEEDED
    assert load(attempt.pk).end_reason == JobAttempt.EndReason.SUCCEEDED
    assert objects(gcp, attempt) == NOTHING
    deleted = {(kind, labels.get(ROLE_LABEL)) for _, kind, _, labels in gcp.deletions}
    if in_jobset(world):  # the JobSet, and with it what its controller made
        assert ("JobSet", None) in deleted
    else:
        assert {("Job", ROLLOUT), ("Job", REWARD), ("Service", ROLLOUT), ("Service", REWARD)} <= deleted


def test_a_failed_rollout_pod_fails_the_job_naming_its_role_and_index_and_every_role_is_deleted(grpo):
    world, make = grpo
    attempt = make()
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")

    gcp.finish_pod(pods_of(gcp, attempt, ROLLOUT)[1]["metadata"]["name"], 3)
    world.reconcile("gcp-usc1")

    ended = load(attempt.pk)
    assert state(attempt) == S.FAILED
    assert (ended.end_reason, ended.exit_code) == (JobAttempt.EndReason.FAILED, 3)
    assert ended.message.startswith("role rollout pod 1 exited with code 3")
    assert objects(gcp, attempt) == NOTHING


def test_a_retry_makes_a_new_attempt_of_every_role(grpo):
    world, make = grpo
    first = make(max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")
    gcp.finish_pod(pods_of(gcp, first, LEARNER)[0]["metadata"]["name"], 1)
    world.reconcile("gcp-usc1")
    assert state(first) == S.RECOVERING
    assert objects(gcp, first) == NOTHING

    assert try_admit(first.job_id) == "admitted"
    second = load(Job.objects.get(pk=first.job_id).current_attempt_id)
    assert dispatch(second.pk) == "dispatched"

    assert second.number == 2 and second.object_name != first.object_name
    made = objects(gcp, second)
    assert made["Job"] == sorted(names(world, second, r)[0] for r in ROLES)
    assert made["Service"] == sorted({names(world, second, r)[1] for r in ROLES})
    assert made["JobSet"] == ([second.object_name] if in_jobset(world) else [])
    assert len(made["Pod"]) == 4
    assert {resolved_env(p)["CONTROLPLANE_ATTEMPT"] for p in gcp.pods(second.pk)} == {"2"}
    world.reconcile("gcp-usc1")
    gcp.finish_pod(pods_of(gcp, second, LEARNER)[0]["metadata"]["name"], 0)
    world.reconcile("gcp-usc1")
    assert state(second) == S.SUCCEEDED


def test_billing_runs_from_the_first_roles_creation_until_the_last_pod_stopped(grpo):
    """Cancelled while every role runs. The ledger bills the attempt as one line, all its GPUs from the creation
    of its first object that holds GPUs (the first role's Job, or the JobSet) until its last pod stopped; the
    cluster counts each pod from its own creation to its own stop. They differ by exactly the GPU-seconds
    between the first creation and each pod's creation, and between each pod's stop and the last one (the
    roles are created and deleted one after the other, milliseconds apart), worked out from the cluster's own
    times."""
    world, make = grpo
    attempt = make()
    gcp = world.emulators["gcp-usc1"]
    owners = gcp.objects("JobSet", attempt.pk) + gcp.objects("Job", attempt.pk)
    first = min(parse_time(o["metadata"]["creationTimestamp"]) for o in owners)
    world.reconcile("gcp-usc1")
    time.sleep(1.0)

    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert finish_cancel(attempt.job_id) is True

    assert state(attempt) == S.CANCELLED and objects(gcp, attempt) == NOTHING
    billed, ran = ledger_gpu_seconds(attempt.pk), Decimal(str(gcp.pod_gpu_seconds(attempt.pk)))
    pods = [(gpus, made, stopped) for gpus, labels, made, stopped in gcp.pod_times.values()
            if labels.get("controlplane.io/attempt") == str(attempt.pk)]
    last = max(stopped for _, _, stopped in pods)
    assert len(pods) == 4 and sum(gpus for gpus, _, _ in pods) == attempt.gpus == 5
    skew = Decimal(str(sum(gpus * ((made - first) + (last - stopped)) for gpus, made, stopped in pods)))
    assert ran > 5 * Decimal("1.0") and skew >= 0
    assert abs(billed - (ran + skew)) < Decimal("0.05"), (billed, ran, skew)
    assert abs(billed - attempt.gpus * Decimal(str(last - first))) < Decimal("0.05")


def test_a_restarted_control_plane_keeps_the_objects_of_a_running_multi_role_attempt(grpo):
    world, make = grpo
    attempt = make()
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")
    before = objects(gcp, attempt)

    # a new process: no cached client, and nothing of the dispatch's bookkeeping but the rows
    kube_client._CLIENTS.clear()
    JobAttempt.objects.filter(pk=attempt.pk).update(runner_state={})
    results = [reconcile_cluster(Cluster.objects.get(name="gcp-usc1")) for _ in range(2)]

    assert [r["orphans_deleted"] for r in results] == [0, 0]
    assert state(attempt) == S.RUNNING
    assert objects(gcp, attempt) == before and len(before["Pod"]) == 4
    assert not [d for d in gcp.deletions if d[3].get("controlplane.io/attempt") == str(attempt.pk)]


def test_the_log_of_node_n_is_the_pod_the_local_runner_numbers_n(grpo):
    """Nodes are numbered over the roles in name order, each role's pods by index, as the local runner
    numbers them (``GET /api/v1/jobs/<id>/logs?node=<n>``)."""
    world, make = grpo
    attempt = make()
    gcp = world.emulators["gcp-usc1"]
    numbered = [(role_name, index) for role_name, role_spec in sorted(attempt.job.spec["roles"].items())
                for index in range(role_spec["resources"]["nodes"])]
    for role_name, index in numbered:
        gcp.write_log(pods_of(gcp, attempt, role_name)[index]["metadata"]["name"], f"{role_name} {index}\n")

    backend = backend_for(attempt.cluster)
    assert [backend.logs(attempt, node) for node in range(len(numbered))] == [f"{r} {i}\n" for r, i in numbered]
    assert backend.logs(attempt, len(numbered)) == ""


def test_an_evicted_pod_of_any_role_loses_the_attempt_and_every_role_is_deleted(grpo):
    """A pod taken away (here a drain's eviction of a rollout) is a lost attempt, not a failed one: the job
    recovers by its retries, the cause named with the role and index, and no role is left running."""
    world, make = grpo
    attempt = make(max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")

    gcp.evict(pods_of(gcp, attempt, ROLLOUT)[0]["metadata"]["name"])
    world.reconcile("gcp-usc1")

    ended = load(attempt.pk)
    assert state(attempt) == S.RECOVERING and ended.end_reason == JobAttempt.EndReason.EVICTED
    assert ended.message.startswith("role rollout pod 0: pod ")
    gcp.step()  # the evicted pod's termination ends
    assert objects(gcp, attempt) == NOTHING


def test_the_inventory_after_a_restore_shows_a_running_multi_role_attempt_once_under_its_own_name(grpo):
    """What a restored database learns from the cluster (``Backend.inventory``): the attempt, once, named as the
    attempt (not as one of its roles), running, with its dispatch record."""
    world, make = grpo
    attempt = make()
    world.reconcile("gcp-usc1")

    found = backend_for(attempt.cluster).inventory(attempt.cluster)

    (entry,) = [e for e in found if e["uid"] == str(attempt.uid)]
    assert entry["name"] == attempt.object_name and entry["observation"].phase == "running"
    assert entry["record"]["attempt_id"] == attempt.pk and entry["record"]["kind"] == "multi-role"
