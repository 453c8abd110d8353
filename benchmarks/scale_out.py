"""Reconcile scale-out: full reconcile rounds over many running attempts, run by 1, 2 and 4 real Celery workers.

Run: ``.venv/bin/python benchmarks/scale_out.py`` (``--attempts``, default 50,000 RUNNING attempts; ``--clusters``,
default 16 emulated Kubernetes clusters holding them, as evenly as they divide; ``--workers``, default ``1,2,4``
worker processes; ``--rounds``, default 3 steady rounds per worker count). On the 2-core machine of
benchmarks/README.md the default run took 3 min 45 s at load 8 (about 1 minute of it the database's migration and
the seeding); a small run (``--attempts 2000 --clusters 4 --workers 1,2``) still takes about 2 minutes, most of
it the migration.

Fixture (``benchmarks/dispatch.py``'s): one team, ``--attempts`` RUNNING jobs with one attempt each, spread over
``--clusters`` clusters, each served by a kmock emulator (``tests/support/kubernetes.py``) in one child process,
pre-filled with one batch/v1 Job and one Running pod per attempt. The database is ``BENCH_DATABASE_URL``
(default ``postgres://postgres@127.0.0.1:5432/cp_bench_scale_out``, dropped and recreated per run), the broker
``BENCH_BROKER_URL`` (default ``redis://127.0.0.1:6379/12``). ``K8S_QPS``/``K8S_BURST`` are raised as in
``dispatch.py``: the emulators answer at once, and the benchmark measures the platform, not the limiter.

For each worker count N: N ``celery worker`` processes on the fast queue (``-P prefork -c 1`` each, as the
deployments run their pool, ``-A benchmarks.scale_out_worker``: the product's app plus a record of each
finished ``reconcile_cluster`` task), then rounds. A round is what beat starts every
``RECONCILE_INTERVAL_SECONDS`` (docs/adr/0042): ``jobs.tasks.reconcile_all`` published, which publishes one
``jobs.tasks.reconcile_cluster`` per cluster, each run under its cluster's lease by whichever worker takes it;
the round ends when every cluster's task has finished. Its wall time runs from the publish to the last task's
end. The first round of each N is a full round (every cluster's watch state cleared first, so each LISTs
everything, as at first contact and every ``RECONCILE_FULL_LIST_SECONDS``); the ``--rounds`` after it are steady
rounds (each cluster resumes its watches from the versions kept, nothing changes in between).

Figures (CPU read from ``/proc`` as ``benchmarks/procstat.py`` does; each process apart):

- ``reconcile_cpu_us_per_attempt``: per worker count, CPU microseconds per running attempt and steady round
  of the workers (each worker's process tree), PostgreSQL (the backends of the benchmark's database), Redis
  (the whole server), the emulators (the clusters' API servers, not the platform's), ``platform`` (workers +
  PostgreSQL + Redis) and ``total``; ``full_list_cpu_us_per_attempt`` the same for the full round;
  ``averaged_cpu_us_per_attempt``: the platform's per round with one full round in
  ``RECONCILE_FULL_LIST_SECONDS / RECONCILE_INTERVAL_SECONDS`` (``full_round_every``).
- ``worker_share``: per worker count and worker, over all its rounds: the clusters and attempts (the running
  attempts of the clusters it took) it reconciled, its share of them, and its CPU seconds and share of the
  workers' CPU; ``max_attempt_share`` per worker count.
- ``round_wall_s``: per worker count, the steady rounds' wall times; ``full_round_wall_s`` the full round's;
  ``fits_interval``: whether the slowest steady round ended inside ``reconcile_interval_s``, and
  ``full_round_fits_interval`` the same for the full round. Wall times move with the machine's load
  (``cpus``, ``loadavg``); the CPU per attempt hardly does.

The emulators answer a watch at once; a real API server holds it open for its ``timeoutSeconds``
(``K8S_WATCH_SECONDS``, 1 s) when nothing changes, so on real clusters a steady pass of one cluster lasts about
that long whatever its CPU, and one worker process finishes at most ``RECONCILE_INTERVAL_SECONDS /
K8S_WATCH_SECONDS`` clusters per round (docs/capacity.md). A missing PostgreSQL or Redis ends the run with
status 3 and a ``missing`` JSON line. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for the project's modules

from benchmarks.dispatch import (  # noqa: E402
    DISPATCH_CLUSTER,
    bench_env,
    database_backends,
    read_servers,
    recreate_database,
    seed,
    servers_used,
    start_emulators,
    start_workers,
    stop_emulators,
    stop_workers,
)
from benchmarks.procstat import cpu_seconds, machine, tree_cpu_seconds  # noqa: E402

PLATFORM = ("workers", "postgres", "redis-server")


# --- arithmetic (pure; tests/benchmarks/test_scale_out_figures.py) ---------------------------------------------


def us_per_attempt(cpu_s: dict[str, float | None], attempts: int, rounds: int) -> dict[str, float | None]:
    """CPU seconds by process over ``rounds`` rounds -> microseconds per attempt and round, each process apart,
    plus ``platform`` (the sum of ``PLATFORM``'s: workers, PostgreSQL, Redis) and ``total`` (every process).
    A process read as None (not on this machine) stays None, and so does any sum that needs it; no attempts or
    no rounds give None throughout."""
    per = {key: None if value is None or not attempts or not rounds else round(1e6 * value / attempts / rounds, 2)
           for key, value in cpu_s.items()}

    def summed(keys) -> float | None:
        values = [per.get(key) for key in keys]
        return None if not values or None in values else round(sum(values), 2)

    return {**per, "platform": summed([k for k in PLATFORM if k in cpu_s]), "total": summed(list(cpu_s))}


def worker_shares(taken: list[tuple[str, int]], attempts_by_cluster: dict[int, int],
                  worker_cpu_s: dict[str, float]) -> dict[str, dict]:
    """Who did the work: ``taken`` is one ``(worker name, cluster id)`` per finished cluster pass, of any number
    of rounds; ``attempts_by_cluster`` the running attempts of each cluster; ``worker_cpu_s`` each worker's CPU
    seconds over the same rounds (a worker that took nothing still appears). Returns, per worker, ``clusters``
    (passes taken), ``attempts`` (the running attempts of those passes' clusters), ``attempt_share`` (of all
    passes' attempts, 0-1), ``cpu_s`` and ``cpu_share`` (of the workers' CPU, 0-1). Raises KeyError for a
    cluster not in ``attempts_by_cluster``."""
    names = sorted(set(worker_cpu_s) | {worker for worker, _ in taken})
    clusters = dict.fromkeys(names, 0)
    attempts = dict.fromkeys(names, 0)
    for worker, cluster_id in taken:
        clusters[worker] += 1
        attempts[worker] += attempts_by_cluster[cluster_id]
    all_attempts, all_cpu = sum(attempts.values()), sum(worker_cpu_s.values())
    return {name: {"clusters": clusters[name], "attempts": attempts[name],
                   "attempt_share": round(attempts[name] / all_attempts, 3) if all_attempts else None,
                   "cpu_s": round(worker_cpu_s.get(name, 0.0), 2),
                   "cpu_share": round(worker_cpu_s.get(name, 0.0) / all_cpu, 3) if all_cpu else None}
            for name in names}


def averaged(steady: float | None, full: float | None, full_every: int) -> float | None:
    """CPU per attempt and round averaged over ``full_every`` rounds of which one is full and the rest steady:
    ``(full + (full_every - 1) * steady) / full_every``; None when either is. ``full_every`` >= 1."""
    if steady is None or full is None:
        return None
    return round((full + (full_every - 1) * steady) / full_every, 2)


# --- workers and rounds --------------------------------------------------------------------------------------


def one_round(env: dict, workers: list[subprocess.Popen], names: dict[int, str], cluster_ids: list[int],
              emulator_pid: int, timeout: float) -> dict:
    """Publish ``jobs.tasks.reconcile_all`` and wait until every cluster of ``cluster_ids`` has had its
    ``reconcile_cluster`` task finish; the round's wall seconds, CPU seconds by process, and the passes."""
    import redis

    from benchmarks.scale_out_worker import DONE_KEY
    from jobs.tasks import reconcile_all

    broker = redis.Redis.from_url(env["CELERY_BROKER_URL"])
    broker.delete(DONE_KEY)
    backends = database_backends(env)
    servers_before = read_servers(backends)
    workers_before = {names[w.pid]: tree_cpu_seconds(w.pid) for w in workers}
    emulator_before = cpu_seconds(emulator_pid)
    started = time.monotonic()
    reconcile_all.delay()
    passes: list[dict] = []
    while len({p["cluster_id"] for p in passes if not p["skipped"]}) < len(cluster_ids):
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"a round did not end in {timeout:.0f} s ({len(passes)} passes)")
        item = broker.blpop([DONE_KEY], timeout=1)
        if item is not None:
            passes.append(json.loads(item[1]))
    wall = time.monotonic() - started
    workers_after = {names[w.pid]: tree_cpu_seconds(w.pid) for w in workers}
    emulator_after = cpu_seconds(emulator_pid)
    servers = servers_used(backends, servers_before, read_servers(backends))
    backends.close()
    broker.close()
    worker_cpu = {name: workers_after[name] - workers_before[name] for name in workers_after}
    return {"wall_s": wall, "worker_cpu_s": worker_cpu, "passes": passes,
            "cpu_s": {"workers": sum(worker_cpu.values()),
                      "emulator": None if None in (emulator_before, emulator_after)
                      else emulator_after - emulator_before, **servers}}


