"""``GET /api/v1/jobs/{id}/logs/?follow=1`` over the local backend: a text/plain stream of the tail, then new lines."""

from __future__ import annotations

import time

from tests.support.local_runner import dispatched

PRINT_OVER_TWO_SECONDS = ["python", "-c", "import time\nfor i in range(10):\n    print(f'line {i}', flush=True)\n"
                                          "    time.sleep(0.2)\n"]
PRINT_AND_SLEEP = ["python", "-c", "import time; print('ready', flush=True); time.sleep(60)"]


def read_stream(response) -> tuple[list[bytes], float]:
    """Every chunk of a streaming response and the seconds it took to read them."""
    started = time.monotonic()
    chunks = [chunk for chunk in response.streaming_content if chunk]
    return chunks, time.monotonic() - started


def test_follow_streams_every_line_while_the_attempt_runs_and_ends_with_it(admitted, teams, settings, teammate):
    settings.LOG_FOLLOW_POLL_SECONDS = 0.1
    settings.LOG_FOLLOW_MAX_SECONDS = 30
    attempt = dispatched(admitted(PRINT_OVER_TWO_SECONDS, nodes=1))
    reader = teammate

    response = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=1&tail=50")

    assert response.status_code == 200
    assert response.streaming and response["Content-Type"].startswith("text/plain")
    chunks, seconds = read_stream(response)
    body = b"".join(chunks).decode()
    assert body.splitlines() == [f"line {i}" for i in range(10)]  # every line, once, in order
    assert len(chunks) > 1  # lines came as they were printed, not in one read at the end
    assert 1.0 < seconds < 20  # it waited for the job and stopped when the job ended, long before the 30 s cap


def test_follow_stops_after_the_max_duration(admitted, teams, settings, teammate):
    settings.LOG_FOLLOW_POLL_SECONDS = 0.1
    settings.LOG_FOLLOW_MAX_SECONDS = 1.5
    attempt = dispatched(admitted(PRINT_AND_SLEEP, nodes=1))
    reader = teammate
    deadline = time.monotonic() + 10
    while "ready" not in reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/").json()["text"]:
        assert time.monotonic() < deadline, "the job never printed"
        time.sleep(0.05)

    response = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=1")

    chunks, seconds = read_stream(response)
    assert b"".join(chunks).decode() == "ready\n"
    assert 1.0 < seconds < 5


def test_plain_logs_stay_json_and_follow_checks_the_node(admitted, teams, settings, teammate):
    attempt = dispatched(admitted(PRINT_OVER_TWO_SECONDS, nodes=1))
    reader = teammate
    plain = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=0")
    assert plain.status_code == 200 and set(plain.json()) == {"node", "attempt", "text"}
    bad = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=1&node=3")
    assert bad.status_code == 400
