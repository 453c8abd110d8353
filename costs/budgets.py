"""Budget status (spent, committed, remaining, forecast) and threshold alerts that fire once per period.

Spent is the ledger's priced USD with ``interval_start`` in the period,
read from the running totals (``costs.spend.period_spend``: day rollups and
the partial edge days only, constant time whatever the history); GPU-hours
of unknown cost (no price in force) count at the catalog's highest price for
their accelerator (``unpriced_usd``, ``costs.spend.unpriced_bound_usd``);
committed is what active jobs may still spend, ``max(estimated - accrued,
0)`` summed (``jobs.models.committed_usd``). Admission
(``jobs.scheduling.snapshot.budget_views``) reads the same figures.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from decimal import Decimal

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.gpus import exact_gpus
from jobs.models import JobAttempt, committed_usd, held_gpu_milli
from quotas.models import Budget, Membership

from .catalog import NoPrice, prices_by_pool, rates_at
from .forecast import Forecast, forecast
from .ledger import held_cpu, interval_cost
from .metrics import BUDGET_ALERTS, BUDGET_AMOUNT_USD, BUDGET_FORECAST_USD, BUDGET_SPENT_USD
from .models import BudgetAlert, Price
from .spend import period_spend, unpriced_bound_usd

log = logging.getLogger(__name__)
DEFAULT_THRESHOLDS = (50, 80, 100)


@dataclasses.dataclass(frozen=True)
class BudgetStatus:
    """A budget in the period containing ``at``; all money in exact Decimal USD.

    ``spent_usd`` is the priced ledger; ``unpriced_gpu_hours`` accrued with
    no price in force count as ``unpriced_usd`` (at the catalog's highest
    price for their accelerator) in ``remaining_usd``, ``spent_percent`` and
    the forecast.
    ``forecast_usd`` is ``costs.forecast.forecast`` (spent + unpriced +
    committed + median daily spend x days left; its method and inputs in
    ``basis``); ``burn_rate_usd_per_hour`` is what the team's running
    attempts cost per hour now (``burn_rate``), ``burn_rate_unpriced_gpus``
    the GPUs running where no price is in force (not in the rate).
    """

    budget: Budget
    at: dt.datetime
    period_start: dt.datetime
    period_end: dt.datetime
    amount_usd: Decimal
    spent_usd: Decimal
    committed_usd: Decimal
    burn_rate_usd_per_hour: Decimal
    forecast_usd: Decimal
    unpriced_gpu_hours: Decimal = Decimal(0)
    unpriced_usd: Decimal = Decimal(0)
    basis: Forecast | None = None
    unpriced_vcpu_hours: Decimal = Decimal(0)
    burn_rate_unpriced_gpus: int | Decimal = 0

    @property
    def remaining_usd(self) -> Decimal:
        return self.amount_usd - self.spent_usd - self.unpriced_usd - self.committed_usd

    @property
    def spent_percent(self) -> Decimal:
        """Spent and unknown-cost USD (at the highest price) as a percent of the amount."""
        return (self.spent_usd + self.unpriced_usd) / self.amount_usd * 100 if self.amount_usd else Decimal(0)


def budget_status(budget: Budget, at: dt.datetime | None = None) -> BudgetStatus | None:
    """The status of ``budget`` in the period containing ``at`` (default now); None outside a custom period."""
    at = at or timezone.now()
    start, end = budget.window(at)
    if start is None or end is None or not (start <= at < end):
        return None
    spend = period_spend([budget.team_id], start, end)[budget.team_id]
    spent, unpriced = spend.cost_usd, unpriced_bound_usd(spend)
    committed = committed_usd(budget.team_id)
    basis = forecast(budget.team_id, end, at, spent + unpriced, committed)
    rate, unpriced_gpus = burn_rate(budget.team_id, at)
    return BudgetStatus(budget, at, start, end, budget.amount_usd, spent, committed, rate, basis.forecast_usd,
                        spend.unpriced_gpu_hours, unpriced, basis, spend.unpriced_vcpu_hours, unpriced_gpus)


def burn_rate(team_id: int, at: dt.datetime) -> tuple[Decimal, int]:
    """What the team's running attempts cost per hour at ``at``: ``(USD per hour, GPUs without a price)``.

    The sum over its attempts started and not ended of GPUs (a share of one GPU as its share, as the ledger bills
    it: ``jobs.models.held_gpu_milli``; GPUs without a price an int, or an exact Decimal with a share) x USD per
    GPU-hour (plus vCPUs x USD per vCPU-hour
    and GiB x USD per GiB-hour on a CPU node pool) at the price in force at ``at``, the ledger's formula
    (docs/design.md, Cost ledger); an attempt with no price in force counts its GPUs apart. Two queries.
    """
    attempts = list(JobAttempt.objects.filter(job__team_id=team_id, started_at__isnull=False, started_at__lte=at,
                                              ended_at__isnull=True).select_related("node_pool__cluster", "job"))
    if not attempts:
        return Decimal(0), 0
    pools = {a.node_pool_id: a.node_pool for a in attempts}
    rows = prices_by_pool(pools.values(), Price.objects.filter(
        accelerator_id__in={p.accelerator_id for p in pools.values()}))
    usd, unpriced = Decimal(0), 0
    for attempt in attempts:
        gpus = exact_gpus(held_gpu_milli(attempt.gpus, attempt.job.gpu_share_milli))
        try:
            rates = rates_at(attempt.node_pool, at, rows[attempt.node_pool_id])
        except NoPrice:
            unpriced += gpus
            continue
        usd += interval_cost(gpus, Decimal(3600), rates.gpu, *held_cpu(attempt.placement), rates.vcpu, rates.gib)
    return usd, unpriced


def admin_emails(team_id: int) -> list[str]:
    """E-mail addresses of the team's admins (empty addresses left out)."""
    return sorted(
        e for e in Membership.objects.filter(team_id=team_id, role=Membership.Role.ADMIN)
        .values_list("user__email", flat=True) if e
    )


