"""A private Slurm (munged, slurmctld, slurmd) for the submission benchmark's peer phase.

Slurm is what many ML teams submit to instead of the platform. ``SlurmPeer``
starts its own munged (a fresh key, socket, seed and log under a temporary
directory), writes a ``slurm.conf`` with one node on 127.0.0.1, free ports
and a private ``StateSaveLocation``/``SlurmdSpoolDir``, and starts
``slurmctld -D`` and ``slurmd -D``; ``stop`` (also on leaving the ``with``
block through an exception or Ctrl-C) ends each of them and removes the
directory. Nothing is installed: ``missing()`` names the Debian packages to
install when a command is not on PATH.

The configuration is Slurm's defaults, plus what the benchmark needs
(``MaxJobCount`` high enough for every round's jobs, no accounting) and
what Slurm's own advice for high throughput says (``SchedulerParameters=defer``:
no scheduling attempt per submission; logging at ``error``). Submissions are
``sbatch --hold --wrap true``: held jobs are stored and answered, never
started, like the platform's submissions that the benchmark measures.

Job arrays (``array_phase``): one ``sbatch --hold --array=0-<count - 1>``,
the peer of the platform's one-request array (``POST /api/v1/arrays/``).
Slurm stores a pending array as one job record and splits elements off only
when it starts them, so a held array is recorded once. ``MaxArraySize``
(Slurm's default 1001: indices 0-1000) is raised to ``max_array_size(count)``
when the benchmark asks for more elements.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.procstat import client_cpu_seconds, cpu_seconds

COMMANDS = {"munged": "munge", "munge": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm",
            "sbatch": "slurm-wlm", "scancel": "slurm-wlm", "sinfo": "slurm-wlm", "squeue": "slurm-wlm"}
DAEMONS = ("slurmctld", "slurmd", "munged")
#: Slurm's default ``MaxArraySize``: array indices 0 to 1000.
DEFAULT_MAX_ARRAY_SIZE = 1001


def array_indices(count: int, parallelism: int | None = None) -> str:
    """``sbatch --array``'s value for ``count`` elements indexed from 0, with ``%parallelism`` when the elements
    running at once are limited: ``array_indices(1000)`` is ``"0-999"``, ``array_indices(50, 8)`` ``"0-49%8"``.
    Raises ValueError for a count or parallelism under 1."""
    if count < 1 or (parallelism is not None and parallelism < 1):
        raise ValueError(f"an array needs count >= 1 and parallelism >= 1, not {count} and {parallelism}")
    indices = f"0-{count - 1}" if count > 1 else "0"
    return f"{indices}%{parallelism}" if parallelism is not None and parallelism < count else indices


def max_array_size(count: int) -> int:
    """The ``MaxArraySize`` a ``slurm.conf`` needs for arrays of ``count`` elements indexed from 0: Slurm takes
    indices up to ``MaxArraySize - 1``, so at least ``count``, and never under Slurm's default (1001)."""
    return max(DEFAULT_MAX_ARRAY_SIZE, count)


