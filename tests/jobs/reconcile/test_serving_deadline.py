"""An inference server stops at its max runtime on Kubernetes, as a training Job does.

Class of failure: a limit enforced by one runner and not another. A Kubernetes Job fails ``DeadlineExceeded`` at
``activeDeadlineSeconds`` and the local runner's supervisor stops every kind at its max runtime, but a Deployment
has no deadline: a server ran, and was billed, past the max runtime its worst-case estimate counted. Invariant:
every attempt, whatever its kind and runner, ends at its max runtime, its objects are deleted, and the ledger bills
it no more than its estimate's interval.

On ``live_clusters`` (``tests/support/clusters.py``) with the control plane's clock frozen by ``time_machine``;
expected times are the scenario's own.
"""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine

from jobs.models import JobAttempt, JobState
from tests.support.clusters import ledger_gpu_seconds, load, state

START = dt.datetime(2026, 3, 9, 4, 0, tzinfo=dt.UTC)
MAX_RUNTIME = 600


@pytest.fixture
def clock():
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def test_a_server_past_its_max_runtime_ends_at_the_deadline_and_its_deployment_is_deleted(clock, live_clusters):
    attempt = live_clusters.running("gcp-usc1", kind="inference", gpus=2, max_runtime=MAX_RUNTIME)
    emulator = live_clusters.emulator(attempt)
    started = attempt.started_at
    assert started is not None and len(emulator.objects("Deployment")) == 1

    clock.move_to(started + dt.timedelta(seconds=MAX_RUNTIME - 1))
    live_clusters.reconcile("gcp-usc1")
    assert state(attempt) == JobState.RUNNING  # a second before its deadline it serves on

    look = started + dt.timedelta(seconds=MAX_RUNTIME + 7)  # the first look after the deadline
    clock.move_to(look)
    live_clusters.reconcile("gcp-usc1")
    ended = load(attempt.pk)
    assert state(attempt) == JobState.FAILED
    assert ended.end_reason == JobAttempt.EndReason.DEADLINE_EXCEEDED
    # Its pods held their GPUs until the deletion was accepted (the end moves on that evidence, ADR 0021) ...
    assert started + dt.timedelta(seconds=MAX_RUNTIME) <= ended.ended_at <= look
    assert emulator.objects("Deployment") == []  # deleted by the same pass
    # ... but the seconds the platform took to enforce the limit are not charged (ADR 0024): 2 GPUs x the max runtime.
    assert ledger_gpu_seconds(attempt.pk) == 2 * MAX_RUNTIME


def test_a_server_within_its_max_runtime_is_left_running(clock, live_clusters):
    attempt = live_clusters.running("gcp-usc1", kind="inference", gpus=1, max_runtime=86400)
    clock.shift(3600)
    live_clusters.reconcile("gcp-usc1")
    assert state(attempt) == JobState.RUNNING and load(attempt.pk).ended_at is None
    assert len(live_clusters.emulator(attempt).objects("Deployment")) == 1