def _fire(status: BudgetStatus, threshold: int) -> BudgetAlert | None:
    """Insert the alert row; None when this threshold already fired in this period (the unique key decides)."""
    try:
        with transaction.atomic():
            return BudgetAlert.objects.create(
                budget=status.budget, period_start=status.period_start, threshold_percent=threshold, fired_at=status.at,
                spent_usd=status.spent_usd, amount_usd=status.amount_usd,
            )
    except IntegrityError:
        return None


def check_budget(budget: Budget, at: dt.datetime | None = None) -> list[BudgetAlert]:
    """Fire every threshold (percent of the amount) that the period's spend has reached and that has not fired yet.

    Each new alert is a BudgetAlert row, an e-mail to the team's admins
    (Django mail) and an increment of ``controlplane_budget_alerts_total``.
    Safe to run concurrently: the unique (budget, period, threshold) key
    lets one caller fire each alert. Returns the alerts fired now.
    """
    status = budget_status(budget, at)
    if status is None:
        return []
    labels = {"team": budget.team.slug, "budget": str(budget.pk)}
    BUDGET_SPENT_USD.labels(**labels).set(float(status.spent_usd))
    BUDGET_AMOUNT_USD.labels(**labels).set(float(status.amount_usd))
    BUDGET_FORECAST_USD.labels(**labels).set(float(status.forecast_usd))
    fired = []
    for threshold in sorted(int(t) for t in (budget.alert_thresholds or DEFAULT_THRESHOLDS)):
        if status.spent_percent < threshold:
            break
        alert = _fire(status, threshold)
        if alert is None:
            continue
        fired.append(alert)
        BUDGET_ALERTS.labels(threshold=str(threshold), **labels).inc()
        recipients = admin_emails(budget.team_id)
        if recipients:
            send_mail(
                subject=f"[controlplane] {budget.team.slug}: {threshold}% of the {budget.period} budget spent",
                message=(f"Team {budget.team.slug} has spent ${status.spent_usd:.2f} of ${status.amount_usd:.2f} "
                         f"({status.spent_percent:.1f}%) in the period from {status.period_start:%Y-%m-%d}.\n"
                         f"Committed by running jobs: ${status.committed_usd:.2f}. "
                         f"Forecast at period end: ${status.forecast_usd:.2f}. Action at 100%: {budget.action}.\n"),
                from_email=settings.DEFAULT_FROM_EMAIL, recipient_list=recipients,
            )
        log.info("budget %s: %s%% threshold fired", budget.pk, threshold)
    return fired


def check_budgets(at: dt.datetime | None = None) -> int:
    """``check_budget`` for every budget; returns the number of alerts fired."""
    return sum(len(check_budget(b, at)) for b in Budget.objects.select_related("team"))
