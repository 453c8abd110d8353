"""Bad input to every writable endpoint of the router answers 400, never a 500, and changes nothing.

The writable endpoints (create, update, partial update) come from the router (``routes.py``); each starts from
a valid body that staff may send (``VALID_BODIES``, checked to be accepted), then one thing is broken at a time:
the body is not JSON, not an object, not valid Unicode, nested too deep or empty; a required field is missing;
one field holds a value of the wrong type (an object, a list, null, a boolean), a huge or non-finite number, a
NUL or a lone surrogate. Staff pass every permission, so the answer is the validation's alone.

Three exceptions are the API's documented answers, listed below: a submission's ``kind`` defaults to
``training`` and its ``after`` to none; a report asked for without ``team`` is platform-wide; and the platform objects' names and regions take a JSON number as its decimal text when that
text is a valid value (DRF's ``CharField``), as ``9223372036854775808`` or ``inf``.
"""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from .routes import MORE_BODIES, ROUTES, VALID_BODIES, world

WRITABLE = [r for r in ROUTES if r.served and r.action in ("create", "update", "partial_update")]

#: Bodies no endpoint accepts, sent as raw ``application/json``.
RAW_BODIES = {
    "not-json": b'{"name": ',
    "a-list": b"[]",
    "a-string": b'"x"',
    "a-number": b"42",
    "null": b"null",
    "true": b"true",
    "lone-surrogate-key": b'{"\\udfff": 1}',
    "not-utf-8": b'{"name": "\xff\xfe"}',
    "nesting-too-deep": b"[" * 100_000 + b"]" * 100_000,
}
#: JSON texts put in place of one field's value.
BAD_VALUES = {
    "an-object": '{"nested": ["x"]}',
    "a-list-of-lists": '[["x"]]',
    "null": "null",
    "a-boolean": "true",
    "huge-integer": "1" + "0" * 400,
    "huge-negative-integer": "-1" + "0" * 400,
    "past-int64": str(2**63),
    "past-a-float": "1e400",
    "nan": "NaN",
    "nul-in-text": '"x\\u0000y"',
    "lone-surrogate": '"\\ud800"',
    "huge-text": json.dumps("x" * 100_000),
}


#: Fields that may be left out, with the value the API stores then (a report without a team is the platform's,
#: which staff, who send these bodies, may build; a subscription without one is the user's own).
DEFAULTS = {("jobs", "kind"): "training", ("jobs", "after"): [], ("arrays", "kind"): "training",
            ("reports", "team"): None, ("subscriptions", "team"): None}
#: Text fields that take a JSON number as its decimal text, and the bad values that are then valid text.
NUMBER_AS_TEXT = {("cohorts", "name"), ("priority-classes", "name"), ("clusters", "name"), ("clusters", "region")}
VALID_AS_TEXT = {"past-int64", "past-a-float"}  # 9223372036854775808 and inf; 400 digits are over the length


@pytest.fixture
def lookups(teams, owner, teammate, outsider, aws_cluster, alpha_objects, beta_objects, h100, redis_broker):
    return world(teams, owner, teammate, outsider, aws_cluster, alpha_objects, beta_objects, h100)


def send(client, route, lookup, raw: bytes):
    url = route.url(lookup) if route.detail else route.template
    return client.generic(route.method.upper(), url, raw, content_type="application/json")


def snapshot(client, route, lookup):
    """What staff read at the route's resource: its detail, or the list it creates into."""
    return client.get(route.url(lookup) if route.detail else route.template).json()


def with_value(body: dict, key: str, value_json: str) -> bytes:
    """``body`` as JSON with ``key``'s value replaced by the JSON text ``value_json`` (which json.dumps could not
    always write: NaN, huge literals, lone surrogates)."""
    placeholder = "__replaced__"
    text = json.dumps({**body, key: placeholder})
    return text.replace(json.dumps(placeholder), value_json).encode()


def bodies(route):
    """The valid bodies of ``route``: ``VALID_BODIES``' and its ``MORE_BODIES``, with an id suffix each."""
    yield "", VALID_BODIES[(route.prefix, route.action)]
    for make in MORE_BODIES.get((route.prefix, route.action), ()):
        yield f" ({make.__name__})", make


def field_cases():
    for route in WRITABLE:
        for name, make in bodies(route):
            for key in make():
                yield pytest.param(route, key, make, id=f"{route.id}{name} {key}")


def missing_field_cases():
    for route in WRITABLE:
        if route.action != "partial_update":
            for name, make in bodies(route):
                for key in make():
                    yield pytest.param(route, key, make, id=f"{route.id}{name} without {key}")


