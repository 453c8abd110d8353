"""Queue order: priority first, then fair share between teams, then submission time.

Within one team jobs keep their order (Kueue's StrictFIFO): priority high
first, then submission time, then id. Between teams the next job comes from
the team whose head has the highest priority, then the lowest weighted decayed
usage (Kueue's Admission Fair Sharing: decayed usage over the team's weight,
``usage_key``; all 0 while fair sharing over time is off), then the lowest
dominant share (Kueue's DRS: borrowed GPUs over the cohort's lendable GPUs, max
over accelerators, divided by the team's weight), then the earliest submission.
"""

from __future__ import annotations

from decimal import Decimal

from .types import OVERTAKEN_SHOWN, Admission, QueuedJob, TeamState, Waiting
from .usage import ZERO, weighted_usage


def dominant_share(team: TeamState, lendable: dict[tuple, int]) -> float:
    """max over accelerators of GPUs above nominal / the cohort's lendable GPUs, divided by weight (Kueue's DRS).

    ``lendable``: lendable GPUs by (cohort, accelerator id). A team that
    borrows from a cohort that lends nothing, or of weight 0, has an infinite share.
    """
    share = 0.0
    for acc, used in team.used.items():
        q = team.quotas.get(acc)
        above = used - (q.nominal_gpus if q else 0)
        if above > 0:
            pool = lendable.get((team.cohort, acc), 0)
            share = max(share, float(above) / pool if pool else float("inf"))
    return share / team.weight if team.weight > 0 else float("inf")


def usage_key(team: TeamState) -> Decimal:
    """The team's weighted decayed usage, GPU-seconds per unit of weight: ``fair_usage / weight`` (Kueue's Admission
    Fair Sharing, kueue.sigs.k8s.io/docs/concepts/admission_fair_sharing/; ``usage.weighted_usage``), 0 for a team
    with no decayed usage (fair sharing over time off: every team ties and the order is the dominant share's)."""
    return ZERO if not team.fair_usage else weighted_usage(team.fair_usage, team.weight)


def team_key(head: QueuedJob, share: float, usage: Decimal = ZERO) -> tuple:
    """The order between teams, by their head job: priority high first, lower weighted decayed usage (``usage_key``)
    first, then lower share, then submission and id."""
    return (-head.priority, usage, share, head.submitted, head.job_id)


class TeamQueue:
    """One team's waiting jobs in order, how far a pass got (``pos``), and the head that blocks the rest, if any.

    A heap entry of the decision loop carries the team's generation (``cohort.CohortBook.team_gen``) when it was
    made: it changes whenever the team's usage (hence its share) changes, so an older entry is known to be stale.
    """

    __slots__ = ("team", "jobs", "pos", "blocked", "waiting_before")

    def __init__(self, team: TeamState):
        self.team = team
        self.jobs: list[QueuedJob] = []
        self.pos = 0
        self.blocked: Waiting | None = None
        self.waiting_before: list[QueuedJob] = []  # passed over without blocking (no pool can ever hold them)


def behind_message(blocked: Waiting) -> str:
    """Why a job waits behind its StrictFIFO team's head ``blocked`` (at most 480 characters)."""
    return (f"Waits behind job {blocked.job.job_id}, ahead of it in its team's queue (the team queues StrictFIFO), "
            f"which waits for {blocked.reason}: {blocked.message}")[:480]


def behind(job: QueuedJob, blocked: Waiting, message: str | None = None) -> Waiting:
    """``job`` waits (reason ``priority``) because its team's head ``blocked`` waits and the team keeps its order;
    ``message``: ``behind_message(blocked)`` when the caller has it already."""
    return Waiting(job, "priority", message or behind_message(blocked),
                   {"request_gpus": job.nodes * job.gpus_per_node, "behind_job_id": blocked.job.job_id,
                    "behind_reason": blocked.reason})


def note_overtaking(admission: Admission, heads: dict[int, Waiting]) -> None:
    """Record on each waiting head of ``heads`` (team id -> its first waiting job in this run; removed once it was
    told of ``OVERTAKEN_SHOWN`` jobs) that comes before
    ``admission``'s job in the queue's overall order (priority, submission, id), accepts the admitted
    accelerator and waits for what the admission takes (nodes: any team's; quota or budget: its own team's)
    that this job was admitted ahead of it (``Waiting.overtaken_by``, at most ``OVERTAKEN_SHOWN``):
    Kueue's BestEffortFIFO lets a job that fits pass one that does not, and the passed job is told so."""
    job = admission.job
    key, acc, tid = job.key, admission.accelerator_id or job.accelerator_id, job.team_id
    full = []
    for team_id, w in heads.items():
        head = w.job
        # a head waiting for nodes is passed by any team's admission; one waiting for its team's quota or budget
        # only by its own team's, which takes what it waits for
        if head.key < key and (acc == head.accelerator_id or acc in head.alternatives) and (
                team_id == tid or w.reason == "capacity"):
            seen = w.overtaken_by
            if seen is None:
                w.overtaken_by = [job]
            else:
                seen.append(job)
                if len(seen) >= OVERTAKEN_SHOWN:
                    full.append(team_id)
    for team_id in full:  # told of as many as it is shown
        del heads[team_id]
