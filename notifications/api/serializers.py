"""Serializers of ``/api/v1/subscriptions/`` and ``/api/v1/notifications/``."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers

from core.fields import ListedChoiceField, StrictBooleanField, StrictCharField
from quotas.serializers import VisibleTeamField

from ..models import Event, Notification, Subscription
from ..rules import shown_url, subscription_errors


class SubscriptionTeamField(VisibleTeamField):
    """A subscription's team: a slug of the user's teams on input (left out: the user's own subscription, never
    null), the slug or null (the user's own) in answers."""


class SubscriptionTeamFieldSchema(OpenApiSerializerFieldExtension):
    """The OpenAPI schema of ``SubscriptionTeamField``: a string in requests, a nullable string in answers."""

    target_class = SubscriptionTeamField

    def map_serializer_field(self, auto_schema, direction):
        return {"type": "string", "nullable": True} if direction == "response" else {"type": "string"}


class SubscriptionSerializer(serializers.ModelSerializer):
    """A user's or a team's subscription to notifications.

    Input: ``team`` (slug of one of the user's teams: a team subscription, which only the team's admins and
    staff make; left out: the user's own), ``channel`` (``email`` or ``webhook``, fixed after creation),
    ``email`` (an e-mail subscription's address; a team's needs one, the user's own defaults to the user's
    address), ``webhook_url`` (a webhook's http or https URL without ``user:password@``; never shown again:
    ``webhook`` shows its scheme and host), ``secret`` (the HMAC-SHA256 key of the ``X-Controlplane-Signature-256``
    header, at most 200 characters; never shown, ``has_secret`` says whether one is set), ``events`` (one or more
    of ``job.succeeded``, ``job.failed``, ``job.cancelled``, ``job.preempted``, ``job.recovered``,
    ``budget.threshold``), ``only_own_jobs`` (the user's own subscription only: job events of the jobs the user
    submitted), ``active``, ``name``.
    """

    team = SubscriptionTeamField(required=False)
    user = serializers.CharField(source="user.username", read_only=True, default=None, allow_null=True)
    channel = ListedChoiceField(choices=Subscription.Channel.choices)
    name = StrictCharField(max_length=100, required=False, allow_blank=True)
    email = serializers.EmailField(required=False, allow_blank=True)
    webhook_url = StrictCharField(write_only=True, required=False, allow_blank=True, max_length=2000)
    webhook = serializers.SerializerMethodField()
    secret = StrictCharField(write_only=True, required=False, allow_blank=True, max_length=200,
                             trim_whitespace=False)
    has_secret = serializers.SerializerMethodField()
    events = serializers.ListField(child=ListedChoiceField(choices=Event.choices), allow_empty=False, max_length=6)
    only_own_jobs = StrictBooleanField(required=False)
    active = StrictBooleanField(required=False)

    class Meta:
        model = Subscription
        fields = ["id", "team", "user", "name", "channel", "email", "webhook_url", "webhook", "secret", "has_secret",
                  "events", "only_own_jobs", "active", "created_at"]
        read_only_fields = ["id", "user", "webhook", "has_secret", "created_at"]

    def get_webhook(self, sub: Subscription) -> str:
        return shown_url(sub.webhook_url) if sub.channel == Subscription.Channel.WEBHOOK else ""

    def get_has_secret(self, sub: Subscription) -> bool:
        return bool(str(sub.secret))

    def validate_events(self, events: list) -> list:
        if len(set(events)) != len(events):
            raise serializers.ValidationError("each event once")
        return events

    def validate(self, attrs: dict) -> dict:
        current = self.instance
        # A PATCH keeps what it leaves out; a PUT replaces the subscription, URL included (never shown, so never
        # sent back unchanged by accident), and keeps only its team.
        kept = ("team", "channel", "email", "webhook_url", "only_own_jobs") if self.partial else ("team",)
        merged = {f: attrs.get(f, getattr(current, f, None) if f in kept else None) for f in
                  ("team", "channel", "email", "webhook_url", "only_own_jobs")}
        if current is not None:
            for field in ("team", "channel"):
                if field in attrs and attrs[field] != getattr(current, field):
                    raise serializers.ValidationError({field: "fixed after creation; make a new subscription"})
        errors = subscription_errors(team=merged["team"], channel=merged["channel"], email=merged["email"],
                                     webhook_url=merged["webhook_url"], secret=attrs.get("secret", ""),
                                     only_own_jobs=merged["only_own_jobs"],
                                     owner_email=(current.user if current is not None and current.user_id
                                                  else self.context["request"].user).email)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class NotificationSerializer(serializers.ModelSerializer):
    """One notification and how its delivery went: ``status`` ``pending`` (next try at ``next_attempt_at``),
    ``queued``, ``sending``, ``sent`` (at ``sent_at``) or ``failed``; ``response_status`` is the webhook
    receiver's last HTTP status, ``last_error`` the last failure; ``uid`` is the webhook's
    ``X-Controlplane-Delivery``. ``payload`` is the body sent (its ``text`` the e-mail's)."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    channel = serializers.CharField(source="subscription.channel", read_only=True)

    class Meta:
        model = Notification
        fields = ["id", "uid", "subscription", "team", "event", "job", "channel", "recipient", "subject", "payload",
                  "status", "attempts", "next_attempt_at", "sent_at", "response_status", "last_error", "created_at"]
        read_only_fields = fields
