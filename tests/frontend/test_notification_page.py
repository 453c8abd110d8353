"""The Notifications page: a team admin subscribes the team's webhook from a form (refused with the field's
reason when the URL holds a password), a member sees it but has no Delete and gets 403 posting one, another
team's subscription is a 404, and the page never shows the URL's path or the secret."""

from __future__ import annotations

import pytest

from notifications.models import Subscription
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db
HOOK = "https://hooks.slack.com/services/T0/B0/PATHKEY"


def test_a_team_admin_subscribes_the_team_and_a_member_cannot_delete_it(owner, teammate, outsider):
    web = signed_in(owner)
    refused = web.post("/notifications/", {"team": "alpha", "channel": "webhook", "events": ["job.failed"],
                                           "webhook_url": "https://u:p@hooks.example.com/x"})
    assert refused.status_code == 400 and "user:password@" in refused.content.decode()
    made = web.post("/notifications/", {"team": "alpha", "channel": "webhook", "events": ["job.failed"],
                                        "webhook_url": HOOK, "secret": "k-9"})
    assert made.status_code == 302 and made["Location"] == "/notifications/"
    sub = Subscription.objects.get()
    assert (sub.team.slug, str(sub.webhook_url), str(sub.secret)) == ("alpha", HOOK, "k-9")
    page = web.get("/notifications/").content.decode()
    assert "https://hooks.slack.com/…" in page and "PATHKEY" not in page and "k-9" not in page
    assert f"/notifications/{sub.pk}/delete/" in page

    member = signed_in(teammate)
    shown = member.get("/notifications/").content.decode()
    assert "team alpha" in shown and f"/notifications/{sub.pk}/delete/" not in shown
    assert 'value="alpha"' not in shown  # a member may subscribe only themselves
    assert member.post(f"/notifications/{sub.pk}/delete/").status_code == 403
    assert signed_in(outsider).post(f"/notifications/{sub.pk}/delete/").status_code == 404
    assert web.post(f"/notifications/{sub.pk}/delete/").status_code == 302
    assert not Subscription.objects.exists()


def test_a_member_subscribes_themselves_by_email_to_their_own_jobs(teammate):
    web = signed_in(teammate)
    response = web.post("/notifications/", {"channel": "email", "events": ["job.failed"]})
    assert response.status_code == 400 and "no e-mail address" in response.content.decode()  # none to send to
    teammate.user.email = "teammate@example.com"
    teammate.user.save(update_fields=["email"])
    response = web.post("/notifications/", {"team": "alpha", "channel": "email", "events": ["job.failed"]})
    assert response.status_code == 400  # not an admin of alpha: not a choice
    response = web.post("/notifications/", {"channel": "email", "events": ["job.failed", "job.succeeded"],
                                            "only_own_jobs": "on"})
    assert response.status_code == 302
    sub = Subscription.objects.get()
    assert (sub.user, sub.team, sub.events, sub.only_own_jobs) == (teammate.user, None,
                                                                   ["job.failed", "job.succeeded"], True)
