"""A serving pod whose server crashes on Kubernetes (the kubelet restarts it in place: lastState, restartCount,
CrashLoopBackOff) is replaced in its slot while ``max_retries`` replacements in 600 s allow, each a
``replica_replaced`` event (docs/adr/0041); the loss past that ends the attempt, which the job follows as any failed
serving attempt (a new attempt while its retries allow, then FAILED); the ended attempt's Deployment is deleted and
its pods are billed until the crash was seen."""

from __future__ import annotations

from decimal import Decimal

from jobs.lifecycle import dispatch
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import try_admit
from tests.support.clusters import ledger_gpu_seconds, load, state

S = JobState


def _serve(world, attempt: JobAttempt):
    """Dispatch ``attempt`` on gcp-usc1 and reconcile until it runs; returns its emulator."""
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RUNNING
    return world.emulators["gcp-usc1"]


def _serving_pod(gcp, attempt: JobAttempt) -> dict:
    return next(p for p in gcp.pods(attempt.pk) if not p["metadata"].get("deletionTimestamp"))


def test_a_crashing_server_is_replaced_then_its_attempt_ends_as_max_retries_says_then_the_job_fails(live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", kind="inference", gpus=2, max_retries=1)
    job_id, numbers = attempt.job_id, []
    while True:
        gcp = _serve(world, attempt)
        first = _serving_pod(gcp, attempt)
        gcp.crash_pod(first["metadata"]["name"], exit_code=134)
        assert _serving_pod(gcp, attempt)["status"]["phase"] == "Running"  # the kubelet keeps the pod, restarting it
        world.reconcile("gcp-usc1")
        assert state(attempt) == S.RUNNING and load(attempt.pk).ended_at is None  # replaced in its slot
        second = _serving_pod(gcp, attempt)
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        assert JobEvent.objects.get(attempt_id=attempt.pk, kind="replica_replaced").data["exit_code"] == 134

        gcp.crash_pod(second["metadata"]["name"], exit_code=134)  # again within 600 s: past max_retries 1
        world.reconcile("gcp-usc1")

        ended = load(attempt.pk)
        numbers.append(ended.number)
        assert (ended.end_reason, ended.exit_code) == ("Failed", 134)
        assert gcp.objects("Deployment", attempt.pk) == []  # deleted in the pass that saw the crash
        if state(attempt) == S.FAILED:
            break
        assert state(attempt) == S.RECOVERING
        assert try_admit(job_id) == "admitted"
        attempt = load(Job.objects.get(pk=job_id).current_attempt_id)

    job = Job.objects.get(pk=job_id)
    assert numbers == [1, 2]
    assert job.state_reason == "attempt 2 server exited (exit code 134) and 1 retries used"
    events = list(job.events.filter(to_state__in=(S.RECOVERING, S.FAILED), kind="state").order_by("id").values_list(
        "to_state", "reason"))
    assert events == [(S.RECOVERING, "attempt 1 server exited (exit code 134), retry 1 of 1"),
                      (S.FAILED, "attempt 2 server exited (exit code 134) and 1 retries used")]
    assert [a.end_reason for a in job.attempts.order_by("number")] == ["Failed"] * 2


def test_an_oom_killed_server_past_the_budget_ends_the_attempt_and_the_crashed_pod_is_billed_until_seen(
        live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", kind="inference", gpus=2, max_retries=0)
    gcp = _serve(world, attempt)
    gcp.crash_pod(gcp.pods(attempt.pk)[0]["metadata"]["name"], exit_code=137, reason="OOMKilled")
    gcp.step()  # the back-off is over: the kubelet runs the container again, the pod still holds its GPUs

    world.reconcile("gcp-usc1")

    ended = load(attempt.pk)
    assert state(attempt) == S.FAILED and (ended.end_reason, ended.exit_code) == ("OOMKilled", 137)
    event = Job.objects.get(pk=attempt.job_id).events.filter(to_state=S.FAILED).get()
    assert event.reason == "OOMKilled: attempt 1 server exited (exit code 137) and 0 retries used"
    # Billed from the Deployment's creation to the look that saw the crash, which deleted the objects in the same
    # pass: the cluster's own count of the pods' GPU time, to within 2 seconds of the 2 GPUs.
    assert gcp.objects("Deployment", attempt.pk) == []
    assert abs(ledger_gpu_seconds(attempt.pk) - Decimal(str(gcp.pod_gpu_seconds(attempt.pk)))) <= 2 * 2

def test_a_server_that_exits_zero_and_is_restarted_has_stopped_serving(live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", kind="inference", max_retries=0)
    gcp = _serve(world, attempt)
    gcp.crash_pod(gcp.pods(attempt.pk)[0]["metadata"]["name"], exit_code=0, reason="Completed")
    world.reconcile("gcp-usc1")
    ended = load(attempt.pk)
    assert state(attempt) == S.FAILED and (ended.end_reason, ended.exit_code) == ("Failed", 0)


def test_a_serving_pod_evicted_by_its_kubelet_or_crashed_is_a_lost_replica_not_the_attempt_s_end():
    """Node-pressure eviction: the pod is Failed with reason Evicted and its container killed (137), without a
    deletionTimestamp; the Deployment runs a new pod: the attempt runs, the evicted pod a lost replica. A server
    that crashed (restarted in place) is a lost replica too, not the attempt's failure."""
    import datetime as dt

    from runners.kubernetes.runner import observe_inference

    now = dt.datetime(2026, 12, 1, 12, tzinfo=dt.timezone.utc)
    deployment = {"metadata": {"creationTimestamp": "2026-12-01T11:00:00Z"}, "spec": {"replicas": 1},
                  "status": {"readyReplicas": 1}}
    evicted = {"metadata": {"name": "s-1"}, "status": {"phase": "Failed", "reason": "Evicted", "containerStatuses": [
        {"name": "server", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}}
    replacement = {"metadata": {"name": "s-2"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "server", "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T11:59:00Z"}}}]}}
    seen = observe_inference([deployment], [evicted, replacement], now, 600.0)
    assert seen.phase == "running"
    assert [(r.key, r.phase, r.end_reason) for r in seen.lost_replicas] == [("-/s-1", "lost", "Evicted")]
    crashed = {"metadata": {"name": "s-2"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "server", "restartCount": 1, "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}},
         "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    seen = observe_inference([dict(deployment, status={"readyReplicas": 0})], [evicted, crashed], now, 600.0)
    assert seen.phase == "pending"
    assert [(r.key, r.phase, r.end_reason, r.exit_code) for r in seen.lost_replicas] == [
        ("-/s-1", "lost", "Evicted", None), ("-/s-2", "failed", "Failed", 2)]
