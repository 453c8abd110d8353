"""The local runner's side of a serving job's endpoint: its directory, its ports, the proxy process, the replica list.

Per serving job ``<LOCAL_RUNNER_DIR>/job-<id>/endpoint/`` holds ``endpoint.json`` (``port`` and ``admin_port``,
picked once, so the address stays the job's for its life, across attempts), ``backends.json`` (the replicas the
proxy balances over, ``runners.local.endpoint``), ``proxy.pid`` (the proxy's ``ProcessRef``) and ``proxy.log``.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings

from .endpoint import BACKENDS_FILE
from .layout import read_json, write_json_atomic
from .procs import ProcessRef, boot_id, ref_of, signal_process

ENDPOINT_FILE = "endpoint.json"
PROXY_PID_FILE = "proxy.pid"
DEFAULT_HEALTH_PATH = "/healthz"


def endpoint_dir(job_id: int) -> Path:
    """``<LOCAL_RUNNER_DIR>/job-<job id>/endpoint``: the files of the job's endpoint."""
    return Path(settings.LOCAL_RUNNER_DIR).resolve() / f"job-{job_id}" / "endpoint"


def endpoint_url(conf: dict) -> str:
    """The address clients use: ``http://127.0.0.1:<port>``."""
    return f"http://127.0.0.1:{conf['port']}"


def metrics_url(conf: dict) -> str:
    """Where the proxy serves its own counters: ``http://127.0.0.1:<admin port>/metrics``."""
    return f"http://127.0.0.1:{conf['admin_port']}/metrics"


def ensure_endpoint(job_id: int, attempt_name: str, replicas: list[str], health_path: str, free_ports,
                    hold_seconds: float = 0.0, refusal: str = "") -> dict:
    """Make the job's endpoint balance over ``replicas`` (``host:port`` each) of attempt ``attempt_name``, checked
    on ``health_path``; start its proxy if it does not run. Returns ``endpoint.json``: ``{"port", "admin_port"}``.
    ``hold_seconds`` (a job that scales to zero): how long the proxy holds a request while no replica is ready;
    ``refusal``: why a replica could not be admitted for it (held requests get 503 with it).

    ``free_ports(n)`` picks ``n`` free TCP ports (``runners.local.runner.free_ports``), used once per job. Under
    a lock of the endpoint directory, so concurrent callers start one proxy. Raises OSError.
    """
    directory = endpoint_dir(job_id)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conf = read_json(directory / ENDPOINT_FILE)
        if conf is None:
            port, admin_port = free_ports(2)
            conf = {"port": port, "admin_port": admin_port, "created_at": time.time()}
            write_json_atomic(directory / ENDPOINT_FILE, conf)
        wanted = {"attempt": attempt_name, "replicas": list(replicas), "health_path": health_path,
                  "hold_seconds": hold_seconds, "refusal": refusal}
        current = read_json(directory / BACKENDS_FILE) or {}
        if {k: current.get(k) for k in wanted} != wanted:
            write_json_atomic(directory / BACKENDS_FILE, {**wanted, "updated_at": time.time()})
        proxy = ProcessRef.from_json(read_json(directory / PROXY_PID_FILE))
        if proxy is None or not proxy.alive():
            _start_proxy(directory, conf)
    return conf


def _start_proxy(directory: Path, conf: dict) -> None:
    """Start ``runners.local.endpoint`` for ``directory`` in a session of its own (it outlives the worker)."""
    with open(directory / "proxy.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runners.local.endpoint", "--dir", str(directory), "--port", str(conf["port"]),
             "--admin-port", str(conf["admin_port"]),
             "--idle-exit", str(settings.LOCAL_ENDPOINT_IDLE_EXIT_SECONDS)],
            cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True)
    threading.Thread(target=proc.wait, name=f"reap-endpoint-{directory.parent.name}", daemon=True).start()
    ref = ref_of(proc.pid) or ProcessRef(proc.pid, 0, boot_id())
    write_json_atomic(directory / PROXY_PID_FILE, ref.to_json())


def clear_replicas(job_id: int, attempt_name: str) -> None:
    """Leave the endpoint of the job with no replica if ``attempt_name``'s are the ones listed (its attempt ended):
    the proxy answers 503 until another attempt lists its own, and exits after ``LOCAL_ENDPOINT_IDLE_EXIT_SECONDS``
    without a ready replica."""
    directory = endpoint_dir(job_id)
    if not directory.is_dir():
        return
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = read_json(directory / BACKENDS_FILE) or {}
        if current.get("attempt") == attempt_name and current.get("replicas"):
            write_json_atomic(directory / BACKENDS_FILE, {**current, "replicas": [], "updated_at": time.time()})


def stop_proxy(job_id: int, sig: int) -> bool:
    """Send ``sig`` to the job's proxy if it runs; True when sent."""
    return signal_process(ProcessRef.from_json(read_json(endpoint_dir(job_id) / PROXY_PID_FILE)), sig)
