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

Both must give identical GPU-hours and cents, the same utilization to
1e-9 percent, and the same observed, idle and unobserved GPU-hours (a DCGM
exporter misses one hour a day on some nodes, so not everything allocated is
observed). The idle column needs a comparison per sample, hence a subquery
at the scrape interval (``costs.prometheus.idle_pieces``): it is timed apart
(``idle_*``), next to the main table whose goal is unchanged.

The synthetic TSDB is built with ``promtool tsdb create-blocks-from
openmetrics``, one input file per 2-hour block: promtool reads its whole
input once per block it writes, so day files cost 12 passes where block
files cost one (the one-time build went from 24 minutes to a few). It is
then compacted once by Prometheus as a month of history would be, and
cached under ``var/bench/`` in a folder named by a digest of the generator's
code and parameters (a changed generator builds anew, an unchanged one is
reused). Goal: pushed down under 10 s and at least 10 x faster than the raw pull.
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


BLOCK_SECONDS = 7200  # promtool writes 2-hour blocks
IDLE_PERCENT = 5.0
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


def write_block(path: Path, block: int, nodes: int, teams: int, step: int) -> int:
    """The 2-hour block ``block`` (counted from T0) of DCGM and kube-state-metrics series as OpenMetrics;
    returns the sample count."""
    start = int(T0.timestamp()) + block * BLOCK_SECONDS
    day = block * BLOCK_SECONDS // 86400
    times = range(start, start + BLOCK_SECONDS, step)
    count = 0
    with open(path, "w", buffering=1 << 22) as out:
        out.write("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
        for node in range(nodes):
            if not running(node, day):
                continue
            ns, pod = f"cp-team{node % teams}", f"job-{node}-1-0-bench"
            seen = [t for t in times if scraped(node, t)]
            steps = [t // step * 11 for t in seen]
            tails = [f" {t}\n" for t in seen]  # formatted once per node, not once per sample
            for gpu in range(GPUS_PER_NODE):
                prefix = (f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",Hostname="node{node}",namespace="{ns}",pod="{pod}",'
                          f'container="main"}} ')
                base = utilization(node, gpu, 0, step)  # utilization() = (base + t // step * 11) % 101
                out.write("".join([prefix + PERCENT[(base + k) % 101] + tail for k, tail in zip(steps, tails)]))
                count += len(seen)
        all_tails = [f" {t}\n" for t in times]
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
                head = f"{family}{labels} {value_of(node)}"
                out.write("".join([head + tail for tail in all_tails]))
                count += len(times)
        out.write("# EOF\n")
    return count


def _build_block(job: tuple) -> int:
    """Worker: write one 2-hour block's OpenMetrics file, convert it with promtool (one pass), delete it."""
    data, block, nodes, teams, step = job
    path = data.parent / "incoming" / f"block{block}.om"
    samples = write_block(path, block, nodes, teams, step)
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(data)],
                   check=True)
    path.unlink()
    return samples


