"""A multi-role job on the local runner (ADR 0039): each role's pods start with their role's command and env and
the platform's role variables; the job succeeds when every role with completion succeeded (the servers are then
stopped), and one pod's failure, whatever its role, fails the whole job (or starts a new attempt of every role).

The cluster: the emulated local cluster of 2 nodes x 8 H100 GPUs (``two_node_local_cluster``).
"""

from __future__ import annotations

import json
import re

import pytest

from costs.prometheus import pod_role
from jobs.models import JobAttempt, JobState
from jobs.scheduling.passes import try_admit
from jobs.workload import collect_workload_metrics
from runners.base import backend_for
from runners.local.exporter import LocalGpuCollector, emulated_gpus, live_pods, render
from runners.local.runner import attempt_dir
from tests.runners.local.test_local_runner import observe, reconcile_until, state_chain
from tests.support.factories import make_job_row
from tests.support.local_runner import dispatched, wait_until
from tests.support.personas import signed_in

KEYS = ["CONTROLPLANE_ROLE", "CONTROLPLANE_ROLE_INDEX", "CONTROLPLANE_ROLES", "CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES",
        "CONTROLPLANE_ROLE_LEARNER_ADDRESSES", "CONTROLPLANE_ROLE_REWARD_SERVER_ADDRESSES", "PORT", "WORLD_SIZE",
        "RANK", "MASTER_PORT", "GREETING", "WHO"]
PRINT_ENV = f"import os, json; print(json.dumps({{k: os.environ.get(k) for k in {KEYS!r}}}), flush=True)"
SERVE = PRINT_ENV + "; import time; time.sleep(60)"


