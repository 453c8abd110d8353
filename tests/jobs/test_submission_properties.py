"""``jobs.spec.validated_submission`` (the validation of POST /api/v1/jobs/) over mutated submissions.

Hypothesis mutates valid submissions (wrong types, blanks, whitespace, NUL, unknown keys, missing keys,
out-of-range numbers, other teams) and holds every answer to what a 400 and a 201 promise: a refusal raises
DRF's ValidationError whose every path is the path of a field or unknown key the document holds or lacks (or
the document itself), never another exception; an accepted submission's stored spec holds every field of the
models in their order (key order included: it is the job's stored JSON; those of other kinds and absent
declarations left out) with the values given. The fields to mutate, and values at their edges, come from the
models' JSON schema, so a new field is covered without editing this file.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.exceptions import ValidationError

from jobs.spec import JobSubmission, validated_submission
from tests.support.factories import VALID_SPEC
from tests.support.personas import make_persona

# Spec objects stored only when given (absent: no declaration).
DECLARATIONS = ("model", "parallelism", "follow")

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("alpha_h100_quota")]

MINIMAL = {"team": "alpha", "name": "tiny", "spec": {
    "image": "python:3.11", "command": ["python", "-V"],
    "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "max_runtime_seconds": 60}}
TRAINING = {"team": "alpha", "name": "train-small", "kind": "training", "spec": VALID_SPEC}
INFERENCE = {"team": "alpha", "name": "serve", "kind": "inference", "spec": {
    "image": "python:3.11", "command": ["python", "serve.py"], "env": {"PORT": "8000"}, "replicas": 2,
    "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "max_runtime_seconds": 600}}
TEMPLATES = [MINIMAL, TRAINING, INFERENCE]


def _fields(schema: dict, defs: dict, prefix: tuple = ()) -> dict[tuple, dict]:
    """Every property below ``schema`` by its path, parents before children, references resolved. A field of
    several models (the spec: a single-role or a multi-role job's) is its first model's, with the fields of
    every one below it."""
    def resolved(field: dict) -> dict:
        while "$ref" in field:
            field = {**defs[field["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in field.items() if k != "$ref"}}
        return field

    fields = {}
    for name, field in schema.get("properties", {}).items():
        field = resolved(field)
        choices = [resolved(c) for c in field.get("oneOf") or field.get("anyOf") or ()]
        if choices and all("properties" in c for c in choices):
            fields[prefix + (name,)] = choices[0]
            for choice in reversed(choices):
                fields.update(_fields(choice, defs, prefix + (name,)))
            continue
        fields[prefix + (name,)] = field
        fields.update(_fields(field, defs, prefix + (name,)))
    return fields


SCHEMA = JobSubmission.model_json_schema()
# Every field of the submission, and keys that are no field (unknown keys, environment variable names).
FIELDS = _fields(SCHEMA, SCHEMA["$defs"])
PATHS_LIST = list(FIELDS) + [
    ("extra",), ("spec", "unknown"), ("spec", "resources", "gpus"), ("spec", "placement", "zones"),
    ("spec", "env", "A"), ("spec", "env", "9X"),
]
PATHS = st.sampled_from(PATHS_LIST)
ODD = [
    None, True, False, 0, 1, -1, 8, 9, 16, 2**31 - 1, 2**31, 1.0, 1.5, 0.0, float("inf"), float("nan"),
    "", " ", "x", " x", "x ", "x\x00", "é", "Z", "python:3.11", "H100-80GB", "A100-80GB", "L4", "nope-GPU",
    "aws", "gcp", "mars", "training", "inference", "batch", "low", "normal", "high", "urgent", "alpha", "beta",
    "UPPER", "ok-name", "-bad", [], [""], ["a"], ["a", ""], ["a", 1], ["aws"], ["aws", "mars"], [None],
    {}, {"A": "1"}, {"1A": "x"}, {"A": 1}, {"A": "x\x00"}, {"providers": ["gcp"]}, {"regions": ""},
    {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1},
]
INTS = [-2, -1, 0, 1, 2, 7, 8, 9, 16, 17, 65535, 65536, 2**31 - 1, 2**31, 10**400]
STRINGS = ["x", " x", "x ", "", " ", "x\x00", "é", "a" * 512, "a" * 513, "\tx"]
STRING_LISTS = [[], ["a"], [""], [" "], ["a\x00"], ["é"], ["a", "--x"], ["a", ""]]
NUMBERS = INTS + [0.5, 2.5, -0.5, float("inf"), float("nan"), True]
# Values picked by hand for some fields (near the edges of what each accepts).
HAND_PICKED = {
    ("name",): ["ok", "ok-2", "a" * 63, "a" * 64, "Ok", "ok_", "ok.", "-ok", "ok-", "o k", " ok", "ok\n"],
    ("team",): ["alpha", "beta", "gamma", " alpha", "alpha ", "ALPHA"],
    ("kind",): ["training", "inference", "Training", ""],
    ("spec", "image"): STRINGS, ("spec", "command"): STRING_LISTS, ("spec", "args"): STRING_LISTS,
    ("spec", "env"): [{"A": ""}, {"_a": "v"}, {"a1": "v"}, {"1a": "v"}, {"A-B": "v"}, {"": "v"}, {"É": "v"},
                      {"A": "v\x00"}, {"A": "é"}],
    ("spec", "max_runtime_seconds"): INTS, ("spec", "max_retries"): INTS, ("spec", "replicas"): INTS,
    ("spec", "port"): INTS, ("spec", "resources", "gpus_per_node"): INTS, ("spec", "resources", "nodes"): INTS,
    ("spec", "resources", "cpu"): NUMBERS, ("spec", "resources", "memory_gib"): NUMBERS,
    ("spec", "preemptible"): [True, False, 0, 1, "true", None],
    ("spec", "priority"): ["low", "normal", "high", "urgent", "", "Normal", 500],
    ("spec", "resources", "accelerator"): ["H100-80GB", "A100-80GB", "L4", "h100-80gb", "X"],
    ("spec", "placement", "providers"): [["aws"], ["gcp", "azure"], ["onprem"], ["mars"], [""], ["aws", "aws"]],
    ("spec", "placement", "regions"): STRING_LISTS, ("spec", "placement", "clusters"): STRING_LISTS,
}


def edges(field: dict) -> list:
    """Inputs at the edges of what the schema says of ``field`` (bounds, lengths, choices, default); whether each
    is valid is the validation's answer, not this list's."""
    values = [field["default"]] if "default" in field else []
    for bound in (field.get("minimum"), field.get("maximum")):
        if bound is not None:
            values += [bound - 1, bound, bound + 1]
    if "maxLength" in field:
        values += ["a" * (field["maxLength"] - 1), "a" * field["maxLength"], "a" * (field["maxLength"] + 1)]
    for choice in field.get("enum", ()):
        values += [choice, choice.upper()]
    for choice in field.get("items", {}).get("enum", ()):
        values += [[choice], [choice, "x"]]
    return values


# Values aimed at each field: the hand-picked ones and its edges; every field also gets ODD.
NEAR = {path: HAND_PICKED.get(path, []) + edges(field) for path, field in FIELDS.items()}
NEAR = {path: values for path, values in NEAR.items() if values}
ODD_VALUES = st.sampled_from(ODD)
MUTATION = PATHS.flatmap(lambda path: st.tuples(
    st.sampled_from(["set", "set", "set", "delete"]), st.just(path),
    st.one_of(st.sampled_from(NEAR[path]), ODD_VALUES) if path in NEAR else ODD_VALUES))


def mutate(document: dict, mutations) -> dict:
    document = copy.deepcopy(document)
    for action, path, value in mutations:
        parent = document
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        if action == "delete":
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = copy.deepcopy(value)
    return document


def answer(document: dict, user) -> tuple[dict | None, dict]:
    """``(submit_job's keyword arguments, {})`` or ``(None, the 400's errors)``; any other exception escapes."""
    try:
        return validated_submission(copy.deepcopy(document), user), {}
    except ValidationError as exc:
        return None, exc.detail


def present_or_missing(document, path: tuple) -> bool:
    """Whether ``path`` is a key the document holds, or a key missing from an object it holds; in a list (``after``)
    a key is an index of an item it holds."""
    node = document
    for key in path[:-1]:
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
            continue
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    if isinstance(node, list):
        return path[-1].isdigit() and int(path[-1]) < len(node)
    return isinstance(node, dict)


def check_answer(document: dict, user) -> bool:
    """Hold one answer to its promises; True when the submission was accepted."""
    fields, errors = answer(document, user)
    if fields is None:
        assert errors, document
        for path in errors:
            assert path == "non_field_errors" or present_or_missing(document, tuple(path.split("."))), (path, errors)
        return False
    stored, spec, kind = fields["spec"], document["spec"], document.get("kind", "training")
    expected_keys = [name for name, field in FIELDS[("spec",)]["properties"].items()
                     if kind in field.get("x-job-kinds", [kind]) and (name in spec or name not in DECLARATIONS)]
    assert list(stored) == expected_keys, (list(stored), expected_keys)  # the stored JSON's key order too
    for name, value in spec.items():
        if name in ("resources", "placement", "model", "parallelism"):
            assert [k for k in stored[name] if k in value] == [k for k in FIELDS[("spec", name)]["properties"]
                                                              if k in value]
        elif name != "checkpoint_from":
            assert stored[name] == (value.strip() if isinstance(value, str) else value), name
    assert fields["team"].slug == document["team"].strip()
    assert fields["resources"]["accelerator"].name == stored["resources"]["accelerator"]
    return True


@pytest.fixture
def users(teams, aws_cluster):
    """A member of alpha, a viewer of alpha (may not submit) and platform staff."""
    member = make_persona("member-x", teams[0], "member").user
    viewer = make_persona("viewer-x", teams[0], "viewer").user
    staff = make_persona("staff-x").user
    staff.is_staff = True
    staff.save()
    return [member, viewer, staff]


def test_the_common_submissions_are_accepted(users):
    for template in TEMPLATES:
        assert check_answer(template, users[0]), template


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(template=st.sampled_from(TEMPLATES), mutations=st.lists(MUTATION, min_size=1, max_size=3),
       who=st.integers(min_value=0, max_value=2))
def test_every_mutated_submission_gets_a_201_or_a_400_on_its_fields(users, template, mutations, who):
    check_answer(mutate(template, mutations), users[who])


@pytest.mark.parametrize("template", TEMPLATES, ids=["minimal", "training", "inference"])
def test_every_single_change_of_every_field_gets_a_201_or_a_400_on_its_fields(users, template):
    """Exhaustive over one change at a time (each field set to each value aimed at it and each odd value, or
    deleted), for a member and for staff."""
    changes = [("delete", path, None) for path in PATHS_LIST]
    changes += [("set", path, value) for path in PATHS_LIST for value in NEAR.get(path, []) + ODD]
    accepted = 0
    for user in (users[0], users[2]):
        for change in changes:
            accepted += check_answer(mutate(template, [change]), user)
    assert accepted > 100  # valid variants are accepted, not only the templates
