"""Two web servers sharing Redis as their cache (``CACHE_URL``, as several web pods do) count one rate limit: failed
token checks spread over both reach the rate together, and the next one on either answers 429."""

from __future__ import annotations

import contextlib

import pytest

from tests.support.web_server import connect, exchange, web_server

TEAMS = "/api/v1/teams/?limit=1"
WRONG = {"Authorization": "Token " + "x" * 43}


@pytest.fixture
def two_servers(transactional_db, owner, private_redis):
    env = {"CACHE_URL": private_redis.url}
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(web_server(env)) for _ in range(2)], owner


def test_failed_token_checks_on_two_servers_count_against_one_rate(two_servers):
    ports, owner = two_servers
    with connect(ports[0]) as first, connect(ports[1]) as second:
        for i in range(30):  # the default rate: 30 a minute per client address, 15 failures on each server
            assert exchange(first if i % 2 else second, "GET", TEAMS, headers=WRONG)[0] == 401
        for sock in (first, second):
            status, headers, _ = exchange(sock, "GET", TEAMS, headers={"Authorization": f"Token {owner.key}"})
            assert status == 429
            assert 1 <= int(headers["retry-after"]) <= 60
