"""Dispatch and reconcile throughput of the kubernetes backend against kmock emulators that answer at once.

(a) dispatch: in each of ``--rounds`` rounds (default 3), ``--jobs``
ADMITTED jobs (default 500) are turned into created batch/v1 Jobs by 2
real ``celery worker`` processes (one process each, ``-P solo``, started
once for all rounds) over Redis, published as a scheduling pass publishes
them (``dispatch_attempts`` tasks of ``jobs.enqueue.DISPATCH_BATCH``
attempts; ``--per-attempt``: one ``dispatch_attempt`` task each); the rate
is jobs whose objects exist (attempt started, job STARTING) per second of
wall time from the first enqueue to the last start. Goal: 200/s; and at
most twice a bare create's CPU per job (``dispatch_over_bare_cpu_per_job``).
Its baseline, ``bare create``, runs in the same round, before the
dispatch in one round and after it in the next: the same number of
batch/v1 Job manifests POSTed straight to an emulator of its own by 2
client threads (urllib3, no database, broker or Celery): what creating
the objects costs at least. Each is the manifest dispatch builds for the
first measured attempt (its labels, attempt uid and record annotation,
2,586 bytes) with its own name, ids and uid. ``dispatch_over_bare_cpu_per_job`` is the
median of the rounds' ratios (``..._rounds``): each round's two sides
share the machine's load of that moment, and one round that other work
disturbed moves the median least; ``..._pooled`` is the ratio of all
rounds' CPU together. Before the rounds, 4 more attempts are dispatched
unmeasured (each worker's first database connection and cluster client,
as the bare create opens its connection before its clock), and both
emulators are emptied before each measured side (an emulator's CPU per
create grows with the objects it holds; its change log, kept for watches,
is compacted with them, as etcd compacts its history). The clusters of
(b) are filled after the dispatch rounds: held during them, their 20,000
objects make each full collection of the emulator process's heap cost
about 0.3 s, which lands on one side of a round (0.6 ms per create).
(b) reconcile: one ``jobs.reconcile.reconcile_clusters`` pass (clusters
looked at concurrently, as in ``reconcile_all``) over ``--clusters``
clusters (default 10) holding ``--attempts`` RUNNING attempts in all
(default 10,000), the emulators pre-filled with one Job and one Running
pod per attempt. Goal: under 2 s for the whole pass. Its baseline: the
LISTs the pass reads (the labelled Jobs and Pods of every cluster,
clusters concurrently, JSON decoded, nothing done with them);
``reconcile_over_list`` is the ratio. The reconcile passes run twice:
``reconcile_full_lists_*`` LIST everything on every pass
(``RECONCILE_FULL_LIST_SECONDS`` = 0), ``reconcile_*`` after one full pass
fetch only the changes since the resourceVersions it kept (docs/adr/0042);
``reconcile_cpu_per_attempt_over_full_lists`` is the ratio of their CPU per
live attempt. ``reconcile_churn_*``: the same while ``--churn`` of the
attempts (default 1%) have a pod changed before each pass.

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
import random
import subprocess
import sys
import time
from collections.abc import Callable
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
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{index}-abcde",
            "namespace": meta["namespace"],
            "labels": dict(meta["labels"]),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
        },
        "spec": {**job["spec"]["template"]["spec"], "nodeName": f"node-{index}"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        },
    }


def emulator_process(names: list[str], conn) -> None:
    """Serve one emulator per name; answer ``("prefill", {name: [(job_id, attempt_id, object_name)]})``,
    ``("count", name)`` (batch/v1 Jobs stored), ``("clear", name)`` (the same count, then every stored object of
    that emulator forgotten and its change log compacted: a watch from before answers 410 Gone; its namespaces
    kept) and ``("stop",)`` over ``conn``."""
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
                conn.send(
                    sum(
                        1
                        for (resource, _, _), obj in objects.items()
                        if getattr(resource, "plural", "") == "jobs" and not obj.deleted
                    )
                )
            elif message[0] == "clear":  # forget every stored object of one emulator; answers the Jobs it held
                objects = emulators.handlers[message[1]].objects
                conn.send(
                    sum(
                        1
                        for (resource, _, _), obj in objects.items()
                        if getattr(resource, "plural", "") == "jobs" and not obj.deleted
                    )
                )
                objects.clear()
                emulators.fronts[message[1]].compact()  # the logged changes hold the objects too
            elif message[0] == "churn":  # pods whose status changes, as a kubelet's heartbeat of a restart does
                for name, pod_names in message[1].items():
                    objects, front = emulators.handlers[name].objects, emulators.fronts[name]
                    for pod_name in pod_names:
                        pod = dict(objects["v1/pods", "cp-bench", pod_name].raw)
                        pod["status"] = {
                            **pod["status"],
                            "conditions": [
                                {
                                    "type": "Ready",
                                    "status": "True",
                                    "lastTransitionTime": f"2026-01-01T00:00:{message[2]:02d}Z",
                                }
                            ],
                        }
                        objects["v1/pods", "cp-bench", pod_name] = pod
                        front.log_change("v1/pods", "MODIFIED", pod)
                conn.send("churned")
            elif message[0] == "prefill":
                for name, rows in message[1].items():
                    objects = emulators.handlers[name].objects
                    for job_id, attempt_id, object_name in rows:
                        w = m.Workload(
                            name=object_name,
                            namespace="cp-bench",
                            team="bench",
                            job_id=job_id,
                            attempt_id=attempt_id,
                            attempt_number=1,
                            kind="training",
                            image="img:1",
                            command=("python", "train.py"),
                            gpus_per_node=1,
                            gpu_product="NVIDIA-H100-80GB-HBM3",
                        )
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
    spec = {
        "image": "registry.example/train:1",
        "command": ["python", "train.py"],
        "args": [],
        "env": {},
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1},
        "placement": {},
    }
    now = timezone.now()

    def make(cluster_name: str, count: int, state: str) -> list[tuple[int, int, str]]:
        cluster = Cluster.objects.create(
            name=cluster_name, provider="aws", region="us-east-1", backend="kubernetes", api_endpoint=urls[cluster_name]
        )
        pool = NodePool.objects.create(cluster=cluster, name="h100", accelerator=h100, nodes=count, gpus_per_node=1)
        with transaction.atomic():
            made = Job.objects.bulk_create(
                [
                    Job(
                        team=team,
                        submitter=user,
                        name=f"b{i}",
                        spec=spec,
                        accelerator=h100,
                        gpus_per_node=1,
                        nodes=1,
                        max_runtime_seconds=3600,
                        state=state,
                        admitted_at=now,
                        started_at=now if state == JobState.RUNNING else None,
                    )
                    for i in range(count)
                ],
                batch_size=2000,
            )
            tries = JobAttempt.objects.bulk_create(
                [
                    JobAttempt(
                        job=j,
                        number=1,
                        cluster=cluster,
                        node_pool=pool,
                        gpus=1,
                        object_name=f"job-{j.pk}-1",
                        usd_per_gpu_hour="2.0",
                        started_at=now if state == JobState.RUNNING else None,
                    )
                    for j in made
                ],
                batch_size=2000,
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE jobs_job j SET current_attempt_id = a.id FROM jobs_jobattempt a "
                    "WHERE a.job_id = j.id AND a.cluster_id = %s",
                    [cluster.pk],
                )
        return [(a.job_id, a.pk, a.object_name) for a in tries]

    admitted = [attempt_id for _, attempt_id, _ in make(DISPATCH_CLUSTER, jobs, JobState.ADMITTED)]
    per = attempts // len(clusters)
    running = {
        name: make(name, per + (1 if i < attempts % len(clusters) else 0), JobState.RUNNING)
        for i, name in enumerate(clusters)
    }
    return admitted, running


# --- processes ---------------------------------------------------------------------------------------------


def start_workers(
    env: dict, count: int, app: str = "controlplane", pool: str = "solo", concurrency: int = 1, prefix: str = "bench"
) -> list[subprocess.Popen]:
    """Start ``count`` ``celery worker`` processes of Celery app module ``app`` on the fast queue (``-P pool -c
    concurrency``, named ``<prefix><i>@<host>``, with ``env``) and return once all answer a ping; RuntimeError
    (the workers stopped) when they do not within 90 s or one exits."""
    from controlplane.celery import app as celery_app

    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app,
                "worker",
                "-Q",
                "fast",
                "-P",
                pool,
                "-c",
                str(concurrency),
                "-n",
                f"{prefix}{i}@%h",
                "-l",
                "warning",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(count)
    ]
    deadline = time.monotonic() + 90
    while len(celery_app.control.ping(timeout=0.5) or []) < count:
        if time.monotonic() > deadline or any(worker.poll() is not None for worker in workers):
            stop_workers(workers)
            raise RuntimeError(f"the {count} celery workers did not all answer a ping in 90 s")
    return workers


def stop_workers(workers: list[subprocess.Popen]) -> None:
    """Stop the worker processes (SIGTERM, then SIGKILL after 30 s) and wait for each."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def bench_env(name: str, database: str, broker_db: int) -> dict:
    """This process's environment for benchmark ``name`` and its workers: ``DATABASE_URL`` from
    ``BENCH_DATABASE_URL`` (default PostgreSQL ``database`` on localhost), ``CELERY_BROKER_URL`` from
    ``BENCH_BROKER_URL`` (default Redis db ``broker_db`` on localhost), real Celery, the per-cluster client rate
    limit raised (the emulators answer at once: the platform is measured, not the limiter). Exits with status 3
    and a ``missing`` JSON line when PostgreSQL or Redis does not answer."""
    env = dict(os.environ)
    env["DATABASE_URL"] = os.environ.get("BENCH_DATABASE_URL", f"postgres://postgres@127.0.0.1:5432/{database}")
    env["CELERY_BROKER_URL"] = os.environ.get("BENCH_BROKER_URL", f"redis://127.0.0.1:6379/{broker_db}")
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        CELERY_TASK_ALWAYS_EAGER="false",
        K8S_QPS="100000",
        K8S_BURST="100000",
        PYTHONPATH=str(ROOT),
    )
    require(name, [postgres_missing(env["DATABASE_URL"]), redis_missing(env["CELERY_BROKER_URL"])])
    return env


