"""Preemption (Kueue's reclaim within a cohort): which running jobs a job within its nominal quota may end.

A job that stays within its team's nominal quota but is blocked by the
cohort's lendable pool or by capacity may preempt preemptible running jobs
of other teams of its cohort that borrow. A victim is taken only if its
team stays at or above its nominal after losing it (work within nominal is
never preempted), lowest priority first, then most recently admitted;
unneeded victims are pruned (Kueue's minimal set). Preemptors end within
nominal and victims' teams above it, so preemption cannot cycle.
"""

from __future__ import annotations

from collections.abc import Iterable

from .placement import PoolOffer
from .types import OK, QueuedJob, RunningJob, TeamQuota, TeamState, Verdict


def may_preempt(job: QueuedJob, team: TeamState, quota: TeamQuota) -> bool:
    """Whether ``job`` stays within its team's nominal quota once admitted (only such a job preempts)."""
    return team.used.get(job.accelerator_id, 0) + job.total_gpus <= quota.nominal_gpus


def victim_order(r: RunningJob) -> tuple:
    """The order victims are taken in: lowest priority first, then the most recently admitted."""
    return (r.priority, -r.admitted, -r.job_id)


def keeps_nominal(owner: TeamState, accelerator_id: int, used_after: int) -> bool:
    """Whether ``owner`` still holds at least its nominal quota of the accelerator with ``used_after`` GPUs."""
    q = owner.quotas.get(accelerator_id)
    return used_after >= (q.nominal_gpus if q else 0)


def victims_keep_nominal(teams: dict[int, TeamState], job: QueuedJob, victims: Iterable[RunningJob]) -> Verdict:
    """After ``victims`` ended (``teams``' usage no longer counts them): OK when every victim's team still holds
    its nominal quota, else the verdict that the preemption would reach into it (reason ``quota``)."""
    acc = job.accelerator_id
    for owner_id in {v.team_id for v in victims}:
        owner = teams.get(owner_id) or TeamState(owner_id)
        if not keeps_nominal(owner, acc, owner.used.get(acc, 0)):
            return Verdict(False, "quota", "preemption would reach into another team's nominal quota",
                           {"request_gpus": job.total_gpus})
    return OK


def choose_victims(candidates: list[RunningJob], pools: list[PoolOffer], free: dict[int, int],
                   teams: dict[int, TeamState], accelerator_id: int, gpus: int,
                   cohort_need: int) -> tuple[PoolOffer, tuple[RunningJob, ...]] | None:
    """The pool and the fewest victims whose end lets ``gpus`` GPUs in, or None.

    ``candidates``: preemptible running jobs of other teams of the cohort, in
    ``victim_order``; ``free``: free GPUs by pool id; ``cohort_need``: GPUs the
    cohort's borrowing must give back for the job to fit (<= 0: none).
    """
    best = None
    for offer in pools:
        cap_need = gpus - free[offer.node_pool_id]
        picked = _pick(candidates, teams, accelerator_id, offer.node_pool_id, cohort_need, cap_need)
        if picked is not None and (best is None or len(picked) < len(best[1])):
            best = (offer, tuple(picked))
    return best


def _pick(candidates, teams, acc, pool_id, cohort_need, cap_need) -> list[RunningJob] | None:
    taken: dict[int, int] = {}
    picked: list[RunningJob] = []
    for c in candidates:
        if cohort_need <= 0 and cap_need <= 0:
            break
        helps_pool = cap_need > 0 and c.node_pool_id == pool_id
        if not (cohort_need > 0 or helps_pool):
            continue
        owner = teams[c.team_id]
        if not keeps_nominal(owner, acc, owner.used.get(acc, 0) - taken.get(c.team_id, 0) - c.gpus):
            continue  # would preempt work within its team's nominal quota
        picked.append(c)
        taken[c.team_id] = taken.get(c.team_id, 0) + c.gpus
        cohort_need -= c.gpus
        if c.node_pool_id == pool_id:
            cap_need -= c.gpus
    if cohort_need > 0 or cap_need > 0:
        return None
    for c in reversed(list(picked)):  # prune victims not needed (removing one never makes others ineligible)
        pool_gain = c.gpus if c.node_pool_id == pool_id else 0
        if cohort_need + c.gpus <= 0 and cap_need + pool_gain <= 0:
            picked.remove(c)
            cohort_need += c.gpus
            cap_need += pool_gain
    return picked
