"""Database connections per process are bounded by its threads, as platform/README.md ("Database connections")
counts them against PostgreSQL's ``max_connections``: a burst of requests served by M threads never holds more
than M connections, kept ones are reused, and ``CONN_MAX_AGE=0`` leaves none open after the burst.

Requests are served by the WSGI application as gunicorn's threads serve them (``application(environ,
start_response)``, then the response's ``close()``: Django's ``request_started`` / ``request_finished`` handling of
kept connections; its test client skips that) to ``/readyz``, whose database check runs ``SELECT 1`` on the
default connection. The connections are counted by a private PostgreSQL itself (``pg_stat_activity``).
"""

from __future__ import annotations

import queue
import threading
import time
from wsgiref.util import setup_testing_defaults

import pytest
from django.core.wsgi import get_wsgi_application
from django.db import connection, connections

from tests.support.postgres import app_database, private_postgres

THREADS = 3
REQUESTS = 60
APP_NAME = "connection-bound-check"


@pytest.fixture(scope="module")
def server():
    with private_postgres(max_connections=20) as pg:
        yield pg


def app_on(server, django_db_blocker, conn_max_age: int):
    """The default database settings (shared by every thread's connection) pointed at ``server``, tagged with
    ``APP_NAME``, with ``conn_max_age``; restored afterwards."""
    options = {**connection.settings_dict.get("OPTIONS", {}), "application_name": APP_NAME}
    return app_database(django_db_blocker, {**server.settings_dict(), "CONN_MAX_AGE": conn_max_age,
                                            "OPTIONS": options})


def app_connections(admin) -> int:
    (n,) = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]).fetchone()
    return n


def serve_one(application, path: str) -> int:
    """One GET of ``path`` through the WSGI ``application`` as a WSGI server does it; the status code."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "HTTP_HOST": "testserver"}
    setup_testing_defaults(environ)
    statuses = []
    response = application(environ, lambda status, headers, exc_info=None: statuses.append(int(status.split()[0])))
    try:
        for _ in response:
            pass
    finally:
        response.close()  # request_finished: where a connection past CONN_MAX_AGE is closed
    return statuses[0]


def burst(server, settle: float = 0.0) -> tuple[int, int, list[int]]:
    """``REQUESTS`` requests served by ``THREADS`` threads; returns (the most connections seen open during the burst,
    those open after it with the threads still alive, each request's status). ``settle``: seconds to wait, at most,
    for the count after the burst to reach 0 (a backend exits just after its client closes)."""
    work: queue.Queue = queue.Queue()
    for _ in range(REQUESTS):
        work.put("/readyz")
    statuses: list[int] = []
    done, release = threading.Barrier(THREADS + 1), threading.Event()

    application = get_wsgi_application()

    def serve():
        while True:
            try:
                path = work.get_nowait()
            except queue.Empty:
                break
            statuses.append(serve_one(application, path))
        done.wait()
        release.wait()  # alive, like an idle gunicorn thread, until counted
        connections.close_all()

    threads = [threading.Thread(target=serve) for _ in range(THREADS)]
    peak = 0
    with server.connect() as admin:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) and done.n_waiting < THREADS:
            peak = max(peak, app_connections(admin))
            time.sleep(0.005)
        done.wait()
        deadline = time.monotonic() + settle
        while (after := app_connections(admin)) and time.monotonic() < deadline:
            time.sleep(0.1)
        release.set()
        for t in threads:
            t.join(timeout=30)
    return peak, after, statuses


def test_a_burst_holds_at_most_one_connection_per_thread_and_reuses_it(server, django_db_blocker):
    with app_on(server, django_db_blocker, conn_max_age=60):
        peak, after, statuses = burst(server)
    assert len(statuses) == REQUESTS and set(statuses) <= {200, 503}  # 503 only when the broker check fails
    assert 1 <= peak <= THREADS
    assert 1 <= after <= THREADS  # kept for the next request of each thread, never more than one per thread
    assert closed_within(server, 30)  # each thread's connection closed with it


def closed_within(server, seconds: float) -> bool:
    """Whether every connection of the app is gone within ``seconds`` (a backend exits just after its client)."""
    deadline = time.monotonic() + seconds
    with server.connect() as admin:
        while app_connections(admin):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    return True


def test_conn_max_age_zero_leaves_no_connection_open_after_the_burst(server, django_db_blocker):
    with app_on(server, django_db_blocker, conn_max_age=0):
        peak, after, statuses = burst(server, settle=10)
    assert len(statuses) == REQUESTS
    assert peak <= THREADS
    assert after == 0
