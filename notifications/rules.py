"""What a subscription must be to be sendable, and who may make or change one: one definition for the API and the
web UI (docs/adr/0035-notifications.md)."""

from __future__ import annotations

import urllib.parse

from quotas.permissions import may_administer

from .models import Subscription

TEAM_ONLY_ADMINS = "only the team's admins and platform staff change a team's subscriptions"
OWN_ONLY = "only its user changes a personal subscription"


class WebhookUrlInvalid(ValueError):
    """A webhook URL the platform will not POST to (the message says why)."""


def check_webhook_url(url: str) -> str:
    """``url`` when it is an absolute http or https URL with a host and no ``user:password@`` part (a credential
    there would be shown in logs and answers; a receiver's secret goes in ``secret`` or in the path, as Slack's
    incoming webhooks do). Raises WebhookUrlInvalid otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookUrlInvalid("a webhook URL must start with http:// or https://")
    if not parts.hostname:
        raise WebhookUrlInvalid("a webhook URL must name a host")
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlInvalid("a webhook URL may not hold user:password@; put the receiver's key in secret")
    return url


def shown_url(url: str) -> str:
    """A webhook URL as answers and pages show it: scheme and host only, the path (which holds Slack's key) left
    out; "" for none."""
    parts = urllib.parse.urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}/…" if parts.netloc else ""


def subscription_errors(*, team, channel: str, email: str, webhook_url: str, secret: str,
                        only_own_jobs: bool, owner_email: str = "") -> dict[str, str]:
    """Why a subscription with these values could not be sent, by field (empty: it can).

    ``team`` is a Team or None (the user's own); ``channel`` ``email`` or ``webhook``. A webhook needs a valid
    URL (``check_webhook_url``) and no address; an e-mail one no URL or secret, and an address to send to: a
    team's its own ``email``, a user's own ``email`` or else ``owner_email`` (the address of the account it belongs
    to; "" when the account has none); ``only_own_jobs`` is for a user's own subscription.
    """
    errors = {}
    if channel == Subscription.Channel.WEBHOOK:
        if not webhook_url:
            errors["webhook_url"] = "a webhook subscription needs a URL"
        else:
            try:
                check_webhook_url(str(webhook_url))
            except WebhookUrlInvalid as exc:
                errors["webhook_url"] = str(exc)
        if email:
            errors["email"] = "a webhook subscription has no e-mail address"
    else:
        if webhook_url or secret:
            errors["webhook_url" if webhook_url else "secret"] = "only a webhook subscription has one"
        if team is not None and not email:
            errors["email"] = "a team's e-mail subscription needs an address"
        elif team is None and not email and not owner_email:
            errors["channel"] = ("your account has no e-mail address to send to: give one in email, or add one to "
                                 "the account")
    if team is not None and only_own_jobs:
        errors["only_own_jobs"] = "only for your own subscription, not a team's"
    return errors


def may_change(user, sub: Subscription) -> bool:
    """Whether ``user`` may change or delete ``sub``: a team's by its admins and staff, a personal one by its
    user and staff."""
    if sub.team_id is not None:
        return may_administer(user, sub.team_id)
    return sub.user_id == user.pk or user.is_staff


def refusal(sub: Subscription) -> str:
    """The reason ``may_change`` gives no to someone who sees ``sub``."""
    return TEAM_ONLY_ADMINS if sub.team_id is not None else OWN_ONLY
