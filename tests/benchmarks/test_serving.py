"""The serving benchmark at its quick size: the autoscaled service goes 1 -> 3 -> 1 replicas under the stepped load,
no request fails (a killed replica and a rolling update included), and it spends fewer GPU-hours per million requests than the fixed
deployment sized for the peak on the same load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_serving_benchmark_follows_the_load_and_costs_less_than_the_peak_deployment():
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane")
    env = {**os.environ, "BENCH_DATABASE_URL": f"{base}_bench_serving"}  # beside the suite's own database
    proc = subprocess.run([sys.executable, "benchmarks/serving.py", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    seen = result["replicas_seen"]
    assert seen[0] == 1 and 3 in seen and seen[-1] == 1 and seen.index(3) < len(seen) - 1
    assert result["scale_up_seconds"] > 0 and result["scale_down_seconds"] > 0
    assert result["failed_requests"] == 0 and result["failed_requests_replica_loss"] == 0
    assert result["replica_loss_requests"] > 0
    auto, fixed = result["gpu_hours_per_million_requests"]["autoscaled"], result["gpu_hours_per_million_requests"]["fixed"]
    assert result["gpu_hours_per_million_requests_ratio_vs_fixed"] == round(auto / fixed, 3) < 1
    figures = result["figures_autoscaled"]
    # the product's samples end at its passes (every 2 s), not where the load starts and stops: a few requests of the
    # low rate at either edge may fall on the other side
    assert abs(figures["requests"] - result["requests"]["autoscaled"]["requests"]) <= 10 and figures["errors"] == 0
    assert figures["latency_p50_ms"] <= figures["latency_p99_ms"]
    assert [n for _, n in figures["replicas"]][0] == 1 and 3 in [n for _, n in figures["replicas"]]
    assert result["proxy_cpu_ms_per_request"] > 0
    assert result["failed_requests_rolling_update"] == 0 and result["rolling_update"]["state"] == "done"
    assert result["rolling_update"]["requests"] > 0
    assert result["goal_met"] is True
