"""Scheduling passes racing each other on PostgreSQL keep a job array within its parallelism and make each element once.

Two OS processes run passes in a loop (``tests/support/racing.py``), each topping the array up before it reads
the queue; this process runs and ends admitted elements all along, so room opens again and again, and a monitor
checks in consistent (REPEATABLE READ) snapshots that the array never has more live elements than its
parallelism, that no index was made twice and that ``materialized`` counts exactly the element rows. At the end
every element was made once and succeeded, and every element's events form a chain along the state machine.
"""

import time

import pytest
from django.db import connection, transaction

from jobs.arrays import submit_array
from jobs.lifecycle import end_attempt, mark_started
from jobs.models import FINAL_STATES, Job, JobArray, JobState
from jobs.spec import validated_submission
from jobs.states import InvalidTransition, StaleState, transition
from quotas.models import Quota
from tests.support.factories import VALID_SPEC
from tests.support.racing import SnapshotMonitor, scheduler_processes
from tests.support.states import assert_event_chains_valid

S = JobState
COUNT, PARALLELISM = 60, 6

pytestmark = pytest.mark.django_db(transaction=True)


def violations(array_id: int) -> list[str]:
    found = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        elements = list(Job.objects.filter(array_id=array_id).values_list("array_index", "state"))
        materialized = JobArray.objects.values_list("materialized", flat=True).get(pk=array_id)
    live = sum(state not in FINAL_STATES for _, state in elements)
    if live > PARALLELISM:
        found.append(f"{live} live elements, parallelism {PARALLELISM}")
    indexes = [index for index, _ in elements]
    if len(indexes) != len(set(indexes)) or sorted(indexes) != list(range(len(indexes))):
        found.append(f"element indexes {sorted(indexes)}")
    if materialized != len(indexes):
        found.append(f"materialized {materialized} with {len(indexes)} element rows")
    return found


def finish_what_runs(array_id: int) -> None:
    """What dispatch and reconcile would do for every admitted element: objects, all pods running, exit 0."""
    for job in Job.objects.filter(array_id=array_id, state=S.ADMITTED).select_related("current_attempt__cluster"):
        try:
            mark_started(job, job.current_attempt, {})
            transition(job, S.RUNNING, reason="all nodes running", attempt=job.current_attempt)
            end_attempt(job, job.current_attempt, S.SUCCEEDED, reason="exit 0", end_reason="Succeeded", exit_code=0)
        except (StaleState, InvalidTransition):
            continue


def test_racing_passes_keep_an_array_within_its_parallelism(cluster_factory, h100, teams, user, redis_broker,
                                                             tmp_path, monkeypatch):
    monkeypatch.setenv("ARRAY_QUEUED_WINDOW", "2")  # the processes' setting: many small top-ups, many races
    cluster_factory("roomy", "aws", "us-east-1", h100, nodes=8, gpus_per_node=8, price="2.00")
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=64)
    spec = {**VALID_SPEC, "resources": {**VALID_SPEC["resources"], "gpus_per_node": 1, "nodes": 1},
            "preemptible": False, "priority": "normal"}
    fields = validated_submission({"team": "alpha", "name": "race", "kind": "training", "spec": spec}, user)
    array = submit_array(**fields, count=COUNT, parallelism=PARALLELISM, grid=[])
    connection.close()
    errors: list = []
    monitor = SnapshotMonitor(lambda: violations(array.pk), errors)
    monitor.start()
    try:
        with scheduler_processes(2, redis_broker, tmp_path):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and Job.objects.filter(array_id=array.pk, state=S.SUCCEEDED).count() \
                    < COUNT:
                finish_what_runs(array.pk)
                time.sleep(0.005)
    finally:
        monitor.stop()
    assert not errors, errors
    broken = [v for snapshot in monitor.snapshots for v in snapshot]
    assert not broken, broken[:10]
    assert len(monitor.snapshots) > 10
    assert violations(array.pk) == []
    assert sorted(Job.objects.filter(array_id=array.pk, state=S.SUCCEEDED).values_list("array_index", flat=True)) \
        == list(range(COUNT))
    assert_event_chains_valid(Job.objects.filter(array_id=array.pk))
