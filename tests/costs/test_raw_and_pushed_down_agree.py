"""The two readings of a window's utilization agree on the same real Prometheus data.

Class: two implementations of one set of sums drifting apart. A short window
(``RAW_WINDOW``, a periodic pass) is read as raw samples and summed in Python
(``usage_from_series``); a long one (a whole run, a catch-up, a month) by the
pushed-down PromQL of ``usage_query``. Invariant: on the same series and
window both give the same samples, utilization and memory sums, profiling
samples, observed and idle time and energy, per GPU, whatever the window's
edges (on or off the scrape-step grid) and whatever the series hold: gaps
longer than the lookback, late scrapes, counter resets, profiling and plain
counters mixed, a profiling counter that appears mid-window. And energy and
memory add up exactly over adjacent windows cut anywhere.

The series are drawn at random (seeded, several shapes per GPU) and loaded
into a real Prometheus built by promtool; the windows are drawn at random too.
"""

from __future__ import annotations

import datetime as dt
import random
from datetime import UTC

import pytest

from costs import prometheus
from tests.support.prometheus import start_prometheus

STEP = 15
IDLE = 5.0
LOOKBACK = 300
T0 = dt.datetime(2026, 3, 2, 6, tzinfo=UTC)
SPAN = 4 * 3600  # seconds of data from T0
MATCHERS = 'namespace="cp-agree",pod=~"job-3-1-.*"'
FIGURES = ("samples", "util_sum", "memory_samples", "memory_sum", "observed_seconds", "idle_seconds",
           "prof_samples", "energy_mj")


def gpu_series(rng: random.Random, gpu: int) -> dict[str, list[tuple[float, float]]]:
    """``{metric: [(unix seconds, value)]}`` of one GPU: scrapes every ``STEP`` s at a random offset (ms), some
    late by up to four intervals, gaps of 2-20 minutes (longer than the lookback or not), utilization on both
    sides of the idle threshold, an energy counter that resets to zero now and then; the profiling counter
    throughout, for part of the time only, or not at all."""
    offset = rng.uniform(0, STEP)
    gaps = [(g, g + rng.uniform(120, 1200)) for g in (rng.uniform(0, SPAN) for _ in range(rng.randint(0, 4)))]
    profiling = rng.choice(("always", "later", "never"))
    prof_from = rng.uniform(0, SPAN) if profiling == "later" else 0.0
    resets = sorted(rng.uniform(0, SPAN) for _ in range(rng.randint(0, 3)))
    watts = rng.uniform(80, 700)
    series: dict[str, list] = {m: [] for m in prometheus.GPU_METRICS}
    t = T0.timestamp() - 3600 + offset
    while t < T0.timestamp() + SPAN:
        at = round(t + (rng.choice((1, 2, 3, 4)) * STEP * 0.9 if rng.random() < 0.05 else 0), 3)
        t += STEP
        rel = at - T0.timestamp()
        if any(lo <= rel < hi for lo, hi in gaps) or series[prometheus.UTIL_PERCENT] and \
                at <= series[prometheus.UTIL_PERCENT][-1][0]:
            continue
        util = rng.choice((0.0, 1.0, 4.99, 5.0, 37.0, 99.0))
        series[prometheus.UTIL_PERCENT].append((at, util))
        if profiling == "always" or profiling == "later" and rel >= prof_from:
            series[prometheus.GR_ENGINE_ACTIVE].append((at, rng.choice((0.0, 0.04, 0.0499, 0.05, 0.6))))
        series[prometheus.FB_USED_MIB].append((at, float(rng.randint(0, 80_000))))
        booted = max([-86400.0, *(r for r in resets if r <= rel)])
        series[prometheus.ENERGY_MJ].append((at, round(watts * (rel - booted) * 1000)))
    return series


