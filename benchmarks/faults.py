"""Faults: the platform under a stream of submissions, cancels and log reads while its broker stops, its database
restarts and a worker is killed, on a schedule. Nothing is lost or stuck, nothing is duplicated, nobody sees a 500.

Everything runs privately, so the faults touch nothing shared: a PostgreSQL (initdb + pg_ctl from
``/usr/lib/postgresql/15/bin``, a temporary directory, a free port), a Redis (``redis-server``, a free port),
gunicorn (1 process x 8 threads), two Celery workers (2 pool processes each) and beat, all supervised as
Kubernetes would (``demo.processes.Supervisor`` restarts a process that dies). Jobs run on the local runner's
emulated GPUs: ``python -c "print(...)"``, one GPU each.

Schedule (``--seconds``, default 90, scales it): Redis stopped from 15 % to 32 % of the run, PostgreSQL
restarted (``pg_ctl restart -m fast``: every connection cut) at 50 %, the fast queue's worker (of the two, one
per queue) SIGKILLed at 70 %; then the
load stops and the run waits (at most ``--drain``, default 90 s) until no job is left QUEUED, CANCELLING or
ADMITTED. An outage window is a fault's duration plus 5 s (clients still see it).

Four client threads loop: POST a job (JSON), every third loop cancel one of their jobs, every fourth read a
job's log (``?follow=1``, a stream of at most ``LOG_FOLLOW_MAX_SECONDS``=2 s). The JSON line:
``requests``, ``server_errors_outside_outages`` (5xx answered outside every window), ``http_500_during_outages``
(500s inside a window: they should be 503s), ``http_503_during_outages``, ``connection_errors`` (no answer,
e.g. while gunicorn is busy), ``jobs_lost`` (a 201's job missing, or a 2xx cancel whose job did not end
CANCELLED or CANCELLING), ``jobs_stuck`` (jobs left QUEUED / ADMITTED / CANCELLING after the drain),
``duplicated_objects`` (more than one live attempt of a job, two attempts of one number, two jobs of one
client name), ``recovery_seconds`` per fault (from the fault's end to the first 2xx of a request sent after it;
for the killed worker, to the first job admitted after it) and their ``recovery_seconds_max``;
``cpu_ms_per_request`` of gunicorn and the workers together (the killed worker's first life excluded); ``faultfree_over_outage_rate``
(answered requests per second outside over inside the windows, same run).

Run: ``.venv/bin/python benchmarks/faults.py`` (about 3 minutes on 2 cores). Needs ``redis-server`` and
PostgreSQL 15's binaries; a missing one ends with status 3 and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.procstat import machine, tree_cpu_seconds  # noqa: E402
from benchmarks.services import commands_missing, require  # noqa: E402
from benchmarks.submit import NO_SUBMIT_LIMITS  # noqa: E402

SEED = """
from django.contrib.auth import get_user_model
from django.core.management import call_command
from quotas.models import ApiToken, Budget, Membership, Quota, Team
from runners.local.capacity import ensure_local_cluster
call_command("seed_catalog", verbosity=0)
cluster = ensure_local_cluster()
accelerator = cluster.node_pools.get(name="gpu").accelerator
team = Team.objects.create(slug="faults", name="faults")
user = get_user_model().objects.create(username="faults")
Membership.objects.create(team=team, user=user, role="admin")
Quota.objects.create(team=team, accelerator=accelerator, nominal_gpus=16)
Budget.objects.create(team=team, amount_usd="1000000", action="block")
print("TOKEN", ApiToken.issue(user, "faults")[1], accelerator.name)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="length of the loaded run with its faults")
    parser.add_argument("--drain", type=float, default=90.0, help="longest wait for the queue to drain after it")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    require("faults", commands_missing({"redis-server": "redis-server"})
            + ([] if Path("/usr/lib/postgresql/15/bin/pg_ctl").exists()
               else ["/usr/lib/postgresql/15/bin/pg_ctl (Debian: apt-get install postgresql-15)"]))

    import psycopg
    import requests

    from demo.processes import Supervisor, wait_for_port
    from tests.support.net import free_port
    from tests.support.postgres import private_postgres
    from tests.support.redis import PrivateRedis

    work = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    redis_server = PrivateRedis()
    redis_server.start()
    out = open(work / "supervisor.log", "w")
    supervisor = None
    try:
        with private_postgres(max_connections=100) as pg:
            with pg.connect() as conn:
                conn.execute("CREATE DATABASE controlplane")
            db_url = f"postgres://postgres@127.0.0.1:{pg.port}/controlplane"
            port = free_port()
            env = {**os.environ, "DATABASE_URL": db_url, "CELERY_BROKER_URL": redis_server.url, **NO_SUBMIT_LIMITS,
                   "CONTROLPLANE_VAR_DIR": str(work / "var"), "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                   "SCHEDULE_INTERVAL_SECONDS": "2", "RECONCILE_INTERVAL_SECONDS": "1", "ACCRUAL_INTERVAL_SECONDS": "10",
                   "OUTBOX_SWEEP_INTERVAL_SECONDS": "2", "LOG_FOLLOW_MAX_SECONDS": "2", "LOG_FOLLOW_POLL_SECONDS": "0.5",
                   "LOCAL_METRICS_PORT": str(free_port()), "CONN_MAX_AGE": "60"}
            py = sys.executable
            subprocess.run([py, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
            seeded = subprocess.run([py, "manage.py", "shell", "-v", "0", "-c", SEED], cwd=ROOT, env=env, check=True,
                                    capture_output=True, text=True).stdout
            _, token, accelerator = next(line for line in seeded.splitlines() if line.startswith("TOKEN")).split()

            supervisor = Supervisor(ROOT, work / "logs", out, max_restarts=50)
            celery = [py, "-m", "celery", "-A", "controlplane"]
            web = supervisor.start("web", [py, "-m", "gunicorn", "controlplane.wsgi:application", f"--bind=127.0.0.1:{port}",
                                           "--worker-class=gthread", "--workers=1", "--threads=8", "--timeout=60"],
                                   env=env)
            # One worker per queue, as deployed (settings.CELERY_TASK_ROUTES): the fast one dispatches, the slow
            # one accrues; the faults kill either.
            # workers[0], the fast queue's, is the one killed.
            workers = [supervisor.start(f"worker-{queue}", celery + [
                "worker", "--concurrency=2", "-Q", queue, "--without-gossip", "--without-mingle", "--loglevel=WARNING",
                f"--hostname=faults-{queue}@%h"], env=env) for queue in ("fast", "slow")]
            supervisor.start("beat", celery + ["beat", "--loglevel=WARNING", "--pidfile", str(work / "beat.pid")], env=env)
            supervisor.watch(interval=0.5)
            assert wait_for_port(port, 60), "gunicorn did not start"
            base = f"http://127.0.0.1:{port}/api/v1"
            headers = {"Authorization": f"Token {token}"}

            log: list[tuple[float, str, int | None]] = []  # (sent at, kind, status or None)
            accepted: dict[str, int] = {}
            cancelled_ok: set[int] = set()
            lock = threading.Lock()
            stop = threading.Event()
            t0 = time.monotonic()

            def client(index: int) -> None:
                rng = random.Random(index)
                session = requests.Session()
                mine: list[int] = []
                n = 0
                while not stop.is_set():
                    n += 1
                    name = f"c{index}-{n}"
                    doc = {"team": "faults", "name": name, "kind": "training",
                           "spec": {"image": "python:3.11", "command": ["python", "-c", f"print('{name}')"],
                                    "resources": {"accelerator": accelerator, "gpus_per_node": 1, "nodes": 1},
                                    "max_runtime_seconds": 600}}
                    calls = [("submit", "post", f"{base}/jobs/", {"json": doc})]
                    if mine and n % 3 == 0:
                        calls.append(("cancel", "post", f"{base}/jobs/{rng.choice(mine)}/cancel/", {}))
                    if mine and n % 4 == 0:
                        calls.append(("logs", "get", f"{base}/jobs/{rng.choice(mine)}/logs/?follow=1", {}))
                    for kind, method, url, kw in calls:
                        sent = time.monotonic() - t0
                        try:
                            r = getattr(session, method)(url, headers=headers, timeout=15, **kw)
                            if kind == "logs":
                                _ = r.content
                            status = r.status_code
                        except requests.RequestException:
                            status = None
                        with lock:
                            log.append((sent, kind, status))
                            if kind == "submit" and status == 201:
                                accepted[name] = r.json()["id"]
                                mine.append(accepted[name])
                            if kind == "cancel" and status is not None and 200 <= status < 300:
                                cancelled_ok.add(int(url.rstrip("/").split("/")[-2]))
                    time.sleep(1.0)  # about 4 submissions/s in all: what 16 emulated GPUs can run and drain

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            for t in threads:
                t.start()
            s = args.seconds
            windows: dict[str, list[float]] = {}

            def at(fraction: float) -> None:
                time.sleep(max(0.0, t0 + fraction * s - time.monotonic()))

            at(0.15)
            windows["redis_stop"] = [time.monotonic() - t0]
            redis_server.stop()
            at(0.32)
            redis_server.start()
            windows["redis_stop"].append(time.monotonic() - t0)
            at(0.50)
            windows["postgres_restart"] = [time.monotonic() - t0]
            pg.restart()
            windows["postgres_restart"].append(time.monotonic() - t0)
            at(0.70)
            windows["worker_kill"] = [time.monotonic() - t0]
            os.killpg(workers[0].process.pid, signal.SIGKILL)
            windows["worker_kill"].append(time.monotonic() - t0)
            at(1.0)
            stop.set()
            for t in threads:
                t.join(timeout=60)
            load_end = time.monotonic() - t0

            dsn = db_url.replace("postgres://", "postgresql://")
            drain_deadline = time.monotonic() + args.drain
            while time.monotonic() < drain_deadline:
                with psycopg.connect(dsn) as conn:
                    (left,) = conn.execute("SELECT count(*) FROM jobs_job WHERE state IN "
                                           "('QUEUED', 'ADMITTED', 'CANCELLING')").fetchone()
                if left == 0:
                    break
                time.sleep(1)
            drained = time.monotonic() - t0
            with psycopg.connect(dsn) as conn:
                rows = conn.execute("SELECT id, name, state FROM jobs_job").fetchall()
                (double_live,) = conn.execute(
                    "SELECT count(*) FROM (SELECT job_id FROM jobs_jobattempt WHERE ended_at IS NULL "
                    "GROUP BY job_id HAVING count(*) > 1) x").fetchone()
                (double_number,) = conn.execute(
                    "SELECT count(*) FROM (SELECT job_id, number FROM jobs_jobattempt "
                    "GROUP BY job_id, number HAVING count(*) > 1) x").fetchone()
                admitted_at = [r[0] for r in conn.execute(
                    "SELECT created_at FROM jobs_jobevent WHERE to_state = 'ADMITTED' ORDER BY created_at")]
                (started_at,) = conn.execute("SELECT min(created_at) FROM jobs_jobevent").fetchone()
            web_cpu = tree_cpu_seconds(web.process.pid)
            workers_cpu = sum(tree_cpu_seconds(w.process.pid) for w in workers)
            supervisor.stop()  # before its database goes
    finally:
        if supervisor is not None:
            supervisor.stop()
        redis_server.close()
        out.close()

    by_id = {r[0]: r for r in rows}
    names = [r[1] for r in rows]
    lost = sum(1 for job_id in accepted.values() if job_id not in by_id)
    lost += sum(1 for job_id in cancelled_ok if by_id.get(job_id, (0, "", ""))[2] not in ("CANCELLED", "CANCELLING"))
    stuck = sum(1 for r in rows if r[2] in ("QUEUED", "ADMITTED", "CANCELLING"))
    duplicated = double_live + double_number + (len(names) - len(set(names)))
    grace = 5.0
    spans = [(w[0], w[1] + grace) for w in windows.values() if len(w) == 2 and w is not windows["worker_kill"]]

    def inside(t: float) -> bool:
        return any(a <= t <= b for a, b in spans)

    outside = [(round(t, 1), kind, st) for t, kind, st in log if st is not None and st >= 500 and not inside(t)]
    outside_5xx = len(outside)
    in_500 = sum(1 for t, _, st in log if st == 500 and inside(t))
    in_503 = sum(1 for t, _, st in log if st == 503 and inside(t))
    recovery = {}
    for fault in ("redis_stop", "postgres_restart"):
        end = windows[fault][1]
        firsts = [t for t, _, st in log if t >= end and st is not None and 200 <= st < 300]
        recovery[fault] = round(min(firsts) - end, 2) if firsts else None
    # the killed worker: from its kill to the first admission after it (wall clock of the database events)
    kill_wall = (started_at.timestamp() + windows["worker_kill"][1]) if started_at else None
    after = [a.timestamp() for a in admitted_at if kill_wall is not None and a.timestamp() >= kill_wall]
    recovery["worker_kill"] = round(min(after) - kill_wall, 2) if after else None
    inside_time = sum(b - a for a, b in spans)
    answered_in = sum(1 for t, _, st in log if st is not None and inside(t))
    answered_out = sum(1 for t, _, st in log if st is not None and not inside(t))
    rate_in = answered_in / inside_time if inside_time else None
    rate_out = answered_out / max(load_end - inside_time, 1e-9)
    with_recovery = [v for v in recovery.values() if v is not None]
    result = {
        "benchmark": "faults",
        "requests": len(log),
        "by_kind": {k: sum(1 for _, kind, _ in log if kind == k) for k in ("submit", "cancel", "logs")},
        "server_errors_outside_outages": outside_5xx,
        "server_errors_outside_first": outside[:10],  # (seconds into the run, request kind, status)
        "http_500_during_outages": in_500,
        "http_503_during_outages": in_503,
        "connection_errors": sum(1 for _, _, st in log if st is None),
        "jobs_submitted": len(accepted),
        "jobs_lost": lost,
        "jobs_stuck": stuck,
        "duplicated_objects": duplicated,
        "recovery_seconds": recovery,
        "recovery_seconds_max": max(with_recovery) if with_recovery else None,
        "recovery_unmeasured": [k for k, v in recovery.items() if v is None],
        "drain_seconds_after_load": round(drained - load_end, 1),
        "outage_windows_s": {k: [round(x, 1) for x in v] for k, v in windows.items()},
        "cpu_ms_per_request": round((web_cpu + workers_cpu) * 1000 / max(len(log), 1), 2),
        "faultfree_over_outage_rate": round(rate_out / rate_in, 2) if rate_in else None,
        "seconds": round(drained, 1),
        **machine(),
    }
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
