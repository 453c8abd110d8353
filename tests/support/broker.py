"""The Redis broker that the on-commit tasks (scheduling passes, dispatch) of a test go to, and real Celery workers
on it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

from controlplane.celery import app
from jobs.scheduling import pacing
from tests.support.racing import REPO, database_url

#: The queues by concern (``CELERY_TASK_ROUTES``): a worker of a test consumes the queues of the tasks it exercises.
FAST, SLOW = settings.CELERY_FAST_QUEUE, settings.CELERY_SLOW_QUEUE

TEST_BROKER_URL = "redis://127.0.0.1:6379/15"  # as in the Makefile's `make test`


@pytest.fixture
def redis_broker():
    """Send the on-commit tasks (schedule, dispatch) to Redis db 15, never to the filesystem queue under var/.

    Under ``make test`` CELERY_BROKER_URL already is that; otherwise the app is pointed there before it opens
    its first connection. Yields the broker URL; the queue is purged afterwards.
    """
    url, options = app.conf.broker_url, app.conf.broker_transport_options
    if not str(url).startswith("redis://"):
        app.conf.broker_url, app.conf.broker_transport_options = TEST_BROKER_URL, {}
    with app.pool.acquire(block=True) as conn:
        assert conn.transport.driver_type == "redis", (
            "the Celery app already holds connections to a non-Redis broker; run with CELERY_BROKER_URL=" + TEST_BROKER_URL)

    def forget_passes():  # no pacing pause left over from another test's pass, no flag either
        client = pacing.schedule_flag_client()
        client.delete(pacing.SCHEDULE_LAST_PASS_KEY, pacing.SCHEDULE_PENDING_KEY)

    forget_passes()
    yield app.conf.broker_url
    pacing.SCHEDULE_NOTIFIER.flush()  # publishes of this test's submissions land before the purge, not in the next test
    forget_passes()
    app.control.purge()
    app.conf.broker_url, app.conf.broker_transport_options = url, options


def start_worker(broker_url: str, queues: list[str], *args: str, env: dict | None = None,
                 stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """A ``celery worker`` process (its own session) consuming ``queues`` (``-Q``) on this test's database and on
    ``broker_url``, with the worker options ``args`` and the extra environment ``env``; its output to ``stdout``."""
    environment = {**os.environ, "DATABASE_URL": database_url(), "CELERY_BROKER_URL": broker_url,
                   "DJANGO_SETTINGS_MODULE": "controlplane.settings", "CONN_MAX_AGE": "0", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-Q", ",".join(queues),
                             "--without-gossip", "--without-mingle", *args],
                            cwd=REPO, env=environment, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)
