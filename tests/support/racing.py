"""Racing on PostgreSQL: scheduler passes in separate OS processes, threads started together, and a monitor that
checks invariants in consistent snapshots while they run.

Every thread closes its own database connection when it ends; the processes use the test's database (not the
base name in the environment) and print ``ready``, then their pass count as JSON when told to stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection

REPO = Path(__file__).resolve().parents[2]

PROCESS_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import django
    django.setup()
    from django.db import connection
    from jobs.scheduling.passes import schedule_pending
    stop = Path(sys.argv[1])
    print("ready", flush=True)
    passes = admitted = 0
    deadline = time.monotonic() + 25
    while not stop.exists() and time.monotonic() < deadline:
        admitted += len(schedule_pending().admitted)
        passes += 1
    connection.close()
    print(json.dumps({"passes": passes, "admitted": admitted}), flush=True)
""")


def database_url() -> str:
    """The URL of the test database this test runs on (not the one in the environment, which is its base name)."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "") + (":" + quote(s["PASSWORD"]) if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@contextlib.contextmanager
def scheduler_processes(count: int, broker_url: str, workdir: Path):
    """``count`` OS processes running scheduling passes in a loop (at most 25 s) on the test's database.

    Yields once all are ready. On leaving the block they are told to stop (a file under ``workdir``); if the
    block ended normally, each must have exited 0 after at least one pass. Close this thread's connection first
    (``connection.close()``) when the test ran its setup in a transaction the processes must see committed.
    """
    env = {**os.environ, "DATABASE_URL": database_url(), "CELERY_BROKER_URL": broker_url,
           "DJANGO_SETTINGS_MODULE": "controlplane.settings", "CONN_MAX_AGE": "0"}
    stop = workdir / "stop"
    processes = [subprocess.Popen([sys.executable, "-c", PROCESS_SCRIPT, str(stop)], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    try:
        for p in processes:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        yield processes
    finally:
        stop.touch()
        outputs = [p.communicate(timeout=60) for p in processes]
    for p, (out, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["passes"] > 0


class SnapshotMonitor(threading.Thread):
    """Calls ``check()`` (a list of broken invariants) every 10 ms until ``stop()``; keeps every answer in
    ``snapshots`` and an exception in ``errors``."""

    def __init__(self, check, errors: list):
        super().__init__()
        self.check = check
        self.errors = errors
        self.snapshots: list[list[str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                self.snapshots.append(self.check())
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            connection.close()

    def stop(self, timeout: float = 30) -> None:
        self.done.set()
        self.join(timeout=timeout)


def run_concurrently(*targets, timeout: float = 60) -> tuple[list, list[BaseException]]:
    """Run each callable in its own thread, all released together at a barrier; returns (results in the order
    of ``targets``, exceptions raised)."""
    barrier = threading.Barrier(len(targets))
    results, errors = [None] * len(targets), []

    def wrap(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=wrap, args=(i, fn)) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results, errors
