"""A change committed while the broker is down answers success, never 500: the task it enqueues after commit
goes to the outbox, and the outbox sweep publishes it once Redis is back (real Redis on its own port, stopped)."""

from __future__ import annotations

import base64
import json

import redis
from django.conf import settings

from jobs.enqueue import CANCEL_TASK, send_outbox
from jobs.models import Job, JobState, OutboxTask
from tests.support.factories import make_attempt, make_job


def queued_tasks(server) -> list[tuple[str, list]]:
    """(task name, args) of the messages waiting in the fast queue (the lifecycle's tasks) on ``server``."""
    client = redis.Redis(port=server.port)
    out = []
    for raw in client.lrange(settings.CELERY_FAST_QUEUE, 0, -1):
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        out.append((message["headers"]["task"], list(body[0])))
    return out


def test_a_cancel_while_the_broker_is_down_answers_success_and_its_task_is_sent_later(
        owner, teams, h100, aws_cluster, private_broker, django_capture_on_commit_callbacks):
    job = make_job(teams[0], owner.user, h100)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])  # RUNNING: the cancel needs a task
    private_broker.stop()
    with django_capture_on_commit_callbacks(execute=True):
        r = owner.client.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert r.status_code in (200, 202), r.content
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLING  # committed
    (kept,) = OutboxTask.objects.all()
    assert (kept.task, kept.args) == (CANCEL_TASK, [job.pk])
    assert "onnection" in kept.last_error  # the broker's refusal is recorded

    assert send_outbox() == 0  # still down: kept, attempt counted
    assert OutboxTask.objects.get().attempts == 1

    private_broker.start()
    assert send_outbox() == 1
    assert not OutboxTask.objects.exists()
    assert (CANCEL_TASK, [job.pk]) in queued_tasks(private_broker)


def test_a_submission_while_the_broker_is_down_is_stored_and_answers_201(
        owner, funded_aws_cluster, submission, private_broker, django_capture_on_commit_callbacks):
    submission["spec"]["resources"]["nodes"] = 1  # within alpha's per-job cap of 8 GPUs: a job that can run
    private_broker.stop()
    with django_capture_on_commit_callbacks(execute=True):
        r = owner.client.post("/api/v1/jobs/", submission, format="json")
    assert r.status_code == 201, r.content
    assert Job.objects.get(pk=r.json()["id"]).state == JobState.QUEUED
