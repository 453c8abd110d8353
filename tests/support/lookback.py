"""Observed and idle GPU time of listed scrapes under Prometheus' lookback, computed here without PromQL.

The rule (docs/design.md, "Observed and idle GPU time"): a sample stands for
its GPU from its own timestamp until the next sample or until the lookback
delta runs out, whichever comes first. ``continuous`` measures that in
seconds; ``instants`` measures it at evaluation instants (multiples of the
scrape interval since the Unix epoch, each standing for one interval), as
the platform does.
"""

from __future__ import annotations

import bisect
import math


def continuous(scrapes: list[tuple[float, float]], lo: float, hi: float, lookback: float,
               idle_below: float) -> tuple[float, float]:
    """``(observed seconds, idle seconds)`` of one GPU's ``scrapes`` ``[(unix seconds, utilization percent)]`` in
    ``[lo, hi)``: each sample counts from its time until the next sample or ``lookback`` seconds, clipped to the
    window; idle where its value is under ``idle_below`` percent."""
    scrapes = sorted(scrapes)
    observed = idle = 0.0
    for i, (t, value) in enumerate(scrapes):
        until = t + lookback if i + 1 == len(scrapes) else min(scrapes[i + 1][0], t + lookback)
        length = max(0.0, min(until, hi) - max(t, lo))
        observed += length
        idle += length if value < idle_below else 0.0
    return observed, idle


def instants(scrapes: list[tuple[float, float]], lo: float, hi: float, step: float, lookback: float,
             idle_below: float) -> tuple[float, float]:
    """``(observed seconds, idle seconds)`` of one GPU's ``scrapes`` in ``[lo, hi)`` measured at instants: every
    multiple ``p`` of ``step`` seconds in the window stands for ``[p, p + step)`` cut at ``hi``, and ``lo`` for the
    time up to the first multiple; at each the value is the latest sample in ``(p - lookback, p]`` (none:
    unobserved)."""
    scrapes = sorted(scrapes)
    times = [t for t, _ in scrapes]
    k = math.ceil(round(lo * 1000) / round(step * 1000))
    points = [lo] if k * step > lo else []
    while k * step < hi:
        points.append(k * step)
        k += 1
    observed = idle = 0.0
    for n, p in enumerate(points):
        weight = (points[n + 1] if n + 1 < len(points) else hi) - p
        i = bisect.bisect_right(times, p) - 1
        if i >= 0 and p - times[i] < lookback:
            observed += weight
            idle += weight if scrapes[i][1] < idle_below else 0.0
    return observed, idle
