"""A pass re-checks and writes its admissions together: its queries do not grow with the number of jobs it admits,
and each admission it re-checks counts against the room left for the next one.

Twelve admissions cost the queries of two (the locks, the locked snapshot and the bulk writes are per pass, not per
admission); each admitted job still gets its own attempt and one ADMITTED event.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import JobEvent, JobState
from jobs.scheduling.core import FairShareScheduler
from jobs.scheduling.passes import run_pass, schedule_pending
from jobs.scheduling.snapshot import load_snapshot
from tests.support.factories import fresh, make_attempt, make_job_row

S = JobState

pytestmark = pytest.mark.django_db


def admitting_pass(jobs: list) -> int:
    """Queries of one pass that must admit every job of ``jobs``."""
    with CaptureQueriesContext(connection) as ctx:
        result = schedule_pending()
    assert sorted(result.admitted) == sorted(j.pk for j in jobs)
    return len(ctx.captured_queries)


def test_a_pass_admitting_twelve_jobs_runs_as_many_queries_as_one_admitting_two(
        cluster_factory, quota_factory, budget_factory, h100, alpha, beta, queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    cluster_factory("other", "gcp", "us-central1", h100, nodes=4, price="7.00")
    for team in (alpha, beta):
        quota_factory(team, h100, nominal=32)
        budget_factory(team, "100000.00")  # block budgets: the teams' totals rows are locked and read too

    admitting_pass([queue_job(team, 1) for team in (alpha, beta)])  # the first creates the teams' totals rows

    two = admitting_pass([queue_job(team, 2) for team in (alpha, beta)])
    twelve = admitting_pass([queue_job(team, 2) for team in (alpha, beta) * 6])

    assert twelve == two
    admitted = JobEvent.objects.filter(to_state=S.ADMITTED)
    assert admitted.count() == 16 and len({e.job_id for e in admitted}) == 16
    for event in admitted:
        job = fresh(event.job)
        assert job.state == S.ADMITTED and event.attempt_id == job.current_attempt_id
        assert job.attempts.count() == 1 and job.current_attempt.object_name == f"job-{job.pk}-1-{job.current_attempt.uid.hex[:8]}"


def test_admissions_rechecked_together_never_take_more_than_the_locked_pool_holds(
        cluster_factory, quota_factory, h100, alpha, beta, user, queue_job):
    """The pass decided two 4-GPU jobs on a free 8-GPU node; another admission took 4 of them before they commit:
    each fits alone, but only one fits after the other, so one is admitted and the other waits for capacity."""
    cluster, pool = cluster_factory("one", "aws", "us-east-1", h100, nodes=1, price="6.88")
    quota_factory(alpha, h100, nominal=16)
    quota_factory(beta, h100, nominal=16)
    first, second = queue_job(alpha, 4), queue_job(alpha, 4)
    now = timezone.now()
    loaded = load_snapshot(now)
    decisions = FairShareScheduler(loaded.snapshot).full_pass()
    assert len(decisions.admissions) == 2
    other = make_job_row(beta, user, h100, name="elsewhere", gpus_per_node=4)
    make_attempt(other, cluster, pool, state=S.ADMITTED)

    result = run_pass(loaded, decisions, now)

    assert result.admitted == [first.pk]
    assert fresh(first).state == S.ADMITTED
    waiting = fresh(second)
    assert waiting.state == S.QUEUED and waiting.queue_info["reason"] == "capacity"
    assert not waiting.attempts.exists()
