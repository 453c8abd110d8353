"""Autoscaled serving under a load that steps up and down: scale-up and scale-down times, latency, failed requests
while a replica is killed, and GPU-hours per million requests against a fixed deployment sized for the peak.

The demo's served model (``examples/serve.py`` over a one-step checkpoint of ``examples/train_gpt.py``, as the demo
serves it) runs as a serving job on the local runner, behind its endpoint (``runners/local/endpoint.py``), with
emulated GPUs (one per replica). The control plane's own code does the work in this process, as
``cluster_faults.py`` does: admission (``try_admit``), dispatch, reconcile until RUNNING, then the autoscaling pass
(``serving.autoscaler.autoscale``, which also keeps the figures' samples) every ``--interval`` seconds (default 2,
for the 15 s of ``AUTOSCALE_INTERVAL_SECONDS``) in a thread, the cluster's last contact moved with it, and the
ledger's accrual (``accrue_attempt``) at each phase's end. The database is PostgreSQL ``BENCH_DATABASE_URL``
(default ``cp_bench_serving``), dropped and recreated per run; Celery's in-memory broker.

Load: per service, an open loop on 127.0.0.1: ``POST /generate`` (``max_new_tokens`` 8, greedy, an
``Idempotency-Key``, as a client that may be retried) sent at a set rate by at most 16 client threads (a request
due while all are busy waits, and its latency counts from when it was due), stepped ``--low-rps`` (default 1.5)
-> ``--high-rps`` (default 6) -> low. The same offered requests to both services, so that GPU-hours per request
compare the replicas each held, whatever the machine's load does to the requests' speed.

1. Two services side by side, each under its own load stepped together: an autoscaled one (``min_replicas`` 1,
   ``max_replicas`` 3, ``target_rps_per_replica`` 2, scale-up delay 0, scale-down delay ``--down-delay``,
   default 8 s) and a fixed deployment of 3 replicas (the peak). ``--low-seconds`` (default 15) at the low rate;
   at the high rate until the autoscaled endpoint has 3 ready replicas (``scale_up_seconds``, from the step up),
   then ``--hold-seconds`` more (default 8); at the low rate until the autoscaled job is back at 1 replica and its
   endpoint lists only it (``scale_down_seconds``, from the step down; it includes the delay), then
   ``--low-seconds`` more. A service that follows its load saves in the low phases what the peak-sized one
   holds idle, and pays for the time its replicas take to start: the low phases are long beside the
   transitions, as a day's trough is long beside a scale-up.
2. ``failed_requests_replica_loss``: the fixed deployment at the high rate for 4 s, one replica SIGKILLed, 6 s
   more; a request that did not answer 200 failed.
3. ``failed_requests_rolling_update``: the low rate while the autoscaled service is rolled to another training
   job's checkpoint (``serving.rollout.start_rollout``, stepped by the passes as the serving task steps it);
   ``rolling_update`` holds its requests, end state (``done``) and seconds.

Figures: ``gpu_hours_per_million_requests`` of each (the ledger's GPU-seconds of the job over its load phases,
over the requests answered 200 then) and ``gpu_hours_per_million_requests_ratio_vs_fixed`` (autoscaled over fixed,
same load, same run: below 1 is the goal); client-side ``latency_ms`` p50/p99 of each, and the product's own
figures of the autoscaled service over its load (``jobs.serving_figures.service_figures``: requests, percentiles by
histogram_quantile, replicas over time); ``proxy_cpu_ms_per_request`` (the endpoint process's user + system CPU over
the requests it served, from /proc); ``replicas_seen`` (the counts the autoscaled job went through). Wall times
depend on the machine's load: read them with ``loadavg``.

Run: ``.venv/bin/python benchmarks/serving.py`` (about 3 minutes on 2 busy cores); ``--quick`` for the short
phases ``tests/benchmarks/test_serving.py`` runs. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cluster_faults import recreate_database  # noqa: E402
from benchmarks.procstat import cpu_seconds, machine  # noqa: E402
from benchmarks.services import postgres_missing, require  # noqa: E402

PROMPT = {"prompt": "To be, or not", "max_new_tokens": 8, "temperature": 0}
SCALING = {"min_replicas": 1, "max_replicas": 3, "target_rps_per_replica": 2, "scale_up_delay_seconds": 0}
#: Client threads per service at most: requests due beyond them wait.
CONCURRENCY = 16


def configure(database_url: str, run_dir: Path) -> None:
    """The control plane's environment in this process: the benchmark database, the in-memory broker, the local
    runner under ``run_dir`` with 2 emulated nodes of 8 GPUs, a short kill grace."""
    os.environ.update({
        "DATABASE_URL": database_url, "CELERY_BROKER_URL": "memory://", "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "LOCAL_RUNNER_DIR": str(run_dir), "LOCAL_RUNNER_NODES": "2", "LOCAL_RUNNER_EMULATED_GPUS": "16",
        "LOCAL_RUNNER_KILL_GRACE_SECONDS": "1", "LOG_LEVEL": "ERROR",
    })


def train_checkpoint(directory: Path) -> None:
    """A one-step checkpoint of the demo's model in ``directory`` (what serving needs)."""
    env = {k: v for k, v in os.environ.items() if k not in {"CHECKPOINT_DIR", "CHECKPOINT_URI", "PORT"}}
    subprocess.run([sys.executable, "examples/train_gpt.py", "--steps", "1", "--batch-size", "8", "--log-every", "1",
                    "--checkpoint-dir", str(directory)], cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, check=True,
                   capture_output=True, timeout=300)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` (0..1) quantile of ``values`` by nearest rank; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


class Load:
    """An open loop against ``endpoint``: ``POST /generate`` sent at ``rate`` requests per second (0: none), each by
    one of at most ``concurrency`` client threads (a request waits for a free one: the latency counts from when
    it was due). Every answer kept as ``(due monotonic, seconds, status)`` (status 0: no answer)."""

    def __init__(self, endpoint: str, concurrency: int):
        self.endpoint, self.rate, self.answers = endpoint, 0.0, []
        self.lock, self.stopping, self.local = threading.Lock(), threading.Event(), threading.local()
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="client")
        self.pacer = threading.Thread(target=self._pace, daemon=True)
        self.pacer.start()

    def _pace(self) -> None:
        due = time.monotonic()
        while not self.stopping.is_set():
            now = time.monotonic()
            if self.rate <= 0:
                due = now
                time.sleep(0.02)
            elif now < due:
                time.sleep(min(due - now, 0.02))
            else:
                self.pool.submit(self._send, due)
                due += 1 / self.rate

    def _send(self, due: float) -> None:
        import requests

        session = getattr(self.local, "session", None) or requests.Session()
        self.local.session = session
        try:
            status = session.post(f"{self.endpoint}/generate", json=PROMPT, timeout=60,
                                  headers={"Idempotency-Key": uuid.uuid4().hex}).status_code
        except requests.RequestException:
            status = 0
        with self.lock:
            self.answers.append((due, time.monotonic() - due, status))

    def since(self, t0: float, t1: float | None = None) -> list[tuple[float, float, int]]:
        """The answers to requests due within ``[t0, t1)``."""
        with self.lock:
            return [a for a in self.answers if a[0] >= t0 and (t1 is None or a[0] < t1)]

    def stop(self) -> None:
        self.rate = 0
        self.stopping.set()
        self.pacer.join(timeout=10)
        self.pool.shutdown(wait=True)


class Passes(threading.Thread):
    """The serving task's work every ``interval`` seconds: a step of every rolling update, then the autoscaling pass
    (the cluster's last contact moved to now first, as a look would), until stopped; the replica counts the pass
    left kept per job."""

    def __init__(self, interval: float):
        super().__init__(daemon=True)
        self.interval, self.stopping, self.seen = interval, threading.Event(), {}

    def run(self) -> None:
        from django.db import connection
        from django.utils import timezone

        from runners.models import Cluster
        from serving.autoscaler import autoscale
        from serving.rollout import step_rollouts

        try:
            while not self.stopping.wait(self.interval):
                Cluster.objects.update(last_contact_at=timezone.now())
                step_rollouts()  # as the serving task does, before the autoscaling pass
                for result in autoscale():
                    counts = self.seen.setdefault(result["job"], [])
                    if "replicas" in result and (not counts or counts[-1] != result["replicas"]):
                        counts.append(result["replicas"])
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)


class Bench:
    """One run: the team, the local cluster, the checkpoint and the two services (module docstring)."""

    def __init__(self, args):
        from django.contrib.auth import get_user_model

        from costs.seed import seed_accelerators, seed_prices
        from quotas.models import Quota, Team
        from runners.local.capacity import ensure_local_cluster

        self.args = args
        seed_accelerators()
        seed_prices()
        self.cluster = ensure_local_cluster()
        self.pool = self.cluster.node_pools.get(name="gpu")
        self.team = Team.objects.create(slug="serving", name="Serving")
        self.user = get_user_model().objects.create_user(username="bench", password="x")
        Quota.objects.create(team=self.team, accelerator=self.pool.accelerator, nominal_gpus=16)

    def trained(self, checkpoint: Path, count: int) -> list[int]:
        """``count`` SUCCEEDED training jobs of the team, each with a copy of ``checkpoint`` where the local runner
        keeps its checkpoints (what a serving job's ``checkpoint_from`` loads); their ids."""
        from jobs.models import JobState
        from runners.local.runner import checkpoint_dir
        from tests.support.factories import make_job_row

        ids = []
        for i in range(count):
            job = make_job_row(self.team, self.user, self.pool.accelerator, name=f"train-gpt-{i + 1}",
                               state=JobState.SUCCEEDED)
            shutil.copytree(checkpoint, checkpoint_dir(job.pk), dirs_exist_ok=True)
            ids.append(job.pk)
        return ids

    def start(self, name: str, replicas: int, autoscaling: dict | None, checkpoint_from: int):
        """A serving job of ``examples/serve.py`` serving training job ``checkpoint_from``'s checkpoint, admitted,
        dispatched and RUNNING with ``replicas`` ready replicas behind its endpoint; returns its attempt."""
        from jobs.models import JobAttempt, JobState
        from jobs.reconcile import reconcile_cluster
        from jobs.scheduling.passes import try_admit
        from jobs.tasks import dispatch_attempt
        from tests.support.factories import make_job_row

        spec = {"image": "python:3.11", "command": ["python", "examples/serve.py"],
                "args": ["--host", "127.0.0.1"], "env": {"OMP_NUM_THREADS": "1"}, "checkpoint_from": checkpoint_from,
                "resources": {"accelerator": self.pool.accelerator.name, "gpus_per_node": 1, "nodes": 1},
                "replicas": replicas, "port": 8000, "health_path": "/healthz", "autoscaling": autoscaling}
        job = make_job_row(self.team, self.user, self.pool.accelerator, name=name, kind="inference", spec=spec,
                           max_runtime=None, replicas=replicas)
        assert try_admit(job.pk) == "admitted", f"{name} was not admitted"
        job.refresh_from_db()
        assert dispatch_attempt(job.current_attempt_id) == "dispatched"
        deadline = time.monotonic() + 120
        while True:
            reconcile_cluster(self.cluster)
            job.refresh_from_db()
            if job.state == JobState.RUNNING:
                break
            if time.monotonic() > deadline or job.is_final:
                raise RuntimeError(f"{name} did not reach RUNNING: {job.state} {job.state_reason}")
            time.sleep(0.5)
        attempt = JobAttempt.objects.select_related("job", "cluster").get(pk=job.current_attempt_id)
        self.wait(lambda: metric(attempt, "controlplane_endpoint_ready_replicas") == replicas, 120,
                  f"{replicas} ready replicas of {name}")
        return attempt

    @staticmethod
    def wait(predicate, timeout: float, what: str) -> float:
        """Poll ``predicate`` every 0.1 s; the seconds it took. Raises RuntimeError after ``timeout``."""
        started = time.monotonic()
        while not predicate():
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.1)
        return time.monotonic() - started

    def accrue(self, attempt) -> None:
        """Bill ``attempt`` up to now (the cluster answered now)."""
        from django.utils import timezone

        from costs.ledger import accrue_attempt
        from runners.models import Cluster

        now = timezone.now()
        Cluster.objects.filter(pk=self.cluster.pk).update(last_contact_at=now)
        accrue_attempt(attempt.pk, now)

    def stop(self, attempt) -> None:
        """Cancel the job of ``attempt`` and stop its processes."""
        from jobs.lifecycle import cancel_job
        from jobs.models import Job
        from jobs.tasks import cancel_job_objects

        cancel_job(Job.objects.get(pk=attempt.job_id), self.user)
        cancel_job_objects(attempt.job_id)


def metric(attempt, name: str) -> float | None:
    """The value of ``name`` in the endpoint's exposition of ``attempt`` (no labels), or None."""
    import requests

    try:
        text = requests.get(attempt.runner_state["endpoint_metrics_url"], timeout=2).text
    except requests.RequestException:
        return None
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    return None


def proxy_pid(job_id: int) -> int | None:
    """The pid of the job's endpoint process."""
    from runners.local.layout import read_json
    from runners.local.serving import endpoint_dir

    return (read_json(endpoint_dir(job_id) / "proxy.pid") or {}).get("pid")


def gpu_seconds(job_id: int, t0, t1) -> float:
    """The ledger's GPU-seconds of job ``job_id`` within ``[t0, t1)`` (aware datetimes), each entry pro rata."""
    from costs.models import CostEntry

    total = 0.0
    for entry in CostEntry.objects.filter(job_id=job_id, interval_start__lt=t1, interval_end__gt=t0):
        inside = (min(entry.interval_end, t1) - max(entry.interval_start, t0)).total_seconds()
        total += entry.gpu_milli / 1000 * max(0.0, inside)
    return total


def summary(answers: list[tuple[float, float, int]]) -> dict:
    ok = [seconds * 1000 for _, seconds, status in answers if status == 200]
    return {"requests": len(answers), "ok": len(ok), "failed": len(answers) - len(ok),
            "p50_ms": round(percentile(ok, 0.5), 1) if ok else None,
            "p99_ms": round(percentile(ok, 0.99), 1) if ok else None}


def run_profile(bench: Bench, services: dict, args) -> dict:
    """The load profile against every service of ``services`` (``{"autoscaled": (attempt, Load), "fixed": ...}``)
    at once, each with its own load stepped together: ``args.low_rps``, ``args.high_rps``, low again; the autoscaled service's
    scale-up and scale-down (plus the hold and the low phase) set the phases' lengths. Returns the phases' lengths,
    the scale times, and per service the answers' summary, the ledger's GPU-seconds over the load and its proxy's
    CPU seconds."""
    from django.utils import timezone

    from jobs.models import Job

    scaled = services["autoscaled"][0]
    pids = {name: proxy_pid(attempt.job_id) for name, (attempt, _) in services.items()}
    cpu0 = {name: cpu_seconds(pid) if pid else None for name, pid in pids.items()}

    def rate(rps: float) -> None:
        for _, load in services.values():
            load.rate = rps

    wall0, t0 = timezone.now(), time.monotonic()
    rate(args.low_rps)
    time.sleep(args.low_seconds)
    rate(args.high_rps)
    high_at = time.monotonic()
    up = bench.wait(lambda: metric(scaled, "controlplane_endpoint_ready_replicas") == 3, 180, "3 ready replicas")
    time.sleep(args.hold_seconds)
    rate(args.low_rps)
    low_at = time.monotonic()
    down = bench.wait(lambda: Job.objects.get(pk=scaled.job_id).replicas == 1
                      and metric(scaled, "controlplane_endpoint_replicas") == 1, 180, "back to 1 replica")
    time.sleep(args.low_seconds)
    rate(0)
    t1 = time.monotonic()
    time.sleep(1.0)  # the last requests answer
    wall1 = timezone.now()
    out = {"lengths": {"high": low_at - high_at, "low_after": t1 - low_at}, "scale_up_seconds": up,
           "scale_down_seconds": down, "window": (wall0, wall1)}
    for name, (attempt, load) in services.items():
        bench.accrue(attempt)
        cpu1 = cpu_seconds(pids[name]) if pids[name] else None
        out[name] = {"answers": summary(load.since(t0, t1)),
                     "gpu_seconds": gpu_seconds(attempt.job_id, wall0, wall1),
                     "proxy_cpu_s": None if cpu0[name] is None or cpu1 is None else cpu1 - cpu0[name]}
    return out


def replica_loss(attempt, load: Load, rps: float) -> dict:
    """``rps`` requests per second for 4 s, then one replica of ``attempt`` SIGKILLed, 6 s more: the answers that
    were not 200."""
    from runners.local.layout import read_json
    from runners.local.runner import attempt_dir

    load.rate = rps
    t0 = time.monotonic()
    time.sleep(4)
    child = read_json(attempt_dir(attempt) / "node-1.pid")["child"]["pid"]
    os.kill(child, signal.SIGKILL)
    time.sleep(6)
    load.rate = 0
    t1 = time.monotonic()
    time.sleep(1.0)
    answers = load.since(t0, t1)
    return summary(answers)


def rolling_update(bench: Bench, attempt, load: Load, checkpoint_job_id: int, rps: float) -> dict:
    """``rps`` requests per second while ``attempt``'s service is rolled to the checkpoint of ``checkpoint_job_id``
    (``serving.rollout.start_rollout``; the passes step it, as the serving task does): the answers' summary, the
    rollout's end state and the seconds from its start to that end."""
    from jobs.models import ServingRollout
    from serving.rollout import start_rollout

    load.rate = rps
    t0 = time.monotonic()
    time.sleep(2)
    rollout = start_rollout(attempt.job_id, checkpoint_from_job_id=checkpoint_job_id, actor=bench.user)
    took = bench.wait(lambda: ServingRollout.objects.get(pk=rollout.pk).state != ServingRollout.State.ROLLING, 240,
                      "the rolling update")
    time.sleep(3)
    load.rate = 0
    t1 = time.monotonic()
    time.sleep(1.0)
    return {**summary(load.since(t0, t1)), "state": ServingRollout.objects.get(pk=rollout.pk).state,
            "seconds": round(took, 2)}


def per_million(gpu_s: float, requests: int) -> float | None:
    """GPU-hours per million requests of ``gpu_s`` GPU-seconds over ``requests`` (None without any)."""
    return round(gpu_s / 3600 / requests * 1e6, 3) if requests else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--low-rps", type=float, default=1.5, help="requests per second off the peak")
    parser.add_argument("--high-rps", type=float, default=6.0, help="requests per second at the peak")
    parser.add_argument("--low-seconds", type=float, default=15.0, help="each low phase at the low rate, s")
    parser.add_argument("--hold-seconds", type=float, default=8.0, help="the peak once 3 replicas are ready, s")
    parser.add_argument("--down-delay", type=int, default=8, help="the autoscaled service's scale-down delay, s")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between autoscaling passes")
    parser.add_argument("--quick", action="store_true", help="short phases (10 s low, 4 s hold, 5 s delay)")
    args = parser.parse_args()
    if args.quick:
        args.low_seconds, args.hold_seconds, args.down_delay = 10.0, 4.0, 5
    url = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cp_bench_serving")
    require("serving", [postgres_missing(url)])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        configure(url, Path(tmp) / "runs")
        recreate_database(url)
        import django

        django.setup()
        checkpoint = Path(tmp) / "checkpoint"
        train_checkpoint(checkpoint)
        bench = Bench(args)
        passes = Passes(args.interval)
        passes.start()
        try:
            result = measure(bench, passes, args, checkpoint)
        finally:
            passes.stop()
            from tests.support.local_runner import kill_everything_under

            kill_everything_under(Path(tmp) / "runs")
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps({"benchmark": "serving", **result, **machine()}))


def measure(bench: Bench, passes: Passes, args, checkpoint: Path) -> dict:
    """Both services under the same load, the replica loss and the rolling update; the result line's keys."""
    from jobs.serving_figures import service_figures

    first, second = bench.trained(checkpoint, 2)
    scaled = bench.start("serve-autoscaled", 1, {**SCALING, "scale_down_delay_seconds": args.down_delay}, first)
    fixed_attempt = bench.start("serve-fixed", 3, None, first)
    services = {"autoscaled": (scaled, Load(scaled.runner_state["endpoint"], CONCURRENCY)),
                "fixed": (fixed_attempt, Load(fixed_attempt.runner_state["endpoint"], CONCURRENCY))}
    profile = run_profile(bench, services, args)
    auto, fixed = profile["autoscaled"], profile["fixed"]
    figures = service_figures(scaled.job, *profile["window"])
    lost = replica_loss(fixed_attempt, services["fixed"][1], args.high_rps)
    services["fixed"][1].stop()
    bench.stop(fixed_attempt)
    rolled = rolling_update(bench, scaled, services["autoscaled"][1], second, args.low_rps)
    services["autoscaled"][1].stop()
    bench.stop(scaled)

    auto_pm = per_million(auto["gpu_seconds"], auto["answers"]["ok"])
    fixed_pm = per_million(fixed["gpu_seconds"], fixed["answers"]["ok"])
    served = auto["answers"]["requests"] + fixed["answers"]["requests"]
    proxy_cpu = [x for x in (auto["proxy_cpu_s"], fixed["proxy_cpu_s"]) if x is not None]
    print(f"autoscaled: up {profile['scale_up_seconds']:.1f} s, down {profile['scale_down_seconds']:.1f} s, "
          f"{auto['answers']}; fixed {fixed['answers']}; replica loss {lost}", file=sys.stderr)
    result = {
        "scale_up_seconds": round(profile["scale_up_seconds"], 2),
        "scale_down_seconds": round(profile["scale_down_seconds"], 2),
        "scale_down_delay_seconds": args.down_delay,
        "autoscale_interval_seconds": args.interval,
        "replicas_seen": passes.seen.get(scaled.job_id, []),
        "latency_ms": {"autoscaled": {k: auto["answers"][k] for k in ("p50_ms", "p99_ms")},
                       "fixed": {k: fixed["answers"][k] for k in ("p50_ms", "p99_ms")}},
        "requests": {"autoscaled": auto["answers"], "fixed": fixed["answers"]},
        "failed_requests": auto["answers"]["failed"] + fixed["answers"]["failed"],
        "failed_requests_replica_loss": lost["failed"],
        "replica_loss_requests": lost["requests"],
        "gpu_hours_per_million_requests": {"autoscaled": auto_pm, "fixed": fixed_pm},
        "gpu_hours_per_million_requests_ratio_vs_fixed": round(auto_pm / fixed_pm, 3) if auto_pm and fixed_pm else None,
        "proxy_cpu_ms_per_request": round(1000 * sum(proxy_cpu) / served, 3) if proxy_cpu and served else None,
        "figures_autoscaled": {k: figures[k] for k in ("requests", "errors", "requests_per_second", "latency_p50_ms",
                                                        "latency_p99_ms", "gpu_hours_per_million_requests",
                                                        "usd_per_million_requests", "replicas")},
        "phase_seconds": {"low": args.low_seconds, "high": round(profile["lengths"]["high"], 1),
                          "low_after": round(profile["lengths"]["low_after"], 1)},
    }
    result["failed_requests_rolling_update"] = rolled["failed"]
    result["rolling_update"] = rolled
    result["goal_met"] = bool(result["gpu_hours_per_million_requests_ratio_vs_fixed"] is not None
                              and result["gpu_hours_per_million_requests_ratio_vs_fixed"] < 1
                              and lost["failed"] == 0 and result["failed_requests"] == 0
                              and rolled["failed"] == 0 and rolled["state"] == "done")
    return result


if __name__ == "__main__":
    main()
