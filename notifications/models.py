"""Subscriptions (who is told of what, and how), the notifications derived from events (one row per event and
subscription: the idempotency key), and the cursors of the fan-out (docs/adr/0035-notifications.md)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from runners.credentials import EncryptedTextField


class Event(models.TextChoices):
    """What a subscription may ask to hear of. The job events come from ``jobs.JobEvent`` rows (a job's state
    change), the budget one from ``costs.BudgetAlert`` rows (a threshold crossed, once per budget period)."""

    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    JOB_PREEMPTED = "job.preempted"
    JOB_RECOVERED = "job.recovered"
    BUDGET_THRESHOLD = "budget.threshold"


JOB_EVENTS = frozenset(e for e in Event if e.value.startswith("job."))


class SubscriptionQuerySet(models.QuerySet):
    def visible_to(self, user) -> "SubscriptionQuerySet":
        """The user's own subscriptions and those of the teams they belong to (any role); all for staff."""
        if user.is_staff:
            return self
        return self.filter(Q(user=user) | Q(team__memberships__user=user)).distinct()


class Subscription(models.Model):
    """A user's or a team's wish to be told of ``events`` through one channel.

    Exactly one of ``user`` (a personal subscription: the events of the jobs and budgets of every team the user
    belongs to when the event happens; ``only_own_jobs`` narrows job events to the jobs the user submitted) and
    ``team`` (the team's jobs and budgets; managed by the team's admins and staff) is set. ``channel`` ``email``
    sends to ``email`` (for a personal subscription, blank means the user's address at the time of the event);
    ``webhook`` POSTs a Slack-compatible JSON body to ``webhook_url`` (http or https, no user:password part),
    signed with HMAC-SHA256 of ``secret`` when one is set. The URL and the secret are encrypted at rest
    (``runners.credentials``): a Slack incoming-webhook URL is itself a credential.
    """

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
                             related_name="notification_subscriptions")
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, null=True, blank=True,
                             related_name="notification_subscriptions")
    name = models.CharField(max_length=100, blank=True)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    email = models.EmailField(blank=True)
    webhook_url = EncryptedTextField(blank=True, default="", help_text="http(s) URL (encrypted at rest)")
    secret = EncryptedTextField(blank=True, default="", help_text="HMAC-SHA256 key of the signature (encrypted)")
    events = models.JSONField(default=list, help_text="Event names, e.g. [\"job.failed\", \"budget.threshold\"]")
    only_own_jobs = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SubscriptionQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(user__isnull=False, team__isnull=True) | Q(user__isnull=True,
                                                                                       team__isnull=False),
                                   name="subscription_user_xor_team"),
        ]

    def __str__(self) -> str:
        owner = f"user {self.user_id}" if self.user_id else f"team {self.team_id}"
        return f"{owner} {self.channel} {','.join(self.events)}"


class NotificationQuerySet(models.QuerySet):
    def visible_to(self, user) -> "NotificationQuerySet":
        """The notifications of the subscriptions ``user`` sees (``SubscriptionQuerySet.visible_to``)."""
        if user.is_staff:
            return self
        return self.filter(subscription__in=Subscription.objects.visible_to(user).values("pk"))


class Notification(models.Model):
    """One event told to one subscription: the outbox row and, once sent, the delivery log.

    ``(subscription, source, source_id)`` is unique: the idempotency key, so a fan-out repeated (a task
    delivered twice, a pass that re-reads events it has seen) creates nothing twice. ``source`` names the row
    the event came from (``job_event``: a ``jobs.JobEvent``; ``budget_alert``: a ``costs.BudgetAlert``).
    ``payload`` is the webhook body (Slack-compatible: ``text`` plus structured fields), ``subject`` and the
    payload's ``text`` the e-mail, both fixed when the row is made so a retry sends the same bytes.

    ``uid`` is the delivery id receivers deduplicate on (``X-Controlplane-Delivery``): the same on every try of
    this notification, and never handed out again, even by a database restored from a backup (whose sequences
    give out ids again, ADR 0011).

    ``status``: ``pending`` (due at ``next_attempt_at``), ``queued`` (a delivery task was published at
    ``claimed_at``), ``sending`` (a worker claimed it at ``claimed_at``), ``sent``, ``failed`` (gave up after
    ``NOTIFY_MAX_ATTEMPTS``, or nothing to send to). Every change is a compare-and-set on the status.
    """

    class Source(models.TextChoices):
        JOB_EVENT = "job_event"
        BUDGET_ALERT = "budget_alert"

    class Status(models.TextChoices):
        PENDING = "pending"
        QUEUED = "queued"
        SENDING = "sending"
        SENT = "sent"
        FAILED = "failed"

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="notifications")
    source = models.CharField(max_length=16, choices=Source.choices)
    source_id = models.BigIntegerField()
    event = models.CharField(max_length=32, choices=Event.choices)
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    recipient = models.EmailField(blank=True, help_text="The address of an e-mail notification")
    subject = models.CharField(max_length=200)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True, help_text="HTTP status of the last POST")
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = NotificationQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["subscription", "source", "source_id"],
                                               name="notification_once_per_event")]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"{self.event} {self.source}:{self.source_id} -> subscription {self.subscription_id} ({self.status})"


class FanoutCursor(models.Model):
    """How far the fan-out has read a source's rows: every row with ``id <= last_id`` was read after it had
    settled (``NOTIFY_SETTLE_SECONDS`` old), so no transaction that was still open can add one below it."""

    source = models.CharField(max_length=16, primary_key=True, choices=Notification.Source.choices)
    last_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.source} up to {self.last_id}"
