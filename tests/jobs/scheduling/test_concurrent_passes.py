"""Scheduling passes racing each other on PostgreSQL never overdraw a quota, a cohort, a budget or a pool.

Two scenarios, each with two separate OS processes running passes in a loop (``tests/support/racing.py``) and a
monitor checking the invariants in consistent (REPEATABLE READ) snapshots, while they run and at the end.

Submitters and schedulers: eight threads submit jobs and run passes (in rounds that start together at a
barrier), a ninth thread finishes admitted jobs (so GPUs and money are released and admitted again all along).
Demand is well above quota, capacity and budget, so a missing lock shows as an overshoot. The invariants:

- per team and accelerator, GPUs of live attempts <= nominal + borrowing;
- per node pool, GPUs of live attempts <= its capacity;
- per block budget, the estimates of admitted (active) jobs <= its amount
  (nothing is accrued here, so nothing is spent);
- every admitted job has exactly one live attempt, its current one;
and at the end every job's events form a chain (each from_state is the
previous to_state, along edges of the state machine).

Cohorts, lending and preemption: this process submits jobs of three teams (preemptible and not), runs its own
passes and ends admitted jobs. Per team live GPUs <= nominal + borrowing; per cohort the borrowed GPUs (usage
above each team's unlendable part) <= the GPUs its teams lend, hence the cohort's usage <= its nominal; per
node pool live GPUs <= its capacity; an active job has exactly one live attempt and a waiting one none; and
every job's events form a chain along the state machine.
"""

import random
import threading
import time
from collections import defaultdict
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, Q, Sum

from jobs.lifecycle import end_attempt, mark_started, submit_job
from jobs.models import ACTIVE_STATES, Job, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.states import StaleState, transition
from quotas.models import Budget, Quota, Team
from runners.models import NodePool
from tests.support.racing import SnapshotMonitor, scheduler_processes
from tests.support.states import assert_event_chains_valid

D = Decimal
S = JobState

THREADS = 8
ROUNDS = 10  # each round: every thread submits, all meet at a barrier, then all run passes at once
JOBS_PER_ROUND = 2
PASSES_PER_ROUND = 3
JOBS_PER_THREAD = ROUNDS * JOBS_PER_ROUND
MAX_FINISHED = 400
# the racing scenario's teams: nominal, borrowing, lending limit
QUOTAS = {"alpha": (8, 8, None), "beta": (8, 8, 4), "gamma": (4, 12, None)}


# --- submitters and schedulers: quota, capacity and budget ------------------------------------------------------

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
    # 8 + 8 = 16 GPUs: less than what quota and budget let the two teams hold together (alpha 12 by quota,
    # beta 6 by budget, below), so every contended pass turns some job away for capacity
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=1, gpus_per_node=8, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, nodes=2, gpus_per_node=4, price="6.88")
    # beta's jobs are 2 GPUs for 1 h: 8.40 at the cheapest price, so at most K = 3 fit 30.00 at once (4 x 8.40 = 33.60)
    beta_budget = D("30.00")
    beta_estimate_floor = D(2) * D("4.20")
    assert 3 * beta_estimate_floor <= beta_budget < 4 * beta_estimate_floor
    Budget.objects.create(team=beta, amount_usd=beta_budget, action="block")
    # alpha's jobs are 1, 2, 4 or 8 GPUs for 30 min: 12 GPUs x 0.5 h x 6.88 = 41.28 at most, under 60.00, so its
    # quota binds first; its budget is still checked in every snapshot
    Budget.objects.create(team=alpha, amount_usd=D("60.00"), action="block")
    connection.close()  # the threads and processes open their own

    errors: list[BaseException] = []
    finished: list[int] = []
    submitters_done = threading.Event()
    with scheduler_processes(2, redis_broker, tmp_path):
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
            except BaseException as exc:  # noqa: BLE001 - reported below
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

        monitor = SnapshotMonitor(invariant_violations, errors)
        threads = [threading.Thread(target=submitter, args=(i,)) for i in range(THREADS)]
        helpers = [threading.Thread(target=finisher), monitor]
        for t in threads + helpers:
            t.start()
        for t in threads:
            t.join(timeout=60)
        submitters_done.set()
        monitor.stop()
        for t in helpers:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads + helpers), "a thread hung (deadlock?)"
    assert not errors, errors

    # -- the invariants: in every snapshot taken during the run, and at the end ------------
    assert len(monitor.snapshots) > 10
    assert [v for v in monitor.snapshots if v] == []
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
        assert [a.object_name for a in mine] == [f"job-{job.pk}-{n}-{a.uid.hex[:8]}" for n, a in enumerate(mine, 1)]

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


