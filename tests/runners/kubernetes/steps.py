"""Steps of the kubernetes backend tests: the schema check, a sample workload, and taking an admitted attempt
through dispatch and reconcile with the test kubelet playing the cluster."""

from __future__ import annotations

import kubernetes_validate

from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.tasks import dispatch_attempt
from runners.kubernetes import manifests as m
from tests.support.kubernetes import Kubelet

S = JobState


def validate(obj: dict) -> None:
    """``obj`` validates against the Kubernetes 1.33 schema, strictly (unknown fields are errors)."""
    kubernetes_validate.validate(obj, "1.33", strict=True)


def workload(**kw) -> m.Workload:
    """A 2 x 8 GPU training workload of job 7, attempt 11, on-demand; ``kw`` overrides fields."""
    base = dict(name="job-7-1", namespace="cp-alpha", team="alpha", job_id=7, attempt_id=11, attempt_number=1,
                kind="training", image="img:1", command=("python", "train.py"), args=("--steps", "5"),
                env=(("A", "1"),), nodes=2, gpus_per_node=8, cpu=4, memory_gib=32.5, gpu_product="NVIDIA-H100-80GB-HBM3",
                spot=False, max_runtime_seconds=900)
    base.update(kw)
    return m.Workload(**base)


def load(attempt_id: int) -> JobAttempt:
    """Attempt ``attempt_id`` with its job, team, cluster and pool loaded."""
    return JobAttempt.objects.select_related("job__team", "cluster", "node_pool__accelerator").get(pk=attempt_id)


def kubelet(emulated_clusters, attempt: JobAttempt) -> Kubelet:
    """The test kubelet of the emulator ``attempt`` was dispatched to."""
    return Kubelet(emulated_clusters[0].url(attempt.cluster.name))


def start(emulated_clusters, attempt: JobAttempt) -> tuple[Kubelet, dict, list[dict]]:
    """Dispatch ``attempt``, validate what was created, and run its pods; returns the kubelet, Job and pods."""
    assert dispatch_attempt(attempt.pk) == "dispatched"
    k = kubelet(emulated_clusters, attempt)
    job = k.job(attempt.pk)
    validate(job)
    for svc in k.services():
        validate(svc)
    pods = k.start_pods(job)
    reconcile_cluster(attempt.cluster)
    assert Job.objects.get(pk=attempt.job_id).state == S.RUNNING
    return k, job, pods


def state(attempt: JobAttempt) -> str:
    """The state of ``attempt``'s job now."""
    return Job.objects.get(pk=attempt.job_id).state


def watch_fail_past_the_grace(clock, reconcile, grace_seconds: float, every: float = 30.0) -> None:
    """Reconcile (``reconcile()``) every ``every`` seconds of ``clock`` (a ``time_machine`` traveller) until the
    control plane has watched its stopped cluster fail for longer than ``grace_seconds``: looks closer together
    than ``CLUSTER_LOST_OBSERVED_GAP_SECONDS``, the only time the lost-cluster grace counts."""
    for _ in range(int(grace_seconds // every) + 1):
        clock.shift(every)
        reconcile()