def build_tsdb(data: Path, nodes: int, teams: int, days: int, step: int, workers: int) -> int:
    """Build the TSDB one 2-hour block per worker task (generation and promtool are both CPU bound); returns samples."""
    (data.parent / "incoming").mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    blocks = days * 86400 // BLOCK_SECONDS
    with multiprocessing.Pool(workers) as pool:
        samples = sum(pool.imap_unordered(_build_block, [(data, b, nodes, teams, step) for b in range(blocks)]))
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
    ticks every minute, and the first tick runs every plan until none is
    left: once it has been triggered, the compaction is over when no block
    is being written (no ``*.tmp-for-creation`` folder) and neither the
    completed compactions nor the loaded blocks have changed for 5 s (or,
    at the latest, when a second tick has been triggered).
    """
    proc, url = start_prometheus(data, compact=True)
    try:
        deadline = time.monotonic() + 3600
        stable, last = 0, None
        while stable < 5 and _metric(url, "prometheus_tsdb_compactions_triggered_total") < 2:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("compaction did not finish; see " + str(data.parent / "prometheus.log"))
            time.sleep(1)
            state = (_metric(url, "prometheus_tsdb_compactions_total"), _metric(url, "prometheus_tsdb_blocks_loaded"))
            writing = any(p.name.endswith(".tmp-for-creation") for p in data.iterdir())
            triggered = _metric(url, "prometheus_tsdb_compactions_triggered_total") >= 1
            stable = stable + 1 if triggered and not writing and state == last and state[0] > 0 else 0
            last = state
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


def idle_day(source: P.Source, day: int, step: int) -> dict:
    """``{(team, day): idle samples}`` of one day from the idle subquery (``costs.prometheus.idle_pieces``)."""
    lo, hi = T0 + day * DAY, T0 + (day + 1) * DAY
    usage = P.read_usage_by(source, 'namespace=~"cp-.*"', lo, hi, ("namespace",), step_seconds=step,
                            idle_percent=IDLE_PERCENT, fields=("idle_samples",))
    return {(ns, day): u.idle_samples for (ns,), u in usage.items()}


def by_day(source: P.Source, days: int, workers: int, one_day) -> dict:
    """``one_day(source, day)`` for every day, ``workers`` at a time (Prometheus evaluates each query on one core)."""
    table = {}
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(lambda day: one_day(source, day), range(days)):
            table.update(part)
    return table


def raw_pull(source: P.Source, days: int, step: int, chunk_hours: int) -> dict:
    """The same table from raw samples fetched ``chunk_hours`` at a time and summed in Python (one thread:
    decoding JSON and summing hold the GIL, so threads would not help)."""
    client = source.client()
    util = defaultdict(lambda: [0.0, 0, 0])  # utilization sum, samples, idle samples
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
                    acc[2] += float(value) < IDLE_PERCENT
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
    return {key: (seconds / 3600, util[key][0], util[key][1], util[key][2]) for key, seconds in gpu_seconds.items()}


def present(table: dict, days: int, step: int) -> dict:
    """Rows as the API shows them: GPU-hours (6 decimals), cost in cents, utilization (percent, 9 decimals), and
    observed, idle (null without samples) and unobserved GPU-hours (6 decimals)."""
    rows = {}
    for (ns, day), (gpu_hours, util_sum, samples, idle) in sorted(table.items()):
        cost = (Decimal(repr(round(gpu_hours, 6))) * price_on(day, days)).quantize(CENT, ROUND_HALF_EVEN)
        observed = samples * step / 3600
        rows[f"{ns}/{day}"] = (round(gpu_hours, 6), str(cost), round(util_sum / samples, 9) if samples else None,
                               round(observed, 6), round(idle * step / 3600, 6) if samples else None,
                               round(max(0.0, gpu_hours - observed), 6))
    return rows


def cache_key(nodes: int, teams: int, days: int, step: int) -> str:
    """A digest of what the TSDB holds: the generator's code and its parameters (and promtool's version)."""
    code = "".join(inspect.getsource(f) for f in (running, scraped, utilization, write_block))
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
    parser.add_argument("--data-dir", type=Path, default=ROOT / "var" / "bench")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="build processes and query threads")
    args = parser.parse_args()
    require("costs", commands_missing({"prometheus": "prometheus", "promtool": "prometheus"}))
    nodes = args.gpus // GPUS_PER_NODE
    home = args.data_dir / f"costs-{args.gpus}gpus-{args.days}d-{args.step}s-{cache_key(nodes, args.teams, args.days, args.step)}"
    data = home / "data"
    built, children = time.perf_counter(), client_cpu_seconds(children=True) - client_cpu_seconds(children=False)
    if not (home / "samples").exists():
        shutil.rmtree(home, ignore_errors=True)
        build_tsdb(data, nodes, args.teams, args.days, args.step, args.workers)
    import_seconds = time.perf_counter() - built
    import_cpu = client_cpu_seconds(children=True) - client_cpu_seconds(children=False) - children
    if not (home / "compacted").exists():
        compact_tsdb(data)
    build_seconds = time.perf_counter() - built
    compact_cpu = client_cpu_seconds(children=True) - client_cpu_seconds(children=False) - children - import_cpu
    samples = int((home / "samples").read_text())
    blocks, tsdb_bytes = tsdb_shape(data)
    proc, url = start_prometheus(data)
    try:
        source = P.Source(url, "")
        cpu, client, t = cpu_seconds(proc.pid), client_cpu_seconds(children=False), time.perf_counter()
        main_table = by_day(source, args.days, args.workers, lambda src, day: pushed_down_day(src, day, args.step))
        pushed_seconds = time.perf_counter() - t
        # Prometheus's CPU time for the pushed-down queries: the wall time above is this over the cores it got.
        pushed_cpu = None if cpu is None else round(cpu_seconds(proc.pid) - cpu, 2)
        pushed_client_cpu = round(client_cpu_seconds(children=False) - client, 2)
        cpu, client, t = cpu_seconds(proc.pid), client_cpu_seconds(children=False), time.perf_counter()
        idle = by_day(source, args.days, args.workers, lambda src, day: idle_day(src, day, args.step))
        idle_seconds = time.perf_counter() - t
        idle_cpu = None if cpu is None else round(cpu_seconds(proc.pid) - cpu, 2)
        idle_client_cpu = round(client_cpu_seconds(children=False) - client, 2)
        pushed = present({k: (*v, idle.get(k, 0)) for k, v in main_table.items()}, args.days, args.step)
        cpu, client, t = cpu_seconds(proc.pid), client_cpu_seconds(children=False), time.perf_counter()
        raw = present(raw_pull(source, args.days, args.step, args.chunk_hours), args.days, args.step)
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
        "build_s": round(build_seconds, 1), "build_import_s": round(import_seconds, 1),
        "build_compact_s": round(build_seconds - import_seconds, 1), "build_import_cpu_s": round(import_cpu, 1),
        "build_compact_cpu_s": round(compact_cpu, 1), "tsdb_cache": home.name, "pushed_down_s": round(pushed_seconds, 3),
        "pushed_down_prometheus_cpu_s": pushed_cpu, "pushed_down_client_cpu_s": pushed_client_cpu,
        "pushed_down_cpu_ms_per_million_samples": per_million(pushed_cpu, pushed_client_cpu, samples),
        "raw_pull_s": round(raw_seconds, 3), "speedup": round(raw_seconds / pushed_seconds, 1),
        "raw_pull_prometheus_cpu_s": raw_cpu, "raw_pull_client_cpu_s": raw_client_cpu,
        "raw_pull_cpu_ms_per_million_samples": per_million(raw_cpu, raw_client_cpu, samples),
        "idle_subquery_s": round(idle_seconds, 3), "idle_subquery_prometheus_cpu_s": idle_cpu,
        "idle_subquery_client_cpu_s": idle_client_cpu,
        "idle_subquery_cpu_ms_per_million_samples": per_million(idle_cpu, idle_client_cpu, samples),
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
