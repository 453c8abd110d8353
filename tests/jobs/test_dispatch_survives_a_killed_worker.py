"""A Celery worker SIGKILLed in the middle of a dispatch loses no job: its unacknowledged message is delivered
again to another worker after the Redis transport's visibility timeout, which finds the objects created before
(409, owned by the attempt) and records them, billed from their creation. Real workers on the real broker."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import time

import pytest

from jobs.models import Job, JobAttempt, JobState
from tests.support.broker import FAST, start_worker
from tests.support.clusters import load


def worker(broker_url: str) -> subprocess.Popen:
    """A Celery worker of the fast queue (dispatch's; one process, solo pool) on the test's database and broker,
    2 s visibility timeout."""
    return start_worker(broker_url, [FAST], "-P", "solo", "--without-heartbeat", "-l", "WARNING",
                        env={"CELERY_VISIBILITY_TIMEOUT_SECONDS": "2", "K8S_READ_TIMEOUT_SECONDS": "30"})


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_during_dispatch_leaves_the_job_to_the_next_worker(live_clusters, redis_broker):
    world = live_clusters
    gcp = world.emulators["gcp-usc1"]
    release = gcp.hold("POST", "/jobs")  # the worker will wait inside its Job create
    attempt = world.admit(cluster="gcp-usc1", nodes=1, gpus=2)  # commits: the dispatch task goes to Redis
    first = worker(redis_broker)
    second = None
    try:
        assert wait_for(lambda: gcp.held == 1, 60), "the first worker never reached the Job create"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        release.set()  # the create it had sent lands: the objects exist, nobody recorded them
        assert wait_for(lambda: len(gcp.objects("Job", attempt.pk)) == 1, 10)
        assert Job.objects.get(pk=attempt.job_id).state == JobState.ADMITTED

        second = worker(redis_broker)
        # the second worker boots, then restores the unacknowledged message after the visibility timeout: on a
        # loaded machine the boot alone can take half a minute
        assert wait_for(lambda: Job.objects.get(pk=attempt.job_id).state == JobState.STARTING, 180)
    finally:
        release.set()
        for process in (first, second):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(20)
    (job_object,) = gcp.objects("Job", attempt.pk)  # created once, adopted by the second run
    created = dt.datetime.fromisoformat(job_object["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    assert load(attempt.pk).started_at == created
    assert JobAttempt.objects.filter(job_id=attempt.job_id).count() == 1
