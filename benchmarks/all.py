"""Every benchmark with its documented defaults, one after another; their JSON lines into one file.

Run: ``make bench`` or ``.venv/bin/python benchmarks/all.py`` (``--out``, default
``var/bench/results.jsonl``, rewritten each run; ``--only submit,costs`` for some
of them; ``--full-costs`` for the costs benchmark's full size, whose one-time
build takes about half an hour on 2 cores, instead of its quick size).

Each benchmark checks its own services and says what is missing; one that
lacks them, fails or prints no JSON line still gets a line in the file
(``missing`` or ``error``), the others still run, and the exit status is 1.
The environment passes through (``BENCH_DATABASE_URL``, ``BENCH_BROKER_URL``).
Each line gains ``command``, ``seconds`` (its duration), ``finished_at`` (UTC) and
``loadavg_before``: the machine's load averages before it started (its own
``loadavg``, read at its end, counts its own processes too).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> arguments: each benchmark's documented default, the costs benchmark and the simulation at their quick size.
BENCHMARKS = {
    "schedule": [],
    "fair_usage": [],
    "trace_replay": [],
    "submit": [],
    "bad_input": [],
    "dispatch": [],
    "scale_out": [],
    "cluster_faults": [],
    "costs": ["--gpus", "128", "--days", "4"],
    "efficiency": [],
    "ledger_scale": [],
    "faults": [],
    "serving": [],
    "simulate": ["--seeds", "24"],
}


def last_json_line(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object, or None."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run(name: str, args: list[str], timeout: float) -> tuple[dict, bool]:
    """Run one benchmark (its stderr passes through); its result line and whether it succeeded."""
    command = [sys.executable, f"benchmarks/{name}.py", *args]
    shown = " ".join(["benchmarks/" + name + ".py", *args])
    print(f"== {shown}", file=sys.stderr, flush=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=timeout)
        result, status = last_json_line(done.stdout), done.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        result, status = last_json_line(out), None
    if result is None or status != 0:
        result = {"benchmark": name, **(result or {})}
        if "missing" not in result:
            result["error"] = (f"ran past {timeout:.0f} s" if status is None else f"exit status {status}") + (
                "" if len(result) > 1 else ", no JSON line")
    result["command"] = shown
    result["loadavg_before"] = load_before
    result["seconds"] = round(time.monotonic() - started, 1)
    result["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return result, status == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "bench" / "results.jsonl")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated names (default: all)")
    parser.add_argument("--full-costs", action="store_true", help="the costs benchmark at its full size")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds each benchmark may run (default 3600)")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(unknown)} (known: {', '.join(BENCHMARKS)})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ok = True
    with open(args.out, "w") as out:
        for name in names:
            bench_args = [] if name == "costs" and args.full_costs else BENCHMARKS[name]
            result, succeeded = run(name, bench_args, args.timeout)
            ok &= succeeded
            line = json.dumps(result)
            out.write(line + "\n")
            out.flush()
            print(line, flush=True)
    print(f"results: {args.out}", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
