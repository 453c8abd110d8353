"""Submission throughput: POST /api/v1/jobs/ with admission on, against a bare create of the same row and Slurm.

Run: ``.venv/bin/python benchmarks/submit.py`` (PostgreSQL at
``BENCH_DATABASE_URL``, default ``postgres://postgres@127.0.0.1:5432/controlplane_bench``,
recreated on each run; Redis at ``BENCH_BROKER_URL``, default
``redis://127.0.0.1:6379/13``; Slurm's ``slurm-wlm`` and ``munge`` packages
for the peer phase). It starts gunicorn (gthread workers, keep-alive), one
Celery worker that runs the scheduling passes the submissions enqueue, and
its own Slurm (``benchmarks/slurm.py``), then drives 16 concurrent clients
over loopback for ``--seconds`` per phase:

- ``admission``: the real endpoint (spec validation, job + event rows,
  scheduling pass enqueued on commit and run by the worker);
- ``bare``: an endpoint of this benchmark's own URLconf that authenticates
  the same token and inserts the same Job row, nothing else;
- ``validated``: the real submission without admission (same validation,
  job and event rows, no scheduling pass);
- ``floor``: the stack's floor: a plain Django view behind the same
  middleware that reads the body and answers 201, with no database,
  authentication or serializer (what any submission served by gunicorn and
  Django costs at least; ``ratio_floor_vs_slurm_cpu_per_job`` compares it with
  slurmctld's CPU per job);
- ``slurm``: the peer: each client runs ``sbatch --hold --wrap true`` one
  after another (a process per job, as a Slurm user submits), answered by
  the private slurmctld.

- ``array`` (``--phases array``; not among the default phases): a job
  array of ``--array-count`` elements (default 1,000) in one request,
  ``POST /api/v1/arrays/`` with ``array: {count, parallelism}``
  (``--array-parallelism``, default the count), against its peer, one
  ``sbatch --hold --array=0-999``: ``--array-rounds`` rounds (default 3) of
  the platform's array and of its floor (the same array at parallelism 1:
  one element row, the request's and the pass's fixed cost), and
  ``--array-slurm-rounds`` of Slurm's (default 30: slurmctld records a held
  array in about one 10 ms clock tick), in rotating order. The platform's window: from before
  the request is sent until the scheduling pass that the submission
  published has ended (its end time, ``controlplane:schedule-last-pass``,
  after the 201; the passes' queue empty) and a further second has passed:
  validation of the template once, the array row and its first
  ``min(parallelism, ARRAY_QUEUED_WINDOW)`` element rows with their events
  in one transaction, the 201, and the first pass (it tops the array up
  within its window and decides its queued elements; the quota is full
  from an unmeasured warm-up array, whose admitted elements are then
  marked RUNNING so that their dispatch to the benchmark's unreachable
  cluster stops retrying; that pass admits none, the same in every
  round). Slurm's window: from before ``sbatch`` starts until a
  second after it exits: its authentication by munged, slurmctld recording
  the held array as one job record; no element is split off or started.
  Neither window runs an element. Results: CPU milliseconds per element of
  each process (``array.platform_cpu_ms_per_element`` with its parts,
  ``array.slurm_cpu_ms_per_element``: slurmctld, munged apart) and
  ``array.ratio_vs_slurm_cpu_per_element`` (the platform's processes
  together over slurmctld's; ``array.floor_parallelism_1`` the same for
  the floor array). Admission of every element is not measured:
  the benchmark's cluster and quota (16 GPUs) admit 16 one-GPU elements at
  a time, and the rest wait for them to run, which this benchmark does not.

The phases run in rotating order each round, each one with both queues
emptied first (the platform's QUEUED jobs cancelled, Slurm's jobs
scancelled). When Slurm's commands are missing the peer phase is left out:
the ``slurm`` keys are null, ``slurm_missing`` says what to install, and the
run still succeeds (``--no-slurm`` leaves it out on purpose). A missing
PostgreSQL or Redis ends the run with status 3 and says so.

Ends with one JSON line: per phase jobs/s, p50/p99 latency (ms), CPU
milliseconds per job of each server process (gunicorn, the Celery worker,
PostgreSQL's backends of the benchmark's database, the Redis server;
for Slurm: slurmctld, slurmd, munged) and, apart, of the clients (this
process, and for Slurm its sbatch children); the overhead of admission over
the bare and the validated create, and the ratios against Slurm measured in
the same run: ``ratio_vs_slurm_jobs_per_s`` (admission's jobs/s over
Slurm's; goal >= 1) and ``ratio_vs_slurm_cpu_per_job`` (admission's CPU per
job, all its server processes and the database included, over
slurmctld's; goal <= 1). Goals: >= 500 jobs/s, overhead < 25 %.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import slurm as slurm_peer  # noqa: E402
from benchmarks.procstat import (  # noqa: E402
    DatabaseBackends,
    client_cpu_seconds,
    machine,
    named_cpu_seconds,
    tree_cpu_seconds,
    used_since,
)
from benchmarks.services import postgres_missing, redis_missing, require  # noqa: E402

JOB = {
    "team": "bench", "name": "bench-job", "kind": "training",
    "spec": {
        "image": "python:3.11", "command": ["python", "train.py"], "args": ["--steps", "10"],
        "env": {"SEED": "1"},
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1},
        "max_runtime_seconds": 600,
    },
}


#: Submission rate limits off: the throughput benchmarks submit hundreds of jobs a second as one user and team
#: (benchmarks/bad_input.py runs with the limits on).
NO_SUBMIT_LIMITS = {"THROTTLE_SUBMIT_USER": "off", "THROTTLE_SUBMIT_TEAM": "off"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(env: dict) -> str:
    """Recreate the benchmark database, migrate, seed a team, quota, cluster and token; returns the token key."""
    url = env["DATABASE_URL"]
    dbname = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    import psycopg

    with psycopg.connect(admin_url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    seed = (
        "from decimal import Decimal\n"
        "from django.contrib.auth import get_user_model\n"
        "from costs.seed import seed_accelerators, seed_prices\n"
        "from quotas.models import ApiToken, Membership, Quota, Team\n"
        "from runners.models import Accelerator, Cluster, NodePool\n"
        "seed_accelerators(); seed_prices()\n"
        "h100 = Accelerator.objects.get(name='H100-80GB')\n"
        "c = Cluster.objects.create(name='bench-aws', provider='aws', region='us-east-1', backend='kubernetes')\n"
        "NodePool.objects.create(cluster=c, name='h100', accelerator=h100, nodes=4, gpus_per_node=8)\n"
        "t = Team.objects.create(slug='bench', name='Bench')\n"
        "u = get_user_model().objects.create_user('bench')\n"
        "Membership.objects.create(team=t, user=u, role='member')\n"
        "Quota.objects.create(team=t, accelerator=h100, nominal_gpus=16)\n"
        "print(ApiToken.issue(u, 'bench')[1])\n"
    )
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", seed], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def client(port: int, path: str, token: str, body: bytes, stop_at: float, latencies: list, errors: list) -> None:
    """One keep-alive HTTP client posting ``body`` until ``stop_at`` (monotonic seconds)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            ok = resp.status == 201
        except (OSError, http.client.HTTPException):
            ok = False
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        if ok:
            latencies.append(time.perf_counter() - t0)
        else:
            errors.append(1)
    conn.close()