def start_emulators(names: list[str]):
    """``emulator_process`` for ``names`` in a spawned child; returns ``(process, connection, {name: url})``."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    emulator = ctx.Process(target=emulator_process, args=(names, child), daemon=True)
    emulator.start()
    child.close()  # this process's copy: a dead emulator then ends parent.recv() with EOFError, not a hang
    return emulator, parent, parent.recv()


def stop_emulators(emulator, parent) -> None:
    """Stop the emulator child of ``start_emulators`` (asked over ``parent``; terminated after 10 s)."""
    try:
        parent.send(("stop",))
        parent.recv()
    except (EOFError, OSError):
        pass
    emulator.join(timeout=10)
    if emulator.is_alive():
        emulator.terminate()


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
    return {
        key: None if value is None or not operations else round(1000 * value / operations, 3)
        for key, value in seconds.items()
    }


def total(ms: dict[str, float | None]) -> float | None:
    return None if None in ms.values() else round(sum(ms.values()), 3)


def bare_create_phase(
    url: str, count: int, emulator_pid: int, threads: int = 2, prefix: str = "bare", like=None
) -> dict:
    """Baseline of the dispatch phase: ``count`` batch/v1 Job manifests like the dispatched ones (built before the
    clock starts, named ``<prefix>-<i>``) POSTed to the emulator at ``url`` by ``threads`` client threads over one
    urllib3 pool, after one namespace create (409 when made before). ``like``: the ``manifests.Workload`` of a
    dispatched attempt (``runners.kubernetes.runner.workload``), whose manifest each one copies but for its name,
    job and attempt ids and attempt uid (in its labels and in its record annotation), so both sides send manifests
    of the same shape and size; None: a training Workload without the attempt's uid, installation and record.
    Returns the jobs created, the seconds and the CPU seconds of the clients (this process) and of the emulator
    process (None where unreadable)."""
    import dataclasses
    import threading
    import uuid

    import urllib3

    from runners.kubernetes import manifests as m

    http = urllib3.PoolManager(maxsize=threads)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    answer = http.request(
        "POST", url + "/api/v1/namespaces", body=json.dumps(m.namespace(NAMESPACE, "bench")), headers=headers
    )
    assert answer.status in (200, 201, 409), answer.data
    def workload(i: int) -> m.Workload:
        if like is None:
            return m.Workload(
                name=f"{prefix}-{i}",
                namespace=NAMESPACE,
                team="bench",
                job_id=i,
                attempt_id=i,
                attempt_number=1,
                kind="training",
                image="registry.example/train:1",
                command=("python", "train.py"),
                gpus_per_node=1,
                gpu_product="NVIDIA-H100-80GB-HBM3",
            )
        uid = str(uuid.uuid4())
        record = {**json.loads(like.record), "job_id": i, "attempt_id": i, "uid": uid} if like.record else None
        return dataclasses.replace(
            like,
            name=f"{prefix}-{i}",
            namespace=NAMESPACE,
            job_id=i,
            attempt_id=i,
            attempt_uid=uid if like.attempt_uid else "",
            record="" if record is None else json.dumps(record, sort_keys=True),
        )

    manifests = [m.manifests(workload(i))[0] for i in range(count)]
    assert all(manifest["kind"] == "Job" for manifest in manifests)
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
    if not created:
        raise RuntimeError(f"bare create: every POST failed, e.g. HTTP {errors[0]}")
    return {
        "jobs": created,
        "errors": len(errors),
        "seconds": seconds,
        "cpu": {
            "client": cpu_after[0] - cpu_before[0],
            "emulator": None if None in (cpu_before[1], cpu_after[1]) else cpu_after[1] - cpu_before[1],
        },
    }


def dispatch_round(
    env: dict,
    attempt_ids: list[int],
    cluster_id: int,
    timeout: float,
    pids: list[int],
    emulator_pid: int,
    per_attempt: bool = False,
) -> dict:
    """Enqueue every dispatch of ``attempt_ids`` (attempts of cluster ``cluster_id``) as a scheduling pass does
    (``dispatch_attempts`` tasks of ``jobs.enqueue.DISPATCH_BATCH`` attempts; with ``per_attempt``, one
    ``dispatch_attempt`` task each) to the running workers ``pids`` and wait until every attempt started, at most
    ``timeout`` seconds. Returns the attempts started, the seconds (first enqueue to last start), the enqueue's
    seconds and the CPU seconds of the workers, the emulator, PostgreSQL's backends (less this process's polling
    connection) and Redis (None where unreadable)."""
    from jobs.enqueue import dispatch_batches
    from jobs.models import JobAttempt
    from jobs.tasks import dispatch_attempt, dispatch_attempts

    def started_count() -> int:
        # By cluster, not by a 500-id IN list: the poll should cost the machine next to nothing.
        return JobAttempt.objects.filter(cluster__name=DISPATCH_CLUSTER, started_at__isnull=False).count()

    before_round = started_count()
    backends, poller = database_backends(env), frozenset([own_backend_pid()])
    servers_before = read_servers(backends, poller)
    cpu_before = [cpu_seconds(pid) for pid in [*pids, emulator_pid]]
    started = time.monotonic()
    if per_attempt:
        for attempt_id in attempt_ids:
            dispatch_attempt.delay(attempt_id)
    else:  # as a scheduling pass publishes its admissions (jobs.enqueue.enqueue_dispatches)
        for batch in dispatch_batches([(attempt_id, cluster_id) for attempt_id in attempt_ids]):
            dispatch_attempts.delay(batch)
    enqueued = time.monotonic() - started
    done = 0
    while done < len(attempt_ids) and time.monotonic() - started < timeout:
        time.sleep(0.05)
        done = started_count() - before_round
    seconds = time.monotonic() - started
    cpu_after = [cpu_seconds(pid) for pid in [*pids, emulator_pid]]
    servers = servers_used(backends, servers_before, read_servers(backends, poller))
    backends.close()
    used = [None if a is None or b is None else b - a for a, b in zip(cpu_before, cpu_after, strict=True)]
    return {
        "jobs": done,
        "seconds": seconds,
        "enqueue_seconds": enqueued,
        "cpu": {"workers": None if None in used[:-1] else sum(used[:-1]), "emulator": used[-1], **servers},
    }


def _summed(rounds: list[dict]) -> dict[str, float | None]:
    """The CPU seconds of ``rounds`` (each ``{"cpu": {process: seconds or None}}``) added up by process."""
    return {
        key: None if any(r["cpu"][key] is None for r in rounds) else sum(r["cpu"][key] for r in rounds)
        for key in rounds[0]["cpu"]
    }


def median(values: list[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def dispatched_workload(attempt_id: int):
    """The ``manifests.Workload`` dispatch builds for admitted attempt ``attempt_id`` (its job, team, submitter,
    cluster and node pool read as ``jobs.lifecycle.dispatch_many`` reads them), for the bare create to copy."""
    from jobs.lifecycle import attach_placement_rows
    from jobs.models import JobAttempt
    from runners.kubernetes.runner import workload

    attempt = JobAttempt.objects.select_related("job__team", "job__submitter").get(pk=attempt_id)
    attach_placement_rows(attempt)
    return workload(attempt)


#: Attempts dispatched before the measured rounds, one task each (``dispatch_phase``).
WARM_UP = 4


def dispatch_phase(
    env: dict,
    attempt_ids: list[int],
    cluster_id: int,
    timeout: float,
    emulator_pid: int,
    bare_url: str,
    rounds: int = 3,
    pool: str = "solo",
    concurrency: int = 1,
    per_attempt: bool = False,
    clear: Callable[[str], int] | None = None,
) -> dict:
    """Start 2 celery workers, then ``rounds`` rounds, each a dispatch of its share of ``attempt_ids`` (attempts of
    cluster ``cluster_id``, ``dispatch_round``) and a bare create of as many manifests at ``bare_url``
    (``bare_create_phase``), the two in the same round, which goes first alternating from round to round, so both
    sides of each round's ratio share the machine's load of that moment.

    Returns the rate and the CPU milliseconds per job of each process of both sides over all rounds, the ratio of
    CPU per job of each round (``dispatch_over_bare_cpu_per_job_rounds``) and their median
    (``dispatch_over_bare_cpu_per_job``: a round that other work on the machine disturbed moves it least), and the
    ratio of the sums (``dispatch_over_bare_cpu_per_job_pooled``).

    The first ``WARM_UP`` attempts of ``attempt_ids`` are dispatched before the rounds, one task each, unmeasured:
    each worker's first task opens its database connection and the cluster's client, as the bare create's
    namespace create opens its connection before its clock starts. ``clear(name)`` (the emulator process's
    ``clear``: the batch/v1 Jobs emulator ``name`` held, then none) empties both emulators before each measured
    side: the emulator's CPU per create grows with the objects it holds (from about 1.3 to 2.8 ms over three rounds
    of 500), which would otherwise charge whichever side goes second. ``dispatch_objects_cleared``: the Jobs the
    dispatch cluster's emulator held at those clears. CPU per operation hardly moves when other work shares the
    machine's cores; the rates do.
    """
    from controlplane.celery import app
    from jobs.models import JobAttempt
    from jobs.tasks import dispatch_attempts

    app.control.purge()
    warm, attempt_ids = attempt_ids[:WARM_UP], attempt_ids[WARM_UP:]
    share = -(-len(attempt_ids) // rounds)
    parts = [attempt_ids[i : i + share] for i in range(0, len(attempt_ids), share)]
    # Both on the fast queue, dispatch's (settings.CELERY_TASK_ROUTES): this measures dispatch alone.
    workers = start_workers(env, 2, pool=pool, concurrency=concurrency)
    bare, dispatched, cleared = [], [], 0
    try:
        pids = [worker.pid for worker in workers]
        for (
            attempt_id
        ) in warm:  # each a task of its own: both workers take some (Redis serves its waiting BRPOPs in turn)
            dispatch_attempts.delay([attempt_id])
        deadline = time.monotonic() + timeout
        while JobAttempt.objects.filter(pk__in=warm, started_at__isnull=False).count() < len(warm):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {len(warm)} warm-up dispatches did not start in {timeout:g} s")
            time.sleep(0.05)
        like = dispatched_workload(attempt_ids[0])
        for number, part in enumerate(parts):
            for side in ("dispatch", "bare") if number % 2 == 0 else ("bare", "dispatch"):
                if clear is not None:
                    cleared += clear(DISPATCH_CLUSTER)
                    clear(BARE_CLUSTER)
                if side == "dispatch":
                    dispatched.append(dispatch_round(env, part, cluster_id, timeout, pids, emulator_pid, per_attempt))
                else:
                    bare.append(
                        bare_create_phase(bare_url, len(part), emulator_pid, prefix=f"bare{number}", like=like)
                    )
    finally:
        stop_workers(workers)
    bare_ms = per_op(_summed(bare), sum(r["jobs"] for r in bare))
    done = sum(r["jobs"] for r in dispatched)
    ms = per_op(_summed(dispatched), done)
    ratios = []
    for d, b in zip(dispatched, bare, strict=True):
        d_total, b_total = total(per_op(d["cpu"], d["jobs"])), total(per_op(b["cpu"], b["jobs"]))
        ratios.append(None if not d_total or not b_total else round(d_total / b_total, 3))
    seconds = sum(r["seconds"] for r in dispatched)
    bare_seconds = sum(r["seconds"] for r in bare)
    return {
        "rounds": len(parts),
        "dispatch_objects_cleared": cleared,
        "bare_create_jobs": sum(r["jobs"] for r in bare),
        "bare_create_errors": sum(r["errors"] for r in bare),
        "bare_create_seconds": round(bare_seconds, 3),
        "bare_create_jobs_per_second": round(sum(r["jobs"] for r in bare) / bare_seconds, 1),
        "bare_create_cpu_ms_per_job": bare_ms,
        "bare_create_cpu_ms_per_job_total": total(bare_ms),
        "dispatch_jobs": len(attempt_ids),
        "dispatch_started": done,
        "dispatch_seconds": round(seconds, 3),
        "dispatch_enqueue_seconds": round(sum(r["enqueue_seconds"] for r in dispatched), 3),
        "dispatch_jobs_per_second": round(done / seconds, 1),
        "dispatch_worker_cpu_ms_per_job": ms["workers"],
        "dispatch_emulator_cpu_ms_per_job": ms["emulator"],
        "dispatch_cpu_ms_per_job": ms,
        "dispatch_cpu_ms_per_job_total": total(ms),
        "bare_create_cpu_ms_per_job_rounds": [per_op(r["cpu"], r["jobs"]) for r in bare],
        "dispatch_cpu_ms_per_job_rounds": [per_op(r["cpu"], r["jobs"]) for r in dispatched],
        "dispatch_over_bare_cpu_per_job_rounds": ratios,
        "dispatch_over_bare_cpu_per_job": None if None in ratios else round(median(ratios), 3),
        "dispatch_over_bare_cpu_per_job_pooled": (
            None if not total(ms) or not total(bare_ms) else round(total(ms) / total(bare_ms), 3)
        ),
    }


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
    ms = per_op(
        {
            "benchmark": cpu_after[0] - cpu_before[0],
            "emulator": None if None in (cpu_before[1], cpu_after[1]) else cpu_after[1] - cpu_before[1],
        },
        passes,
    )
    return {
        "list_objects": objects,
        "list_pass_seconds": times,
        "list_cpu_ms_per_pass": ms,
        "list_cpu_ms_per_pass_total": total(ms),
    }


def reconcile_phase(
    env: dict,
    clusters: list[str],
    passes: int,
    emulator_pid: int,
    full_lists: bool = False,
    prefix: str = "reconcile",
    churn: Callable[[int], None] | None = None,
) -> dict:
    """``passes`` reconcile passes over ``clusters`` (``reconcile_clusters``: what the periodic ``reconcile_all`` runs,
    less the dispatch cluster); the seconds of each (the first has cold clients), and the CPU milliseconds per
    pass of this process (the pass runs here), the emulator process, PostgreSQL's backends and Redis; per attempt:
    per live attempt on ``clusters``. ``full_lists``: every pass LISTs everything (``RECONCILE_FULL_LIST_SECONDS``
    = 0, as reconcile did before it followed changes); else one untimed full pass first, and the timed passes
    fetch only the changes since (docs/adr/0042). ``churn(i)``: called before timed pass ``i`` to change some pods
    on the clusters. Keys start with ``prefix``."""
    from django.conf import settings

    from jobs.models import Job, JobAttempt, JobState
    from jobs.reconcile import reconcile_clusters
    from runners.models import Cluster

    rows = list(Cluster.objects.filter(name__in=clusters))
    settings.RECONCILE_FULL_LIST_SECONDS = 0 if full_lists else 300.0
    if not full_lists:
        reconcile_clusters(rows)  # the first contact LISTs everything and keeps the versions
    live = JobAttempt.objects.filter(cluster__in=rows, ended_at__isnull=True).count()
    backends = database_backends(env)
    times, observed, full = [], 0, 0
    servers_before = read_servers(backends)
    cpu_before = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    for i in range(passes):
        if churn is not None:
            churn(i)
        started = time.monotonic()
        results = reconcile_clusters(rows)
        observed = sum(result["observed"] for result in results)
        full += sum(1 for result in results if result.get("full_list"))
        times.append(round(time.monotonic() - started, 3))
    cpu_after = (client_cpu_seconds(children=False), cpu_seconds(emulator_pid))
    servers = servers_used(backends, servers_before, read_servers(backends))
    backends.close()
    still_running = Job.objects.filter(current_attempt__cluster__in=rows, state=JobState.RUNNING).count()
    ms = per_op(
        {
            "benchmark": cpu_after[0] - cpu_before[0],
            "emulator": None if None in (cpu_before[1], cpu_after[1]) else cpu_after[1] - cpu_before[1],
            **servers,
        },
        passes,
    )
    return {
        f"{prefix}_attempts": live,
        f"{prefix}_looked_at": observed,
        f"{prefix}_full_list_looks": full,
        f"{prefix}_still_running": still_running,
        f"{prefix}_pass_seconds": times,
        f"{prefix}_cpu_ms_per_pass": ms,
        f"{prefix}_cpu_ms_per_pass_total": total(ms),
        f"{prefix}_cpu_us_per_attempt": None if total(ms) is None or not live else round(1000 * total(ms) / live, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=500, help="admitted jobs to dispatch in each round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --jobs dispatches and as many bare creates")
    parser.add_argument("--attempts", type=int, default=10000, help="running attempts to reconcile")
    parser.add_argument("--clusters", type=int, default=10, help="clusters holding the running attempts")
    parser.add_argument("--passes", type=int, default=3, help="reconcile passes")
    parser.add_argument(
        "--churn",
        type=float,
        default=0.01,
        help="fraction of the running attempts whose pod changes before each pass of the churn phase",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each round's dispatches")
    parser.add_argument(
        "--pool",
        choices=["solo", "threads"],
        default="solo",
        help="each worker's pool (default solo: one dispatch at a time per worker)",
    )
    parser.add_argument("--concurrency", type=int, default=1, help="threads per worker with --pool threads")
    parser.add_argument(
        "--per-attempt",
        action="store_true",
        help="one dispatch_attempt task per attempt instead of the scheduler's batches",
    )
    args = parser.parse_args()

    env = bench_env("dispatch", "cp_bench_dispatch", 14)
    recreate_database(env)
    os.environ.update(env)

    names = [f"bench-{i:02d}" for i in range(args.clusters)]
    emulator, parent, urls = start_emulators([DISPATCH_CLUSTER, BARE_CLUSTER, *names])
    try:
        import django

        django.setup()
        admitted, running = seed(urls, WARM_UP + args.jobs * args.rounds, args.attempts, names)

        result = {"benchmark": "dispatch", "workers": 2, "pool": f"{args.pool} x{args.concurrency}", **machine()}
        from runners.models import Cluster

        def clear(name: str) -> int:
            parent.send(("clear", name))
            return parent.recv()

        result.update(
            dispatch_phase(
                env,
                admitted,
                Cluster.objects.get(name=DISPATCH_CLUSTER).pk,
                args.timeout,
                emulator.pid,
                urls[BARE_CLUSTER],
                args.rounds,
                args.pool,
                args.concurrency,
                args.per_attempt,
                clear,
            )
        )
        result["dispatch_tasks"] = "dispatch_attempt per attempt" if args.per_attempt else "dispatch_attempts batches"
        parent.send(("count", DISPATCH_CLUSTER))
        result["dispatch_objects_created"] = result.pop("dispatch_objects_cleared") + parent.recv()
        result["dispatch_over_bare_jobs_per_second"] = round(
            result["dispatch_jobs_per_second"] / result["bare_create_jobs_per_second"], 3
        )
        parent.send(("prefill", running))  # after the dispatch rounds: the module docstring says why
        parent.recv()
        result.update(list_phase([urls[name] for name in names], args.passes, emulator.pid))
        result.update(
            reconcile_phase(env, names, args.passes, emulator.pid, full_lists=True, prefix="reconcile_full_lists")
        )
        result.update(reconcile_phase(env, names, args.passes, emulator.pid))
        changing = round(args.churn * args.attempts)

        def churn(i: int) -> None:
            picked = random.Random(i).sample([(name, row) for name in names for row in running[name]], changing)
            by_cluster: dict[str, list[str]] = {}
            for name, (_, _, object_name) in picked:
                by_cluster.setdefault(name, []).append(f"{object_name}-0-abcde")
            parent.send(("churn", by_cluster, i))
            parent.recv()

        result.update(reconcile_phase(env, names, args.passes, emulator.pid, prefix="reconcile_churn", churn=churn))
        result["reconcile_churn_pods_changed_per_pass"] = changing
        result["reconcile_cpu_per_attempt_over_full_lists"] = (
            None
            if not result["reconcile_cpu_us_per_attempt"] or not result["reconcile_full_lists_cpu_us_per_attempt"]
            else round(result["reconcile_cpu_us_per_attempt"] / result["reconcile_full_lists_cpu_us_per_attempt"], 3)
        )
        result["reconcile_over_list_seconds"] = round(
            min(result["reconcile_pass_seconds"]) / min(result["list_pass_seconds"]), 3
        )
        result["reconcile_over_list_cpu_per_pass"] = (
            None
            if not result["reconcile_cpu_ms_per_pass_total"] or not result["list_cpu_ms_per_pass_total"]
            else round(result["reconcile_cpu_ms_per_pass_total"] / result["list_cpu_ms_per_pass_total"], 3)
        )
        result["reconcile_clusters"] = args.clusters
        result["goal_dispatch_jobs_per_second"] = 200
        result["goal_reconcile_seconds"] = 2.0
        result["dispatch_goal_met"] = result["dispatch_jobs_per_second"] >= 200
        result["reconcile_goal_met"] = max(result["reconcile_pass_seconds"]) < 2.0
    finally:
        stop_emulators(emulator, parent)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
