"""Authentication of the API: malformed ``Authorization`` headers, expired tokens and inactive users get 401;
session writes without a CSRF token are refused (403) and change nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from quotas.models import ApiToken, Quota


def raw_client(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


@pytest.mark.parametrize("header", [
    "Token", "Token ", "Token a b", "token x", "Bearer abc", "Bearer", "Bearer a b", "Basic Zm9vOmJhcg==", "Token \x00",
    "Token " + "x" * 10_000, "Token caf\u00e9",
])
def test_malformed_authorization_is_401(owner, header):
    response = raw_client(header).get("/api/v1/jobs/")
    assert response.status_code == 401, (header[:20], response.status_code)


def test_a_token_is_accepted_under_the_bearer_scheme_as_under_token(owner):
    for scheme in ("Token", "Bearer", "bearer"):
        answer = raw_client(f"{scheme} {owner.key}").get("/api/v1/jobs/")
        assert answer.status_code == 200, (scheme, answer.status_code)
    assert raw_client("Bearer " + "0" * len(owner.key)).get("/api/v1/jobs/").status_code == 401


def test_an_expired_token_or_an_inactive_user_gets_401(owner, teams):
    token, key = ApiToken.issue(owner.user, "short", expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert raw_client(f"Token {key}").get("/api/v1/jobs/").status_code == 401
    user = get_user_model().objects.create_user("gone", password="x", is_active=False)
    _, key = ApiToken.issue(user, "t")
    assert raw_client(f"Token {key}").get("/api/v1/jobs/").status_code == 401
    owner.user.is_active = False
    owner.user.save()
    assert owner.client.get("/api/v1/jobs/").status_code == 401


def test_session_post_without_csrf_is_refused(owner, alpha_objects, submission):
    api = APIClient(enforce_csrf_checks=True)
    api.force_login(owner.user)
    assert api.get("/api/v1/jobs/").status_code == 200
    job = alpha_objects["job"]
    assert api.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert api.post("/api/v1/jobs/", submission, format="json").status_code == 403
    assert api.patch(f"/api/v1/quotas/{alpha_objects['quota'].pk}/", {"nominal_gpus": 1}, format="json").status_code == 403
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner.user)
    assert browser.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == "QUEUED"
    assert Quota.objects.get(pk=alpha_objects["quota"].pk).nominal_gpus == 16