class Servers:
    """CPU seconds of the servers the platform's phases use: PostgreSQL (the backends of the benchmark's
    database, or the whole server where its processes are not on this machine) and the Redis server."""

    def __init__(self, database_url: str):
        admin_url, dbname = database_url.rsplit("/", 1)
        self.backends = DatabaseBackends(admin_url + "/postgres", dbname)
        self.postgres_of = "database backends" if self.backends.snapshot() is not None else "whole server"

    def snapshot(self) -> dict:
        own = self.backends.snapshot() if self.postgres_of == "database backends" else None
        names = ("redis-server",) if own is not None else ("postgres", "redis-server")
        return {"postgres": own, **named_cpu_seconds(names)}

    @staticmethod
    def used(before: dict, after: dict) -> dict[str, float]:
        used = {"redis-server": after["redis-server"] - before["redis-server"]}
        if isinstance(after["postgres"], dict):
            used["postgres"] = used_since(before["postgres"], after["postgres"])
        else:
            used["postgres"] = after["postgres"] - before["postgres"]
        return used

    def close(self) -> None:
        self.backends.close()


def phase(port: int, path: str, token: str, clients: int, seconds: float, procs: dict | None = None,
          name: str = "bench-job", servers: Servers | None = None) -> dict:
    """Run ``clients`` concurrent clients posting a job named ``name`` for ``seconds``; the raw samples:
    latencies (s), errors, elapsed seconds, the CPU seconds of each process tree of ``procs`` (name ->
    Popen) and of ``servers``, and of the clients (this process's threads); ``summarize`` turns them into
    the results.
    """
    latencies: list[float] = []
    errors: list[int] = []
    body = json.dumps({**JOB, "name": name}).encode()
    procs = procs or {}
    cpu_before = {key: tree_cpu_seconds(p.pid) for key, p in procs.items()}
    servers_before = servers.snapshot() if servers else None
    stop_at = time.monotonic() + seconds
    threads = [threading.Thread(target=client, args=(port, path, token, body, stop_at, latencies, errors))
               for _ in range(clients)]
    client_before = client_cpu_seconds()
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    client_used = client_cpu_seconds() - client_before
    if "scheduler" in procs:
        time.sleep(1.0)  # let the scheduling passes this phase published finish: their CPU is this phase's
    cpu = {key: tree_cpu_seconds(p.pid) - cpu_before[key] for key, p in procs.items()}
    if servers:
        cpu.update(servers.used(servers_before, servers.snapshot()))
    return {"latencies": latencies, "errors": len(errors), "elapsed": elapsed, "cpu": cpu, "client_cpu": client_used}


