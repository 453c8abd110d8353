"""Benchmark: per-team, per-day GPU-hours, cost and utilization of a month of a GPU fleet in a real Prometheus.

Default size: 30 days of 1,024 GPUs (128 nodes of 8) scraped
every 15 s (about 200 million samples). Two ways to the same table:

* pushed down (the platform's way, ``costs.prometheus``): per UTC day one
  query of ``sum by (namespace)`` over ``sum_over_time``/``count_over_time``
  of DCGM_FI_DEV_GPU_UTIL and one of kube-state-metrics GPU requests
  (``max_over_time``) joined on (namespace, pod) with the samples of the
  Running phase (``sum_over_time``), no subquery;
* raw pull: the raw samples of the same series, fetched in chunks of hours,
  aggregated in Python.

Both must give identical GPU-hours and cents and the same utilization to
1e-9 percent. The synthetic TSDB (``promtool tsdb create-blocks-from
openmetrics``, one file per day, then compacted once by Prometheus as a
month of history would be) is cached under ``var/bench/`` and reused.
Goal: pushed down under 10 s and at least 10 x faster than the raw pull.
Next to the wall times, the CPU seconds of Prometheus and of this process
(the client) for each way, per table and per million samples, and their
ratios (raw pull over pushed down): the figures that hold on a shared
machine, where the wall times do not. Needs ``prometheus`` and ``promtool``
on PATH (Debian package ``prometheus``); without them it ends with status
3 and says so. Ends with one JSON line.

    .venv/bin/python benchmarks/costs.py                   # full size (builds ~200 M samples once)
    .venv/bin/python benchmarks/costs.py --gpus 64 --days 3  # a quick run
"""

from __future__ import annotations

import argparse
import datetime as dt
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
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

from benchmarks.procstat import client_cpu_seconds, cpu_seconds, machine  # noqa: E402
from benchmarks.services import commands_missing, require  # noqa: E402
from costs import prometheus as P  # noqa: E402

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)  # 31-day January: the whole month is history
DAY = dt.timedelta(days=1)
GPUS_PER_NODE = 8
PRICE_BEFORE, PRICE_AFTER = Decimal("6.88"), Decimal("5.50")  # USD per GPU-hour; the change is at mid-month midnight
CENT = Decimal("0.01")


def price_on(day: int, days: int) -> Decimal:
    return PRICE_BEFORE if day < days // 2 else PRICE_AFTER


def running(node: int, day: int) -> bool:
    """Each node's pod pauses one day in seven (phase not Running, no pod labels on its GPUs)."""
    return (node + day) % 7 != 3


def write_day(path: Path, day: int, nodes: int, teams: int, step: int) -> int:
    """One day of DCGM utilization and kube-state-metrics series as OpenMetrics; returns the sample count."""
    start = int((T0 + day * DAY).timestamp())
    times = range(start, start + 86400, step)
    count = 0
    with open(path, "w", buffering=1 << 22) as out:
        out.write("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
        for node in range(nodes):
            if not running(node, day):
                continue
            ns, pod = f"cp-team{node % teams}", f"job-{node}-1-0-bench"
            for gpu in range(GPUS_PER_NODE):
                prefix = (f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",Hostname="node{node}",namespace="{ns}",pod="{pod}",'
                          f'container="main"}} ')
                seed = node * 8 + gpu
                out.write("".join(f"{prefix}{(seed * 37 + t // step * 11) % 101} {t}\n" for t in times))
                count += len(times)
        for family, value_of in (
            ("kube_pod_container_resource_requests", lambda node: GPUS_PER_NODE),
            ("kube_pod_status_phase", lambda node: int(running(node, day))),
        ):
            out.write(f"# TYPE {family} gauge\n")
            for node in range(nodes):
                ns, pod = f"cp-team{node % teams}", f"job-{node}-1-0-bench"
                if family == "kube_pod_status_phase":
                    labels = f'{{namespace="{ns}",pod="{pod}",phase="Running"}}'
                else:
                    labels = f'{{namespace="{ns}",pod="{pod}",container="main",resource="nvidia_com_gpu",unit="integer"}}'
                value = value_of(node)
                out.write("".join(f"{family}{labels} {value} {t}\n" for t in times))
                count += len(times)
        out.write("# EOF\n")
    return count


def _build_day(job: tuple) -> int:
    """Worker: write one day's OpenMetrics file, convert it to blocks with promtool, delete it."""
    data, day, nodes, teams, step = job
    path = data.parent / "incoming" / f"day{day}.om"
    samples = write_day(path, day, nodes, teams, step)
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(data)],
                   check=True)
    path.unlink()
    return samples


