"""Celery tasks of the cost ledger: periodic accrual and the final accrual when an attempt ends."""

from celery import shared_task
from django.db import transaction

from .ledger import accrue_attempt, accrue_running


def enqueue_final_accrual(attempt_id: int) -> None:
    """Write the last ledger entries of an ended attempt after the current transaction commits."""
    transaction.on_commit(lambda: accrue_attempt_task.delay(attempt_id))


@shared_task(name="costs.tasks.accrue_running_costs", ignore_result=True)
def accrue_running_costs() -> int:
    """Accrue every started attempt up to now (periodic, through Celery beat); idempotent."""
    return accrue_running()


@shared_task(name="costs.tasks.accrue_attempt", ignore_result=True)
def accrue_attempt_task(attempt_id: int) -> str:
    """Accrue one attempt up to now (its end, if it ended); idempotent."""
    return str(accrue_attempt(attempt_id))
