"""Refused bodies never break the connection they came on: on the real web server (gunicorn gthread as the
Kubernetes manifest runs it), a body refused at a parser's cap leaves the kept-alive connection usable for the
next request, and one over the request body limit is answered 413 with ``Connection: close`` and the connection
then ends cleanly (never keep-alive announced and the connection dropped)."""

from __future__ import annotations

import http.client

import pytest
from django.conf import settings
from django.test import Client

from core.limits import yaml_max_bytes
from tests.support.web_server import closed_by_server, connect, exchange, web_server

YAML = {"Content-Type": "application/yaml"}


@pytest.fixture
def served(transactional_db, owner):
    """The web server's port and alpha's admin (token) in committed rows."""
    with web_server() as port:
        yield port, owner


def test_a_body_refused_at_the_yaml_cap_leaves_the_kept_alive_connection_usable(served):
    port, owner = served
    body = b"team: alpha\n" + b"#" * (3 * yaml_max_bytes())  # over the YAML cap, under the request body limit
    assert len(body) < settings.REQUEST_BODY_MAX_BYTES
    with connect(port) as sock:
        status, headers, answer = exchange(
            sock, "POST", "/api/v1/jobs/", body, {**YAML, "Authorization": f"Token {owner.key}"}
        )
        assert status == 400 and b"YAML body over" in answer
        assert headers["connection"] == "keep-alive"
        status, _, answer = exchange(
            sock, "GET", "/api/v1/teams/?limit=1", headers={"Authorization": f"Token {owner.key}"}
        )
        assert status == 200 and b'"alpha"' in answer  # the same connection answered the next request


def test_a_body_refused_before_authentication_leaves_the_connection_usable(served):
    port, _ = served
    with connect(port) as sock:
        status, headers, _ = exchange(
            sock, "POST", "/api/v1/jobs/", b"x" * 900_000, {**YAML, "Authorization": "Token not-a-key"}
        )
        assert status == 401 and headers["connection"] == "keep-alive"
        assert exchange(sock, "GET", "/healthz")[0] == 200


def test_a_body_over_the_limit_is_refused_unread_and_its_connection_closed_cleanly(served):
    port, owner = served
    declared = 2 * 1024 * 1024
    with connect(port) as sock:
        status, headers, answer = exchange(
            sock,
            "POST",
            "/api/v1/jobs/",
            b"#" * 65536,
            {**YAML, "Authorization": f"Token {owner.key}"},
            declared_length=declared,
        )
        assert status == 413
        assert headers["connection"] == "close"  # said before the server closes, not after
        assert f"Request body of {declared} bytes".encode() in answer
        assert closed_by_server(sock)


def test_a_form_over_the_limit_is_refused_with_413_and_closes(served):
    port, _ = served
    with connect(port) as sock:
        status, headers, answer = exchange(
            sock,
            "POST",
            "/login/",
            b"username=a&password=" + b"x" * 1_500_000,
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert status == 413 and headers["connection"] == "close"
        assert len(answer) < 200  # the reason, never the body
        assert closed_by_server(sock)


def test_a_chunked_body_which_django_does_not_read_closes_its_connection(served):
    port, _ = served
    with connect(port) as sock:
        sock.sendall(
            b"POST /api/v1/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/yaml\r\n\r\n5\r\nteam:\r\n0\r\n\r\n"
        )
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        response.read()
        assert response.getheader("Connection") == "close"
        assert closed_by_server(sock)


@pytest.mark.django_db
def test_the_limit_is_checked_before_any_view_reads_the_body():
    client = Client()
    response = client.generic(
        "POST",
        "/login/",
        b"x" * 16,
        content_type="application/x-www-form-urlencoded",
        CONTENT_LENGTH=str(settings.REQUEST_BODY_MAX_BYTES + 1),
    )
    assert response.status_code == 413
    assert response.content.decode() == (
        f"Request body of {settings.REQUEST_BODY_MAX_BYTES + 1} bytes is over "
        f"the limit of {settings.REQUEST_BODY_MAX_BYTES} bytes."
    )
