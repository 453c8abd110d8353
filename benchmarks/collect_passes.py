"""Prometheus CPU of one day of periodic utilization passes (96, every 15 minutes): the whole-lookback re-read
against the incremental, grouped pass (``costs.collection.periodic_pass``, docs/adr/0026).

Fixture: ``--nodes`` nodes of 8 GPUs (default 8: 64 GPUs) scraped every 15 s by dcgm-exporter (utilization
and memory, pods labelled ``namespace``/``pod``) for three UTC days, in a real Prometheus (built with
``promtool``, 2-hour blocks, no compaction while measuring). Half the nodes run one 8-GPU job through all three
days; the other half run 6-hour jobs back to back (a start and an end every 6 hours per node). The measured
day is the third: the passes at ``D + 7.5 min + k x 15 min``. Before: each pass re-reads the lookback (2 days
from a UTC midnight) per attempt and day (``collect_utilization(lookback_start(now), now)``, what the pass did
before). After: ``periodic_pass(now)``, from the rows a pass 15 minutes before the day left (the steady state;
the previous day's rows are sealed during the measured day, as every day's are once, without another read; each
15-minute window is one raw read of the GPU series summed in Python, docs/adr/0034). The fixture has no profiling
or energy series, so a raw read here holds two series per GPU where a full exporter has four. Each phase is measured on the same
Prometheus in the same run: CPU seconds of its process (``/proc``), its own count of instant queries
(``prometheus_http_requests_total``), wall time. ``projected_1024_gpus_cpu_s``: the after figure scaled by
GPUs (an upper bound: the per-query overhead does not grow with the fleet).

Run: ``.venv/bin/python benchmarks/collect_passes.py``. Database ``BENCH_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/cp_bench_collect``, recreated on each run; needs ``prometheus`` and
``promtool`` on PATH. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.procstat import client_cpu_seconds, cpu_seconds, machine  # noqa: E402
from benchmarks.services import commands_missing, postgres_missing, require  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/cp_bench_collect"
STEP = 15
DAY = dt.timedelta(days=1)
D0 = dt.datetime(2026, 9, 7, tzinfo=UTC)  # the first of the three days; the measured day is D0 + 2 days
SHORT = dt.timedelta(hours=6)


def runs(nodes: int) -> list[tuple[int, int, dt.datetime, dt.datetime]]:
    """``(n, node, start, end)`` of every job: one through the three days on the first half of the nodes, 6-hour
    jobs back to back on the others; starts and ends 30 s after the hour, off the scrape grid."""
    out = []
    for node in range(nodes):
        if node < nodes // 2:
            out.append((len(out) + 1, node, D0 + dt.timedelta(seconds=30), D0 + 3 * DAY - dt.timedelta(minutes=30)))
        else:
            t = D0 + dt.timedelta(seconds=30)
            while t + SHORT <= D0 + 3 * DAY:
                out.append((len(out) + 1, node, t, t + SHORT - dt.timedelta(minutes=1)))
                t += SHORT
    return out


def write_openmetrics(path: Path, nodes: int) -> int:
    """The scrapes of every job's 8 GPUs (utilization and memory) as OpenMetrics text; returns samples written."""
    samples = 0
    with open(path, "w") as f:
        for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
            f.write(f"# TYPE {metric} gauge\n")
            for n, node, start, end in runs(nodes):
                first = int(start.timestamp()) // STEP * STEP + STEP + 3
                for gpu in range(8):
                    labels = (f'{{gpu="{gpu}",UUID="GPU-{node}-{gpu}",Hostname="node-{node}",container="main",'
                              f'namespace="cp-bench",pod="job-{n}-1-0-abcde"}}')
                    lines = []
                    for t in range(first, int(end.timestamp()), STEP):
                        value = (t // 60 + gpu * 7 + n) % 100 if metric.endswith("UTIL") else 20000 + gpu
                        lines.append(f"{metric}{labels} {value} {t}\n")
                    f.writelines(lines)
                    samples += len(lines)
        f.write("# EOF\n")
    return samples


def start_prometheus(data: Path) -> tuple[subprocess.Popen, str]:
    """A Prometheus over ``data`` with 2-hour blocks at most, so that no compaction runs while passes are timed."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = data.parent / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    proc = subprocess.Popen(
        [shutil.which("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=3650d",
         "--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"],
        stdout=open(data.parent / "prometheus.log", "ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if urllib.request.urlopen(url + "/-/ready", timeout=1).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("prometheus did not become ready")


def instant_queries(url: str) -> int:
    """Prometheus' own count of requests to ``/api/v1/query`` so far."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    found = re.findall(r'prometheus_http_requests_total\{code="\d+",handler="/api/v1/query"\} (\d+)', text)
    return sum(int(n) for n in found)


def phase(pid: int, url: str, passes, work) -> dict:
    queries, cpu, client, wall = instant_queries(url), cpu_seconds(pid), client_cpu_seconds(), time.monotonic()
    for now in passes:
        work(now)
    return {"prometheus_cpu_s": round(cpu_seconds(pid) - cpu, 2), "queries": instant_queries(url) - queries,
            "client_cpu_s": round(client_cpu_seconds() - client, 2), "wall_s": round(time.monotonic() - wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8, help="nodes of 8 GPUs scraped (default 8: 64 GPUs)")
    parser.add_argument("--passes", type=int, default=96,
                        help="passes of the measured day, every 15 minutes from 00:07:30 (default 96: the whole day)")
    args = parser.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    require("collect_passes", [postgres_missing(url), *commands_missing({"prometheus": "prometheus",
                                                                         "promtool": "prometheus"})])
    from benchmarks.ledger_scale import recreate

    recreate(url)
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="controlplane.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User

    from costs.collection import collect_utilization, lookback_start, periodic_pass
    from costs.models import UtilizationRollup
    from costs.seed import seed_accelerators, seed_prices
    from jobs.models import Job, JobAttempt, JobState
    from quotas.models import Team
    from runners.models import Accelerator, Cluster, NodePool

    with tempfile.TemporaryDirectory(prefix="bench-collect-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        samples = write_openmetrics(work / "fleet.om", args.nodes)
        subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(work / "fleet.om"),
                        str(work / "data")], check=True, capture_output=True)
        (work / "fleet.om").unlink()
        build_s = time.monotonic() - started
        proc, prom = start_prometheus(work / "data")
        try:
            settings.COSTS_SCRAPE_INTERVAL_SECONDS = STEP
            seed_accelerators()
            seed_prices()
            h100 = Accelerator.objects.get(name="H100-80GB")
            team = Team.objects.create(slug="bench", name="Bench")
            cluster = Cluster.objects.create(name="bench", provider="aws", region="us-east-1", backend="kubernetes",
                                             prometheus_url=prom)
            pool = NodePool.objects.create(cluster=cluster, name="gpu", accelerator=h100, capacity_type="on-demand",
                                           nodes=args.nodes, gpus_per_node=8)
            submitter = User.objects.create(username="bench")
            for n, _, start, end in runs(args.nodes):
                job = Job.objects.create(team=team, submitter=submitter, name=f"job{n}", state=JobState.SUCCEEDED,
                                         spec={}, accelerator=h100, gpus_per_node=8, nodes=1, max_runtime_seconds=86400)
                JobAttempt.objects.create(job=job, number=1, cluster=cluster, node_pool=pool, gpus=8,
                                          object_name=f"job-{n}-1", usd_per_gpu_hour="6.88", started_at=start,
                                          ended_at=end)
            day = D0 + 2 * DAY
            passes = [day + dt.timedelta(minutes=7.5 + 15 * k) for k in range(args.passes)]
            before = phase(proc.pid, prom, passes, lambda now: collect_utilization(lookback_start(now), now))
            UtilizationRollup.objects.all().delete()
            periodic_pass(passes[0] - dt.timedelta(minutes=15))  # the rows the previous day's passes left
            after = phase(proc.pid, prom, passes, periodic_pass)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    gpus = args.nodes * 8
    print(json.dumps({
        "benchmark": "collect_passes", "gpus": gpus, "passes": args.passes, "scrape_interval_s": STEP,
        "attempts": len(runs(args.nodes)), "samples": samples, "build_s": round(build_s, 1),
        "before": before, "after": after,
        "before_over_after_prometheus_cpu": round(before["prometheus_cpu_s"] / max(after["prometheus_cpu_s"], 0.01), 1),
        "projected_1024_gpus_cpu_s": round(after["prometheus_cpu_s"] * 1024 / gpus, 2), "goal_1024_gpus_cpu_s": 5.0,
        **machine(),
    }))


if __name__ == "__main__":
    main()
