"""Celery tasks of notifications: the periodic pass (fan-out, then the due rows queued) and one delivery per
notification (docs/adr/0035-notifications.md). Both take ids only and are safe to run twice: the unique
(event, subscription) key and the compare-and-set on the status decide. Slow queue (``CELERY_TASK_ROUTES``): a
delivery waits on someone else's server."""

from __future__ import annotations

from celery import shared_task

from . import delivery, fanout


# Every NOTIFY_INTERVAL_SECONDS (10 s): a range scan of the events since the cursor, an insert per notification.
@shared_task(name="notifications.tasks.notify", ignore_result=True, soft_time_limit=60, time_limit=75)
def notify() -> int:
    """Derive the notifications of new job events and budget alerts, then queue every due one; returns how many
    were queued."""
    fanout.fan_out()
    return len(delivery.queue_due())


# One webhook POST (NOTIFY_WEBHOOK_TIMEOUT_SECONDS, 5 s) or one e-mail.
@shared_task(name="notifications.tasks.deliver", ignore_result=True, soft_time_limit=30, time_limit=40)
def deliver(notification_id: int) -> str:
    """Send one notification (``notifications.delivery.deliver``); a duplicate delivery of the task sends
    nothing."""
    return delivery.deliver(notification_id)
