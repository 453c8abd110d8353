"""The local backend: supervised node processes, their environment, ends, deadlines, cancels, losses and orphans.

Jobs run real (short) Python processes under ``tmp_path``; state changes go
through ``jobs.scheduling.passes.try_admit``, the ``dispatch_attempt`` task body and
``jobs.reconcile.reconcile_cluster``, called directly because on-commit
callbacks do not run inside these tests' transactions.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from costs.models import Price
from costs.seed import CATALOG_EFFECTIVE_FROM
from jobs.lifecycle import cancel_job, finish_cancel
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.reconcile import reconcile_cluster
from jobs.tasks import dispatch_attempt
from runners.base import PermanentDispatchError, TransientDispatchError, backend_for
from runners.local import capacity
from runners.local.capacity import LocalGpu, ensure_local_cluster
from runners.local.layout import node_path, read_json
from runners.local.procs import ProcessRef
from runners.local.runner import attempt_dir, node_env, tail
from runners.models import Accelerator, Cluster, NodePool
from tests.support.factories import make_attempt, make_job_row
from tests.support.local_runner import dispatched, wait_until

ENV_KEYS = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "CHECKPOINT_DIR", "PORT", "CONTROLPLANE_JOB_ID", "CONTROLPLANE_ATTEMPT", "CONTROLPLANE_TEAM",
            "CUDA_VISIBLE_DEVICES", "PEAK_TFLOPS", "GREETING", "DATABASE_URL"]
SLEEP = ["python", "-c", "import time; time.sleep(60)"]
IGNORE_SIGTERM_AND_SLEEP = ["python", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                            "print('ready', flush=True); time.sleep(60)"]


def observe(attempt: JobAttempt):
    """The backend's Observation of ``attempt`` now."""
    return backend_for(attempt.cluster).observe(attempt.cluster, [attempt])[attempt.pk]


def reconcile_until(attempt: JobAttempt, states, timeout: float = 15.0) -> Job:
    """Reconcile the attempt's cluster until its job is in one of ``states``; returns the job."""
    job = attempt.job

    def reached():
        reconcile_cluster(attempt.cluster)
        job.refresh_from_db()
        return job.state in states

    wait_until(reached, timeout, f"job {job.pk} to reach {states}")
    return job


def state_chain(job: Job) -> list[str]:
    """The states ``job`` entered, in order, from its JobEvents."""
    return list(JobEvent.objects.filter(job=job, kind="state").values_list("to_state", flat=True))


def pid_record(attempt: JobAttempt, node: int) -> dict:
    """``node-<node>.pid`` of ``attempt`` once its supervisor started the command."""
    return wait_until(lambda: read_json(node_path(attempt_dir(attempt), node, "pid")), 10, f"node {node} to start")


def alive(record: dict, key: str) -> bool:
    """Whether the process stored under ``key`` (``supervisor`` or ``child``) of a pid record still runs."""
    return ProcessRef.from_json(record[key]).alive()


def test_it_gives_each_node_the_torchrun_environment(admitted):
    probe = f"import os, sys, json; print(json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS!r}}} | " \
            "{'cwd': os.getcwd(), 'python': sys.executable}))"
    attempt = dispatched(admitted(["python", "-c", probe], env={"GREETING": "hello"}))
    job = reconcile_until(attempt, {JobState.SUCCEEDED})

    port = attempt.runner_state["master_port"]
    assert attempt.runner_state["nodes"] == 2 and len(attempt.runner_state["pids"]) == 2
    ports = attempt.runner_state["ports"]
    assert len(set(ports + [port])) == 3 and attempt.runner_state["endpoint"] is None  # training: no endpoint
    checkpoints = Path(django_settings.LOCAL_RUNNER_DIR).resolve() / f"job-{job.pk}" / "checkpoints"
    assert checkpoints.is_dir()
    for node in range(2):
        lines = [line for line in backend_for(attempt.cluster).logs(attempt, node).splitlines() if line.startswith("{")]
        env = json.loads(lines[-1])
        assert env == {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "NODE_RANK": str(node),
            "RANK": str(node), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "CHECKPOINT_DIR": str(checkpoints),
            "PORT": str(ports[node]),
            "CONTROLPLANE_JOB_ID": str(job.pk), "CONTROLPLANE_ATTEMPT": "1", "CONTROLPLANE_TEAM": "alpha",
            "CUDA_VISIBLE_DEVICES": "", "GREETING": "hello",
            "PEAK_TFLOPS": None,  # emulated GPUs run on the CPU, whose peak is unknown: no MFU
            "DATABASE_URL": None,  # the control plane's own environment does not leak into jobs
            "cwd": str(django_settings.BASE_DIR), "python": sys.executable,
        }


