"""Scenarios: action lists drawn from a seed, played against a ``World``, checked, and shrunk.

An action is a tuple ``(kind, *integers)``; its integers pick among what exists when it is played (the k-th live
job, the k-th node, modulo their number), so an action list stays playable after any of its actions is removed,
which is what shrinking needs. ``draw(seed, knobs)`` gives the world's configuration and the action list;
``play(config, actions)`` runs them and returns a ``Result``; ``shrink`` finds a shorter list that still breaks
the same invariant.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import random
import time
from collections import Counter

from .world import WorldConfig

#: Job shapes a scenario submits: (nodes, GPUs per node).
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 8))
#: (method, path fragment) of the cluster calls API faults hit.
FAULT_TARGETS = (("GET", "/pods"), ("GET", "/jobs"), ("GET", "/deployments"), ("POST", "/jobs"),
                 ("POST", "/deployments"), ("POST", "/namespaces"), ("DELETE", "/jobs"), ("DELETE", "/deployments"),
                 ("GET", "/nodes"), (None, None))
FAULT_KINDS = (500, 503, 429, 404, 409, 410, "timeout")
#: Seconds of virtual time the settling phase lets pass at most (faults off, beat and worker on).
SETTLE_SECONDS = 3600


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The rate of each kind of fault and user action: the chance that a step is of that kind (weights; the rest
    of each step submits a job, lets time pass or lets the worker run)."""

    api_faults: float = 0.06
    cluster_outage: float = 0.02
    control_plane_outage: float = 0.02
    spot_reclaim: float = 0.03
    node_loss: float = 0.02
    pod_disruption: float = 0.03
    slow_termination: float = 0.02
    duplicate_delivery: float = 0.04
    late_delivery: float = 0.03
    worker_kill: float = 0.03
    credential_rejected: float = 0.02
    credential_unreadable: float = 0.01
    price_change: float = 0.02
    cancel: float = 0.05
    quota_change: float = 0.02
    budget_change: float = 0.02
    backup: float = 0.02
    restore: float = 0.01

    @classmethod
    def off(cls) -> Knobs:
        """Every fault off (users still submit and cancel)."""
        return cls(**{f.name: 0.0 for f in dataclasses.fields(cls) if f.name not in ("cancel", "quota_change", "budget_change")})


def draw(seed: int, knobs: Knobs, steps: int = 40) -> tuple[WorldConfig, list[tuple]]:
    """The world and ``steps`` actions of scenario ``seed``."""
    rng = random.Random(seed)
    config = WorldConfig.draw(rng)
    n = len(config.clusters)
    faults = {k: v for k, v in dataclasses.asdict(knobs).items() if v > 0}
    actions: list[tuple] = []
    for _ in range(steps):
        roll = rng.random()
        picked = None
        for kind, rate in faults.items():
            if roll < rate:
                picked = kind
                break
            roll -= rate
        if picked == "api_faults":
            actions.append(("api_faults", rng.randrange(n), rng.randrange(len(FAULT_TARGETS)),
                            rng.randrange(len(FAULT_KINDS)), rng.randint(1, 4)))
        elif picked == "cluster_outage":
            actions.append(("cluster_outage", rng.randrange(n), rng.choice([30, 120, 700, 1500])))
        elif picked == "control_plane_outage":
            actions.append(("control_plane_outage", rng.choice([30, 300, 700, 1500])))
        elif picked in ("spot_reclaim", "node_loss"):
            actions.append((picked, rng.randrange(n), rng.randrange(8), rng.randrange(2)))
        elif picked == "slow_termination":
            actions.append(("slow_termination", rng.randrange(n), rng.choice([10, 30, 120])))
        elif picked == "pod_disruption":
            actions.append(("pod_disruption", rng.randrange(n), rng.randrange(8), rng.randrange(2)))
        elif picked in ("duplicate_delivery", "worker_kill"):
            actions.append((picked, rng.randrange(8)))
        elif picked == "late_delivery":
            actions.append(("late_delivery", rng.randrange(8), rng.choice([5, 30, 120])))
        elif picked == "credential_rejected":
            actions.append(("credential_rejected", rng.randrange(n), rng.randint(1, 6)))
        elif picked == "credential_unreadable":
            actions.append(("credential_unreadable", rng.randrange(n), rng.choice([30, 300])))
        elif picked == "price_change":
            actions.append(("price_change", rng.randrange(n), rng.randint(50, 400), rng.randrange(4)))
        elif picked == "cancel":
            actions.append(("cancel", rng.randrange(8)))
        elif picked == "quota_change":
            actions.append(("quota_change", rng.randrange(2), rng.randint(0, 8), rng.randint(0, 8)))
        elif picked in ("backup", "restore"):
            actions.append((picked,))
        elif picked == "budget_change":
            actions.append(("budget_change", rng.randrange(2), rng.choice([0, 1, 5, 50]), rng.randrange(2)))
        else:
            roll = rng.random()
            if roll < 0.35:
                kind = 1 if rng.random() < 0.15 else 0
                actions.append(("submit", rng.randrange(2), rng.randrange(len(SHAPES)), kind, rng.randrange(2),
                                rng.choice([20, 60, 240]), rng.randrange(3), rng.randint(1, 3)))
            elif roll < 0.75:
                actions.append(("advance", rng.choice([5, 10, 30, 60, 120])))
            else:
                actions.append(("work", rng.randrange(1 << 16)))
    return config, actions


