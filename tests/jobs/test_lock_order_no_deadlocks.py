"""Submission, admission, the start of a job, cancel, the end of an attempt and cost accrual running at once on
PostgreSQL: no deadlock.

The platform's lock order (``jobs.scheduling``'s docstring) is followed by these writers, so PostgreSQL's own
deadlock counter (``pg_stat_database.deadlocks`` of the test database) does not move while threads submit jobs,
run scheduling passes, start admitted jobs, cancel them, end cancelled attempts and accrue the running attempts'
cost (``costs.ledger.accrue_running``: key-share locks on team and cluster rows, job and attempt rows with SKIP
LOCKED, then the totals and the entries), all on the same team, job, attempt and node pool rows. No thread may see
a database error either.
"""

import random
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from costs.ledger import accrue_running
from jobs.lifecycle import NotCancellable, cancel_job, end_attempt, mark_started, submit_job
from jobs.models import Job, JobAttempt, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.states import InvalidTransition, StaleState, transition
from quotas.models import Budget, Quota, Team

S = JobState
RUN_SECONDS = 6.0


def deadlocks_so_far() -> int:
    """PostgreSQL's count of deadlocks detected in the current database (statistics read fresh)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def submit(team, user, h100, gpus: int) -> Job:
    spec = {"image": "python:3.11", "command": ["python", "train.py"],
            "resources": {"accelerator": h100.name, "gpus_per_node": gpus, "nodes": 1}, "priority": 500,
            "max_runtime_seconds": 3600, "preemptible": False, "placement": {}, "max_retries": 0}
    return submit_job(team=team, submitter=user, name=f"race-{gpus}", kind="training", spec=spec,
                      resources={"accelerator": h100, "gpus_per_node": gpus, "nodes": 1, "priority": 500,
                                 "preemptible": False, "max_runtime_seconds": 3600, "max_retries": 0})


@pytest.mark.django_db(transaction=True)
def test_submission_admission_start_and_cancel_together_never_deadlock(catalog, cluster_factory, redis_broker):
    h100 = catalog["H100-80GB"]
    user = get_user_model().objects.create(username="racer")
    teams = [Team.objects.create(slug=f"t{i}", name=f"t{i}") for i in range(2)]
    for team in teams:
        Quota.objects.create(team=team, accelerator=h100, nominal_gpus=8, borrowing_limit_gpus=8)
        Budget.objects.create(team=team, amount_usd="100000.00", action="block")
    # two pools of one accelerator: admission locks both, the start and the end of an attempt touch one each
    cluster_factory("a", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8)
    cluster_factory("b", "gcp", "us-central1", h100, nodes=1, gpus_per_node=8)
    connection.close()

    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"submitted": 0, "passes": 0, "started": 0, "cancelled": 0, "ended": 0, "accrued": 0}
    rng = random.Random(7)

    def loop(name, body):
        def run():
            try:
                while not stop.is_set():
                    body()
                    counts[name] += 1
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                stop.set()
            finally:
                connection.close()
        return threading.Thread(target=run, name=name)

    def submitter():
        submit(rng.choice(teams), user, h100, rng.choice((1, 2, 4)))

    def starter():
        """What dispatch and reconcile do: objects created, then running (billing starts)."""
        job = Job.objects.filter(state=S.ADMITTED).select_related("current_attempt").order_by("?").first()
        if job is None:
            return
        try:
            mark_started(job, job.current_attempt, {})
            transition(job, S.RUNNING, reason="all nodes running", attempt=job.current_attempt)
        except (StaleState, InvalidTransition):
            pass

    def canceller():
        # Placed jobs first (their cancel races admission, start and accrual on the attempt), else a queued one.
        placed = rng.random() < 0.7
        states = [S.ADMITTED, S.STARTING, S.RUNNING] if placed else [S.QUEUED]
        job = Job.objects.filter(state__in=states).order_by("?").first()
        if job is None:
            return
        try:
            cancel_job(job, actor=user)
        except (NotCancellable, StaleState, InvalidTransition):
            pass

    def ender():
        """What the cancel task does once the cluster confirms: the attempt ends, the job is CANCELLED."""
        job = Job.objects.filter(state=S.CANCELLING).select_related("current_attempt").order_by("?").first()
        if job is None or job.current_attempt is None:
            return
        try:
            end_attempt(job, job.current_attempt, S.CANCELLED, reason="objects deleted",
                        end_reason=JobAttempt.EndReason.CANCELLED)
        except (StaleState, InvalidTransition):
            pass

    before = deadlocks_so_far()
    connection.close()
    threads = ([loop("submitted", submitter) for _ in range(3)] + [loop("passes", schedule_pending) for _ in range(2)]
               + [loop("started", starter), loop("cancelled", canceller), loop("ended", ender)]
               + [loop("accrued", accrue_running) for _ in range(2)])
    for t in threads:
        t.start()
    time.sleep(RUN_SECONDS)
    # On a loaded machine the race may need longer before every kind of writer has met the others on shared rows:
    # keep it going (up to a minute) until a job was started and one with an attempt was cancelled to its end.
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline and not (
            JobAttempt.objects.filter(started_at__isnull=False).exists()
            and Job.objects.filter(state=S.CANCELLED, attempts__isnull=False).exists()):
        time.sleep(0.5)
    connection.close()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []

    time.sleep(1.0)  # backends flush their statistics when they exit (all connections are closed by now)
    assert deadlocks_so_far() - before == 0
    # The race was real: every kind of writer worked on shared rows many times.
    assert counts["submitted"] > 20 and counts["passes"] > 5 and counts["accrued"] > 5, counts
    assert JobAttempt.objects.filter(started_at__isnull=False).exists(), counts
    assert Job.objects.filter(state=S.CANCELLED, attempts__isnull=False).exists(), counts
    connection.close()
