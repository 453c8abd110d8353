"""Concurrent writers of one derived row: two collectors reading the same attempt's workload metrics at once (beat's
collection and reconcile's collection before a deletion, or one task delivered twice) write one row, count each
report once, and neither raises.

Class of failure: concurrent writers of one derived row. Invariant: a row that periodic tasks derive is written
idempotently (an upsert under the row's lock); a duplicate delivery or a race never aborts a pass.

Real PostgreSQL in autocommit (``transaction=True``), two threads with their own connections, the emulated
cluster's log endpoint held until both collectors wait on it, so both have read "no row yet" before either writes.
"""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from jobs.models import WorkloadMetrics
from jobs.workload import collect_attempt
from runners.kubernetes.runner import pod_of_node
from tests.support.racing import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)

LOG = ("config world_size=1 flops_per_token=1234567 tokens_per_step=4096\n"
       "step=10 loss=3.1000 tokens_per_s=900.0\n"
       "step=20 loss=2.5000 tokens_per_s=1100.0\n")


def collect_at_once(attempt, emulator, collectors: int = 2) -> list[BaseException]:
    """Run ``collect_attempt(attempt)`` in ``collectors`` threads released together; each thread's log read is
    held on the emulated API server until all of them wait there. Returns what the threads raised."""
    release = emulator.hold("GET", "/log")

    def release_when_all_wait() -> None:
        deadline = time.monotonic() + 10
        while emulator.held < collectors and time.monotonic() < deadline:
            time.sleep(0.01)
        waiting = emulator.held
        release.set()
        assert waiting == collectors, "the collectors did not all reach the log read"

    _, errors = run_concurrently(*[lambda: collect_attempt(attempt)] * collectors, release_when_all_wait)
    return errors


@pytest.mark.parametrize("log", [LOG, ""], ids=["reports", "no-reports"])
@pytest.mark.parametrize("ended", [False, True], ids=["live", "ended"])
def test_two_collectors_of_one_attempt_write_one_row_and_raise_nothing(live_clusters, log, ended):
    """Five rounds: the row is removed, then two collectors read the attempt's log at once; then five more with
    the row in place. Every round: no exception, at most one row (none only while a live attempt reported
    nothing), each report counted once, and an ended attempt's row complete."""
    world = live_clusters
    attempt = world.running("gcp-usc1")
    emulator = world.emulator(attempt)
    emulator.write_log(pod_of_node(emulator.pods(attempt.pk), 0)["metadata"]["name"], log)
    if ended:
        attempt.ended_at = timezone.now()  # as a collector that loaded it after its end sees it
    expect_row = bool(log) or ended

    for round_ in range(10):
        if round_ < 5:
            WorkloadMetrics.objects.filter(attempt=attempt).delete()
        errors = collect_at_once(attempt, emulator)
        assert errors == [], f"round {round_}: {errors!r}"
        rows = list(WorkloadMetrics.objects.filter(attempt=attempt))
        assert len(rows) == int(expect_row), f"round {round_}"
        if rows:
            assert rows[0].stats.get("reports", 0) == (2 if log else 0)
            assert rows[0].complete == ended
