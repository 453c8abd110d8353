"""The array phase's pure parts: Slurm's ``--array`` value and ``MaxArraySize``, the generated slurm.conf, and the
per-element CPU figures and ratios of ``benchmarks/submit.py``."""

from __future__ import annotations

import pytest

from benchmarks import slurm as slurm_peer
from benchmarks.submit import array_versus_slurm, summarize_array


@pytest.mark.parametrize(("count", "parallelism", "expected"), [
    (1000, None, "0-999"), (50, 8, "0-49%8"), (1, None, "0"), (10, 10, "0-9"), (10, 20, "0-9"),
])
def test_array_indices_are_zero_based_with_a_limit_only_below_the_count(count, parallelism, expected):
    assert slurm_peer.array_indices(count, parallelism) == expected


@pytest.mark.parametrize(("count", "parallelism"), [(0, None), (5, 0), (-1, 2)])
def test_array_indices_refuse_empty_arrays_and_zero_parallelism(count, parallelism):
    with pytest.raises(ValueError):
        slurm_peer.array_indices(count, parallelism)


@pytest.mark.parametrize(("count", "expected"), [(1, 1001), (1000, 1001), (1001, 1001), (1002, 1002), (5000, 5000)])
def test_max_array_size_holds_the_last_index_and_keeps_slurms_default(count, expected):
    assert slurm_peer.max_array_size(count) == expected


def test_the_generated_conf_raises_max_array_size_and_sbatch_submits_one_held_array():
    peer = slurm_peer.SlurmPeer(array_count=4000)  # writes its slurm.conf; no daemon starts before start()
    try:
        lines = peer.conf.read_text().splitlines()
        argv = peer.sbatch_array_argv("sweep", 4000)
    finally:
        peer.stop()
    assert [line for line in lines if line.startswith("MaxArraySize=")] == ["MaxArraySize=4000"]
    assert argv[:4] == ["sbatch", "--hold", "--parsable", "--array=0-3999"]
    assert argv[argv.index("-J") + 1] == "sweep" and argv[-2:] == ["--wrap", "true"]
    assert not peer.conf.exists()


def _sample(elements, cpu, client=0.01, elapsed=0.05, errors=0):
    return {"elements": elements, "errors": errors, "error_sample": ["boom"] if errors else [], "elapsed": elapsed,
            "cpu": cpu, "client_cpu": client}


def test_cpu_per_element_sums_the_rounds_and_divides_by_the_elements_accepted():
    rounds = [_sample(1000, {"api": 0.030, "scheduler": 0.090, "postgres": 0.060, "redis-server": 0.0}),
              _sample(1000, {"api": 0.020, "scheduler": 0.110, "postgres": 0.080, "redis-server": 0.010}),
              _sample(0, {"api": 0.004, "scheduler": 0.0, "postgres": 0.0, "redis-server": 0.0}, errors=1)]
    got = summarize_array(rounds)
    # 2,000 elements accepted; the refused round's CPU is still charged to them.
    assert got["elements"] == 2000 and got["errors"] == 1 and got["error_sample"] == "boom"
    assert got["cpu_ms_per_element"] == {"api": 0.027, "scheduler": 0.1, "postgres": 0.07, "redis-server": 0.005}
    assert got["cpu_ms_per_element_total"] == pytest.approx(0.202)
    assert got["client_cpu_ms_per_element"] == pytest.approx(0.015)
    assert got["submit_ms"] == pytest.approx(50.0)
    assert summarize_array([]) is None


def test_the_ratio_is_the_platforms_processes_together_over_slurmctld_alone():
    platform = summarize_array([_sample(1000, {"api": 0.02, "scheduler": 0.1, "postgres": 0.06, "redis-server": 0.0})])
    slurm = summarize_array([_sample(1000, {"slurmctld": 0.004, "slurmd": 0.0, "munged": 0.001}),
                             _sample(1000, {"slurmctld": 0.006, "slurmd": 0.0, "munged": 0.0})])
    got = array_versus_slurm(platform, slurm)
    assert got["platform_cpu_ms_per_element"] == pytest.approx(0.18)
    assert got["slurm_cpu_ms_per_element"] == pytest.approx(0.005)  # 10 ms over 2,000 elements
    assert got["slurm_munged_cpu_ms_per_element"] == pytest.approx(0.0005)
    assert got["ratio_vs_slurm_cpu_per_element"] == pytest.approx(36.0)  # 0.18 / 0.005
    assert got["ratio_vs_slurm_cpu_per_element_with_munged"] == pytest.approx(32.727, abs=1e-3)  # 0.18 / 0.0055


def test_the_ratio_is_none_without_slurm_or_with_no_slurm_cpu_read():
    platform = summarize_array([_sample(10, {"api": 0.01})])
    assert array_versus_slurm(platform, None)["ratio_vs_slurm_cpu_per_element"] is None
    idle = summarize_array([_sample(10, {"slurmctld": 0.0, "slurmd": 0.0, "munged": 0.0})])
    assert array_versus_slurm(platform, idle)["ratio_vs_slurm_cpu_per_element"] is None
    assert array_versus_slurm(None, idle)["platform_cpu_ms_per_element"] is None
