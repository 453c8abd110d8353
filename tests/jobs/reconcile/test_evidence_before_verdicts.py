"""Reconcile believes only what a cluster really says: failed, erroring, empty or malformed answers are failed
looks (counted in the cluster's health) that change nothing; an attempt is gone only when its own object answers
404 on two looks in a row; orphan cleanup never deletes objects of a live attempt. Every look here LISTs.

On ``live_clusters`` (``tests/support/clusters.py``): emulated clusters with a Job controller, nodes and faults.
"""

from __future__ import annotations

import pytest

from jobs.lifecycle import dispatch
from jobs.models import Job, JobAttempt, JobState
from runners.models import Cluster
from tests.support.clusters import load, state
from tests.support.kubernetes import Fault

S = JobState


@pytest.fixture(autouse=True)
def every_look_lists(settings):
    """The faults here are injected into LIST answers: every look LISTs everything (the answers to the watches
    of the looks between full LISTs: ``test_watched_changes.py``)."""
    settings.RECONCILE_FULL_LIST_SECONDS = 0


def running(world, **kw) -> JobAttempt:
    """A job admitted on gcp-usc1, dispatched, its pods running and seen RUNNING by reconcile."""
    return world.running("gcp-usc1", **kw)


def test_one_404_to_the_job_list_kills_no_healthy_job(live_clusters):
    """Two RUNNING jobs (max_retries 1 and 0); the Job LIST answers 404 once, as an API server behind a load
    balancer during an upgrade does. Neither job moves, nothing is deleted, the cluster counts one failure."""
    world = live_clusters
    retry_left, no_retry = running(world, max_retries=1), running(world, max_retries=0)
    gcp = world.emulators["gcp-usc1"]
    pods_before = {p["metadata"]["uid"] for p in gcp.pods()}
    gcp.inject(Fault(404, method="GET", path="/apis/batch/v1/jobs", count=1))

    result = world.reconcile("gcp-usc1")

    assert result["unreachable"] and "404" in result["failure"]
    assert (state(retry_left), state(no_retry)) == (S.RUNNING, S.RUNNING)
    assert gcp.deletions == [] and {p["metadata"]["uid"] for p in gcp.pods()} == pods_before
    cluster = Cluster.objects.get(name="gcp-usc1")
    assert (cluster.health, cluster.consecutive_failures) == ("degraded", 1)
    assert JobAttempt.objects.filter(pk__in=[retry_left.pk, no_retry.pk], ended_at__isnull=True).count() == 2

    world.reconcile("gcp-usc1")  # the next look answers: healthy again, and still nothing moved
    assert Cluster.objects.get(name="gcp-usc1").health == "healthy"
    assert (state(retry_left), state(no_retry)) == (S.RUNNING, S.RUNNING) and gcp.deletions == []


@pytest.mark.parametrize("kind,path", [(kind, "/apis/batch/v1/jobs") for kind in (404, 410, 429, 500, 503, "timeout",
                                                                                  "truncated")]
                         + [(404, "/api/v1/pods"), ("truncated", "/api/v1/services")])
def test_a_failed_answer_to_any_list_is_a_failed_look_that_changes_nothing(live_clusters, settings, kind, path):
    settings.K8S_READ_TIMEOUT_SECONDS = 0.3
    world = live_clusters
    attempt = running(world, max_retries=0)
    gcp = world.emulators["gcp-usc1"]
    gcp.inject(Fault(kind, method="GET", path=path, count=1, delay=0.6))

    result = world.reconcile("gcp-usc1")

    assert result.get("unreachable") is True, result
    assert state(attempt) == S.RUNNING and gcp.deletions == []
    assert Cluster.objects.get(name="gcp-usc1").consecutive_failures == 1


