"""A dispatch that runs past its soft time limit is stopped inside the task and leaves its job as it was (ADMITTED,
not started, nothing billed); the task's retry then finds the objects the stopped run had asked for and records
them once. A real prefork worker of the fast queue, on the real broker, against an emulated cluster whose API
server holds the Job create."""

from __future__ import annotations

import os
import signal

import pytest

from controlplane.celery import app
from costs.models import CostEntry
from jobs.models import Job, JobAttempt, JobState
from jobs.tasks import dispatch_attempt
from tests.support.broker import FAST, start_worker
from tests.support.clusters import load
from tests.support.local_runner import wait_until

SOFT_LIMIT_SECONDS = 2


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_dispatch_past_its_soft_limit_changes_nothing_and_its_retry_starts_the_job(live_clusters, redis_broker,
                                                                                     tmp_path):
    world = live_clusters
    gcp = world.emulators["gcp-usc1"]
    release = gcp.hold("POST", "/jobs")  # the API server answers no Job create until released
    attempt = world.admit(cluster="gcp-usc1", nodes=1, gpus=2)
    app.control.purge()  # the dispatch published on admission: this test sends its own, with a short soft limit
    assert app.amqp.router.route({}, dispatch_attempt.name)["queue"].name == FAST
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = start_worker(redis_broker, [FAST], "--concurrency=1", "-l", "INFO", stdout=log,
                              env={"K8S_READ_TIMEOUT_SECONDS": "30"})  # the hold outlasts the soft limit

    def worker_log() -> str:
        return log_path.read_text(errors="replace")

    try:
        dispatch_attempt.apply_async((attempt.pk,), soft_time_limit=SOFT_LIMIT_SECONDS, time_limit=60)
        wait_until(lambda: gcp.held == 1, 90, "the worker's Job create")
        wait_until(lambda: "SoftTimeLimitExceeded" in worker_log(), 30, "the soft time limit")

        # stopped inside the create: the job, its attempt and the ledger are as the admission left them
        job = Job.objects.get(pk=attempt.job_id)
        assert job.state == JobState.ADMITTED
        assert load(attempt.pk).started_at is None and load(attempt.pk).ended_at is None
        assert not CostEntry.objects.filter(attempt_id=attempt.pk).exists()
        assert gcp.objects("Job", attempt.pk) == []
        assert f"Soft time limit ({SOFT_LIMIT_SECONDS}s) exceeded for {dispatch_attempt.name}" in worker_log()

        release.set()  # the held creates land; the retry finds them (409, owned by the attempt) and records them
        wait_until(lambda: Job.objects.get(pk=attempt.job_id).state == JobState.STARTING, 90, "the retry's start")
        assert worker.poll() is None  # a soft limit stops the task, not the worker
    finally:
        release.set()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
    assert "Retry in" in worker_log() and "SoftTimeLimitExceeded" in worker_log()
    assert len(gcp.objects("Job", attempt.pk)) == 1  # created once, adopted by the retry
    assert load(attempt.pk).started_at is not None
    assert JobAttempt.objects.filter(job_id=attempt.job_id).count() == 1
