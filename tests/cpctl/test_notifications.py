"""``cpctl subscribe``, ``subscriptions``, ``notifications`` and ``unsubscribe`` against the live API: a team admin
subscribes the team's webhook (a member may not: exit 4), a job's end reaches the receiver, and the log shows it
sent."""

from __future__ import annotations

from jobs.lifecycle import end_attempt
from jobs.models import JobAttempt, JobState
from notifications import delivery, fanout
from notifications.models import Subscription
from tests.notifications.receiver import Receiver, signed_by
from tests.support.factories import fresh, make_attempt, make_job

from .test_read import rows


def test_a_team_admin_subscribes_the_team_and_reads_the_delivery_log(run_cli, owner, teammate, fleet, h100,
                                                                     settings):
    settings.NOTIFY_SETTLE_SECONDS = 0
    with Receiver() as receiver:
        args = ("subscribe", "--team", "alpha", "--event", "job.succeeded", "--webhook", receiver.url,
                "--secret", "k-1")
        assert run_cli(*args, persona=teammate).code == 4
        result = run_cli(*args, persona=owner)
        assert result.code == 0, result.err
        sub = Subscription.objects.get()
        assert result.out.strip() == (f"subscription {sub.pk} (alpha): webhook to http://{receiver.url.split('/')[2]}"
                                      f"/…; job.succeeded")
        Subscription.objects.filter(pk=sub.pk).update(created_at=sub.created_at.replace(year=2000))
        listed = rows(run_cli("subscriptions", persona=teammate).out)
        assert listed[0] == ["ID", "TEAM", "CHANNEL", "SENDS TO", "EVENTS", "ACTIVE"]
        assert listed[1][:3] == [str(sub.pk), "alpha", "webhook"]

        job = make_job(fleet["quota"].team, teammate.user, h100, name="cli-run")
        attempt = make_attempt(job, fleet["cluster"], fleet["pool"])
        end_attempt(fresh(job), attempt, JobState.SUCCEEDED, reason="done", end_reason=JobAttempt.EndReason.SUCCEEDED)
        fanout.fan_out()
        for pk in delivery.queue_due():
            delivery.deliver(pk)
    assert len(receiver.received) == 1 and signed_by(receiver.received[0], "k-1")
    log = rows(run_cli("notifications", "--status", "sent", persona=owner).out)
    assert log[1][1:6] == ["job.succeeded", "alpha", "webhook", "sent", "1"]
    assert run_cli("unsubscribe", str(sub.pk), persona=teammate).code == 4
    assert run_cli("unsubscribe", str(sub.pk), persona=owner).out.strip() == f"subscription {sub.pk} deleted"
    assert not Subscription.objects.exists()
