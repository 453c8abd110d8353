"""Each team's decayed GPU usage (fair sharing over time, docs/adr/0045-fair-sharing-over-time.md): read as of a
pass, stored every sampling interval.

The stored state is one ``quotas.models.TeamUsage`` row per team: decayed GPU-seconds as of ``sampled_at``. A
read (``decayed_usage``) moves every row to ``now`` in memory from the spans the attempts held GPUs since the
earliest sample (``jobs.scheduling.core.usage.advance``), so the order is exact whatever the sampling interval;
``sample_usage`` stores the same figures when a row is older than ``FAIR_SHARING_USAGE_SAMPLING_SECONDS``
(Kueue's ``usageSamplingInterval``), each row with a compare-and-set on its ``sampled_at``, so concurrent passes
move a row once. Nothing rereads history older than the rows: the work per pass is the attempts live or ended
since the earliest sample.

An attempt holds GPUs from its creation (admission) until it ends, as quotas count them
(``jobs.snapshot.team_used_gpus``), exact milli-GPUs (``jobs.models.held_gpu_milli``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from decimal import Decimal

from django.conf import settings
from django.db.models import Q

from quotas.models import Team, TeamUsage

from ..models import HELD_GPU_MILLI, JobAttempt
from .core.usage import ZERO, advance, entry_penalty, weighted_usage

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_SECONDS_PER_HOUR = Decimal(3600)


def half_life_seconds() -> int:
    """``FAIR_SHARING_USAGE_HALF_LIFE_SECONDS``: the usage's half-life in seconds (0: fair sharing over time is off)."""
    return settings.FAIR_SHARING_USAGE_HALF_LIFE_SECONDS


def pass_entry_penalty() -> Decimal:
    """The entry penalty a pass applies, GPU-seconds per GPU admitted (``core.usage.entry_penalty`` of the
    sampling interval and the half-life; 0 while fair sharing over time is off)."""
    return entry_penalty(settings.FAIR_SHARING_USAGE_SAMPLING_SECONDS, half_life_seconds())


def _us(t: dt.datetime) -> int:
    """Integer microseconds of a tz-aware time since 1970-01-01 UTC."""
    return (t - _EPOCH) // dt.timedelta(microseconds=1)


def _spans(since: dt.datetime, until: dt.datetime, team_ids: Iterable[int] | None = None) -> dict[int, list[tuple]]:
    """By team id, ``(milli-GPUs held, start µs, end µs or None)`` of every attempt that held GPUs at some time within
    ``(since, until]``."""
    qs = (JobAttempt.objects.filter(created_at__lt=until, gpus__gt=0)
          .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since)))
    if team_ids is not None:
        qs = qs.filter(job__team_id__in=list(team_ids))
    out: dict[int, list[tuple]] = {}
    for team_id, created, ended, held in (qs.annotate(held=HELD_GPU_MILLI)
                                          .values_list("job__team_id", "created_at", "ended_at", "held")):
        out.setdefault(team_id, []).append((held, _us(created), None if ended is None else _us(ended)))
    return out


def _moved(rows: list[tuple[int, Decimal, dt.datetime]], now: dt.datetime, half_life: int) -> dict[int, Decimal]:
    """``rows`` (team id, GPU-seconds, sampled at) moved to ``now``."""
    if not rows:
        return {}
    spans = _spans(min(at for _, _, at in rows), now, [tid for tid, _, _ in rows])
    return {tid: advance(gs, _us(at), _us(now), spans.get(tid, ()), half_life) for tid, gs, at in rows}


def decayed_usage(now: dt.datetime) -> dict[int, Decimal]:
    """Every sampled team's decayed usage as of ``now`` (tz-aware), GPU-seconds, by team id; reads only. Empty while
    fair sharing over time is off (half-life 0); a team without a row is missing (it counts 0)."""
    half_life = half_life_seconds()
    if half_life <= 0:
        return {}
    return _moved(list(TeamUsage.objects.values_list("team_id", "gpu_seconds", "sampled_at")), now, half_life)


