"""Between full LISTs a look fetches only what changed on the cluster since the resourceVersions it kept (a watch
resumed from each, docs/adr/0042) and looks again only at the attempts whose objects changed, plus those not
steady yet. Changes the server no longer keeps (410 Gone) or the first contact make it LIST everything; a failed
answer to a watch is a failed look that changes nothing and loses no change.

On ``live_clusters`` (``tests/support/clusters.py``): emulated clusters whose API server keeps a resourceVersion
counter and a log of changes, serves watches from a version and answers 410 Gone for versions it compacted away.
"""

from __future__ import annotations

import datetime as dt

import pytest

from jobs.models import JobState
from runners.models import Cluster
from tests.support.clusters import load, state
from tests.support.kubernetes import Fault

S = JobState


@pytest.fixture(autouse=True)
def full_lists_rarely(settings):
    settings.RECONCILE_FULL_LIST_SECONDS = 3600


def pod_of(emulator, attempt) -> str:
    return emulator.pods(attempt.pk)[0]["metadata"]["name"]


def test_a_steady_cluster_is_looked_at_by_watches_alone(live_clusters):
    """Two RUNNING jobs, nothing changes: the next look LISTs nothing, looks at no attempt and changes nothing."""
    world = live_clusters
    first, second = world.running("gcp-usc1"), world.running("gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    lists, watches = gcp.lists, gcp.watches

    result = world.reconcile("gcp-usc1")

    assert (result["full_list"], result["observed"], result["changed"]) == (False, 0, 0)
    assert gcp.lists == lists and gcp.watches == watches + 4  # Jobs, Deployments, Services, Pods
    assert (state(first), state(second)) == (S.RUNNING, S.RUNNING) and gcp.deletions == []


def test_a_change_is_seen_by_the_next_look_which_looks_at_its_attempt_only(live_clusters):
    """One of two RUNNING jobs finishes on the cluster: the next look looks at that attempt alone and ends it."""
    world = live_clusters
    done, other = world.running("gcp-usc1"), world.running("gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    world.reconcile("gcp-usc1")  # steady
    gcp.finish_pod(pod_of(gcp, done), exit_code=0)
    gcp.step()

    result = world.reconcile("gcp-usc1")

    assert (result["full_list"], result["observed"]) == (False, 1)
    assert (state(done), state(other)) == (S.SUCCEEDED, S.RUNNING)


def test_changes_no_longer_kept_make_the_look_list_everything(live_clusters):
    """The server compacted its changes away (a watch from the kept version answers 410 Gone, Expired): the look
    LISTs everything and still sees the job that finished meanwhile."""
    world = live_clusters
    done = world.running("gcp-usc1")
    gcp = world.emulators["gcp-usc1"]
    gcp.finish_pod(pod_of(gcp, done), exit_code=0)
    gcp.step()
    gcp.compact()

    result = world.reconcile("gcp-usc1")

    assert result["full_list"] is True and result.get("unreachable") is None
    assert state(done) == S.SUCCEEDED
    assert Cluster.objects.get(name="gcp-usc1").consecutive_failures == 0


@pytest.mark.parametrize("kind", [404, 429, 500, 503, "timeout"])
def test_a_failed_answer_to_a_watch_is_a_failed_look_that_loses_no_change(live_clusters, settings, kind):
    """A watch answers an error once while a job finishes: that look fails (counted, nothing moves, nothing is
    deleted, the versions kept stay); the next look gets the change from the same version and ends the job."""
    settings.K8S_READ_TIMEOUT_SECONDS = 0.3
    world = live_clusters
    done, other = world.running("gcp-usc1", max_retries=0), world.running("gcp-usc1", max_retries=0)
    gcp = world.emulators["gcp-usc1"]
    kept = Cluster.objects.get(name="gcp-usc1").reconcile_watch["versions"]
    gcp.finish_pod(pod_of(gcp, done), exit_code=0)
    gcp.step()
    gcp.inject(Fault(kind, method="GET", path="/api/v1/pods?", count=1, delay=0.6))

    failed = world.reconcile("gcp-usc1")

    assert failed.get("unreachable") is True, failed
    assert (state(done), state(other)) == (S.RUNNING, S.RUNNING) and gcp.deletions == []
    cluster = Cluster.objects.get(name="gcp-usc1")
    assert cluster.consecutive_failures == 1 and cluster.reconcile_watch["versions"] == kept

    result = world.reconcile("gcp-usc1")
    assert result["full_list"] is False and (state(done), state(other)) == (S.SUCCEEDED, S.RUNNING)


def test_objects_gone_are_confirmed_by_the_next_look_with_no_change_of_their_own(live_clusters):
    """Someone deletes the Job and its pods: the look that sees the deletions records the attempt absent; the
    next look, with no change on the cluster, looks at it again (not steady) and recovers the job."""
    world = live_clusters
    attempt = world.running("gcp-usc1", max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    with gcp.lock:
        gcp.store["Job"].pop(("cp-alpha", attempt.object_name))
        for key, pod in list(gcp.store["Pod"].items()):
            if pod["metadata"]["labels"].get("controlplane.io/attempt") == str(attempt.pk):
                gcp._delete("Pod", key, cascade=False)

    world.reconcile("gcp-usc1")
    first = load(attempt.pk)
    assert state(attempt) == S.RUNNING and first.absent_since is not None

    result = world.reconcile("gcp-usc1")
    assert result["full_list"] is False
    ended = load(attempt.pk)
    assert state(attempt) == S.RECOVERING and ended.end_reason == "Deleted"
    assert ended.ended_at == first.absent_since


def test_a_look_after_the_control_plane_was_down_lists_everything(live_clusters, settings):
    """The last look that answered is older than CLUSTER_LOST_OBSERVED_GAP_SECONDS (the control plane was down,
    or restored from a backup): nothing it kept is trusted, the look LISTs everything."""
    world = live_clusters
    attempt = world.running("gcp-usc1")
    cluster = Cluster.objects.get(name="gcp-usc1")
    watch = cluster.reconcile_watch
    long_ago = dt.datetime.fromisoformat(watch["looked_at"]) - dt.timedelta(
        seconds=settings.CLUSTER_LOST_OBSERVED_GAP_SECONDS + 1)
    Cluster.objects.filter(pk=cluster.pk).update(reconcile_watch={**watch, "looked_at": long_ago.isoformat()})

    result = world.reconcile("gcp-usc1")

    assert result["full_list"] is True and result["observed"] == 1 and state(attempt) == S.RUNNING


def test_objects_of_an_attempt_ended_meanwhile_are_deleted_by_the_next_look(live_clusters):
    """The control plane ends a RUNNING attempt while its objects stay unchanged on the cluster: the next look
    between full LISTs deletes them as orphans (the attempts ended since the last look are looked up)."""
    from jobs.lifecycle import recover_or_fail
    from jobs.models import JobAttempt

    world = live_clusters
    attempt = world.running("gcp-usc1", max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    recover_or_fail(attempt.job, attempt, end_reason=JobAttempt.EndReason.NODE_LOST, message="test: ended here")
    assert load(attempt.pk).ended_at is not None

    result = world.reconcile("gcp-usc1")

    assert result["full_list"] is False and result["orphans_deleted"] == 1
    assert any(kind == "Job" and name == attempt.object_name for _, kind, name, _ in gcp.deletions)
