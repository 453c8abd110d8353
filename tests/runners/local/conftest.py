"""Fixtures of the local runner's tests: the local cluster ``ensure_local_cluster`` makes with two emulated
nodes, and jobs admitted to it."""

from __future__ import annotations

import pytest

from jobs.models import JobAttempt
from jobs.scheduling.passes import try_admit
from tests.support.factories import make_job_row
from tests.support.local_runner import emulated_local_cluster_for


@pytest.fixture
def two_node_local_cluster(local_runs, settings, monkeypatch, catalog, teams):
    """The local cluster (runs under ``local_runs``) of 2 nodes x 8 emulated H100 GPUs, no real GPU detected,
    and alpha's 8-GPU quota."""
    return emulated_local_cluster_for(settings, monkeypatch, teams[0], catalog["H100-80GB"], nodes=2)


@pytest.fixture
def admitted(two_node_local_cluster, teams, user, catalog):
    """``admitted(command, *, nodes=2, max_runtime=60, max_retries=0, env=None, args=None, kind="training",
    spec=None)``: a job of ``kind`` running ``command`` (1 GPU per node; ``spec`` adds further spec keys) admitted
    to the local cluster; returns its attempt (job and cluster loaded)."""

    def make(command, *, nodes=2, max_runtime=60, max_retries=0, env=None, args=None, kind="training",
             spec=None) -> JobAttempt:
        spec = {"command": command, "env": env or {}, **(spec or {})}
        if args is not None:
            spec["args"] = args
        job = make_job_row(teams[0], user, catalog["H100-80GB"], name="t", spec=spec, nodes=nodes,
                           max_runtime=max_runtime, max_retries=max_retries, kind=kind)
        assert try_admit(job.pk) == "admitted"
        job.refresh_from_db()
        return JobAttempt.objects.select_related("job__team", "cluster", "node_pool").get(pk=job.current_attempt_id)

    return make
