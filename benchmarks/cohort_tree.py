"""Benchmark of trees of cohorts in the pure core (ADR 0046): one full pass over ``schedule.build``'s snapshot with
its teams flat (two plain cohorts), then with the same teams in a three-level tree (an organisation, four
departments of ten teams, each department with a borrowing limit and a lending limit on every accelerator).

Same jobs, nodes and quotas; no database. CPU time of this process, best of three per variant, and the ratio
tree over flat, which holds on a shared machine. Prints a line and ends with one JSON line. Run:
``.venv/bin/python benchmarks/cohort_tree.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.procstat import machine  # noqa: E402
from benchmarks.schedule import ACCELERATORS, JOBS, TEAMS, build  # noqa: E402
from core.cohorts import Level  # noqa: E402
from jobs.scheduling.core import FairShareScheduler  # noqa: E402

DEPARTMENTS = 4
ROOT = ("cohort", 0)


def as_tree(snapshot):
    """``snapshot`` with its teams in one tree: team ``t`` in department ``t % DEPARTMENTS``; each department may
    borrow a quarter of its teams' nominal and lends at most half of it, per accelerator."""
    nominal = {d: {a: 0 for a in range(ACCELERATORS)} for d in range(DEPARTMENTS)}
    for t, team in snapshot.teams.items():
        for a, q in team.quotas.items():
            nominal[t % DEPARTMENTS][a] += q.nominal_gpus
        team.cohort, team.parent_cohort = ROOT, ("cohort", 1 + t % DEPARTMENTS)
    snapshot.cohort_levels = (Level(ROOT, name="org"),) + tuple(
        Level(("cohort", 1 + d), ROOT, {}, {a: n // 4 for a, n in nominal[d].items()},
              {a: n // 2 for a, n in nominal[d].items()}, weight=1.0 + d % 2, name=f"dept-{d}")
        for d in range(DEPARTMENTS))
    return snapshot


def best_pass(tree: bool) -> tuple[float, object]:
    """Least CPU seconds of three full passes over a fresh snapshot (``tree``: in a tree), and the last decisions."""
    times, decisions = [], None
    for _ in range(3):
        decisions = None
        snapshot, _ = build()
        if tree:
            as_tree(snapshot)
        gc.collect()
        c0 = time.process_time()
        decisions = FairShareScheduler(snapshot).full_pass()
        times.append(time.process_time() - c0)
    return min(times), decisions


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    flat_s, flat = best_pass(False)
    tree_s, tree = best_pass(True)
    print(f"flat: {flat_s:.3f} s CPU, {len(flat.admissions)} admitted; tree: {tree_s:.3f} s CPU, "
          f"{len(tree.admissions)} admitted", file=sys.stderr)
    print(json.dumps({
        "benchmark": "cohort_tree", "queued_jobs": JOBS, "teams": TEAMS, "departments": DEPARTMENTS,
        "flat_full_pass_cpu_s": round(flat_s, 4), "tree_full_pass_cpu_s": round(tree_s, 4),
        "tree_over_flat": round(tree_s / flat_s, 3) if flat_s else None,
        "flat_admitted": len(flat.admissions), "tree_admitted": len(tree.admissions),
        "flat_preempted": len(flat.preemptions), "tree_preempted": len(tree.preemptions),
        "tree_waiting_on_a_level": sum(1 for w in tree.waiting.values() if w.detail.get("cohort_tree")),
        **machine(),
    }))


if __name__ == "__main__":
    main()
