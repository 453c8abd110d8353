"""The arithmetic of ``benchmarks/scale_out.py``'s figures: CPU per attempt and round by process, each worker's share
of the clusters and attempts it reconciled, and the average with one full round in N."""

from __future__ import annotations

import pytest

from benchmarks.scale_out import averaged, us_per_attempt, worker_shares


def test_cpu_per_attempt_divides_by_attempts_and_rounds_and_sums_the_platform_apart_from_the_emulators():
    # 2.5 s of the workers over 2 rounds of 50,000 attempts: 2.5e6 us / 100,000 = 25 us.
    figures = us_per_attempt({"workers": 2.5, "postgres": 0.5, "redis-server": 0.1, "emulator": 4.0}, 50_000, 2)
    assert figures == {"workers": 25.0, "postgres": 5.0, "redis-server": 1.0, "emulator": 40.0,
                       "platform": 31.0, "total": 71.0}


def test_a_process_not_read_leaves_its_figure_and_every_sum_that_needs_it_unknown():
    figures = us_per_attempt({"workers": 1.0, "postgres": None, "redis-server": 0.0, "emulator": 1.0}, 1000, 1)
    assert figures["workers"] == 1000.0
    assert figures["postgres"] is None
    assert figures["platform"] is None and figures["total"] is None


def test_no_attempts_gives_no_figure_rather_than_a_division_by_zero():
    assert us_per_attempt({"workers": 1.0}, 0, 3) == {"workers": None, "platform": None, "total": None}


def test_each_worker_is_credited_with_the_attempts_of_the_clusters_it_took_over_every_round():
    attempts = {1: 3000, 2: 1000, 3: 1000}
    # Two rounds: scale0 took cluster 1 twice, scale1 clusters 2 and 3 twice; scale2 took nothing.
    taken = [("scale0", 1), ("scale1", 2), ("scale1", 3), ("scale1", 2), ("scale0", 1), ("scale1", 3)]
    shares = worker_shares(taken, attempts, {"scale0": 3.0, "scale1": 1.0, "scale2": 0.0})
    assert shares["scale0"] == {"clusters": 2, "attempts": 6000, "attempt_share": 0.6, "cpu_s": 3.0,
                                "cpu_share": 0.75}
    assert shares["scale1"] == {"clusters": 4, "attempts": 4000, "attempt_share": 0.4, "cpu_s": 1.0,
                                "cpu_share": 0.25}
    assert shares["scale2"] == {"clusters": 0, "attempts": 0, "attempt_share": 0.0, "cpu_s": 0.0,
                                "cpu_share": 0.0}
    assert sum(s["attempts"] for s in shares.values()) == 2 * sum(attempts.values())


def test_a_pass_on_an_unknown_cluster_is_an_error_not_a_silent_zero():
    with pytest.raises(KeyError):
        worker_shares([("scale0", 9)], {1: 10}, {"scale0": 1.0})


def test_the_average_counts_one_full_round_in_n():
    # One full round of 300 us and 59 steady ones of 20 us: (300 + 59 * 20) / 60 = 24.67 us.
    assert averaged(20.0, 300.0, 60) == 24.67
    assert averaged(20.0, 300.0, 1) == 300.0
    assert averaged(None, 300.0, 60) is None
