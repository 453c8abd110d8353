"""Benchmark: per-team, per-day GPU-hours, cost and utilization of a month of a GPU fleet in a real Prometheus.

Default size: 30 days of 1,024 GPUs (128 nodes of 8) scraped
every 15 s (about 200 million samples). Two ways to the same table:

* pushed down (the platform's way, ``costs.prometheus``): per UTC day the
  product's two queries, ``read_usage_by`` (``sum by (namespace)`` over
  ``sum_over_time``/``count_over_time`` of DCGM_FI_DEV_GPU_UTIL, and the
  observed and idle time under Prometheus' 5-minute lookback: subqueries at
  the scrape interval, all points for the observed time, the points under
  the threshold for the idle time, ``costs.prometheus.lookback_instants``) and ``allocated_gpu_hours_by``
  (kube-state-metrics GPU requests, ``max_over_time``, joined on (namespace,
  pod) with the samples of the Running phase, ``sum_over_time``); the days
  are queried ``--workers`` at a time;
* raw pull: the raw samples of the same series, fetched in chunks of hours,
  aggregated in Python (each sample observed from its time until the next
  one or the lookback, at the instants of the scrape interval).

Both must give identical GPU-hours and cents, the same utilization to
1e-9 percent, and the same observed, idle and unobserved GPU-hours (a DCGM
exporter misses one hour a day on some nodes, so not everything allocated is
observed). The table is timed ``--repeat`` times (the fastest counts), then
each of its three queries alone (``per_query``: ``usage``, ``idle``,
``allocated``) for their CPU per million samples.

The synthetic TSDB is built with ``promtool tsdb create-blocks-from
openmetrics``, one input file per block of 54 hours (``SPAN_SECONDS``,
promtool's hidden ``--max-block-duration``; cut at its multiples since the
epoch, where such blocks begin): promtool reads its whole input once to find
its time range and once per block it writes, so one file per block is read
twice, and long blocks cost less per sample than 2-hour ones (about a fifth
less CPU) and leave nothing to compact: 54 hours is one of the lengths
Prometheus compacts a month of history to, and the chunks are cut as
Prometheus cuts them. Spans are built ``--workers`` at a time, longest first.
The TSDB is cached under ``var/bench/`` in a folder named by a digest of the
generator's code and parameters (a changed generator builds anew, an
unchanged one is reused). Goal: pushed down under 10 s and at least 10 x
faster than the raw pull. Next to the wall times, the CPU seconds of
Prometheus and of this process (the client) for each way, per table and per
million samples, their ratio (raw pull over pushed down), and
``pushed_down_cores_busy`` (Prometheus CPU over the table's wall time: about
2 when the concurrent queries overlap on 2 free cores): the figures that hold
on a shared machine, where the wall times do not. Needs ``prometheus`` and
``promtool`` on PATH (Debian package ``prometheus``); without them it ends
with status 3 and says so. Ends with one JSON line.

    .venv/bin/python benchmarks/costs.py                   # full size (builds ~200 M samples once)
    .venv/bin/python benchmarks/costs.py --gpus 128 --days 4  # the quick size (make bench)
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import inspect
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

from benchmarks.procstat import client_cpu_seconds, cpu_seconds, machine  # noqa: E402
from benchmarks.services import commands_missing, require  # noqa: E402
from core.money import CENT  # noqa: E402
from costs import prometheus as P  # noqa: E402

T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)  # 31-day January: the whole month is history
DAY = dt.timedelta(days=1)
GPUS_PER_NODE = 8
PRICE_BEFORE, PRICE_AFTER = Decimal("6.88"), Decimal("5.50")  # USD per GPU-hour; the change is at mid-month midnight


def price_on(day: int, days: int) -> Decimal:
    return PRICE_BEFORE if day < days // 2 else PRICE_AFTER


BLOCK_SECONDS = 7200  # the generator's unit: Prometheus's and promtool's default (and smallest) block
# promtool writes blocks of this length (its hidden --max-block-duration; one of Prometheus's compaction ranges,
# 2 h x 3^3), so the month needs no compaction afterwards: 14 blocks of up to 2.25 days, chunks as Prometheus cuts them.
SPAN_SECONDS = 54 * 3600
IDLE_PERCENT = 5.0
LOOKBACK = P.LOOKBACK_DELTA_SECONDS  # Prometheus' default --query.lookback-delta
GAP_HOUR = 13  # on nodes with node % 16 == 5 the DCGM exporter misses 13:00-14:00 UTC every day


def running(node: int, day: int) -> bool:
    """Each node's pod pauses one day in seven (phase not Running, no pod labels on its GPUs)."""
    return (node + day) % 7 != 3


