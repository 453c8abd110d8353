"""Process inspection for the local runner: identities that survive pid reuse, liveness, process groups.

Standard library only, because the node supervisor (``runners.local.launcher``)
imports it too and must start fast without Django. Linux ``/proc`` is the
source: field 22 of ``/proc/<pid>/stat`` is the start time in clock ticks
since boot (proc(5)), which with the boot id tells a process from a later
one that got the same pid.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

PROC = Path("/proc")
# Process states of proc(5) that mean "exited, not yet (or never to be) reaped".
DEAD_STATES = frozenset({"Z", "X", "x"})


@dataclasses.dataclass(frozen=True)
class ProcInfo:
    """One line of ``/proc/<pid>/stat``: pid, state letter, process group id, start time (clock ticks since boot)."""

    pid: int
    state: str
    pgrp: int
    start: int

    @property
    def dead(self) -> bool:
        """True for a zombie: it exited and only waits for its parent to reap it."""
        return self.state in DEAD_STATES


@dataclasses.dataclass(frozen=True)
class ProcessRef:
    """A process identity that survives pid reuse: pid, start time (ticks since boot) and boot id."""

    pid: int
    start: int
    boot: str

    def to_json(self) -> dict:
        """The identity as a JSON-ready dict (``pid``, ``start``, ``boot``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict | None) -> "ProcessRef | None":
        """The identity stored by ``to_json``; None when ``data`` lacks it."""
        if not data or not isinstance(data.get("pid"), int) or not isinstance(data.get("start"), int):
            return None
        return cls(data["pid"], data["start"], str(data.get("boot", "")))

    def alive(self, table: dict[int, ProcInfo] | None = None) -> bool:
        """Whether this very process still runs (not a zombie, not a later process with the same pid).

        ``table`` is a ``proc_table()`` snapshot; without it ``/proc`` is read now.
        """
        if self.boot and self.boot != boot_id():
            return False
        if table is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass  # it exists, owned by another user
            info = read_proc(self.pid)
        else:
            info = table.get(self.pid)
        return info is not None and not info.dead and info.start == self.start


_BOOT_ID: str | None = None


def boot_id() -> str:
    """This boot's random id (``/proc/sys/kernel/random/boot_id``), "" when unavailable."""
    global _BOOT_ID
    if _BOOT_ID is None:
        try:
            _BOOT_ID = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _BOOT_ID = ""
    return _BOOT_ID


def read_proc(pid: int) -> ProcInfo | None:
    """``/proc/<pid>/stat`` parsed, or None when no such process exists."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last ')'.
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        # fields[0] is field 3 (state); pgrp is field 5, starttime field 22.
        return ProcInfo(pid=pid, state=fields[0], pgrp=int(fields[2]), start=int(fields[19]))
    except (IndexError, ValueError):
        return None


def proc_table() -> dict[int, ProcInfo]:
    """A snapshot of every process on the machine, keyed by pid (one pass over ``/proc``)."""
    table = {}
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            info = read_proc(int(entry.name))
            if info is not None:
                table[info.pid] = info
    return table


def ref_of(pid: int) -> ProcessRef | None:
    """The identity of the running process ``pid`` now, or None when it does not exist."""
    info = read_proc(pid)
    return None if info is None else ProcessRef(pid, info.start, boot_id())


def group_members(leader: ProcessRef, table: dict[int, ProcInfo]) -> list[int]:
    """Live (non-zombie) pids in the process group that ``leader`` created with ``setsid``.

    The group id is the leader's pid. Linux does not hand out a pid while a
    process group still uses it as its id, so members found with that id
    belong to our group, unless the group emptied and a new process with the
    same pid led a new one: then a process with that pid and another start
    time exists, and nothing is returned.
    """
    if leader.boot and leader.boot != boot_id():
        return []
    head = table.get(leader.pid)
    if head is not None and head.start != leader.start:
        return []
    return sorted(p.pid for p in table.values() if p.pgrp == leader.pid and not p.dead and p.start >= leader.start)


def signal_group(leader: ProcessRef, sig: int, table: dict[int, ProcInfo] | None = None) -> bool:
    """Send ``sig`` to the process group led by ``leader`` if it still has live members.

    Returns True when a signal was sent. Never signals a group whose id was
    reused by an unrelated process (see ``group_members``).
    """
    table = proc_table() if table is None else table
    if not group_members(leader, table):
        return False
    try:
        os.killpg(leader.pid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_process(ref: ProcessRef | None, sig: int, table: dict[int, ProcInfo] | None = None) -> bool:
    """Send ``sig`` to ``ref`` if that very process still runs; True when sent."""
    if ref is None or not ref.alive(table):
        return False
    try:
        os.kill(ref.pid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_name(sig: int | None) -> str:
    """``SIGKILL`` for 9; ``signal N`` for a number Python does not name; "" for None."""
    if sig is None:
        return ""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
