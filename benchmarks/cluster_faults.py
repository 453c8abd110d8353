"""Soak of cluster truth: jobs run to their end while a random fault hits 5 % of every call to the clusters.

``--jobs`` jobs (default 200) of one team run on ``--clusters`` emulated clusters (default 3, each 4 nodes x 8
H100; ``tests/support/kubernetes.ClusterEmulator``: Job and Deployment controllers, pod GPU-second counting),
each of which answers ``--fault-rate`` (default 0.05) of all calls, whatever they are (LIST, GET, create,
delete), with a random fault: 404, 410, 429, 500, 503, a timeout, a truncated or an empty answer. Training
jobs (1-2 nodes x 1-4 GPUs) run for 1-3 s and succeed; inference jobs (1-3 replicas x 1-2 GPUs) are cancelled
after 1-3 s of serving; every ``--disrupt-every`` seconds (default 2) a random running pod is evicted or deleted
directly, which its job must survive (``max_retries`` 3). The control plane's own code does the work, in this
process: scheduling passes, ``jobs.lifecycle.dispatch`` (a transient failure is retried on the next round, as the
dispatch task would), ``jobs.reconcile.reconcile_all`` and, every ``--accrue-every`` seconds (default 60, as
``ACCRUAL_INTERVAL_SECONDS``), the ledger's accrual of live attempts, in a loop; the broker is
Celery's in-memory transport (tasks are published and never consumed: the loop calls what they would).

At the end (every job final, or ``--max-seconds``), faults stop and reconcile runs until no ended attempt has
objects left, then the ledger accrues to the end. Results:

- ``jobs_lost``: training jobs not SUCCEEDED plus inference jobs not CANCELLED; ``jobs_stuck``: jobs not final;
- ``duplicated_objects``: pods of a job alive at once beyond its nodes x replicas (the job running twice);
- ``healthy_objects_deleted``: DELETEs the platform sent for objects of an attempt that was neither ended nor
  being cancelled at that moment;
- ``unbilled_pod_gpu_seconds`` / ``overbilled_pod_gpu_seconds``: per attempt, the emulator's own count of pod
  GPU-seconds less the ledger's (its entries' GPUs x their intervals), summed where positive / negative; and
  ``max_attempt_billing_error_seconds``, the largest difference of one attempt in seconds of its pods' time
  (GPU-seconds over its GPUs). Goals: 0 lost, stuck, duplicated and healthy deleted, and billing to the second
  (every attempt's difference under 1 s). Where a DELETE was carried out but its answer was lost (a client
  timeout), the platform cannot know when the pods stopped and bills until it learns they are gone.
- CPU milliseconds of this process (platform and emulators together) per job, and the same for a fault-free
  run of ``--baseline-jobs`` jobs (default 40) in the same run: ``cpu_ms_per_job_over_fault_free`` is the price
  of the faults.

Run: ``.venv/bin/python benchmarks/cluster_faults.py`` (a few minutes on 2 cores). The database is
``BENCH_DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/cp_bench_cluster_faults``), dropped and
recreated per run. Ends with one JSON line; times in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.services import postgres_missing, require  # noqa: E402

NODES_PER_CLUSTER, GPUS_PER_NODE = 4, 8
H100_LABEL = "NVIDIA-H100-80GB-HBM3"


def configure(database_url: str) -> None:
    """The environment of the control plane in this process: the benchmark database, the in-memory broker, short
    client timeouts (an injected timeout costs 0.5 s), a short dispatch deadline, a cluster never declared lost."""
    os.environ.update({
        "DATABASE_URL": database_url, "CELERY_BROKER_URL": "memory://", "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "K8S_CONNECT_TIMEOUT_SECONDS": "0.5", "K8S_READ_TIMEOUT_SECONDS": "0.5", "K8S_QPS": "100000",
        "K8S_BURST": "100000", "DISPATCH_DEADLINE_SECONDS": "5", "CLUSTER_LOST_GRACE_SECONDS": "100000",
        "K8S_IMAGE_PULL_GRACE_SECONDS": "120", "LOG_LEVEL": "ERROR",
    })


def recreate_database(url: str) -> None:
    import subprocess

    import psycopg

    admin_url, dbname = url.rsplit("/", 1)
    with psycopg.connect((admin_url + "/postgres").replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=os.environ, check=True)


class Soak:
    """One soak: clusters, a team, jobs, the loop and the accounting (see the module docstring)."""

    def __init__(self, jobs: int, clusters: int, fault_rate: float, seed: int, disrupt_every: float,
                 accrue_every: float):
        from tests.support.kubernetes import ClusterEmulator

        self.rng = random.Random(seed)
        self.jobs, self.fault_rate, self.disrupt_every, self.accrue_every = jobs, fault_rate, disrupt_every, accrue_every
        self.lifetimes: dict[str, float] = {}  # job id (label value) -> seconds its training pods run
        self.serve_for: dict[int, float] = {}  # inference job id -> seconds of serving before its cancel
        self.emulators = {f"soak-{i}": ClusterEmulator(f"soak-{i}", lifetime=self._lifetime) for i in range(clusters)}
        self.disruptions = 0

    def _lifetime(self, pod: dict) -> float | None:
        return self.lifetimes.get((pod["metadata"].get("labels") or {}).get("controlplane.io/job"))

    def seed_rows(self) -> None:
        from decimal import Decimal

        from django.contrib.auth import get_user_model

        from costs.models import Price
        from costs.seed import seed_accelerators, seed_prices
        from jobs.lifecycle import store_submitted_job
        from quotas.models import Quota, Team
        from runners.models import Accelerator, Cluster, NodePool

        seed_accelerators()
        seed_prices()
        h100 = Accelerator.objects.get(name="H100-80GB")
        team = Team.objects.create(slug="soak", name="Soak")
        user = get_user_model().objects.create_user(username="soak", password="x")
        Quota.objects.create(team=team, accelerator=h100, nominal_gpus=NODES_PER_CLUSTER * GPUS_PER_NODE * len(self.emulators))
        for i, (name, emulator) in enumerate(self.emulators.items()):
            emulator.start()
            for n in range(NODES_PER_CLUSTER):
                emulator.add_node(f"{name}-n{n}", GPUS_PER_NODE, {"nvidia.com/gpu.product": H100_LABEL})
            cluster = Cluster.objects.create(name=name, provider="aws", region="us-east-1", backend="kubernetes",
                                             api_endpoint=emulator.url, api_token="soak")
            NodePool.objects.create(cluster=cluster, name="h100", accelerator=h100, nodes=NODES_PER_CLUSTER,
                                    gpus_per_node=GPUS_PER_NODE)
            Price.objects.create(provider="aws", region="us-east-1", accelerator=h100, capacity_type="on-demand",
                                 cluster=cluster, usd_per_gpu_hour=Decimal("2.00") + i,
                                 effective_from="2020-01-01T00:00:00Z")
        for i in range(self.jobs):
            inference = self.rng.random() < 0.2
            gpus = self.rng.choice([1, 2]) if inference else self.rng.choice([1, 2, 4])
            nodes = 1 if inference else self.rng.choice([1, 1, 2])
            replicas = self.rng.choice([1, 2, 3]) if inference else 1
            spec = {"image": "registry.example/soak:1", "command": ["python", "work.py"], "args": [], "env": {},
                    "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes},
                    "priority": "normal", "max_runtime_seconds": 3600, "preemptible": False, "placement": {},
                    "max_retries": 3}
            if inference:
                spec.update(replicas=replicas, port=8000)
            job = store_submitted_job(
                team=team, submitter=user, name=f"soak-{i}", kind="inference" if inference else "training", spec=spec,
                resources={"accelerator": h100, "gpus_per_node": gpus, "nodes": nodes, "priority": 500,
                           "preemptible": False, "max_runtime_seconds": 3600, "max_retries": 3, "replicas": replicas})
            if inference:
                self.serve_for[job.pk] = self.rng.uniform(1, 3)
            else:
                self.lifetimes[str(job.pk)] = self.rng.uniform(1, 3)

    def run(self, max_seconds: float) -> float:
        """The loop until every job is final or ``max_seconds``; returns its duration."""
        from django.utils import timezone

        from costs.ledger import accrue_running
        from jobs.lifecycle import NotCancellable, cancel_job, dispatch
        from jobs.models import FINAL_STATES, Job, JobAttempt, JobState
        from jobs.reconcile import reconcile_all
        from jobs.scheduling.passes import schedule_pending
        from jobs.states import StaleState
        from runners.base import TransientDispatchError

        for i, emulator in enumerate(self.emulators.values()):
            emulator.random_faults(self.fault_rate, seed=self.rng.randrange(1 << 30) + i, delay=0.6)
        tickers = [e.ticking(0.05) for e in self.emulators.values()]
        started = time.monotonic()
        next_disruption = started + self.disrupt_every
        next_accrual = started + self.accrue_every
        try:
            while time.monotonic() - started < max_seconds:
                if not Job.objects.exclude(state__in=FINAL_STATES).exists():
                    break
                schedule_pending()
                for attempt_id in JobAttempt.objects.filter(job__state=JobState.ADMITTED, ended_at__isnull=True,
                                                            started_at__isnull=True).values_list("pk", flat=True):
                    try:
                        dispatch(attempt_id)
                    except TransientDispatchError:
                        pass  # the dispatch task retries with backoff; here the next round does
                reconcile_all()
                now = timezone.now()
                for job in Job.objects.filter(kind="inference", state=JobState.RUNNING, started_at__isnull=False):
                    if (now - job.started_at).total_seconds() >= self.serve_for[job.pk]:
                        try:
                            cancel_job(job)
                        except (NotCancellable, StaleState):
                            pass
                if time.monotonic() >= next_disruption:
                    self._disrupt()
                    next_disruption += self.disrupt_every
                if time.monotonic() >= next_accrual:
                    accrue_running()
                    next_accrual += self.accrue_every
                time.sleep(0.02)
        finally:
            for ticker in tickers:
                ticker.stop()
        return time.monotonic() - started

    def _disrupt(self) -> None:
        """Evict or directly delete one random running pod (a drain, an operator's kubectl)."""
        emulator = self.rng.choice(list(self.emulators.values()))
        running = [p for p in emulator.pods() if p["status"].get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]
        if not running:
            return
        pod = self.rng.choice(running)["metadata"]["name"]
        (emulator.evict if self.rng.random() < 0.5 else emulator.delete_pod)(pod)
        self.disruptions += 1

    def drain(self) -> None:
        """Faults off; reconcile until no ended attempt has objects left and Terminating pods are gone; accrue."""
        from costs.ledger import accrue_running
        from jobs.reconcile import reconcile_all

        for emulator in self.emulators.values():
            emulator.random_faults(0.0)
        for _ in range(50):
            for emulator in self.emulators.values():
                emulator.step()
            reconcile_all()
            if not any(e.objects("Job") or e.objects("Deployment") or e.pods() for e in self.emulators.values()):
                break
            time.sleep(0.05)
        accrue_running()

    def results(self) -> dict:
        from costs.models import CostEntry
        from jobs.models import FINAL_STATES, Job, JobAttempt, JobEvent, JobState

        jobs = list(Job.objects.all())
        lost = sum(1 for j in jobs if j.state in FINAL_STATES and j.state != (
            JobState.CANCELLED if j.kind == "inference" else JobState.SUCCEEDED))
        stuck = sum(1 for j in jobs if j.state not in FINAL_STATES)
        attempts = {a.pk: a for a in JobAttempt.objects.select_related("job")}
        ledger: dict[int, Decimal] = defaultdict(Decimal)
        for attempt_id, milli, start, end in CostEntry.objects.values_list("attempt_id", "gpu_milli", "interval_start",
                                                                           "interval_end"):
            ledger[attempt_id] += Decimal(milli) / 1000 * Decimal(str((end - start).total_seconds()))
        counted: dict[int, float] = defaultdict(float)
        pods_of_job: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
        deletions = []
        for emulator in self.emulators.values():
            for gpus, labels, created, stopped in emulator.pod_times.values():
                attempt_id = int(labels["controlplane.io/attempt"])
                counted[attempt_id] += gpus * ((stopped or time.time()) - created)
                pods_of_job[int(labels["controlplane.io/job"])].append((created, stopped))
            deletions += emulator.deletions
        errors = {a: Decimal(str(counted.get(a, 0.0))) - ledger.get(a, Decimal(0)) for a in attempts}
        unbilled = sum((e for e in errors.values() if e > 0), Decimal(0))
        overbilled = -sum((e for e in errors.values() if e < 0), Decimal(0))
        duplicated = 0
        for job in jobs:
            allowed = job.nodes * job.replicas
            edges = sorted([(c, 1) for c, s in pods_of_job[job.pk]] + [(s or time.time(), -1) for c, s in pods_of_job[job.pk]],
                           key=lambda e: (e[0], e[1]))
            alive = 0
            for _, step in edges:
                alive += step
                duplicated = max(duplicated, alive - allowed) if alive > allowed else duplicated
        ends = {}
        for attempt_id, at in JobEvent.objects.filter(
                to_state__in=[JobState.RECOVERING, JobState.FAILED, JobState.SUCCEEDED, JobState.CANCELLED,
                              JobState.CANCELLING], attempt__isnull=False).values_list("attempt_id", "created_at"):
            ends[attempt_id] = min(ends.get(attempt_id, at), at)
        cancelling = dict(JobEvent.objects.filter(to_state=JobState.CANCELLING).values_list("job_id", "created_at"))
        healthy_deleted = 0
        for at, _kind, _name, labels in deletions:
            attempt = attempts.get(int(labels.get("controlplane.io/attempt", 0)))
            if attempt is None:
                continue
            ended = ends.get(attempt.pk)
            cancel = cancelling.get(attempt.job_id)
            legit = (ended is not None and ended.timestamp() <= at) or (cancel is not None and cancel.timestamp() <= at)
            healthy_deleted += 0 if legit else 1
        return {"jobs": len(jobs), "attempts": len(attempts), "jobs_lost": lost, "jobs_stuck": stuck,
                "duplicated_objects": duplicated, "healthy_objects_deleted": healthy_deleted,
                "unbilled_pod_gpu_seconds": round(float(unbilled), 3),
                "overbilled_pod_gpu_seconds": round(float(overbilled), 3),
                "max_attempt_billing_error_seconds": round(float(max(
                    (abs(e) / max(attempts[a].gpus, 1) for a, e in errors.items()), default=Decimal(0))), 3),
                "pod_gpu_seconds": round(sum(counted.values()), 3),
                "worst_billed_attempts": [
                    {"attempt": a, "end_reason": attempts[a].end_reason, "kind": attempts[a].job.kind,
                     "cluster_gpu_seconds": round(counted.get(a, 0.0), 3), "ledger_gpu_seconds": round(float(ledger.get(a, 0)), 3),
                     "deletions": [(round(t % 1000, 3), k) for t, k, _, lb in deletions
                                   if lb.get("controlplane.io/attempt") == str(a)],
                     "pods_stopped": [round(s % 1000, 3) if s else None for e in self.emulators.values()
                                      for g, lb, c, s in e.pod_times.values() if lb.get("controlplane.io/attempt") == str(a)],
                     "billed": [round(attempts[a].started_at.timestamp() % 1000, 3) if attempts[a].started_at else None,
                                round(attempts[a].ended_at.timestamp() % 1000, 3) if attempts[a].ended_at else None]}
                    for a in sorted(errors, key=lambda a: -abs(errors[a]))[:3] if abs(errors[a]) >= 1],
                "faults_injected": sum(e.faults_injected for e in self.emulators.values()),
                "calls": sum(len(e.requests) for e in self.emulators.values()),
                "disruptions": self.disruptions,
                "end_reasons": dict(sorted(_count(a.end_reason for a in attempts.values()).items()))}

    def stop(self) -> None:
        for emulator in self.emulators.values():
            emulator.stop()


def _count(values) -> dict:
    out: dict = defaultdict(int)
    for v in values:
        out[v or "(live)"] += 1
    return out


def soak(args, jobs: int, fault_rate: float) -> dict:
    """One soak on a fresh database: its results with its CPU milliseconds per job."""
    import django
    from django.db import connections

    recreate_database(os.environ["DATABASE_URL"])
    django.setup()
    from core.lookups import clear_all

    clear_all()
    run = Soak(jobs, args.clusters, fault_rate, args.seed, args.disrupt_every, args.accrue_every)
    try:
        run.seed_rows()
        cpu = time.process_time()
        seconds = run.run(args.max_seconds)
        run.drain()
        cpu = time.process_time() - cpu
        result = run.results()
    finally:
        run.stop()
        connections.close_all()
    result.update(seconds=round(seconds, 1), cpu_ms_per_job=round(1000 * cpu / max(jobs, 1), 1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--baseline-jobs", type=int, default=40, help="jobs of the fault-free run (0: none)")
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--fault-rate", type=float, default=0.05)
    parser.add_argument("--disrupt-every", type=float, default=2.0)
    parser.add_argument("--accrue-every", type=float, default=60.0,
                        help="seconds between accruals of live attempts (ACCRUAL_INTERVAL_SECONDS' default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cp_bench_cluster_faults")
    require("cluster_faults", [postgres_missing(url)])
    configure(url)
    result = {"benchmark": "cluster_faults", "fault_rate": args.fault_rate, **soak(args, args.jobs, args.fault_rate)}
    if args.baseline_jobs:
        base = soak(args, args.baseline_jobs, 0.0)
        result["fault_free"] = {k: base[k] for k in ("jobs", "jobs_lost", "jobs_stuck", "duplicated_objects",
                                                     "healthy_objects_deleted", "unbilled_pod_gpu_seconds",
                                                     "overbilled_pod_gpu_seconds", "seconds", "cpu_ms_per_job")}
        result["cpu_ms_per_job_over_fault_free"] = round(result["cpu_ms_per_job"] / max(base["cpu_ms_per_job"], 1e-9), 2)
    result["goals_met"] = (result["jobs_lost"] == result["jobs_stuck"] == result["duplicated_objects"]
                           == result["healthy_objects_deleted"] == 0
                           and result["max_attempt_billing_error_seconds"] < 1)
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))
    return 0 if result["goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
