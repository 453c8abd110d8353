"""The supervisor of one node of a local attempt: runs the command, enforces its deadline, records its end.

Started by ``runners.local.runner`` in a session of its own (so it leads a
process group) with its output going to ``node-<i>.log``::

    python -m runners.local.launcher --attempt-dir DIR --node I --max-runtime S --grace G -- CMD [ARG...]

It starts CMD in its own process group, writes ``node-<i>.pid`` once CMD
runs, and on every way out writes ``node-<i>.exit`` atomically as JSON
``{"exit_code": int|null, "reason": "exited"|"deadline"|"cancelled"|"signal",
"signal": int|null, ...}``:

- CMD exits by itself: ``exited`` with its code, or ``signal`` when a signal
  (not sent by us) killed it (exit_code null, ``signal`` its number);
- it runs past ``--max-runtime`` seconds: ``deadline``;
- the supervisor gets SIGTERM, SIGINT or SIGHUP (a cancel): ``cancelled``.

In the last two cases the group gets SIGTERM, then, after ``--grace``
seconds, SIGKILL. Leftover processes of the group are stopped the same way
before the exit file is written, so an exit file means nothing of the node
runs any more. Standard library only: it must not need Django.
"""

from __future__ import annotations

import argparse
import errno
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from .layout import STOP_FILE, node_path, write_json_atomic
from .procs import ProcessRef, boot_id, proc_table, ref_of, signal_name

# Signals that ask the node to stop (a cancel from the control plane, a shutdown, a hang-up).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Longest wait between two looks at the child when nothing wakes us (seconds).
MAX_WAIT_SLICE = 1.0


class Supervisor:
    """Runs one node's command and records its end in ``node-<node>.exit``.

    ``attempt_dir``: the attempt directory; ``node``: the node index;
    ``command``: argv of the real command; ``max_runtime``: seconds the
    command may run (0 or less: no limit); ``grace``: seconds between
    SIGTERM and SIGKILL.
    """

    def __init__(self, attempt_dir: Path, node: int, command: list[str], max_runtime: float, grace: float):
        self.attempt_dir = attempt_dir
        self.node = node
        self.command = command
        self.max_runtime = max_runtime
        self.grace = grace
        self.pgid = os.getpgrp()
        self.stop_signal: int | None = None
        self.started = time.monotonic()
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_stop_signal)

    def _on_stop_signal(self, signum: int, frame) -> None:
        # Our own SIGTERM to the group comes back here as well; the first stop request wins.
        if self.stop_signal is None:
            self.stop_signal = signum

    def _say(self, text: str) -> None:
        print(f"[controlplane] node {self.node}: {text}", file=sys.stderr, flush=True)

    def run(self) -> int:
        """Run the command to its end; returns the supervisor's exit status (0 when the exit file was written)."""
        if (self.attempt_dir / STOP_FILE).exists():
            self._write_exit(None, "cancelled", None, error="the attempt was stopped before this node started")
            return 0
        try:
            child = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
        except OSError as exc:
            code = 127 if exc.errno == errno.ENOENT else 126
            self._say(f"cannot start {self.command[0]!r}: {exc}")
            self._write_exit(code, "exited", None, error=str(exc))
            return 0
        self._write_pid(child)
        deadline = self.started + self.max_runtime if self.max_runtime > 0 else None
        if self._wait(child, deadline):
            reason = "exited" if child.returncode >= 0 else "signal"
        else:
            if self.stop_signal is not None:
                reason = "cancelled"
                self._say(f"stop requested ({signal_name(self.stop_signal)}); stopping the command")
            else:
                reason = "deadline"
                self._say(f"max_runtime_seconds={self.max_runtime:g} exceeded; stopping the command")
            self._stop(child)
        self._stop_leftovers()
        code = child.returncode
        self._write_exit(code if code >= 0 else None, reason, -code if code < 0 else None)
        return 0

    def _wait(self, child: subprocess.Popen, until: float | None) -> bool:
        """Wait for the child until ``until`` (monotonic) or a stop signal; True when it exited."""
        try:
            pidfd = os.pidfd_open(child.pid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            while True:
                if child.poll() is not None:
                    return True
                if self.stop_signal is not None:
                    return False
                now = time.monotonic()
                if until is not None and now >= until:
                    return False
                slice_s = MAX_WAIT_SLICE if until is None else min(MAX_WAIT_SLICE, until - now)
                if pidfd is None:
                    slice_s = min(slice_s, 0.1)
                fds = [self._wake_r] + ([pidfd] if pidfd is not None else [])
                select.select(fds, [], [], slice_s)
                self._drain_wakeup()
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _drain_wakeup(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _stop(self, child: subprocess.Popen) -> None:
        """SIGTERM the whole group, wait ``grace`` seconds for the child, then SIGKILL what is left."""
        try:
            os.killpg(self.pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            child.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self._say(f"still running {self.grace:g} s after SIGTERM; sending SIGKILL")
            self._kill_others(signal.SIGKILL)
            child.wait()

    def _stop_leftovers(self) -> None:
        """Stop processes the command left in the group (SIGTERM, grace, SIGKILL), so nothing outlives the node."""
        if not self._kill_others(signal.SIGTERM):
            return
        end = time.monotonic() + self.grace
        while time.monotonic() < end and self._others():
            time.sleep(0.05)
        self._kill_others(signal.SIGKILL)

    def _others(self) -> list[int]:
        me = os.getpid()
        return [p.pid for p in proc_table().values() if p.pgrp == self.pgid and p.pid != me and not p.dead]

    def _kill_others(self, sig: int) -> bool:
        """Send ``sig`` to every live member of our group but ourselves; True when there was one."""
        sent = False
        for _ in range(3):  # again, for processes forked while we signalled
            pids = self._others()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    sent = True
                except ProcessLookupError:
                    pass
            if sig != signal.SIGKILL:
                break
        return sent

    def _write_pid(self, child: subprocess.Popen) -> None:
        me = ref_of(os.getpid()) or ProcessRef(os.getpid(), 0, boot_id())
        kid = ref_of(child.pid)
        write_json_atomic(node_path(self.attempt_dir, self.node, "pid"), {
            "node": self.node,
            "supervisor": me.to_json(),
            "pgid": self.pgid,
            "child": kid.to_json() if kid else None,
            "started_at": time.time(),
        })

    def _write_exit(self, exit_code: int | None, reason: str, sig: int | None, error: str = "") -> None:
        record = {
            "exit_code": exit_code, "reason": reason, "signal": sig, "node": self.node,
            "ended_at": time.time(), "runtime_seconds": round(time.monotonic() - self.started, 3),
        }
        if error:
            record["error"] = error
        write_json_atomic(node_path(self.attempt_dir, self.node, "exit"), record)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of the module docstring; the command follows ``--``."""
    p = argparse.ArgumentParser(prog="python -m runners.local.launcher", description=__doc__.splitlines()[0])
    p.add_argument("--attempt-dir", required=True, type=Path)
    p.add_argument("--node", required=True, type=int)
    p.add_argument("--max-runtime", type=float, default=0.0, help="seconds; 0 means no limit")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("a command is required after --")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: supervise the command given on the command line; returns the process exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return Supervisor(args.attempt_dir, args.node, args.command, args.max_runtime, args.grace).run()


if __name__ == "__main__":
    sys.exit(main())
