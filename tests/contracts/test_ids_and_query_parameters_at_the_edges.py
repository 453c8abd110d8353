"""Query parameters and ids at the edges: never a 500."""

from __future__ import annotations

import pytest
from django.test import Client

BIG = "9" * 25


@pytest.mark.parametrize("url,ok", [
    (f"/api/v1/jobs/{BIG}/", (404,)),
    (f"/api/v1/jobs/{BIG}/cancel/", (404,)),
    ("/api/v1/jobs/-1/", (404,)),
    ("/api/v1/jobs/abc/", (404,)),
    (f"/api/v1/quotas/{BIG}/", (404,)),
    (f"/api/v1/budget-status/{BIG}/", (404,)),
    (f"/api/v1/reports/{BIG}/csv/", (404,)),
    ("/api/v1/jobs/?state=BOGUS", (400,)),
    ("/api/v1/jobs/?created_after=yesterday", (400,)),
    ("/api/v1/jobs/?created_after=2026-02-30T00:00:00Z", (400,)),
    ("/api/v1/jobs/?created_after=0001-01-01T00:00:00%2B05:30", (200, 400)),
    ("/api/v1/jobs/?kind=batch", (400,)),
    ("/api/v1/jobs/?ordering=secret_field", (200, 400)),
    ("/api/v1/jobs/?limit=-1", (200,)),
    (f"/api/v1/jobs/?limit={BIG}", (200,)),
    (f"/api/v1/jobs/?offset={BIG}", (200,)),
    ("/api/v1/jobs/?offset=-5", (200,)),
    (f"/api/v1/quotas/?offset={BIG}", (200,)),
    (f"/api/v1/prices/?offset={BIG}", (200,)),
    ("/api/v1/quotas/?ordering=team__memberships__user__password", (200,)),
    ("/api/v1/prices/?provider=nope", (200, 400)),
])
def test_api_edges(owner, alpha_objects, url, ok):
    response = owner.client.get(url) if "cancel" not in url else owner.client.post(url)
    assert response.status_code in ok, (url, response.status_code)


@pytest.mark.parametrize("query", ["node=-1", "node=abc", f"node={BIG}", "tail=0", "tail=abc", f"tail={BIG}",
                                   "tail=100001", "node=1"])
def test_logs_params(owner, alpha_objects, query):
    job = alpha_objects["job"]
    response = owner.client.get(f"/api/v1/jobs/{job.pk}/logs/?{query}")
    assert response.status_code == 400, (query, response.status_code)


@pytest.mark.parametrize("url", [f"/jobs/{BIG}/", f"/jobs/{BIG}/status/", f"/reports/{BIG}/",
                                 f"/teams/alpha/quotas/{BIG}/edit/", "/jobs/?page=" + BIG, "/jobs/?page=-1",
                                 "/jobs/?created_after=2026-02-30T00:00:00Z", "/jobs/rows/?state=BOGUS"])
def test_web_edges(owner, alpha_objects, url):
    client = Client()
    client.force_login(owner.user)
    assert client.get(url).status_code in (200, 404), url


def test_limit_is_capped(owner, alpha_objects):
    response = owner.client.get(f"/api/v1/jobs/?limit={BIG}")
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1
    events = owner.client.get(f"/api/v1/jobs/{alpha_objects['job'].pk}/events/?limit={BIG}")
    assert events.status_code == 200
