"""The simulator in the test suite: every regression scenario (each the shortest world and action list that broke
its invariant before its fix) and a bounded run of seeded scenarios with every fault knob on, each played by
``benchmarks/simulate.py`` in a process of its own (the in-memory broker, the virtual clock) on a PostgreSQL
database of its own beside the test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.simulation.invariants import NAMES
from tests.support.simulation.regressions import REGRESSIONS

ROOT = Path(__file__).resolve().parents[2]
#: Seeds the suite plays with every fault knob on (``benchmarks/simulate.py --seeds N`` plays more).
SEEDS = 10


def simulate(args: list[str], suffix: str, **env: str) -> dict:
    """Run ``benchmarks/simulate.py args`` on its own database (the test server's, named ``cp_sim_<suffix>``
    after the suite's own database, so two suites on one server never share it) and return its JSON line."""
    server, _, own = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane").rpartition("/")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    own = "".join(c for c in own.split("?")[0] if c.isalnum() or c == "_")[:20]
    proc = subprocess.run([sys.executable, "benchmarks/simulate.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200, env={**os.environ,
                                             "BENCH_DATABASE_URL": f"{server}/cp_sim_{own}_{suffix}{worker}", **env})
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def regressions() -> dict:
    return simulate(["--regressions"], "regressions")["regressions"]


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_every_regression_scenario_breaks_no_invariant(regressions, name):
    assert regressions[name] == [], f"{name} ({REGRESSIONS[name][0].__doc__.split('.')[0]}): {regressions[name]}"


def test_the_admit_preempt_loop_is_seen_when_the_protection_is_off():
    """The invariant can fail: with a protection that lasts 0 s the borrower is reclaimed before every dispatch
    again, and ``bounded_preemption_before_run`` says so."""
    result = simulate(["--regressions", "admit_preempt_loop"], "loop", PREEMPTION_PROTECTION_SECONDS="0")
    broken = {v[0] for v in result["regressions"]["admit_preempt_loop"]}
    assert "bounded_preemption_before_run" in broken


def test_seeded_scenarios_with_every_fault_break_no_invariant():
    result = simulate(["--seeds", str(SEEDS), "--workers", "2"], "seeds")
    assert result["scenarios"] == SEEDS
    assert result["faults_injected"] > 0
    assert set(result["violations"]) == set(NAMES)
    assert result["violations_total"] == 0, json.dumps(result["failing"], indent=1)[:4000]


def test_one_seed_replays_the_same_run():
    """Determinism: the same seed twice gives the same deliveries, faults and outcome."""
    first = simulate(["--seed", "3", "--digest"], "replay")
    second = simulate(["--seed", "3", "--digest"], "replay")
    assert first["digest"] == second["digest"]
