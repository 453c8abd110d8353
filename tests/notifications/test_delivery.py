"""Notifications end to end against a real webhook receiver on 127.0.0.1 and Django's locmem mail outbox: a
job's end and a budget's 80 % threshold each send one signed webhook and one e-mail, a task delivered twice
sends nothing twice, a receiver that answers 500 gets the notification after one retry, and one that never
answers delays no one else."""

from __future__ import annotations

import datetime as dt
import threading
from datetime import UTC
from decimal import Decimal

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from costs.budgets import check_budget
from costs.ledger import accrue_attempt
from jobs.lifecycle import end_attempt, preempt_attempt
from jobs.models import JobAttempt, JobEvent, JobState
from jobs.states import transition
from notifications import delivery, fanout, tasks
from notifications.models import Event, FanoutCursor, Notification, Subscription
from tests.support.factories import fresh, make_attempt, make_job, make_job_row

from .receiver import Receiver, signed_by

SECRET = "whsec-3f9a1c"
LONG_AGO = dt.datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def quick(settings):
    """A short webhook timeout (the receiver that never answers), no settle time (every event is read now)."""
    settings.NOTIFY_WEBHOOK_TIMEOUT_SECONDS = 0.5
    settings.NOTIFY_SETTLE_SECONDS = 0
    settings.NOTIFY_BASE_URL = "https://cp.example.com"
    return settings


def subscribe(*, team=None, user=None, channel="webhook", url="", email="", events=(), secret=SECRET,
              only_own_jobs=False) -> Subscription:
    """A subscription made before every event of the test (its ``created_at`` moved back: events older than a
    subscription notify nobody)."""
    sub = Subscription.objects.create(team=team, user=user, channel=channel, webhook_url=url, email=email,
                                      secret=secret if channel == "webhook" else "", events=list(events),
                                      only_own_jobs=only_own_jobs)
    Subscription.objects.filter(pk=sub.pk).update(created_at=LONG_AGO)
    return sub


def send_all(now=None) -> list[str]:
    """The periodic pass (fan-out, then queue the due rows) and then each queued row's delivery task, as a
    worker would run them; returns the delivery results."""
    fanout.fan_out(now)
    return [tasks.deliver.run(pk) if now is None else delivery.deliver(pk, now) for pk in delivery.queue_due(now)]


def ended_job(team, submitter, h100, aws_cluster, *, name="train-small"):
    """A job of ``team`` that ran and succeeded (its attempt ended through the lifecycle)."""
    job = make_job(team, submitter, h100, name=name)
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    end_attempt(fresh(job), attempt, JobState.SUCCEEDED, reason="all pods succeeded",
                end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
    return fresh(job)


@pytest.mark.django_db
def test_a_jobs_end_sends_one_signed_webhook_and_one_email(quick, teams, owner, teammate, h100, aws_cluster):
    teammate.user.email = "member@example.com"
    teammate.user.save()
    with Receiver() as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.JOB_SUCCEEDED, Event.JOB_FAILED])
        subscribe(user=teammate.user, channel="email", events=[Event.JOB_SUCCEEDED])
        job = ended_job(teams[0], teammate.user, h100, aws_cluster)
        assert sorted(send_all()) == ["sent", "sent"]
        assert send_all() == []  # a second pass: nothing new
        fanout.fan_out()
        assert send_all() == []

    assert len(receiver.received) == 1
    post = receiver.received[0]
    assert post["path"] == "/hooks/T000/B000/key" and signed_by(post, SECRET)
    assert not signed_by(post, SECRET + "x")
    body = post["json"]
    assert body["text"].startswith(f"Job {job.pk} train-small of team alpha succeeded: all pods succeeded. Cost: $")
    assert body["text"].endswith(f" https://cp.example.com/jobs/{job.pk}/")
    assert {k: body[k] for k in ("event", "job_id", "team", "state", "reason", "cost_usd", "url")} == {
        "event": "job.succeeded", "job_id": job.pk, "team": "alpha", "state": "SUCCEEDED",
        "reason": "all pods succeeded", "cost_usd": "0.00", "url": f"https://cp.example.com/jobs/{job.pk}/"}
    assert post["headers"]["X-Controlplane-Event"] == "job.succeeded"
    note = Notification.objects.get(subscription__channel="webhook")
    assert post["headers"]["X-Controlplane-Delivery"] == str(note.uid)
    assert (note.status, note.attempts, note.response_status) == ("sent", 1, 200)

    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["member@example.com"]
    assert mail.outbox[0].subject == f"[controlplane] alpha: job {job.pk} train-small succeeded"
    assert body["text"] in mail.outbox[0].body


