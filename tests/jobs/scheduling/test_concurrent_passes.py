"""The admission invariants under real concurrency on PostgreSQL.

Eight threads submit jobs and run scheduling passes (in rounds that start
together at a barrier) while two separate OS processes run scheduling passes
in a loop, a ninth thread finishes admitted jobs (so GPUs and money are
released and admitted again all along) and a monitor thread checks the
invariants in consistent snapshots. Demand is well above quota, capacity and
budget, so a missing lock shows as an overshoot. The invariants, in every
snapshot and at the end:

- per team and accelerator, GPUs of live attempts <= nominal + borrowing;
- per node pool, GPUs of live attempts <= its capacity;
- per block budget, the estimates of admitted (active) jobs <= its amount
  (nothing is accrued here, so nothing is spent);
- every admitted job has exactly one live attempt, its current one;
and at the end every job's events form a chain (each from_state is the
previous to_state, along edges of the state machine).
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, Q, Sum

from jobs.lifecycle import end_attempt, mark_started, submit_job
from jobs.models import ACTIVE_STATES, Job, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.states import StaleState, transition
from quotas.models import Budget, Quota
from runners.models import NodePool
from tests.core.test_states import assert_event_chains_valid

D = Decimal
S = JobState
REPO = Path(__file__).resolve().parents[2]

THREADS = 8
ROUNDS = 10  # each round: every thread submits, all meet at a barrier, then all run passes at once
JOBS_PER_ROUND = 2
PASSES_PER_ROUND = 3
JOBS_PER_THREAD = ROUNDS * JOBS_PER_ROUND
MAX_FINISHED = 400

PROCESS_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import django
    django.setup()
    from django.db import connection
    from jobs.scheduling.passes import schedule_pending
    stop = Path(sys.argv[1])
    print("ready", flush=True)
    passes = admitted = 0
    deadline = time.monotonic() + 25
    while not stop.exists() and time.monotonic() < deadline:
        admitted += len(schedule_pending().admitted)
        passes += 1
    connection.close()
    print(json.dumps({"passes": passes, "admitted": admitted}), flush=True)
""")


