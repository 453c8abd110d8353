"""A job run for real on the local runner, followed with ``cpctl``: ``submit --wait`` to SUCCEEDED, ``logs --follow``.

The CLI runs as ``python -m cpctl`` subprocesses against the live
server while this test thread takes the Celery worker's steps (admit,
dispatch, reconcile), as the browser test does.
"""

from __future__ import annotations

import json
import queue
import threading
import time

import pytest
import yaml

from jobs.models import Job
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from jobs.tasks import dispatch_attempt

from .conftest import spawn_cli

# Prints a line, then waits for the file named by its argument (the test's go-ahead), then prints another.
PROGRAM = ("import os, sys, time; print('first line', flush=True); "
           "[time.sleep(0.05) for _ in iter(lambda: os.path.exists(sys.argv[1]), True)]; "
           "print('second line', flush=True)")


@pytest.fixture
def local_cluster(funded_local_cluster, settings):
    """``funded_local_cluster``, with followed logs polled every 0.2 s."""
    settings.LOG_FOLLOW_POLL_SECONDS = 0.2
    return funded_local_cluster


def wait_for(predicate, what: str, timeout: float = 60.0, step=None):
    """Call ``step`` (if any) until ``predicate()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if step is not None:
            step()
        time.sleep(0.2)


def test_submit_wait_and_logs_follow_a_job_to_succeeded(server, owner, local_cluster, run_cli, tmp_path):
    accelerator = local_cluster.node_pools.get(name="gpu").accelerator.name
    go = tmp_path / "go"
    document = {"team": "alpha", "name": "hello-cli", "spec": {
        "image": "python:3.11", "command": ["python", "-c", PROGRAM, str(go)],
        "resources": {"accelerator": accelerator, "gpus_per_node": 1, "nodes": 1}, "max_runtime_seconds": 120}}
    path = tmp_path / "hello.yaml"
    path.write_text(yaml.safe_dump(document))

    submit = spawn_cli(server, owner.key, "submit", str(path), "--wait", "--interval", "0.3")
    follow = None
    try:
        wait_for(lambda: Job.objects.exists() or submit.poll() is not None, "the submission")
        job = Job.objects.get()
        assert try_admit(job.pk) == "admitted"
        job.refresh_from_db()
        assert dispatch_attempt(job.current_attempt_id) == "dispatched"
        follow = spawn_cli(server, owner.key, "logs", str(job.pk), "--follow")
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=lambda: lines.put(follow.stdout.readline()), daemon=True)
        reader.start()
        # The first line must come through while the job still runs (it waits for `go`): streamed, not
        # delivered when the attempt ends.
        wait_for(lambda: not lines.empty(), "the first followed line", step=lambda: reconcile_cluster(local_cluster))
        assert not Job.objects.get(pk=job.pk).is_final
        first = lines.get()
        wait_for(lambda: Job.objects.get(pk=job.pk).state == "RUNNING", "RUNNING",
                 step=lambda: reconcile_cluster(local_cluster))
        time.sleep(1.0)  # a few of the --wait client's 0.3 s polls fall while it runs, however loaded the machine
        go.touch()
        wait_for(lambda: Job.objects.get(pk=job.pk).is_final, "the job's end", step=lambda: reconcile_cluster(
            local_cluster))
        submitted_out, submitted_err = submit.communicate(timeout=60)
        rest, followed_err = follow.communicate(timeout=60)
        followed_out = first + rest
    finally:
        for process in (submit, follow):
            if process is not None and process.poll() is None:
                process.kill()

    assert Job.objects.get(pk=job.pk).state == "SUCCEEDED"
    assert submit.returncode == 0, (submitted_out, submitted_err)
    lines = submitted_out.splitlines()
    assert lines[0] == f"job {job.pk} submitted: hello-cli (team alpha), QUEUED"
    assert any(f"job {job.pk}: RUNNING" in line for line in lines[1:-1])  # it ran until `go`, polled every 0.3 s
    assert lines[-1].startswith(f"job {job.pk} ended SUCCEEDED, cost $")

    assert follow.returncode == 0, followed_err
    assert followed_out == "first line\nsecond line\n"

    tail = run_cli("logs", str(job.pk), "--tail", "1", persona=owner)
    assert (tail.code, tail.out) == (0, "second line\n")
    body = json.loads(run_cli("logs", str(job.pk), "--json", persona=owner).out)
    assert body["attempt"] == 1 and body["text"] == "first line\nsecond line\n"
    events = run_cli("events", str(job.pk), persona=owner).out
    assert "RUNNING -> SUCCEEDED" in events
