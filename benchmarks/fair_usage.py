"""Benchmark of the decayed usage a pass reads (fair sharing over time, docs/adr/0045): every team's figure moved
from its last sample to the pass's time (``jobs.scheduling.core.usage.advance``), over the spans of the attempts
live or ended since.

40 teams sampled at one time, 300 s before the pass (the sampling interval); 5,000 attempts live since before the
sample and 1,000 admitted or ended within the window, each at its own microsecond (the worst case: every one a
factor of its own). Plain data, no database. Ends with one JSON line. Run: ``.venv/bin/python benchmarks/fair_usage.py``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.scheduling.core.usage import US, advance, decay_factor  # noqa: E402

TEAMS, LIVE, CHURN, WINDOW_S, HALF_LIFE = 40, 5000, 1000, 300, 604800


def spans_by_team(seed: int = 7) -> dict[int, list[tuple]]:
    rng = random.Random(seed)
    at = 10**15
    since = at - WINDOW_S * US
    out: dict[int, list[tuple]] = {t: [] for t in range(TEAMS)}
    for _ in range(LIVE):
        out[rng.randrange(TEAMS)].append((rng.choice((1000, 2000, 4000, 8000, 250)), since - rng.randrange(10**12), None))
    for _ in range(CHURN):
        start = since + rng.randrange(WINDOW_S * US)
        end = None if rng.random() < 0.5 else start + rng.randrange(at - start)
        out[rng.randrange(TEAMS)].append((rng.choice((1000, 8000, 500)), start, end))
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    spans = spans_by_team()
    at = 10**15
    since = at - WINDOW_S * US
    times = []
    for _ in range(3):
        decay_factor.cache_clear()  # a pass at a new time: no factor known yet
        t0 = time.perf_counter()
        figures = {t: advance(Decimal(t * 3600), since, at, s, HALF_LIFE) for t, s in spans.items()}
        times.append(time.perf_counter() - t0)
    print(f"{TEAMS} teams, {LIVE + CHURN} spans: {min(times) * 1000:.1f} ms", file=sys.stderr)
    print(json.dumps({"benchmark": "fair_usage", "teams": TEAMS, "live_spans": LIVE, "window_spans": CHURN,
                      "window_s": WINDOW_S, "half_life_s": HALF_LIFE, "read_ms": round(min(times) * 1000, 2),
                      "read_median_ms": round(sorted(times)[1] * 1000, 2), "teams_read": len(figures)}))


if __name__ == "__main__":
    main()
