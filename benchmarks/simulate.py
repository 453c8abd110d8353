"""Simulation: many seeded scenarios of the whole control plane under faults, every invariant checked.

Each scenario (``tests/support/simulation``) draws a small fleet (1-3 emulated Kubernetes clusters of 1-2 nodes,
on-demand or spot, with prices), two teams in a cohort, and ``--steps`` actions from its seed: submissions and
cancels through the REST API, time passing on the virtual clock, the simulated worker delivering the published
tasks in a chosen order, and faults, each kind at its rate (``Knobs``: API answers 5xx/429/404/409/410/timeout per
verb and object, a cluster's API server down with its pods running, the control plane down, spot reclaims and
node losses with and without replacements, pod evictions and deletions, duplicate deliveries, a worker killed
before it acknowledged, credentials rejected (401) or unreadable, price rows changed or deleted, quotas changed).
After every step the step invariants are checked, after the settling phase (faults off) the end invariants
(``tests/support/simulation/invariants.py``).

The JSON line: ``scenarios``, ``steps``, ``deliveries`` (tasks run), ``faults_injected`` and ``faults_by_kind``,
``violations_total`` and ``violations`` by invariant (every invariant named, 0 included), ``failing`` (per
invariant, the first few seeds with their first message and, with ``--shrink``, the shortest action list found),
``scenarios_per_cpu_minute`` and ``cpu_ms_per_step`` (CPU of the simulation's processes: the platform's code,
the emulated clusters and the simulator together), ``wall_s``.

Run: ``.venv/bin/python benchmarks/simulate.py --seeds 200`` (``--start`` first seed, ``--workers`` processes,
each on its own PostgreSQL database ``<BENCH_DATABASE_URL>_<i>``, default ``cp_bench_simulate``; ``--faults off``
for the fault-free baseline; ``--seed N`` replays one seed and prints its violations and actions; ``--regressions
[NAME ...]`` plays the named regression scenarios of ``tests/support/simulation/regressions.py``, all when none is
named, and prints their violations by name).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.services import postgres_missing, require  # noqa: E402


def run_seeds(job: tuple[str, list[int], int, str, bool]) -> dict:
    """Play ``seeds`` on database ``url`` in this process; the counts and the failing seeds."""
    url, seeds, steps, faults, shrink_them = job
    from tests.support.simulation.world import configure, prepare_database

    configure(url)
    prepare_database()
    from tests.support.simulation import invariants
    from tests.support.simulation.scenario import Knobs, describe, draw, shrink

    knobs = Knobs() if faults == "on" else Knobs.off()
    out = {"scenarios": 0, "steps": 0, "deliveries": 0, "faults": Counter(), "cpu_s": 0.0, "digests": [],
           "violations": Counter({name: 0 for name in invariants.NAMES}), "failing": {}}
    for seed in seeds:
        config, actions = draw(seed, knobs, steps)
        result = play_safely(config, actions)
        out["scenarios"] += 1
        out["steps"] += result.steps
        out["deliveries"] += result.deliveries
        out["faults"].update(result.faults)
        out["cpu_s"] += result.cpu_s
        out["digests"].append(result.digest)
        for name, message, step in result.violations:
            out["violations"][name] += 1
            failing = out["failing"].setdefault(name, [])
            if len(failing) < 3:
                entry = {"seed": seed, "step": step, "message": message[:400]}
                if shrink_them and not failing:
                    entry["shrunk_actions"] = describe(shrink(config, actions, name)).splitlines()
                failing.append(entry)
    return out


def run_regressions(url: str, names: list[str]) -> dict[str, list[list]]:
    """Play the named regression scenarios (``tests/support/simulation/regressions.py``) on database ``url``; each
    name maps to its violations ``[[invariant, message, step], ...]`` (empty: it passes)."""
    from tests.support.simulation.world import configure, prepare_database

    configure(url)
    prepare_database()
    from tests.support.simulation.regressions import REGRESSIONS

    out = {}
    for name in names:
        config, actions = REGRESSIONS[name][0]()
        out[name] = [list(v) for v in play_safely(config, actions).violations]
    return out


def play_safely(config, actions):
    """``scenario.play``; an exception that escapes the platform's code into the simulation (a world it cannot
    even drive, e.g. a model that cannot be loaded) is the violation ``simulation_error``, not the end of the run."""
    from tests.support.simulation.scenario import Result, play

    try:
        return play(config, actions)
    except Exception as exc:  # noqa: BLE001 - reported as a violation of its own
        return Result([("simulation_error", f"{type(exc).__name__}: {exc}"[:400], -1)], len(actions), Counter(), 0,
                      0.0, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=200, help="how many scenarios")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, default=None, help="replay this one seed and print it")
    parser.add_argument("--steps", type=int, default=40, help="actions per scenario")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--faults", choices=["on", "off"], default="on")
    parser.add_argument("--shrink", action="store_true", help="shrink the first failing seed of each invariant")
    parser.add_argument("--digest", action="store_true", help="with --seed: print the run's outcome digest")
    parser.add_argument("--regressions", nargs="*", default=None, metavar="NAME",
                        help="play the named regression scenarios (none named: all) instead of seeds")
    args = parser.parse_args()
    base = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cp_bench_simulate")
    require("simulate", [postgres_missing(base.rsplit("/", 1)[0] + "/postgres")])
    if args.regressions is not None:
        from tests.support.simulation.regressions import REGRESSIONS

        unknown = sorted(set(args.regressions) - set(REGRESSIONS))
        if unknown:
            parser.error(f"unknown regression scenario(s) {', '.join(unknown)}; known: {', '.join(REGRESSIONS)}")
        result = run_regressions(f"{base}_0", args.regressions or list(REGRESSIONS))
        print(json.dumps({"benchmark": "simulate", "regressions": result,
                          "violations_total": sum(len(v) for v in result.values())}))
        return 0 if not any(result.values()) else 1
    if args.seed is not None:
        result = run_seeds((f"{base}_0", [args.seed], args.steps, args.faults, not args.digest))
        from tests.support.simulation.scenario import Knobs, describe, draw

        _, actions = draw(args.seed, Knobs() if args.faults == "on" else Knobs.off(), args.steps)
        print(describe(actions), file=sys.stderr)
        print(json.dumps({"seed": args.seed, "violations": dict(result["violations"]), "failing": result["failing"],
                          "deliveries": result["deliveries"], "digest": result["digests"][0]}, default=str))
        return 0 if not sum(result["violations"].values()) else 1
    seeds = list(range(args.start, args.start + args.seeds))
    workers = max(1, min(args.workers, len(seeds)))
    jobs = [(f"{base}_{i}", seeds[i::workers], args.steps, args.faults, args.shrink) for i in range(workers)]
    started = time.monotonic()
    if workers == 1:
        parts = [run_seeds(jobs[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            parts = pool.map(run_seeds, jobs)
    total = {"scenarios": 0, "steps": 0, "deliveries": 0, "cpu_s": 0.0}
    faults, violations, failing = Counter(), Counter(), {}
    for part in parts:
        for key in total:
            total[key] += part[key]
        faults.update(part["faults"])
        violations.update(part["violations"])
        for name, entries in part["failing"].items():
            failing.setdefault(name, []).extend(entries)
    result = {
        "benchmark": "simulate", "faults": args.faults, "first_seed": args.start, **total,
        "faults_injected": sum(faults.values()), "faults_by_kind": dict(sorted(faults.items())),
        "violations_total": sum(violations.values()), "violations": dict(violations),
        "failing": {k: sorted(v, key=lambda e: e["seed"])[:3] for k, v in sorted(failing.items())},
        "scenarios_per_cpu_minute": round(60 * total["scenarios"] / max(total["cpu_s"], 1e-9), 1),
        "cpu_ms_per_step": round(1000 * total["cpu_s"] / max(total["steps"], 1), 1),
        "cpu_s": round(total["cpu_s"], 1), "wall_s": round(time.monotonic() - started, 1), "workers": workers,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))
    return 0 if result["violations_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
