"""Benchmark of the training-efficiency computations (``jobs/efficiency/``), pure, no database.

* The memory-fit check of a submission that declares a model: ``fit_errors`` for one that fits (what every
  declared submission pays) and one that does not (the estimate, then the smallest change of each kind,
  bisection over node counts included), against a baseline every submission already pays: the JSON encoding
  of its spec (``jobs.spec.spec_size_bytes`` measures the spec's size that way).
* The collection of workload reports: parsing 10,000 log lines as ``examples/train_gpt.py`` prints them and
  keeping them in ``RunStats``, against a bare ``str.split`` of the same lines.

CPU time of this process (the only one involved), best of 5; ends with one JSON line.
Run: ``.venv/bin/python benchmarks/efficiency.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.procstat import machine  # noqa: E402
from jobs.efficiency.memory import Layout, fit_errors  # noqa: E402
from jobs.efficiency.protocol import RunStats, parse_log  # noqa: E402

SPEC = {
    "image": "python:3.11", "command": ["python", "train.py"], "args": ["--steps", "1000"], "env": {"A": "1"},
    "resources": {"accelerator": "H100-80GB", "gpus_per_node": 8, "nodes": 4, "cpu": 16, "memory_gib": 256},
    "priority": "normal", "max_runtime_seconds": 86400, "preemptible": False, "max_retries": 2,
    "placement": {"providers": [], "regions": [], "clusters": []},
    "model": {"layers": 32, "hidden_size": 4096, "heads": 32, "vocab_size": 50257, "sequence_length": 2048,
              "micro_batch_size": 4, "precision": "bf16", "optimizer": "adam", "activation_recomputation": "none"},
    "parallelism": {"zero_stage": 1, "tensor_parallel": 2, "pipeline_parallel": 1, "sequence_parallel": True},
}
CATALOG = [("L4", 24), ("A100-80GB", 80), ("H100-80GB", 80), ("H200-141GB", 141)]
LINES = 10_000


def cpu_ms(fn, repeat: int, rounds: int = 5) -> float:
    """Best CPU milliseconds per call of ``fn`` over ``rounds`` rounds of ``repeat`` calls."""
    best = float("inf")
    for _ in range(rounds):
        c0 = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, (time.process_time() - c0) / repeat)
    return best * 1000


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    model, parallelism = SPEC["model"], SPEC["parallelism"]
    layout = Layout(32, parallelism["zero_stage"], parallelism["tensor_parallel"], 1, True)
    big = {**model, "micro_batch_size": 16}  # activations over 80 GiB: refused, with suggestions

    def fits():
        assert fit_errors(model, layout, "H100-80GB", 80, gpus_per_node=8, accelerators=CATALOG) == {}

    def refused():
        assert fit_errors(big, layout, "H100-80GB", 80, gpus_per_node=8, accelerators=CATALOG)

    def encode():
        json.dumps(SPEC, separators=(",", ":"), ensure_ascii=False, default=str).encode()

    fits_ms, refused_ms, encode_ms = cpu_ms(fits, 2000), cpu_ms(refused, 500), cpu_ms(encode, 2000)
    log = "config flops_per_token=1234567 tokens_per_step=12288 peak_tflops=989 (table)\n" + "".join(
        f"step={s} loss={5 - s / LINES:.4f} tokens_per_s={100000 + s % 97:.1f} mfu=41.2000\n"
        for s in range(1, LINES + 1))

    def collect():
        stats = RunStats()
        stats.add_all(parse_log(log), at=0.0)
        assert stats.reports == LINES

    def split():
        for line in log.splitlines():
            line.split()

    collect_ms, split_ms = cpu_ms(collect, 3), cpu_ms(split, 3)
    refusal = fit_errors(big, layout, "H100-80GB", 80, gpus_per_node=8, accelerators=CATALOG)["model"][1]
    print(f"fit check {fits_ms * 1000:.1f} us (refusal {refused_ms * 1000:.1f} us) vs spec encoding "
          f"{encode_ms * 1000:.1f} us; {LINES} log lines {collect_ms:.1f} ms vs split {split_ms:.1f} ms; "
          f"{refusal}", file=sys.stderr)
    print(json.dumps({
        "benchmark": "efficiency",
        "fit_check_cpu_us": round(fits_ms * 1000, 2),
        "fit_refusal_cpu_us": round(refused_ms * 1000, 2),
        "baseline_spec_encoding_cpu_us": round(encode_ms * 1000, 2),
        "fit_check_over_encoding": round(fits_ms / encode_ms, 2),
        "fit_refusal_over_encoding": round(refused_ms / encode_ms, 2),
        "log_lines": LINES,
        "collect_cpu_us_per_line": round(collect_ms * 1000 / LINES, 3),
        "baseline_split_cpu_us_per_line": round(split_ms * 1000 / LINES, 3),
        "collect_over_split": round(collect_ms / split_ms, 2),
        **machine(),
    }))


if __name__ == "__main__":
    main()
