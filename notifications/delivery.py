"""Sending notifications: e-mail through Django's mail API, webhooks as a signed JSON POST.

Each notification is sent by its own task (``notifications.tasks.deliver``), so an endpoint that fails or never
answers holds one worker for at most ``NOTIFY_WEBHOOK_TIMEOUT_SECONDS`` and delays nobody else's notification
(one failure domain per endpoint). Every step is a compare-and-set on ``Notification.status``:

- ``queue_due``: ``pending`` rows due now become ``queued`` and a ``deliver`` task is published for each after
  commit; ``queued`` or ``sending`` rows older than the lease (a lost message, a worker that died) go back to
  ``pending``;
- ``deliver``: a worker claims the row (``queued``/``pending`` and due -> ``sending``, attempts + 1); a
  second copy of the task claims nothing and sends nothing. After the send, ``sending`` -> ``sent``, or back to
  ``pending`` with an exponential backoff (``NOTIFY_RETRY_BASE_SECONDS`` x 2^(attempts - 1), at most
  ``NOTIFY_RETRY_MAX_SECONDS``), or ``failed`` after ``NOTIFY_MAX_ATTEMPTS``.

A worker that dies between the receiver's answer and the ``sent`` mark sends again after the lease: receivers
that must not act twice read the ``X-Controlplane-Delivery`` header, the notification's ``uid``, which never
changes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.enqueue import publish_or_keep

from .models import Notification, Subscription
from .rules import check_webhook_url

log = logging.getLogger(__name__)

DELIVER_TASK = "notifications.tasks.deliver"
SIGNATURE_HEADER = "X-Controlplane-Signature-256"
S = Notification.Status


def signature(secret: str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256 of body keyed with secret>``, GitHub's ``X-Hub-Signature-256`` form
    (docs.github.com, "Validating webhook deliveries"): the receiver recomputes it over the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follow no redirect: a 3xx answer is a failed delivery (never a POST to a host the user did not name)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class DeliveryFailed(Exception):
    """A send that did not succeed: ``status`` is the receiver's HTTP status when it answered."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def post_webhook(notification: Notification, sub: Subscription) -> int:
    """POST the notification's payload to ``sub.webhook_url``; returns the 2xx status. Raises DeliveryFailed on
    any other answer, a redirect, a timeout (``NOTIFY_WEBHOOK_TIMEOUT_SECONDS``) or a connection error."""
    body = json.dumps(notification.payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "controlplane-notifications/1",
               "X-Controlplane-Event": notification.event, "X-Controlplane-Delivery": str(notification.uid)}
    if str(sub.secret):
        headers[SIGNATURE_HEADER] = signature(str(sub.secret), body)
    request = urllib.request.Request(check_webhook_url(str(sub.webhook_url)), data=body, headers=headers,
                                     method="POST")
    try:
        with _OPENER.open(request, timeout=settings.NOTIFY_WEBHOOK_TIMEOUT_SECONDS) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        raise DeliveryFailed(f"the receiver answered {exc.code}", exc.code) from None
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, a bad URL
        reason = getattr(exc, "reason", exc)
        raise DeliveryFailed(f"no answer: {reason}"[:500]) from None


def send_email(notification: Notification) -> None:
    """Send the notification as a plain-text e-mail to its recipient (``EMAIL_BACKEND``), with the webhook's
    ``X-Controlplane-Delivery`` and ``X-Controlplane-Event`` headers; raises DeliveryFailed when the backend
    refuses it."""
    message = EmailMessage(subject=notification.subject, body=notification.payload.get("text", "") + "\n",
                           from_email=settings.DEFAULT_FROM_EMAIL, to=[notification.recipient],
                           headers={"X-Controlplane-Delivery": str(notification.uid),
                                    "X-Controlplane-Event": notification.event})
    try:
        message.send()
    except Exception as exc:  # noqa: BLE001 - SMTP and socket errors alike: retried with backoff
        raise DeliveryFailed(f"the mail server refused it: {exc!r}"[:500]) from None


def backoff_seconds(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: ``NOTIFY_RETRY_BASE_SECONDS`` x
    2^(attempts - 1), at most ``NOTIFY_RETRY_MAX_SECONDS`` (exponential backoff, as Celery's ``retry_backoff``)."""
    return min(settings.NOTIFY_RETRY_BASE_SECONDS * 2 ** max(attempts - 1, 0), settings.NOTIFY_RETRY_MAX_SECONDS)


def lease_seconds() -> float:
    """How long a ``queued`` or ``sending`` row may stay so before it is taken for lost: ten webhook timeouts,
    at least a minute (a queue that is busy for longer sends it twice; the delivery id tells the receiver)."""
    return max(60.0, 10 * settings.NOTIFY_WEBHOOK_TIMEOUT_SECONDS)


def deliver(notification_id: int, now: dt.datetime | None = None) -> str:
    """Send one notification if it is due at ``now`` (default now) and no one else holds it; returns its status
    afterwards, or ``"skipped"`` when the claim found it sent, held or not due (a duplicate task)."""
    clock = timezone.now if now is None else (lambda: now)
    now = clock()
    claimed = Notification.objects.filter(pk=notification_id, status__in=(S.QUEUED, S.PENDING),
                                          next_attempt_at__lte=now)
    if not claimed.update(status=S.SENDING, attempts=F("attempts") + 1, claimed_at=now):
        return "skipped"
    row = Notification.objects.select_related("subscription").get(pk=notification_id)
    sub = row.subscription
    status, error = None, ""
    try:
        if not sub.active:
            raise DeliveryFailed("the subscription was switched off")
        if sub.channel == Subscription.Channel.WEBHOOK:
            status = post_webhook(row, sub)
        else:
            send_email(row)
    except DeliveryFailed as exc:
        status, error = exc.status, str(exc)
    done = clock()
    held = Notification.objects.filter(pk=row.pk, status=S.SENDING, attempts=row.attempts)
    if not error:
        held.update(status=S.SENT, sent_at=done, response_status=status, last_error="")
        return S.SENT
    if row.attempts >= settings.NOTIFY_MAX_ATTEMPTS or not sub.active:
        held.update(status=S.FAILED, response_status=status, last_error=error[:500])
        log.warning("notification %s failed for good after %d attempt(s): %s", row.pk, row.attempts, error)
        return S.FAILED
    held.update(status=S.PENDING, response_status=status, last_error=error[:500],
                next_attempt_at=done + dt.timedelta(seconds=backoff_seconds(row.attempts)))
    log.info("notification %s: attempt %d failed (%s), retried later", row.pk, row.attempts, error)
    return S.PENDING


def queue_due(now: dt.datetime | None = None, limit: int = 500) -> list[int]:
    """Mark up to ``limit`` due ``pending`` rows ``queued`` and publish a ``deliver`` task for each after commit;
    first put back to ``pending`` the rows held longer than ``lease_seconds``. Returns the ids queued."""
    now = now or timezone.now()
    stale = now - dt.timedelta(seconds=lease_seconds())
    Notification.objects.filter(status__in=(S.QUEUED, S.SENDING), claimed_at__lt=stale).update(status=S.PENDING)
    with transaction.atomic():
        ids = list(Notification.objects.select_for_update(skip_locked=True)
                   .filter(status=S.PENDING, next_attempt_at__lte=now).order_by("next_attempt_at", "id")
                   .values_list("pk", flat=True)[:limit])
        Notification.objects.filter(pk__in=ids, status=S.PENDING).update(status=S.QUEUED, claimed_at=now)
        for pk in ids:
            transaction.on_commit(lambda pk=pk: publish_or_keep(DELIVER_TASK, [pk]), robust=True)
    return ids
