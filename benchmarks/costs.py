"""Benchmark: what the product's utilization collection costs Prometheus per day of a GPU fleet, and the 30-day
utilization and capacity views read from the database rollups, on a month of that fleet in a real Prometheus.

Default size: 30 days of 1,024 GPUs (128 nodes of 8, 8 teams) scraped every 15 s (about 200 million samples),
each node running one attempt all month. In the benchmark's own PostgreSQL database (``BENCH_DATABASE_URL``,
default ``postgres://postgres@127.0.0.1:5432/controlplane_bench_costs``, recreated per run; Celery's in-memory
broker) the fleet the TSDB holds (``build_fleet``): one cluster whose ``prometheus_url`` is the benchmark's
Prometheus, teams ``team<k>`` (namespaces ``cp-team<k>``), one pool of 8-GPU nodes and its node inventory, and
per node job ``n + 1`` whose running attempt ``job-<n + 1>-1`` owns the node's pod ``job-<n + 1>-1-0-bench``.

* Daily collection (``daily_collection``; goal: under 5 s of Prometheus CPU per day of the fleet): the product's
  periodic collection of one whole UTC day in the middle of the data (``--day``, default the middle one), as
  beat runs it: ``costs.collection.periodic_pass(now)`` every ``UTILIZATION_INTERVAL_SECONDS`` (96 passes) and
  ``collect_ended(now)`` every ``ENDED_UTILIZATION_INTERVAL_SECONDS`` (1,440 checks; nothing ends in this
  fleet, so they cost the database only), each with the clock at its instant (time_machine), after the pass
  before the day (unmeasured); ``--passes N``: N consecutive passes around the day's noon, scaled to the day.
  Whatever a pass reads is what is measured (a pass that re-reads its whole window reads every attempt's every
  day of the last ``COSTS_COLLECT_LOOKBACK_SECONDS`` from a UTC midnight, each time): Prometheus' CPU
  (``/proc``), the HTTP queries it answered (``prometheus_http_requests_total`` of its ``/api/`` handlers),
  this process' CPU (the client, Django's ORM included) and its PostgreSQL backend's, per day and per pass.
* Rollup views (``rollup_views``; goal: each under 200 ms): ``/api/v1/utilization/`` and ``/api/v1/capacity/``
  over the whole data (30 days) with each of their ``group_by`` options, in process (Django's test client,
  logged in as a platform admin), the fastest of ``--view-repeat``, in wall and CPU milliseconds (this process
  and its PostgreSQL backend). What they read is made by the product: the utilization rollups by one
  ``collect_utilization`` over the month (its cost is given as ``month_collection``), the ledger and its
  rollups by ``accrue_running`` up to the month's end, the node inventory (``runners.NodeSpan``) written as
  node sync would have it, each node seen all month.
* Cold pull (no goal; kept as ratios): the per-team, per-day table of the whole month read two ways. Pushed
  down (``costs.prometheus``): per UTC day the product's two queries, ``read_usage_by`` (``sum by
  (namespace)`` over ``sum_over_time``/``count_over_time`` of DCGM_FI_DEV_GPU_UTIL, and the observed and idle
  time under Prometheus' 5-minute lookback: subqueries at the scrape interval, all points for the observed
  time, the points under the threshold for the idle time, ``costs.prometheus.lookback_instants``) and
  ``allocated_gpu_hours_by`` (kube-state-metrics GPU requests, ``max_over_time``, joined on (namespace, pod)
  with the samples of the Running phase, ``sum_over_time``), ``--workers`` days at a time; raw pull: the raw
  samples of the same series, fetched in chunks of hours, aggregated in Python (each sample observed from its
  time until the next one or the lookback, at the instants of the scrape interval). Both must give identical
  GPU-hours and cents, the same utilization to 1e-9 percent, and the same observed, idle and unobserved
  GPU-hours (a DCGM exporter misses one hour a day on some nodes, so not everything allocated is observed):
  ``identical``. The table is timed ``--repeat`` times (the fastest counts), then each of its three queries
  alone (``per_query``: ``usage``, ``idle``, ``allocated``); ``speedup`` and ``raw_over_pushed_cpu`` (raw pull
  over pushed down, CPU of Prometheus and the client) compare them, ``pushed_down_cores_busy`` is Prometheus
  CPU over the table's wall time.

The synthetic TSDB is built with ``promtool tsdb create-blocks-from openmetrics``, one input file per block of
54 hours (``SPAN_SECONDS``, promtool's hidden ``--max-block-duration``; cut at its multiples since the epoch,
where such blocks begin): promtool reads its whole input once to find its time range and once per block it
writes, so one file per block is read twice, and long blocks cost less per sample than 2-hour ones (about a
fifth less CPU) and leave nothing to compact: 54 hours is one of the lengths Prometheus compacts a month of
history to, and the chunks are cut as Prometheus cuts them. Spans are built ``--workers`` at a time, longest
first. The TSDB is cached under ``var/bench/`` in a folder named by a digest of the generator's code and
parameters (a changed generator builds anew, an unchanged one is reused); the build's time is in ``build_s``
and ``build_cpu_s``. Needs ``prometheus`` and ``promtool`` on PATH (Debian package ``prometheus``) and
PostgreSQL; without them it ends with status 3 and says so. Ends with one JSON line; ``goals_met`` covers the
daily collection and the views.

    .venv/bin/python benchmarks/costs.py                   # full size (builds ~200 M samples once)
    .venv/bin/python benchmarks/costs.py --gpus 128 --days 4  # the quick size (make bench)
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import inspect
import json
import math
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
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/controlplane_bench_costs"
BENCH_URL = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
# The fleet's database (recreated per run) and Celery's in-memory broker, before Django reads its settings.
os.environ.update(DATABASE_URL=BENCH_URL, CELERY_BROKER_URL="memory://")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

from benchmarks import ledger_scale  # noqa: E402
from benchmarks.procstat import client_cpu_seconds, cpu_seconds, machine  # noqa: E402
from benchmarks.services import commands_missing, postgres_missing, require  # noqa: E402
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


def pod_name(node: int) -> str:
    """The pod of the node's one job: ``job-<job id>-<attempt number>-<index>-<suffix>`` (``jobs.models``' legacy
    object name ``job-<job id>-1`` plus a pod's index and suffix) of job ``node + 1``, whose one attempt runs
    on the node all month."""
    return f"job-{node + 1}-1-0-bench"


def write_span(path: Path, first: int, blocks: int, nodes: int, teams: int, step: int) -> int:
    """The 2-hour blocks ``first .. first + blocks - 1`` (counted from T0) of DCGM and kube-state-metrics series as
    OpenMetrics, each series' samples together and in time order; returns the sample count."""
    starts = [int(T0.timestamp()) + b * BLOCK_SECONDS for b in range(first, first + blocks)]
    count = 0
    with open(path, "w", buffering=1 << 22) as out:
        out.write("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
        for node in range(nodes):
            ns, pod = f"cp-team{node % teams}", pod_name(node)
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
                ns, pod = f"cp-team{node % teams}", pod_name(node)
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
    code = "".join(inspect.getsource(f) for f in (running, scraped, utilization, pod_name, write_span, spans))
    version = subprocess.run([shutil.which("promtool"), "--version"], capture_output=True, text=True).stdout
    text = f"{code}|{nodes}|{teams}|{days}|{step}|{T0.isoformat()}|{version.splitlines()[:1]}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def per_million(prometheus_cpu: float | None, client_cpu: float, samples: int) -> dict:
    """CPU milliseconds per million samples of the table's month, of Prometheus and of the client."""
    scale = 1000 * 1e6 / samples
    return {"prometheus": None if prometheus_cpu is None else round(prometheus_cpu * scale, 2),
            "client": round(client_cpu * scale, 2)}


# --- what runs in production: the periodic collection of a day, and the 30-day views on the rollups ----------

GOALS = {"daily_collection": 5.0, "rollup_views": 200.0}  # Prometheus CPU s per day of the fleet; ms per view
NODE_POOL = "h100"


def build_fleet(prometheus_url: str, nodes: int, teams: int, days: int) -> dict:
    """In the (recreated) benchmark database, the fleet the TSDB holds: one cluster whose Prometheus is the
    benchmark's (``Cluster.prometheus_url``: its series carry no cluster label, so the source's cluster matcher
    is empty, ``costs.prometheus.source_for``), its price (``PRICE_BEFORE``, ``PRICE_AFTER`` from mid-month, as
    the cold pull's table prices it), one pool of ``nodes`` 8-GPU H100 nodes, ``teams`` teams ``team<k>`` (namespace
    ``cp-team<k>`` under the default ``K8S_NAMESPACE_PREFIX``), a platform admin (staff), the node inventory
    (``runners.NodeSpan``: node ``node<n>``, the DCGM series' ``Hostname``, seen the whole month) and per node
    job ``n + 1`` (team ``n % teams``) whose one attempt ``job-<n + 1>-1`` holds the node's 8 GPUs from T0 on
    and is still running: its pods are the TSDB's ``pod_name(n)``. Returns ``{"admin", "cluster", "attempts"}``."""
    from django.contrib.auth.models import User
    from django.core.management.color import no_style
    from django.db import connection

    from costs.models import Price
    from costs.seed import seed_accelerators
    from jobs.models import Job, JobAttempt, JobState
    from quotas.models import Team
    from runners.models import Accelerator, Cluster, NodePool, NodeSpan

    seed_accelerators()
    acc = Accelerator.objects.get(name="H100-80GB")
    admin = User.objects.create_user("bench-admin", is_staff=True)
    cluster = Cluster.objects.create(name="bench", provider="aws", region="bench-1", backend="kubernetes",
                                     prometheus_url=prometheus_url)
    Price.objects.bulk_create([
        Price(provider="aws", region="bench-1", accelerator=acc, cluster=cluster, usd_per_gpu_hour=price_on(day, days),
              effective_from=T0 + day * DAY - (DAY if day == 0 else dt.timedelta(0))) for day in (0, days // 2)])
    pool = NodePool.objects.create(cluster=cluster, name=NODE_POOL, accelerator=acc, nodes=nodes,
                                   gpus_per_node=GPUS_PER_NODE)
    team_rows = Team.objects.bulk_create([Team(slug=f"team{k}", name=f"Team {k}") for k in range(teams)])
    jobs = Job.objects.bulk_create([
        Job(pk=node + 1, team=team_rows[node % teams], submitter=admin, name=f"train-{node}", spec={}, accelerator=acc,
            gpus_per_node=GPUS_PER_NODE, nodes=1, max_runtime_seconds=2 * days * 86400, state=JobState.RUNNING,
            estimated_cost_usd=Decimal(0), admitted_at=T0, started_at=T0) for node in range(nodes)])
    with connection.cursor() as cursor:  # the ids were given: the sequence goes on after them
        for sql in connection.ops.sequence_reset_sql(no_style(), [Job]):
            cursor.execute(sql)
    attempts = JobAttempt.objects.bulk_create([
        JobAttempt(job=job, number=1, cluster=cluster, node_pool=pool, gpus=GPUS_PER_NODE,
                   object_name=f"job-{job.pk}-1", usd_per_gpu_hour=PRICE_BEFORE, started_at=T0,
                   placement={"nodes": [f"node{node}"], "gpus_per_node": GPUS_PER_NODE})
        for node, job in enumerate(jobs)])
    assert all(f"{a.object_name}-0-bench" == pod_name(node) for node, a in enumerate(attempts))
    for job, attempt in zip(jobs, attempts, strict=True):
        job.current_attempt = attempt
    Job.objects.bulk_update(jobs, ["current_attempt"])
    NodeSpan.objects.bulk_create([
        NodeSpan(cluster=cluster, node_name=f"node{node}", node_pool=pool, pool_name=pool.name, accelerator=acc,
                 capacity_type=pool.capacity_type, gpus=GPUS_PER_NODE, schedulable=True, start=T0,
                 end=T0 + days * DAY, open=False) for node in range(nodes)])
    return {"admin": admin, "cluster": cluster, "attempts": len(attempts)}


def http_queries(url: str) -> int:
    """The HTTP API requests Prometheus has answered so far (``prometheus_http_requests_total`` summed over the
    ``/api/`` handlers: queries, series and label lookups; its own ``/metrics`` and readiness not counted)."""
    total = 0
    for line in urllib.request.urlopen(url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


class Usage:
    """Wall seconds, HTTP queries, and CPU seconds of Prometheus, of this process (the collection's client, the
    Django ORM included) and of its PostgreSQL backend over a block."""

    def __init__(self, pid: int, url: str, backend: int):
        self.pid, self.url, self.backend = pid, url, backend

    def read(self) -> tuple:
        return (time.perf_counter(), http_queries(self.url), cpu_seconds(self.pid), time.process_time(),
                cpu_seconds(self.backend))

    def __enter__(self):
        self.start = self.read()
        return self

    def __exit__(self, *exc) -> None:
        end = self.read()
        self.figures = {key: None if None in (a, b) else round(b - a, 3) for key, a, b in zip(
            ("s", "queries", "prometheus_cpu_s", "client_cpu_s", "postgres_cpu_s"), self.start, end, strict=True)}


def beat_interval(task: str) -> int:
    """Seconds between two runs of the beat ``task`` (``CELERY_BEAT_SCHEDULE``: ``UTILIZATION_INTERVAL_SECONDS``,
    ``ENDED_UTILIZATION_INTERVAL_SECONDS``)."""
    from django.conf import settings

    return int(next(e["schedule"] for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == task))


def daily_collection(usage: Usage, day: int, passes: int | None = None) -> dict:
    """The product's utilization collection over UTC day ``day`` (counted from T0), as beat runs it:
    ``periodic_pass(now)`` every ``UTILIZATION_INTERVAL_SECONDS`` (96 passes at 900 s) and ``collect_ended(now)``
    every ``ENDED_UTILIZATION_INTERVAL_SECONDS`` (1,440 at 60 s), each with the clock at its instant
    (time_machine, ticking), so what the product reads of the clock (when the label shape was last detected, the
    rows' ``collected_at``) is as it would be then. The pass before the first one measured runs first,
    unmeasured: the day is a day of a collection that was running already. ``passes``: only that many
    consecutive passes (and the ended checks between them) around the day's noon, their figures scaled to the
    whole day (a pass's cost varies over the day: today's piece grows); None: the whole day. Returns
    ``usage``'s figures per day (``s``, ``queries``, ``*_cpu_s``) with ``passes`` (measured), ``scale`` (passes
    in a day over those measured), ``rows`` (rollup rows written), ``ended_checks``, ``ended_collected`` and the
    slowest pass (``max_pass_s``)."""
    import time_machine

    from costs.collection import collect_ended, periodic_pass

    every, ended_every = beat_interval("costs.tasks.collect_utilization"), beat_interval(
        "costs.tasks.collect_ended_utilization")
    per_day = 86400 // every
    measured = min(passes or per_day, per_day)
    start = T0 + day * DAY + dt.timedelta(seconds=(per_day - measured) // 2 * every)
    with time_machine.travel(start - dt.timedelta(seconds=every), tick=True):
        periodic_pass(start - dt.timedelta(seconds=every))
    rows = done = checks = ended = 0
    slowest = 0.0
    with usage:
        for second in range(0, measured * every, math.gcd(every, ended_every)):
            now = start + dt.timedelta(seconds=second)
            with time_machine.travel(now, tick=True):
                if second % every == 0:
                    t = time.perf_counter()
                    rows += periodic_pass(now)
                    slowest, done = max(slowest, time.perf_counter() - t), done + 1
                if second % ended_every == 0:
                    ended += collect_ended(now)
                    checks += 1
    scale = per_day / done
    return {**{key: None if value is None else round(value * scale, 3) for key, value in usage.figures.items()},
            "passes": done, "scale": round(scale, 3), "rows": rows, "ended_checks": checks,
            "ended_collected": ended, "max_pass_s": round(slowest, 3)}


def month_rollups(usage: Usage, days: int) -> dict:
    """Fill what the 30-day views read, with the clock at the month's end: the utilization rollups by the
    product's collection of the whole month at once (``collect_utilization(T0, T0 + days)``: one query per
    attempt and day), and the ledger by its accrual (``accrue_running``: hourly entries and their rollups,
    ``DailyCostRollup``, ``JobDailyCost``, ``AttemptDailyCost``, ``TeamSpend``). Returns the collection's
    ``usage`` figures, rows, ledger entries and the accrual's seconds."""
    import time_machine
    from django.db import connection

    from costs.collection import collect_utilization
    from costs.ledger import accrue_running
    from costs.models import CostEntry

    end = T0 + days * DAY
    with time_machine.travel(end, tick=True):
        with usage:
            rows = collect_utilization(T0, end)
        t = time.perf_counter()
        accrue_running(until=end)
        accrual_s = time.perf_counter() - t
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"collection": {**usage.figures, "rows": rows}, "ledger_entries": CostEntry.objects.count(),
            "accrual_s": round(accrual_s, 2)}


def rollup_views(admin, days: int, repeat: int) -> tuple[dict, dict]:
    """Wall and CPU (this process and its PostgreSQL backend) milliseconds, the fastest of ``repeat``, of
    ``/api/v1/utilization/`` and ``/api/v1/capacity/`` over the ``days`` of data with each of their ``group_by``
    options (Django's test client, in process, logged in as the platform admin): ``({view: {group_by: ms}},
    the same in CPU ms)``."""
    from django.test import Client

    from costs.api.serializers import GROUP_BY_CHOICES
    from costs.capacity import GROUPS

    client = Client()
    client.force_login(admin)
    meter = ledger_scale.Meter()
    window = {"start": T0.isoformat(), "end": (T0 + days * DAY).isoformat()}
    wall, cpu = {}, {}
    for view, groups in (("utilization", GROUP_BY_CHOICES), ("capacity", GROUPS)):
        wall[view], cpu[view] = {}, {}
        for group_by in groups:
            def get(_, view=view, group_by=group_by):
                response = client.get(f"/api/v1/{view}/", {"group_by": group_by, **window})
                assert response.status_code == 200, response.content[:300]
                assert response.json()["results"], (view, group_by)
            seconds, cpu_s = ledger_scale.timed(meter, get, repeat)
            wall[view][group_by], cpu[view][group_by] = round(seconds * 1000, 1), round(cpu_s * 1000, 1)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--repeat", type=int, default=2, help="cold pull: pushed-down table runs (the fastest counts)")
    parser.add_argument("--day", type=int, default=None,
                        help="the day of collection measured, counted from the first (default the middle one)")
    parser.add_argument("--passes", type=int, default=None,
                        help="measure only that many consecutive passes around the day's noon, scaled to the day "
                             "(default all: the whole day)")
    parser.add_argument("--view-repeat", type=int, default=3, help="runs of each view (the fastest counts)")
    args = parser.parse_args()
    require("costs", [*commands_missing({"prometheus": "prometheus", "promtool": "prometheus"}),
                      postgres_missing(BENCH_URL)])
    from django.conf import settings
    from django.db import connection

    lookback_days = math.ceil(settings.COSTS_COLLECT_LOOKBACK_SECONDS / 86400)
    day = max(lookback_days, args.days // 2) if args.day is None else args.day
    if not lookback_days <= day < args.days:
        parser.error(f"the day collected needs the {lookback_days} days before it in the data: --days >= "
                     f"{lookback_days + 1}, {lookback_days} <= --day < --days")
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
    ledger_scale.recreate(BENCH_URL)
    proc, url = start_prometheus(data)
    try:
        fleet = build_fleet(url, nodes, args.teams, args.days)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            usage = Usage(proc.pid, url, cursor.fetchone()[0])
        collection = {"day": str((T0 + day * DAY).date()), **daily_collection(usage, day, args.passes)}
        month = month_rollups(usage, args.days)
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
    views_ms, views_cpu_ms = rollup_views(fleet["admin"], args.days, args.view_repeat)
    views_max = max(ms for view in views_ms.values() for ms in view.values())
    per_day = round(collection["passes"] * collection["scale"])
    identical = pushed_compared == raw
    if not identical:
        diff = [k for k in sorted(set(pushed_compared) | set(raw)) if pushed.get(k) != raw.get(k)][:5]
        print("differences:", {k: (pushed.get(k), raw.get(k)) for k in diff}, file=sys.stderr)
    print(json.dumps({
        "benchmark": "costs", "gpus": args.gpus, "days": args.days, "step_s": args.step, "samples": samples,
        "attempts": fleet["attempts"],
        "daily_collection_prometheus_cpu_s": collection["prometheus_cpu_s"],
        "daily_collection_queries": collection["queries"],
        "daily_collection_client_cpu_s": collection["client_cpu_s"],
        "daily_collection_postgres_cpu_s": collection["postgres_cpu_s"],
        "daily_collection_s": collection["s"],
        "daily_collection_cpu_ms_per_pass": {
            key: None if collection[f"{key}_cpu_s"] is None else round(collection[f"{key}_cpu_s"] * 1000 / per_day, 1)
            for key in ("prometheus", "client", "postgres")},
        "daily_collection": collection, "month_collection": month["collection"],
        "ledger_entries": month["ledger_entries"], "accrual_s": month["accrual_s"],
        "rollup_views_ms": {**views_ms, "max": views_max}, "rollup_views_cpu_ms": views_cpu_ms,
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
        "identical": identical, "goals": GOALS,
        "goals_met": {"daily_collection": collection["prometheus_cpu_s"] is not None
                      and collection["prometheus_cpu_s"] < GOALS["daily_collection"],
                      "rollup_views": views_max < GOALS["rollup_views"]},
    }))


if __name__ == "__main__":
    main()
