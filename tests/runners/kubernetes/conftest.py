"""Fixtures of the kubernetes backend tests: three kmock emulators (aws, gcp, azure) registered as clusters, and
jobs admitted to them."""

from __future__ import annotations

import pytest

from jobs.models import Job, JobAttempt
from jobs.scheduling.passes import try_admit
from quotas.models import Quota
from tests.support.factories import make_cluster, make_job_row
from tests.support.kubernetes import Emulators

from .steps import load

SLEEP = ["python", "-c", "import time; time.sleep(600)"]
# (emulator/cluster name, provider, region, USD per GPU-hour override)
CLUSTERS = [("aws-use1", "aws", "us-east-1", "3.10"), ("gcp-usc1", "gcp", "us-central1", "2.50"),
            ("azure-eastus", "azure", "eastus", "4.20")]


@pytest.fixture
def emulated_clusters(settings, catalog, teams):
    """Three emulated clusters (``CLUSTERS``) with a 2 x 8 H100 on-demand pool each, priced differently, and alpha's
    64-GPU quota; ``(Emulators, {name: Cluster})``."""
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 0
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 3.0
    settings.CLUSTER_UNREACHABLE_AFTER_FAILURES = 3
    settings.CLUSTER_LOST_GRACE_SECONDS = 600
    Quota.objects.create(team=teams[0], accelerator=catalog["H100-80GB"], nominal_gpus=64)
    with Emulators([name for name, *_ in CLUSTERS]) as emulators:
        clusters = {}
        for name, provider, region, price in CLUSTERS:
            cluster, _ = make_cluster(name, provider, region, catalog["H100-80GB"], price=price)
            cluster.api_endpoint = emulators.url(name)
            cluster.api_token = f"token-of-{name}"
            cluster.save()
            clusters[name] = cluster
        yield emulators, clusters


@pytest.fixture
def admitted(emulated_clusters, teams, user, catalog):
    """``admitted(*, nodes=1, gpus=1, preemptible=False, placement=None, max_retries=0, kind="training", image)``:
    a job of alpha admitted by the scheduler to one of the emulated clusters; returns its attempt (loaded)."""
    def make(*, nodes=1, gpus=1, preemptible=False, placement=None, max_retries=0, kind="training",
             image="registry.example/train:1") -> JobAttempt:
        spec = {"image": image, "command": SLEEP, "args": [], "env": {"GREETING": "hi"},
                "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes, "cpu": 2,
                              "memory_gib": 8},
                "placement": placement or {}}
        if kind == "inference":
            spec.update(replicas=2, port=8000)
        job = make_job_row(teams[0], user, catalog["H100-80GB"], name="t", kind=kind, spec=spec, gpus_per_node=gpus,
                           nodes=nodes, preemptible=preemptible, max_retries=max_retries)
        assert try_admit(job.pk) == "admitted", job.queue_info
        return load(Job.objects.get(pk=job.pk).current_attempt_id)
    return make