@pytest.mark.django_db
def test_a_budgets_80_percent_threshold_sends_one_webhook_and_one_email(quick, teams, owner, teammate, h100,
                                                                        cluster_factory, budget_factory):
    pool = cluster_factory("eks", "aws", "us-east-1", h100, price="5.00", nodes=4)[1]
    budget = budget_factory(teams[0], "1000", action="alert")

    def spend(gpus, start, end):  # gpus x hours x $5, accrued into the ledger
        job = make_job_row(teams[0], owner.user, h100, name="j", spec={}, gpus_per_node=gpus,
                           max_runtime=30 * 86400, state=JobState.SUCCEEDED)
        accrue_attempt(make_attempt(job, pool.cluster, pool, gpus=gpus, usd_per_gpu_hour=Decimal("5.00"),
                                    started_at=start, ended_at=end, state=JobState.SUCCEEDED).pk, until=end)

    at = dt.datetime(2026, 3, 20, 12, tzinfo=UTC)
    with Receiver() as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.BUDGET_THRESHOLD])
        subscribe(team=teams[0], channel="email", email="alpha-leads@example.com", events=[Event.BUDGET_THRESHOLD])
        spend(4, dt.datetime(2026, 3, 2, tzinfo=UTC), dt.datetime(2026, 3, 3, 6, tzinfo=UTC))  # 4 x 30 h x $5 = $600
        assert [a.threshold_percent for a in check_budget(budget, at)] == [50]
        send_all()
        before_posts, before_mails = len(receiver.received), len(to("alpha-leads@example.com"))
        assert (before_posts, before_mails) == (1, 1)

        spend(4, dt.datetime(2026, 3, 5, tzinfo=UTC), dt.datetime(2026, 3, 5, 11, tzinfo=UTC))  # + $220 = $820
        assert [a.threshold_percent for a in check_budget(budget, at)] == [80]
        assert check_budget(budget, at) == []
        send_all()
        send_all()

    eighty = receiver.received[before_posts:]
    assert len(eighty) == 1 and signed_by(eighty[0], SECRET)
    body = eighty[0]["json"]
    assert {k: body[k] for k in ("event", "team", "budget_id", "threshold_percent", "spent_usd", "amount_usd")} == {
        "event": "budget.threshold", "team": "alpha", "budget_id": budget.pk, "threshold_percent": 80,
        "spent_usd": "820.00", "amount_usd": "1000.00"}
    mails = to("alpha-leads@example.com")[before_mails:]
    assert len(mails) == 1 and "80% of the monthly budget" in mails[0].subject
    assert "$820.00 of $1000.00" in mails[0].body


def to(address: str) -> list:
    """The messages of Django's locmem outbox sent to ``address`` (the team admins' own budget alert goes too)."""
    return [m for m in mail.outbox if address in m.to]


@pytest.mark.django_db
def test_a_task_delivered_twice_sends_nothing_twice(quick, teams, owner, teammate, h100, aws_cluster):
    with Receiver() as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.JOB_SUCCEEDED])
        ended_job(teams[0], teammate.user, h100, aws_cluster)
        fanout.fan_out()
        fanout.fan_out()  # the periodic task delivered twice
        FanoutCursor.objects.all().update(last_id=0)  # and a pass that reads every event again
        fanout.fan_out()
        assert Notification.objects.count() == 1
        [pk] = delivery.queue_due()
        assert delivery.queue_due() == []
        assert [tasks.deliver.run(pk), tasks.deliver.run(pk)] == ["sent", "skipped"]
    assert len(receiver.received) == 1


@pytest.mark.django_db
def test_a_receiver_that_answers_500_gets_it_once_after_a_retry_with_backoff(quick, teams, teammate, h100,
                                                                              aws_cluster):
    now = timezone.now()
    with Receiver(statuses=[500, 200]) as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.JOB_SUCCEEDED])
        ended_job(teams[0], teammate.user, h100, aws_cluster)
        assert send_all(now) == ["pending"]
        note = Notification.objects.get()
        base = quick.NOTIFY_RETRY_BASE_SECONDS
        assert (note.status, note.attempts, note.response_status) == ("pending", 1, 500)
        assert note.next_attempt_at == now + dt.timedelta(seconds=base)
        assert "500" in note.last_error
        assert delivery.deliver(note.pk, now) == "skipped"  # not due yet
        assert send_all(now + dt.timedelta(seconds=base - 1)) == []
        assert send_all(now + dt.timedelta(seconds=base)) == ["sent"]
        assert send_all(now + dt.timedelta(hours=1)) == []

    assert [r["headers"]["X-Controlplane-Delivery"] for r in receiver.received] == [str(note.uid)] * 2
    assert receiver.received[0]["body"] == receiver.received[1]["body"]  # the same bytes, signed the same
    note.refresh_from_db()
    assert (note.status, note.attempts, note.response_status, note.last_error) == ("sent", 2, 200, "")


