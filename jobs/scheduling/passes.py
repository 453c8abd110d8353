"""The scheduling passes: read a snapshot, let the core decide, commit the decisions.

``schedule_pending`` is one pass over the queue, ``try_admit`` one job's
admission attempt by the same rules, ``schedule_coalesced`` what the
scheduling task runs: passes paced and serialised between processes
(``pacing``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

from django.db import connection
from django.utils import timezone

from .. import metrics
from ..arrays import top_up_arrays
from ..models import Job, JobState
from .apply import apply_admissions, apply_rejection, store_waiting, waiting_info
from .core import Decisions, decide
from .pacing import clear_schedule_flag, defer_schedule, pass_pause_remaining, record_pass, scheduler_lock
from .snapshot import Loaded, load_snapshot
from .usage import sample_usage

__all__ = ["PassResult", "run_pass", "schedule_coalesced", "schedule_pending", "try_admit"]


@dataclasses.dataclass
class PassResult:
    """Counts from one scheduling pass."""

    admitted: list[int] = dataclasses.field(default_factory=list)
    waiting: int = 0
    rejected: int = 0
    skipped: int = 0
    #: Array elements the pass materialized before reading the queue (``jobs.arrays.top_up_arrays``).
    materialized: int = 0


def run_pass(loaded: Loaded, decisions: Decisions, now: dt.datetime, *, positions: bool = True) -> PassResult:
    """Commit ``decisions`` (decided on ``loaded``): the admissions re-checked under locks (``apply_admissions``), rejections,
    then the waiting jobs' ``queue_info`` in bulk. ``positions``: store the new queue positions (a full pass);
    otherwise each job keeps its stored ones."""
    result = PassResult()
    infos: dict[int, tuple[str, str, dict]] = {}
    for decision, (outcome, verdict) in zip(decisions.admissions, apply_admissions(decisions.admissions, now), strict=True):
        if outcome == "admitted":
            result.admitted.append(decision.job.job_id)
            metrics.ADMISSIONS.inc()
            metrics.PREEMPTIONS.inc(len(decision.victims))
        elif outcome == "waiting":
            result.waiting += 1
            infos[decision.job.job_id] = (verdict.reason, verdict.message,
                                          {"reason": verdict.reason, "message": verdict.message, **verdict.detail})
        else:
            result.skipped += 1
    for decision in decisions.rejections:
        if apply_rejection(decision):
            result.rejected += 1
            metrics.REJECTIONS.labels(reason=decision.verdict.reason).inc()
        else:
            result.skipped += 1
    admitted = set(result.admitted)
    for job_id, w in decisions.waiting.items():
        result.waiting += 1
        old = loaded.rows[job_id]["queue_info"] or {}
        infos[job_id] = waiting_info(w, None if positions else old, admitted, old)
    store_waiting(infos, loaded.rows)
    return result


def try_admit(job_id: int, now: dt.datetime | None = None) -> str:
    """One admission attempt for one job; returns ``admitted``, ``waiting``, ``rejected`` or ``skipped``.

    ``skipped`` means the job is no longer waiting or another scheduler holds it.
    The rules are the pass's, with only this job in the queue; its stored
    queue positions are kept until the next pass.
    """
    now = now or timezone.now()
    loaded = load_snapshot(now, job_ids=[job_id], skip_empty=True)
    if not loaded.snapshot.queue:
        return "skipped"
    result = run_pass(loaded, decide(loaded.snapshot), now, positions=False)
    if result.admitted:
        return "admitted"
    if result.rejected:
        return "rejected"
    return "waiting" if result.waiting else "skipped"


def schedule_pending(limit: int | None = None) -> PassResult:
    """One scheduling pass over every waiting job (or the first ``limit`` in priority order); safe to run concurrently.

    First every open job array is topped up (``jobs.arrays.top_up_arrays``: more QUEUED elements, as many as
    keep its live ones within its parallelism), so the pass sees them, and the teams' decayed usage is stored
    when its sample is due (``usage.sample_usage``). The core decides on a snapshot; the
    admissions are then verified under locks and committed (``apply``).
    """
    materialized = top_up_arrays()
    now = timezone.now()
    sample_usage(now)  # store the teams' decayed usage when its sample is due (ADR 0045)
    loaded = load_snapshot(now, limit=limit, skip_empty=True)
    if not loaded.snapshot.queue:
        return PassResult(materialized=materialized)
    result = run_pass(loaded, decide(loaded.snapshot), now)
    result.materialized = materialized
    return result


def schedule_coalesced() -> PassResult | None:
    """Run passes until no job arrived during the last one, unless another process is already doing so.

    Returns None when another pass holds the lock (it re-checks for jobs
    submitted while it ran, and the periodic pass catches any left) or when
    this pass was deferred (below). Without PostgreSQL (SQLite, one worker)
    it simply runs one pass. Correctness never depends on this lock:
    ``try_admit`` holds its own row locks.

    First it clears the Redis flag ``controlplane:schedule-pending`` (see
    ``pacing.publish_schedule``), *before* reading the queue. Ordering
    argument: a submission whose ``SET NX`` fails found the flag set; its job
    committed before that SET, so before the DELETE that clears this
    particular flag value, and that DELETE is followed by this pass's read of
    the queue, which therefore sees the job. A submission arriving after the
    DELETE sets the flag anew and publishes its own pass. A lost task leaves
    the flag for at most 30 s (its expiry); meanwhile the periodic pass
    (every 10 s) admits the jobs.

    Pacing (Redis broker only): a pass reads every waiting job, so under a
    storm of submissions back-to-back passes would cost the queue's length
    per handful of new jobs. After a pass of ``d`` seconds the next one waits
    ``min(d x SCHEDULE_PASS_PAUSE_FACTOR, SCHEDULE_PASS_PAUSE_MAX_SECONDS)``
    (Slurm's ``sched_min_interval`` plays the same part): a pass that comes
    too early publishes itself again with that countdown, leaving the flag
    set so that submissions meanwhile publish nothing, and returns. The
    deferred copy clears the flag when it runs, so the ordering argument
    above holds for it. With the defaults (factor 6) the scheduler uses at
    most a seventh of a core, new jobs wait at most 2 s for a pass, and a
    pass over a short queue (under 20 ms) delays nothing.
    """
    if connection.vendor != "postgresql":
        clear_schedule_flag()
        return schedule_pending()
    wait = pass_pause_remaining()
    if wait > 0:
        defer_schedule(wait, own_flag=True)
        return None
    clear_schedule_flag()
    with scheduler_lock() as held:
        if not held:
            return None
        total = PassResult()
        while True:
            # Ids grow with submission: any id above the newest seen now arrived during the pass.
            newest = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            started = time.monotonic()
            result = schedule_pending()
            pause = record_pass(time.monotonic() - started)
            total.admitted += result.admitted
            total.waiting, total.rejected = result.waiting, total.rejected + result.rejected
            # Array elements made by the pass's own top-up were read by it: only jobs submitted meanwhile count.
            if not Job.objects.filter(state=JobState.QUEUED, pk__gt=newest, array__isnull=True).exists():
                return total
            if pause > 0:  # jobs arrived: a paced pass serves them, and this worker is free meanwhile
                defer_schedule(pause, own_flag=False)
                return total
