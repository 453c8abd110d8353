"""Query parameters and ids at the edges (huge, negative, malformed, impossible dates, unknown fields): never a
500, always the exact answer the API and the web UI give for them."""

from __future__ import annotations

import pytest

from tests.support.personas import signed_in

BIG = "9" * 25


@pytest.mark.parametrize("url,status", [
    (f"/api/v1/jobs/{BIG}/", 404),
    (f"/api/v1/jobs/{BIG}/cancel/", 404),
    (f"/api/v1/arrays/{BIG}/", 404),
    (f"/api/v1/arrays/{BIG}/cancel/", 404),
    (f"/api/v1/arrays/{BIG}/elements/", 404),
    ("/api/v1/arrays/abc/", 404),
    ("/api/v1/arrays/1%00/", 404),
    ("/api/v1/arrays/?team=alpha%00", 400),
    ("/api/v1/arrays/?state=BOGUS", 400),
    ("/api/v1/arrays/?created_after=2026-02-30T00:00:00Z", 400),
    ("/api/v1/arrays/?ordering=secret_field", 400),
    (f"/api/v1/arrays/?offset={BIG}", 200),
    ("/api/v1/jobs/-1/", 404),
    ("/api/v1/jobs/abc/", 404),
    ("/api/v1/jobs/1%00/", 404),
    ("/api/v1/teams/alpha%00/", 404),  # a NUL no text column can hold: no such team, not a database error
    ("/api/v1/jobs/?team=alpha%00", 400),
    (f"/api/v1/quotas/{BIG}/", 404),
    (f"/api/v1/budget-status/{BIG}/", 404),
    (f"/api/v1/reports/{BIG}/csv/", 404),
    ("/api/v1/jobs/?state=BOGUS", 400),
    ("/api/v1/jobs/?created_after=yesterday", 400),
    ("/api/v1/jobs/?created_after=2026-02-30T00:00:00Z", 400),
    ("/api/v1/jobs/?created_after=0001-01-01T00:00:00%2B05:30", 200),  # before datetime.min in UTC: all jobs
    ("/api/v1/jobs/?kind=batch", 400),
    (f"/api/v1/jobs/?array={BIG}", 400), ("/api/v1/jobs/?array=1.5", 400), ("/api/v1/jobs/?array=1", 200),
    ("/api/v1/jobs/?ordering=secret_field", 400),
    ("/api/v1/jobs/?limit=-1", 200),
    (f"/api/v1/jobs/?limit={BIG}", 200),
    (f"/api/v1/jobs/?offset={BIG}", 200),
    ("/api/v1/jobs/?offset=-5", 200),
    (f"/api/v1/quotas/?offset={BIG}", 200),
    (f"/api/v1/prices/?offset={BIG}", 200),
    ("/api/v1/quotas/?ordering=team__memberships__user__password", 200),
    ("/api/v1/prices/?provider=nope", 200),  # a filter that matches nothing
])
def test_api_ids_and_query_parameters_at_the_edges_get_their_exact_answer(owner, alpha_objects, url, status):
    response = owner.client.get(url) if "cancel" not in url else owner.client.post(url)
    assert response.status_code == status, (url, response.status_code)


@pytest.mark.parametrize("query", ["node=-1", "node=abc", f"node={BIG}", "tail=0", "tail=abc", f"tail={BIG}",
                                   "tail=100001", "node=1"])
def test_bad_log_parameters_get_400(owner, alpha_objects, query):
    job = alpha_objects["job"]
    response = owner.client.get(f"/api/v1/jobs/{job.pk}/logs/?{query}")
    assert response.status_code == 400, (query, response.status_code)


@pytest.mark.parametrize("url,status", [
    (f"/jobs/{BIG}/", 404), (f"/jobs/{BIG}/status/", 404), (f"/reports/{BIG}/", 404),
    (f"/teams/alpha/quotas/{BIG}/edit/", 404),
    # lists show what they can: the last page, the first page, the form's error, no row
    ("/jobs/?page=" + BIG, 200), ("/jobs/?page=-1", 200), ("/jobs/?created_after=2026-02-30T00:00:00Z", 200),
    ("/jobs/rows/?state=BOGUS", 200),
])
def test_web_ids_and_query_parameters_at_the_edges_get_their_exact_answer(owner, alpha_objects, url, status):
    assert signed_in(owner).get(url).status_code == status, url


def test_a_huge_page_limit_is_capped(owner, alpha_objects):
    response = owner.client.get(f"/api/v1/jobs/?limit={BIG}")
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1
    events = owner.client.get(f"/api/v1/jobs/{alpha_objects['job'].pk}/events/?limit={BIG}")
    assert events.status_code == 200
