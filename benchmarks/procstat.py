"""CPU time of processes from Linux ``/proc``, for the benchmarks' CPU-per-job figures."""

from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...), or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _comm(pid: int | str) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds used so far by process ``pid`` (all its threads); None where /proc lacks it."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of process ``root`` and its live descendants (e.g. gunicorn and its workers)."""
    parents, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(entry)) is not None:
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    total = 0.0
    for pid, seconds in cpu.items():
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            total += seconds
    return total


def named_cpu_seconds(names: tuple[str, ...]) -> dict[str, float]:
    """User + system CPU seconds of the live processes whose command name (``/proc/<pid>/comm``) is in
    ``names``, summed per name: e.g. ``("postgres", "redis-server")``, the servers a benchmark talks to.

    A process that exits takes its CPU time with it, so a phase's figure is only complete when the
    servers' processes outlive it (PostgreSQL backends of persistent connections, ``CONN_MAX_AGE``).
    """
    total = dict.fromkeys(names, 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        comm = _comm(entry)
        if comm in total and (fields := _stat(entry)) is not None:
            total[comm] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def pids_cpu_seconds(pids) -> dict[int, float]:
    """``{pid: user + system CPU seconds}`` of those of ``pids`` that are alive and readable."""
    out = {}
    for pid in pids:
        seconds = cpu_seconds(pid)
        if seconds is not None:
            out[pid] = seconds
    return out


def used_since(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two ``pids_cpu_seconds`` snapshots by the processes alive at the second: a process
    that started in between counts whole, one that exited in between is lost (its time went with it)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def client_cpu_seconds(children: bool = True) -> float:
    """User + system CPU seconds of this process (all its threads) and, with ``children``, of its waited-for
    children, e.g. the ``sbatch`` processes a client thread ran: the load generator's own cost."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    if children:
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += waited.ru_utime + waited.ru_stime
    return total


class DatabaseBackends:
    """CPU time of the PostgreSQL backends serving one database (``pg_stat_activity``), not of the whole server.

    On a machine where other databases of the same server are busy (a test suite, another benchmark), the
    server-wide figure charges their work to the benchmark; the backends of the benchmark's own database do
    not. The server's shared background processes (WAL writer, checkpointer) are left out for the same
    reason: the commits' WAL flushes run in the committing backends. Needs the server on this machine (its
    process ids readable in ``/proc``); ``snapshot`` returns None otherwise.

    ``admin_url``: a ``postgres://`` URL of another database of the same server (its own backend is not
    counted); ``dbname``: the benchmark's database.
    """

    def __init__(self, admin_url: str, dbname: str):
        import psycopg

        self.dbname = dbname
        self.conn = psycopg.connect(admin_url.replace("postgres://", "postgresql://"), autocommit=True)
        own_pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self.local = cpu_seconds(own_pid) is not None and _comm(own_pid) == "postgres"

    def snapshot(self, exclude: frozenset[int] = frozenset()) -> dict[int, float] | None:
        """``{pid: CPU seconds}`` of the database's backends now, less those of ``exclude`` (e.g. the backend of
        the benchmark's own polling connection); None when the server is not on this machine."""
        if not self.local:
            return None
        pids = [row[0] for row in self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.dbname]) if row[0] not in exclude]
        return pids_cpu_seconds(pids)

    def close(self) -> None:
        self.conn.close()


def machine() -> dict:
    """Cores and load averages (1, 5, 15 min) of this machine, for a result line: rates need them to be read."""
    return {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
