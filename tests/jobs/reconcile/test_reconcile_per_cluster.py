"""Reconcile is one task per cluster, spread over the fast queue's workers: one cluster's reconcile never runs twice
at once (its lease), and a slow cluster never delays another's. Emulated API servers over HTTP; real workers on the
real broker for the fan-out."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from jobs import reconcile
from jobs.lifecycle import dispatch
from jobs.models import JobState
from runners.models import Cluster
from tests.support.broker import FAST, start_worker
from tests.support.clusters import state

S = JobState
pytestmark = pytest.mark.django_db(transaction=True)


def running(world, cluster: str):
    attempt = world.admit(cluster=cluster, nodes=1, gpus=2)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile(cluster)
    assert state(attempt) == S.RUNNING
    return attempt


def finish(world, cluster: str, attempt) -> None:
    emulator = world.emulators[cluster]
    for pod in emulator.pods(attempt.pk):
        emulator.finish_pod(pod["metadata"]["name"], 0)


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def lease(cluster: Cluster) -> tuple[str, dt.datetime | None]:
    row = Cluster.objects.values("reconcile_lease_holder", "reconcile_lease_until").get(pk=cluster.pk)
    return row["reconcile_lease_holder"], row["reconcile_lease_until"]


def test_a_cluster_is_reconciled_once_at_a_time_and_a_slow_one_delays_no_other(live_clusters, settings):
    settings.K8S_READ_TIMEOUT_SECONDS = 30.0  # the held LIST waits for the test, not for the client's timeout
    world = live_clusters
    (slow_name, slow), (quick_name, quick) = sorted(world.clusters.items())
    on_slow, on_quick = running(world, slow_name), running(world, quick_name)
    finish(world, slow_name, on_slow)
    finish(world, quick_name, on_quick)
    release = world.emulators[slow_name].hold("GET", "/pods")
    first: list[dict] = []
    holder = threading.Thread(target=lambda: (first.append(reconcile.reconcile_leased(slow.pk, "first")),
                                              connection.close()))
    holder.start()
    try:
        assert wait_for(lambda: world.emulators[slow_name].held >= 1, 30), "the first pass never reached its LIST"
        assert lease(slow)[0] == "first"

        second = reconcile.reconcile_leased(slow.pk, "second")
        other = reconcile.reconcile_leased(quick.pk, "other")

        assert "skipped" in second and lease(slow)[0] == "first"  # the running pass keeps its lease
        assert other["ended"] == 1 and state(on_quick) == S.SUCCEEDED  # not delayed by the slow cluster
        assert state(on_slow) == S.RUNNING
    finally:
        release.set()
        holder.join(60)
    assert first and first[0]["ended"] == 1 and state(on_slow) == S.SUCCEEDED
    assert lease(slow) == ("", None) and lease(quick) == ("", None)  # both given back


def test_a_lease_left_by_a_killed_holder_is_taken_once_it_runs_out(live_clusters):
    world = live_clusters
    name, cluster = sorted(world.clusters.items())[0]
    attempt = running(world, name)
    finish(world, name, attempt)
    now = timezone.now()
    Cluster.objects.filter(pk=cluster.pk).update(reconcile_lease_holder="killed",
                                                 reconcile_lease_until=now + dt.timedelta(seconds=30))

    assert "skipped" in reconcile.reconcile_leased(cluster.pk, "next")
    assert state(attempt) == S.RUNNING

    Cluster.objects.filter(pk=cluster.pk).update(reconcile_lease_until=now - dt.timedelta(seconds=1))
    assert reconcile.reconcile_leased(cluster.pk, "next")["ended"] == 1
    assert state(attempt) == S.SUCCEEDED and lease(cluster) == ("", None)


def test_only_one_of_two_racing_passes_takes_the_lease(live_clusters):
    world = live_clusters
    cluster = sorted(world.clusters.values(), key=lambda c: c.name)[0]
    now = timezone.now()
    taken = [reconcile.take_reconcile_lease(cluster.pk, holder, now) for holder in ("a", "b")]
    assert taken == [True, False] and lease(cluster)[0] == "a"
    reconcile.give_back_reconcile_lease(cluster.pk, "b")  # not b's: left as it is
    assert lease(cluster)[0] == "a"
    reconcile.give_back_reconcile_lease(cluster.pk, "a")
    assert lease(cluster) == ("", None)
    assert reconcile.take_reconcile_lease(-1, "c", now) is False  # no such cluster


def test_the_periodic_reconcile_fans_out_to_the_workers_and_a_stuck_cluster_holds_only_one(live_clusters,
                                                                                         redis_broker):
    """Two workers of the fast queue, one cluster whose API server does not answer its LIST: the other cluster's
    ended job is still seen, by the other worker, on the next beat's fan-out."""
    from jobs.tasks import reconcile_all

    world = live_clusters
    (slow_name, slow), (quick_name, _) = sorted(world.clusters.items())
    on_slow, on_quick = running(world, slow_name), running(world, quick_name)
    release = world.emulators[slow_name].hold("GET", "/pods")
    finish(world, quick_name, on_quick)
    workers = [start_worker(redis_broker, [FAST], "-P", "solo", "--without-heartbeat", "-l", "WARNING",
                            env={"K8S_READ_TIMEOUT_SECONDS": "60"}) for _ in range(2)]
    try:
        def seen() -> bool:
            reconcile_all.delay()  # what beat publishes every RECONCILE_INTERVAL_SECONDS
            return wait_for(lambda: state(on_quick) == S.SUCCEEDED, 5)

        reconcile_all.delay()
        assert wait_for(lambda: world.emulators[slow_name].held >= 1, 120), "the stuck cluster was never looked at"
        assert wait_for(seen, 180), "the quick cluster's end was never reconciled"
        # the stuck cluster's pass still waits on its LIST, holding its lease and one worker
        assert world.emulators[slow_name].held >= 1 and lease(slow)[0] != "" and state(on_slow) == S.RUNNING
    finally:
        release.set()
        for process in workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in workers:
            process.wait(30)
