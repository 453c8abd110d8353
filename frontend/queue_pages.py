"""The Queue page: every waiting job the user may see, fleet-wide for staff, in the scheduler's order, with its
position in its team's queue and overall, its team's fair share (weight, quota and what it uses now, and its
decayed usage over time: docs/adr/0045-fair-sharing-over-time.md), whether it
would borrow from its cohort, what it waits for and why later jobs were admitted ahead of it (Kueue's pending
workloads view, as KueueViz shows it).

Everything shown comes from the last scheduling pass (``Job.queue_info``: the reason, the numbers and the
positions; ``jobs.scheduling.apply.waiting_info``) and the quota rows; nothing is decided again here.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import F, IntegerField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.shortcuts import render
from django.utils import timezone

from core.gpus import exact_gpus
from jobs.models import Job, JobState
from jobs.scheduling.snapshot import cpu_used_milli, team_used_gpus
from jobs.scheduling.usage import fair_usage, half_life_seconds
from quotas.models import Quota, Team

from .readable import short_of_words

#: Waiting jobs shown on the page, first in the queue's order; the rest are counted.
QUEUE_ROWS = 500


def _share(team, accelerator, quotas: dict, used_cache: dict) -> dict:
    """A team's fair-share facts on one accelerator: ``{"unit": "GPUs" | "vCPU", "used", "nominal",
    "borrowing_limit", "weight", "strategy", "quota": bool}`` (no team-wide quota: ``quota`` False, and a CPU-only
    job then runs quota-free)."""
    key = (team.pk, accelerator.pk)
    if key not in used_cache:
        q = quotas.get(key)
        if accelerator.is_cpu:
            used = cpu_used_milli([team.pk]).get(team.pk, 0) / 1000
            used = int(used) if used == int(used) else used
            numbers = (q.nominal_vcpus, q.borrowing_limit_vcpus) if q is not None else (0, 0)
        else:
            used = team_used_gpus(team.pk, accelerator.pk)
            numbers = (q.nominal_gpus, q.borrowing_limit_gpus) if q is not None else (0, 0)
        used_cache[key] = {"unit": "vCPU" if accelerator.is_cpu else "GPUs", "used": used, "nominal": numbers[0],
                           "borrowing_limit": numbers[1], "weight": team.weight, "strategy": team.queueing_strategy,
                           "quota": q is not None}
    return used_cache[key]


def _asks(job: Job) -> tuple[int | float, str]:
    """What a job counts against its quota: its GPUs (a share of one GPU exactly, ADR 0040), or for a CPU-only job
    its pods' vCPU."""
    if job.accelerator.is_cpu:
        per_node = ((job.spec or {}).get("resources") or {}).get("cpu") or 0
        total = per_node * job.nodes * max(1, job.replicas)
        return (int(total) if total == int(total) else total), "vCPU"
    return (exact_gpus(job.gpu_share_milli) if job.gpu_share_milli else job.total_gpus), "GPUs"


def borrowing_text(asks: int | float, share: dict) -> str:
    """Whether a job of ``asks`` (in ``share["unit"]``) would borrow from its cohort if admitted now: the part of it
    above the team's nominal quota, and whether that is more than its borrowing limit allows with what it uses now
    (``share``: ``_share``'s facts)."""
    if not share["quota"]:
        return "no: quota-free" if share["unit"] == "vCPU" else "no quota for it"
    above = share["used"] + asks - share["nominal"]
    if above <= 0:
        return "no: within nominal quota"
    above = min(above, asks)
    unit = "GPU" if share["unit"] == "GPUs" and above == 1 else share["unit"]
    if share["used"] + asks > share["nominal"] + share["borrowing_limit"]:
        return (f"it would need {above} {unit} above nominal, more than the team's borrowing limit of "
                f"{share['borrowing_limit']} allows now")
    return f"yes: {above} {unit} above nominal"


def queue_rows(user) -> tuple[list[dict], int]:
    """The waiting jobs ``user`` may see, in the scheduler's overall order (jobs not yet numbered last, by
    submission), at most ``QUEUE_ROWS``, each with its team's share, its decayed usage (``over_time``:
    ``jobs.scheduling.usage.FairUsage``) and its borrowing; and how many wait in all."""
    waiting = (Job.objects.visible_to(user).filter(state__in=[JobState.QUEUED, JobState.RECOVERING])
               .select_related("team", "accelerator")
               .annotate(overall=Cast(KT("queue_info__position__overall"), IntegerField()))
               .order_by(F("overall").asc(nulls_last=True), "created_at", "pk"))
    count = waiting.count()
    jobs = list(waiting[:QUEUE_ROWS])
    quotas = {(q.team_id, q.accelerator_id): q for q in Quota.objects.filter(
        team_id__in={j.team_id for j in jobs}, accelerator_id__in={j.accelerator_id for j in jobs}, cluster=None)}
    used: dict = {}
    over_time = {f.team_id: f for f in fair_usage(
        Team.objects.filter(pk__in={j.team_id for j in jobs}).select_related("cohort"), timezone.now(),
        None if user.is_staff else set(user.memberships.values_list("team_id", flat=True)))}
    rows = []
    for job in jobs:
        info = job.queue_info or {}
        position = info.get("position") or {}
        share = _share(job.team, job.accelerator, quotas, used)
        asks, unit = _asks(job)
        rows.append({
            "job": job, "overall": position.get("overall"), "team_position": position.get("team"),
            "asks": asks, "unit": unit, "share": share, "borrowing": borrowing_text(asks, share),
            "over_time": over_time.get(job.team_id),
            "waits_for": short_of_words(info) if info else "its first scheduling pass",
            "message": info.get("message") or job.state_reason, "overtaken": info.get("overtaken", ""),
        })
    return rows, count


@login_required
def queue(request):
    """Every waiting job the user may see (every team's for staff), in queue order, with positions, fair share,
    borrowing, what it waits for and why later jobs went ahead."""
    rows, count = queue_rows(request.user)
    return render(request, "frontend/queue.html", {"rows": rows, "count": count, "shown": len(rows),
                                                   "half_life_days": half_life_seconds() / 86400,
                                                   "poll_seconds": settings.UI_POLL_SECONDS})