def test_an_empty_list_is_checked_object_by_object_and_kills_nothing(live_clusters):
    """A LIST that answers no items while objects exist: each attempt is read by its own GET, which finds it."""
    world = live_clusters
    attempt = running(world, max_retries=0)
    gcp = world.emulators["gcp-usc1"]
    for path in ("/apis/batch/v1/jobs", "/api/v1/pods", "/api/v1/services"):
        gcp.inject(Fault("empty", method="GET", path=path, count=1))

    world.reconcile("gcp-usc1")

    assert state(attempt) == S.RUNNING and gcp.deletions == []
    assert load(attempt.pk).absent_since is None


def test_a_single_404_to_the_objects_own_get_is_not_enough(live_clusters):
    """The LIST misses the Job and its GET answers 404, once: recorded, not acted on; the next look sees it."""
    world = live_clusters
    attempt = running(world, max_retries=0)
    gcp = world.emulators["gcp-usc1"]
    gcp.inject(Fault("empty", method="GET", path="/apis/batch/v1/jobs", count=1))
    gcp.inject(Fault(404, method="GET", path=f"/jobs/{attempt.object_name}", count=1))

    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RUNNING and load(attempt.pk).absent_since is not None

    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RUNNING and load(attempt.pk).absent_since is None
    assert gcp.deletions == []


def test_objects_gone_on_two_looks_in_a_row_end_the_attempt_billed_to_the_first(live_clusters):
    """Someone deletes the Job (and so its pods): the first look records it, the second recovers the job."""
    world = live_clusters
    attempt = running(world, max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    with gcp.lock:
        job = gcp.store["Job"].pop(("cp-alpha", attempt.object_name))
        for key, pod in list(gcp.store["Pod"].items()):
            if pod["metadata"]["labels"].get("controlplane.io/attempt") == str(attempt.pk):
                gcp._delete("Pod", key, cascade=False)
    assert job is not None

    world.reconcile("gcp-usc1")
    first = load(attempt.pk)
    assert state(attempt) == S.RUNNING and first.absent_since is not None

    world.reconcile("gcp-usc1")
    ended = load(attempt.pk)
    assert state(attempt) == S.RECOVERING and ended.end_reason == "Deleted"
    assert ended.ended_at == first.absent_since  # billed up to the first look that missed it
    event = Job.objects.get(pk=attempt.job_id).events.filter(to_state=S.RECOVERING).get()
    assert "Deleted" in event.reason


def test_orphan_cleanup_keeps_objects_of_an_attempt_being_dispatched(live_clusters):
    """An ADMITTED attempt whose Service exists and whose Job is not created yet owns its Service."""
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", nodes=2)
    gcp = world.emulators["gcp-usc1"]
    gcp.inject(Fault(503, method="POST", path="/jobs", count=None))
    from runners.base import TransientDispatchError
    with pytest.raises(TransientDispatchError):
        dispatch(attempt.pk)
    assert len(gcp.objects("Service", attempt.pk)) == 1

    result = world.reconcile("gcp-usc1")

    assert result["orphans_deleted"] == 0 and gcp.deletions == [] and state(attempt) == S.ADMITTED


def test_an_empty_pod_list_while_the_job_counts_pods_is_a_failed_look(live_clusters):
    """Pods missing from their LIST would read as pods deleted (a recovery) and leave running pods unbilled."""
    world = live_clusters
    attempt = running(world, max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    gcp.inject(Fault("empty", method="GET", path="/api/v1/pods", count=1))

    result = world.reconcile("gcp-usc1")

    assert result.get("unreachable") is True and "lacks" in result["failure"]
    assert state(attempt) == S.RUNNING


@pytest.mark.parametrize("kind", ["empty", "truncated"])
def test_a_create_answered_with_something_else_than_the_object_is_retried(live_clusters, kind):
    """A 2xx whose body is not the created object says nothing about it: the dispatch is retried, and the retry
    finds what exists (created, or not) instead of failing the job."""
    from runners.base import TransientDispatchError

    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    gcp.inject(Fault(kind, method="POST", path="/jobs", count=1))
    with pytest.raises(TransientDispatchError):
        dispatch(attempt.pk)
    assert state(attempt) == S.ADMITTED
    assert dispatch(attempt.pk) == "dispatched"
    assert len(gcp.objects("Job", attempt.pk)) == 1
