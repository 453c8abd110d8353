"""A verdict only on time the control plane watched: a cluster is judged lost (its attempts recovered, their pods
deleted when it answers again) only after reconcile watched it fail for ``CLUSTER_LOST_GRACE_SECONDS``, never on
time the control plane itself was down and looked at nothing.

Class of failure: a verdict on time the control plane did not observe. Invariant: no healthy pod is deleted, and
a cluster's lost-grace counts only the time between looks at most ``CLUSTER_LOST_OBSERVED_GAP_SECONDS`` apart (a
longer gap between two looks restarts the clock at the first failed look after it).

On ``live_clusters`` (``tests/support/clusters.py``) with the control plane's clock moved by ``time_machine``
(frozen; the tests move it) and the cluster's API server stopped for its outage.
"""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine

from jobs.models import JobState
from runners.models import Cluster
from tests.support.clusters import load, state

S = JobState
START = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def clock():
    """The control plane's wall clock, frozen at ``START``; ``clock.shift(seconds)`` moves it."""
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def pod_uids(emulator) -> set[str]:
    return {p["metadata"]["uid"] for p in emulator.pods()}


def test_a_control_plane_outage_longer_than_the_grace_kills_no_healthy_job(clock, live_clusters, settings):
    """The control plane is down for longer than the grace (no look at all), then comes back while the cluster's
    API server fails a few looks in a row. The grace counts from the first of those looks, not from the last
    contact before the outage: the running job is not recovered, and when the cluster answers again its pods
    are all still there and nothing was deleted."""
    world = live_clusters
    attempt = world.running("gcp-usc1", max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    pods_before = pod_uids(gcp)

    clock.shift(settings.CLUSTER_LOST_GRACE_SECONDS + 100)  # the control plane is down: no look, no verdict
    gcp.stop()  # and the cluster's API server does not answer the first looks after the restart
    for _ in range(4):
        result = world.reconcile("gcp-usc1")
        clock.shift(5)

    assert result["unreachable"] and result["recovered"] == 0, result
    assert Cluster.objects.get(name="gcp-usc1").health == "unreachable"
    assert state(attempt) == S.RUNNING and load(attempt.pk).ended_at is None

    gcp.start()
    world.reconcile("gcp-usc1")
    assert state(attempt) == S.RUNNING
    assert gcp.deletions == [] and pod_uids(gcp) == pods_before


GRACE, GAP, EVERY = 60.0, 20.0, 5.0  # the class sweep's grace, bound on a watched gap, and reconcile interval


def watched_failing(looks: list[tuple[float, bool]]) -> float:
    """The definition the class sweep checks against: seconds the control plane watched the cluster fail up to
    its last look. ``looks``: ``(time, answered)`` in order. Walking back from the last look over gaps of at most
    ``GAP`` seconds, through failed looks, to the look that answered (the last contact) or to the first look after
    a longer gap."""
    start = looks[-1][0]
    for (earlier, answered), (later, _) in zip(reversed(looks[:-1]), reversed(looks[1:]), strict=True):
        if later - earlier > GAP:
            break
        start = earlier
        if answered:
            break
    return looks[-1][0] - start


@pytest.mark.parametrize("before", [0, 10], ids=lambda n: f"{n}-failed-before")
@pytest.mark.parametrize("outage", [EVERY, GAP, GAP + 1, 700.0], ids=lambda s: f"down-{s:g}s")
@pytest.mark.parametrize("after", [3, 9, 12, 13], ids=lambda n: f"{n}-failed-after")
def test_a_cluster_is_lost_iff_it_was_watched_failing_for_the_grace(clock, live_clusters, settings, before, outage,
                                                                     after):
    """The class: a cluster answers one look (the job runs), fails ``before`` looks ``EVERY`` s apart, the control
    plane is down for ``outage`` s (no look; a gap of at most ``GAP`` s still counts as watched), then the
    cluster fails ``after`` looks ``EVERY`` s apart. The job is recovered iff, at some look with at least
    ``CLUSTER_UNREACHABLE_AFTER_FAILURES`` failures in a row, the looks watched it failing for ``GRACE`` s
    (``watched_failing``); when the cluster answers again its pods are deleted iff the job was recovered."""
    settings.CLUSTER_LOST_GRACE_SECONDS, settings.CLUSTER_LOST_OBSERVED_GAP_SECONDS = GRACE, GAP
    world = live_clusters
    attempt = world.running("gcp-usc1", max_retries=1)
    gcp = world.emulators["gcp-usc1"]
    pods_before = pod_uids(gcp)
    looks, t = [(0.0, True)], 0.0
    expected = False

    gcp.stop()
    for i in range(before + after):
        step = outage if i == before else EVERY
        clock.shift(step)
        t += step
        looks.append((t, False))
        world.reconcile("gcp-usc1")
        expected = expected or (i + 1 >= settings.CLUSTER_UNREACHABLE_AFTER_FAILURES
                                and watched_failing(looks) >= GRACE)
        assert (load(attempt.pk).ended_at is not None) == expected, (looks, watched_failing(looks))

    assert state(attempt) == (S.RECOVERING if expected else S.RUNNING)
    gcp.start()
    clock.shift(EVERY)
    world.reconcile("gcp-usc1")
    assert (pod_uids(gcp) == pods_before) != expected
    assert bool(gcp.deletions) == expected
