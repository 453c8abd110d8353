"""GPU-hours accrued without a price: "cost unknown since T for N GPU-hours", and its alert, fired once.

The marker: a ledger entry (``CostEntry``) whose ``usd_per_gpu_hour`` is
NULL holds GPU-hours that the catalog had no price for (its ``amount_usd``
is NULL too). ``UNPRICED`` is the one place that says so. Everything here
only reads the ledger; accrual writes it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from core.gpus import MILLI_PER_GPU
from quotas.models import Membership

from .models import CostEntry, UnknownCostAlert

log = logging.getLogger(__name__)
UNPRICED = Q(usd_per_gpu_hour__isnull=True)
# For a Job queryset: ``.annotate(has_unpriced_cost=HAS_UNPRICED)`` tells which rows need ``unknown_cost``.
HAS_UNPRICED = Exists(CostEntry.objects.filter(UNPRICED, job=OuterRef("pk")))


@dataclasses.dataclass(frozen=True)
class UnknownCost:
    """GPU-hours without a price: since the earliest such entry's start (aware UTC), in GPU-hours, on which pools."""

    since: dt.datetime
    gpu_hours: float
    attempts: int
    pools: tuple[str, ...]  # "cluster/pool (accelerator, capacity type)"

    @property
    def message(self) -> str:
        return (f"cost unknown since {self.since:%Y-%m-%d %H:%M} UTC for {self.gpu_hours:.2f} GPU-hours: "
                f"no price for {', '.join(self.pools)}")


def unpriced_entries(team=None, job=None, until: dt.datetime | None = None):
    """Ledger entries without a price, of ``team`` and/or ``job`` (rows or ids), starting before ``until``."""
    entries = CostEntry.objects.filter(UNPRICED)
    if team is not None:
        entries = entries.filter(team=team)
    if job is not None:
        entries = entries.filter(job=job)
    if until is not None:
        entries = entries.filter(interval_start__lt=until)
    return entries


ENTRY_FIELDS = ("interval_start", "interval_end", "gpu_milli", "attempt_id", "cluster__name", "attempt__node_pool__name",
                "accelerator__name", "attempt__node_pool__capacity_type")


def _summarize_rows(rows, until: dt.datetime | None) -> UnknownCost | None:
    since, seconds, attempts, pools = None, 0.0, set(), set()
    for start, end, milli, attempt, cluster, pool, acc, capacity in rows:
        since = start if since is None else min(since, start)
        seconds += milli / MILLI_PER_GPU * ((min(end, until) if until else end) - start).total_seconds()
        attempts.add(attempt)
        pools.add(f"{cluster}/{pool} ({acc}, {capacity})")
    if since is None:
        return None
    return UnknownCost(since, round(seconds / 3600, 6), len(attempts), tuple(sorted(pools)))


def summarize(entries, until: dt.datetime | None = None) -> UnknownCost | None:
    """``UnknownCost`` of a queryset of unpriced entries (their time before ``until`` only), or None if empty."""
    return _summarize_rows(entries.values_list(*ENTRY_FIELDS), until)


def unknown_cost_json(found: UnknownCost | None) -> dict | None:
    """``{"since": ISO 8601, "gpu_hours": float, "message": str}`` for the API, or None."""
    return None if found is None else {"since": found.since.isoformat(), "gpu_hours": found.gpu_hours,
                                       "message": found.message}


def unknown_cost(team=None, job=None, until: dt.datetime | None = None) -> UnknownCost | None:
    """What ``team`` (or ``job``; None: everyone) accrued without a price before ``until`` (default: all), or None."""
    return summarize(unpriced_entries(team, job, until), until)


def unpriced_hours(team=None, job=None, until: dt.datetime | None = None) -> tuple[float, float]:
    """``(GPU-hours, vCPU-hours)`` that ``team`` and/or ``job`` (rows or ids) accrued without a price before
    ``until`` (default: all), 6 decimals: what a money figure of theirs leaves out and shows beside it."""
    gpu = vcpu = 0.0
    for start, end, gpu_milli, milli in unpriced_entries(team, job, until).values_list(
            "interval_start", "interval_end", "gpu_milli", "cpu_milli"):
        seconds = ((min(end, until) if until else end) - start).total_seconds()
        gpu += gpu_milli / MILLI_PER_GPU * seconds
        vcpu += milli / 1000 * seconds
    return round(gpu / 3600, 6), round(vcpu / 3600, 6)


def check_unknown_costs(at: dt.datetime | None = None) -> list[UnknownCostAlert]:
    """Alert once per attempt accruing without a price: an UnknownCostAlert row (its unique attempt decides),
    a log warning and an e-mail to the team's admins and to staff. Returns the alerts fired now."""
    at = at or timezone.now()
    fired = []
    pending = (unpriced_entries().filter(attempt__unknown_cost_alert__isnull=True)
               .values_list("attempt_id", "team_id").distinct().order_by("attempt_id"))
    for attempt_id, team_id in list(pending):
        found = summarize(CostEntry.objects.filter(UNPRICED, attempt_id=attempt_id))
        try:
            with transaction.atomic():
                alert = UnknownCostAlert.objects.create(attempt_id=attempt_id, team_id=team_id, since=found.since,
                                                        fired_at=at, gpu_hours=found.gpu_hours, message=found.message)
        except IntegrityError:
            continue  # another worker fired it
        fired.append(alert)
        log.warning("attempt %s: %s", attempt_id, found.message)
        recipients = sorted({e for e in Membership.objects.filter(team_id=team_id, role=Membership.Role.ADMIN)
                             .values_list("user__email", flat=True) if e}
                            | {e for e in get_user_model().objects.filter(is_staff=True, is_active=True)
                               .values_list("email", flat=True) if e})
        if recipients:
            send_mail(subject=f"[controlplane] cost unknown: attempt {attempt_id}",
                      message=f"{found.message}.\nAdd the missing price to the catalog; the GPU-hours are kept.\n",
                      from_email=settings.DEFAULT_FROM_EMAIL, recipient_list=recipients)
    return fired
