"""Busy Celery workers outlive their broker: Redis (its own server, on its own port) stops while jobs stream in
and scheduling passes run, stays down, comes back empty; the same worker processes reconnect. Then one is
SIGKILLed, and the other admits every job submitted before, during and after the outage once beat's next pass
is published."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from jobs.lifecycle import submit_job
from jobs.models import Job, JobState
from jobs.scheduling.pacing import publish_schedule
from quotas.models import Quota, Team
from tests.support.broker import FAST, start_worker

OUTAGE_SECONDS = 8


def fast_worker(broker_url: str, log_path, name: str) -> subprocess.Popen:
    """A worker of the fast queue: the scheduling passes and dispatches this test exercises."""
    with open(log_path, "wb") as log:
        return start_worker(broker_url, [FAST], "--concurrency=2", "--loglevel=INFO",
                            f"--hostname={name}-{os.getpid()}@%h", stdout=log)


def wait_for(predicate, timeout: float, step: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_busy_worker_survives_redis_going_away_and_coming_back(catalog, cluster_factory, private_broker, tmp_path):
    h100 = catalog["H100-80GB"]
    user = get_user_model().objects.create(username="streamer")
    team = Team.objects.create(slug="stream", name="stream")
    Quota.objects.create(team=team, accelerator=h100, nominal_gpus=10_000)
    cluster, _ = cluster_factory("big", "aws", "us-east-1", h100, nodes=1000, gpus_per_node=8)
    cluster.api_endpoint = "http://127.0.0.1:9"  # dispatches fail and retry: more work in flight
    cluster.save()
    connection.close()

    def submit(n: int) -> None:
        spec = {"image": "python:3.11", "command": ["python", "train.py"],
                "resources": {"accelerator": h100.name, "gpus_per_node": 1, "nodes": 1}, "priority": 500,
                "max_runtime_seconds": 600, "preemptible": False, "placement": {}, "max_retries": 0}
        submit_job(team=team, submitter=user, name=f"s-{n}", kind="training", spec=spec,
                   resources={"accelerator": h100, "gpus_per_node": 1, "nodes": 1, "priority": 500,
                              "preemptible": False, "max_runtime_seconds": 600, "max_retries": 0})

    worker = fast_worker(private_broker.url, tmp_path / "worker.log", "survivor")
    doomed = fast_worker(private_broker.url, tmp_path / "doomed.log", "doomed")
    stop = threading.Event()
    submitted = []

    def stream():
        try:
            while not stop.is_set():
                submit(len(submitted))
                submitted.append(1)
                time.sleep(0.25)
        finally:
            connection.close()

    submitter = threading.Thread(target=stream)
    try:
        for name in ("worker.log", "doomed.log"):
            assert wait_for(lambda name=name: "ready" in (tmp_path / name).read_text(errors="replace"), 60), \
                (tmp_path / name).read_text(errors="replace")[-3000:]
        submitter.start()
        # the worker is busy: it admits the stream as it comes
        assert wait_for(lambda: Job.objects.exclude(state=JobState.QUEUED).count() >= 5, 30)
        private_broker.stop()
        time.sleep(OUTAGE_SECONDS)
        private_broker.start()
        time.sleep(2)
        stop.set()
        submitter.join(timeout=30)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text(errors="replace")[-4000:]
        assert doomed.poll() is None, (tmp_path / "doomed.log").read_text(errors="replace")[-4000:]
        os.killpg(doomed.pid, signal.SIGKILL)  # the other worker carries on alone
        doomed.wait(timeout=10)
        # beat's periodic pass after the outage (the queue came back empty)
        publish_schedule()
        assert wait_for(lambda: not Job.objects.filter(state=JobState.QUEUED).exists(), 120), (
            Job.objects.filter(state=JobState.QUEUED).count(), (tmp_path / "worker.log").read_text()[-4000:])
        assert worker.poll() is None
        assert Job.objects.count() == len(submitted) > 10
    finally:
        stop.set()
        if submitter.is_alive():
            submitter.join(timeout=30)
        for process in (worker, doomed):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        connection.close()
