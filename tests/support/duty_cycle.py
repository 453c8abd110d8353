"""A GPU pod's duty cycle scraped the way production DCGM series arrive: late by one to four scrapes, and once
not at all for hours.

The shape: dcgm-exporter scraped every 57 s, each next sample 57 s later in
about half of the cases and 114, 171, 228 or 285 s later in the rest (one to
four scrapes missed, all within Prometheus' 5-minute lookback), one outage
of 3 hours with no sample; the workload alternates busy phases (60-100 %)
and idle phases (0-3 %) of 10 to 50 minutes. Seeded, so every run is the
same. The expected figures are computed from the listed samples by
``tests.support.lookback``, not by the platform.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from datetime import UTC

SCRAPE = 57  # seconds between scrapes
# How many scrape intervals after a sample the next one arrives, and how often (weights).
LATENESS = {1: 50, 2: 20, 3: 13, 4: 9, 5: 8}
OUTAGE = (dt.timedelta(hours=5), dt.timedelta(hours=8))  # after the start: no sample at all


@dataclasses.dataclass(frozen=True)
class DutyCycle:
    """One pod's GPUs over ``[start, end)``: ``scrapes`` per GPU index, ``[(unix seconds, percent)]``."""

    start: dt.datetime
    end: dt.datetime
    scrapes: dict


def generate(gpus: int = 2, hours: int = 12, seed: int = 57,
             start: dt.datetime = dt.datetime(2026, 5, 4, 6, 0, 20, tzinfo=UTC)) -> DutyCycle:
    """``gpus`` GPUs of one pod for ``hours`` from ``start``; the busy and idle phases are the pod's (all GPUs alike),
    the lateness of each scrape is each GPU's own."""
    rng = random.Random(seed)
    end = start + dt.timedelta(hours=hours)
    phases, t, busy = [], start.timestamp(), rng.random() < 0.5
    while t < end.timestamp():
        length = rng.uniform(600, 3000)
        phases.append((t, t + length, busy))
        t, busy = t + length, not busy
    outage = ((start + OUTAGE[0]).timestamp(), (start + OUTAGE[1]).timestamp())
    scrapes = {}
    for gpu in range(gpus):
        series, t = [], start.timestamp() + rng.uniform(0, SCRAPE)
        while t < end.timestamp() + 10 * SCRAPE:
            if not outage[0] <= t < outage[1]:
                busy = next((b for lo, hi, b in phases if lo <= t < hi), False)
                series.append((round(t, 3), float(rng.randint(60, 100) if busy else rng.randint(0, 3))))
            t += SCRAPE * rng.choices(list(LATENESS), weights=list(LATENESS.values()))[0]
        scrapes[gpu] = series
    return DutyCycle(start, end, scrapes)


def openmetrics(cycle: DutyCycle, namespace: str, pod: str) -> str:
    """The scrapes as dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` (pod label shape), OpenMetrics text ending ``# EOF``."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for gpu, series in cycle.scrapes.items():
        labels = (f'{{gpu="{gpu}",UUID="GPU-duty-{gpu}",Hostname="node-d",modelName="NVIDIA H100 80GB HBM3",'
                  f'container="main",namespace="{namespace}",pod="{pod}"}}')
        lines += [f"DCGM_FI_DEV_GPU_UTIL{labels} {value:g} {t:.3f}" for t, value in series]
    return "\n".join([*lines, "# EOF"]) + "\n"