def scraped(node: int, t: int) -> bool:
    """Whether the node's DCGM exporter was scraped at unix second ``t`` (kube-state-metrics always is)."""
    return node % 16 != 5 or (t % 86400) // 3600 != GAP_HOUR


PERCENT = [str(v) for v in range(101)]


def utilization(node: int, gpu: int, t: int, step: int) -> int:
    """The DCGM_FI_DEV_GPU_UTIL sample (percent) of a GPU at unix second ``t``."""
    return ((node * 8 + gpu) * 37 + t // step * 11) % 101


def write_span(path: Path, first: int, blocks: int, nodes: int, teams: int, step: int) -> int:
    """The 2-hour blocks ``first .. first + blocks - 1`` (counted from T0) of DCGM and kube-state-metrics series as
    OpenMetrics, each series' samples together and in time order; returns the sample count."""
    starts = [int(T0.timestamp()) + b * BLOCK_SECONDS for b in range(first, first + blocks)]
    count = 0
    with open(path, "w", buffering=1 << 22) as out:
        out.write("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
        for node in range(nodes):
            ns, pod = f"cp-team{node % teams}", f"job-{node}-1-0-bench"
            # Per block: the scrapes seen and their lines' tails, formatted once per node, not once per sample.
            pieces = []
            for start in starts:
                if running(node, (start - int(T0.timestamp())) // 86400):
                    seen = [t for t in range(start, start + BLOCK_SECONDS, step) if scraped(node, t)]
                    pieces.append(([t // step * 11 for t in seen], [f" {t}\n" for t in seen]))
            for gpu in range(GPUS_PER_NODE):
                prefix = (f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",Hostname="node{node}",namespace="{ns}",pod="{pod}",'
                          f'container="main"}} ')
                base = utilization(node, gpu, 0, step)  # utilization() = (base + t // step * 11) % 101
                for steps, tails in pieces:
                    out.write("".join([prefix + PERCENT[(base + k) % 101] + tail for k, tail in zip(steps, tails, strict=True)]))
                    count += len(tails)
        all_tails = [f" {t}\n" for t in range(starts[0], starts[-1] + BLOCK_SECONDS, step)]
        per_block = BLOCK_SECONDS // step
        for family, value_of in (
            ("kube_pod_container_resource_requests", lambda node, day: GPUS_PER_NODE),
            ("kube_pod_status_phase", lambda node, day: int(running(node, day))),
        ):
            out.write(f"# TYPE {family} gauge\n")
            for node in range(nodes):
                ns, pod = f"cp-team{node % teams}", f"job-{node}-1-0-bench"
                if family == "kube_pod_status_phase":
                    labels = f'{{namespace="{ns}",pod="{pod}",phase="Running"}}'
                else:
                    labels = f'{{namespace="{ns}",pod="{pod}",container="main",resource="nvidia_com_gpu",unit="integer"}}'
                for i, start in enumerate(starts):
                    head = f"{family}{labels} {value_of(node, (start - int(T0.timestamp())) // 86400)}"
                    tails = all_tails[i * per_block:(i + 1) * per_block]
                    out.write("".join([head + tail for tail in tails]))
                    count += len(tails)
        out.write("# EOF\n")
    return count


def spans(days: int) -> list[tuple[int, int]]:
    """``(first 2-hour block, blocks)`` of each promtool input: the month cut at the multiples of
    ``SPAN_SECONDS`` since the epoch, where promtool's blocks of that length begin."""
    lo, hi = int(T0.timestamp()), int(T0.timestamp()) + days * 86400
    cuts = sorted({lo, hi, *range((lo // SPAN_SECONDS + 1) * SPAN_SECONDS, hi, SPAN_SECONDS)})
    return [((a - lo) // BLOCK_SECONDS, (b - a) // BLOCK_SECONDS) for a, b in pairwise(cuts)]


def _build_span(job: tuple) -> int:
    """Worker: write one span's OpenMetrics file, convert it with promtool into one block (one pass), delete it."""
    data, first, blocks, nodes, teams, step = job
    path = data.parent / "incoming" / f"blocks{first}.om"
    samples = write_span(path, first, blocks, nodes, teams, step)
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", "-q",
                    f"--max-block-duration={SPAN_SECONDS}s", str(path), str(data)], check=True)
    path.unlink()
    return samples


def build_tsdb(data: Path, nodes: int, teams: int, days: int, step: int, workers: int) -> int:
    """Build the TSDB one span per worker task (generation and promtool are both CPU bound), longest spans first
    so that the last tasks are short; returns samples."""
    (data.parent / "incoming").mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    jobs = sorted(((data, first, n, nodes, teams, step) for first, n in spans(days)), key=lambda j: -j[2])
    with multiprocessing.Pool(workers) as pool:
        samples = sum(pool.imap_unordered(_build_span, jobs))
    (data.parent / "samples").write_text(str(samples))
    return samples


def start_prometheus(data: Path) -> tuple[subprocess.Popen, str]:
    """A Prometheus over ``data`` with min = max block duration (2 h): no compaction runs in the background while
    we time queries (the blocks are already as long as a month's compacted history would be)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = data.parent / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    blocks = ["--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"]
    proc = subprocess.Popen(
        [shutil.which("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=3650d", *blocks],
        stdout=open(data.parent / "prometheus.log", "ab"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url + "/-/ready", timeout=1).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("prometheus did not become ready; see " + str(data.parent / "prometheus.log"))


def tsdb_shape(data: Path) -> tuple[int, int]:
    """(blocks, bytes on disk) of the TSDB."""
    blocks = [b for b in data.iterdir() if (b / "meta.json").exists()]
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    return len(blocks), size


FIELDS = ("util_sum", "samples", "observed_seconds", "idle_seconds")


def pushed_down_day(source: P.Source, day: int, step: int) -> dict:
    """``{(team, day): (gpu_hours, util_sum, samples, observed seconds, idle seconds)}`` of one day from the product's
    2 queries: ``read_usage_by`` (utilization sum, samples, observed and idle time in one) and
    ``allocated_gpu_hours_by``."""
    lo, hi = T0 + day * DAY, T0 + (day + 1) * DAY
    usage = P.read_usage_by(source, 'namespace=~"cp-.*"', lo, hi, ("namespace",), step_seconds=step,
                            idle_percent=IDLE_PERCENT, fields=FIELDS)
    hours = P.allocated_gpu_hours_by(source, lo, hi, ("namespace",), step_seconds=step)
    table = {}
    for (ns,), gpu_hours in hours.items():
        u = usage.get((ns,))
        table[(ns, day)] = (gpu_hours, *((u.util_sum, u.samples, u.observed_seconds, u.idle_seconds) if u
                                         else (0.0, 0, 0.0, 0.0)))
    return table


def one_query(kind: str, step: int):
    """``(source, day) -> None``: one of the table's queries alone, for its CPU per million samples:
    ``usage`` (sums and samples), ``idle`` (observed and idle time), ``allocated`` (GPU-hours)."""
    def run(source: P.Source, day: int) -> dict:
        lo, hi = T0 + day * DAY, T0 + (day + 1) * DAY
        if kind == "allocated":
            P.allocated_gpu_hours_by(source, lo, hi, ("namespace",), step_seconds=step)
        else:
            P.read_usage_by(source, 'namespace=~"cp-.*"', lo, hi, ("namespace",), step_seconds=step,
                            idle_percent=IDLE_PERCENT,
                            fields=("observed_seconds", "idle_seconds") if kind == "idle" else ("util_sum", "samples"))
        return {}
    return run


def by_day(source: P.Source, days: int, workers: int, one_day) -> dict:
    """``one_day(source, day)`` for every day, ``workers`` at a time (Prometheus evaluates each query on one core)."""
    table = {}
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(lambda day: one_day(source, day), range(days)):
            table.update(part)
    return table


def timed(pid: int, work) -> tuple:
    """``(result, wall seconds, Prometheus CPU seconds or None, client CPU seconds)`` of ``work()``."""
    cpu, client, t = cpu_seconds(pid), client_cpu_seconds(children=False), time.perf_counter()
    result = work()
    wall = time.perf_counter() - t
    return (result, wall, None if cpu is None else round(cpu_seconds(pid) - cpu, 2),
            round(client_cpu_seconds(children=False) - client, 2))


def lookback_credit(util: dict, ns: str, t: int, value: float, until: float, step: int) -> None:
    """Credit the sample ``(t, value)`` of a GPU of ``ns`` with the instants (multiples of ``step`` since the epoch,
    each standing for ``step`` seconds) in ``[t, until)``, per UTC day of the instant: observed, and idle when
    ``value`` is under the threshold. ``until``: the next sample or ``t`` + the lookback, whichever comes first."""
    first = -(-t // step) * step
    while first < until:
        day = int((first - T0.timestamp()) // 86400)
        day_end = T0.timestamp() + (day + 1) * 86400
        count = -(-(min(until, day_end) - first) // step)
        acc = util[(ns, day)]
        acc[3] += count * step
        acc[4] += count * step if value < IDLE_PERCENT else 0
        first += count * step


def raw_pull(source: P.Source, days: int, step: int, chunk_hours: int) -> dict:
    """The same table from raw samples fetched ``chunk_hours`` at a time and summed in Python (one thread:
    decoding JSON and summing hold the GIL, so threads would not help). A series' latest sample waits for the
    next one (which may come in the next chunk) to know how long it stands (``lookback_credit``)."""
    client = source.client()
    util = defaultdict(lambda: [0.0, 0, 0, 0.0, 0.0])  # utilization sum, samples, -, observed s, idle s
    gpu_seconds = defaultdict(float)
    latest: dict[tuple, tuple] = {}  # series -> (namespace, t, value) of its latest sample
    chunk = dt.timedelta(hours=chunk_hours)
    end = (T0 + days * DAY).timestamp()
    for day in range(days):
        for c in range(24 // chunk_hours):
            lo = T0 + day * DAY + c * chunk
            at = {"time": (lo + chunk - P.EPSILON).timestamp()}
            r = P.duration(chunk - P.EPSILON)
            for series in client.custom_query(f"DCGM_FI_DEV_GPU_UTIL[{r}]", params=at):
                key, ns = tuple(sorted(series["metric"].items())), series["metric"]["namespace"]
                acc = util[(ns, day)]
                for t, value in series["values"]:
                    value = float(value)
                    acc[0] += value
                    acc[1] += 1
                    if key in latest:
                        _, t0, v0 = latest[key]
                        lookback_credit(util, ns, t0, v0, min(t, t0 + LOOKBACK), step)
                    latest[key] = (ns, t, value)
            requests = {
                (s["metric"]["namespace"], s["metric"]["pod"]): {t: float(v) for t, v in s["values"]}
                for s in client.custom_query(f'kube_pod_container_resource_requests{{resource="nvidia_com_gpu"}}[{r}]',
                                             params=at)
            }
            for series in client.custom_query(f'kube_pod_status_phase{{phase="Running"}}[{r}]', params=at):
                key = (series["metric"]["namespace"], series["metric"]["pod"])
                pod_requests = requests.get(key, {})
                for t, value in series["values"]:
                    if value == "1":
                        gpu_seconds[(key[0], day)] += pod_requests.get(t, 0.0) * step
    for ns, t, value in latest.values():
        lookback_credit(util, ns, t, value, min(end, t + LOOKBACK), step)
    return {key: (seconds / 3600, *util[key][:2], *util[key][3:]) for key, seconds in gpu_seconds.items()}


def present(table: dict, days: int, step: int) -> dict:
    """Rows as the API shows them: GPU-hours (6 decimals), cost in cents, utilization (percent, 9 decimals), and
    observed, idle (null when nothing was observed) and unobserved GPU-hours (6 decimals)."""
    rows = {}
    for (ns, day), (gpu_hours, util_sum, samples, observed_s, idle_s) in sorted(table.items()):
        cost = (Decimal(repr(round(gpu_hours, 6))) * price_on(day, days)).quantize(CENT, ROUND_HALF_EVEN)
        observed = observed_s / 3600
        rows[f"{ns}/{day}"] = (round(gpu_hours, 6), str(cost), round(util_sum / samples, 9) if samples else None,
                               round(observed, 6), round(idle_s / 3600, 6) if observed_s else None,
                               round(max(0.0, gpu_hours - observed), 6))
    return rows


def cache_key(nodes: int, teams: int, days: int, step: int) -> str:
    """A digest of what the TSDB holds: the generator's code and its parameters (and promtool's version)."""
    code = "".join(inspect.getsource(f) for f in (running, scraped, utilization, write_span, spans))
    version = subprocess.run([shutil.which("promtool"), "--version"], capture_output=True, text=True).stdout
    text = f"{code}|{nodes}|{teams}|{days}|{step}|{T0.isoformat()}|{version.splitlines()[:1]}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def per_million(prometheus_cpu: float | None, client_cpu: float, samples: int) -> dict:
    """CPU milliseconds per million samples of the table's month, of Prometheus and of the client."""
    scale = 1000 * 1e6 / samples
    return {"prometheus": None if prometheus_cpu is None else round(prometheus_cpu * scale, 2),
            "client": round(client_cpu * scale, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=1024, help="a multiple of 8 (default 1024)")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--step", type=int, default=15, help="scrape interval, seconds")
    parser.add_argument("--teams", type=int, default=8)
    parser.add_argument("--chunk-hours", type=int, default=2, help="raw pull: hours of samples per request")
    parser.add_argument("--raw-days", type=int, default=None,
                        help="raw pull over the first N days only (default all), compared with their rows; its "
                             "time and CPU are then scaled to all days")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "var" / "bench")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="build processes and query threads")
    parser.add_argument("--repeat", type=int, default=2, help="pushed-down table runs (the fastest counts)")
    args = parser.parse_args()
    require("costs", commands_missing({"prometheus": "prometheus", "promtool": "prometheus"}))
    nodes = args.gpus // GPUS_PER_NODE
    home = args.data_dir / f"costs-{args.gpus}gpus-{args.days}d-{args.step}s-{cache_key(nodes, args.teams, args.days, args.step)}"
    data = home / "data"
    built, children = time.perf_counter(), client_cpu_seconds(children=True) - client_cpu_seconds(children=False)
    if not (home / "samples").exists():
        shutil.rmtree(home, ignore_errors=True)
        build_tsdb(data, nodes, args.teams, args.days, args.step, args.workers)
    build_seconds = time.perf_counter() - built
    build_cpu = client_cpu_seconds(children=True) - client_cpu_seconds(children=False) - children
    samples = int((home / "samples").read_text())
    blocks, tsdb_bytes = tsdb_shape(data)
    proc, url = start_prometheus(data)
    try:
        source = P.Source(url, "")
        P.range_left_open(source)  # probed once per URL, before any timing
        tables = [timed(proc.pid, lambda: by_day(source, args.days, args.workers,
                                                 lambda src, day: pushed_down_day(src, day, args.step)))
                  for _ in range(args.repeat)]
        main_table, pushed_seconds, pushed_cpu, pushed_client_cpu = min(tables, key=lambda t: t[1])
        per_query = {}
        for kind in ("usage", "idle", "allocated"):
            _, seconds, cpu, client = timed(proc.pid, lambda kind=kind: by_day(source, args.days, args.workers,
                                                                               one_query(kind, args.step)))
            per_query[kind] = {"s": round(seconds, 3), "prometheus_cpu_s": cpu, "client_cpu_s": client,
                               "cpu_ms_per_million_samples": per_million(cpu, client, samples)}
        pushed = present(main_table, args.days, args.step)
        raw_days = min(args.days, args.raw_days or args.days)
        raw_table, raw_seconds, raw_cpu, raw_client_cpu = timed(
            proc.pid, lambda: raw_pull(source, raw_days, args.step, args.chunk_hours))
        raw = present(raw_table, args.days, args.step)
        pushed_compared = {k: v for k, v in pushed.items() if int(k.rsplit("/", 1)[1]) < raw_days}
        scale = args.days / raw_days  # the raw pull's cost is the same for every day
        raw_seconds, raw_cpu, raw_client_cpu = (raw_seconds * scale, None if raw_cpu is None else raw_cpu * scale,
                                                raw_client_cpu * scale)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    identical = pushed_compared == raw
    if not identical:
        diff = [k for k in sorted(set(pushed_compared) | set(raw)) if pushed.get(k) != raw.get(k)][:5]
        print("differences:", {k: (pushed.get(k), raw.get(k)) for k in diff}, file=sys.stderr)
    print(json.dumps({
        "benchmark": "costs", "gpus": args.gpus, "days": args.days, "step_s": args.step, "samples": samples,
        "rows": len(pushed), "workers": args.workers, "blocks": blocks, "tsdb_mib": round(tsdb_bytes / 2**20, 1),
        "build_s": round(build_seconds, 1), "build_cpu_s": round(build_cpu, 1), "tsdb_cache": home.name,
        "pushed_down_s": round(pushed_seconds, 3), "pushed_down_runs_s": [round(t[1], 3) for t in tables],
        "pushed_down_prometheus_cpu_s": pushed_cpu, "pushed_down_client_cpu_s": pushed_client_cpu,
        "pushed_down_cpu_ms_per_million_samples": per_million(pushed_cpu, pushed_client_cpu, samples),
        # Prometheus's CPU over the table's wall time: how many cores its concurrent queries kept busy.
        "pushed_down_cores_busy": round(pushed_cpu / pushed_seconds, 2) if pushed_cpu is not None else None,
        "per_query": per_query,
        "raw_days": raw_days, "rows_compared": len(raw), "raw_pull_s": round(raw_seconds, 3), "speedup": round(raw_seconds / pushed_seconds, 1),
        "raw_pull_prometheus_cpu_s": None if raw_cpu is None else round(raw_cpu, 2),
        "raw_pull_client_cpu_s": round(raw_client_cpu, 2),
        "raw_pull_cpu_ms_per_million_samples": per_million(raw_cpu, raw_client_cpu, samples),
        "observed_gpu_hours": round(sum(r[3] for r in pushed.values()), 6),
        "unobserved_gpu_hours": round(sum(r[5] for r in pushed.values()), 6),
        "idle_gpu_hours": round(sum(r[4] or 0 for r in pushed.values()), 6),
        "raw_over_pushed_cpu": (round((raw_cpu + raw_client_cpu) / (pushed_cpu + pushed_client_cpu), 1)
                                if None not in (raw_cpu, pushed_cpu) and pushed_cpu + pushed_client_cpu else None),
        **machine(),
        "identical": identical, "goal_met": identical and pushed_seconds < 10 and raw_seconds >= 10 * pushed_seconds,
    }))


if __name__ == "__main__":
    main()
