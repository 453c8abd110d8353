"""Coalesced publishing of scheduling passes on a Redis broker (``jobs.scheduling.pacing.publish_schedule``).

A submission publishes a pass only when it sets the flag ``controlplane:schedule-pending``
(SET NX EX 30); the pass clears the flag before it reads the queue, so a job whose
submission found the flag set is still read by that pass.
"""

import pytest
from django.conf import settings

from jobs import tasks
from jobs.lifecycle import submit_job
from jobs.models import Job, JobState
from jobs.scheduling import pacing
from jobs.scheduling.passes import schedule_coalesced

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(redis_broker):
    """The test broker's Redis, flag cleared; yields a function counting messages in the fast queue (the passes')."""
    client = pacing.schedule_flag_client()
    assert client is not None
    client.delete(pacing.SCHEDULE_PENDING_KEY)
    yield lambda: client.llen(settings.CELERY_FAST_QUEUE)
    client.delete(pacing.SCHEDULE_PENDING_KEY)


@pytest.fixture
def submit_and_publish(teams, user, h100, quota_factory, cluster_factory, django_capture_on_commit_callbacks):
    """``submit_and_publish()``: a 1-GPU job of alpha submitted as the API does, its on-commit notification run and
    flushed (the pass published, or not)."""
    alpha = teams[0]
    cluster_factory("c", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    counter = iter(range(1, 10_000))

    def make():
        spec = {
            "image": "python:3.11", "command": ["python", "train.py"],
            "resources": {"accelerator": h100.name, "gpus_per_node": 1, "nodes": 1},
            "priority": 500, "max_runtime_seconds": 3600, "preemptible": False, "placement": {}, "max_retries": 0,
        }
        resources = {"accelerator": h100, "gpus_per_node": 1, "nodes": 1, "priority": 500, "preemptible": False,
                     "max_runtime_seconds": 3600, "max_retries": 0}
        with django_capture_on_commit_callbacks(execute=True):
            job = submit_job(team=alpha, submitter=user, name=f"job-{next(counter)}", kind="training",
                             spec=spec, resources=resources)
        assert pacing.SCHEDULE_NOTIFIER.flush()  # the notifier thread's publish (or not) has happened
        return job
    return make


def test_two_submissions_in_a_row_publish_one_pass_and_the_pass_reopens_publishing(broker, submit_and_publish):
    before = broker()
    submit_and_publish()
    submit_and_publish()
    assert broker() == before + 1  # the second found the flag set
    assert pacing.schedule_flag_client().ttl(pacing.SCHEDULE_PENDING_KEY) > 0  # bounded by its expiry

    schedule_coalesced()  # what the published task runs: clears the flag first

    assert not pacing.schedule_flag_client().exists(pacing.SCHEDULE_PENDING_KEY)
    submit_and_publish()
    assert broker() == before + 2


def test_a_job_submitted_while_the_flag_is_set_is_admitted_by_the_pending_pass(broker, submit_and_publish):
    first = submit_and_publish()
    before = broker()
    second = submit_and_publish()  # flag set by the first: no publish of its own
    assert broker() == before

    result = schedule_coalesced()  # the pass the first submission published

    assert result is not None and set(result.admitted) >= {first.pk, second.pk}
    assert Job.objects.get(pk=second.pk).state == JobState.ADMITTED


def test_any_other_broker_publishes_every_time(monkeypatch):
    from controlplane.celery import app

    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery's broker_url reads it first
    monkeypatch.setattr(app.conf, "broker_url", "filesystem://")
    published = []
    monkeypatch.setattr(tasks.schedule_pending, "delay", lambda: published.append(1))
    assert pacing.schedule_flag_client() is None
    assert pacing.publish_schedule() and pacing.publish_schedule()
    assert len(published) == 2


def test_a_pass_that_comes_before_the_pause_ends_defers_itself_and_keeps_the_flag(broker, submit_and_publish, settings):
    """Pacing: after a pass of d seconds the next waits d x factor; an early pass republishes itself with a
    countdown, the flag stays set so submissions meanwhile publish nothing, and the deferred pass admits them."""
    import json

    settings.SCHEDULE_PASS_PAUSE_FACTOR, settings.SCHEDULE_PASS_PAUSE_MAX_SECONDS = 1.0, 2.0
    client = pacing.schedule_flag_client()
    client.delete(pacing.SCHEDULE_LAST_PASS_KEY)
    first = submit_and_publish()  # sets the flag and publishes the pass
    assert pacing.record_pass(5.0) == 2.0  # a long pass just ended: capped pause of 2 s
    before = broker()

    assert schedule_coalesced() is None  # too early

    assert broker() == before + 1
    message = json.loads(client.lindex(settings.CELERY_FAST_QUEUE, 0))
    assert message["headers"]["task"] == "jobs.tasks.schedule_pending" and message["headers"]["eta"]
    assert client.exists(pacing.SCHEDULE_PENDING_KEY)
    assert Job.objects.get(pk=first.pk).state == JobState.QUEUED
    second = submit_and_publish()
    assert broker() == before + 1  # the flag is held for the deferred pass

    client.delete(pacing.SCHEDULE_LAST_PASS_KEY)  # the pause has passed
    result = schedule_coalesced()  # the deferred copy

    assert result is not None and {first.pk, second.pk} <= set(result.admitted)
    assert not client.exists(pacing.SCHEDULE_PENDING_KEY)


def test_a_short_pass_asks_for_no_pause(redis_broker, settings):
    settings.SCHEDULE_PASS_PAUSE_FACTOR, settings.SCHEDULE_PASS_PAUSE_MIN_SECONDS = 1.0, 0.02
    assert pacing.record_pass(0.005) == 0.0
    settings.SCHEDULE_PASS_PAUSE_FACTOR = 3.0
    assert pacing.record_pass(0.019) == 0.0  # the pass's own length decides, not the pause it would give
    settings.SCHEDULE_PASS_PAUSE_FACTOR = 1.0
    assert pacing.pass_pause_remaining() == 0.0
    assert pacing.record_pass(0.5) == 0.5
    assert 0.0 < pacing.pass_pause_remaining() <= 0.5
    pacing.schedule_flag_client().delete(pacing.SCHEDULE_LAST_PASS_KEY)


def test_a_burst_of_notifications_from_many_threads_publishes_once_and_after_each_of_them(broker):
    """The API's submissions notify ``SCHEDULE_NOTIFIER`` on commit; its one thread publishes for all of them."""
    import threading

    def set_calls():  # SET commands the Redis server has run (server-wide counter)
        return pacing.schedule_flag_client().info("commandstats").get("cmdstat_set", {}).get("calls", 0)

    before, sets_before = broker(), set_calls()
    threads = [threading.Thread(target=lambda: [pacing.SCHEDULE_NOTIFIER.notify() for _ in range(50)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pacing.SCHEDULE_NOTIFIER.flush()
    assert broker() == before + 1  # 400 notifications, one pass published: the flag stayed set
    assert set_calls() - sets_before < 20  # coalesced in the process too: one SET NX per coalesce window
    pacing.schedule_flag_client().delete(pacing.SCHEDULE_PENDING_KEY)  # the pass started
    pacing.SCHEDULE_NOTIFIER.notify()
    assert pacing.SCHEDULE_NOTIFIER.flush()
    assert broker() == before + 2  # a notification after the pass started publishes the next one


def test_a_forked_process_gets_a_notifier_of_its_own(broker):
    """gunicorn and Celery fork workers: a child must not inherit a dead thread or a held lock."""
    import os

    pacing.SCHEDULE_NOTIFIER.notify()  # the parent's thread exists before the fork
    assert pacing.SCHEDULE_NOTIFIER.flush()
    pacing.schedule_flag_client().delete(pacing.SCHEDULE_PENDING_KEY)
    before = broker()
    pid = os.fork()
    if pid == 0:  # the child: publish one pass through its own notifier thread, then leave without cleanup
        ok = False
        try:
            pacing.SCHEDULE_NOTIFIER.notify()
            ok = pacing.SCHEDULE_NOTIFIER.flush(10.0)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert broker() == before + 1
