"""Benchmark of the money path as history grows: accrual, budget status, a scheduling pass and cost queries at two
lengths of ledger history, 10x apart, on PostgreSQL.

Fixture (a fleet of a large lab's size): 40 teams with monthly block budgets, 1,000 running attempts (1-8 GPUs) on 4
clusters, 120 queued jobs of which the free capacity admits 60. History is written with COPY as the ledger's
layout writes it: one entry per attempt and UTC hour (the open entry of the current hour extended by each
accrual), teams' rows interleaved hour by hour, with its day rollups and team totals rebuilt from it
(``costs.rollups.rebuild_totals``). Default lengths: 3 days (72,000 entries) and 30 days (720,000 entries:
the month of this fleet, the full size); ``--days-short``/``--days-long`` change them, ``--attempts`` the
fleet (a smaller fleet is a scaled-down run, and the JSON line says ``full_size: false``).

Measured at each length (the fastest of ``--repeat`` runs, 10x as many for budget status, so that other
load on a shared machine disturbs the ratios least): one accrual run over every running attempt (a minute
later each time), ``budget_status`` of one budget, one scheduling pass (``schedule_pending``: 120 queued,
60 admitted, then undone), the pass's money reads alone (``schedule_budget_reads_ms``: the 40 teams' budget
figures of the snapshot and the locked re-check's, the admitted jobs' teams read together in one transaction),
``/api/v1/costs/?group_by=team`` and ``group_by=day`` over 30 days (Django's test client, staff user), and
``/api/v1/capacity/?group_by=cluster``, ``node`` and ``team`` over 30 days and the Capacity page by node over the
30 UTC days to today (its table and its daily chart), the pools' GPUs as 8-GPU nodes seen for the whole month, each
attempt placed on one of them (``capacity_nodes``, ``capacity_gpus``: 480 nodes at full size; ``--attempts 256``
makes the 1,024-GPU fleet of 128 nodes). The capacity figures read a window's whole days from the running
allocation totals (``costs.running``, ADR 0050: two rows per pool-and-team or node series, however long the
history); beside them, for comparison (not goals): ``capacity_rollup_rows``, the attempt-day rollup rows of the
30-day window (its edge days included), what the figures read before, and ``capacity_rollup_read_ms``, the
database reading and summing them per attempt alone; its ratio is in ``growth_ratios`` but not in
``growth_ratio_max``. History's build rebuilds the running allocation too; ``table_mib`` counts its tables.
Each figure is measured in wall time (the goals) and in CPU time of this process and its PostgreSQL backend
(``cpu_ms``, per operation); ``growth_ratios`` and ``growth_ratio_max`` compare CPU times, which other load
on a shared machine moves far less than wall times (``wall_growth_ratios`` are given too). Ends with one JSON line: ``entries``, ``table_mib``, each figure per length,
``growth_ratio_max`` (the largest long/short ratio) and the goals.

Run: ``.venv/bin/python benchmarks/ledger_scale.py``. Database ``BENCH_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/controlplane_bench_ledger``, recreated on each run. Celery's
in-memory broker: dispatches enqueued by admissions go nowhere.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.procstat import cpu_seconds  # noqa: E402
from benchmarks.services import postgres_missing, require  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/controlplane_bench_ledger"
TEAMS, CLUSTERS, QUEUED, ADMITTED = 40, 4, 120, 60
GOALS = {"accrual_run_s": 2.0, "budget_status_ms": 10.0, "schedule_pass_s": 1.0, "costs_by_team_s": 1.0,
         "costs_by_day_s": 1.0, "capacity_by_cluster_s": 1.0, "capacity_by_node_s": 1.0, "capacity_by_team_s": 1.0,
         "capacity_page_by_node_s": 1.0, "growth_ratio_max": 1.5}
#: Figures whose long/short ratio makes ``growth_ratio_max`` (the budget reads of a pass: its part that reads money).
GROWTH = ("accrual_run_s", "budget_status_ms", "schedule_pass_s", "schedule_budget_reads_ms", "costs_by_team_s",
          "costs_by_day_s", "capacity_by_cluster_s", "capacity_by_node_s", "capacity_by_team_s",
          "capacity_page_by_node_s")
#: Figures shown for comparison, not goals: what the capacity figures read per attempt-day before ADR 0050.
FLOORS = ("capacity_rollup_read_ms",)
#: GPUs per node of the fleet's node inventory (``runners.NodeSpan``): the capacity queries' nodes.
NODE_GPUS = 8


def recreate(url: str) -> None:
    """Drop and create the benchmark database, then migrate it."""
    import psycopg

    admin, dbname = url.rsplit("/", 1)
    with psycopg.connect((admin + "/postgres").replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)


def build_fleet(attempts: int, now: dt.datetime):
    """Teams, budgets, quotas, clusters and ``attempts`` running jobs; returns (staff user, accelerator, budgets)."""
    from django.contrib.auth.models import User

    from costs.models import Price
    from costs.seed import CATALOG_EFFECTIVE_FROM, seed_accelerators, seed_prices
    from jobs.models import Job, JobAttempt, JobState
    from quotas.models import Budget, Quota, Team
    from runners.models import Accelerator, Cluster, NodePool

    seed_accelerators()
    seed_prices()
    acc = Accelerator.objects.get(name="H100-80GB")
    staff = User.objects.create_user("bench", is_staff=True)
    teams = Team.objects.bulk_create([Team(slug=f"team-{i:02d}", name=f"Team {i}") for i in range(TEAMS)])
    budgets = Budget.objects.bulk_create([Budget(team=t, amount_usd=Decimal("10000000"), action="block",
                                                 alert_thresholds=[50, 80, 100]) for t in teams])
    Quota.objects.bulk_create([Quota(team=t, accelerator=acc, nominal_gpus=10_000) for t in teams])
    gpus = [(1, 2, 4, 8)[i % 4] for i in range(attempts)]
    pools = []
    for c in range(CLUSTERS):
        cluster = Cluster.objects.create(name=f"c{c}", provider="aws", region=f"r-{c}", backend="kubernetes")
        Price.objects.create(provider="aws", region=f"r-{c}", accelerator=acc, cluster=cluster,
                             usd_per_gpu_hour=Decimal("6.88") + c, effective_from=CATALOG_EFFECTIVE_FROM)
        held = sum(g for i, g in enumerate(gpus) if i % CLUSTERS == c)
        # Free room for ADMITTED one-GPU jobs in all; the other queued jobs wait for capacity.
        pools.append(NodePool.objects.create(cluster=cluster, name="h100", accelerator=acc,
                                             nodes=held + ADMITTED // CLUSTERS, gpus_per_node=1))
    started = now - dt.timedelta(days=400)
    jobs = Job.objects.bulk_create([
        Job(team=teams[i % TEAMS], submitter=staff, name=f"run-{i}", spec={}, accelerator=acc, gpus_per_node=gpus[i],
            nodes=1, max_runtime_seconds=86400 * 30, state=JobState.RUNNING, estimated_cost_usd=Decimal(0),
            admitted_at=started, started_at=started) for i in range(attempts)])
    rows = JobAttempt.objects.bulk_create([
        JobAttempt(job=job, number=1, cluster_id=pools[i % CLUSTERS].cluster_id, node_pool=pools[i % CLUSTERS],
                   gpus=gpus[i], object_name=f"job-{job.pk}-1", usd_per_gpu_hour=Decimal("6.88") + i % CLUSTERS,
                   started_at=started) for i, job in enumerate(jobs)])
    for job, attempt in zip(jobs, rows, strict=True):
        job.current_attempt = attempt
    Job.objects.bulk_update(jobs, ["current_attempt"], batch_size=2000)
    # The node inventory: each pool's GPUs on 8-GPU nodes seen without a change for the last 31 days, each
    # attempt placed on one of its cluster's nodes (round robin).
    from runners.models import NodeSpan

    spans, names = [], {}
    for pool in pools:
        count = -(-pool.nodes * pool.gpus_per_node // NODE_GPUS)
        names[pool.pk] = [f"{pool.cluster.name}-node-{k}" for k in range(count)]
        spans += [NodeSpan(cluster_id=pool.cluster_id, node_name=n, node_pool=pool, pool_name=pool.name,
                           accelerator=acc, capacity_type=pool.capacity_type, gpus=NODE_GPUS, schedulable=True,
                           start=now - dt.timedelta(days=31), end=now, open=True) for n in names[pool.pk]]
    NodeSpan.objects.bulk_create(spans)
    for i, attempt in enumerate(rows):
        nodes = names[attempt.node_pool_id]
        attempt.placement = {"nodes": [nodes[i // CLUSTERS % len(nodes)]], "gpus_per_node": attempt.gpus}
    JobAttempt.objects.bulk_update(rows, ["placement"], batch_size=2000)
    return staff, acc, budgets


def load_history(hours: int, now: dt.datetime) -> int:
    """Replace the ledger with ``hours`` of hourly entries of every running attempt up to ``now - 60 s`` (the open
    entry of the current hour last), COPY-built, then rebuild the totals; returns the entries written."""
    from django.db import connection

    from core.money import LEDGER_QUANTUM
    from costs.models import CostEntry, DailyCostRollup, JobDailyCost, Price, TeamSpend
    from costs.rollups import rebuild_totals
    from jobs.models import JobAttempt

    price = {p.cluster_id: p.usd_per_gpu_hour for p in Price.objects.filter(cluster__isnull=False)}
    attempts = list(JobAttempt.objects.values_list("pk", "job_id", "job__team_id", "cluster_id",
                                                   "node_pool__accelerator_id", "gpus"))
    accrued = now - dt.timedelta(seconds=60)
    hour = accrued.replace(minute=0, second=0, microsecond=0)
    first = hour - dt.timedelta(hours=hours - 1)
    with connection.cursor() as cursor:
        for model in (CostEntry, DailyCostRollup, JobDailyCost, TeamSpend):
            cursor.execute(f'TRUNCATE "{model._meta.db_table}"')
        cursor.execute(f'UPDATE "{JobAttempt._meta.db_table}" SET accrued_until = %s, started_at = %s',
                       [accrued, first])
        columns = ("attempt_id", "job_id", "team_id", "cluster_id", "accelerator_id", "interval_start",
                   "interval_end", "gpu_milli", "usd_per_gpu_hour", "amount_usd", "created_at")
        written = 0
        with cursor.cursor.copy(f'COPY "{CostEntry._meta.db_table}" ({", ".join(columns)}) FROM STDIN') as copy:
            lo = first
            while lo <= hour:
                hi = min(lo + dt.timedelta(hours=1), accrued)
                seconds = Decimal((hi - lo).total_seconds())
                buf = io.StringIO()
                for pk, job, team, cluster, acc, gpus in attempts:
                    p = price[cluster]
                    amount = (gpus * seconds * p / 3600).quantize(LEDGER_QUANTUM)
                    buf.write(f"{pk}\t{job}\t{team}\t{cluster}\t{acc}\t{lo.isoformat()}\t{hi.isoformat()}\t{gpus * 1000}\t"
                              f"{p}\t{amount}\t{hi.isoformat()}\n")
                copy.write(buf.getvalue())
                written += len(attempts)
                lo += dt.timedelta(hours=1)
    rebuild_totals()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return written


def table_mib() -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(pg_total_relation_size(t)) FROM unnest(%s::regclass[]) AS t",
                       [["costs_costentry", "costs_dailycostrollup", "costs_jobdailycost", "costs_teamspend",
                         "costs_allocationseries", "costs_allocationrunningtotal"]])
        return round(float(cursor.fetchone()[0]) / 2**20, 1)


class Meter:
    """Wall and CPU seconds of a block: CPU of this process and of its PostgreSQL backend (``/proc``)."""

    def __init__(self) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.backend = cursor.fetchone()[0]
        self.walls: list[float] = []
        self.cpus: list[float] = []

    def cpu(self) -> float:
        return time.process_time() + (cpu_seconds(self.backend) or 0.0)

    def __enter__(self):
        self.c0, self.t0 = self.cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.walls.append(time.perf_counter() - self.t0)
        self.cpus.append(self.cpu() - self.c0)


def timed(meter: Meter, fn, repeat: int, per: int = 1) -> tuple[float, float]:
    """The fastest of ``repeat`` runs of ``per`` calls ``fn(i)``, per call: ``(wall seconds, CPU seconds)``.

    The fastest run is the one least disturbed by other load on a shared machine; ``per`` calls together
    outlast the 10 ms tick of ``/proc``'s CPU times.
    """
    meter.walls, meter.cpus = [], []
    for r in range(repeat):
        with meter:
            for i in range(per):
                fn(r * per + i)
    return min(meter.walls) / per, min(meter.cpus) / per


def measure(now: dt.datetime, staff, acc, budgets, repeat: int) -> tuple[dict, dict]:
    """Wall figures (seconds, ``*_ms`` in ms) and CPU milliseconds per operation at the loaded history."""
    from django.db import transaction
    from django.test import Client

    from costs.budgets import budget_status
    from costs.ledger import accrue_running
    from jobs.models import Job, JobAttempt, JobState
    from jobs.scheduling.passes import schedule_pending
    from jobs.scheduling.snapshot import budget_views_by_team

    meter = Meter()
    wall, cpu = {}, {}

    def record(name: str, figures: tuple[float, float], scale: float = 1.0) -> None:
        wall[name], cpu[name] = round(figures[0] * scale, 4), round(figures[1] * 1000, 3)

    record("accrual_run_s", timed(meter, lambda i: accrue_running(until=now + dt.timedelta(seconds=60 * i)), repeat))
    at = now + dt.timedelta(seconds=60 * repeat)
    record("budget_status_ms", timed(meter, lambda i: budget_status(budgets[i % TEAMS], at), repeat, 20), 1000)

    def budget_reads(i):
        budget_views_by_team([b.team_id for b in budgets], at)
        with transaction.atomic():  # the re-check of the 60 admissions: their teams' totals rows locked once
            budget_views_by_team(sorted({budgets[j % TEAMS].team_id for j in range(ADMITTED)}), at, lock=True)
    record("schedule_budget_reads_ms", timed(meter, budget_reads, repeat), 1000)

    walls, cpus, admitted = [], [], []
    for i in range(repeat):
        Job.objects.bulk_create([
            Job(team_id=budgets[j % TEAMS].team_id, submitter=staff, name=f"q{i}-{j}", spec={}, accelerator=acc,
                gpus_per_node=1, nodes=1, max_runtime_seconds=3600, state=JobState.QUEUED) for j in range(QUEUED)])
        pass_wall, pass_cpu = timed(meter, lambda _: schedule_pending(), 1)
        walls.append(pass_wall)
        cpus.append(pass_cpu)
        new = Job.objects.filter(name__startswith=f"q{i}-")
        admitted.append(new.filter(state=JobState.ADMITTED).count())
        JobAttempt.objects.filter(job__in=new).update(ended_at=at)
        Job.objects.filter(pk__in=new).update(current_attempt=None)
        JobAttempt.objects.filter(job__in=new).delete()
        new.delete()
    record("schedule_pass_s", (min(walls), min(cpus)))
    wall["schedule_admitted"] = min(admitted)
    client = Client()
    client.force_login(staff)
    window = {"start": (at - dt.timedelta(days=30)).isoformat(), "end": at.isoformat()}
    for group_by in ("team", "day"):
        def query(i, group_by=group_by):
            response = client.get("/api/v1/costs/", {"group_by": group_by, **window})
            assert response.status_code == 200, response.content[:300]
        record(f"costs_by_{group_by}_s", timed(meter, query, repeat, 3))
    for group_by in ("cluster", "node", "team"):
        def capacity(i, group_by=group_by):
            response = client.get("/api/v1/capacity/", {"group_by": group_by, **window})
            assert response.status_code == 200, response.content[:300]
        record(f"capacity_by_{group_by}_s", timed(meter, capacity, repeat, 1))
    today = at.date()
    page = {"group_by": "node", "start": (today - dt.timedelta(days=29)).isoformat(), "end": today.isoformat()}

    def capacity_page(i):
        response = client.get("/capacity/", page)
        assert response.status_code == 200 and b"errorlist" not in response.content, response.content[:300]
    record("capacity_page_by_node_s", timed(meter, capacity_page, repeat, 1))
    # What the capacity figures cannot read less of: the window's attempt-day rollup rows (its edge days' too),
    # read and summed per attempt by the database alone.
    from django.db import connection

    from costs.models import AttemptDailyCost

    days = [(at - dt.timedelta(days=30)).date(), at.date()]
    read = (f'SELECT attempt_id, SUM(gpu_seconds), SUM(cost_usd), SUM(unpriced_gpu_seconds) '
            f'FROM "{AttemptDailyCost._meta.db_table}" WHERE day >= %s AND day <= %s GROUP BY 1')

    def rollup_read(i):
        with connection.cursor() as cursor:
            cursor.execute(read, days)
            cursor.fetchall()
    record("capacity_rollup_read_ms", timed(meter, rollup_read, repeat, 10), 1000)
    wall["capacity_rollup_rows"] = AttemptDailyCost.objects.filter(day__gte=days[0], day__lte=days[1]).count()
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days-short", type=float, default=3.0,
                        help="days of ledger history of the shorter length (default 3)")
    parser.add_argument("--days-long", type=float, default=30.0,
                        help="days of ledger history of the longer length (default 30)")
    parser.add_argument("--attempts", type=int, default=1000,
                        help="running attempts of the fleet; fewer make a scaled-down run (default 1000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each figure, the fastest counts; 10x as many for budget status (default 3)")
    args = parser.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    require("ledger_scale", [postgres_missing(url)])
    recreate(url)
    os.environ.update(DATABASE_URL=url, CELERY_BROKER_URL="memory://", DJANGO_SETTINGS_MODULE="controlplane.settings")
    import django

    django.setup()
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    staff, acc, budgets = build_fleet(args.attempts, now)
    from django.db.models import Count, Sum

    from runners.models import NodeSpan

    inventory = NodeSpan.objects.aggregate(nodes=Count("node_name", distinct=True), gpus=Sum("gpus"))
    result = {"benchmark": "ledger_scale", "attempts": args.attempts, "teams": TEAMS, "queued": QUEUED,
              "capacity_nodes": inventory["nodes"], "capacity_gpus": inventory["gpus"],
              "full_size": args.attempts >= 1000 and args.days_long >= 30, "entries": {}, "table_mib": {}}
    per_length, cpu = {}, {}
    for name, days in (("short", args.days_short), ("long", args.days_long)):
        t = time.perf_counter()
        result["entries"][name] = load_history(int(days * 24), now)
        build_s = time.perf_counter() - t
        result["table_mib"][name] = table_mib()
        per_length[name], cpu[name] = measure(now, staff, acc, budgets, args.repeat)
        print(f"{name}: {days} days, {result['entries'][name]} entries ({result['table_mib'][name]} MiB, built in "
              f"{build_s:.1f} s): {per_length[name]}; CPU ms {cpu[name]}", file=sys.stderr, flush=True)
    for key in per_length["long"]:
        result[key] = {name: per_length[name][key] for name in per_length}
    result["cpu_ms"] = {key: {name: cpu[name][key] for name in cpu} for key in cpu["long"]}
    ratios = {k: cpu["long"][k] / cpu["short"][k] for k in GROWTH if cpu["short"][k]}
    floor = {k: round(cpu["long"][k] / cpu["short"][k], 3) for k in FLOORS if cpu["short"][k]}
    result["wall_growth_ratios"] = {k: round(per_length["long"][k] / per_length["short"][k], 3) for k in GROWTH
                                    if per_length["short"][k]}
    result["growth_ratios"] = {**{k: round(v, 3) for k, v in ratios.items()}, **floor}
    result["growth_ratio_max"] = round(max(ratios.values()), 3)
    result["goals"] = GOALS
    met = {k: per_length["long"][k] <= goal for k, goal in GOALS.items() if k != "growth_ratio_max"}
    met["growth_ratio_max"] = result["growth_ratio_max"] <= GOALS["growth_ratio_max"]
    result["goals_met"] = met
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
