"""Every route of the ``/api/v1/`` router, tried by every persona, answers what the API contract says.

The routes come from the router (``routes.py``): every list, detail and extra action, every HTTP method it maps.
Team alpha's objects (or the platform's) stand behind the detail routes. The contract (docs/design.md, Interfaces):

- without credentials, every route is a 401 asking for a token;
- the owner, the teammate, the viewer and staff read everything of alpha's and the platform's;
- an outsider (beta's admin) gets exactly 404 for alpha's objects, reads or writes, the same 404 as for an object
  that does not exist, and reads the platform-wide objects;
- a viewer writes nothing: 403 on every write to alpha's objects; staff-only writes are a 403 for any other user
  before any lookup (so for the outsider too, whatever the team), and so is a quota or budget created by anyone
  but staff; a job (or a job array) submitted for a team the user may not submit to is refused on its ``team`` field (400), as a
  change request for a team the user is not in;
- quotas, budgets and the platform's objects are staff's to write (ADR 0029): alpha's admin and member get 403
  on every write to them too, and change nothing;
- a team's notification subscriptions are its admins' and staff's to write: a viewer gets 403, the outsider's
  create for alpha is refused on its ``team`` field (400);
- a report is built on demand by any member of its team, a viewer too (what it shows, ``costs/`` shows them);
  the outsider's request for alpha is refused on its ``team`` field (400).
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from .routes import (
    AGGREGATES,
    MEMBER_BUILDS,
    MISSING,
    PLATFORM_WIDE,
    ROUTES,
    STAFF_WRITES,
    STAFF_WRITES_OF_TEAM_OBJECTS,
    TEAM_ADMIN_REQUESTS,
    TEAM_ADMIN_WRITES,
    TEAM_SCOPED,
    VALID_BODIES,
    world,
)

READS = [r for r in ROUTES if not r.writes]
#: Where any member submits for a team: a job, an array of jobs.
SUBMISSIONS = {"jobs", "arrays"}
WRITES = [r for r in ROUTES if r.writes]


@pytest.fixture
def lookups(teams, owner, teammate, outsider, aws_cluster, alpha_objects, beta_objects, h100, redis_broker):
    return world(teams, owner, teammate, outsider, aws_cluster, alpha_objects, beta_objects, h100)


@pytest.fixture
def personas(owner, teammate, viewer, outsider, staff):
    return {"anonymous": APIClient(), "owner": owner.client, "teammate": teammate.client, "viewer": viewer.client,
            "outsider": outsider.client, "staff": staff.client}


def call(client, route, lookup, body=None):
    url = route.url(lookup) if route.detail else route.template
    return getattr(client, route.method)(url, body, format="json") if body is not None else \
        getattr(client, route.method)(url)


def body_for(route):
    make = VALID_BODIES.get((route.prefix, route.action))
    return make() if make is not None else None


def expected_read(route, persona: str) -> int:
    if persona == "anonymous":
        return 401
    if persona == "outsider" and route.detail and route.prefix in TEAM_SCOPED:
        return 404
    return 200


def expected_write(route, persona: str) -> int:
    if persona == "anonymous":
        return 401
    if route.prefix in STAFF_WRITES:
        return 403
    if route.detail:
        return 404 if persona == "outsider" else 403
    if route.prefix in MEMBER_BUILDS:
        return 400 if persona == "outsider" else 201
    if route.prefix in SUBMISSIONS:
        return 400  # the team is a field of the submission: refused on it, like an unknown team
    if route.prefix in STAFF_WRITES_OF_TEAM_OBJECTS:
        return 403
    if route.prefix in TEAM_ADMIN_REQUESTS | TEAM_ADMIN_WRITES:
        return 400 if persona == "outsider" else 403  # the outsider's body names a team it is not in
    raise AssertionError(f"no contract for {route.id}")


def test_every_route_is_classified_and_has_a_sample(lookups):
    prefixes = {r.prefix for r in ROUTES}
    assert prefixes == TEAM_SCOPED | PLATFORM_WIDE | AGGREGATES, prefixes ^ (TEAM_SCOPED | PLATFORM_WIDE | AGGREGATES)
    assert not (TEAM_SCOPED & PLATFORM_WIDE or TEAM_SCOPED & AGGREGATES or PLATFORM_WIDE & AGGREGATES)
    assert {r.prefix for r in ROUTES if r.detail} <= set(lookups)
    assert not any(r.detail for r in ROUTES if r.prefix in AGGREGATES)
    writable = {r.prefix for r in WRITES}
    assert writable == (STAFF_WRITES | STAFF_WRITES_OF_TEAM_OBJECTS | TEAM_ADMIN_REQUESTS | TEAM_ADMIN_WRITES
                        | MEMBER_BUILDS | SUBMISSIONS), writable
    for route in WRITES:
        if route.served and route.action not in ("destroy", "cancel"):
            assert (route.prefix, route.action) in VALID_BODIES, route.id


@pytest.mark.parametrize("route", READS, ids=lambda r: r.id)
def test_a_read_answers_each_persona_as_the_contract_says(route, lookups, personas):
    lookup = lookups.get(route.prefix)
    for persona, client in personas.items():
        response = call(client, route, lookup)
        assert response.status_code == expected_read(route, persona), (persona, route.id, response.content[:300])
        if persona == "anonymous":
            assert response["WWW-Authenticate"] == "Token"
    if route.detail and route.prefix in TEAM_SCOPED:  # another team's object looks like a missing one
        missing = call(personas["outsider"], route, MISSING[route.lookup])
        assert (missing.status_code, missing.json()) == (404, call(personas["outsider"], route, lookup).json())


@pytest.mark.parametrize("route", WRITES, ids=lambda r: r.id)
def test_a_write_by_anonymous_a_viewer_or_an_outsider_is_refused_and_changes_nothing(route, lookups, personas):
    lookup = lookups.get(route.prefix)
    reader = personas["staff"]
    for persona in ("anonymous", "viewer", "outsider"):
        seen = reader.get(route.url(lookup) if route.detail else route.template).json()
        response = call(personas[persona], route, lookup, body_for(route))
        expected = expected_write(route, persona)
        assert response.status_code == expected, (persona, route.id, response.content[:300])
        if expected == 400:
            assert "team" in response.json(), (persona, route.id, response.json())
        if persona == "outsider" and expected == 404:
            missing = call(personas["outsider"], route, MISSING[route.lookup], body_for(route))
            assert (missing.status_code, missing.json()) == (404, response.json())
        if expected >= 400:
            assert reader.get(route.url(lookup) if route.detail else route.template).json() == seen, (persona,
                                                                                                      route.id)


ENTITLEMENT_WRITES = [r for r in WRITES if r.served and r.prefix in STAFF_WRITES | STAFF_WRITES_OF_TEAM_OBJECTS]


@pytest.mark.parametrize("route", ENTITLEMENT_WRITES, ids=lambda r: r.id)
def test_a_write_to_quotas_budgets_or_the_platform_by_alphas_admin_or_member_is_403_and_changes_nothing(
        route, lookups, personas):
    lookup = lookups.get(route.prefix)
    reader = personas["staff"]
    for persona in ("owner", "teammate"):
        seen = reader.get(route.url(lookup) if route.detail else route.template).json()
        response = call(personas[persona], route, lookup, body_for(route))
        assert response.status_code == 403, (persona, route.id, response.content[:300])
        assert reader.get(route.url(lookup) if route.detail else route.template).json() == seen, (persona, route.id)
