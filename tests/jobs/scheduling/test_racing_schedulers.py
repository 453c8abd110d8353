"""Two scheduler processes racing on PostgreSQL with cohorts, lending limits and preemption.

Two OS processes run fair-share passes in a loop while this process submits
jobs of three teams (preemptible and not), runs its own passes and ends
admitted jobs. A monitor checks, in REPEATABLE READ snapshots and at the end:
per team live GPUs <= nominal + borrowing; per cohort the borrowed GPUs
(usage above each team's unlendable part) <= the GPUs its teams lend, hence
the cohort's usage <= its nominal; per node pool live GPUs <= its capacity;
an active job has exactly one live attempt and a waiting one none; and every
job's events form a chain along the state machine.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, Q, Sum

from jobs.lifecycle import end_attempt, mark_started, submit_job
from jobs.models import ACTIVE_STATES, Job, JobAttempt, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.states import StaleState, transition
from quotas.models import Quota, Team
from runners.models import NodePool
from tests.core.test_concurrency import PROCESS_SCRIPT, REPO, database_url
from tests.core.test_states import assert_event_chains_valid

S = JobState
QUOTAS = {"alpha": (8, 8, None), "beta": (8, 8, 4), "gamma": (4, 12, None)}  # nominal, borrowing, lending


def violations() -> list[str]:
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

    env = {**os.environ, "DATABASE_URL": database_url(), "CELERY_BROKER_URL": redis_broker,
           "DJANGO_SETTINGS_MODULE": "controlplane.settings", "CONN_MAX_AGE": "0"}
    stop = tmp_path / "stop"
    processes = [subprocess.Popen([sys.executable, "-c", PROCESS_SCRIPT, str(stop)], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors: list[BaseException] = []
    snapshots: list[list[str]] = []
    done = threading.Event()

    def monitor() -> None:
        try:
            while not done.is_set():
                snapshots.append(violations())
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    rng = random.Random(4)
    try:
        for p in processes:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        watcher = threading.Thread(target=monitor)
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
            done.set()
            watcher.join(timeout=30)
    finally:
        stop.touch()
        outputs = [p.communicate(timeout=60) for p in processes]
    assert not errors, errors
    for p, (out, err) in zip(processes, outputs):
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["passes"] > 0
    assert len(snapshots) > 5
    assert [v for v in snapshots if v] == []
    assert violations() == []

    assert_event_chains_valid(Job.objects.all())
    assert Job.objects.filter(state__in=[S.ADMITTED, S.SUCCEEDED]).count() > 5
    assert Job.objects.filter(state=S.QUEUED).exists()
    connection.close()
