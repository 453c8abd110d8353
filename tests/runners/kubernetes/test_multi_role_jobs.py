"""Multi-role jobs on a Kubernetes cluster (ADR 0039): a headless Service and an Indexed Job per role, pinned to the
nodes admission booked for that role; every pod told its role, its index, every role's pods' stable DNS names and
its role's own rendezvous. The attempt succeeds when the roles with completion succeed (the servers are then
deleted), fails when any pod fails (named by role and index, every role deleted), starts every role again by the
job's retries, is billed from the first role's creation until its last pod stopped, and a control plane that
restarts keeps a running attempt's objects.

The cluster: ``gcp-usc1`` of ``live_clusters`` (``tests.support.clusters``: two Ready 8-GPU H100 nodes, emulated by
``ClusterEmulator``), its nodes synced so admission books node by node, its pods bound by the test kube-scheduler
(``tests.support.kube_scheduler.bind``: node affinity, anti-affinity and resources as Kubernetes documents them).
The job: a learner (1 pod x 2 GPUs, completion), two rollouts (1 GPU each, port 8000, servers) and a reward server
(1 pod x 1 GPU, port 9000); the spec has every role on the job's one accelerator, as ADR 0039 requires.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from jobs.lifecycle import cancel_job, dispatch, finish_cancel
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from runners.kubernetes import client as kube_client
from runners.kubernetes.sync import sync_cluster
from runners.models import Cluster
from tests.support import kube_scheduler
from tests.support.clusters import ledger_gpu_seconds, load, state
from tests.support.factories import make_job_row

from .steps import validate

S = JobState
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


@pytest.fixture
def grpo(live_clusters):
    """``grpo(max_retries=0)``: the three-role job admitted to gcp-usc1 (its nodes synced, its pods bound by the
    test kube-scheduler) and dispatched; returns ``(world, attempt)``."""
    world = live_clusters
    world.emulators["gcp-usc1"].bind = kube_scheduler.bind
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


def objects(emulator, attempt: JobAttempt) -> dict[str, list[str]]:
    """The names of the attempt's Jobs, Services and pods on ``emulator`` (sorted)."""
    return {kind: sorted(o["metadata"]["name"] for o in (emulator.pods(attempt.pk) if kind == "Pod"
                                                         else emulator.objects(kind, attempt.pk)))
            for kind in ("Job", "Service", "Pod")}


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
    name = attempt.object_name
    booked = attempt.placement["roles"]

    jobs = {j["metadata"]["labels"][ROLE_LABEL]: j for j in gcp.objects("Job", attempt.pk)}
    services = {s["metadata"]["labels"][ROLE_LABEL]: s for s in gcp.objects("Service", attempt.pk)}
    assert set(jobs) == set(services) == {LEARNER, ROLLOUT, REWARD}
    for obj in [*jobs.values(), *services.values()]:
        validate({k: v for k, v in obj.items() if k != "status"})
    namespace = jobs[LEARNER]["metadata"]["namespace"]

    def dns(role_name: str, index: int) -> str:  # <job>-<index>.<service>.<namespace>.svc, Job and Service named alike
        return f"{name}-{role_name}-{index}.{name}-{role_name}.{namespace}.svc"

    # the spec's order is the order of the stored spec's roles (what the local runner and the job's answer use too)
    stored_order = list(attempt.job.spec["roles"])
    rollouts = f"{dns(ROLLOUT, 0)}:8000,{dns(ROLLOUT, 1)}:8000"
    reward = f"{dns(REWARD, 0)}:9000"
    for role_name, spec in ROLES.items():
        job, service = jobs[role_name], services[role_name]
        pods = spec["resources"]["nodes"]
        assert job["metadata"]["name"] == service["metadata"]["name"] == f"{name}-{role_name}"
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
        # the role's Service selects its pods and no other role's
        selected = [p for p in gcp.pods(attempt.pk)
                    if all(p["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())]
        assert sorted(p["metadata"]["name"] for p in selected) == sorted(p["metadata"]["name"] for p in running)
        for index, pod in enumerate(running):
            assert f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}.{namespace}.svc" == dns(role_name, index)
            env = resolved_env(pod)
            assert (env["CONTROLPLANE_ROLE"], env["CONTROLPLANE_ROLE_INDEX"]) == (role_name, str(index))
            assert env["CONTROLPLANE_ROLES"] == ",".join(stored_order) and set(stored_order) == set(ROLES)
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
    assert objects(gcp, attempt) == {"Job": [], "Service": [], "Pod": []}
    deleted = {(kind, labels.get(ROLE_LABEL)) for _, kind, _, labels in gcp.deletions}
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
    assert objects(gcp, attempt) == {"Job": [], "Service": [], "Pod": []}


def test_a_retry_makes_a_new_attempt_of_every_role(grpo):
    world, make = grpo
    first = make(max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")
    gcp.finish_pod(pods_of(gcp, first, LEARNER)[0]["metadata"]["name"], 1)
    world.reconcile("gcp-usc1")
    assert state(first) == S.RECOVERING
    assert objects(gcp, first) == {"Job": [], "Service": [], "Pod": []}

    assert try_admit(first.job_id) == "admitted"
    second = load(Job.objects.get(pk=first.job_id).current_attempt_id)
    assert dispatch(second.pk) == "dispatched"

    assert second.number == 2 and second.object_name != first.object_name
    made = objects(gcp, second)
    assert made["Job"] == made["Service"] == sorted(f"{second.object_name}-{r}" for r in ROLES)
    assert len(made["Pod"]) == 4
    assert {resolved_env(p)["CONTROLPLANE_ATTEMPT"] for p in gcp.pods(second.pk)} == {"2"}
    world.reconcile("gcp-usc1")
    gcp.finish_pod(pods_of(gcp, second, LEARNER)[0]["metadata"]["name"], 0)
    world.reconcile("gcp-usc1")
    assert state(second) == S.SUCCEEDED


def test_billing_runs_from_the_first_roles_creation_until_the_last_pod_stopped(grpo):
    """Cancelled while every role runs: every pod held its GPUs from its creation until the deletion, so the
    ledger's one line for the attempt equals the GPU-seconds the cluster itself counted."""
    world, make = grpo
    attempt = make()
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")
    time.sleep(1.0)

    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert finish_cancel(attempt.job_id) is True

    assert state(attempt) == S.CANCELLED and objects(gcp, attempt) == {"Job": [], "Service": [], "Pod": []}
    billed, ran = ledger_gpu_seconds(attempt.pk), Decimal(str(gcp.pod_gpu_seconds(attempt.pk)))
    assert ran > 5 * Decimal("1.0") and abs(billed - ran) < Decimal("0.1"), (billed, ran)


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
