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
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in total and (fields := _stat(entry)) is not None:
            total[comm] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total
