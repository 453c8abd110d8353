"""The Redis broker that the on-commit tasks (scheduling passes, dispatch) of a test go to."""

from __future__ import annotations

import pytest

from controlplane.celery import app
from jobs.scheduling import pacing

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