def test_it_starts_one_set_of_processes_when_dispatched_twice(admitted, tmp_path):
    marker = tmp_path / "starts.txt"
    command = ["python", "-c", f"import os; open({str(marker)!r}, 'a').write(os.environ['RANK'] + '\\n')"]
    attempt = dispatched(admitted(command))
    again = backend_for(attempt.cluster).dispatch(attempt)

    assert again == attempt.runner_state
    assert observe(attempt).phase in ("pending", "running", "succeeded")
    wait_until(lambda: observe(attempt).phase == "succeeded", what="both nodes to exit")
    assert sorted(marker.read_text().split()) == ["0", "1"]


def test_it_starts_one_set_of_processes_under_concurrent_dispatch(admitted, tmp_path):
    marker = tmp_path / "starts.txt"
    command = ["python", "-c", f"import os; open({str(marker)!r}, 'a').write(os.environ['RANK'] + '\\n')"]
    attempt = admitted(command)
    backend = backend_for(attempt.cluster)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def dispatch():
        barrier.wait()
        try:
            results.append(backend.dispatch(attempt))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=dispatch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors and len(results) == 2
    assert results[0] == results[1]
    wait_until(lambda: observe(attempt).phase == "succeeded", what="both nodes to exit")
    assert sorted(marker.read_text().split()) == ["0", "1"]
    assert sorted(p.name for p in attempt_dir(attempt).glob("node-*.pid")) == ["node-0.pid", "node-1.pid"]


