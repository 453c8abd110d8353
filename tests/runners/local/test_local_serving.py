"""Inference on the local runner: every attempt gets free ports of its own (env PORT), its endpoint is in the
API, a serving job reads the checkpoints of the training job it names, and a crashing server is started again
as often as ``max_retries`` says."""

from __future__ import annotations

import json
from pathlib import Path

import requests
from django.conf import settings as django_settings

from jobs.api.serializers import JobSerializer
from jobs.models import JobAttempt, JobState
from jobs.scheduling.passes import try_admit
from runners.base import backend_for
from runners.local.runner import attempt_dir
from tests.support.factories import make_job_row
from tests.support.local_runner import dispatched, wait_until

from .test_local_runner import reconcile_until

# A tiny HTTP server on $PORT that answers its own environment (what a serving job sees).
ENV_SERVER = ["python", "-c", (
    "import http.server, json, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = json.dumps({k: os.environ.get(k) for k in ('PORT', 'CHECKPOINT_DIR')}).encode()\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
    "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n")]


def answer(url: str) -> dict:
    """The JSON the server at ``url`` answers, once it listens and a replica behind it is ready (until then the
    endpoint's proxy answers 503 itself, which is not the server's answer)."""
    def get():
        try:
            reply = requests.get(url, timeout=2)
        except requests.ConnectionError:
            return None
        return reply.json() if reply.status_code == 200 else None
    return wait_until(get, 15, f"{url} to answer")


def test_a_server_listens_on_its_own_port_and_the_api_shows_its_endpoint(admitted, teams, user, catalog):
    training = make_job_row(teams[0], user, catalog["H100-80GB"], name="train", state=JobState.SUCCEEDED)
    first = dispatched(admitted(ENV_SERVER, nodes=1, kind="inference", spec={"checkpoint_from": training.pk}))
    second = dispatched(admitted(ENV_SERVER, nodes=1, kind="inference"))
    job = reconcile_until(first, {JobState.RUNNING})
    reconcile_until(second, {JobState.RUNNING})

    endpoint = JobSerializer(JobAttempt.objects.get(pk=first.pk).job).data["endpoint"]
    port = first.runner_state["ports"][0]
    # The job's endpoint (its proxy) is not the replica's own port, and balances over the replica on that port.
    assert endpoint == first.runner_state["endpoint"] and endpoint.startswith("http://127.0.0.1:")
    assert first.runner_state["replicas"] == [f"127.0.0.1:{port}"]
    assert port != second.runner_state["ports"][0] and endpoint != second.runner_state["endpoint"]
    seen = answer(endpoint)
    runs = Path(django_settings.LOCAL_RUNNER_DIR).resolve()
    # The serving job reads the training job's checkpoints, not a directory of its own.
    assert seen == {"PORT": str(port), "CHECKPOINT_DIR": str(runs / f"job-{training.pk}" / "checkpoints")}
    assert answer(second.runner_state["endpoint"])["CHECKPOINT_DIR"] == str(runs / f"job-{second.job_id}" / "checkpoints")

    backend_for(first.cluster).delete(first)
    job = reconcile_until(first, {JobState.RECOVERING, JobState.FAILED})
    assert JobSerializer(job).data["endpoint"] is None  # no endpoint once nothing serves


def test_a_crashing_server_is_started_again_as_max_retries_says(admitted):
    attempt = dispatched(admitted(["python", "-c", "import sys; sys.exit(2)"], nodes=1, kind="inference",
                                  max_retries=2))
    job = attempt.job
    numbers = []
    for _ in range(3):
        job = reconcile_until(attempt, {JobState.RECOVERING, JobState.FAILED})
        numbers.append(attempt.number)
        if job.state == JobState.FAILED:
            break
        assert try_admit(job.pk) == "admitted"
        job.refresh_from_db()
        attempt = dispatched(JobAttempt.objects.get(pk=job.current_attempt_id))
    assert numbers == [1, 2, 3] and job.state == JobState.FAILED
    assert job.state_reason == "attempt 3 server exited (exit code 2) and 2 retries used"
    assert [a.end_reason for a in job.attempts.order_by("number")] == ["Failed"] * 3
    assert json.loads((attempt_dir(attempt) / "attempt.json").read_text())["ports"]


def test_a_training_job_that_exits_non_zero_uses_a_retry_and_without_retries_fails(admitted):
    attempt = dispatched(admitted(["python", "-c", "import sys; sys.exit(2)"], nodes=1, max_retries=2))
    job = reconcile_until(attempt, {JobState.RECOVERING, JobState.FAILED})
    assert job.state == JobState.RECOVERING and job.state_reason == "attempt 1 exited (exit code 2), retry 1 of 2"
    attempt = dispatched(admitted(["python", "-c", "import sys; sys.exit(2)"], nodes=1, max_retries=0))
    job = reconcile_until(attempt, {JobState.RECOVERING, JobState.FAILED})
    assert job.state == JobState.FAILED and job.attempts.count() == 1
