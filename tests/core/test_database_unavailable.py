"""Database trouble answers 503 with Retry-After (JSON for the API, a styled page for the UI), never a 500; a kept
connection survives a PostgreSQL restart.

The app is pointed at a private PostgreSQL (``tests/support/postgres.py``) that the tests stop or fill up, so the
errors are the real ones: connection refused, and ``sorry, too many clients already``.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db.backends.postgresql.base import DatabaseWrapper
from django.test import Client

from tests.support.postgres import app_database, private_postgres


@pytest.fixture(scope="module")
def server():
    with private_postgres(max_connections=3) as pg:
        yield pg


def assert_api_503(response):
    assert response.status_code == 503, response.content[:300]
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == str(settings.UNAVAILABLE_RETRY_AFTER_SECONDS)
    body = response.json()
    assert body["dependency"] == "database"
    assert body["retry_after_seconds"] == settings.UNAVAILABLE_RETRY_AFTER_SECONDS
    assert "temporarily unavailable" in body["detail"]


def test_api_answers_503_json_with_retry_after_while_the_database_is_down(server, django_db_blocker):
    server.stop()
    try:
        with app_database(django_db_blocker, server.settings_dict()):
            client = Client(raise_request_exception=False)
            assert_api_503(client.get("/api/v1/jobs/", HTTP_AUTHORIZATION="Token abc"))
            assert_api_503(client.post("/api/v1/jobs/", data={"team": "alpha"}, content_type="application/json",
                                       HTTP_AUTHORIZATION="Token abc"))
    finally:
        server.start()


def test_ui_answers_a_styled_503_page_while_the_database_is_down(server, django_db_blocker):
    server.stop()
    try:
        with app_database(django_db_blocker, server.settings_dict()):
            client = Client(raise_request_exception=False)
            client.cookies["sessionid"] = "a-session-that-must-be-read-from-the-database"
            r = client.get("/jobs/")
    finally:
        server.start()
    assert r.status_code == 503
    assert r["Content-Type"].startswith("text/html")
    assert r["Retry-After"] == str(settings.UNAVAILABLE_RETRY_AFTER_SECONDS)
    page = r.content.decode()
    assert "<h1>Temporarily unavailable</h1>" in page and "frontend/app.css" in page
    assert "Traceback" not in page and "OperationalError" not in page


def test_api_answers_503_when_every_connection_slot_is_taken(server, django_db_blocker):
    held = [server.connect() for _ in range(server.max_connections)]
    try:
        with pytest.raises(Exception, match="too many clients"):
            server.connect()  # the slots really are full
        with app_database(django_db_blocker, server.settings_dict()):
            assert_api_503(Client(raise_request_exception=False).get("/api/v1/teams/",
                                                                     HTTP_AUTHORIZATION="Token abc"))
    finally:
        for c in held:
            c.close()


def kept_connection(server, **overrides) -> DatabaseWrapper:
    """A connection configured as settings.py configures the default one, on the private server."""
    config = {**settings.DATABASES["default"], **server.settings_dict(), "TEST": {}, **overrides}
    return DatabaseWrapper(config, alias="restart-check")


def query_after_a_restart(server, wrapper: DatabaseWrapper) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT 1")
    server.restart()
    wrapper.close_if_unusable_or_obsolete()  # what Django does when a request (or Celery task) starts
    try:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 2")
            return cursor.fetchone()[0]
    finally:
        wrapper.close()


def test_a_kept_connection_is_replaced_after_a_postgresql_restart(server, django_db_blocker):
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] > 0  # connections are kept between requests
    with django_db_blocker.unblock():
        assert query_after_a_restart(server, kept_connection(server)) == 2
        # Without the health check the dead connection is used, and the request would fail.
        with pytest.raises((OperationalError, InterfaceError)):  # the server closed the connection
            query_after_a_restart(server, kept_connection(server, CONN_HEALTH_CHECKS=False))