def test_a_successful_job_goes_through_running_to_succeeded(admitted):
    attempt = dispatched(admitted(["python", "-c", "print('done')"]))
    job = reconcile_until(attempt, {JobState.SUCCEEDED})

    assert state_chain(job) == ["ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]
    attempt.refresh_from_db()
    assert attempt.end_reason == "Succeeded" and attempt.exit_code == 0 and attempt.ended_at is not None
    assert backend_for(attempt.cluster).owned_attempt_ids(attempt.cluster) == set()


def test_a_non_zero_exit_fails_the_job_and_stops_the_other_node(admitted):
    command = ["python", "-c", "import os, sys, time; sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)"]
    attempt = dispatched(admitted(command))
    node0 = pid_record(attempt, 0)
    job = reconcile_until(attempt, {JobState.FAILED})

    attempt.refresh_from_db()
    assert attempt.end_reason == "Failed" and attempt.exit_code == 3
    assert job.state_reason == "exited with code 3"  # read after FAILED: the state is not said twice
    assert state_chain(job)[-2:] == ["RUNNING", "FAILED"]
    wait_until(lambda: not alive(node0, "child") and not alive(node0, "supervisor"), what="node 0 to be stopped")


def test_it_enforces_max_runtime(admitted):
    attempt = dispatched(admitted(SLEEP, nodes=1, max_runtime=2))
    child = pid_record(attempt, 0)
    job = reconcile_until(attempt, {JobState.FAILED}, timeout=20)

    attempt.refresh_from_db()
    assert attempt.end_reason == "DeadlineExceeded"
    assert read_json(node_path(attempt_dir(attempt), 0, "exit"))["reason"] == "deadline"
    assert not alive(child, "child")
    assert "max_runtime" in backend_for(attempt.cluster).logs(attempt, 0)
    assert job.state == JobState.FAILED


def test_cancel_kills_the_process_group(admitted):
    attempt = dispatched(admitted(IGNORE_SIGTERM_AND_SLEEP, nodes=2))
    records = [pid_record(attempt, n) for n in range(2)]
    job = reconcile_until(attempt, {JobState.RUNNING})

    cancel_job(job, actor=job.submitter)
    assert job.state == JobState.CANCELLING
    wait_until(lambda: finish_cancel(job.pk), timeout=15, what="the cancel to finish")

    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    # its lists show who cancelled it, not the runner's words alone
    assert job.state_reason == f"cancelled by {job.submitter.username}: objects deleted", job.state_reason
    for record in records:  # they ignored SIGTERM, so SIGKILL after the grace ended them
        assert not alive(record, "child") and not alive(record, "supervisor")
    assert read_json(node_path(attempt_dir(attempt), 0, "exit"))["reason"] == "cancelled"
    attempt.refresh_from_db()
    assert attempt.end_reason == "Cancelled"


def test_a_killed_supervisor_is_lost_and_the_job_recovers(admitted):
    attempt = dispatched(admitted(SLEEP, nodes=2, max_retries=1))
    records = [pid_record(attempt, n) for n in range(2)]
    reconcile_until(attempt, {JobState.RUNNING})

    os.kill(records[1]["supervisor"]["pid"], signal.SIGKILL)
    job = reconcile_until(attempt, {JobState.RECOVERING})

    attempt.refresh_from_db()
    assert attempt.end_reason == "NodeLost" and attempt.ended_at is not None
    # Nothing of the lost attempt keeps running: the orphaned command and the other node are stopped.
    wait_until(lambda: not any(alive(r, "child") for r in records), what="the lost attempt's processes to stop")
    assert job.max_retries == 1


def test_reconcile_deletes_processes_of_an_ended_attempt(admitted):
    attempt = dispatched(admitted(SLEEP, nodes=1))
    record = pid_record(attempt, 0)
    backend = backend_for(attempt.cluster)
    assert backend.owned_attempt_ids(attempt.cluster) == {str(attempt.uid)}  # by uid: a restored database reuses ids

    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=attempt.started_at, end_reason="Failed")
    result = reconcile_cluster(attempt.cluster)

    assert result["orphans_deleted"] == 1
    assert not alive(record, "child") and not alive(record, "supervisor")
    assert backend.owned_attempt_ids(attempt.cluster) == set()


def test_logs_returns_the_tail_of_a_node_log(admitted):
    attempt = dispatched(admitted(["python", "-c", "for i in range(500): print('line', i)"], nodes=1))
    wait_until(lambda: observe(attempt).phase == "succeeded", what="the node to exit")
    backend = backend_for(attempt.cluster)

    assert backend.logs(attempt, 0, tail_lines=3) == "line 497\nline 498\nline 499\n"
    assert backend.logs(attempt, 0, tail_lines=1000).count("\n") == 500
    assert backend.logs(attempt, 5) == ""


def test_tail_reads_across_blocks(tmp_path):
    path = tmp_path / "log"
    path.write_text("".join(f"{i:05d}\n" for i in range(10_000)))
    assert tail(path, 2, block=7) == "09998\n09999\n"
    assert tail(path, 0) == "" and tail(tmp_path / "missing", 5) == ""


@pytest.mark.parametrize("command", [[], ["definitely-not-a-program-xyz"], ["./no/such/script.sh"], "python -c 1"])
def test_a_bad_command_is_a_permanent_dispatch_error(admitted, command):
    attempt = admitted(command)
    with pytest.raises(PermanentDispatchError):
        backend_for(attempt.cluster).dispatch(attempt)
    assert not attempt_dir(attempt).exists()
    assert dispatch_attempt(attempt.pk) == "failed"
    attempt.refresh_from_db()
    assert attempt.end_reason == "DispatchError"