# --- cohorts, lending and preemption -----------------------------------------------------------------------------

def cohort_violations() -> list[str]:
    found = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        used = defaultdict(int, JobAttempt.objects.filter(ended_at__isnull=True).values_list("job__team_id")
                           .annotate(n=Sum("gpus")))
        lendable = borrowed = nominal_sum = used_sum = 0
        for q in Quota.objects.all():
            if used[q.team_id] > q.nominal_gpus + q.borrowing_limit_gpus:
                found.append(f"team {q.team_id} holds {used[q.team_id]} over {q}")
            lend = q.nominal_gpus if q.lending_limit_gpus is None else min(q.lending_limit_gpus, q.nominal_gpus)
            lendable += lend
            borrowed += max(0, used[q.team_id] - (q.nominal_gpus - lend))
            nominal_sum += q.nominal_gpus
            used_sum += used[q.team_id]
        if borrowed > lendable or used_sum > nominal_sum:
            found.append(f"cohort borrows {borrowed} of {lendable} lendable; uses {used_sum} of {nominal_sum}")
        for pool in NodePool.objects.all():
            held = JobAttempt.objects.filter(node_pool=pool, ended_at__isnull=True).aggregate(n=Sum("gpus"))["n"] or 0
            if held > pool.nodes * pool.gpus_per_node:
                found.append(f"pool {pool.pk} holds {held}")
        odd = Job.objects.filter(state__in=ACTIVE_STATES).annotate(
            live=Count("attempts", filter=Q(attempts__ended_at__isnull=True))).exclude(live=1)
        found += [f"active job {j.pk} has {j.live} live attempts" for j in odd]
        queued = Job.objects.filter(state=S.QUEUED).annotate(
            live=Count("attempts", filter=Q(attempts__ended_at__isnull=True))).exclude(live=0)
        found += [f"queued job {j.pk} holds {j.live} live attempts" for j in queued]
    return found


@pytest.mark.django_db(transaction=True)
def test_two_racing_schedulers_never_overdraw_a_quota_a_cohort_or_a_pool(catalog, cluster_factory, redis_broker,
                                                                          tmp_path):
    h100 = catalog["H100-80GB"]
    user = get_user_model().objects.create(username="racer")
    teams = {}
    for slug, (nominal, borrowing, lending) in QUOTAS.items():
        teams[slug] = Team.objects.create(slug=slug, name=slug)
        Quota.objects.create(team=teams[slug], accelerator=h100, nominal_gpus=nominal, borrowing_limit_gpus=borrowing,
                             lending_limit_gpus=lending)
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=2, gpus_per_node=8, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, nodes=2, gpus_per_node=4, price="6.88")  # 24 GPUs > 20 nominal
    connection.close()

    errors: list[BaseException] = []
    rng = random.Random(4)
    with scheduler_processes(2, redis_broker, tmp_path):
        watcher = SnapshotMonitor(cohort_violations, errors)
        watcher.start()
        try:
            for n in range(100):
                slug = rng.choice(list(teams))
                gpus = rng.choice([2, 4, 8])
                preemptible = rng.random() < 0.6
                spec = {"image": "python:3.11", "command": ["python"], "priority": "normal",
                        "max_runtime_seconds": 3600, "preemptible": preemptible, "placement": {}, "max_retries": 0,
                        "resources": {"accelerator": h100.name, "gpus_per_node": gpus, "nodes": 1}}
                submit_job(team=teams[slug], submitter=user, name=f"r{n}", kind="training", spec=spec,
                           resources={"accelerator": h100, "gpus_per_node": gpus, "nodes": 1,
                                      "priority": rng.choice([100, 500, 1000]), "preemptible": preemptible,
                                      "max_runtime_seconds": 3600, "max_retries": 0})
                schedule_pending()
                if n % 3 == 2:
                    job = Job.objects.filter(state=S.ADMITTED).order_by("?").select_related("current_attempt").first()
                    if job is not None:
                        try:
                            attempt = job.current_attempt
                            mark_started(job, attempt, {})
                            transition(job, S.RUNNING, reason="running", attempt=attempt)
                            end_attempt(job, attempt, S.SUCCEEDED, reason="exit 0",
                                        end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
                        except StaleState:
                            pass
        finally:
            watcher.stop()
    assert not errors, errors
    assert len(watcher.snapshots) > 5
    assert [v for v in watcher.snapshots if v] == []
    assert cohort_violations() == []

    assert_event_chains_valid(Job.objects.all())
    assert Job.objects.filter(state__in=[S.ADMITTED, S.SUCCEEDED]).count() > 5
    assert Job.objects.filter(state=S.QUEUED).exists()
    connection.close()