def summarize(samples: list[dict]) -> dict:
    """One phase's results over its rounds: jobs, jobs/s, latency percentiles (ms), CPU milliseconds per
    accepted job of each measured server process (``cpu_ms_per_job``, summed in ``cpu_ms_per_job_total``) and
    of the clients (``client_cpu_ms_per_job``, apart: the load generator, not the system under test).

    CPU per job depends less on what else the machine runs than jobs/s does on a shared 2-core machine.
    """
    lat = sorted(x for s in samples for x in s["latencies"])
    jobs, elapsed = len(lat), sum(s["elapsed"] for s in samples)
    cpu = {key: round(sum(s["cpu"][key] for s in samples) * 1000 / max(1, jobs), 3) for key in samples[0]["cpu"]}
    pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2) if lat else None  # noqa: E731
    return {"jobs": jobs, "errors": sum(s["errors"] for s in samples), "jobs_per_s": round(jobs / elapsed, 1),
            "p50_ms": pick(0.50), "p99_ms": pick(0.99), "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
            "cpu_ms_per_job": cpu, "cpu_ms_per_job_total": round(sum(cpu.values()), 3),
            "client_cpu_ms_per_job": round(sum(s["client_cpu"] for s in samples) * 1000 / max(1, jobs), 3)}


def cancel_waiting(database_url: str) -> None:
    """Cancel every QUEUED job and every open array (between phases, unmeasured): each phase starts with an empty
    queue, the validated phase's rows, which no pass was published for, never reach a later admission phase's
    passes, and no pass tops up an earlier round's array."""
    import psycopg

    with psycopg.connect(database_url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute("UPDATE jobs_jobarray SET state = 'cancelled' WHERE state = 'open'")
        conn.execute("UPDATE jobs_job SET state = 'CANCELLED' WHERE state = 'QUEUED'")


def mark_admitted_running(database_url: str) -> int:
    """Move every ADMITTED job to RUNNING (the array phase, after its warm-up, unmeasured); returns how many.

    The benchmark's cluster is not reachable, so each admitted job's dispatch fails and retries with backoff for
    minutes inside the measured windows; a dispatch finds a job no longer ADMITTED and skips it. RUNNING jobs still
    hold the team's quota, so each measured pass admits nothing, as the phase intends."""
    import psycopg

    with psycopg.connect(database_url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        return conn.execute("UPDATE jobs_job SET state = 'RUNNING' WHERE state = 'ADMITTED'").rowcount


def wait_pass_after(broker_url: str, since: float, timeout: float = 120) -> None:
    """Wait until a scheduling pass ended after ``since`` (Unix seconds; the pass records its end time under
    ``controlplane:schedule-last-pass``) and no further pass is queued or flagged: the first pass over what was
    committed before ``since`` has run. Raises RuntimeError after ``timeout`` seconds."""
    import redis

    client = redis.Redis.from_url(broker_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = client.get("controlplane:schedule-last-pass")
        ended = float(last.split()[0]) if last else 0.0
        if ended > since and client.llen("fast") == 0 and not client.exists("controlplane:schedule-pending"):
            return
        time.sleep(0.05)
    raise RuntimeError("no scheduling pass ran after the array's submission")


def array_phase(port: int, token: str, count: int, parallelism: int, procs: dict, servers: Servers,
                broker_url: str, settle: float = 1.0) -> dict:
    """One array of ``count`` elements submitted in one request (``POST /api/v1/arrays/``); the raw sample in the
    shape of ``SlurmPeer.array_phase``: ``elements`` (``count`` when answered 201, else 0), ``errors``, ``elapsed``
    (s, the request), the CPU seconds of each process tree of ``procs`` and of ``servers`` from before the request
    until the first scheduling pass after it has ended (``wait_pass_after``) and ``settle`` seconds more, and of
    the client (this process: the request and the polling of Redis).
    """
    body = json.dumps({**JOB, "name": "bench-array", "array": {"count": count, "parallelism": parallelism}}).encode()
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    cpu_before = {key: tree_cpu_seconds(p.pid) for key, p in procs.items()}
    servers_before = servers.snapshot()
    client_before = client_cpu_seconds()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.monotonic()
    conn.request("POST", "/api/v1/arrays/", body=body, headers=headers)
    resp = conn.getresponse()
    answer = resp.read()
    elapsed = time.monotonic() - t0
    conn.close()
    ok = resp.status == 201
    if ok and "scheduler" in procs:
        wait_pass_after(broker_url, time.time())
    time.sleep(settle)
    cpu = {key: tree_cpu_seconds(p.pid) - cpu_before[key] for key, p in procs.items()}
    cpu.update(servers.used(servers_before, servers.snapshot()))
    return {"elements": count if ok else 0, "errors": 0 if ok else 1,
            "error_sample": [] if ok else [f"{resp.status} {answer[:300].decode(errors='replace')}"],
            "elapsed": elapsed, "cpu": cpu, "client_cpu": client_cpu_seconds() - client_before}


def summarize_array(samples: list[dict]) -> dict | None:
    """One side's array results over its rounds (``array_phase`` samples): elements accepted, errors, CPU
    milliseconds per element of each measured process (``cpu_ms_per_element``, summed in
    ``cpu_ms_per_element_total``), of the client apart, and the submission's wall time (ms, mean of the rounds).
    None without samples."""
    if not samples:
        return None
    elements = sum(s["elements"] for s in samples)
    cpu = {key: round(sum(s["cpu"][key] for s in samples) * 1000 / max(1, elements), 4) for key in samples[0]["cpu"]}
    return {"elements": elements, "errors": sum(s["errors"] for s in samples),
            "error_sample": next((e for s in samples for e in s["error_sample"]), None),
            "cpu_ms_per_element": cpu, "cpu_ms_per_element_total": round(sum(cpu.values()), 4),
            "client_cpu_ms_per_element": round(sum(s["client_cpu"] for s in samples) * 1000 / max(1, elements), 4),
            "submit_ms": round(statistics.fmean(s["elapsed"] for s in samples) * 1000, 1)}


def array_versus_slurm(platform: dict | None, slurm: dict | None) -> dict:
    """The ``array`` result keys: the platform's CPU ms per element (its processes together, and each part: the API
    server, the scheduler's worker, PostgreSQL's backends, Redis), Slurm's (slurmctld; munged and slurmd apart) and
    ``ratio_vs_slurm_cpu_per_element``: the platform's total over slurmctld's (<= 1: the platform uses less);
    ``ratio_vs_slurm_cpu_per_element_with_munged`` over slurmctld and munged together. Ratios are None where a
    side is missing or Slurm's figure is 0."""
    p_total = platform["cpu_ms_per_element_total"] if platform else None
    s_cpu = slurm["cpu_ms_per_element"] if slurm else None
    return {
        "platform_cpu_ms_per_element": p_total,
        "platform_cpu_ms_per_element_parts": platform["cpu_ms_per_element"] if platform else None,
        "slurm_cpu_ms_per_element": s_cpu["slurmctld"] if s_cpu else None,
        "slurm_munged_cpu_ms_per_element": s_cpu["munged"] if s_cpu else None,
        "slurm_slurmd_cpu_ms_per_element": s_cpu["slurmd"] if s_cpu else None,
        "ratio_vs_slurm_cpu_per_element": ratio(p_total, s_cpu["slurmctld"]) if s_cpu else None,
        "ratio_vs_slurm_cpu_per_element_with_munged": (ratio(p_total, s_cpu["slurmctld"] + s_cpu["munged"])
                                                       if s_cpu else None),
    }


def wait_worker_ready(broker_url: str, timeout: float = 180) -> None:
    """Wait until the Celery worker consumes: the warm-up's scheduling pass left the queue and started.

    A worker spends several CPU seconds starting (imports, the Kubernetes client's warm-up); measured
    phases must not pay for that.
    """
    import redis

    client = redis.Redis.from_url(broker_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.llen("fast") == 0 and not client.exists("controlplane:schedule-pending"):  # the passes' queue
            time.sleep(2.0)  # the pass itself, and the worker settling
            return
        time.sleep(0.2)
    raise RuntimeError("the Celery worker did not start consuming")


def cpu_overhead(bare: dict, admission: dict) -> float | None:
    """Extra CPU per job of ``admission`` over ``bare`` (a baseline phase), in percent: all measured processes together."""
    b, a = sum(bare["cpu_ms_per_job"].values()), sum(admission["cpu_ms_per_job"].values())
    return round((a / b - 1) * 100, 1) if b else None


def wait_up(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not start")


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def versus_slurm(admission: dict, slurm: dict | None) -> dict:
    """The platform's admission phase against Slurm's from the same run: jobs/s (>= 1: the platform is faster),
    server CPU per job with the database against slurmctld's (<= 1: the platform uses less), the same against
    slurmctld and munged together (Slurm's authentication daemon, which every sbatch asks twice), and the
    clients' CPU per job."""
    if slurm is None:
        return {"ratio_vs_slurm_jobs_per_s": None, "ratio_vs_slurm_cpu_per_job": None,
                "ratio_vs_slurm_cpu_per_job_with_munged": None, "ratio_vs_slurm_client_cpu_per_job": None}
    s_cpu = slurm["cpu_ms_per_job"]
    return {
        "ratio_vs_slurm_jobs_per_s": ratio(admission["jobs_per_s"], slurm["jobs_per_s"]),
        "ratio_vs_slurm_cpu_per_job": ratio(admission["cpu_ms_per_job_total"], s_cpu["slurmctld"]),
        "ratio_vs_slurm_cpu_per_job_with_munged": ratio(admission["cpu_ms_per_job_total"],
                                                        s_cpu["slurmctld"] + s_cpu["munged"]),
        "ratio_vs_slurm_client_cpu_per_job": ratio(admission["client_cpu_ms_per_job"], slurm["client_cpu_ms_per_job"]),
    }


#: The job phases (``--phases``' default, with Slurm's single submissions) and every phase.
DEFAULT_PHASES = ("bare", "admission", "validated", "floor", "slurm")
ALL_PHASES = (*DEFAULT_PHASES, "array")


def run_arrays(args, parallelism: int, port: int, token: str, procs: dict, servers: Servers, slurm, env: dict,
               out: dict[str, list[dict]]) -> None:
    """The array phase: an unmeasured warm-up array (it fills the team's quota, so every measured round's first
    pass admits nothing and decides the same queue), then rounds of: the platform's array (``parallelism``), the
    platform's floor array (parallelism 1: one element row made, the request's and the pass's fixed cost) for
    ``args.array_rounds`` rounds, and Slurm's array for ``args.array_slurm_rounds`` rounds (more by default: one
    held array costs slurmctld about one 10 ms clock tick, so its figure needs many rounds to read); the sides'
    order rotates each round, each side starts from empty queues. Samples appended to ``out["platform"]``,
    ``out["platform_floor"]`` and ``out["slurm"]``."""
    broker = env["CELERY_BROKER_URL"]

    def idle(platform_ran: bool) -> None:
        if "scheduler" in procs and platform_ran:
            wait_worker_ready(broker)
        cancel_waiting(env["DATABASE_URL"])
        if slurm:
            slurm.cancel_all()

    idle(True)
    array_phase(port, token, args.array_count, parallelism, procs, servers, broker)  # warm-up
    mark_admitted_running(env["DATABASE_URL"])
    if slurm:
        slurm.array_phase(args.array_count, settle=0)
    ran = True
    for round_number in range(max(args.array_rounds, args.array_slurm_rounds if slurm else 0)):
        sides = [*(["platform", "platform_floor"] if round_number < args.array_rounds else []),
                 *(["slurm"] if slurm and round_number < args.array_slurm_rounds else [])]
        shift = round_number % len(sides)
        for side in sides[shift:] + sides[:shift]:
            idle(ran)
            ran = side != "slurm"
            if side == "slurm":
                out[side].append(slurm.array_phase(args.array_count))
            else:
                out[side].append(array_phase(port, token, args.array_count,
                                             parallelism if side == "platform" else 1, procs, servers, broker))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="duration of each phase (default 10)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the phases in rotating order, results summed over them (default 3)")
    parser.add_argument("--clients", type=int, default=16,
                        help="concurrent clients of each phase, the Slurm peer's included (default 16)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn worker (default 8)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="run no Celery worker (submissions are only enqueued), to isolate the API's own cost")
    parser.add_argument("--no-slurm", action="store_true", help="leave out the Slurm peer phase")
    parser.add_argument("--phases", default=",".join(DEFAULT_PHASES),
                        help=f"comma-separated phases to run, of {', '.join(ALL_PHASES)} (default "
                             f"{','.join(DEFAULT_PHASES)}; array: the platform's array and sbatch --array)")
    parser.add_argument("--array-rounds", type=int, default=3,
                        help="rounds of the platform's array and of its floor array (default 3)")
    parser.add_argument("--array-slurm-rounds", type=int, default=30,
                        help="Slurm's arrays (default 30: one costs slurmctld about one 10 ms clock tick)")
    parser.add_argument("--array-count", type=int, default=1000, help="elements of each array (default 1000)")
    parser.add_argument("--array-parallelism", type=int, default=None,
                        help="the platform's array parallelism (default: the count, as sbatch --array without %%)")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(ALL_PHASES))
    if unknown or not phases:
        parser.error(f"--phases: unknown phase(s) {', '.join(unknown) or '(none given)'}; the phases are "
                     f"{', '.join(ALL_PHASES)}")
    job_phases = {"bare", "admission", "validated", "floor"}
    if job_phases & set(phases) and not job_phases <= set(phases):
        parser.error("--phases: the job phases bare, admission, validated and floor run together, or none of them")
    if args.array_count < 1 or args.array_rounds < 1 or args.array_slurm_rounds < 1 or (args.array_parallelism is not None
                                                        and args.array_parallelism < 1):
        parser.error("--array-count, --array-rounds and --array-parallelism must be at least 1")
    array_parallelism = args.array_parallelism or args.array_count

    env = dict(os.environ)
    env["DATABASE_URL"] = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane_bench")
    env["CELERY_BROKER_URL"] = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
    env["ROOT_URLCONF"] = "benchmarks.bench_urls"
    env["LOG_LEVEL"] = "WARNING"
    env.update(NO_SUBMIT_LIMITS)
    env["CONN_MAX_AGE"] = "3600"  # a backend that exits takes its CPU time with it (see procstat.DatabaseBackends)
    require("submit", [postgres_missing(env["DATABASE_URL"]), redis_missing(env["CELERY_BROKER_URL"])])
    wants_slurm = "slurm" in phases or "array" in phases
    slurm_missing = ("left out (--no-slurm)" if args.no_slurm else None if wants_slurm else "left out (--phases)")
    slurm_missing = slurm_missing or slurm_peer.missing()
    if slurm_missing and not args.no_slurm and wants_slurm:
        print(f"submit: Slurm peer phase left out: {slurm_missing}", file=sys.stderr)
    # SIGTERM unwinds like Ctrl-C, so every process started below is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    token = prepare(env)
    port = free_port()
    procs: dict[str, subprocess.Popen] = {}
    servers = slurm = None
    samples: dict[str, list[dict]] = {"bare": [], "admission": [], "validated": [], "floor": [], "slurm": []}
    array_samples: dict[str, list[dict]] = {"platform": [], "platform_floor": [], "slurm": []}
    try:
        procs["api"] = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "controlplane.wsgi", "-b", f"127.0.0.1:{port}", "-k", "gthread",
             "-w", str(args.workers), "--threads", str(args.threads), "--keep-alive", "30", "--log-level", "warning"],
            cwd=ROOT, env=env)
        if not args.no_scheduler:
            procs["scheduler"] = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-Q", "fast", "-c", "1",
                 "--loglevel=WARNING", "--without-gossip", "--without-mingle"], cwd=ROOT, env=env)
        if not slurm_missing:
            try:
                slurm = slurm_peer.SlurmPeer(array_count=args.array_count).__enter__()  # stopped in the finally
            except RuntimeError as exc:  # it stopped what it had started
                print(f"submit: Slurm peer phase left out: {exc}", file=sys.stderr)
                slurm_missing = f"did not start: {str(exc).splitlines()[0]}"
        servers = Servers(env["DATABASE_URL"])
        wait_up(port)
        phase(port, "/api/v1/jobs/", token, 2, 1.0)  # warm-up: imports, connections
        phase(port, "/bench/bare-jobs/", token, 2, 1.0)
        phase(port, "/bench/floor/", token, 2, 1.0)
        phase(port, "/bench/validated-jobs/", token, 2, 1.0)
        if slurm:
            slurm.phase(2, 1.0, settle=0)
        paths = {"bare": ("/bench/bare-jobs/", "bench-job"), "admission": ("/api/v1/jobs/", "bench-job"),
                 "validated": ("/bench/validated-jobs/", "bench-validated"), "floor": ("/bench/floor/", "bench-floor")}
        order = [*(p for p in paths if p in phases), *(["slurm"] if slurm and "slurm" in phases else [])]
        for round_number in range(args.rounds if order else 0):
            # The order rotates each round: on this machine a phase run later in a round measured up to 30 %
            # more CPU per job for the same work (the VM's clock), which favoured whichever ran first.
            shift = round_number % len(order)
            for name in order[shift:] + order[:shift]:
                if "scheduler" in procs:
                    wait_worker_ready(env["CELERY_BROKER_URL"])  # no pass of an earlier phase still runs
                cancel_waiting(env["DATABASE_URL"])  # each phase starts with empty queues
                if slurm:
                    slurm.cancel_all()
                if name == "slurm":
                    samples[name].append(slurm.phase(args.clients, args.seconds))
                else:
                    path, job_name = paths[name]
                    samples[name].append(phase(port, path, token, args.clients, args.seconds, procs, name=job_name,
                                               servers=servers))
        if "array" in phases:
            run_arrays(args, array_parallelism, port, token, procs, servers, slurm, env, array_samples)
    finally:
        if slurm:
            slurm.stop()
        if servers:
            servers.close()
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=30)
    array_result = None
    if "array" in phases:
        platform_array, slurm_array = summarize_array(array_samples["platform"]), summarize_array(array_samples["slurm"])
        floor_array = summarize_array(array_samples["platform_floor"])
        floor_vs = array_versus_slurm(floor_array, slurm_array)
        array_result = {"elements": args.array_count, "rounds": args.array_rounds,
                        "slurm_rounds": args.array_slurm_rounds if slurm else 0, "parallelism": array_parallelism,
                        **array_versus_slurm(platform_array, slurm_array),
                        "floor_parallelism_1": {"platform_cpu_ms_per_element": floor_vs["platform_cpu_ms_per_element"],
                                                "platform_cpu_ms_per_element_parts":
                                                    floor_vs["platform_cpu_ms_per_element_parts"],
                                                "ratio_vs_slurm_cpu_per_element":
                                                    floor_vs["ratio_vs_slurm_cpu_per_element"]},
                        "platform": platform_array, "platform_floor": floor_array, "slurm": slurm_array,
                        "all_elements_admitted": None, "goal": {"ratio_vs_slurm_cpu_per_element_max": 1.0}}
    if not any(samples[k] for k in paths):
        print(json.dumps({"benchmark": "submit", "phases": phases, **machine(), "scheduler_worker": not args.no_scheduler,
                          "postgres_cpu_of": servers.postgres_of, "slurm_missing": slurm_missing,
                          "array": array_result}))
        return
    bare, admission, validated, floor = (summarize(samples[k]) if samples[k] else None
                                         for k in ("bare", "admission", "validated", "floor"))
    slurm_result = summarize(samples["slurm"]) if samples["slurm"] else None
    if slurm_result:
        slurm_result["error_sample"] = next((e for s in samples["slurm"] for e in s["error_sample"]), None)
    overhead = (bare["jobs_per_s"] / admission["jobs_per_s"] - 1) if admission["jobs_per_s"] else None
    admission_only = (validated["jobs_per_s"] / admission["jobs_per_s"] - 1) if admission["jobs_per_s"] else None
    print(json.dumps({
        "benchmark": "submit", "clients": args.clients, "seconds_per_phase": args.seconds, "rounds": args.rounds,
        "gunicorn": f"{args.workers}x{args.threads} gthread", **machine(),
        "scheduler_worker": not args.no_scheduler, "postgres_cpu_of": servers.postgres_of,
        "admission": admission, "bare_create": bare, "validated_create": validated, "floor": floor,
        "slurm": slurm_result, "slurm_missing": slurm_missing,
        "admission_overhead_pct": round(overhead * 100, 1) if overhead is not None else None,
        "cpu_overhead_pct": cpu_overhead(bare, admission),
        "admission_over_validated_pct": round(admission_only * 100, 1) if admission_only is not None else None,
        "cpu_admission_over_validated_pct": cpu_overhead(validated, admission),
        **versus_slurm(admission, slurm_result),
        "ratio_floor_vs_slurm_cpu_per_job": (ratio(floor["cpu_ms_per_job_total"], slurm_result["cpu_ms_per_job"]["slurmctld"])
                                             if slurm_result else None),
        "goal": {"jobs_per_s": 500, "overhead_pct_max": 25, "ratio_vs_slurm_jobs_per_s_min": 1.0,
                 "ratio_vs_slurm_cpu_per_job_max": 1.0},
        **({"array": array_result} if array_result else {}),
    }))


if __name__ == "__main__":
    main()
