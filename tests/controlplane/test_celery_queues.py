"""Every task the Celery app registers goes to one of the two queues by a route of its own, and every task of the
project has a soft and a hard time limit; the tasks that beat sends reach their queue on the real broker."""

from __future__ import annotations

import pytest
from django.conf import settings

from controlplane.celery import app
from jobs.scheduling.pacing import registered_task

QUEUES = {settings.CELERY_FAST_QUEUE, settings.CELERY_SLOW_QUEUE}


def registered() -> dict:
    """Every task of the app's registry, after autodiscovery of every installed app's ``tasks`` module."""
    app.autodiscover_tasks(force=True)
    return dict(app.tasks)


def project_tasks() -> dict:
    """The registered tasks defined in this project's modules (Celery's own, ``celery.*``, left out)."""
    return {name: task for name, task in registered().items() if not type(task).__module__.startswith("celery.")}


def explicit_queue(name: str) -> str | None:
    """The queue a route of ``CELERY_TASK_ROUTES`` names for ``name``; None when only the default queue would."""
    for route in app.amqp.routes:
        found = route(name)
        if found:
            return found["queue"]
    return None


def test_the_two_queues_are_declared_and_the_default_is_one_of_them():
    assert len(QUEUES) == 2
    assert set(app.amqp.queues) == QUEUES
    assert app.conf.task_default_queue in QUEUES


def test_the_registry_holds_the_project_tasks():
    names = set(project_tasks())
    assert {"jobs.tasks.reconcile_all", "jobs.tasks.dispatch_attempt", "costs.tasks.collect_utilization",
            "frontend.tasks.generate_reports"} <= names
    assert all(not name.startswith("celery.") for name in names)


@pytest.mark.parametrize("name", sorted(registered()))
def test_every_registered_task_has_a_route_to_one_of_the_queues(name):
    queue = explicit_queue(name)
    assert queue in QUEUES, f"{name} has no route in CELERY_TASK_ROUTES"
    assert app.amqp.router.route({}, name)["queue"].name == queue


@pytest.mark.parametrize("name", sorted(project_tasks()))
def test_every_project_task_has_a_soft_limit_below_its_hard_limit(name):
    task = app.tasks[name]
    assert task.soft_time_limit is not None and task.time_limit is not None, name
    assert 0 < task.soft_time_limit < task.time_limit, name


@pytest.mark.parametrize("name", sorted(n for n, t in project_tasks().items() if t.acks_late))
def test_an_acks_late_task_ends_before_the_broker_would_deliver_it_again(name):
    """Redis hands an unacknowledged message to another worker after the visibility timeout: a task still running
    then would run twice."""
    assert app.tasks[name].time_limit < settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]


def test_the_lifecycle_is_fast_and_the_accounting_slow():
    fast, slow = settings.CELERY_FAST_QUEUE, settings.CELERY_SLOW_QUEUE
    for name in ("jobs.tasks.schedule_pending", "jobs.tasks.dispatch_attempt", "jobs.tasks.reconcile_all",
                 "jobs.tasks.reconcile_cluster", "jobs.tasks.cancel_job_objects", "jobs.tasks.delete_attempt_objects"):
        assert explicit_queue(name) == fast, name
    for name in ("costs.tasks.accrue_running_costs", "costs.tasks.collect_utilization", "costs.tasks.check_ledger",
                 "frontend.tasks.generate_reports", "costs.tasks.check_budgets"):
        assert explicit_queue(name) == slow, name


def test_the_reconcile_stops_well_before_minutes_and_a_report_may_take_them():
    assert app.tasks["jobs.tasks.reconcile_all"].time_limit <= 90
    assert app.tasks["jobs.tasks.reconcile_cluster"].time_limit <= 90
    assert app.tasks["frontend.tasks.generate_reports"].soft_time_limit >= 120


@pytest.mark.django_db
def test_beats_tasks_land_in_their_queue_on_the_broker(redis_broker):
    """Publish every task of the beat schedule once; each message is in the Redis list of its route's queue."""
    from jobs.scheduling.pacing import schedule_flag_client

    client = schedule_flag_client()
    client.delete(*QUEUES)
    expected = {queue: 0 for queue in QUEUES}
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        registered_task(entry["task"]).apply_async()
        expected[explicit_queue(entry["task"])] += 1
    assert {queue: client.llen(queue) for queue in QUEUES} == expected
    assert all(expected.values())
