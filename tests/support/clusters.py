"""Clusters that behave like clusters (``kubernetes.ClusterEmulator``) registered as the platform's clusters, and
the steps tests take with them: admit a job, dispatch it, reconcile, read what the ledger and the cluster counted.

``live_clusters`` starts two emulated clusters, ``aws-use1`` (3.10 USD/GPU-h) and ``gcp-usc1`` (2.50, the cheaper,
where unconstrained jobs go), each with two Ready 8-GPU H100 nodes matching its 2 x 8 node pool, and gives team
alpha a 64-GPU nominal quota. Tests call the dispatch task body and the reconcile pass directly (on-commit
callbacks do not run inside test transactions).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from jobs.lifecycle import dispatch
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from quotas.models import Quota
from runners.models import Cluster

from .factories import make_cluster, make_job_row
from .kubernetes import ClusterEmulator

H100_LABEL = "NVIDIA-H100-80GB-HBM3"
CLUSTERS = [("aws-use1", "aws", "us-east-1", "3.10"), ("gcp-usc1", "gcp", "us-central1", "2.50")]


@dataclasses.dataclass
class World:
    """The emulated clusters by name, their Cluster rows, and the team and user jobs are submitted as."""

    emulators: dict[str, ClusterEmulator]
    clusters: dict[str, Cluster]
    team: object
    user: object
    accelerator: object

    def admit(self, *, nodes=1, gpus=1, kind="training", replicas=None, max_retries=0, cluster=None,
              preemptible=False, command=("python", "train.py"), args=(), env=None, image="registry.example/t:1",
              max_runtime=3600) -> JobAttempt:
        """A job of alpha admitted by the scheduler (on ``cluster`` if named); returns its attempt, loaded."""
        spec = {"image": image, "command": list(command), "args": list(args), "env": dict(env or {}),
                "resources": {"accelerator": self.accelerator.name, "gpus_per_node": gpus, "nodes": nodes},
                "placement": {"clusters": [cluster]} if cluster else {}, "max_runtime_seconds": max_runtime,
                "max_retries": max_retries, "preemptible": preemptible}
        if not command:
            spec.pop("command")
        if kind == "inference":
            spec.update(replicas=replicas or 1, port=8000)
        job = make_job_row(self.team, self.user, self.accelerator, name="t", kind=kind, spec=spec,
                           gpus_per_node=gpus, nodes=nodes, max_retries=max_retries, preemptible=preemptible,
                           max_runtime=max_runtime)
        assert try_admit(job.pk) == "admitted", Job.objects.get(pk=job.pk).queue_info
        return load(Job.objects.get(pk=job.pk).current_attempt_id)

    def running(self, cluster: str = "gcp-usc1", **kw) -> JobAttempt:
        """A job admitted on ``cluster`` (``admit``'s ``kw``), dispatched, its pods running and seen RUNNING by one
        reconcile pass (the cluster's last contact); returns its attempt, loaded."""
        attempt = self.admit(cluster=cluster, **kw)
        assert dispatch(attempt.pk) == "dispatched"
        self.reconcile(cluster)
        assert state(attempt) == JobState.RUNNING
        return load(attempt.pk)

    def emulator(self, attempt: JobAttempt) -> ClusterEmulator:
        return self.emulators[attempt.cluster.name]

    def reconcile(self, name: str) -> dict:
        """One reconcile pass over cluster ``name``."""
        return reconcile_cluster(Cluster.objects.get(name=name))


def load(attempt_id: int) -> JobAttempt:
    """Attempt ``attempt_id`` with its job, team, cluster and pool loaded."""
    return JobAttempt.objects.select_related("job__team", "cluster", "node_pool__accelerator").get(pk=attempt_id)


def state(attempt: JobAttempt) -> str:
    """The state of ``attempt``'s job now."""
    return Job.objects.get(pk=attempt.job_id).state


def ledger_gpu_seconds(attempt_id: int) -> Decimal:
    """GPU-seconds the ledger charged attempt ``attempt_id`` (its entries' GPUs x their intervals)."""
    from costs.ledger import accrue_attempt
    from costs.models import CostEntry

    accrue_attempt(attempt_id)
    return sum((Decimal(e.gpus) * Decimal(str((e.interval_end - e.interval_start).total_seconds()))
                for e in CostEntry.objects.filter(attempt_id=attempt_id)), Decimal(0))


def emulated_cluster(name: str, provider: str, region: str, accelerator, *, price: str, labels: dict,
                     node_prefix: str = "gpu", nodes: int = 2, **pool) -> tuple[ClusterEmulator, Cluster]:
    """A started ``ClusterEmulator`` with ``nodes`` 8-GPU nodes ``<name>-<node_prefix>-<i>`` of ``labels``, and its
    Cluster row with a pool of as many nodes (``make_cluster``, ``pool`` passed on) pointed at it; the emulator is
    stopped if the row cannot be made."""
    emulator = ClusterEmulator(name)
    emulator.start()
    try:
        for i in range(nodes):
            emulator.add_node(f"{name}-{node_prefix}-{i}", 8, labels)
        cluster, _ = make_cluster(name, provider, region, accelerator, nodes=nodes, price=price, **pool)
        cluster.api_endpoint, cluster.api_token = emulator.url, f"token-of-{name}"
        cluster.save()
    except BaseException:
        emulator.stop()
        raise
    return emulator, cluster


@pytest.fixture
def live_clusters(settings, catalog, teams, user):
    """Two emulated clusters that behave like clusters (see the module docstring); yields a ``World``."""
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 0
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 1.0
    settings.CLUSTER_UNREACHABLE_AFTER_FAILURES = 3
    settings.CLUSTER_LOST_GRACE_SECONDS = 600
    settings.DISPATCH_DEADLINE_SECONDS = 300
    accelerator = catalog["H100-80GB"]
    Quota.objects.create(team=teams[0], accelerator=accelerator, nominal_gpus=64)
    emulators, clusters = {}, {}
    try:
        for name, provider, region, price in CLUSTERS:
            emulators[name], clusters[name] = emulated_cluster(name, provider, region, accelerator, price=price,
                                                               labels={"nvidia.com/gpu.product": H100_LABEL})
        yield World(emulators, clusters, teams[0], user, accelerator)
    finally:
        for emulator in emulators.values():
            emulator.stop()
