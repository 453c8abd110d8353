"""Network and process utilities for tests that start servers (Prometheus, Redis, the OpenID Connect provider, the
example workloads, the demo)."""

from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """Stop a server process as an operator does: SIGTERM, then SIGKILL if it has not exited within ``timeout``
    seconds; returns once it has exited."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
