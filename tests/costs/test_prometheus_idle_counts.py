"""Observed and idle time counted inside Prometheus agree with the scrapes, whichever counter a GPU carries.

A real Prometheus (promtool-built) holds four GPUs of one pod: two export
both ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` and ``DCGM_FI_DEV_GPU_UTIL`` (the
profiling counter must win, also where it has no idle sample at all and
the other counter has only idle ones), one only ``GPU_UTIL`` with a gap and
values on both sides of the threshold, one only the profiling counter.
Expected values are computed from the listed scrapes (``tests.support.lookback``).
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import pytest

from costs import prometheus
from tests.support import lookback
from tests.support.prometheus import start_prometheus

STEP = 60
IDLE = 5.0
LOOKBACK = 300
T0 = dt.datetime(2026, 4, 7, 10, tzinfo=UTC)
START = T0 + dt.timedelta(seconds=30)  # mid-step: both edges of the window hold a scrape (at :45)
END = T0 + dt.timedelta(hours=2, seconds=50)
MATCHERS = 'namespace="cp-idle",pod=~"job-9-1-.*"'


def scrapes(values, lo=T0 - dt.timedelta(minutes=5), hi=T0 + dt.timedelta(hours=2, minutes=5), skip=()):
    """``[(unix seconds, value)]`` one per minute at second 45, cycling through ``values``, minus ``skip`` minutes."""
    out, t, i = [], int(lo.timestamp()) // STEP * STEP + 45, 0
    while t < hi.timestamp():
        if (t - int(T0.timestamp())) // STEP not in skip:
            out.append((t, values[i % len(values)]))
        i += 1
        t += STEP
    return out


# gpu: {counter: scrapes}; profiling values are ratios, GPU_UTIL ones percent.
GPUS = {
    "0": {prometheus.GR_ENGINE_ACTIVE: scrapes([0.5]), prometheus.UTIL_PERCENT: scrapes([0.0])},
    "1": {prometheus.GR_ENGINE_ACTIVE: scrapes([0.01, 0.9, 0.049]), prometheus.UTIL_PERCENT: scrapes([90.0])},
    "2": {prometheus.UTIL_PERCENT: scrapes([0.0, 3.0, 50.0, 4.99, 5.0], skip=range(30, 50))},
    "3": {prometheus.GR_ENGINE_ACTIVE: scrapes([0.7, 0.2])},
}


def openmetrics() -> str:
    families: dict[str, list[str]] = {}
    for gpu, counters in GPUS.items():
        labels = f'{{gpu="{gpu}",namespace="cp-idle",pod="job-9-1-0-abcde",container="main"}}'
        for metric, series in counters.items():
            families.setdefault(metric, []).extend(f"{metric}{labels} {v:g} {t}" for t, v in series)
    lines = []
    for metric, rows in families.items():
        lines += [f"# TYPE {metric} gauge", *rows]
    return "\n".join([*lines, "# EOF"]) + "\n"


def expected(gpu: str, lo: dt.datetime = START, hi: dt.datetime = END) -> tuple[int, float, float, float]:
    """(samples, observed seconds, idle seconds, utilization sum in percent) of ``gpu`` inside [lo, hi), from
    its scrapes of the preferred counter."""
    counters = GPUS[gpu]
    metric = prometheus.GR_ENGINE_ACTIVE if prometheus.GR_ENGINE_ACTIVE in counters else prometheus.UTIL_PERCENT
    scale = 100 if metric == prometheus.GR_ENGINE_ACTIVE else 1
    percent = [(t, v * scale) for t, v in counters[metric]]
    inside = [v for t, v in percent if lo.timestamp() <= t < hi.timestamp()]
    observed, idle = lookback.instants(percent, lo.timestamp(), hi.timestamp(), STEP, LOOKBACK, IDLE)
    return len(inside), observed, idle, sum(inside)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    proc, url = start_prometheus(tmp_path_factory.mktemp("idle-prometheus"), openmetrics())
    yield prometheus.Source(url, "")
    proc.terminate()
    proc.wait(timeout=30)


def read(source, lo, hi, by=()):
    return prometheus.read_usage_by(source, MATCHERS, lo, hi, by, step_seconds=STEP, idle_percent=IDLE,
                                    lookback_seconds=LOOKBACK)


def test_idle_instants_follow_the_preferred_counter_of_each_gpu(source):
    got = read(source, START, END, ("gpu",))
    want = {gpu: expected(gpu) for gpu in GPUS}
    assert set(got) == {(gpu,) for gpu in want}
    for (gpu,), u in got.items():
        assert (u.samples, u.observed_seconds, u.idle_seconds) == pytest.approx(want[gpu][:3]), gpu
    for (gpu,), usage in got.items():
        assert usage.util_sum == pytest.approx(want[gpu][3], abs=1e-9 * max(1, want[gpu][0]))
    # The cases that matter: a profiling counter never idle beside an always-idle GPU_UTIL reads 0 idle, and
    # the last sample before a 20-minute gap stands for the lookback's 5 minutes (4 more than its own), no longer.
    assert want["0"][2] == 0 < want["0"][1] and want["1"][2] > 0
    assert want["2"][1] == want["3"][1] - (20 - (LOOKBACK // STEP - 1)) * STEP


def test_instants_of_a_group_add_up_over_its_gpus_and_over_adjacent_windows(source):
    [total] = read(source, START, END).values()
    want = [expected(gpu) for gpu in GPUS]
    figures = ("samples", "observed_seconds", "idle_seconds")
    assert tuple(getattr(total, f) for f in figures) == pytest.approx(tuple(sum(w[i] for w in want) for i in range(3)))
    # Samples add up over any cut; observed and idle time over cuts at multiples of the step (UTC midnights).
    odd = START + dt.timedelta(minutes=47, seconds=13, milliseconds=500)
    halves = [read(source, lo, hi)[()] for lo, hi in ((START, odd), (odd, END))]
    assert sum(h.samples for h in halves) == total.samples
    aligned = T0 + dt.timedelta(minutes=47)
    halves = [read(source, lo, hi)[()] for lo, hi in ((START, aligned), (aligned, END))]
    assert tuple(sum(getattr(h, f) for h in halves) for f in figures) == pytest.approx(
        tuple(getattr(total, f) for f in figures))
    assert total.util_metric == "mixed"
