"""A private Redis server (``redis-server`` on a free port, no persistence) that a test may stop and start again,
and the Celery app pointed at it: never the shared server on 6379, which other tests use.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from controlplane.celery import app
from jobs.scheduling import pacing
from tests.support.net import free_port, stop_process


class PrivateRedis:
    """``redis-server`` on 127.0.0.1:``port``; ``stop()`` ends it (clients see connection refused), ``start()``
    brings it back on the same port (empty: the server keeps nothing on disk)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="redis-private-"))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> None:
        self.process = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not listen on port {self.port}")

    def stop(self) -> None:
        """Stop the server as an operator does (SIGTERM: it closes every client connection and exits)."""
        if self.process is not None and self.process.poll() is None:
            stop_process(self.process)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _reset_celery_connections() -> None:
    """Forget the app's broker connection and producer pools, so the next publish uses the pool of the broker URL
    configured now (kombu keeps one pool per URL: the other URL's pool stays open for when it is configured
    again)."""
    app._pool = None
    app.amqp._producer_pool = None
    pacing._redis_client = None  # the scheduling flag's client follows the broker URL too


@pytest.fixture
def private_redis():
    """A started ``PrivateRedis``; killed and removed afterwards."""
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def private_broker(private_redis, settings, monkeypatch):
    """The Celery app (and the scheduling flag) publishing to ``private_redis`` for the test; yields the server."""
    url, options = app.conf.broker_url, app.conf.broker_transport_options
    monkeypatch.setenv("CELERY_BROKER_URL", private_redis.url)  # Celery reads it before its configuration
    settings.CELERY_BROKER_URL = private_redis.url
    app.conf.broker_url, app.conf.broker_transport_options = private_redis.url, {}
    _reset_celery_connections()
    try:
        yield private_redis
    finally:
        pacing.SCHEDULE_NOTIFIER.flush(timeout=2)
        monkeypatch.undo()
        app.conf.broker_url, app.conf.broker_transport_options = url, options
        _reset_celery_connections()
