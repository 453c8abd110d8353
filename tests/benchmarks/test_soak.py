"""The soak at a short duration: the demo's processes under its supervisor survive a killed broker and a killed
worker (the fast queue's; the slow queue's has its own) while a client submits, cancels and follows logs; nothing is lost or stuck, nobody sees a 500, only the
killed components restarted, and every component's memory is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_loses_nothing_and_restarts_only_what_was_killed():
    proc = subprocess.run([sys.executable, "benchmarks/soak.py", "--seconds", "50", "--interval", "2",
                           "--fault-every", "15", "--grace", "10", "--warmup", "5", "--sample-every", "5",
                           "--drain", "90"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [f["kind"] for f in result["faults"]] == ["broker_kill", "worker_kill"]  # at 15 s and 30 s
    assert [f["component"] for f in result["faults"]] == ["broker", "worker-fast"]
    assert result["restarts"] == {"broker": 1, "web": 0, "worker-fast": 1, "worker-slow": 0, "beat": 0}
    assert result["unexpected_exits"] == {"broker": 0, "web": 0, "worker-fast": 0, "worker-slow": 0, "beat": 0}
    assert result["supervisor_failure"] is None
    assert result["by_kind"]["submit"] >= 10 and result["by_kind"]["cancel"] >= 1 and result["by_kind"]["logs"] >= 1
    assert result["jobs_submitted"] == sum(result["jobs_by_state"].values())
    assert (result["jobs_lost"], result["jobs_stuck"], result["http_500"]) == (0, 0, 0)
    assert result["server_errors_outside_faults"] == 0, result["server_errors_first"]
    assert set(result["rss_mib"]) == {"broker", "web", "worker-fast", "worker-slow", "beat"}
    assert all(m["first"] > 0 and m["last"] > 0 for m in result["rss_mib"].values())
    assert result["goals_met"] is True