def openmetrics(gpus: dict[int, dict[str, list]]) -> str:
    lines = []
    for metric in prometheus.GPU_METRICS:
        kind = "counter" if metric == prometheus.ENERGY_MJ else "gauge"
        lines.append(f"# TYPE {metric} {kind}")
        for gpu, series in gpus.items():
            labels = f'{{gpu="{gpu}",UUID="GPU-{gpu}",namespace="cp-agree",pod="job-3-1-0-abcde"}}'
            lines += [f"{metric}{labels} {v:g} {t:.3f}" for t, v in series[metric]]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    rng = random.Random(20260302)
    gpus = {gpu: gpu_series(rng, gpu) for gpu in range(12)}
    proc, url = start_prometheus(tmp_path_factory.mktemp("agree"), openmetrics(gpus))
    yield prometheus.Source(url, "")
    proc.terminate()
    proc.wait(timeout=30)


def read(source, lo, hi, pushed_down: bool):
    """``{gpu: WindowUsage}`` of ``[lo, hi)``; ``pushed_down`` forces ``usage_query`` (every field asked for)."""
    fields = prometheus.USAGE_FIELDS if pushed_down else None
    found = prometheus.read_usage_by(source, MATCHERS, lo, hi, ("gpu",), step_seconds=STEP, idle_percent=IDLE,
                                     lookback_seconds=LOOKBACK, fields=fields)
    return {gpu: usage for (gpu,), usage in found.items()}


def figures(usage: prometheus.WindowUsage) -> tuple:
    """The figures compared, energy not measured (None) as -1."""
    return tuple(-1 if getattr(usage, f) is None else getattr(usage, f) for f in FIGURES)


def windows(rng: random.Random, count: int) -> list[tuple[dt.datetime, dt.datetime]]:
    """Random windows inside the data, at most ``RAW_WINDOW`` long: off the grid (millisecond edges), on it, a
    single step, shorter than a step."""
    out = []
    longest = prometheus.RAW_WINDOW.total_seconds()
    for n in range(count):
        lo = T0 + dt.timedelta(milliseconds=rng.randint(0, (SPAN - int(longest)) * 1000))
        length = dt.timedelta(milliseconds=rng.randint(1, int(longest * 1000)))
        if n % 4 == 1:  # on the grid
            lo = T0 + dt.timedelta(seconds=STEP * rng.randint(0, (SPAN - int(longest)) // STEP))
            length = dt.timedelta(seconds=STEP * rng.randint(1, int(longest) // STEP))
        elif n % 4 == 2:
            length = dt.timedelta(milliseconds=rng.randint(1, STEP * 1000))
        out.append((lo, lo + length))
    return out


def test_raw_samples_summed_in_python_agree_with_the_pushed_down_sums(source):
    assert prometheus.RAW_WINDOW.total_seconds() < SPAN
    checked = set()
    for lo, hi in windows(random.Random(11), 24):
        raw, pushed = read(source, lo, hi, False), read(source, lo, hi, True)
        assert set(raw) == set(pushed), (lo, hi)
        for gpu, usage in raw.items():
            assert figures(usage) == pytest.approx(figures(pushed[gpu]), rel=1e-9, abs=1e-6), (gpu, lo, hi)
            checked |= {f for f in FIGURES if getattr(usage, f)}
    # Every figure was non-zero somewhere: the comparison is not vacuous.
    assert checked == set(FIGURES)


def test_energy_and_memory_add_up_over_adjacent_windows_cut_anywhere(source):
    rng = random.Random(5)
    lo = T0 + dt.timedelta(minutes=40, milliseconds=rng.randint(0, 10**6))
    cuts = sorted(lo + dt.timedelta(milliseconds=rng.randint(1, 3 * 3600 * 1000)) for _ in range(5))
    edges = [lo, *cuts]
    whole = read(source, lo, edges[-1], True)  # three hours and more: pushed down
    parts = [read(source, a, b, (b - a) > prometheus.RAW_WINDOW) for a, b in zip(edges, edges[1:], strict=False)]
    for gpu, usage in whole.items():
        summed = [p[gpu] for p in parts if gpu in p]
        # (Which counter makes the utilization sums is chosen per window: a profiling counter appearing
        # mid-run splits them differently, so only the figures of one series each are compared here.)
        for name in ("memory_samples", "memory_sum", "energy_mj"):
            assert sum(getattr(u, name) or 0 for u in summed) == pytest.approx(getattr(usage, name), rel=1e-9), \
                (gpu, name)
    assert sum(u.energy_mj or 0 for u in whole.values()) > 0