@pytest.mark.django_db
def test_retries_back_off_exponentially_and_give_up_after_the_last_attempt(quick, teams, teammate, h100,
                                                                            aws_cluster):
    quick.NOTIFY_MAX_ATTEMPTS, quick.NOTIFY_RETRY_BASE_SECONDS, quick.NOTIFY_RETRY_MAX_SECONDS = 4, 10, 30
    now = timezone.now()
    with Receiver(statuses=[503]) as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.JOB_SUCCEEDED])
        ended_job(teams[0], teammate.user, h100, aws_cluster)
        fanout.fan_out(now)
        gaps = []
        for _ in range(4):
            pk = Notification.objects.get().pk
            delivery.deliver(pk, now)
            note = Notification.objects.get()
            if note.status == "pending":
                gaps.append((note.next_attempt_at - now).total_seconds())
                now = note.next_attempt_at
    assert gaps == [10, 20, 30]  # 10 x 2^0, 10 x 2^1, then the 30 s cap
    assert (note.status, note.attempts) == ("failed", 4) and len(receiver.received) == 4


@pytest.mark.django_db(transaction=True)
def test_a_receiver_that_never_answers_delays_no_other_notification(quick, teams, teammate, h100, aws_cluster):
    with Receiver(hold=True) as silent, Receiver() as good:
        silent_sub = subscribe(team=teams[0], url=silent.url, events=[Event.JOB_SUCCEEDED])
        good_sub = subscribe(team=teams[0], url=good.url, events=[Event.JOB_SUCCEEDED])
        ended_job(teams[0], teammate.user, h100, aws_cluster)
        fanout.fan_out()
        assert len(delivery.queue_due()) == 2
        silent_pk = Notification.objects.get(subscription=silent_sub).pk
        good_pk = Notification.objects.get(subscription=good_sub).pk
        results = {}

        def worker(pk):
            try:
                results[pk] = tasks.deliver.run(pk)
            finally:
                connection.close()

        stuck = threading.Thread(target=worker, args=(silent_pk,))
        stuck.start()
        assert silent.arrived.wait(10)  # the silent receiver holds its request, unanswered
        worker(good_pk)  # meanwhile another worker sends the other one
        assert results == {good_pk: "sent"} and len(good.received) == 1
        stuck.join(10)
    assert results[silent_pk] == "pending"
    silent_note = Notification.objects.get(pk=silent_pk)
    assert silent_note.attempts == 1 and "timed out" in silent_note.last_error


@pytest.mark.django_db
def test_preemption_and_recovery_notify_the_subscribers_that_asked(quick, teams, owner, teammate, h100,
                                                                  aws_cluster):
    with Receiver() as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.JOB_PREEMPTED, Event.JOB_RECOVERED])
        job = make_job(teams[0], teammate.user, h100, name="long-run")
        first = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
        preempt_attempt(fresh(job), first, reason="preempted by job 7 (priority 1000)")
        second = make_attempt(fresh(job), aws_cluster["cluster"], aws_cluster["pool"], number=2,
                              state=JobState.RECOVERING)
        job = transition(fresh(job), JobState.ADMITTED, reason="admitted again", attempt=second)
        job = transition(job, JobState.STARTING, reason="objects created", attempt=second)
        transition(job, JobState.RUNNING, reason="all nodes running", attempt=second)
        end_attempt(fresh(job), second, JobState.SUCCEEDED, reason="done", end_reason="Succeeded")  # not asked for
        send_all()
    assert [r["json"]["event"] for r in receiver.received] == ["job.preempted", "job.recovered"]
    assert receiver.received[0]["json"]["reason"] == "preempted by job 7 (priority 1000)"
    assert [" Cost so far: " in r["json"]["text"] for r in receiver.received] == [True, True]  # not over yet


@pytest.mark.django_db
def test_without_a_base_url_a_message_gives_no_relative_link(quick, teams, teammate, h100, aws_cluster):
    """A path alone ("/jobs/8/") is no link in a chat tool: with NOTIFY_BASE_URL empty the message has no URL and
    says which setting gives one."""
    quick.NOTIFY_BASE_URL = ""
    with Receiver() as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.JOB_SUCCEEDED])
        job = ended_job(teams[0], teammate.user, h100, aws_cluster)
        assert send_all() == ["sent"]
    body = receiver.received[0]["json"]
    assert body["url"] is None
    assert f"/jobs/{job.pk}/" not in body["text"] and body["text"].endswith("(no link: NOTIFY_BASE_URL is not set)")


