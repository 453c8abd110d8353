"""The local runner's clusters under ``tmp_path``, and the cleanup of the processes its attempts leave.

``local_runs`` points the runner at ``tmp_path / "runs"`` with a 1 s kill grace and kills whatever its attempts
left running at the end; ``funded_local_cluster`` is the cluster ``ensure_local_cluster`` makes there, with
alpha's quota for all of it and a $1000 budget; ``emulated_local_cluster`` is a priced local cluster row of
1 x 8 emulated GPUs made by hand (no ``ensure_local_cluster``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from jobs.models import JobAttempt
from jobs.tasks import dispatch_attempt
from runners.local.capacity import ensure_local_cluster
from runners.local.layout import read_json
from runners.local.procs import ProcessRef, proc_table, signal_group, signal_process

from .factories import make_cluster


def emulated_local_cluster_for(settings, monkeypatch, team, accelerator, nodes: int):
    """The local cluster ``ensure_local_cluster`` makes with ``nodes`` x 8 emulated ``accelerator`` GPUs (no real
    GPU detected) and ``team``'s 8-GPU quota of them."""
    from quotas.models import Quota
    from runners.local import capacity

    settings.LOCAL_RUNNER_NODES = nodes
    settings.LOCAL_RUNNER_EMULATED_GPUS = 8
    settings.LOCAL_RUNNER_ACCELERATOR = accelerator.name
    monkeypatch.setattr(capacity, "detect_gpus", lambda: [])
    cluster = ensure_local_cluster()
    Quota.objects.create(team=team, accelerator=accelerator, nominal_gpus=8)
    return cluster


def kill_everything_under(root: Path) -> None:
    """SIGKILL every process group and command recorded under ``root`` (a runner directory), and every serving
    job's endpoint proxy."""
    if not root.is_dir():
        return
    table = proc_table()
    for path in list(root.glob("*/node-*.claim")) + list(root.glob("*/node-*.pid")):
        record = read_json(path) or {}
        supervisor = ProcessRef.from_json(record.get("supervisor"))
        if supervisor is not None:
            signal_group(supervisor, signal.SIGKILL, table)
        signal_process(ProcessRef.from_json(record.get("child")), signal.SIGKILL, table)
    for path in root.glob("job-*/endpoint/proxy.pid"):  # serving jobs' endpoints (runners.local.serving)
        signal_process(ProcessRef.from_json(read_json(path)), signal.SIGKILL, table)


def wait_until(predicate, timeout: float = 15.0, what: str = "condition"):
    """Poll ``predicate`` every 50 ms until it returns something truthy (returned) or ``timeout`` seconds pass
    (AssertionError naming ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def dispatched(attempt: JobAttempt) -> JobAttempt:
    """Run the dispatch task body for ``attempt``; returns it reloaded (job STARTING)."""
    assert dispatch_attempt(attempt.pk) == "dispatched"
    return JobAttempt.objects.select_related("job__team", "cluster", "node_pool").get(pk=attempt.pk)


@pytest.fixture
def local_runs(settings, tmp_path):
    """The local runner's directory (``tmp_path / "runs"``, 1 s kill grace); its processes are killed afterwards."""
    settings.LOCAL_RUNNER_DIR = tmp_path / "runs"
    settings.LOCAL_RUNNER_KILL_GRACE_SECONDS = 1.0
    yield settings.LOCAL_RUNNER_DIR
    kill_everything_under(tmp_path / "runs")


@pytest.fixture
def funded_local_cluster(local_runs, teams, quota_factory, budget_factory, catalog):
    """The local cluster ``ensure_local_cluster`` makes (runs under ``local_runs``), with alpha's quota for all
    of its GPUs and a $1000 block budget."""
    cluster = ensure_local_cluster()
    pool = cluster.node_pools.get(name="gpu")
    quota_factory(teams[0], pool.accelerator, pool.capacity_gpus)
    budget_factory(teams[0], "1000.00")
    return cluster


@pytest.fixture
def emulated_local_cluster(h100, settings, tmp_path):
    """A local cluster row (1 node x 8 emulated H100 GPUs at 2.00 USD/GPU-h) made by hand, run directory under
    ``tmp_path``; ``(cluster, pool)``."""
    settings.LOCAL_RUNNER_DIR = tmp_path / "runs"
    settings.LOCAL_RUNNER_EMULATED_GPUS = 8
    settings.LOCAL_RUNNER_ACCELERATOR = h100.name
    cluster, pool = make_cluster("local-emulated", "local", "this-machine", h100, nodes=1, gpus_per_node=8,
                                 backend="local", price="2.00")
    cluster.emulated = True
    cluster.save(update_fields=["emulated"])
    return cluster, pool
