"""Dispatch and reconcile throughput of the kubernetes backend against kmock emulators that answer at once.

(a) dispatch: ``--jobs`` ADMITTED jobs (default 500) are turned into
created batch/v1 Jobs by 2 real ``celery worker`` processes (one process
each, ``-P solo``) over Redis; the rate is jobs whose objects exist (attempt
started, job STARTING) per second of wall time from the first enqueue to the
last start. Goal: 200/s.
Its baseline in the same run, ``bare create``: the same number of
batch/v1 Job manifests POSTed straight to an emulator of its own by 2
client threads (urllib3, no database, broker or Celery): what creating
the objects costs at least; ``dispatch_over_bare_*`` are the ratios.
(b) reconcile: one ``jobs.reconcile.reconcile_clusters`` pass (clusters
looked at concurrently, as in ``reconcile_all``) over ``--clusters``
clusters (default 10) holding ``--attempts`` RUNNING attempts in all
(default 10,000), the emulators pre-filled with one Job and one Running
pod per attempt. Goal: under 2 s for the whole pass. Its baseline: the
LISTs the pass reads (the labelled Jobs and Pods of every cluster,
clusters concurrently, JSON decoded, nothing done with them);
``reconcile_over_list`` is the ratio.

Next to the rates, CPU milliseconds per dispatched job (per reconciled
attempt and pass) of each process involved: the Celery workers, the
emulator process, PostgreSQL (the backends of the benchmark's database,
less this process's polling connection during the dispatch phase), the
Redis server (the whole server), and this process (the reconcile pass, or
the bare create's clients). CPU per operation and the ratios hold on a
shared machine; the rates do not. A missing PostgreSQL or Redis ends the
run with status 3 and says so.

The emulators (``tests/support/kubernetes.py``) run in a child process, so
their serving does not share this process's interpreter. The database is
``BENCH_DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/cp_bench_dispatch``),
dropped and recreated per run; the broker ``BENCH_BROKER_URL`` (default
``redis://127.0.0.1:6379/14``). The per-cluster client-side rate limit is
raised (``K8S_QPS``/``K8S_BURST`` = 100000) because the endpoint answers at
once: the benchmark measures the platform, not the limiter. Ends with one
JSON line; times in seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.procstat import (  # noqa: E402
    DatabaseBackends,
    client_cpu_seconds,
    cpu_seconds,
    machine,
    named_cpu_seconds,
    used_since,
)
from benchmarks.services import postgres_missing, redis_missing, require  # noqa: E402

DISPATCH_CLUSTER = "bench-dispatch"
BARE_CLUSTER = "bench-bare"
NAMESPACE = "cp-bench"


# --- the emulator process ----------------------------------------------------------------------------------------


def _pod(job: dict, index: int) -> dict:
    meta = job["metadata"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{meta['name']}-{index}-abcde", "namespace": meta["namespace"],
                         "labels": dict(meta["labels"]), "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "spec": {**job["spec"]["template"]["spec"], "nodeName": f"node-{index}"},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "main", "ready": True, "restartCount": 0, "image": "x", "imageID": "",
                 "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}


def emulator_process(names: list[str], conn) -> None:
    """Serve one emulator per name; answer ``("prefill", {name: [(job_id, attempt_id, object_name)]})``,
    ``("count", name)`` (batch/v1 Jobs stored) and ``("stop",)`` over ``conn``."""
    from runners.kubernetes import manifests as m
    from tests.support.kubernetes import Emulators

    # kmock matches each request against its whole request history (~3 ms per request at first, ~60 ms after 600
    # creates when kept): the benchmark never reads that history, so each emulator drops it whenever no request
    # is in flight.
    with Emulators(names, forget_requests=True) as emulators:
        conn.send({name: emulators.url(name) for name in names})
        while True:
            message = conn.recv()
            if message[0] == "stop":
                conn.send("stopped")
                return
            if message[0] == "count":
                objects = emulators.handlers[message[1]].objects
                conn.send(sum(1 for (resource, _, _), obj in objects.items()
                              if getattr(resource, "plural", "") == "jobs" and not obj.deleted))
            elif message[0] == "prefill":
                for name, rows in message[1].items():
                    objects = emulators.handlers[name].objects
                    for job_id, attempt_id, object_name in rows:
                        w = m.Workload(name=object_name, namespace="cp-bench", team="bench", job_id=job_id,
                                       attempt_id=attempt_id, attempt_number=1, kind="training", image="img:1",
                                       command=("python", "train.py"), gpus_per_node=1,
                                       gpu_product="NVIDIA-H100-80GB-HBM3", provider="aws")
                        job = m.training_job(w)
                        job["status"] = {"active": 1, "startTime": "2026-01-01T00:00:00Z"}
                        objects["batch/v1/jobs", "cp-bench", object_name] = job
                        pod = _pod(job, 0)
                        objects["v1/pods", "cp-bench", pod["metadata"]["name"]] = pod
                conn.send("filled")


# --- database ------------------------------------------------------------------------------------------------


def recreate_database(env: dict) -> None:
    """Drop and create the benchmark database, then migrate it (in a subprocess, with ``env``)."""
    import psycopg

    url = env["DATABASE_URL"]
    admin_url, dbname = url.rsplit("/", 1)
    with psycopg.connect((admin_url + "/postgres").replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)


def seed(urls: dict[str, str], jobs: int, attempts: int, clusters: list[str]) -> tuple[list[int], dict]:
    """Team, user, clusters and jobs: ``jobs`` ADMITTED (on the dispatch cluster), ``attempts`` RUNNING spread over
    ``clusters``. Returns the admitted attempt ids and ``{cluster: [(job id, attempt id, object name)]}``."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from costs.seed import seed_accelerators
    from jobs.models import Job, JobAttempt, JobState
    from quotas.models import Team
    from runners.models import Accelerator, Cluster, NodePool

    seed_accelerators()
    h100 = Accelerator.objects.get(name="H100-80GB")
    team = Team.objects.create(slug="bench", name="Bench")
    user = get_user_model().objects.create_user(username="bench", password="x")
    spec = {"image": "registry.example/train:1", "command": ["python", "train.py"], "args": [], "env": {},
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "placement": {}}
    now = timezone.now()

    def make(cluster_name: str, count: int, state: str) -> list[tuple[int, int, str]]:
        cluster = Cluster.objects.create(name=cluster_name, provider="aws", region="us-east-1", backend="kubernetes",
                                         api_endpoint=urls[cluster_name])
        pool = NodePool.objects.create(cluster=cluster, name="h100", accelerator=h100, nodes=count, gpus_per_node=1)
        with transaction.atomic():
            made = Job.objects.bulk_create(
                [Job(team=team, submitter=user, name=f"b{i}", spec=spec, accelerator=h100, gpus_per_node=1, nodes=1,
                     max_runtime_seconds=3600, state=state, admitted_at=now,
                     started_at=now if state == JobState.RUNNING else None) for i in range(count)], batch_size=2000)
            tries = JobAttempt.objects.bulk_create(
                [JobAttempt(job=j, number=1, cluster=cluster, node_pool=pool, gpus=1, object_name=f"job-{j.pk}-1",
                            usd_per_gpu_hour="2.0", started_at=now if state == JobState.RUNNING else None)
                 for j in made], batch_size=2000)
            with connection.cursor() as cursor:
                cursor.execute("UPDATE jobs_job j SET current_attempt_id = a.id FROM jobs_jobattempt a "
                               "WHERE a.job_id = j.id AND a.cluster_id = %s", [cluster.pk])
        return [(a.job_id, a.pk, a.object_name) for a in tries]

    admitted = [attempt_id for _, attempt_id, _ in make(DISPATCH_CLUSTER, jobs, JobState.ADMITTED)]
    per = attempts // len(clusters)
    running = {name: make(name, per + (1 if i < attempts % len(clusters) else 0), JobState.RUNNING)
               for i, name in enumerate(clusters)}
    return admitted, running