@dataclasses.dataclass
class Result:
    """One played scenario: its violations ``[(invariant, message, step)]`` (the first of each invariant), its
    steps, the faults it injected by kind, deliveries, and CPU seconds."""

    violations: list[tuple[str, str, int]]
    steps: int
    faults: Counter
    deliveries: int
    cpu_s: float
    jobs: int
    digest: str = ""


def play(config: WorldConfig, actions: list[tuple], *, check_every_step: bool = True) -> Result:
    """Build the world of ``config`` on the (empty) database, play ``actions``, settle and check; see the module
    docstring. Needs Django set up on a database ``world.prepare_database`` made."""
    from . import invariants
    from .clock import VirtualClock
    from .world import World

    cpu = time.process_time()
    violations: dict[str, tuple[str, str, int]] = {}

    def check(checks: dict, step: int) -> None:
        for name, fn in checks.items():
            for message in fn(world):
                violations.setdefault(name, (name, message, step))

    faults: Counter = Counter()
    # The platform's own randomness (Celery's retry jitter, the emulators' choices) comes from the process's
    # ``random``: seeded from the scenario, so a replay draws the same countdowns.
    random.seed(hashlib.sha256(repr((config, actions)).encode()).hexdigest())
    with VirtualClock() as clock:
        world = World(config, clock)
        try:
            world.build()
            for step, action in enumerate(actions):
                if world.apply(action):
                    faults[action[0]] += 1
                if check_every_step:
                    check(invariants.STEP, step)
            world.settle(SETTLE_SECONDS)
            check(invariants.STEP, len(actions))
            check(invariants.END, len(actions))
            digest = outcome_digest(world)
        finally:
            world.stop()
        return Result(sorted(violations.values(), key=lambda v: v[2]), len(actions), faults, world.worker.deliveries,
                      time.process_time() - cpu, len(world.submitted), digest)


def outcome_digest(world) -> str:
    """A SHA-256 of what a run decided: every job's state and its attempts' clusters, end reasons and times, the
    ledger's GPU-seconds per attempt, and the deliveries made (two runs of one seed give the same digest)."""
    from costs.models import CostEntry
    from jobs.models import Job, JobAttempt

    parts = [repr(list(Job.objects.order_by("pk").values_list("pk", "state"))),
             repr(list(JobAttempt.objects.order_by("pk").values_list("job_id", "number", "cluster__name", "end_reason",
                                                                     "created_at", "started_at", "ended_at"))),
             repr(list(CostEntry.objects.order_by("attempt_id", "interval_start").values_list(
                 "attempt_id", "interval_start", "interval_end", "gpu_milli"))),
             str(world.worker.deliveries)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def shrink(config: WorldConfig, actions: list[tuple], invariant: str, budget: int = 60) -> list[tuple]:
    """A shorter action list that still breaks ``invariant`` (delta debugging: drop chunks of halving size while
    the violation stays), within ``budget`` replays."""
    def breaks(candidate: list[tuple]) -> bool:
        return any(v[0] == invariant for v in play(config, candidate).violations)

    current, chunk, tries = list(actions), max(1, len(actions) // 2), 0
    while chunk >= 1 and tries < budget:
        i, progressed = 0, False
        while i < len(current) and tries < budget:
            candidate = current[:i] + current[i + chunk:]
            tries += 1
            if candidate != current and breaks(candidate):
                current, progressed = candidate, True
            else:
                i += chunk
        if not progressed:
            chunk //= 2
    return current


def describe(actions: list[tuple]) -> str:
    """The action list as one line per action (for a report or a regression test)."""
    return "\n".join(repr(a) for a in actions)


__all__ = ["Knobs", "Result", "describe", "draw", "play", "shrink", "dt"]
