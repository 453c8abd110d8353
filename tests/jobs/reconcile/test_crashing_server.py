"""A serving pod whose server crashes on Kubernetes (the kubelet restarts it in place: lastState, restartCount,
CrashLoopBackOff) is started again by the platform as a new attempt while ``max_retries`` allows, each crash an
attempt ended with an event, and the job fails once the retries are spent; the crashed attempt's Deployment is
deleted and its pods are billed until the crash was seen."""

from __future__ import annotations

from decimal import Decimal

from jobs.lifecycle import dispatch
from jobs.models import Job, JobAttempt, JobState
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


def test_a_crashing_server_is_restarted_as_max_retries_says_then_fails(live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", kind="inference", gpus=2, max_retries=2)
    job_id, numbers = attempt.job_id, []
    while True:
        gcp = _serve(world, attempt)
        pod = gcp.pods(attempt.pk)[0]
        gcp.crash_pod(pod["metadata"]["name"], exit_code=134)
        assert gcp.pods(attempt.pk)[0]["status"]["phase"] == "Running"  # the kubelet keeps the pod, restarting it

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
    assert numbers == [1, 2, 3]
    assert job.state_reason == "attempt 3 server exited (exit code 134) and 2 retries used"
    events = list(job.events.filter(to_state__in=(S.RECOVERING, S.FAILED)).order_by("id").values_list(
        "to_state", "reason"))
    assert events == [(S.RECOVERING, "attempt 1 server exited (exit code 134), retry 1 of 2"),
                      (S.RECOVERING, "attempt 2 server exited (exit code 134), retry 2 of 2"),
                      (S.FAILED, "attempt 3 server exited (exit code 134) and 2 retries used")]
    assert [a.end_reason for a in job.attempts.order_by("number")] == ["Failed"] * 3


def test_an_oom_killed_server_recovers_and_the_crashed_pod_is_billed_until_seen(live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", kind="inference", gpus=2, max_retries=1)
    gcp = _serve(world, attempt)
    gcp.crash_pod(gcp.pods(attempt.pk)[0]["metadata"]["name"], exit_code=137, reason="OOMKilled")
    gcp.step()  # the back-off is over: the kubelet runs the container again, the pod still holds its GPUs

    world.reconcile("gcp-usc1")

    ended = load(attempt.pk)
    assert state(attempt) == S.RECOVERING and (ended.end_reason, ended.exit_code) == ("OOMKilled", 137)
    event = Job.objects.get(pk=attempt.job_id).events.filter(to_state=S.RECOVERING).get()
    assert event.reason == "OOMKilled: attempt 1 server exited (exit code 137), retry 1 of 1"
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


def test_a_serving_pod_evicted_by_its_kubelet_is_replaced_not_counted_as_a_crash():
    """Node-pressure eviction: the pod is Failed with reason Evicted and its container killed (137), without a
    deletionTimestamp; the Deployment runs a new pod, and the attempt goes on."""
    import datetime as dt

    from runners.kubernetes.runner import observe_inference

    now = dt.datetime(2026, 12, 1, 12, tzinfo=dt.timezone.utc)
    deployment = {"metadata": {"creationTimestamp": "2026-12-01T11:00:00Z"}, "spec": {"replicas": 1},
                  "status": {"readyReplicas": 1}}
    evicted = {"metadata": {"name": "s-1"}, "status": {"phase": "Failed", "reason": "Evicted", "containerStatuses": [
        {"name": "server", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}}
    replacement = {"metadata": {"name": "s-2"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "server", "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T11:59:00Z"}}}]}}
    assert observe_inference([deployment], [evicted, replacement], now, 600.0).phase == "running"
    crashed = {"metadata": {"name": "s-2"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "server", "restartCount": 1, "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}},
         "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    seen = observe_inference([deployment], [evicted, crashed], now, 600.0)
    assert (seen.phase, seen.end_reason, seen.exit_code) == ("failed", "Failed", 2)