def test_args_follow_the_command(admitted):
    attempt = dispatched(admitted(["python", "-c", "import sys; print(sys.argv[1:])"], args=["--a", "b"], nodes=1))
    wait_until(lambda: observe(attempt).phase == "succeeded", what="the node to exit")
    assert backend_for(attempt.cluster).logs(attempt, 0).strip() == "['--a', 'b']"


def test_an_attempt_without_directory_is_absent(admitted):
    attempt = admitted(SLEEP)
    assert observe(attempt).phase == "absent"
    assert backend_for(attempt.cluster).delete(attempt) is True


def test_ensure_local_cluster_emulates_gpus_and_is_idempotent(two_node_local_cluster, catalog):
    cluster = two_node_local_cluster
    assert (cluster.name, cluster.provider, cluster.region, cluster.backend) == \
        ("local-emulated", "local", "this-machine", "local")
    assert cluster.emulated is True
    pool = NodePool.objects.get(cluster=cluster, name="gpu")
    assert (pool.name, pool.accelerator.name, pool.nodes, pool.gpus_per_node) == ("gpu", "H100-80GB", 2, 4)
    price = Price.objects.get(cluster=cluster, accelerator=pool.accelerator)
    assert price.usd_per_gpu_hour == Decimal("6.88")  # AWS us-east-1 on-demand H100 in the catalog
    assert (price.provider, price.region, price.capacity_type, price.effective_from) == \
        ("local", "this-machine", "on-demand", CATALOG_EFFECTIVE_FROM)
    assert "demo price for emulated GPUs" in price.source

    counts = (Cluster.objects.count(), NodePool.objects.count(), Price.objects.count())
    assert ensure_local_cluster().pk == cluster.pk
    assert (Cluster.objects.count(), NodePool.objects.count(), Price.objects.count()) == counts
    assert backend_for(cluster).discover(cluster)[0].gpus_per_node == 4


def test_ensure_local_cluster_follows_the_settings(two_node_local_cluster, settings):
    Accelerator.objects.create(name="T4", memory_gib=16, peak_bf16_tflops=Decimal("65"))
    settings.LOCAL_RUNNER_ACCELERATOR = "T4"
    settings.LOCAL_RUNNER_NODES = 3
    settings.LOCAL_RUNNER_EMULATED_GPUS = 2

    cluster = ensure_local_cluster()
    pool = cluster.node_pools.get(name="gpu")
    assert (pool.accelerator.name, pool.nodes, pool.gpus_per_node) == ("T4", 3, 1)
    assert Price.objects.get(cluster=cluster, accelerator__name="T4").usd_per_gpu_hour == Decimal("1.00")


def test_ensure_local_cluster_uses_nvml_gpus(catalog, monkeypatch):
    gpus = [LocalGpu(i, "NVIDIA H100 80GB HBM3", 81559 * 1024**2) for i in range(4)]
    monkeypatch.setattr(capacity, "detect_gpus", lambda: gpus)

    cluster = ensure_local_cluster()
    assert (cluster.name, cluster.emulated) == ("local", False)
    pool = cluster.node_pools.get(name="gpu")
    assert (pool.name, pool.accelerator.name, pool.nodes, pool.gpus_per_node) == ("gpu", "H100-80GB", 1, 4)
    assert Price.objects.get(cluster=cluster, accelerator__name="H100-80GB").usd_per_gpu_hour == Decimal("6.88")


@pytest.mark.parametrize("name, memory_gib, expected", [
    ("NVIDIA H100 80GB HBM3", 80, "H100-80GB"), ("NVIDIA H200", 141, "H200-141GB"),
    ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"), ("NVIDIA A100-SXM4-40GB", 40, "A100-40GB"),
    ("NVIDIA L4", 22, "L4"), ("NVIDIA L40S", 45, "L40S-45GB"),
])
def test_accelerator_names_from_nvml(name, memory_gib, expected):
    assert capacity.accelerator_name(LocalGpu(0, name, memory_gib * 1024**3)) == expected


