"""Fair sharing over time through the pass, on the control plane's clock (``time_machine``): a team that used 8 GPUs
for a week yields to a team that starts using one GPU, until the two teams' decayed usages cross, and from then on
goes first; the flip happens exactly where the closed forms of the two usages, worked out here, say it does.

alpha holds 8 GPUs for one half-life (a week, the default); then beta holds 1 GPU from then on. With
``c = h / ln 2`` and ``x = 2 ** (-(t - end) / h)``, alpha's decayed usage is ``8 c (x - x/2) = 4 c x`` and beta's
``c (1 - x)``: they are equal at ``x = 1/5``, ``log2(5)`` half-lives after alpha stopped. Each team then queues an
8-GPU job (alpha's first) and only one fits: before the crossing beta's goes, after it alpha's.
"""

import datetime as dt
import math
from decimal import Decimal

import pytest
import time_machine

from jobs.lifecycle import end_attempt
from jobs.models import JobAttempt, JobState
from jobs.scheduling.core import decide
from jobs.scheduling.passes import schedule_pending
from jobs.scheduling.snapshot import load_snapshot
from jobs.scheduling.usage import decayed_usage, fair_usage, sample_usage
from quotas.models import Team, TeamUsage
from tests.support.factories import fresh, run

S = JobState
pytestmark = pytest.mark.django_db
START = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)


def closed_forms(t: dt.datetime, end: dt.datetime, half_life: int) -> tuple[float, float]:
    """(alpha's, beta's) decayed GPU-seconds at ``t``, alpha having held 8 GPUs over the half-life before ``end``
    and beta 1 GPU since ``end``."""
    c = half_life / math.log(2)
    x = 2 ** (-(t - end).total_seconds() / half_life)
    return 8 * c * (x - x * 2 ** -1), c * (1 - x)


def first_admitted_team(now: dt.datetime) -> int:
    """The team whose job a pass on the state at ``now`` would admit first (nothing is written)."""
    decisions = decide(load_snapshot(now).snapshot)
    return decisions.admissions[0].job.team_id


def test_a_team_that_used_the_fleet_for_a_week_yields_until_the_decayed_usages_cross(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job, settings):
    h = settings.FAIR_SHARING_USAGE_HALF_LIFE_SECONDS
    assert h == 604800  # the default: Slurm's PriorityDecayHalfLife
    cluster_factory("big", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=16)
    quota_factory(beta, h100, nominal=16)
    with time_machine.travel(START, tick=False) as clock:
        week = queue_job(alpha, 8, max_runtime=2 * h)
        assert schedule_pending().admitted == [week.pk]
        _, attempt = run(week)

        end = START + dt.timedelta(seconds=h)
        clock.move_to(end)
        end_attempt(fresh(week), attempt, S.SUCCEEDED, reason="done", end_reason=JobAttempt.EndReason.SUCCEEDED,
                    exit_code=0)
        one = queue_job(beta, 1, max_runtime=10 * h)
        assert schedule_pending().admitted == [one.pk]
        run(one)
        mine, theirs = queue_job(alpha, 8), queue_job(beta, 8)  # alpha's first: without decay alpha's goes

        crossing = end + dt.timedelta(seconds=h * math.log2(5))
        points = [end + dt.timedelta(hours=12 * k) for k in range(1, 11)]
        points += [crossing - dt.timedelta(seconds=1), crossing + dt.timedelta(seconds=1)]
        for now in sorted(points):
            clock.move_to(now)
            sample_usage(now)  # the stored state moves forward on some points, not on others (every 300 s at most)
            a, b = closed_forms(now, end, h)
            got = decayed_usage(now)
            assert math.isclose(float(got[alpha.pk]), a, rel_tol=1e-9)
            assert math.isclose(float(got[beta.pk]), b, rel_tol=1e-9)
            expected = beta.pk if b < a else alpha.pk
            assert first_admitted_team(now) == expected, (now, a, b)
        # and a committed pass just after the crossing admits alpha's job, beta's waiting for capacity
        assert schedule_pending().admitted == [mine.pk]
        assert fresh(theirs).queue_info["reason"] == "capacity"


def test_turned_off_the_order_is_the_one_of_what_runs_now(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job, settings):
    settings.FAIR_SHARING_USAGE_HALF_LIFE_SECONDS = 0
    cluster_factory("big", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=16)
    quota_factory(beta, h100, nominal=16)
    with time_machine.travel(START, tick=False) as clock:
        week = queue_job(alpha, 8, max_runtime=2 * 604800)
        schedule_pending()
        _, attempt = run(week)
        clock.shift(604800)
        end_attempt(fresh(week), attempt, S.SUCCEEDED, reason="done", end_reason=JobAttempt.EndReason.SUCCEEDED,
                    exit_code=0)
        queue_job(alpha, 8), queue_job(beta, 8)
        assert first_admitted_team(START + dt.timedelta(seconds=604800)) == alpha.pk  # the earlier submission
    assert not TeamUsage.objects.exists() and decayed_usage(START) == {}


def test_concurrent_samples_move_a_row_once(alpha, beta, settings):
    with time_machine.travel(START, tick=False) as clock:
        assert sample_usage(START) == 0  # the rows are made at 0
        later = START + dt.timedelta(seconds=settings.FAIR_SHARING_USAGE_SAMPLING_SECONDS)
        clock.move_to(later)
        assert sample_usage(later) == Team.objects.count()
        assert sample_usage(later) == 0  # compare-and-set: already moved to this time
        assert sample_usage(later - dt.timedelta(seconds=1)) == 0  # never back in time
    assert set(TeamUsage.objects.values_list("sampled_at", flat=True)) == {later}
    assert set(TeamUsage.objects.values_list("gpu_seconds", flat=True)) == {Decimal(0)}


def test_the_figures_shown_are_decayed_gpu_hours_weight_and_cohort_share(
        cluster_factory, quota_factory, h100, alpha, beta, queue_job, settings):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=16)
    Team.objects.filter(pk=alpha.pk).update(weight=Decimal("2"))
    with time_machine.travel(START, tick=False) as clock:
        sample_usage(START)
        job = queue_job(alpha, 4, max_runtime=7200)
        schedule_pending()
        run(job)
        clock.shift(3600)
        rows = {f.slug: f for f in fair_usage(Team.objects.select_related("cohort"), START + dt.timedelta(hours=1))}
    h = settings.FAIR_SHARING_USAGE_HALF_LIFE_SECONDS
    gpu_hours = 4 * h / math.log(2) * (1 - 2 ** (-3600 / h)) / 3600  # 4 GPUs for an hour, decayed to its end
    a = rows[alpha.slug]
    assert math.isclose(float(a.decayed_gpu_hours), gpu_hours, rel_tol=1e-6)
    assert math.isclose(float(a.weighted_gpu_hours), gpu_hours / 2, rel_tol=1e-6)
    assert a.weight == Decimal("2") and a.cohort_share == Decimal(1) and a.half_life_seconds == h
    assert rows[beta.slug].decayed_gpu_hours == 0 and rows[beta.slug].cohort_share == 0
    assert [f.slug for f in rows.values()][0] == beta.slug  # listed in the scheduler's order, least used first
