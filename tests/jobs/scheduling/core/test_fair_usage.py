"""Fair sharing over time on the pure core: the decayed usage's arithmetic (checked against the closed forms in
floating point), the order between teams by weighted decayed usage, ties broken as without it, and the reclaim
victims taken from the team with the most weighted decayed usage first.

One accelerator; teams are numbered; GPU counts are whole GPUs; usages GPU-seconds.
"""

import dataclasses
import math
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import FairShareScheduler
from jobs.scheduling.core.usage import (
    QUANTUM,
    US,
    advance,
    decay_factor,
    entry_penalty,
    held_integral,
    weighted_usage,
)
from tests.support.scheduling import admitted, decide, job, pool, running, snapshot, team

WEEK = 7 * 24 * 3600


def used(t, gpu_seconds: str):
    """``t`` with a decayed usage of ``gpu_seconds``."""
    return dataclasses.replace(t, fair_usage=Decimal(gpu_seconds))


# --- the arithmetic ----------------------------------------------------------------------------------------

def test_a_gpu_second_counts_half_after_one_half_life_and_a_quarter_after_two():
    assert decay_factor(WEEK * US, WEEK).quantize(QUANTUM) == Decimal("0.5")
    assert decay_factor(2 * WEEK * US, WEEK).quantize(QUANTUM) == Decimal("0.25")
    assert decay_factor(0, WEEK) == 1


def test_one_gpu_held_for_a_half_life_is_worth_the_closed_form_integral():
    # integral over [0, h] of 2 ** (-(h - s) / h) ds = h / ln 2 * (1 - 1/2)
    h = 3600
    expected = h / math.log(2) * 0.5
    got = held_integral(1000, 0, h * US, h * US, h)
    assert math.isclose(float(got), expected, rel_tol=1e-12)
    # a quarter of a GPU (250 milli-GPUs) counts a quarter
    assert math.isclose(float(held_integral(250, 0, h * US, h * US, h)), expected / 4, rel_tol=1e-12)


def test_advance_decays_the_stored_usage_and_adds_only_the_spans_inside_the_window():
    h = 1000
    # 8 GPUs from -500 s to 200 s, a quarter GPU still held since 100 s; window (0, 300]
    spans = [(8000, -500 * US, 200 * US), (250, 100 * US, None)]
    got = advance(Decimal("1000"), 0, 300 * US, spans, h)
    f = lambda s: 2 ** (-s / h)  # noqa: E731
    expected = (1000 * f(300) + 8 * h / math.log(2) * (f(100) - f(300))
                + 0.25 * h / math.log(2) * (f(0) - f(200)))
    assert math.isclose(float(got), expected, rel_tol=1e-12)
    assert got == got.quantize(QUANTUM)


@settings(max_examples=60, deadline=None)
@given(usage=st.integers(0, 10**12), cut=st.integers(1, 10**6), rest=st.integers(1, 10**6),
       spans=st.lists(st.tuples(st.integers(1, 64_000), st.integers(-10**6, 2 * 10**6),
                                st.one_of(st.none(), st.integers(0, 3 * 10**6))), max_size=6),
       half_life=st.integers(1, 10**6))
def test_sampling_twice_gives_what_sampling_once_gives(usage, cut, rest, spans, half_life):
    # times in milliseconds, scaled to microseconds; the decay of a sum is the sum of the decays
    spans = [(held, a * 1000, None if b is None else b * 1000) for held, a, b in spans]
    u = Decimal(usage) / 1000
    once = advance(u, 0, (cut + rest) * 1000, spans, half_life)
    twice = advance(advance(u, 0, cut * 1000, spans, half_life), cut * 1000, (cut + rest) * 1000, spans, half_life)
    assert abs(once - twice) <= 2 * QUANTUM


def test_the_weighted_usage_divides_by_the_weight_and_a_weight_of_zero_comes_last():
    assert weighted_usage(Decimal("300"), 1.5) == Decimal("200")
    assert weighted_usage(Decimal("1"), 0.0) == Decimal("Infinity")


# --- the order between teams ------------------------------------------------------------------------------

def test_the_team_with_less_weighted_decayed_usage_goes_first_when_only_one_job_fits():
    first, second = job(1, 8, at=1), job(2, 8, at=2)
    d, _ = decide([used(team(1, 8), "100"), used(team(2, 8), "50")], [pool(1, 8)], [first, second])
    assert admitted(d) == [second.job_id]
    assert d.waiting[first.job_id].reason == "capacity"