def missing() -> str | None:
    """None when every command the peer runs is on PATH; otherwise which are not and what to install."""
    absent = sorted(cmd for cmd in COMMANDS if shutil.which(cmd) is None)
    if not absent:
        return None
    packages = " ".join(sorted({COMMANDS[cmd] for cmd in absent}))
    return f"{', '.join(absent)} not on PATH: install them (Debian: apt-get install {packages})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmPeer:
    """One private Slurm cluster of one node; ``with SlurmPeer() as slurm: slurm.phase(...)``.

    ``array_count``: the largest job array the benchmark will submit (``MaxArraySize`` is raised to
    ``max_array_size(array_count)``; 0: Slurm's default). Raises ``RuntimeError`` (with the daemon's log) when a
    daemon does not come up within ``timeout`` seconds.
    """

    def __init__(self, timeout: float = 60, array_count: int = 0):
        self.timeout = timeout
        self.dir = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
        self.procs: dict[str, subprocess.Popen] = {}
        host = socket.gethostname().split(".")[0]
        user = getpass.getuser()
        self.user = user
        self.conf = self.dir / "slurm.conf"
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir), "USER": user,
                    "LANG": "C.UTF-8", "SLURM_CONF": str(self.conf)}
        munge_dir = self.dir / "munge"
        munge_dir.mkdir()
        munge_dir.chmod(0o755)  # clients reach the socket through it
        self.socket = munge_dir / "socket"
        d = self.dir
        (d / "state").mkdir()
        (d / "spool").mkdir()
        self.conf.write_text("\n".join([
            "ClusterName=bench",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "SlurmctldDebug=error",
            "SlurmdDebug=error",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            "MaxJobCount=1000000",
            f"MaxArraySize={max_array_size(array_count)}",
            "SchedulerParameters=defer",
            f"NodeName=bench NodeAddr=127.0.0.1 NodeHostname={host} CPUs={os.cpu_count()} RealMemory=1000 "
            "State=UNKNOWN",
            "PartitionName=bench Nodes=bench Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> "SlurmPeer":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, what: str, ready) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [name for name, p in self.procs.items() if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        logs = "".join((self.dir / f"{name}.{ext}").read_text(errors="replace")[-2000:]
                       for name in ("munged", "slurmctld", "slurmd") for ext in ("out", "log")
                       if (self.dir / f"{name}.{ext}").exists())
        raise RuntimeError(f"Slurm: {what} did not happen in {self.timeout:.0f} s\n{logs}")

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.dir, env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def start(self) -> None:
        """Start munged, slurmctld and slurmd; return once the node is idle and a held job was accepted."""
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.dir / "munge"
        self._daemon("munged", ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.socket}",
                                f"--pid-file={m / 'munged.pid'}", f"--log-file={self.dir / 'munged.log'}",
                                f"--seed-file={m / 'munged.seed'}"])
        self._wait("munged's socket", self.socket.exists)
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait("slurmctld answering", lambda: self._run("sinfo", "-h", check=False).returncode == 0)
        self._daemon("slurmd", ["slurmd", "-D", "-N", "bench", "-f", str(self.conf)])
        self._wait("the node turning idle",
                   lambda: self._run("sinfo", "-h", "-o", "%T", check=False).stdout.strip() == "idle")
        self._run(*self.sbatch_argv("bench-warmup"))
        self.cancel_all()

    def stop(self) -> None:
        """End every daemon this peer started (SIGTERM, then SIGKILL after 15 s) and remove its directory."""
        for name in DAEMONS:
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=15)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- the benchmark ----------------------------------------------------------------------------------------

    def sbatch_argv(self, name: str) -> list[str]:
        """One held batch job that would run ``true``: stored and answered by slurmctld, never started."""
        return ["sbatch", "--hold", "--parsable", "-J", name, "-o", "/dev/null", "--wrap", "true"]

    def sbatch_array_argv(self, name: str, count: int, parallelism: int | None = None) -> list[str]:
        """One held job array of ``count`` elements (``--array=0-<count - 1>``, ``%parallelism`` when given) that
        would each run ``true``: recorded by slurmctld as one pending array job, no element started."""
        return ["sbatch", "--hold", "--parsable", f"--array={array_indices(count, parallelism)}", "-J", name,
                "-o", "/dev/null", "--wrap", "true"]

    def array_phase(self, count: int, parallelism: int | None = None, name: str = "bench-array",
                    settle: float = 1.0) -> dict:
        """One ``sbatch --hold --array`` of ``count`` elements; the raw sample: ``elements`` (``count`` when
        accepted, 0 when not), ``errors``, ``error_sample``, ``elapsed`` (s, the sbatch process from start to exit),
        the CPU seconds of slurmctld, slurmd and munged from before sbatch started until ``settle`` seconds after
        it exited (the submission, its authentication and slurmctld recording the array; held, nothing runs), and
        of the client (this process and the sbatch child).
        """
        argv = self.sbatch_array_argv(name, count, parallelism)
        before, client_before = self.cpu(), client_cpu_seconds()
        t0 = time.monotonic()
        r = subprocess.run(argv, cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        elapsed = time.monotonic() - t0
        client_used = client_cpu_seconds() - client_before
        time.sleep(settle)
        after = self.cpu()
        cpu = {key: (after[key] - before[key]) if None not in (after[key], before[key]) else 0.0 for key in DAEMONS}
        ok = r.returncode == 0
        return {"elements": count if ok else 0, "errors": 0 if ok else 1,
                "error_sample": [] if ok else [r.stderr.decode(errors="replace").strip()], "elapsed": elapsed,
                "cpu": cpu, "client_cpu": client_used}

    def cancel_all(self) -> None:
        """Cancel every job of the benchmark's user and wait until none is pending (between phases, unmeasured)."""
        self._run("scancel", "-u", self.user, check=False)
        deadline = time.monotonic() + self.timeout
        while self._run("squeue", "-h", "-t", "PD", "-o", "%i", check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise RuntimeError("Slurm: pending jobs still listed after scancel")
            time.sleep(0.2)

    def cpu(self) -> dict[str, float | None]:
        """CPU seconds used so far by each daemon."""
        return {name: cpu_seconds(self.procs[name].pid) for name in DAEMONS}

    def phase(self, clients: int, seconds: float, name: str = "bench-job", settle: float = 1.0) -> dict:
        """``clients`` threads each running ``sbatch`` one after another for ``seconds``; the raw samples in the
        shape of ``benchmarks/submit.py``'s phases: latencies (s, each sbatch process from start to exit),
        errors, elapsed seconds, the CPU seconds of slurmctld, slurmd and munged, and of the clients (this
        process and its sbatch children: fork, exec and the client side of Slurm's RPC).

        ``settle``: seconds waited after the last submission before the daemons' CPU is read, as the
        platform's phases wait for their scheduling passes.
        """
        argv = self.sbatch_argv(name)
        latencies: list[float] = []
        errors: list[str] = []
        stop_at = time.monotonic() + seconds

        def client() -> None:
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                r = subprocess.run(argv, cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                if r.returncode == 0:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors.append(r.stderr.decode(errors="replace").strip())

        threads = [threading.Thread(target=client) for _ in range(clients)]
        before, client_before = self.cpu(), client_cpu_seconds()
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        client_used = client_cpu_seconds() - client_before
        time.sleep(settle)
        after = self.cpu()
        cpu = {key: (after[key] - before[key]) if None not in (after[key], before[key]) else 0.0 for key in DAEMONS}
        return {"latencies": latencies, "errors": len(errors), "error_sample": errors[:1], "elapsed": elapsed,
                "cpu": cpu, "client_cpu": client_used}
