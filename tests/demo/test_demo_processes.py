"""The demo's supervision and embedded broker: a component that dies is restarted with the reason printed, one
that keeps dying stops the demo naming it; the embedded Redis answers and keeps its queue across a restart."""

from __future__ import annotations

import io
import os
import signal
import socket
import sys
import time

import pytest
import redis

from demo.processes import Supervisor, embedded_broker_command, wait_for_port
from demo.run import Platform, PortInUse
from tests.support.net import free_port

SLEEPER = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(600)"]


def wait(predicate, timeout=15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_component_killed_is_restarted_and_the_reason_printed(tmp_path):
    out = io.StringIO()
    supervisor = Supervisor(tmp_path, tmp_path / "logs", out)
    try:
        worker = supervisor.start("worker", SLEEPER)
        first = worker.process.pid
        supervisor.watch(interval=0.1)
        os.kill(first, signal.SIGKILL)
        assert wait(lambda: worker.process.pid != first and worker.process.poll() is None)
        assert "The worker process stopped (killed by signal SIGKILL); restarting it (1/5)" in out.getvalue()
        assert supervisor.healthy
    finally:
        supervisor.stop()
    assert worker.process.poll() is not None  # stopped with the supervisor


def test_a_component_that_keeps_exiting_stops_the_demo_naming_it(tmp_path):
    out = io.StringIO()
    supervisor = Supervisor(tmp_path, tmp_path / "logs", out, max_restarts=2, window_seconds=60)
    try:
        supervisor.start("beat", [sys.executable, "-c", "import sys; print('cannot open schedule'); sys.exit(3)"])
        supervisor.watch(interval=0.1)
        assert wait(lambda: not supervisor.healthy)
    finally:
        supervisor.stop()
    assert supervisor.failure.startswith("the beat process exited 3 times in 60 s (exit status 3)")
    assert "cannot open schedule" in supervisor.failure  # the log's last lines say why
    assert "Giving up: the beat process" in out.getvalue()


def test_the_embedded_broker_answers_and_keeps_its_queue_across_a_restart(tmp_path):
    out = io.StringIO()
    port = free_port()
    supervisor = Supervisor(tmp_path, tmp_path / "logs", out)
    try:
        broker = supervisor.start("broker", embedded_broker_command(port, tmp_path / "celery"))
        assert wait_for_port(port)
        client = redis.Redis(port=port)
        client.lpush("celery", b"a queued message")
        time.sleep(1.5)  # appendfsync everysec
        os.kill(broker.process.pid, signal.SIGKILL)
        broker.process.wait(timeout=10)
        supervisor.check()  # what the watch thread does every second: restart it
        assert wait_for_port(port)
        assert wait(lambda: _lrange(client) == [b"a queued message"])
    finally:
        supervisor.stop()
    assert "The broker process stopped (killed by signal SIGKILL)" in out.getvalue()


def _lrange(client):
    try:
        return client.lrange("celery", 0, -1)
    except redis.ConnectionError:
        return None


def test_the_demo_refuses_to_start_when_the_embedded_broker_port_is_taken(settings):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings.EMBEDDED_BROKER, settings.EMBEDDED_BROKER_PORT = True, taken.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {settings.EMBEDDED_BROKER_PORT} on 127.0.0.1 .the embedded broker's"):
            Platform(free_port()).check_port_free()
