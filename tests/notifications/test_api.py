"""``/api/v1/subscriptions/`` and ``/api/v1/notifications/``: who makes and changes which subscription, what an
answer shows of a webhook (never its URL's path or its secret), and what the delivery log lists."""

from __future__ import annotations

import pytest
from django.utils import timezone

from notifications.models import Event, Notification, Subscription

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.slack.com/services/T000/B000/XXXXSECRETPATH"


def with_address(persona, email: str):
    """``persona`` with an e-mail address on the account (what a personal e-mail subscription sends to)."""
    persona.user.email = email
    persona.user.save(update_fields=["email"])
    return persona


def team_hook(**changes) -> dict:
    return {"team": "alpha", "channel": "webhook", "webhook_url": HOOK, "secret": "s3cret-key",
            "events": ["job.failed", "budget.threshold"], **changes}


def test_a_team_admin_subscribes_the_team_and_the_answer_hides_the_url_and_secret(owner):
    response = owner.client.post("/api/v1/subscriptions/", team_hook(), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["team"] == "alpha" and body["user"] is None
    assert body["webhook"] == "https://hooks.slack.com/…" and body["has_secret"] is True
    assert "webhook_url" not in body and "secret" not in body
    assert "XXXXSECRETPATH" not in response.content.decode() and "s3cret-key" not in response.content.decode()
    sub = Subscription.objects.get(pk=body["id"])
    assert (str(sub.webhook_url), str(sub.secret), sub.created_by) == (HOOK, "s3cret-key", owner.user)


def test_members_and_viewers_read_the_teams_subscriptions_but_write_none(owner, teammate, viewer):
    pk = owner.client.post("/api/v1/subscriptions/", team_hook(), format="json").json()["id"]
    for persona in (teammate, viewer):
        assert persona.client.get(f"/api/v1/subscriptions/{pk}/").status_code == 200
        assert persona.client.post("/api/v1/subscriptions/", team_hook(), format="json").status_code == 403
        assert persona.client.patch(f"/api/v1/subscriptions/{pk}/", {"active": False},
                                    format="json").status_code == 403
        assert persona.client.delete(f"/api/v1/subscriptions/{pk}/").status_code == 403
    assert Subscription.objects.get(pk=pk).active is True


def test_a_user_manages_their_own_subscription_which_nobody_else_sees(owner, teammate, outsider, staff):
    with_address(teammate, "teammate@example.com")
    response = teammate.client.post("/api/v1/subscriptions/", {"channel": "email", "events": ["job.succeeded"],
                                                               "only_own_jobs": True}, format="json")
    assert response.status_code == 201, response.content
    pk = response.json()["id"]
    assert response.json()["user"] == "teammate" and response.json()["team"] is None
    for persona in (owner, outsider):  # a teammate's admin included: a personal subscription is its user's
        assert persona.client.get(f"/api/v1/subscriptions/{pk}/").status_code == 404
        assert persona.client.get("/api/v1/subscriptions/").json()["count"] == 0
    assert staff.client.get(f"/api/v1/subscriptions/{pk}/").status_code == 200
    assert teammate.client.patch(f"/api/v1/subscriptions/{pk}/", {"events": ["job.failed"]},
                                 format="json").json()["events"] == ["job.failed"]
    assert teammate.client.delete(f"/api/v1/subscriptions/{pk}/").status_code == 204
    assert not Subscription.objects.exists()


def test_an_outsider_cannot_subscribe_to_another_team(outsider):
    response = outsider.client.post("/api/v1/subscriptions/", team_hook(), format="json")
    assert response.status_code == 400 and "team" in response.json()


@pytest.mark.parametrize("url, why", [
    ("ftp://hooks.example.com/x", "http:// or https://"),
    ("https://user:pw@hooks.example.com/x", "user:password@"),
    ("https:///no-host", "host"),
    ("hooks.example.com/x", "http:// or https://"),
])
def test_a_webhook_url_that_is_not_plain_http_is_refused(owner, url, why):
    response = owner.client.post("/api/v1/subscriptions/", team_hook(webhook_url=url), format="json")
    assert response.status_code == 400 and why in response.json()["webhook_url"][0], response.json()


@pytest.mark.parametrize("body, field", [
    ({"channel": "email", "events": ["job.failed"], "team": "alpha"}, "email"),
    ({"channel": "webhook", "events": ["job.failed"]}, "webhook_url"),
    ({"channel": "email", "events": ["job.failed"], "webhook_url": HOOK}, "webhook_url"),
    ({"channel": "email", "events": []}, "events"),
    ({"channel": "email", "events": ["job.failed", "job.failed"]}, "events"),
    ({"channel": "email", "events": ["job.exploded"]}, "events"),
    ({"channel": "webhook", "events": ["job.failed"], "webhook_url": HOOK, "team": "alpha", "only_own_jobs": True},
     "only_own_jobs"),
])
def test_a_subscription_that_cannot_be_sent_is_refused_on_its_field(owner, body, field):
    with_address(owner, "owner@example.com")
    response = owner.client.post("/api/v1/subscriptions/", body, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()


def test_an_email_subscription_of_an_account_without_an_address_is_refused(owner, teammate):
    """Every notification of it would fail: refused on ``channel`` unless it gives its own address; a team's
    sends to its own ``email`` only, and is refused on that field without one."""
    mine = {"channel": "email", "events": ["job.failed"]}
    response = teammate.client.post("/api/v1/subscriptions/", mine, format="json")
    assert response.status_code == 400 and "no e-mail address" in response.json()["channel"][0], response.json()
    assert not Subscription.objects.exists()
    given = teammate.client.post("/api/v1/subscriptions/", {**mine, "email": "me@example.com"}, format="json")
    assert given.status_code == 201, given.json()
    cleared = teammate.client.patch(f"/api/v1/subscriptions/{given.json()['id']}/", {"email": ""}, format="json")
    assert cleared.status_code == 400 and "channel" in cleared.json()
    with_address(owner, "owner@example.com")  # a team's subscription is not sent to its maker's address
    team = owner.client.post("/api/v1/subscriptions/", {**mine, "team": "alpha"}, format="json")
    assert team.status_code == 400 and "address" in team.json()["email"][0]
    assert owner.client.post("/api/v1/subscriptions/", mine, format="json").status_code == 201


def test_the_channel_and_team_are_fixed_after_creation(owner):
    pk = owner.client.post("/api/v1/subscriptions/", team_hook(), format="json").json()["id"]
    response = owner.client.patch(f"/api/v1/subscriptions/{pk}/", {"channel": "email"}, format="json")
    assert response.status_code == 400 and "channel" in response.json()


def test_the_delivery_log_lists_the_notifications_of_the_subscriptions_the_user_sees(owner, teammate, outsider,
                                                                                       alpha_objects):
    team_sub = Subscription.objects.create(team=alpha_objects["job"].team, channel="webhook", webhook_url=HOOK,
                                           events=[Event.JOB_FAILED])
    own_sub = Subscription.objects.create(user=owner.user, channel="email", events=[Event.JOB_FAILED])
    for i, sub in enumerate((team_sub, own_sub)):
        Notification.objects.create(subscription=sub, source="job_event", source_id=1, event=Event.JOB_FAILED,
                                    team=sub.team or alpha_objects["job"].team, job=alpha_objects["job"],
                                    subject="alpha-job failed", payload={"text": "alpha-job failed"},
                                    next_attempt_at=timezone.now(), status="sent" if i == 0 else "pending")
    seen = {persona: {n["subscription"] for n in persona.client.get("/api/v1/notifications/").json()["results"]}
            for persona in (owner, teammate, outsider)}
    assert seen == {owner: {team_sub.pk, own_sub.pk}, teammate: {team_sub.pk}, outsider: set()}
    sent = owner.client.get("/api/v1/notifications/?status=sent").json()["results"]
    assert [(n["subscription"], n["channel"], n["status"]) for n in sent] == [(team_sub.pk, "webhook", "sent")]
