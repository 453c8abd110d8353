"""``GET /api/v1/jobs/{id}/logs/?follow=1`` on a Kubernetes cluster: one ``follow=true`` log stream, read as it grows.

kmock serves an async generator as a chunked streaming answer, one chunk
per item as it is produced, so the test plays the container: it writes a
line, reads it from the API answer, then writes the next one.
"""

from __future__ import annotations

import asyncio

from jobs.tasks import dispatch_attempt
from tests.support.kubernetes import Kubelet

from .steps import start


def serve_log_stream(emulators, cluster: str, path: str):
    """Answer ``GET path`` on ``cluster`` with a stream fed by ``write(bytes)``; ``write(None)`` ends it."""
    async def install() -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()

        async def lines():
            while (data := await queue.get()) is not None:
                yield data

        emulators.handlers[cluster][f"get {path}"] << lines()
        return queue

    queue = emulators.run(install())
    return lambda data: emulators.loop.call_soon_threadsafe(queue.put_nowait, data)


def next_text(chunks) -> str:
    """The next non-empty chunk of a streaming answer, decoded."""
    for chunk in chunks:
        if chunk:
            return chunk.decode()
    raise AssertionError("the stream ended")


def test_follow_returns_lines_as_they_are_written_and_ends_with_the_container(
        emulated_clusters, admitted, settings, teammate):
    settings.LOG_FOLLOW_MAX_SECONDS = 120
    emulators, _ = emulated_clusters
    attempt = admitted()
    _, _, pods = start(emulated_clusters, attempt)
    path = f"/api/v1/namespaces/cp-alpha/pods/{pods[0]['metadata']['name']}/log"
    write = serve_log_stream(emulators, "gcp-usc1", path)
    write(b"step 1 loss 2.3\n")
    reader = teammate

    response = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=1&tail=10")

    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    chunks = iter(response.streaming_content)
    assert next_text(chunks) == "step 1 loss 2.3\n"
    write(b"step 2 loss 2.")  # half a line waits for its end
    write(b"1\nstep 3 loss 1.9\n")
    assert next_text(chunks) == "step 2 loss 2.1\nstep 3 loss 1.9\n"
    write("done ✓".encode()[:-1])  # a partial line, cut inside a UTF-8 character
    write("done ✓".encode()[-1:])
    write(None)  # the container exits: the API server ends the stream
    assert b"".join(chunks).decode() == "done ✓"
    requests = [r for r in emulators.requests("gcp-usc1") if r.url.path == path]
    assert len(requests) == 1  # one streaming read, no polling
    assert requests[0].params.get("follow") == "true" and requests[0].params.get("tailLines") == "10"


def test_follow_ends_after_the_max_duration_when_the_container_stays_quiet(
        emulated_clusters, admitted, settings, teammate):
    settings.LOG_FOLLOW_MAX_SECONDS = 1.0
    emulators, _ = emulated_clusters
    attempt = admitted()
    _, _, pods = start(emulated_clusters, attempt)
    path = f"/api/v1/namespaces/cp-alpha/pods/{pods[0]['metadata']['name']}/log"
    write = serve_log_stream(emulators, "gcp-usc1", path)
    write(b"ready\n")  # then nothing, and the stream stays open
    reader = teammate

    response = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=1")

    assert b"".join(response.streaming_content).decode() == "ready\n"
    write(None)


def test_follow_waits_for_the_pod_then_streams(emulated_clusters, admitted, settings, teammate):
    """Before the pod exists the stream is open and empty; once it runs, its log follows."""
    settings.LOG_FOLLOW_MAX_SECONDS = 120
    settings.LOG_FOLLOW_POLL_SECONDS = 0.05
    emulators, _ = emulated_clusters
    attempt = admitted()
    assert dispatch_attempt(attempt.pk) == "dispatched"
    reader = teammate

    response = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=1")

    chunks = iter(response.streaming_content)
    assert next(chunks) == b""  # the cluster answered: no pod yet
    k = Kubelet(emulators.url("gcp-usc1"))
    pods = k.start_pods(k.job(attempt.pk))
    write = serve_log_stream(emulators, "gcp-usc1",
                             f"/api/v1/namespaces/cp-alpha/pods/{pods[0]['metadata']['name']}/log")
    write(b"hello\n")
    assert next_text(chunks) == "hello\n"
    write(None)
    assert b"".join(chunks) == b""


def test_follow_on_an_unreachable_cluster_is_a_503(emulated_clusters, admitted, teammate):
    emulators, _ = emulated_clusters
    attempt = admitted()
    start(emulated_clusters, attempt)
    emulators.stop("gcp-usc1")
    reader = teammate

    response = reader.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?follow=1")

    assert response.status_code == 503
