"""Sign-in and token checks are rate limited at their default rates: failed token checks per client address
(30 a minute), failed sign-ins per address (50 an hour) and per username (10 an hour). Past a rate the next
attempt answers 429 with Retry-After before any credential is checked; other addresses and usernames are
untouched."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

TEAMS = "/api/v1/teams/"
WRONG_KEY = "x" * 43


def api_client(address: str, key: str, scheme: str = "Token", **headers) -> APIClient:
    client = APIClient(REMOTE_ADDR=address, **headers)
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}")
    return client


def retry_after(response) -> int:
    return int(response["Retry-After"])


def test_failed_token_checks_are_limited_per_client_address(owner):
    guesser = api_client("203.0.113.7", WRONG_KEY)
    for _ in range(30):
        assert guesser.get(TEAMS).status_code == 401
    refused = guesser.get(TEAMS)
    assert refused.status_code == 429
    assert 1 <= retry_after(refused) <= 60
    # From that address even a valid key, in either scheme, waits: guessing is bounded whatever is tried next.
    assert api_client("203.0.113.7", owner.key).get(TEAMS).status_code == 429
    assert api_client("203.0.113.7", owner.key, "Bearer").get(TEAMS).status_code == 429
    assert api_client("198.51.100.2", owner.key).get(TEAMS).status_code == 200


def test_a_forwarded_for_header_does_not_move_the_count_without_trusted_proxies(owner):
    for i in range(30):
        client = api_client("203.0.113.8", WRONG_KEY, HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
        assert client.get(TEAMS).status_code == 401
    assert api_client("203.0.113.8", WRONG_KEY, HTTP_X_FORWARDED_FOR="192.0.2.99").get(TEAMS).status_code == 429


def test_behind_one_trusted_proxy_the_forwarded_address_is_counted(owner, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    for _ in range(30):
        client = api_client("10.0.0.1", WRONG_KEY, HTTP_X_FORWARDED_FOR="203.0.113.9")
        assert client.get(TEAMS).status_code == 401
    assert api_client("10.0.0.1", WRONG_KEY, HTTP_X_FORWARDED_FOR="203.0.113.9").get(TEAMS).status_code == 429
    # Another client behind the same proxy keeps its own count.
    assert api_client("10.0.0.1", owner.key, HTTP_X_FORWARDED_FOR="203.0.113.10").get(TEAMS).status_code == 200


def sign_in(address: str, username: str, password: str, path: str = "/login/"):
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


def test_failed_sign_ins_are_limited_per_username(owner, teammate):
    for i in range(10):
        assert sign_in(f"192.0.2.{i}", "owner", "wrong").status_code == 200  # the form again, with its error
    refused = sign_in("192.0.2.200", "Owner", "pw-owner")  # the right password, another address, any case
    assert refused.status_code == 429
    assert 3500 <= retry_after(refused) <= 3600
    assert b"Too many sign-in attempts" in refused.content
    assert sign_in("192.0.2.200", "teammate", "pw-teammate").status_code == 302  # another account signs in


def test_failed_sign_ins_are_limited_per_address(owner):
    for i in range(50):
        assert sign_in("192.0.2.50", f"nobody{i}", "wrong").status_code == 200
    assert sign_in("192.0.2.50", "owner", "pw-owner").status_code == 429
    assert sign_in("192.0.2.51", "owner", "pw-owner").status_code == 302


def test_the_admin_sign_in_counts_and_is_refused_alike(staff):
    for i in range(10):
        assert sign_in(f"192.0.2.{i}", "staff", "wrong", "/admin/login/").status_code == 200
    assert sign_in("192.0.2.100", "staff", "pw-staff", "/admin/login/").status_code == 429
    assert sign_in("192.0.2.100", "staff", "pw-staff").status_code == 429


@pytest.mark.parametrize("value", ["", "off", "None"])
def test_a_rate_set_off_is_no_limit(value):
    from core.limits import rate_or_none

    assert rate_or_none(value) is None


@pytest.mark.parametrize("value", ["30", "0/min", "ten/min", "30/week"])
def test_a_mistyped_rate_stops_the_settings(value):
    from core.limits import rate_or_none

    with pytest.raises(ValueError, match="N/s, N/min, N/h or N/day"):
        rate_or_none(value)
