"""The simulation's virtual clock: the process's wall clock, frozen, moved only by ``advance``."""

from __future__ import annotations

import datetime as dt

import time_machine

#: Where every scenario's virtual time starts (UTC): far from any real date, so a real timestamp stands out.
EPOCH = dt.datetime(2031, 3, 3, 9, 0, tzinfo=dt.UTC)


class VirtualClock:
    """The wall clock of this process (``time.time``, ``datetime.now``, hence ``django.utils.timezone.now``) frozen
    at ``start`` (aware UTC datetime) with ``time-machine``; ``advance(seconds)`` moves it forward. Threads read
    the same time (the emulated clusters' controllers included). ``time.monotonic`` is left real: client timeouts
    and the emulators' fault windows keep working in real time.
    """

    def __init__(self, start: dt.datetime = EPOCH):
        self._traveller = time_machine.travel(start, tick=False)
        self._coordinates = None

    def __enter__(self) -> VirtualClock:
        self._coordinates = self._traveller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._traveller.stop()
        self._coordinates = None

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` (>= 0) forward. Raises ValueError for a negative step."""
        if seconds < 0:
            raise ValueError(f"the clock only moves forward, not by {seconds} s")
        self._coordinates.shift(dt.timedelta(seconds=seconds))

    def now(self) -> dt.datetime:
        """The virtual time now (aware UTC)."""
        return dt.datetime.now(dt.UTC)