def sample_usage(now: dt.datetime) -> int:
    """Store the decayed usage as of ``now`` (tz-aware) of every team whose row is at least
    ``FAIR_SHARING_USAGE_SAMPLING_SECONDS`` old, each by a compare-and-set on its ``sampled_at`` (a row another pass
    moved meanwhile is left as that pass stored it); a team without a row gets one of 0 GPU-seconds at ``now``.
    Returns how many rows this call moved. Does nothing while fair sharing over time is off."""
    half_life = half_life_seconds()
    if half_life <= 0:
        return 0
    rows = list(Team.objects.values_list("pk", "usage__gpu_seconds", "usage__sampled_at"))
    missing = [tid for tid, _, at in rows if at is None]
    if missing:
        TeamUsage.objects.bulk_create([TeamUsage(team_id=tid, gpu_seconds=ZERO, sampled_at=now) for tid in missing],
                                      ignore_conflicts=True)
    due_before = now - dt.timedelta(seconds=settings.FAIR_SHARING_USAGE_SAMPLING_SECONDS)
    due = [(tid, gs, at) for tid, gs, at in rows if at is not None and at <= due_before and at < now]
    sampled = {tid: at for tid, _, at in due}
    moved = 0
    for tid, figure in _moved(due, now, half_life).items():
        moved += TeamUsage.objects.filter(team_id=tid, sampled_at=sampled[tid]).update(gpu_seconds=figure,
                                                                                        sampled_at=now)
    return moved


@dataclasses.dataclass(frozen=True)
class FairUsage:
    """One team's place in fair sharing over time: ``decayed_gpu_hours`` (decayed GPU-seconds / 3600), ``weight``,
    ``weighted_gpu_hours`` (decayed / weight: the admission order's key, lowest first; Kueue's Admission Fair
    Sharing), ``cohort_share`` (the team's part of its cohort's weighted decayed usage, 0 to 1; None when the
    cohort used nothing, or when the reader may not see every team of the cohort) and ``half_life_seconds``. Hours are Decimal rounded to 6 places."""

    team_id: int
    slug: str
    cohort: str | None
    decayed_gpu_hours: Decimal
    weight: Decimal
    weighted_gpu_hours: Decimal
    cohort_share: Decimal | None
    half_life_seconds: int


def fair_usage(teams: Iterable[Team], now: dt.datetime, visible: set[int] | None = None) -> list[FairUsage]:
    """``FairUsage`` of each of ``teams`` (their cohorts selected) as of ``now``, in the order the scheduler ranks
    them (lowest weighted usage first, then slug); the cohort shares count every team of those cohorts.
    ``visible``: the ids of the teams the reader may see (None: every team, for staff); a team's ``cohort_share`` is
    None unless the reader may see every team of its cohort, since the share and the team's own figure give the
    rest of the cohort's usage away."""
    teams = list(teams)
    usage = decayed_usage(now)
    q = Decimal("0.000001")
    cohorts = {t.cohort_id for t in teams}
    per_cohort: dict = {}
    members = Q(cohort_id__in=[c for c in cohorts if c is not None])
    if None in cohorts:
        members |= Q(cohort__isnull=True)
    hidden: set = set()  # cohorts with a team the reader may not see
    for tid, cohort_id, weight in Team.objects.filter(members).values_list("pk", "cohort_id", "weight"):
        per_cohort[cohort_id] = per_cohort.get(cohort_id, ZERO) + weighted_usage(usage.get(tid, ZERO), weight)
        if visible is not None and tid not in visible:
            hidden.add(cohort_id)
    out = []
    for t in teams:
        decayed = usage.get(t.pk, ZERO)
        weighted = weighted_usage(decayed, t.weight)
        total = per_cohort.get(t.cohort_id, ZERO)
        out.append(FairUsage(t.pk, t.slug, t.cohort.name if t.cohort_id else None,
                             (decayed / _SECONDS_PER_HOUR).quantize(q), t.weight,
                             (weighted / _SECONDS_PER_HOUR).quantize(q),
                             (weighted / total).quantize(q) if total > 0 and t.cohort_id not in hidden else None,
                             half_life_seconds()))
    out.sort(key=lambda f: (f.weighted_gpu_hours, f.slug))
    return out