def test_two_nodes_rendezvous_with_torch_distributed(admitted):
    command = ["python", "-c", "import torch, torch.distributed as dist; dist.init_process_group('gloo'); "
                               "t = torch.ones(1) * (dist.get_rank() + 1); dist.all_reduce(t); "
                               "print('sum', t.item(), 'world', dist.get_world_size()); dist.destroy_process_group()"]
    attempt = dispatched(admitted(command, max_runtime=120))
    reconcile_until(attempt, {JobState.SUCCEEDED, JobState.FAILED}, timeout=60)

    attempt.job.refresh_from_db()
    backend = backend_for(attempt.cluster)
    assert attempt.job.state == JobState.SUCCEEDED, backend.logs(attempt, 0) + backend.logs(attempt, 1)
    for node in range(2):
        assert "sum 3.0 world 2" in backend.logs(attempt, node)


def test_real_gpus_are_shared_out_between_live_attempts(two_node_local_cluster, teams, user, catalog):
    """On a non-emulated local cluster each node gets GPU indices no other live attempt holds."""
    cluster = Cluster.objects.create(name="local", provider="local", region="this-machine", backend="local")
    pool = NodePool.objects.create(cluster=cluster, name="gpu", accelerator=catalog["H100-80GB"], nodes=1, gpus_per_node=4)
    backend = backend_for(cluster)

    def attempt_on_gpus(gpus_per_node: int) -> JobAttempt:
        job = make_job_row(teams[0], user, pool.accelerator, name="g", spec={"command": SLEEP},
                           gpus_per_node=gpus_per_node, max_runtime=60)
        return make_attempt(job, cluster, pool, usd_per_gpu_hour=Decimal("1"), started_at=None, state=JobState.ADMITTED)

    first, second, third = attempt_on_gpus(2), attempt_on_gpus(2), attempt_on_gpus(1)
    assert backend.dispatch(first)["cuda_visible_devices"] == ["0,1"]
    # Real GPUs get their catalog peak, for the workload's MFU.
    meta = read_json(attempt_dir(first) / "attempt.json")
    assert meta["peak_tflops"] == str(catalog["H100-80GB"].peak_bf16_tflops)
    assert node_env(first, meta, 0)["PEAK_TFLOPS"] == str(catalog["H100-80GB"].peak_bf16_tflops)
    assert backend.dispatch(second)["cuda_visible_devices"] == ["2,3"]
    assert backend.dispatch(first)["cuda_visible_devices"] == ["0,1"]  # a repeated dispatch keeps its GPUs
    with pytest.raises(TransientDispatchError):
        backend.dispatch(third)
    assert backend.delete(first) is True
    assert backend.dispatch(third)["cuda_visible_devices"] == ["0"]


def test_the_management_command_ensures_the_local_cluster(two_node_local_cluster):
    out = io.StringIO()
    call_command("ensure_local_cluster", stdout=out)
    assert "local-emulated" in out.getvalue() and "2 nodes x 4 H100-80GB" in out.getvalue()
    cpu_milli, memory_mib = capacity.machine_resources()
    assert f"pool cpu: 2 nodes of {cpu_milli // 1000} vCPUs and {memory_mib // 1024} GiB (CPU-only jobs)" in \
        out.getvalue()
    assert Cluster.objects.filter(backend="local").count() == 1


def test_the_demos_shutdown_cancels_every_job_running_here_and_leaves_queued_ones(admitted, teams, user, catalog):
    """Ctrl-C on ``make demo``: a job a user submitted meanwhile must not keep training with no platform."""
    from demo.run import cancel_unfinished

    running = dispatched(admitted([sys.executable, "-c", "import time; time.sleep(120)"], nodes=1))
    reconcile_until(running, {JobState.RUNNING})
    queued = make_job_row(teams[0], user, catalog["H100-80GB"], name="waits", spec={"command": ["true"]}, max_runtime=60)

    assert cancel_unfinished([]) == [running.job_id]

    assert Job.objects.get(pk=running.job_id).state == JobState.CANCELLED
    assert Job.objects.get(pk=queued.pk).state == JobState.QUEUED
    assert observe(running).phase not in ("pending", "running")  # its processes are gone
