"""Dispatch and reconcile throughput of the kubernetes backend against kmock emulators that answer at once.

(a) dispatch: ``--jobs`` ADMITTED jobs (default 500) are turned into
created batch/v1 Jobs by 2 real ``celery worker`` processes (one process
each, ``-P solo``) over Redis; the rate is jobs whose objects exist (attempt
started, job STARTING) per second of wall time from the first enqueue to the
last start. Goal: 200/s.
(b) reconcile: one ``jobs.reconcile.reconcile_clusters`` pass (clusters
looked at concurrently, as in ``reconcile_all``) over ``--clusters``
clusters (default 10) holding ``--attempts`` RUNNING attempts in all
(default 10,000), the emulators pre-filled with one Job and one Running
pod per attempt. Goal: under 2 s for the whole pass.

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

from benchmarks.procstat import cpu_seconds  # noqa: E402

DISPATCH_CLUSTER = "bench-dispatch"


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


def dispatch_phase(env: dict, attempt_ids: list[int], timeout: float, emulator_pid: int, pool: str = "solo",
                   concurrency: int = 1) -> dict:
    """Start 2 celery workers, enqueue every dispatch, and wait until every attempt started; returns rate and times.

    Also the CPU milliseconds per dispatched job spent by the two workers and
    by the emulator process: unlike the rate, they hardly move when other
    work shares the machine's cores.
    """
    from controlplane.celery import app
    from jobs.models import JobAttempt
    from jobs.tasks import dispatch_attempt

    app.control.purge()
    workers = [subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-P", pool,
                                 "-c", str(concurrency), "-n", f"bench{i}@%h", "-l", "warning", "--without-gossip", "--without-mingle",
                                 "--without-heartbeat"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for i in range(2)]
    try:
        deadline = time.monotonic() + 60
        while len(app.control.ping(timeout=0.5) or []) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the celery workers did not answer a ping in 60 s")
        pids = [worker.pid for worker in workers]
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
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
    used = [None if a is None or b is None else b - a for a, b in zip(cpu_before, cpu_after, strict=True)]

    def ms_per_job(seconds_used: list[float | None]) -> float | None:
        if None in seconds_used or not done:
            return None
        return round(1000 * sum(seconds_used) / done, 2)

    return {"dispatch_jobs": len(ids), "dispatch_started": done, "dispatch_seconds": round(seconds, 3),
            "dispatch_enqueue_seconds": round(enqueued, 3), "dispatch_jobs_per_second": round(done / seconds, 1),
            "dispatch_worker_cpu_ms_per_job": ms_per_job(used[:-1]),
            "dispatch_emulator_cpu_ms_per_job": ms_per_job(used[-1:])}


def reconcile_phase(clusters: list[str], passes: int) -> dict:
    """``passes`` reconcile passes over ``clusters`` (``reconcile_clusters``: what the periodic ``reconcile_all`` runs,
    less the dispatch cluster); the seconds of each (the first has cold clients)."""
    from jobs.models import Job, JobState
    from jobs.reconcile import reconcile_clusters
    from runners.models import Cluster

    rows = list(Cluster.objects.filter(name__in=clusters))
    times, observed = [], 0
    for _ in range(passes):
        started = time.monotonic()
        observed = sum(result["observed"] for result in reconcile_clusters(rows))
        times.append(round(time.monotonic() - started, 3))
    still_running = Job.objects.filter(current_attempt__cluster__in=rows, state=JobState.RUNNING).count()
    return {"reconcile_attempts": observed, "reconcile_still_running": still_running, "reconcile_pass_seconds": times}


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
    recreate_database(env)
    os.environ.update(env)

    names = [f"bench-{i:02d}" for i in range(args.clusters)]
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    emulator = ctx.Process(target=emulator_process, args=([DISPATCH_CLUSTER, *names], child), daemon=True)
    emulator.start()
    try:
        urls = parent.recv()
        import django

        django.setup()
        admitted, running = seed(urls, args.jobs, args.attempts, names)
        parent.send(("prefill", running))
        parent.recv()

        result = {"benchmark": "dispatch", "workers": 2, "pool": f"{args.pool} x{args.concurrency}",
                  "cores": os.cpu_count()}
        result.update(dispatch_phase(env, admitted, args.timeout, emulator.pid, args.pool, args.concurrency))
        parent.send(("count", DISPATCH_CLUSTER))
        result["dispatch_objects_created"] = parent.recv()
        result.update(reconcile_phase(names, args.passes))
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
