"""The cost ledger: turning an attempt's held GPUs into CostEntry rows.

Formula (OpenCost's allocation cost): ``amount = GPUs x seconds / 3600 x
USD per GPU-hour``, split where the catalog price changes. Rounding rule:
each entry is rounded half to even to 1e-9 USD; sums are exact Decimals, and
money is rounded to cents only when shown. Accrual is idempotent: it
continues from ``attempt.accrued_until`` under a row lock, and the ledger's
unique (attempt, interval_start) key refuses a second copy of an interval.
"""

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.models import Job, JobAttempt

from .catalog import price_segments
from .models import CostEntry
from .spend import exact_seconds

LEDGER_QUANTUM = Decimal("0.000000001")
SECONDS_PER_HOUR = Decimal(3600)


def interval_cost(gpus: int, seconds: Decimal, usd_per_gpu_hour: Decimal) -> Decimal:
    """USD for ``gpus`` GPUs held ``seconds`` seconds at ``usd_per_gpu_hour``, rounded to 1e-9 half-even."""
    return (Decimal(gpus) * seconds * usd_per_gpu_hour / SECONDS_PER_HOUR).quantize(LEDGER_QUANTUM, ROUND_HALF_EVEN)


def accrue_attempt(attempt_id: int, until: dt.datetime | None = None) -> Decimal:
    """Write ledger entries for attempt ``attempt_id`` from where accrual stopped up to ``until``.

    ``until`` defaults to now and is capped at the attempt's end; an attempt
    that never started costs nothing. Returns the USD added (0 when nothing
    was due, as on a repeated call). Raises costs.catalog.NoPrice when no
    price covers part of the interval; nothing is written then.
    """
    with transaction.atomic():
        attempt = (
            JobAttempt.objects.select_for_update()
            .select_related("job", "node_pool__cluster", "node_pool__accelerator")
            .get(pk=attempt_id)
        )
        if attempt.started_at is None:
            return Decimal(0)
        end = until or timezone.now()
        if attempt.ended_at is not None:
            end = min(end, attempt.ended_at)
        start = attempt.accrued_until or attempt.started_at
        if end <= start:
            return Decimal(0)
        total = Decimal(0)
        entries = []
        for seg_start, seg_end, price in price_segments(attempt.node_pool, start, end):
            amount = interval_cost(attempt.gpus, exact_seconds(seg_end - seg_start), price)
            total += amount
            entries.append(
                CostEntry(
                    attempt=attempt, job_id=attempt.job_id, team_id=attempt.job.team_id, cluster_id=attempt.cluster_id,
                    accelerator_id=attempt.node_pool.accelerator_id, interval_start=seg_start, interval_end=seg_end,
                    gpus=attempt.gpus, usd_per_gpu_hour=price, amount_usd=amount,
                )
            )
        CostEntry.objects.bulk_create(entries)
        JobAttempt.objects.filter(pk=attempt.pk).update(accrued_until=end)
        Job.objects.filter(pk=attempt.job_id).update(accrued_cost_usd=F("accrued_cost_usd") + total)
        return total


def accrue_running(until: dt.datetime | None = None) -> int:
    """Accrue every started attempt whose cost is not yet fully in the ledger; returns how many were visited."""
    pending = JobAttempt.objects.filter(started_at__isnull=False).exclude(
        ended_at__isnull=False, accrued_until__gte=F("ended_at")
    )
    count = 0
    for attempt_id in pending.values_list("pk", flat=True).iterator():
        accrue_attempt(attempt_id, until)
        count += 1
    return count
