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

from .routes import ROUTES, VALID_BODIES, world

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


def field_cases():
    for route in WRITABLE:
        for key in VALID_BODIES[(route.prefix, route.action)]():
            yield pytest.param(route, key, id=f"{route.id} {key}")


def missing_field_cases():
    for route in WRITABLE:
        if route.action != "partial_update":
            for key in VALID_BODIES[(route.prefix, route.action)]():
                yield pytest.param(route, key, id=f"{route.id} without {key}")


@pytest.mark.parametrize("route", WRITABLE, ids=lambda r: r.id)
def test_the_valid_body_is_accepted(route, lookups, staff):
    body = VALID_BODIES[(route.prefix, route.action)]()
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


@pytest.mark.parametrize("route, key", list(missing_field_cases()))
def test_a_missing_required_field_is_400_on_that_field(route, key, lookups, staff):
    body = VALID_BODIES[(route.prefix, route.action)]()
    del body[key]
    lookup = lookups.get(route.prefix)
    before = snapshot(staff.client, route, lookup)
    response = send(staff.client, route, lookup, json.dumps(body).encode())
    if (route.prefix, key) in DEFAULTS:
        assert response.status_code == (201 if route.action == "create" else 200), response.content[:300]
        assert response.json()[key] == DEFAULTS[(route.prefix, key)]
        return
    assert response.status_code == 400, response.content[:300]
    assert key in response.json(), response.json()
    assert snapshot(staff.client, route, lookup) == before


@pytest.mark.parametrize("route, key", list(field_cases()))
def test_a_bad_value_in_a_field_is_400(route, key, lookups, staff):
    lookup = lookups.get(route.prefix)
    for bad, value_json in BAD_VALUES.items():
        with transaction.atomic():  # each value on the same starting rows: what one accepts is undone
            body = VALID_BODIES[(route.prefix, route.action)]()
            before = snapshot(staff.client, route, lookup)
            response = send(staff.client, route, lookup, with_value(body, key, value_json))
            if (route.prefix, key) in NUMBER_AS_TEXT and bad in VALID_AS_TEXT:
                assert response.status_code == (201 if route.action == "create" else 200), (bad, response.content)
                assert response.json()[key] == str(json.loads(value_json)), bad
            else:
                assert response.status_code == 400, (bad, response.status_code, response.content[:300])
                assert snapshot(staff.client, route, lookup) == before, bad
            transaction.set_rollback(True)