def database_url() -> str:
    """The URL of the test database this test runs on (not the one in the environment, which is its base name)."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "") + (":" + quote(s["PASSWORD"]) if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def invariant_violations() -> list[str]:
    """Every broken invariant in one consistent snapshot of the database (REPEATABLE READ)."""
    found = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        live = JobAttempt.objects.filter(ended_at__isnull=True)
        for quota in Quota.objects.all():
            used = live.filter(job__team_id=quota.team_id, node_pool__accelerator_id=quota.accelerator_id).aggregate(
                n=Sum("gpus"))["n"] or 0
            if used > quota.nominal_gpus + quota.borrowing_limit_gpus:
                found.append(f"team {quota.team_id} holds {used} GPUs over {quota}")
        for pool in NodePool.objects.all():
            used = live.filter(node_pool=pool).aggregate(n=Sum("gpus"))["n"] or 0
            if used > pool.nodes * pool.gpus_per_node:
                found.append(f"pool {pool.pk} holds {used} GPUs over its {pool.nodes * pool.gpus_per_node}")
        for budget in Budget.objects.filter(action="block"):
            committed = Job.objects.filter(team_id=budget.team_id, state__in=ACTIVE_STATES).aggregate(
                s=Sum("estimated_cost_usd"))["s"] or D(0)
            if committed > budget.amount_usd:
                found.append(f"team {budget.team_id} committed {committed} over its budget {budget.amount_usd}")
        odd = Job.objects.filter(state__in=ACTIVE_STATES).annotate(
            live=Count("attempts", filter=Q(attempts__ended_at__isnull=True))).exclude(live=1)
        found += [f"active job {j.pk} has {j.live} live attempts" for j in odd]
    return found


def run_to_success(job: Job) -> None:
    """What dispatch and reconcile would do: objects created, all pods running, exit 0."""
    attempt = job.current_attempt
    mark_started(job, attempt, {})
    transition(job, S.RUNNING, reason="all nodes running", attempt=attempt)
    end_attempt(job, attempt, S.SUCCEEDED, reason="exit 0", end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)


@pytest.mark.django_db(transaction=True)
def test_quota_capacity_and_budget_hold_under_concurrent_submitters_and_schedulers(
        catalog, teams, cluster_factory, redis_broker, tmp_path):
    h100 = catalog["H100-80GB"]
    alpha, beta = teams
    users = {t.pk: get_user_model().objects.create(username=f"u-{t.slug}") for t in teams}
    for team in teams:
        Quota.objects.create(team=team, accelerator=h100, nominal_gpus=8, borrowing_limit_gpus=4)  # 12 each, 24 in all
    # 8 + 8 + 4 = 20 GPUs: less than the 24 the two quotas allow together
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=1, gpus_per_node=8, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, nodes=2, gpus_per_node=4, price="6.88")
    cluster_factory("dear", "azure", "eastus", h100, nodes=1, gpus_per_node=4, price="12.29")
    # beta's jobs are 2 GPUs for 1 h: 8.40 at the cheapest price, so at most K = 3 fit 30.00 at once (4 x 8.40 = 33.60)
    beta_budget = D("30.00")
    beta_estimate_floor = D(2) * D("4.20")
    assert 3 * beta_estimate_floor <= beta_budget < 4 * beta_estimate_floor
    Budget.objects.create(team=beta, amount_usd=beta_budget, action="block")
    # alpha's jobs are 1, 2, 4 or 8 GPUs for 30 min: 12 GPUs x 0.5 h x 12.29 = 73.74 would be over 60.00
    Budget.objects.create(team=alpha, amount_usd=D("60.00"), action="block")
    connection.close()  # the threads and processes open their own

    errors: list[BaseException] = []
    snapshots: list[list[str]] = []
    finished: list[int] = []
    submitters_done = threading.Event()
    env = {**os.environ, "DATABASE_URL": database_url(), "CELERY_BROKER_URL": redis_broker,
           "DJANGO_SETTINGS_MODULE": "controlplane.settings", "CONN_MAX_AGE": "0"}
    stop = tmp_path / "stop"
    processes = [subprocess.Popen([sys.executable, "-c", PROCESS_SCRIPT, str(stop)], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in processes:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()

        barrier = threading.Barrier(THREADS, timeout=60)

        def submitter(index: int) -> None:
            try:
                team = alpha if index % 2 == 0 else beta
                for n in range(JOBS_PER_THREAD):
                    if team == alpha:
                        gpus, runtime = (1, 2, 4, 8)[(index + n) % 4], 1800
                    else:
                        gpus, runtime = 2, 3600
                    spec = {"image": "python:3.11", "command": ["python", "train.py"],
                            "resources": {"accelerator": h100.name, "gpus_per_node": gpus, "nodes": 1},
                            "priority": 500, "max_runtime_seconds": runtime, "preemptible": False, "placement": {},
                            "max_retries": 0}
                    submit_job(team=team, submitter=users[team.pk], name=f"t{index}-{n}", kind="training", spec=spec,
                               resources={"accelerator": h100, "gpus_per_node": gpus, "nodes": 1, "priority": 500,
                                          "preemptible": False, "max_runtime_seconds": runtime, "max_retries": 0})
                    if (n + 1) % JOBS_PER_ROUND == 0:
                        barrier.wait()  # everyone's batch is in: all schedulers start together
                        for _ in range(PASSES_PER_ROUND):
                            schedule_pending()
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)
                barrier.abort()  # release the others instead of leaving them at the barrier
            finally:
                connection.close()

        def finisher() -> None:
            """End admitted jobs of both teams now and then, so admissions keep happening all along."""
            try:
                while not submitters_done.is_set() and len(finished) < MAX_FINISHED:
                    job = Job.objects.filter(state=S.ADMITTED).select_related("current_attempt__cluster").order_by(
                        "admitted_at").first()
                    if job is not None:
                        try:
                            run_to_success(job)
                            finished.append(job.pk)
                        except StaleState:
                            pass
                    time.sleep(0.002)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        def monitor() -> None:
            try:
                while not submitters_done.is_set():
                    snapshots.append(invariant_violations())
                    time.sleep(0.01)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=submitter, args=(i,)) for i in range(THREADS)]
        helpers = [threading.Thread(target=finisher), threading.Thread(target=monitor)]
        for t in threads + helpers:
            t.start()
        for t in threads:
            t.join(timeout=60)
        submitters_done.set()
        for t in helpers:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads + helpers), "a thread hung (deadlock?)"
    finally:
        stop.touch()
        outputs = [p.communicate(timeout=60) for p in processes]
    assert not errors, errors
    for p, (out, err) in zip(processes, outputs):
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["passes"] > 0

    # -- the invariants: in every snapshot taken during the run, and at the end ------------
    assert len(snapshots) > 10
    assert [v for v in snapshots if v] == []
    assert invariant_violations() == []

    jobs = list(Job.objects.all())
    assert len(jobs) == THREADS * JOBS_PER_THREAD
    assert Job.objects.filter(team=beta, state__in=ACTIVE_STATES).count() <= 3

    attempts = defaultdict(list)
    for attempt in JobAttempt.objects.all():
        attempts[attempt.job_id].append(attempt)
    for job in jobs:
        mine = attempts[job.pk]
        if job.state == S.ADMITTED:
            assert [a.pk for a in mine if a.ended_at is None] == [job.current_attempt_id], job
        elif job.state == S.SUCCEEDED:
            assert len(mine) == 1 and mine[0].ended_at is not None, job
        else:
            assert job.state in (S.QUEUED, S.REJECTED), job
            assert mine == [], job
        assert [a.object_name for a in mine] == [f"job-{job.pk}-{n}" for n in range(1, len(mine) + 1)]

    events = assert_event_chains_valid(jobs)
    for job in jobs:
        chain = events[job.pk]
        assert chain[0].kind == "submitted" and chain[0].to_state == S.QUEUED
        assert sum(e.kind == "state" and e.to_state == S.ADMITTED for e in chain) == len(attempts[job.pk])

    # -- the scenario was contended: every limit turned jobs away at some point, both teams ran -----
    assert len(finished) > 0
    for team in teams:
        assert Job.objects.filter(team=team, state__in=[S.ADMITTED, S.SUCCEEDED]).exists()
        # Some job of the team had to wait (how many still wait at the end depends on timing).
        assert JobEvent.objects.filter(job__team=team, kind="waiting").exists()
    reasons = {e.data.get("reason") for e in JobEvent.objects.filter(kind="waiting")}
    assert {"quota", "budget", "capacity"} <= reasons, reasons
    connection.close()
