"""Coalesced publishing of scheduling passes on a Redis broker (``jobs.tasks.publish_schedule``).

A submission publishes a pass only when it sets the flag ``controlplane:schedule-pending``
(SET NX EX 30); the pass clears the flag before it reads the queue, so a job whose
submission found the flag set is still read by that pass.
"""

import pytest

from jobs import tasks
from jobs.lifecycle import submit_job
from jobs.models import Job, JobState
from jobs.scheduler import schedule_coalesced
from tests.conftest import make_persona

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(redis_broker):
    """The test broker's Redis, flag cleared; yields a function counting messages in the default queue."""
    client = tasks.schedule_flag_client()
    assert client is not None
    client.delete(tasks.SCHEDULE_PENDING_KEY)
    yield lambda: client.llen("celery")
    client.delete(tasks.SCHEDULE_PENDING_KEY)


@pytest.fixture
def submit(teams, h100, quota_factory, cluster_factory, django_capture_on_commit_callbacks):
    alpha = teams[0]
    user = make_persona("owner", alpha, "admin").user
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
            return submit_job(team=alpha, submitter=user, name=f"job-{next(counter)}", kind="training",
                              spec=spec, resources=resources)
    return make


def test_two_submissions_in_a_row_publish_one_pass_and_the_pass_reopens_publishing(broker, submit):
    before = broker()
    submit()
    submit()
    assert broker() == before + 1  # the second found the flag set
    assert tasks.schedule_flag_client().ttl(tasks.SCHEDULE_PENDING_KEY) > 0  # bounded by its expiry

    schedule_coalesced()  # what the published task runs: clears the flag first

    assert not tasks.schedule_flag_client().exists(tasks.SCHEDULE_PENDING_KEY)
    submit()
    assert broker() == before + 2


def test_a_job_submitted_while_the_flag_is_set_is_admitted_by_the_pending_pass(broker, submit):
    first = submit()
    before = broker()
    second = submit()  # flag set by the first: no publish of its own
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
    assert tasks.schedule_flag_client() is None
    assert tasks.publish_schedule() and tasks.publish_schedule()
    assert len(published) == 2
