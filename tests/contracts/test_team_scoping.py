"""Team scoping of the team-scoped endpoints, tried by the personas: members see their team's objects, an
outsider gets the same 404 as for a missing object, staff see every team, and no token or a bad one is a 401."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs.models import Job


def team_endpoints(objects) -> dict[str, str]:
    """Detail URLs of one team's objects, one per team-scoped endpoint."""
    job = objects["job"].pk
    return {
        "job": f"/api/v1/jobs/{job}/",
        "job events": f"/api/v1/jobs/{job}/events/",
        "job attempts": f"/api/v1/jobs/{job}/attempts/",
        "job logs": f"/api/v1/jobs/{job}/logs/",
        "quota": f"/api/v1/quotas/{objects['quota'].pk}/",
        "budget": f"/api/v1/budgets/{objects['budget'].pk}/",
        "team": f"/api/v1/teams/{objects['job'].team.slug}/",
    }


LISTS = {
    "/api/v1/jobs/": lambda r: {j["team"] for j in r["results"]},
    "/api/v1/quotas/": lambda r: {q["team"] for q in r["results"]},
    "/api/v1/budgets/": lambda r: {b["team"] for b in r["results"]},
    "/api/v1/teams/": lambda r: {t["slug"] for t in r["results"]},
}


@pytest.mark.parametrize("persona_name", ["owner", "teammate"])
def test_team_members_see_their_teams_objects(request, persona_name, alpha_objects, beta_objects):
    persona = request.getfixturevalue(persona_name)
    for name, url in team_endpoints(alpha_objects).items():
        assert persona.client.get(url).status_code == 200, name
    for url, teams_in in LISTS.items():
        assert teams_in(persona.client.get(url).json()) == {"alpha"}, url


def test_an_outsider_gets_404_for_every_object_of_another_team(outsider, alpha_objects, beta_objects):
    for name, url in team_endpoints(alpha_objects).items():
        r = outsider.client.get(url)
        assert r.status_code == 404, name
    assert outsider.client.post(f"/api/v1/jobs/{alpha_objects['job'].pk}/cancel/").status_code == 404
    assert Job.objects.get(pk=alpha_objects["job"].pk).state == "QUEUED"
    for url, teams_in in LISTS.items():
        assert teams_in(outsider.client.get(url).json()) == {"beta"}, url
    for name, url in team_endpoints(beta_objects).items():
        assert outsider.client.get(url).status_code == 200, name


def test_a_404_for_another_team_looks_like_a_missing_object(outsider, alpha_objects):
    other = outsider.client.get(f"/api/v1/jobs/{alpha_objects['job'].pk}/").json()
    missing = outsider.client.get("/api/v1/jobs/999999999/").json()
    assert other == missing


def test_staff_see_every_team(staff, alpha_objects, beta_objects):
    for objects in (alpha_objects, beta_objects):
        for name, url in team_endpoints(objects).items():
            assert staff.client.get(url).status_code == 200, name
    for url, teams_in in LISTS.items():
        assert teams_in(staff.client.get(url).json()) == {"alpha", "beta"}, url


ALL_ENDPOINTS = [
    "/api/v1/", "/api/v1/teams/", "/api/v1/accelerators/", "/api/v1/clusters/", "/api/v1/node-pools/",
    "/api/v1/prices/", "/api/v1/quotas/", "/api/v1/budgets/", "/api/v1/jobs/", "/api/v1/costs/",
]


def test_unauthenticated_requests_get_401(alpha_objects):
    client = APIClient()
    urls = ALL_ENDPOINTS + list(team_endpoints(alpha_objects).values())
    for url in urls:
        r = client.get(url)
        assert r.status_code == 401, url
        assert r["WWW-Authenticate"] == "Token"
    assert client.post("/api/v1/jobs/", {}, format="json").status_code == 401


def test_a_bad_or_expired_token_gets_401(owner):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-key")
    assert client.get("/api/v1/jobs/").status_code == 401
    token = owner.user.api_tokens.get()
    token.expires_at = token.created_at
    token.save(update_fields=["expires_at"])
    assert owner.client.get("/api/v1/jobs/").status_code == 401


def test_every_list_endpoint_answers_each_persona(owner, teammate, outsider, alpha_objects, beta_objects):
    for persona in (owner, teammate, outsider):
        for url in ALL_ENDPOINTS:
            assert persona.client.get(url).status_code == 200, (persona.user.username, url)