def body_cases():
    for route in WRITABLE:
        for name, make in bodies(route):
            yield pytest.param(route, make, id=f"{route.id}{name}")


@pytest.mark.parametrize("route, make", list(body_cases()))
def test_the_valid_body_is_accepted(route, make, lookups, staff):
    body = make()
    response = send(staff.client, route, lookups.get(route.prefix), json.dumps(body).encode())
    assert response.status_code == (201 if route.action == "create" else 200), response.content[:300]


@pytest.mark.parametrize("route", WRITABLE, ids=lambda r: r.id)
def test_a_body_that_is_not_a_json_object_is_400(route, lookups, staff):
    lookup = lookups.get(route.prefix)
    before = snapshot(staff.client, route, lookup)
    bodies = dict(RAW_BODIES)
    if route.action != "partial_update":
        bodies["empty"] = b""  # (an empty PATCH is a valid change of nothing)
        bodies["no-field"] = b"{}"
    for name, raw in bodies.items():
        response = send(staff.client, route, lookup, raw)
        assert response.status_code == 400, (name, response.status_code, response.content[:300])
    assert snapshot(staff.client, route, lookup) == before


@pytest.mark.parametrize("route, key, make", list(missing_field_cases()))
def test_a_missing_required_field_is_400_on_that_field(route, key, make, lookups, staff):
    body = make()
    del body[key]
    lookup = lookups.get(route.prefix)
    before = snapshot(staff.client, route, lookup)
    response = send(staff.client, route, lookup, json.dumps(body).encode())
    # (a multi-role job says its kind: a spec with roles and no kind is refused on kind, not taken as training)
    if (route.prefix, key) in DEFAULTS and make is VALID_BODIES[(route.prefix, route.action)]:
        assert response.status_code == (201 if route.action == "create" else 200), response.content[:300]
        assert response.json()[key] == DEFAULTS[(route.prefix, key)]
        return
    assert response.status_code == 400, response.content[:300]
    assert key in response.json(), response.json()
    assert snapshot(staff.client, route, lookup) == before


@pytest.mark.parametrize("route, key, make", list(field_cases()))
def test_a_bad_value_in_a_field_is_400(route, key, make, lookups, staff):
    lookup = lookups.get(route.prefix)
    for bad, value_json in BAD_VALUES.items():
        with transaction.atomic():  # each value on the same starting rows: what one accepts is undone
            body = make()
            before = snapshot(staff.client, route, lookup)
            response = send(staff.client, route, lookup, with_value(body, key, value_json))
            if (route.prefix, key) in NUMBER_AS_TEXT and bad in VALID_AS_TEXT:
                assert response.status_code == (201 if route.action == "create" else 200), (bad, response.content)
                assert response.json()[key] == str(json.loads(value_json)), bad
            else:
                assert response.status_code == 400, (bad, response.status_code, response.content[:300])
                assert snapshot(staff.client, route, lookup) == before, bad
            transaction.set_rollback(True)


ROLE_KEYS = ["image", "command", "args", "env", "resources", "port", "completion"]


@pytest.mark.parametrize("key", ROLE_KEYS)
def test_a_bad_value_in_a_role_is_400_on_the_roles_field(key, lookups, staff):
    """Every field of a multi-role job's role, given each bad value, answers 400 keyed by that role's field."""
    route = next(r for r in WRITABLE if (r.prefix, r.action) == ("jobs", "create"))
    make = MORE_BODIES[("jobs", "create")][0]
    for bad, value_json in BAD_VALUES.items():
        if (key, bad) == ("completion", "a-boolean"):
            continue  # true is a valid completion
        body = make()
        placeholder = "__replaced__"
        body["spec"]["roles"]["rollout"][key] = placeholder
        raw = json.dumps(body).replace(json.dumps(placeholder), value_json).encode()
        before = snapshot(staff.client, route, None)
        response = send(staff.client, route, None, raw)
        assert response.status_code == 400, (bad, response.status_code, response.content[:300])
        errors = response.json()
        # "detail": the body as a whole (not JSON, not Unicode); "spec": over the spec's size limit, measured first
        assert list(errors) == ["detail"] or bad == "huge-text" and list(errors) == ["spec"] or any(
            path == f"spec.roles.rollout.{key}" or path.startswith(f"spec.roles.rollout.{key}.")
            for path in errors), (bad, errors)
        assert snapshot(staff.client, route, None) == before, bad
