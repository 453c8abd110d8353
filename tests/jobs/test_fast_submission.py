"""``jobs.spec.fast_submission`` (the hot path of POST /api/v1/jobs/) against ``JobSubmissionSerializer``.

The fast path may decline anything (None: the serializer decides), but what it accepts must be exactly
what the serializer accepts, with the same ``submission()``: same team, accelerator, columns and the same
normalized spec, key order included (it is the job's stored JSON). Hypothesis mutates valid submissions
(wrong types, blanks, whitespace, NUL, unknown keys, missing keys, out-of-range numbers, other teams) and
holds both to the same answer. The fields to mutate, and values at their edges, come from the table both
paths are built from (``jobs.specfields``), so a new field is covered without editing this file; the answer
each case must get is the serializer's.
"""

from __future__ import annotations

import copy
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.spec import JobSubmissionSerializer, fast_submission
from jobs.specfields import FieldType, SpecField, walk
from tests.support.factories import VALID_SPEC
from tests.support.personas import make_persona

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("alpha_h100_quota")]

MINIMAL = {"team": "alpha", "name": "tiny", "spec": {
    "image": "python:3.11", "command": ["python", "-V"],
    "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "max_runtime_seconds": 60}}
TRAINING = {"team": "alpha", "name": "train-small", "kind": "training", "spec": VALID_SPEC}
INFERENCE = {"team": "alpha", "name": "serve", "kind": "inference", "spec": {
    "image": "python:3.11", "command": ["python", "serve.py"], "env": {"PORT": "8000"}, "replicas": 2,
    "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "max_runtime_seconds": 600}}
TEMPLATES = [MINIMAL, TRAINING, INFERENCE]

# Every field of the submission table, and keys that are no field (unknown keys, environment variable names).
FIELDS = {tuple(path.split(".")): field for path, field in walk()}
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


def edges(field: SpecField) -> list:
    """Inputs at the edges of what the table says of ``field`` (bounds, lengths, choices, default); whether each
    is valid is the serializer's answer, not this list's."""
    values = [field.default_value()] if field.has_default else []
    for bound in (field.min_value, field.max_value):
        if bound is not None:
            values += [bound - 1, bound, bound + 1]
    if field.max_length is not None:
        values += ["a" * (field.max_length - 1), "a" * field.max_length, "a" * (field.max_length + 1)]
    for choice in field.choice_values:
        values += [[choice], [choice, "x"]] if field.type is FieldType.STRING_LIST else [choice, choice.upper()]
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


def serializer_answer(document: dict, user):
    serializer = JobSubmissionSerializer(data=copy.deepcopy(document),
                                         context={"request": types.SimpleNamespace(user=user)})
    return serializer.submission() if serializer.is_valid() else None


def same_submission(fast: dict, slow: dict) -> None:
    assert fast["team"].pk == slow["team"].pk and fast["submitter"].pk == slow["submitter"].pk
    assert (fast["name"], fast["kind"]) == (slow["name"], slow["kind"])
    assert fast["spec"] == slow["spec"]
    assert list(fast["spec"]) == list(slow["spec"])  # the stored JSON's key order too
    for key in ("resources", "placement"):
        assert list(fast["spec"][key]) == list(slow["spec"][key])
    fast_res, slow_res = dict(fast["resources"]), dict(slow["resources"])
    assert fast_res.pop("accelerator").pk == slow_res.pop("accelerator").pk
    assert fast_res == slow_res


@pytest.fixture
def users(teams, aws_cluster):
    """A member of alpha, a viewer of alpha (may not submit) and platform staff."""
    member = make_persona("member-x", teams[0], "member").user
    viewer = make_persona("viewer-x", teams[0], "viewer").user
    staff = make_persona("staff-x").user
    staff.is_staff = True
    staff.save()
    return [member, viewer, staff]


def test_the_fast_path_takes_the_common_submissions(users):
    member = users[0]
    for template in TEMPLATES:
        fast = fast_submission(copy.deepcopy(template), member)
        assert fast is not None, template
        same_submission(fast, serializer_answer(template, member))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(template=st.sampled_from(TEMPLATES), mutations=st.lists(MUTATION, min_size=1, max_size=3),
       who=st.integers(min_value=0, max_value=2))
def test_whatever_the_fast_path_accepts_the_serializer_accepts_identically(users, template, mutations, who):
    user = users[who]
    document = mutate(template, mutations)
    fast = fast_submission(copy.deepcopy(document), user)
    if fast is None:
        return  # declined: the serializer decides, as before
    slow = serializer_answer(document, user)
    assert slow is not None, (document, "the fast path accepted what the serializer refuses")
    same_submission(fast, slow)


@pytest.mark.parametrize("template", TEMPLATES, ids=["minimal", "training", "inference"])
def test_every_single_change_of_every_field_gets_the_serializers_answer(users, template):
    """Exhaustive over one change at a time (each field set to each value aimed at it and each odd value, or
    deleted), for a member and for staff: what the fast path accepts, the serializer accepts identically."""
    changes = [("delete", path, None) for path in PATHS_LIST]
    changes += [("set", path, value) for path in PATHS_LIST for value in NEAR.get(path, []) + ODD]
    accepted = 0
    for user in (users[0], users[2]):
        for change in changes:
            document = mutate(template, [change])
            fast = fast_submission(copy.deepcopy(document), user)
            slow = serializer_answer(document, user)
            if fast is not None:
                accepted += 1
                assert slow is not None, (change, "the fast path accepted what the serializer refuses")
                same_submission(fast, slow)
    assert accepted > 100  # the fast path does take the valid variants, not only the templates
