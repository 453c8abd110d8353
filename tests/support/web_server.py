"""The web server as production runs it, for tests whose behaviour depends on it (keep-alive, several pods).

``web_server`` starts the gunicorn command of ``platform/kubernetes/base/web.yaml`` (gthread, the project's
gunicorn hooks) on 127.0.0.1 against the test's database; ``exchange`` sends one request on a raw socket the
way a careful client does (it stops sending once the server has answered) and reads the answer.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.support.net import free_port
from tests.support.racing import database_url

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "platform/kubernetes/base/web.yaml"


def manifest_command() -> list[str]:
    """The web Deployment's container command (``gunicorn controlplane.wsgi:application --...``)."""
    for document in yaml.safe_load_all(MANIFEST.read_text()):
        if document and document.get("kind") == "Deployment":
            return document["spec"]["template"]["spec"]["containers"][0]["command"]
    raise LookupError(f"no Deployment in {MANIFEST}")


@contextlib.contextmanager
def web_server(env: dict | None = None, timeout: float = 60):
    """gunicorn as the manifest runs it, bound to a free port of 127.0.0.1, on this test's database (committed
    rows: use ``transactional_db``) and the environment plus ``env``; yields the port, stops it afterwards."""
    port = free_port()
    command = [f"--bind=127.0.0.1:{port}" if arg.startswith("--bind=") else arg for arg in manifest_command()]
    environment = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=REPO,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not listen on port {port} (exit status {process.poll()})")
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def exchange(
    sock: socket.socket,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict | None = None,
    declared_length: int | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """Send one HTTP/1.1 request on ``sock`` and read its answer: (status, headers with lower-case names, body).

    ``declared_length`` (default ``len(body)``) is the ``Content-Length`` sent: larger, the server is told of more
    body than follows. The body goes out in 64 KiB pieces, and sending stops once the server has answered.
    """
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Length: {len(body) if declared_length is None else declared_length}",
    ]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    sent = 0
    while sent < len(body) and not select.select([sock], [], [], 0)[0]:
        sent += sock.send(body[sent : sent + 65536])
    response = http.client.HTTPResponse(sock, method=method)
    response.begin()
    data = response.read()
    return response.status, {name.lower(): value for name, value in response.getheaders()}, data


def closed_by_server(sock: socket.socket, timeout: float = 10) -> bool:
    """Whether the server ends the connection (an orderly end of stream) within ``timeout`` seconds, sending
    nothing more."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
