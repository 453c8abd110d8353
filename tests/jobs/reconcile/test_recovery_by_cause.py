"""A pod taken away recovers the job while retries are left, and the event names the cause: eviction through the
Eviction API, a plain pod deletion, the loss of its node, a spot interruption. Without a retry left the job
fails with that cause. Image pulls and OOM kills fail the job as before (``tests/runners/kubernetes``)."""

from __future__ import annotations

import pytest

from jobs.lifecycle import dispatch
from jobs.models import Job, JobState
from jobs.scheduling.passes import try_admit
from tests.support.clusters import load, state

S = JobState


def _evict(cluster, pod):
    cluster.evict(pod["metadata"]["name"])


def _delete(cluster, pod):
    cluster.delete_pod(pod["metadata"]["name"])


def _lose_node(cluster, pod):
    cluster.delete_node(pod["spec"]["nodeName"])


def _spot(cluster, pod):
    cluster.interrupt_spot(pod["spec"]["nodeName"])


CAUSES = [(_evict, "Evicted"), (_delete, "PodDeleted"), (_lose_node, "NodeLost"), (_spot, "Preempted")]


@pytest.mark.parametrize("take,cause", CAUSES)
def test_a_pod_taken_away_recovers_the_job_and_names_the_cause(live_clusters, take, cause):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", nodes=2, gpus=2, max_retries=1)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    take(gcp, gcp.pods(attempt.pk)[0])

    world.reconcile("gcp-usc1")

    assert state(attempt) == S.RECOVERING
    assert load(attempt.pk).end_reason == cause
    event = Job.objects.get(pk=attempt.job_id).events.filter(to_state=S.RECOVERING).get()
    assert event.reason.startswith(f"{cause}:")
    assert try_admit(attempt.job_id) == "admitted"
    world.reconcile("gcp-usc1")  # the first attempt's remaining objects are deleted as orphans
    assert gcp.objects("Job", attempt.pk) == []


@pytest.mark.parametrize("take,cause", CAUSES[:2])
def test_without_a_retry_left_the_job_fails_with_the_cause(live_clusters, take, cause):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", max_retries=0)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    take(gcp, gcp.pods(attempt.pk)[0])
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.FAILED and load(attempt.pk).end_reason == cause


def test_a_pod_that_vanished_before_the_look_still_recovers(live_clusters):
    """The deleted pod is gone (its termination ended) by the time reconcile looks: the Job failed with fewer
    pods than nodes and none failed by itself, so a pod was taken away."""
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", max_retries=1)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    gcp.delete_pod(gcp.pods(attempt.pk)[0]["metadata"]["name"])
    gcp.step()
    assert gcp.pods(attempt.pk) == []

    world.reconcile("gcp-usc1")

    assert state(attempt) == S.RECOVERING and load(attempt.pk).end_reason == "PodDeleted"


def test_an_oom_kill_still_fails_the_job(live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", max_retries=1)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    gcp.finish_pod(gcp.pods(attempt.pk)[0]["metadata"]["name"], 137, "OOMKilled")
    world.reconcile("gcp-usc1")
    ended = load(attempt.pk)
    assert state(attempt) == S.FAILED and (ended.end_reason, ended.exit_code) == ("OOMKilled", 137)


def test_a_training_exit_code_uses_a_retry_so_max_retries_1_makes_2_attempts(live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", max_retries=1)
    job_id, numbers = attempt.job_id, []
    while True:
        assert dispatch(attempt.pk) == "dispatched"
        world.reconcile("gcp-usc1")
        gcp = world.emulators["gcp-usc1"]
        gcp.finish_pod(gcp.pods(attempt.pk)[0]["metadata"]["name"], 3)
        world.reconcile("gcp-usc1")
        numbers.append(load(attempt.pk).number)
        assert load(attempt.pk).exit_code == 3
        if state(attempt) == S.FAILED:
            break
        assert state(attempt) == S.RECOVERING
        assert try_admit(job_id) == "admitted"
        attempt = load(Job.objects.get(pk=job_id).current_attempt_id)
    assert numbers == [1, 2]
    assert Job.objects.get(pk=job_id).state_reason == "attempt 2 exited (exit code 3) and 1 retries used"