def run_worker_count(env: dict, count: int, rounds: int, cluster_ids: list[int], attempts_by_cluster: dict[int, int],
                     emulator_pid: int, timeout: float) -> dict:
    """One full round then ``rounds`` steady rounds with ``count`` workers; the figures of that worker count."""
    from runners.models import Cluster

    workers = start_workers(env, count, app="benchmarks.scale_out_worker", pool="prefork", prefix="scale")
    try:
        names = {w.pid: f"scale{i}" for i, w in enumerate(workers)}
        Cluster.objects.filter(pk__in=cluster_ids).update(reconcile_watch={})  # next look LISTs everything
        full = one_round(env, workers, names, cluster_ids, emulator_pid, timeout)
        steady = [one_round(env, workers, names, cluster_ids, emulator_pid, timeout) for _ in range(rounds)]
    finally:
        stop_workers(workers)
    attempts = sum(attempts_by_cluster.values())
    steady_cpu = {key: None if any(r["cpu_s"][key] is None for r in steady) else sum(r["cpu_s"][key] for r in steady)
                  for key in full["cpu_s"]}
    every = [*steady, full]
    worker_cpu = {name: sum(r["worker_cpu_s"][name] for r in every) for name in names.values()}
    taken = [(p["worker"].split("@")[0], p["cluster_id"]) for r in every for p in r["passes"] if not p["skipped"]]
    return {"full_cpu_us": us_per_attempt(full["cpu_s"], attempts, 1),
            "steady_cpu_us": us_per_attempt(steady_cpu, attempts, rounds),
            "shares": worker_shares(taken, attempts_by_cluster, worker_cpu),
            "full_wall_s": round(full["wall_s"], 3), "steady_wall_s": [round(r["wall_s"], 3) for r in steady],
            "full_lists": sum(p["full_list"] for p in full["passes"]),
            "steady_full_lists": sum(p["full_list"] for r in steady for p in r["passes"]),
            "errors": sum(p["error"] for r in every for p in r["passes"]),
            "skipped": sum(p["skipped"] for r in every for p in r["passes"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attempts", type=int, default=50000, help="running attempts (default 50,000)")
    parser.add_argument("--clusters", type=int, default=16, help="clusters holding them (default 16)")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts, comma-separated (default 1,2,4)")
    parser.add_argument("--rounds", type=int, default=3, help="steady rounds per worker count (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one round may take (default 300)")
    args = parser.parse_args()
    counts = [int(c) for c in args.workers.split(",") if c.strip()]
    if not counts or min(counts) < 1 or args.rounds < 1 or args.clusters < 1 or args.attempts < args.clusters:
        parser.error("--workers, --rounds and --clusters must be at least 1, --attempts at least --clusters")

    env = bench_env("scale_out", "cp_bench_scale_out", 12)
    started = time.monotonic()
    recreate_database(env)
    os.environ.update(env)

    names = [f"scale-{i:02d}" for i in range(args.clusters)]
    emulator, parent, urls = start_emulators([DISPATCH_CLUSTER, *names])
    try:
        import django

        django.setup()
        from django.conf import settings

        from controlplane.celery import app
        from runners.models import Cluster

        _, running = seed(urls, 0, args.attempts, names)
        Cluster.objects.filter(name=DISPATCH_CLUSTER).delete()  # seed's dispatch cluster: no attempts here
        parent.send(("prefill", running))
        parent.recv()
        ids = dict(Cluster.objects.filter(name__in=names).values_list("name", "pk"))
        attempts_by_cluster = {ids[name]: len(rows) for name, rows in running.items()}
        app.control.purge()
        seeded_s = time.monotonic() - started

        interval = float(settings.CELERY_BEAT_SCHEDULE["reconcile"]["schedule"])
        full_every = max(1, round(float(settings.RECONCILE_FULL_LIST_SECONDS) / interval))
        runs = {str(n): run_worker_count(env, n, args.rounds, list(attempts_by_cluster), attempts_by_cluster,
                                         emulator.pid, args.timeout) for n in counts}
    finally:
        stop_emulators(emulator, parent)
    result = {
        "benchmark": "scale_out", "attempts": args.attempts, "clusters": args.clusters, "workers": counts,
        "worker_pool": "prefork x1", "rounds": args.rounds, "reconcile_interval_s": interval,
        "full_round_every": full_every,
        "reconcile_cpu_us_per_attempt": {n: r["steady_cpu_us"] for n, r in runs.items()},
        "full_list_cpu_us_per_attempt": {n: r["full_cpu_us"] for n, r in runs.items()},
        "averaged_cpu_us_per_attempt": {n: averaged(r["steady_cpu_us"]["platform"], r["full_cpu_us"]["platform"],
                                                    full_every) for n, r in runs.items()},
        "worker_share": {n: r["shares"] for n, r in runs.items()},
        "max_attempt_share": {n: max(s["attempt_share"] or 0 for s in r["shares"].values()) for n, r in runs.items()},
        "round_wall_s": {n: r["steady_wall_s"] for n, r in runs.items()},
        "full_round_wall_s": {n: r["full_wall_s"] for n, r in runs.items()},
        "fits_interval": {n: max(r["steady_wall_s"]) < interval for n, r in runs.items()},
        "full_round_fits_interval": {n: r["full_wall_s"] < interval for n, r in runs.items()},
        "full_lists": {n: r["full_lists"] for n, r in runs.items()},
        "steady_full_lists": {n: r["steady_full_lists"] for n, r in runs.items()},
        "pass_errors": {n: r["errors"] for n, r in runs.items()},
        "passes_skipped": {n: r["skipped"] for n, r in runs.items()},
        "seed_s": round(seeded_s, 1), "seconds": round(time.monotonic() - started, 1), **machine()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
