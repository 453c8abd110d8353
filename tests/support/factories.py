"""Fixtures of the API tests: a small fleet, more personas (viewer, staff), and job helpers."""

from __future__ import annotations

import copy

import pytest
from django.utils import timezone

from jobs.lifecycle import submit_job
from jobs.models import PRIORITY_CLASSES, Job, JobAttempt, JobState
from quotas.models import Budget, Quota
from tests.conftest import make_cluster, make_persona

VALID_SPEC = {
    "image": "python:3.11",
    "command": ["python", "-c", "print('hello')"],
    "args": ["--steps", "10"],
    "env": {"PYTHONUNBUFFERED": "1"},
    "resources": {"accelerator": "H100-80GB", "gpus_per_node": 8, "nodes": 2, "cpu": 4, "memory_gib": 32.5},
    "priority": "high",
    "max_runtime_seconds": 3600,
    "preemptible": True,
    "placement": {"providers": ["aws"], "regions": ["us-east-1"], "clusters": []},
    "max_retries": 1,
}


@pytest.fixture
def fleet(catalog):
    """One AWS cluster (us-east-1) with an H100 pool of 2 nodes x 8 GPUs; the catalog price applies."""
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"], nodes=2, gpus_per_node=8)
    return {"cluster": cluster, "pool": pool}


@pytest.fixture
def viewer(teams):
    return make_persona("viewer", teams[0], "viewer")


@pytest.fixture
def staff(teams):
    persona = make_persona("staff")
    persona.user.is_staff = True
    persona.user.save(update_fields=["is_staff"])
    return persona


@pytest.fixture
def submission():
    """A valid submission for team alpha, deep-copied so tests may break it."""
    return {"team": "alpha", "name": "train-small", "kind": "training", "spec": copy.deepcopy(VALID_SPEC)}


def make_job(team, submitter, accelerator, *, name="job", gpus_per_node=1, nodes=1, state=None) -> Job:
    """A job stored the way the API stores it (``submit_job``); ``state`` is then forced for the test."""
    spec = copy.deepcopy(VALID_SPEC)
    spec["resources"].update(accelerator=accelerator.name, gpus_per_node=gpus_per_node, nodes=nodes)
    job = submit_job(
        team=team, submitter=submitter, name=name, kind="training", spec=spec,
        resources={"accelerator": accelerator, "gpus_per_node": gpus_per_node, "nodes": nodes,
                   "priority": PRIORITY_CLASSES["normal"], "preemptible": False, "max_runtime_seconds": 3600,
                   "max_retries": 0},
    )
    if state is not None:
        Job.objects.filter(pk=job.pk).update(state=state)
        job.refresh_from_db()
    return job


def make_attempt(job, cluster, pool, *, number=1, started_at=None, state=JobState.RUNNING) -> JobAttempt:
    """An attempt of ``job`` on ``pool``, made current, with the job moved to ``state``."""
    attempt = JobAttempt.objects.create(
        job=job, number=number, cluster=cluster, node_pool=pool, gpus=job.total_gpus,
        object_name=f"job-{job.pk}-{number}", usd_per_gpu_hour="6.88", started_at=started_at or timezone.now(),
    )
    Job.objects.filter(pk=job.pk).update(current_attempt=attempt, state=state)
    job.refresh_from_db()
    return attempt


@pytest.fixture
def alpha_objects(teams, owner, teammate, fleet, h100):
    """Team alpha's job (submitted by the teammate), quota and budget."""
    alpha = teams[0]
    return {
        "job": make_job(alpha, teammate.user, h100, name="alpha-job"),
        "quota": Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=16),
        "budget": Budget.objects.create(team=alpha, amount_usd="1000.00", action="block"),
    }


@pytest.fixture
def beta_objects(teams, outsider, fleet, h100):
    """Team beta's job, quota and budget (the outsider's team)."""
    beta = teams[1]
    return {
        "job": make_job(beta, outsider.user, h100, name="beta-job"),
        "quota": Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=8),
        "budget": Budget.objects.create(team=beta, amount_usd="500.00", action="alert"),
    }