@pytest.mark.django_db
def test_a_personal_subscription_follows_the_users_teams_and_own_jobs_only_when_asked(
        quick, teams, owner, teammate, outsider, h100, aws_cluster):
    owner.user.email = "owner@example.com"
    owner.user.save()
    subscribe(user=owner.user, channel="email", events=[Event.JOB_SUCCEEDED], only_own_jobs=True)
    subscribe(user=teammate.user, channel="email", email="t@example.com", events=[Event.JOB_SUCCEEDED])
    ended_job(teams[0], teammate.user, h100, aws_cluster, name="teammates")
    ended_job(teams[0], owner.user, h100, aws_cluster, name="owners")
    ended_job(teams[1], outsider.user, h100, aws_cluster, name="betas")
    send_all()
    sent = sorted((m.to[0], m.subject.split()[-2]) for m in mail.outbox)
    assert sent == [("owner@example.com", "owners"), ("t@example.com", "owners"), ("t@example.com", "teammates")]


@pytest.mark.django_db
def test_an_email_subscription_without_an_address_is_logged_as_failed(quick, teams, teammate, h100, aws_cluster):
    subscribe(user=teammate.user, channel="email", events=[Event.JOB_SUCCEEDED])  # the user has no address
    ended_job(teams[0], teammate.user, h100, aws_cluster)
    assert send_all() == []
    note = Notification.objects.get()
    assert (note.status, note.last_error) == ("failed", "no e-mail address to send to") and mail.outbox == []


@pytest.mark.django_db
def test_events_before_the_settle_time_are_read_again_and_the_cursor_waits_for_them(quick, teams, teammate, h100,
                                                                                   aws_cluster):
    quick.NOTIFY_SETTLE_SECONDS = 120
    subscribe(user=teammate.user, channel="email", email="t@example.com", events=[Event.JOB_SUCCEEDED])
    ended_job(teams[0], teammate.user, h100, aws_cluster)
    now = timezone.now()
    fanout.fan_out(now)
    assert FanoutCursor.objects.get(source="job_event").last_id == 0  # the event is not settled yet
    fanout.fan_out(now + dt.timedelta(seconds=121))
    assert FanoutCursor.objects.get(source="job_event").last_id == JobEvent.objects.latest("id").pk
    assert Notification.objects.count() == 1


@pytest.mark.django_db
def test_the_first_pass_starts_after_the_events_that_precede_every_subscription(quick, teams, teammate, h100,
                                                                                aws_cluster):
    old = ended_job(teams[0], teammate.user, h100, aws_cluster, name="before")
    JobEvent.objects.filter(job=old).update(created_at=LONG_AGO - dt.timedelta(days=1))
    last_old_event = JobEvent.objects.filter(job=old).latest("id").pk
    subscribe(user=teammate.user, channel="email", email="t@example.com", events=[Event.JOB_SUCCEEDED])
    ended_job(teams[0], teammate.user, h100, aws_cluster, name="after")
    send_all()
    assert [m.subject.split()[-2] for m in mail.outbox] == ["after"]
    assert FanoutCursor.objects.get(source="job_event").last_id > last_old_event


@pytest.mark.django_db
def test_a_jobs_cost_in_a_notification_is_the_apis_and_unknown_never_zero(quick, teams, owner, teammate, h100,
                                                                           aws_cluster):
    """Class: unknown money shown as $0. A job whose only price disappeared before it ran accrued 2 GPU-hours with
    no price: its notification's cost is the API's figure (null, "unknown"), with the same unpriced hours beside
    it, never "$0.00"."""
    from costs.models import Price

    with Receiver() as receiver:
        subscribe(team=teams[0], url=receiver.url, events=[Event.JOB_SUCCEEDED])
        job = make_job(teams[0], teammate.user, h100, name="unpriced", gpus_per_node=2)
        start = timezone.now() - dt.timedelta(hours=1)
        attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], started_at=start)
        Price.objects.all().delete()
        end_attempt(fresh(job), attempt, JobState.SUCCEEDED, reason="all pods succeeded",
                    end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0, ended_at=start + dt.timedelta(hours=1))
        accrue_attempt(attempt.pk)
        assert send_all() == ["sent"]
    body = receiver.received[0]["json"]
    api = owner.client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert api["accrued_cost_usd"] is None and api["unpriced_gpu_hours"] == 2.0  # 2 GPUs x 1 h, independently
    assert (body["cost_usd"], body["unpriced_gpu_hours"]) == (api["accrued_cost_usd"], api["unpriced_gpu_hours"])
    assert "$0.00" not in body["text"] and " Cost: unknown (and 2 GPU-hours" in body["text"]
