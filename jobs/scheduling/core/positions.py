"""Queue positions of waiting jobs: in their team's queue (team order) and overall (priority, then submission).

Both orders are the queue's order (``QueuedJob.key``: priority high first, submission time, id). After a full
pass whose waiting jobs all came from the snapshot's queue, one walk over that queue, sorted once when the
scheduler was made, numbers both; after a submission only the new waiting jobs are numbered, by bisection in
the sorted keys kept from the pass before.
"""

from __future__ import annotations

import bisect
import operator

from .order import TeamQueue
from .types import Decisions, QueuedJob

_ORDER_KEY = operator.attrgetter("key")  # ``QueuedJob.order_key`` without a call


class Positions:
    """The waiting jobs' overall order of one scheduler. ``queue``: the snapshot's queued jobs (any order)."""

    def __init__(self, queue: list[QueuedJob]):
        #: The snapshot's queue in overall order (priority, submission, id).
        self.in_order: list[QueuedJob] = sorted(queue, key=_ORDER_KEY)
        #: Set once a job was submitted: the queues then hold jobs outside ``in_order``.
        self.submitted = False
        #: The waiting jobs' order keys, sorted.
        self.order: list[tuple] = []

    def number(self, out: Decisions, queues: dict[int, TeamQueue]) -> None:
        """Set the team position and the overall position of every waiting job of ``out`` (a full pass's)."""
        waiting = out.waiting
        if not self.submitted:
            get = waiting.get
            keys: list[tuple] = []
            by_team: dict[int, int] = {}
            for j in self.in_order:
                w = get(j.job_id)
                if w is not None and w.job is j:
                    keys.append(j.key)
                    w.overall_position = len(keys)
                    w.team_position = n = by_team.get(j.team_id, 0) + 1
                    by_team[j.team_id] = n
            if len(keys) == len(waiting):
                self.order = keys
                return
        for tq in queues.values():  # some waiting job came another way (a submission): number them afresh
            n = 0
            pending = tq.jobs[tq.pos:]
            if tq.waiting_before:
                pending = sorted(tq.waiting_before + pending, key=_ORDER_KEY)
            for job in pending:
                w = waiting.get(job.job_id)
                if w is not None:
                    n += 1
                    w.team_position = n
        self.order = sorted([w.job.key for w in waiting.values()])
        index = {k[2]: i for i, k in enumerate(self.order, 1)}
        for jid, w in waiting.items():
            w.overall_position = index[jid]

    def number_new(self, out: Decisions, tq: TeamQueue) -> None:
        """Number the waiting jobs of ``out``, an incremental pass over the queue ``tq`` of one team."""
        for w in out.waiting.values():
            bisect.insort(self.order, w.job.order_key())
        for w in out.waiting.values():
            k = w.job.order_key()
            w.overall_position = bisect.bisect_left(self.order, k) + 1
            w.team_position = bisect.bisect_left(tq.jobs, k, lo=tq.pos, key=QueuedJob.order_key) - tq.pos + 1

    def drop(self, key: tuple) -> None:
        """The job of order key ``key`` waits no longer (it is decided again)."""
        i = bisect.bisect_left(self.order, key)
        if i < len(self.order) and self.order[i] == key:
            del self.order[i]