def test_weight_divides_the_decayed_usage():
    # team 1: 100 / 4 = 25 < team 2: 50 / 1
    first, second = job(1, 8, at=2), job(2, 8, at=1)
    d, _ = decide([used(team(1, 8, weight=4.0), "100"), used(team(2, 8), "50")], [pool(1, 8)], [first, second])
    assert admitted(d) == [first.job_id]


def test_equal_weighted_usages_fall_back_to_the_order_without_decay():
    # 100 / 2 == 50 / 1: the dominant shares tie too (nobody borrows), so the earlier submission goes
    first, second = job(1, 8, at=1), job(2, 8, at=2)
    d, _ = decide([used(team(1, 8, weight=2.0), "100"), used(team(2, 8), "50")], [pool(1, 8)], [first, second])
    assert admitted(d) == [first.job_id]
    # and with no decayed usage at all (fair sharing over time off), the same
    first, second = job(1, 8, at=1), job(2, 8, at=2)
    d, _ = decide([team(1, 8), team(2, 8)], [pool(1, 8)], [first, second])
    assert admitted(d) == [first.job_id]


def test_priority_still_comes_before_the_decayed_usage():
    heavy_high, idle = job(1, 8, priority=1000, at=2), job(2, 8, at=1)
    d, _ = decide([used(team(1, 8), "1000000"), team(2, 8)], [pool(1, 8)], [heavy_high, idle])
    assert admitted(d) == [heavy_high.job_id]


def test_an_admission_adds_the_entry_penalty_so_one_team_does_not_take_every_free_gpu_in_a_pass():
    # penalty 300 GPU-seconds per GPU: beta's first 8-GPU job brings it to 2400 > alpha's 1000, so alpha's job
    # goes next, then beta's second (alpha at 1000 + 2400 = 3400 > 2400)
    b1, b2, a1 = job(2, 8, at=1), job(2, 8, at=2), job(1, 8, at=3)

    def order(penalty: str) -> list[int]:
        snap = snapshot([used(team(1, 24), "1000"), team(2, 24)], [pool(1, 24)], [b1, b2, a1])
        snap.entry_penalty = Decimal(penalty)
        return admitted(FairShareScheduler(snap).full_pass())

    assert order("300") == [b1.job_id, a1.job_id, b2.job_id]
    assert order("0") == [b1.job_id, b2.job_id, a1.job_id]  # without it beta's usage stays 0 for the whole pass


def test_the_entry_penalty_is_one_gpu_over_one_sampling_interval_decayed():
    h, s = 604800, 300
    assert math.isclose(float(entry_penalty(s, h)), h / math.log(2) * (1 - 2 ** (-s / h)), rel_tol=1e-12)
    assert entry_penalty(0, h) == 0 and entry_penalty(s, 0) == 0


# --- reclaim victims ---------------------------------------------------------------------------------------

def _reclaim(team_1, team_2):
    # teams 1 and 2 (nominal 4 each) hold 8 each on a full 16-GPU pool of 4-GPU nodes; team 3 (nominal 8, using
    # nothing) asks 4 within its nominal: one 4-GPU job of a borrowing team must go
    runs = [running(1, 1, 4, 1, admitted=1), running(2, 1, 4, 1, admitted=2),
            running(3, 2, 4, 1, admitted=3), running(4, 2, 4, 1, admitted=4)]
    want = job(3, 4)
    d, _ = decide([team_1, team_2, team(3, 8)], [pool(1, 16, gpus_per_node=4)], [want], runs)
    assert admitted(d) == [want.job_id]
    return [v.job_id for v in d.admissions[0].victims]


def test_reclaim_takes_from_the_team_with_the_most_weighted_decayed_usage_first():
    assert _reclaim(team(1, 4, 8), team(2, 4, 8)) == [4]  # no decayed usage: the most recently admitted
    assert _reclaim(used(team(1, 4, 8), "900"), used(team(2, 4, 8), "300")) == [2]  # team 1's newest
    # weight 4 makes team 1's 900 count 225 < 300: team 2's newest
    assert _reclaim(used(team(1, 4, 8, weight=4.0), "900"), used(team(2, 4, 8), "300")) == [4]


def test_reclaim_still_takes_the_lowest_priority_first():
    runs = [running(1, 1, 4, 1, admitted=1), running(2, 1, 4, 1, admitted=2),
            running(3, 2, 4, 1, admitted=3, priority=100), running(4, 2, 4, 1, admitted=4)]
    want = job(3, 4)
    d, _ = decide([used(team(1, 4, 8), "900"), used(team(2, 4, 8), "300"), team(3, 8)],
                  [pool(1, 16, gpus_per_node=4)], [want], runs)
    assert [v.job_id for v in d.admissions[0].victims] == [3]
