"""The workload-metrics protocol: log lines as examples/train_gpt.py prints them, Prometheus exposition, and the
last value and step-weighted mean kept per attempt (expected means worked out here)."""

from __future__ import annotations

import pytest

from jobs.efficiency.protocol import (
    SERIES_MAX_POINTS,
    Report,
    RunStats,
    last_throughput,
    later_throughput,
    parse_exposition,
    parse_line,
    parse_log,
)

LOG = """\
config world_size=2 backend=gloo device=cpu params=199936 flops_per_token=1234567 tokens_per_step=12288 peak_tflops=1 (CPU nominal) threads=1
step=1 loss=5.6000 tokens_per_s=1000.0 mfu=0.0100
step=20 loss=3.0000 tokens_per_s=4000.0 mfu=0.0400
uploaded checkpoint step=20 to memory://bucket/checkpoint.pt
step=40 loss=2.0000 tokens_per_s=2000.0 mfu=0.0200
final step=40 loss=2.0000 first_loss=5.6000 tokens_per_s=2500.5 mfu=0.0250 elapsed_s=9.00 world_size=2
step=41 loss=1.9 tokens_per_s=3"""  # a partial last line: not read yet


def test_the_log_yields_declarations_progress_and_the_final_summary():
    reports = parse_log(LOG)
    assert [r.kind for r in reports] == ["declaration", "progress", "progress", "progress", "final"]
    assert reports[0].values == {"flops_per_token": 1234567.0, "tokens_per_step": 12288.0}
    assert reports[2].values == {"step": 20.0, "loss": 3.0, "tokens_per_s": 4000.0, "mfu": 0.04}


@pytest.mark.parametrize("line", ["resumed from step 100 checkpoint=x", "step=nan loss=1", "step=1.5 loss=2",
                                  "", "loss=1 tokens_per_s=2"])
def test_lines_without_a_report_are_ignored(line):
    assert parse_line(line) is None


def test_last_and_step_weighted_means():
    stats = RunStats()
    stats.add_all(parse_log(LOG), at=100.0)
    assert stats.last == {"step": 40.0, "loss": 2.0, "tokens_per_s": 2000.0, "mfu": 0.02}
    # Intervals of 1, 19 and 20 steps: throughput = 40 steps / (1/1000 + 19/4000 + 20/2000) s per token-step.
    assert stats.mean("tokens_per_s") == pytest.approx(40 / (1 / 1000 + 19 / 4000 + 20 / 2000))
    assert stats.mean("loss") == pytest.approx((1 * 5.6 + 19 * 3.0 + 20 * 2.0) / 40)
    assert stats.run_tokens_per_s == 2500.5  # the run's own summary wins over the mean
    assert stats.tokens == 12288 * 40  # steps 1..40 at 12,288 tokens per step
    assert stats.flops_per_token == 1234567.0


def test_reading_the_same_log_again_counts_nothing_twice():
    stats = RunStats()
    stats.add_all(parse_log(LOG), at=1.0)
    before = stats.to_dict()
    assert not stats.add_all(parse_log(LOG), at=2.0)
    assert stats.to_dict() == before
    assert RunStats.from_dict(before).to_dict() == before


def test_without_a_summary_the_run_throughput_is_the_mean():
    stats = RunStats()
    stats.add_all(parse_log("step=10 tokens_per_s=100 tokens=5000\nstep=20 tokens_per_s=300 tokens=8000\n"), at=1.0)
    # The first report counts for 1 step (no earlier step is known), the second for 10.
    assert stats.run_tokens_per_s == pytest.approx(11 / (1 / 100 + 10 / 300))
    assert stats.tokens == 8000  # the reported count wins over tokens_per_step


def test_the_series_stays_bounded_and_keeps_the_newest_point():
    stats = RunStats()
    for step in range(1, 3 * SERIES_MAX_POINTS):
        stats.add(Report("progress", {"step": step, "tokens_per_s": float(step)}), at=float(step))
    assert len(stats.series) <= SERIES_MAX_POINTS
    assert stats.series[-1][1] == 3 * SERIES_MAX_POINTS - 1 and stats.series[0][1] == 1


def test_one_scrape_of_the_exposition_is_a_progress_report():
    text = """# HELP workload_step Optimizer steps done.
# TYPE workload_step gauge
workload_step 120
# TYPE workload_tokens_per_second gauge
workload_tokens_per_second 5120.5
# TYPE workload_loss gauge
workload_loss 2.25
# TYPE workload_model_flops_per_token gauge
workload_model_flops_per_token 1.5e6
# TYPE workload_tokens counter
workload_tokens_total 614400
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3.5
"""
    report = parse_exposition(text)
    assert report == Report("progress", {"step": 120.0, "tokens_per_s": 5120.5, "loss": 2.25,
                                         "flops_per_token": 1.5e6, "tokens": 614400.0})
    assert parse_exposition("# TYPE other gauge\nother 1\n") is None


def test_a_pod_s_last_throughput_is_its_last_report_that_carries_one():
    log = ("step=1 tokens_per_s=40 samples_per_s=2\nstep=2 tokens_per_s=42.5\nstep=3 loss=1.0\n"
           "config flops_per_token=1e9\n")
    assert last_throughput(parse_log(log)) == {"step": 2, "tokens_per_s": 42.5, "samples_per_s": None,
                                               "final": False}
    summary = last_throughput(parse_log(log + "final step=3 tokens_per_s=41.0\n"))
    assert summary == {"step": 3, "tokens_per_s": 41.0, "samples_per_s": None, "final": True}
    assert last_throughput(parse_log("step=1 loss=2\n")) is None


def test_a_kept_throughput_moves_only_to_a_later_step_or_that_step_s_summary():
    kept = {"step": 5, "tokens_per_s": 10.0, "final": False}
    assert not later_throughput(kept, {"step": 4, "tokens_per_s": 99.0, "final": True})  # an older tail
    assert not later_throughput(kept, {**kept, "tokens_per_s": 11.0})  # the same report read again
    assert later_throughput(kept, {"step": 5, "tokens_per_s": 9.0, "final": True})
    assert later_throughput(kept, {"step": 6, "tokens_per_s": 9.0, "final": False})
    assert later_throughput(None, kept) and not later_throughput(kept, None)