# --- phases --------------------------------------------------------------------------------------------------


def database_backends(env: dict) -> DatabaseBackends:
    admin_url, dbname = env["DATABASE_URL"].rsplit("/", 1)
    return DatabaseBackends(admin_url + "/postgres", dbname)


def own_backend_pid() -> int:
    """The PostgreSQL backend of this process's Django connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def servers_used(backends: DatabaseBackends, before: tuple, after: tuple) -> dict[str, float | None]:
    """CPU seconds of PostgreSQL's backends (None where the server is not on this machine) and of Redis between
    two ``(backends snapshot, redis-server seconds)`` readings."""
    pg = None if before[0] is None or after[0] is None else used_since(before[0], after[0])
    return {"postgres": pg, "redis-server": after[1] - before[1]}


def read_servers(backends: DatabaseBackends, exclude: frozenset[int] = frozenset()) -> tuple:
    return backends.snapshot(exclude), named_cpu_seconds(("redis-server",))["redis-server"]


def per_op(seconds: dict[str, float | None], operations: int) -> dict[str, float | None]:
    """CPU seconds by process -> milliseconds per operation (None stays None)."""
    return {key: None if value is None or not operations else round(1000 * value / operations, 3)
            for key, value in seconds.items()}


def total(ms: dict[str, float | None]) -> float | None:
    return None if None in ms.values() else round(sum(ms.values()), 3)


def bare_create_phase(url: str, count: int, emulator_pid: int, threads: int = 2) -> dict:
    """Baseline of the dispatch phase: ``count`` batch/v1 Job manifests like the dispatched ones (built before the
    clock starts) POSTed to the emulator at ``url`` by ``threads`` client threads over one urllib3 pool, after
    one namespace create. Returns the rate and the CPU milliseconds per object of the clients (this process)
    and of the emulator process."""
    import threading

    import urllib3

    from runners.kubernetes import manifests as m

    http = urllib3.PoolManager(maxsize=threads)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    answer = http.request("POST", url + "/api/v1/namespaces", body=json.dumps(m.namespace(NAMESPACE, "bench")),
                          headers=headers)
    assert answer.status in (201, 409), answer.data
    manifests = [m.training_job(m.Workload(
        name=f"bare-{i}", namespace=NAMESPACE, team="bench", job_id=i, attempt_id=i, attempt_number=1,
        kind="training", image="registry.example/train:1", command=("python", "train.py"), gpus_per_node=1,
        gpu_product="NVIDIA-H100-80GB-HBM3", provider="aws")) for i in range(count)]
    path = f"{url}/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    todo, errors = iter(manifests), []

    def client() -> None:
        for manifest in todo:  # a shared iterator: next() is atomic under the GIL
            answer = http.request("POST", path, body=json.dumps(manifest), headers=headers)
            if not 200 <= answer.status <= 299:  # the emulator answers 200, an API server 201
                errors.append(answer.status)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    cpu_before = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    started = time.monotonic()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    seconds = time.monotonic() - started
    cpu_after = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    created = count - len(errors)
    ms = per_op({"client": cpu_after[0] - cpu_before[0],
                 "emulator": None if None in (cpu_before[1], cpu_after[1]) else cpu_after[1] - cpu_before[1]}, created)
    if not created:
        raise RuntimeError(f"bare create: every POST failed, e.g. HTTP {errors[0]}")
    return {"bare_create_jobs": created, "bare_create_errors": len(errors), "bare_create_seconds": round(seconds, 3),
            "bare_create_jobs_per_second": round(created / seconds, 1), "bare_create_cpu_ms_per_job": ms,
            "bare_create_cpu_ms_per_job_total": total(ms)}


def dispatch_phase(env: dict, attempt_ids: list[int], timeout: float, emulator_pid: int, pool: str = "solo",
                   concurrency: int = 1) -> dict:
    """Start 2 celery workers, enqueue every dispatch, and wait until every attempt started; returns rate and times.

    Also the CPU milliseconds per dispatched job spent by the two workers, the
    emulator process, PostgreSQL's backends and Redis: unlike the rate, they
    hardly move when other work shares the machine's cores.
    """
    from controlplane.celery import app
    from jobs.models import JobAttempt
    from jobs.tasks import dispatch_attempt

    app.control.purge()
    # Both on the fast queue, dispatch's (settings.CELERY_TASK_ROUTES): this measures dispatch alone.
    workers = [subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-Q", "fast",
                                 "-P", pool, "-c", str(concurrency), "-n", f"bench{i}@%h", "-l", "warning",
                                 "--without-gossip", "--without-mingle", "--without-heartbeat"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for i in range(2)]
    try:
        deadline = time.monotonic() + 60
        while len(app.control.ping(timeout=0.5) or []) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the celery workers did not answer a ping in 60 s")
        pids = [worker.pid for worker in workers]
        backends, poller = database_backends(env), frozenset([own_backend_pid()])
        servers_before = read_servers(backends, poller)
        cpu_before = [cpu_seconds(pid) for pid in [*pids, emulator_pid]]
        started = time.monotonic()
        for attempt_id in attempt_ids:
            dispatch_attempt.delay(attempt_id)
        enqueued = time.monotonic() - started
        done, ids = 0, set(attempt_ids)
        while done < len(ids) and time.monotonic() - started < timeout:
            time.sleep(0.05)
            # By cluster, not by a 500-id IN list: the poll should cost the machine next to nothing.
            done = JobAttempt.objects.filter(cluster__name=DISPATCH_CLUSTER, started_at__isnull=False).count()
        seconds = time.monotonic() - started
        cpu_after = [cpu_seconds(pid) for pid in [*pids, emulator_pid]]
        servers = servers_used(backends, servers_before, read_servers(backends, poller))
        backends.close()
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
    used = [None if a is None or b is None else b - a for a, b in zip(cpu_before, cpu_after, strict=True)]
    ms = per_op({"workers": None if None in used[:-1] else sum(used[:-1]), "emulator": used[-1], **servers}, done)
    return {"dispatch_jobs": len(ids), "dispatch_started": done, "dispatch_seconds": round(seconds, 3),
            "dispatch_enqueue_seconds": round(enqueued, 3), "dispatch_jobs_per_second": round(done / seconds, 1),
            "dispatch_worker_cpu_ms_per_job": ms["workers"], "dispatch_emulator_cpu_ms_per_job": ms["emulator"],
            "dispatch_cpu_ms_per_job": ms, "dispatch_cpu_ms_per_job_total": total(ms)}


def list_phase(urls: list[str], passes: int, emulator_pid: int) -> dict:
    """Baseline of the reconcile pass: the LISTs it reads (labelled Jobs and Pods of every cluster in ``urls``, one
    thread per cluster, answers JSON-decoded with the cyclic garbage collector paused as in the pass), ``passes``
    times; seconds of each and CPU ms per pass of this process and of the emulator process."""
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import quote

    import urllib3

    from runners.kubernetes.runner import SELECTOR

    http = urllib3.PoolManager(maxsize=len(urls))
    query = f"?labelSelector={quote(SELECTOR)}"

    def read(url: str) -> int:
        found = 0
        for path in ("/apis/batch/v1/jobs", "/api/v1/pods"):
            found += len(json.loads(http.request("GET", url + path + query).data)["items"])
        return found

    times = []
    cpu_before = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    with ThreadPoolExecutor(len(urls)) as pool:
        for _ in range(passes):
            started = time.monotonic()
            gc.disable()  # as the pass does while it decodes (jobs.reconcile.paused_gc)
            try:
                objects = sum(pool.map(read, urls))
            finally:
                gc.enable()
            times.append(round(time.monotonic() - started, 3))
    cpu_after = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    ms = per_op({"benchmark": cpu_after[0] - cpu_before[0],
                 "emulator": None if None in (cpu_before[1], cpu_after[1]) else cpu_after[1] - cpu_before[1]}, passes)
    return {"list_objects": objects, "list_pass_seconds": times, "list_cpu_ms_per_pass": ms,
            "list_cpu_ms_per_pass_total": total(ms)}


def reconcile_phase(env: dict, clusters: list[str], passes: int, emulator_pid: int) -> dict:
    """``passes`` reconcile passes over ``clusters`` (``reconcile_clusters``: what the periodic ``reconcile_all`` runs,
    less the dispatch cluster); the seconds of each (the first has cold clients), and the CPU milliseconds per
    pass of this process (the pass runs here), the emulator process, PostgreSQL's backends and Redis."""
    from jobs.models import Job, JobState
    from jobs.reconcile import reconcile_clusters
    from runners.models import Cluster

    rows = list(Cluster.objects.filter(name__in=clusters))
    backends = database_backends(env)
    times, observed = [], 0
    servers_before = read_servers(backends)
    cpu_before = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    for _ in range(passes):
        started = time.monotonic()
        observed = sum(result["observed"] for result in reconcile_clusters(rows))
        times.append(round(time.monotonic() - started, 3))
    cpu_after = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    servers = servers_used(backends, servers_before, read_servers(backends))
    backends.close()
    still_running = Job.objects.filter(current_attempt__cluster__in=rows, state=JobState.RUNNING).count()
    ms = per_op({"benchmark": cpu_after[0] - cpu_before[0],
                 "emulator": None if None in (cpu_before[1], cpu_after[1]) else cpu_after[1] - cpu_before[1],
                 **servers}, passes)
    return {"reconcile_attempts": observed, "reconcile_still_running": still_running, "reconcile_pass_seconds": times,
            "reconcile_cpu_ms_per_pass": ms, "reconcile_cpu_ms_per_pass_total": total(ms),
            "reconcile_cpu_us_per_attempt": None if total(ms) is None or not observed else
            round(1000 * total(ms) / observed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=500, help="admitted jobs to dispatch")
    parser.add_argument("--attempts", type=int, default=10000, help="running attempts to reconcile")
    parser.add_argument("--clusters", type=int, default=10, help="clusters holding the running attempts")
    parser.add_argument("--passes", type=int, default=3, help="reconcile passes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the dispatches")
    parser.add_argument("--pool", choices=["solo", "threads"], default="solo",
                        help="each worker's pool (default solo: one dispatch at a time per worker)")
    parser.add_argument("--concurrency", type=int, default=1, help="threads per worker with --pool threads")
    args = parser.parse_args()

    env = dict(os.environ)
    env["DATABASE_URL"] = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cp_bench_dispatch")
    env["CELERY_BROKER_URL"] = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")
    env.update(DJANGO_SETTINGS_MODULE="controlplane.settings", CELERY_TASK_ALWAYS_EAGER="false",
               K8S_QPS="100000", K8S_BURST="100000", PYTHONPATH=str(ROOT))
    require("dispatch", [postgres_missing(env["DATABASE_URL"]), redis_missing(env["CELERY_BROKER_URL"])])
    recreate_database(env)
    os.environ.update(env)

    names = [f"bench-{i:02d}" for i in range(args.clusters)]
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    emulator = ctx.Process(target=emulator_process, args=([DISPATCH_CLUSTER, BARE_CLUSTER, *names], child), daemon=True)
    emulator.start()
    try:
        urls = parent.recv()
        import django

        django.setup()
        admitted, running = seed(urls, args.jobs, args.attempts, names)
        parent.send(("prefill", running))
        parent.recv()

        result = {"benchmark": "dispatch", "workers": 2, "pool": f"{args.pool} x{args.concurrency}", **machine()}
        result.update(bare_create_phase(urls[BARE_CLUSTER], len(admitted), emulator.pid))
        result.update(dispatch_phase(env, admitted, args.timeout, emulator.pid, args.pool, args.concurrency))
        parent.send(("count", DISPATCH_CLUSTER))
        result["dispatch_objects_created"] = parent.recv()
        result["dispatch_over_bare_jobs_per_second"] = round(
            result["dispatch_jobs_per_second"] / result["bare_create_jobs_per_second"], 3)
        result["dispatch_over_bare_cpu_per_job"] = (
            None if not result["dispatch_cpu_ms_per_job_total"] or not result["bare_create_cpu_ms_per_job_total"]
            else round(result["dispatch_cpu_ms_per_job_total"] / result["bare_create_cpu_ms_per_job_total"], 3))
        result.update(list_phase([urls[name] for name in names], args.passes, emulator.pid))
        result.update(reconcile_phase(env, names, args.passes, emulator.pid))
        result["reconcile_over_list_seconds"] = round(min(result["reconcile_pass_seconds"])
                                                      / min(result["list_pass_seconds"]), 3)
        result["reconcile_over_list_cpu_per_pass"] = (
            None if not result["reconcile_cpu_ms_per_pass_total"] or not result["list_cpu_ms_per_pass_total"]
            else round(result["reconcile_cpu_ms_per_pass_total"] / result["list_cpu_ms_per_pass_total"], 3))
        result["reconcile_clusters"] = args.clusters
        result["goal_dispatch_jobs_per_second"] = 200
        result["goal_reconcile_seconds"] = 2.0
        result["dispatch_goal_met"] = result["dispatch_jobs_per_second"] >= 200
        result["reconcile_goal_met"] = max(result["reconcile_pass_seconds"]) < 2.0
        parent.send(("stop",))
        parent.recv()
    finally:
        emulator.join(timeout=10)
        if emulator.is_alive():
            emulator.terminate()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