def role(code: str, *, nodes: int = 1, port: int | None = None, completion: bool = True, env=None) -> dict:
    spec = {"image": "python:3.11", "command": ["python", "-c", code], "env": env or {},
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": nodes}, "completion": completion}
    if port is not None:
        spec["port"] = port
    return spec


@pytest.fixture
def multi_role(two_node_local_cluster, teams, user, catalog):
    """``multi_role(roles, max_retries=0)``: a multi-role job of ``roles`` (name -> role) admitted to the local
    cluster and dispatched; returns its attempt."""
    def make(roles: dict, *, max_retries: int = 0) -> JobAttempt:
        spec = {"roles": roles, "priority": "normal", "max_runtime_seconds": 60, "preemptible": False,
                "placement": {}, "max_retries": max_retries}
        pods = sum(r["resources"]["nodes"] for r in roles.values())
        job = make_job_row(teams[0], user, catalog["H100-80GB"], name="grpo", kind="multi-role", spec=spec,
                           nodes=pods, gpus_per_node=1, max_runtime=60, max_retries=max_retries)
        assert try_admit(job.pk) == "admitted"
        job.refresh_from_db()
        return dispatched(JobAttempt.objects.select_related("job__team", "cluster", "node_pool")
                          .get(pk=job.current_attempt_id))
    return make


def env_of(attempt: JobAttempt, node: int) -> dict:
    """The environment node ``node`` printed (its log's first JSON line)."""
    def printed():
        lines = [line for line in backend_for(attempt.cluster).logs(attempt, node).splitlines()
                 if line.startswith("{")]
        return json.loads(lines[0]) if lines else None
    return wait_until(printed, 15, f"node {node} to print its environment")


def test_each_role_gets_its_command_env_and_where_the_other_roles_listen(multi_role):
    attempt = multi_role({
        "learner": role(PRINT_ENV, env={"WHO": "learner"}),
        "rollout": role(SERVE, nodes=2, port=8000, completion=False, env={"WHO": "rollout"}),
        "reward-server": role(SERVE, port=9000, completion=False, env={"WHO": "reward"}),
    })
    envs = [env_of(attempt, node) for node in range(4)]
    job = reconcile_until(attempt, {JobState.SUCCEEDED})

    learner, rollout0, rollout1, reward = envs
    assert [e["WHO"] for e in envs] == ["learner", "rollout", "rollout", "reward"]
    assert [(e["CONTROLPLANE_ROLE"], e["CONTROLPLANE_ROLE_INDEX"]) for e in envs] == [
        ("learner", "0"), ("rollout", "0"), ("rollout", "1"), ("reward-server", "0")]
    assert {e["CONTROLPLANE_ROLES"] for e in envs} == {"learner,rollout,reward-server"}
    # every pod is told where each serving role's pods listen: their own PORTs, in index order
    rollouts = f"127.0.0.1:{rollout0['PORT']},127.0.0.1:{rollout1['PORT']}"
    assert {e["CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES"] for e in envs} == {rollouts}
    assert {e["CONTROLPLANE_ROLE_REWARD_SERVER_ADDRESSES"] for e in envs} == {f"127.0.0.1:{reward['PORT']}"}
    assert {e["CONTROLPLANE_ROLE_LEARNER_ADDRESSES"] for e in envs} == {None}  # the learner declares no port
    assert len({e["PORT"] for e in envs}) == 4
    # each role is its own process group: its own rendezvous, world size and ranks
    assert (rollout0["WORLD_SIZE"], rollout0["RANK"], rollout1["RANK"]) == ("2", "0", "1")
    assert (learner["WORLD_SIZE"], learner["RANK"]) == ("1", "0")
    assert rollout0["MASTER_PORT"] == rollout1["MASTER_PORT"] != learner["MASTER_PORT"]
    # the learner's success ended the job; the servers were stopped
    assert job.current_attempt.end_reason == JobAttempt.EndReason.SUCCEEDED
    wait_until(lambda: not backend_for(attempt.cluster).owned_attempt_ids(attempt.cluster), 15,
               "the servers to be stopped")
    assert attempt.runner_state["roles"]["rollout"]["addresses"] == rollouts.split(",")


def test_a_server_role_that_fails_fails_the_whole_job_and_stops_the_other_roles(multi_role):
    attempt = multi_role({
        "learner": role("import time; time.sleep(60)"),
        "rollout": role("import os, sys, time; time.sleep(0.5); sys.exit(3 if os.environ['CONTROLPLANE_ROLE_INDEX'] "
                        "== '1' else 0)", nodes=2, port=8000, completion=False),
    })
    reconcile_until(attempt, {JobState.FAILED})

    ended = JobAttempt.objects.get(pk=attempt.pk)
    assert ended.end_reason == JobAttempt.EndReason.FAILED and ended.exit_code == 3
    assert "role rollout pod 1 exited with code 3" in ended.message
    wait_until(lambda: not backend_for(attempt.cluster).owned_attempt_ids(attempt.cluster), 15,
               "the learner to be stopped")


def test_a_server_role_that_exits_0_early_ends_nothing(multi_role):
    attempt = multi_role({
        "learner": role("import time; time.sleep(2)"),
        "rollout": role("pass", port=8000, completion=False),
    })
    wait_until(lambda: (attempt_dir(attempt) / "node-1.exit").exists(), 10, "the rollout to exit")
    assert observe(attempt).phase == "running"

    job = reconcile_until(attempt, {JobState.SUCCEEDED})
    assert JobState.FAILED not in state_chain(job)


def test_a_failed_role_restarts_every_role_by_the_jobs_retries(multi_role):
    attempt = multi_role({
        "learner": role("import os, sys, time; time.sleep(0.3); sys.exit(1 if os.environ['CONTROLPLANE_ATTEMPT'] "
                        "== '1' else 0)"),
        "rollout": role(SERVE, port=8000, completion=False),
    }, max_retries=1)
    job = reconcile_until(attempt, {JobState.RECOVERING, JobState.QUEUED, JobState.ADMITTED})
    assert JobAttempt.objects.get(pk=attempt.pk).end_reason == JobAttempt.EndReason.FAILED

    assert try_admit(job.pk) == "admitted"
    job.refresh_from_db()
    second = dispatched(JobAttempt.objects.select_related("job__team", "cluster", "node_pool")
                        .get(pk=job.current_attempt_id))
    assert second.number == 2 and set(second.placement["roles"]) == {"learner", "rollout"}
    assert reconcile_until(second, {JobState.SUCCEEDED}).state == JobState.SUCCEEDED


def last_tokens_per_s(log: str) -> float | None:
    """The ``tokens_per_s`` of the last report line (``step=...`` or ``final step=...``) of ``log`` that has one."""
    found = None
    for line in log.splitlines():
        match = re.match(r"^(?:final )?step=\d+\b.*\btokens_per_s=([0-9.]+)", line)
        if match:
            found = float(match.group(1))
    return found


def test_each_pod_s_last_reported_throughput_is_kept_by_role_and_shown_in_the_api(multi_role, teammate):
    report = "import os; print({lines!r}[int(os.environ['CONTROLPLANE_ROLE_INDEX'])], flush=True)"
    attempt = multi_role({
        "learner": role(report.format(lines=["step=1 tokens_per_s=100.5 loss=2.0\nstep=2 tokens_per_s=120.25\n"
                                             "final step=2 tokens_per_s=110.0 loss=1.5"])),
        "rollout": role(report.format(lines=["step=1 tokens_per_s=40.0 samples_per_s=2\nstep=2 tokens_per_s=42.5",
                                             "step=1 tokens_per_s=30.0\nnot a report tokens_per_s=99"]), nodes=2),
    })
    job = reconcile_until(attempt, {JobState.SUCCEEDED})
    collect_workload_metrics()

    roles = teammate.client.get(f"/api/v1/jobs/{job.pk}/").json()["roles"]
    assert (roles["learner"]["tokens_per_s"], roles["learner"]["pod_tokens_per_s"]) == (110.0, [110.0])  # its summary
    assert roles["rollout"]["pod_tokens_per_s"] == [42.5, 30.0]
    assert roles["rollout"]["tokens_per_s"] == 72.5  # each rollout generates for itself: their sum
    assert roles["rollout"]["throughput_attempt"] == 1
    page = signed_in(teammate).get(f"/jobs/{job.pk}/").content.decode()
    assert re.search(r'id="role-throughput-rollout">72\.5 tokens/s \(pods: 42\.5, 30\.0\)', page)
    assert re.search(r'id="role-throughput-learner">110\.0 tokens/s<', page)


def test_the_exporter_names_each_pod_by_its_role_and_gives_it_its_role_s_gpus(multi_role):
    spec = role(SERVE, completion=True)
    spec["resources"] = {**spec["resources"], "gpus_per_node": 2}
    attempt = multi_role({"learner": spec, "rollout": role(SERVE, nodes=2, port=8000, completion=False)})
    reconcile_until(attempt, {JobState.RUNNING})
    name = attempt.object_name
    pods = {p.pod: p for p in live_pods(attempt.cluster_id)}
    assert {pod: len(p.gpus) for pod, p in pods.items()} == {
        f"{name}-learner-0": 2, f"{name}-rollout-0": 1, f"{name}-rollout-1": 1}
    assert len({g for p in pods.values() for g in p.gpus}) == 4  # no GPU in two pods

    text = render(LocalGpuCollector(hostname="h", gpus=lambda: emulated_gpus("h")))
    gpus_by_role: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r'^DCGM_FI_DEV_GPU_UTIL\{.*\bpod="([^"]+)"', line)
        if match:
            found = pod_role(match.group(1), name, ("learner", "rollout"))
            gpus_by_role[found] = gpus_by_role.get(found, 0) + 1
    assert gpus_by_role == {"learner": 2, "rollout": 2}


