"""A training run's last reports survive the deletion of its pods: reconcile reads node 0's log once more before it
deletes the ended attempt's objects, so the throughput read back is the run's own final line."""

from __future__ import annotations

from jobs.models import JobState, WorkloadMetrics
from jobs.reconcile import reconcile_cluster

from .steps import start, state

LOG = (b"config world_size=1 flops_per_token=1234567 tokens_per_step=4096\n"
       b"step=10 loss=3.1000 tokens_per_s=900.0\n"
       b"step=20 loss=2.5000 tokens_per_s=1100.0\n"
       b"final step=20 loss=2.5000 first_loss=5.0000 tokens_per_s=1024.5 elapsed_s=80.00 world_size=1\n")


def test_the_final_line_is_read_before_the_ended_attempts_pods_are_deleted(emulated_clusters, admitted):
    emulators, _ = emulated_clusters
    attempt = admitted()
    k, job, pods = start(emulated_clusters, attempt)
    path = f"/api/v1/namespaces/cp-alpha/pods/{pods[0]['metadata']['name']}/log"

    async def serve_log():
        emulators.handlers[attempt.cluster.name][f"get {path}"] << LOG

    emulators.run(serve_log())
    k.terminate(pods[0], 0)
    k.finish_job(job, "Complete")
    reconcile_cluster(attempt.cluster)  # ends the attempt, then deletes its objects as orphans in the same pass
    assert state(attempt) == JobState.SUCCEEDED
    assert k.jobs() == []
    metrics = WorkloadMetrics.objects.get(attempt_id=attempt.pk)
    assert (metrics.tokens_per_s, metrics.flops_per_token, metrics.complete) == (1024.5, 1234567, True)