def build_tsdb(data: Path, nodes: int, teams: int, days: int, step: int, workers: int) -> int:
    """Build the TSDB one day per worker process (generation and promtool are both CPU bound); returns samples."""
    (data.parent / "incoming").mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    with multiprocessing.Pool(workers) as pool:
        samples = sum(pool.imap_unordered(_build_day, [(data, d, nodes, teams, step) for d in range(days)]))
    (data.parent / "samples").write_text(str(samples))
    return samples


def start_prometheus(data: Path, compact: bool = False) -> tuple[subprocess.Popen, str]:
    """A Prometheus over ``data``; without ``compact``, min = max block duration (2 h): no compaction runs in the
    background while we time queries. With it, Prometheus's defaults (blocks compacted up to 31 days)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = data.parent / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    blocks = [] if compact else ["--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"]
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


def _metric(url: str, name: str) -> float:
    for line in urllib.request.urlopen(url + "/metrics", timeout=10).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def compact_tsdb(data: Path) -> None:
    """Let Prometheus compact the imported 2 h blocks, as it does with any month of history it holds.

    promtool writes one block per 2 h (360 for 30 days); a Prometheus that
    scraped the month itself would have compacted them into blocks of up to
    31 days (its default, 10 % of the retention). Same samples and chunks,
    fewer blocks to merge per query. Its compaction loop is serial and
    ticks every minute: once a second compaction has been triggered, the
    first (which runs every plan until none is left) is over.
    """
    proc, url = start_prometheus(data, compact=True)
    try:
        deadline = time.monotonic() + 3600
        while _metric(url, "prometheus_tsdb_compactions_triggered_total") < 2:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("compaction did not finish; see " + str(data.parent / "prometheus.log"))
            time.sleep(2)
        if _metric(url, "prometheus_tsdb_compactions_failed_total"):
            raise RuntimeError("compaction failed; see " + str(data.parent / "prometheus.log"))
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    (data.parent / "compacted").write_text("")


def tsdb_shape(data: Path) -> tuple[int, int]:
    """(blocks, bytes on disk) of the TSDB."""
    blocks = [b for b in data.iterdir() if (b / "meta.json").exists()]
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    return len(blocks), size


def pushed_down_day(source: P.Source, day: int, step: int) -> dict:
    """``{(team, day): (gpu_hours, util_sum, samples)}`` of one day from 2 pushed-down queries."""
    lo, hi = T0 + day * DAY, T0 + (day + 1) * DAY
    usage = P.read_usage_by(source, 'namespace=~"cp-.*"', lo, hi, ("namespace",), step_seconds=step,
                            fields=("util_sum", "samples"))
    hours = P.allocated_gpu_hours_by(source, lo, hi, ("namespace",), step_seconds=step)
    table = {}
    for (ns,), gpu_hours in hours.items():
        u = usage.get((ns,))
        table[(ns, day)] = (gpu_hours, u.util_sum if u else 0.0, u.samples if u else 0)
    return table


def pushed_down(source: P.Source, days: int, step: int, workers: int) -> dict:
    """The whole table, days queried ``workers`` at a time (Prometheus evaluates each query on one core)."""
    table = {}
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(lambda day: pushed_down_day(source, day, step), range(days)):
            table.update(part)
    return table


def raw_pull(source: P.Source, days: int, step: int, chunk_hours: int) -> dict:
    """The same table from raw samples fetched ``chunk_hours`` at a time and summed in Python (one thread:
    decoding JSON and summing hold the GIL, so threads would not help)."""
    client = source.client()
    util = defaultdict(lambda: [0.0, 0])
    gpu_seconds = defaultdict(float)
    chunk = dt.timedelta(hours=chunk_hours)
    for day in range(days):
        for c in range(24 // chunk_hours):
            lo = T0 + day * DAY + c * chunk
            at = {"time": (lo + chunk - P.EPSILON).timestamp()}
            r = P.duration(chunk - P.EPSILON)
            for series in client.custom_query(f"DCGM_FI_DEV_GPU_UTIL[{r}]", params=at):
                acc = util[(series["metric"]["namespace"], day)]
                for _, value in series["values"]:
                    acc[0] += float(value)
                    acc[1] += 1
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
    return {key: (seconds / 3600, util[key][0], util[key][1]) for key, seconds in gpu_seconds.items()}


def present(table: dict, days: int) -> dict:
    """Rows as the API shows them: GPU-hours (6 decimals), cost in cents, utilization (percent, 9 decimals)."""
    rows = {}
    for (ns, day), (gpu_hours, util_sum, samples) in sorted(table.items()):
        cost = (Decimal(repr(round(gpu_hours, 6))) * price_on(day, days)).quantize(CENT, ROUND_HALF_EVEN)
        rows[f"{ns}/{day}"] = (round(gpu_hours, 6), str(cost), round(util_sum / samples, 9) if samples else None)
    return rows


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
    parser.add_argument("--data-dir", type=Path, default=ROOT / "var" / "bench")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="build processes and query threads")
    args = parser.parse_args()
    require("costs", commands_missing({"prometheus": "prometheus", "promtool": "prometheus"}))
    nodes = args.gpus // GPUS_PER_NODE
    home = args.data_dir / f"costs-{args.gpus}gpus-{args.days}d-{args.step}s"
    data = home / "data"
    built = time.perf_counter()
    if not (home / "samples").exists():
        shutil.rmtree(home, ignore_errors=True)
        build_tsdb(data, nodes, args.teams, args.days, args.step, args.workers)
    if not (home / "compacted").exists():
        compact_tsdb(data)
    build_seconds = time.perf_counter() - built
    samples = int((home / "samples").read_text())
    blocks, tsdb_bytes = tsdb_shape(data)
    proc, url = start_prometheus(data)
    try:
        source = P.Source(url, "")
        cpu, client, t = cpu_seconds(proc.pid), client_cpu_seconds(children=False), time.perf_counter()
        pushed = present(pushed_down(source, args.days, args.step, args.workers), args.days)
        pushed_seconds = time.perf_counter() - t
        # Prometheus's CPU time for the pushed-down queries: the wall time above is this over the cores it got.
        pushed_cpu = None if cpu is None else round(cpu_seconds(proc.pid) - cpu, 2)
        pushed_client_cpu = round(client_cpu_seconds(children=False) - client, 2)
        cpu, client, t = cpu_seconds(proc.pid), client_cpu_seconds(children=False), time.perf_counter()
        raw = present(raw_pull(source, args.days, args.step, args.chunk_hours), args.days)
        raw_seconds = time.perf_counter() - t
        raw_cpu = None if cpu is None else round(cpu_seconds(proc.pid) - cpu, 2)
        raw_client_cpu = round(client_cpu_seconds(children=False) - client, 2)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    identical = pushed == raw
    if not identical:
        diff = [k for k in sorted(set(pushed) | set(raw)) if pushed.get(k) != raw.get(k)][:5]
        print("differences:", {k: (pushed.get(k), raw.get(k)) for k in diff}, file=sys.stderr)
    print(json.dumps({
        "benchmark": "costs", "gpus": args.gpus, "days": args.days, "step_s": args.step, "samples": samples,
        "rows": len(pushed), "workers": args.workers, "blocks": blocks, "tsdb_mib": round(tsdb_bytes / 2**20, 1),
        "build_s": round(build_seconds, 1), "pushed_down_s": round(pushed_seconds, 3),
        "pushed_down_prometheus_cpu_s": pushed_cpu, "pushed_down_client_cpu_s": pushed_client_cpu,
        "pushed_down_cpu_ms_per_million_samples": per_million(pushed_cpu, pushed_client_cpu, samples),
        "raw_pull_s": round(raw_seconds, 3), "speedup": round(raw_seconds / pushed_seconds, 1),
        "raw_pull_prometheus_cpu_s": raw_cpu, "raw_pull_client_cpu_s": raw_client_cpu,
        "raw_pull_cpu_ms_per_million_samples": per_million(raw_cpu, raw_client_cpu, samples),
        "raw_over_pushed_cpu": (round((raw_cpu + raw_client_cpu) / (pushed_cpu + pushed_client_cpu), 1)
                                if None not in (raw_cpu, pushed_cpu) and pushed_cpu + pushed_client_cpu else None),
        **machine(),
        "identical": identical, "goal_met": identical and pushed_seconds < 10 and raw_seconds >= 10 * pushed_seconds,
    }))


if __name__ == "__main__":
    main()
