"""Celery tasks of costs: ledger accrual, budget checks, utilization collection, the ledger-vs-metrics check, reports.

The report tasks live in ``costs.reports.tasks``; they are imported here so that autodiscovery (``<app>.tasks``) finds them.
All go to the slow queue (``CELERY_TASK_ROUTES``, docs/adr/0014); each has a soft time limit (``SoftTimeLimitExceeded``
raised in the task: the transaction it is in rolls back) and a hard one, chosen from its work and its beat interval.
"""

import datetime as dt

from celery import shared_task
from django.utils import timezone

from runners.base import each_cluster
from runners.models import Cluster

from .ledger import accrue_attempt, accrue_running
from .reports.tasks import catch_up_reports, generate_reports  # noqa: F401  (registers the tasks)


# Every 60 s; 1,000 attempts over a 30-day ledger take 0.2-0.6 s (benchmarks/ledger_scale.py).
@shared_task(name="costs.tasks.accrue_running_costs", ignore_result=True, soft_time_limit=120, time_limit=150)
def accrue_running_costs() -> int:
    """Accrue every started attempt up to now (periodic, through Celery beat); idempotent."""
    return accrue_running()


@shared_task(name="costs.tasks.accrue_attempt", ignore_result=True, soft_time_limit=30, time_limit=45)
def accrue_attempt_task(attempt_id: int) -> str:
    """Accrue one attempt up to now (its end, if it ended); idempotent."""
    return str(accrue_attempt(attempt_id))


# Every 300 s: a budget status (milliseconds) per budget, and a mail per alert fired.
@shared_task(name="costs.tasks.check_budgets", ignore_result=True, soft_time_limit=120, time_limit=150)
def check_budgets() -> int:
    """Fire budget threshold alerts due now (periodic); each fires once per period. Returns alerts fired."""
    from .budgets import check_budgets as check
    from .unknown import check_unknown_costs

    check_unknown_costs()  # GPU-hours accruing without a price: alerted once per attempt
    return check()


# Every 900 s: per cluster, one grouped Prometheus query (COSTS_PROMETHEUS_TIMEOUT_SECONDS, 30 s) of the 15 minutes
# since the last pass, plus the attempts that started or ended since and the day seals (costs.collection.periodic_pass).
@shared_task(name="costs.tasks.collect_utilization", ignore_result=True, soft_time_limit=600, time_limit=660)
def collect_utilization() -> int:
    """Read the utilization that each attempt-day row of the lookback lacks up to now, and seal settled days."""
    from .collection import periodic_pass

    return periodic_pass(timezone.now())


# Every 60 s: the attempts ended since the last run; one stopped early is read again by the next (rows per attempt
# are written together, costs.collection.collect_attempt).
@shared_task(name="costs.tasks.collect_ended_utilization", ignore_result=True, soft_time_limit=240, time_limit=300)
def collect_ended_utilization() -> int:
    """Collect the whole run of each attempt that ended since the last pass (every minute); returns attempts read."""
    from .collection import collect_ended

    return collect_ended()


# Hourly: per cluster, a ledger sum and kube-state-metrics queries over the lookback.
@shared_task(name="costs.tasks.check_ledger", ignore_result=True, soft_time_limit=600, time_limit=660)
def check_ledger() -> int:
    """Compare each cluster's ledger GPU-hours with kube-state-metrics over the lookback window; returns flags raised."""
    from .collection import lookback_start
    from .ledgercheck import check_ledger as check

    now = timezone.now().astimezone(dt.timezone.utc)

    def one(cluster: Cluster) -> dict:
        found = check(cluster, lookback_start(now), now)
        return {"cluster": cluster.name, "flagged": bool(found and found.flagged)}

    return sum(bool(r.get("flagged")) for r in each_cluster(Cluster.objects.all(), one, "ledger check"))