def test_the_grpo_example_runs_as_three_roles_and_its_reward_rises(multi_role, teammate):
    """examples/rl_grpo.py, unchanged, finds its rollouts through the runner's variables alone."""
    def grpo(args: list[str], **extra) -> dict:
        spec = role("", **extra)
        spec.update(command=["python", "examples/rl_grpo.py"], args=args)
        return spec

    attempt = multi_role({
        "learner": grpo(["--steps", "12", "--connect-timeout", "60"]),
        "rollout": grpo(["--learner-timeout", "60"], nodes=2, port=8000, completion=False),
    })
    job = reconcile_until(attempt, {JobState.SUCCEEDED, JobState.FAILED}, timeout=120)

    log = backend_for(attempt.cluster).logs(attempt, 0, 400)
    assert job.state == JobState.SUCCEEDED, log
    final = next(line for line in log.splitlines() if line.startswith("final step="))
    fields = dict(word.split("=", 1) for word in final.split() if "=" in word)
    assert float(fields["reward"]) > float(fields["first_reward"]), final
    for node in (1, 2):  # each rollout served generations
        assert "tokens_per_s=" in backend_for(attempt.cluster).logs(attempt, node, 400)
    # Each role's last reported throughput, as its pods' logs say, in the job's answer.
    collect_workload_metrics()
    roles = teammate.client.get(f"/api/v1/jobs/{job.pk}/").json()["roles"]
    logs = [backend_for(attempt.cluster).logs(attempt, node, 400) for node in range(3)]
    assert None not in [last_tokens_per_s(log) for log in logs]
    assert roles["learner"]["pod_tokens_per_s"] == [last_tokens_per_s(logs[0])]
    assert roles["rollout"]["pod_tokens_per_s"] == [last_tokens_per_s(logs[1]), last_tokens_per_s(logs[2])]
