"""Helpers of the observability tests: jobs in given states, and a fake local attempt whose node is a real process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.utils import timezone

from jobs.models import Job, JobAttempt, JobState
from runners.local.procs import ref_of
from tests.support.factories import make_cluster
from tests.support.personas import make_persona

BUSY_LOOP = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def make_job(team, accelerator, user, *, state=JobState.QUEUED, gpus_per_node=1, nodes=1):
    spec = {"image": "python:3.11", "command": ["python"], "priority": "normal", "max_runtime_seconds": 3600,
            "preemptible": False, "placement": {}, "max_retries": 0,
            "resources": {"accelerator": accelerator.name, "gpus_per_node": gpus_per_node, "nodes": nodes}}
    return Job.objects.create(team=team, submitter=user, name="j", kind="training", spec=spec, accelerator=accelerator,
                              gpus_per_node=gpus_per_node, nodes=nodes, priority=500, preemptible=False,
                              max_runtime_seconds=3600, max_retries=0, state=state)


@pytest.fixture
def user(teams):
    return make_persona("owner", teams[0], "admin").user


@pytest.fixture
def local_cluster(h100, settings, tmp_path):
    """An emulated local cluster (1 node x 8 GPUs) whose run directory is under ``tmp_path``."""
    settings.LOCAL_RUNNER_DIR = tmp_path / "runs"
    settings.LOCAL_RUNNER_EMULATED_GPUS = 8
    settings.LOCAL_RUNNER_ACCELERATOR = h100.name
    cluster, pool = make_cluster("local-emulated", "local", "this-machine", h100, nodes=1, gpus_per_node=8,
                                 backend="local", price="2.00")
    cluster.emulated = True
    cluster.save(update_fields=["emulated"])
    return cluster, pool


@pytest.fixture
def fake_attempt(local_cluster, teams, user, settings):
    """``make(argv, gpus)``: a RUNNING job with a started attempt whose node 0 is ``argv`` run as a process group leader
    (as the launcher's supervisor is), recorded in the attempt directory as the runner records it."""
    cluster, pool = local_cluster
    procs = []

    def make(argv, gpus=2):
        job = make_job(teams[0], pool.accelerator, user, state=JobState.RUNNING, gpus_per_node=gpus)
        attempt = JobAttempt.objects.create(job=job, number=1, cluster=cluster, node_pool=pool, gpus=gpus,
                                            object_name=f"job-{job.pk}-1", usd_per_gpu_hour="2.00",
                                            started_at=timezone.now())
        Job.objects.filter(pk=job.pk).update(current_attempt=attempt)
        directory = settings.LOCAL_RUNNER_DIR / attempt.object_name
        directory.mkdir(parents=True)
        (directory / "attempt.json").write_text(json.dumps(
            {"attempt_id": attempt.pk, "job_id": job.pk, "number": 1, "object_name": attempt.object_name,
             "cluster_id": cluster.pk, "nodes": 1, "devices": None}))
        proc = subprocess.Popen(argv, start_new_session=True)
        procs.append(proc)
        ref = ref_of(proc.pid).to_json()
        (directory / "node-0.pid").write_text(json.dumps({"supervisor": ref, "child": ref}))
        return attempt, proc

    yield make
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def busy_argv(seconds: float) -> list[str]:
    return [sys.executable, "-c", BUSY_LOOP.format(seconds=seconds)]
