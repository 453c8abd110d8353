"""Hostile job submissions (wrong types, raw bodies that are not JSON objects, bad Unicode, hostile YAML, odd
values in every field, specs over the size limit): every one answers 400 on its field (never 500) and stores
neither a Job nor a JobEvent, and the next valid submission is unaffected."""

from __future__ import annotations

import copy
import json

import pytest
from rest_framework.exceptions import ParseError

from jobs.models import Job, JobEvent

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"


def counts():
    return Job.objects.count(), JobEvent.objects.count()


def post_raw(persona, body, content_type="application/json"):
    if isinstance(body, str):
        body = body.encode()
    return persona.client.generic("POST", JOBS, body, content_type=content_type)


def assert_rejected(response, before, field=None):
    assert response.status_code == 400, (response.status_code, getattr(response, "content", b"")[:500])
    assert counts() == before
    if field is not None:
        assert field in response.json(), response.json()


def with_path(submission, path, value):
    doc = copy.deepcopy(submission)
    *parents, leaf = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    node[leaf] = value
    return doc


BAD = [
    ("bool-for-int", "spec.resources.nodes", True, "spec.resources.nodes"),
    ("false-for-int", "spec.max_retries", False, "spec.max_retries"),
    ("int-for-bool", "spec.preemptible", 0, "spec.preemptible"),
    ("float-int", "spec.resources.gpus_per_node", 1.0, "spec.resources.gpus_per_node"),
    ("huge-int", "spec.max_runtime_seconds", 2**70, "spec.max_runtime_seconds"),
    ("int32-plus-one", "spec.max_retries", 2**31, "spec.max_retries"),
    ("negative-retries", "spec.max_retries", -1, "spec.max_retries"),
    ("cpu-zero", "spec.resources.cpu", 0, "spec.resources.cpu"),
    ("cpu-negative", "spec.resources.cpu", -1.5, "spec.resources.cpu"),
    ("cpu-string", "spec.resources.cpu", "4", "spec.resources.cpu"),
    ("cpu-bool", "spec.resources.cpu", True, "spec.resources.cpu"),
    ("memory-null", "spec.resources.memory_gib", None, "spec.resources.memory_gib"),
    ("null-team", "team", None, "team"),
    ("null-name", "name", None, "name"),
    ("null-spec", "spec", None, "spec"),
    ("null-image", "spec.image", None, "spec.image"),
    ("null-command", "spec.command", None, "spec.command"),
    ("null-resources", "spec.resources", None, "spec.resources"),
    ("null-env", "spec.env", None, "spec.env"),
    ("null-placement", "spec.placement", None, "spec.placement"),
    ("list-for-spec", "spec", [], "spec"),
    ("list-for-resources", "spec.resources", [{"accelerator": "H100-80GB"}], "spec.resources"),
    ("list-for-placement", "spec.placement", ["aws"], "spec.placement"),
    ("string-for-placement", "spec.placement", "aws", "spec.placement"),
    ("list-team", "team", ["alpha"], "team"),
    ("dict-kind", "kind", {"a": 1}, "kind"),
    ("list-kind", "kind", ["training"], "kind"),
    ("list-priority", "spec.priority", ["high"], "spec.priority"),
    ("dict-priority", "spec.priority", {"x": 1}, "spec.priority"),
    ("int-priority", "spec.priority", 100, "spec.priority"),
    ("nested-env-value", "spec.env", {"A": {"B": "C"}}, "spec.env"),
    ("unicode-name", "name", "tr\u00e4in", "name"),
    ("unicode-env-name", "spec.env", {"\u00c9T\u00c9": "x"}, "spec.env"),
    ("nul-in-name", "name", "train\x00x", "name"),
    ("nul-in-image", "spec.image", "python\x00:3.11", "spec.image"),
    ("nul-in-command", "spec.command", ["python", "-c\x00"], "spec.command"),
    ("nul-in-args", "spec.args", ["--a\x00b"], "spec.args"),
    ("nul-in-env-value", "spec.env", {"A": "x\x00y"}, "spec.env"),
    ("nul-in-env-name", "spec.env", {"A\x00": "x"}, "spec.env"),
    ("nul-in-region", "spec.placement.regions", ["us-east-1\x00"], "spec.placement.regions"),
    ("nul-in-team", "team", "alpha\x00", "team"),
    ("unknown-top-key", "extra", 1, "extra"),
    ("unknown-resources-key", "spec.resources.gpu", 1, "spec.resources.gpu"),
    ("port-on-training", "spec.port", 8080, "spec.port"),
]


@pytest.mark.parametrize("case,path,value,field", BAD, ids=[b[0] for b in BAD])
def test_bad_field_is_400_on_its_path_and_stores_nothing(owner, aws_cluster, submission, case, path, value, field):
    before = counts()
    response = owner.client.post(JOBS, with_path(submission, path, value), format="json")
    assert_rejected(response, before, field)


RAW_BODIES = [
    ("empty", b""),
    ("whitespace", b"   "),
    ("not-json", b"team=alpha&name=x"),
    ("truncated", b'{"team": "alpha", '),
    ("nan", b'{"team": "alpha", "name": "x", "spec": {"resources": {"cpu": NaN}}}'),
    ("infinity", b'{"team": "alpha", "name": "x", "spec": {"max_runtime_seconds": Infinity}}'),
    ("neg-infinity", b'{"team": "alpha", "name": "x", "spec": {"resources": {"cpu": -Infinity}}}'),
    ("list-body", b'[{"team": "alpha"}]'),
    ("scalar-body", b"42"),
    ("string-body", b'"alpha"'),
    ("null-body", b"null"),
    ("true-body", b"true"),
    ("deep-nesting", b"[" * 100_000 + b"]" * 100_000),
    ("deep-nesting-in-spec", b'{"team": "alpha", "name": "x", "spec": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}"),
    ("huge-int-literal", b'{"team": "alpha", "spec": {"max_runtime_seconds": ' + b"9" * 5000 + b"}}"),
    ("overflow-float", b'{"team": "alpha", "spec": {"resources": {"cpu": 1e400}}}'),
    ("latin1", '{"team": "\u00e9"}'.encode("latin-1")),
    ("nul-escape", b'{"team": "alpha", "name": "x\\u0000"}'),
    ("lone-surrogate", b'{"team": "alpha", "name": "\\ud800"}'),
]


@pytest.mark.parametrize("case,body", RAW_BODIES, ids=[b[0] for b in RAW_BODIES])
def test_raw_json_body_is_400(owner, aws_cluster, case, body):
    before = counts()
    assert_rejected(post_raw(owner, body), before)


def test_lone_surrogate_inside_spec_is_400(owner, aws_cluster, submission):
    before = counts()
    body = json.dumps(submission).replace('"python:3.11"', '"python\\ud800"').encode()
    assert_rejected(post_raw(owner, body), before)


def test_lone_surrogate_in_command_is_400(owner, aws_cluster, submission):
    before = counts()
    body = json.dumps(submission).replace('"print(\'hello\')"', '"\\udfff"').encode()
    assert "udfff" in body.decode()
    assert_rejected(post_raw(owner, body), before)


def test_nul_escape_in_env_value_is_400(owner, aws_cluster, submission):
    submission["spec"]["env"] = {"A": "a\u0000b"}
    before = counts()
    assert_rejected(post_raw(owner, json.dumps(submission)), before, "spec.env")


def test_duplicate_keys_keep_the_last_and_are_checked(owner, aws_cluster, submission):
    body = json.dumps(submission)[:-1] + ', "team": "beta"}'
    before = counts()
    response = post_raw(owner, body)
    # beta is not the owner's team: last key wins and the submission is refused, never stored.
    assert_rejected(response, before, "team")


YAML_BODIES = [
    ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                   "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"),
    ("merge-key-alias", "base: &base {image: x}\nspec:\n  <<: *base\n"),
    ("python-object", "team: !!python/object/apply:os.system ['true']\n"),
    ("python-name", "team: !!python/name:os.system\n"),
    ("custom-tag", "team: !foo bar\n"),
    ("list", "- team: alpha\n- name: x\n"),
    ("scalar", "just a string\n"),
    ("number", "42\n"),
    ("empty", ""),
    ("null", "~\n"),
    ("syntax", "team: [alpha\n"),
    ("tabs", "team:\t\talpha\n\tname: x\n"),
    ("binary-team", "team: !!binary YWxwaGE=\nname: x\n"),
    ("date-name", "team: alpha\nname: 2024-01-01\n"),
    ("deep-flow", "[" * 20_000 + "]" * 20_000),
    ("deep-block", "spec:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 3000)) + "  " * 3000 + "v: 1\n"),
    ("not-utf8", b"team: \xff\xfe\n"),
    ("nul-char", "team: alpha\x00\n"),
]


@pytest.mark.parametrize("case,body", YAML_BODIES, ids=[b[0] for b in YAML_BODIES])
def test_hostile_yaml_is_400(owner, aws_cluster, case, body, settings):
    before = counts()
    response = post_raw(owner, body, "application/yaml")
    if len(body) > settings.REQUEST_BODY_MAX_BYTES:  # deep-block's 9 MB: refused (413) before any parser reads it
        assert response.status_code == 413 and counts() == before
    else:
        assert_rejected(response, before)


def yaml_submission(spec_extra: str = "", top_extra: str = "") -> str:
    return (
        "team: alpha\nname: yaml-job\n" + top_extra + "spec:\n  image: python:3.11\n  command: [python, -V]\n"
        "  resources: {accelerator: H100-80GB, gpus_per_node: 1, nodes: 1}\n  max_runtime_seconds: 60\n" + spec_extra
    )


YAML_ODD_KEYS_AND_VALUES = [
    ("date-key-in-spec", "  2024-01-01: x\n"),
    ("binary-key-in-spec", "  !!binary aGVsbG8=: x\n"),
    ("int-key-in-env", "  env: {1: x}\n"),
    ("date-key-in-env", "  env: {2024-01-01: x}\n"),
    ("null-key-in-resources", ""),
    ("set-in-spec", "  args: !!set {a, b}\n"),
    ("timestamp-value-in-env", "  env: {A: 2024-01-01T00:00:00Z}\n"),
    ("float-nan-cpu", ""),
]


@pytest.mark.parametrize("case,extra", YAML_ODD_KEYS_AND_VALUES, ids=[a[0] for a in YAML_ODD_KEYS_AND_VALUES])
def test_yaml_odd_keys_and_values_are_400(owner, aws_cluster, case, extra):
    body = yaml_submission(extra)
    if case == "null-key-in-resources":
        body = body.replace("nodes: 1}", "nodes: 1, ~: 2}")
    if case == "float-nan-cpu":
        body = body.replace("nodes: 1}", "nodes: 1, cpu: .nan}")
    before = counts()
    assert_rejected(post_raw(owner, body, "application/yaml"), before)


@pytest.mark.parametrize("case,body", [
    ("top-level", yaml_submission(top_extra="name: other\n")),
    ("in-spec", yaml_submission("  max_runtime_seconds: 3600\n")),
    ("in-a-flow-mapping", yaml_submission().replace("nodes: 1}", "nodes: 1, nodes: 2}")),
], ids=lambda v: v if len(v) < 20 else "")
def test_a_yaml_key_named_twice_in_one_mapping_is_400_with_its_line(owner, aws_cluster, case, body):
    """PyYAML keeps the last of two equal keys without a word: the submitter's first value would be lost unseen."""
    before = counts()
    response = post_raw(owner, body, "application/yaml")
    assert_rejected(response, before)
    detail = response.json()["detail"]
    key = {"top-level": "name", "in-spec": "max_runtime_seconds", "in-a-flow-mapping": "nodes"}[case]
    seen, line = 0, None
    for number, text in enumerate(body.splitlines(), 1):  # the line where the key is written a second time
        seen += text.count(f"{key}:")
        if seen >= 2:
            line = number
            break
    assert f'duplicate key "{key}" at line {line},' in detail, detail


def test_equal_keys_in_sibling_mappings_are_no_duplicates():
    from core.parsers import load_yaml

    body = "roles:\n  a: {image: x, nodes: 1}\n  b: {image: x, nodes: 2}\nlist: [{k: 1}, {k: 2}]\n"
    assert load_yaml(body) == {"roles": {"a": {"image": "x", "nodes": 1}, "b": {"image": "x", "nodes": 2}},
                               "list": [{"k": 1}, {"k": 2}]}


def test_yaml_date_key_at_top_level_is_400(owner, aws_cluster):
    before = counts()
    assert_rejected(post_raw(owner, yaml_submission(top_extra="2024-01-01: x\n"), "application/yaml"), before)


def test_valid_yaml_is_accepted(owner, aws_cluster, redis_broker):
    response = post_raw(owner, yaml_submission(), "application/yaml")
    assert response.status_code == 201, response.content


def compact_json_bytes(value) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (no spaces, non-ASCII kept as UTF-8): how the spec limit counts
    (docs/design.md, Limits), computed here without the code under test."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def _pad_to(submission, target: int):
    """The submission with spec.env padded so the spec's compact JSON is exactly ``target`` bytes."""
    doc = copy.deepcopy(submission)
    doc["spec"]["env"]["PAD"] = ""
    missing = target - compact_json_bytes(doc["spec"])
    doc["spec"]["env"]["PAD"] = "x" * missing  # one byte per "x"
    assert compact_json_bytes(doc["spec"]) == target
    return doc


def test_spec_at_64_kib_is_accepted_and_one_byte_over_is_refused(
        owner, aws_cluster, submission, redis_broker, settings):
    limit = settings.JOB_SPEC_MAX_BYTES
    assert limit == 64 * 1024
    response = owner.client.post(JOBS, _pad_to(submission, limit), format="json")
    assert response.status_code == 201, response.content
    before = counts()
    over = _pad_to(submission, limit + 1)
    over["name"] = "other"
    response = owner.client.post(JOBS, over, format="json")
    assert_rejected(response, before, "spec")
    assert f"is {limit + 1} bytes" in response.json()["spec"][0]


def test_multibyte_env_counts_bytes_not_characters(owner, aws_cluster, submission, settings):
    submission["spec"]["env"]["PAD"] = "\u20ac" * (settings.JOB_SPEC_MAX_BYTES // 3 + 10)  # 3 bytes each
    before = counts()
    assert_rejected(owner.client.post(JOBS, submission, format="json"), before, "spec")


def test_very_long_command_list_is_refused_by_size(owner, aws_cluster, submission):
    submission["spec"]["command"] = ["x"] * 30_000  # 150 KB: under the body cap, over the spec's
    before = counts()
    assert_rejected(owner.client.post(JOBS, submission, format="json"), before, "spec")


def test_many_env_vars_over_the_size_limit_are_refused(owner, aws_cluster, submission):
    submission["spec"]["env"] = {f"V{i}": "1" for i in range(20_000)}
    before = counts()
    assert_rejected(owner.client.post(JOBS, submission, format="json"), before, "spec")


def test_viewer_cannot_submit(viewer, aws_cluster, submission):
    before = counts()
    assert_rejected(viewer.client.post(JOBS, submission, format="json"), before, "team")


def test_outsider_cannot_submit_for_alpha(outsider, aws_cluster, submission):
    before = counts()
    response = outsider.client.post(JOBS, submission, format="json")
    assert_rejected(response, before, "team")
    # Same answer as a team that does not exist.
    submission["team"] = "nope"
    other = outsider.client.post(JOBS, submission, format="json")
    assert other.json()["team"][0].replace("nope", "alpha") == response.json()["team"][0]


def test_a_form_encoded_submission_gets_415(owner, aws_cluster):
    before = counts()
    response = owner.client.post(JOBS, {"team": "alpha", "name": "x"})  # multipart: not an accepted parser
    assert response.status_code == 415
    assert counts() == before


# --- odd values in every field -------------------------------------------------------------------------------------

ODD_VALUES = [None, True, 0, -1, 1.5, float("1e308"), "", "x" * 5000, [], [1, [2]], {}, {"a": {"b": [None]}}]
FIELD_PATHS = [("team",), ("name",), ("kind",), ("spec",), ("spec", "image"), ("spec", "command"), ("spec", "args"),
               ("spec", "env"), ("spec", "resources"), ("spec", "resources", "accelerator"),
               ("spec", "resources", "gpus_per_node"), ("spec", "resources", "nodes"), ("spec", "resources", "cpu"),
               ("spec", "priority"), ("spec", "max_runtime_seconds"), ("spec", "preemptible"),
               ("spec", "placement"), ("spec", "placement", "providers"), ("spec", "max_retries")]


# The odd values that are valid where they are put (the spec's documented types and defaults), by repr.
VALID_ODD_VALUES = {
    ("spec.args", "[]"),  # no arguments
    ("spec.env", "{}"),  # no variables
    ("spec.placement", "{}"),  # anywhere
    ("spec.placement.providers", "[]"),  # any provider
    ("spec.max_retries", "0"),  # the default
    ("spec.preemptible", "True"),
    ("spec.resources.cpu", "1.5"),  # cores, a positive number
    ("spec.resources.cpu", "1e+308"),  # a positive number too: no upper bound on the CPU request
}


@pytest.mark.parametrize("path", FIELD_PATHS, ids=".".join)
def test_odd_values_in_every_field_get_400_and_only_their_own_errors(cached, teammate, aws_cluster, submission, path):
    for value in ODD_VALUES:
        sub = copy.deepcopy(submission)
        node = sub
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        r = teammate.client.post(JOBS, sub, format="json")
        expected = 201 if (".".join(path), repr(value)) in VALID_ODD_VALUES else 400
        assert r.status_code == expected, (path, value, r.status_code, r.content[:300])
        if expected == 400:
            assert all(k.startswith(path[0]) or k == "non_field_errors" for k in r.json()), (path, value, r.json())
        # the next valid request is unaffected
        ok = teammate.client.post(JOBS, submission, format="json")
        assert ok.status_code == 201, (path, value, ok.content[:300])


# --- YAML that PyYAML parses oddly or cannot construct -------------------------------------------------------------

@pytest.mark.parametrize("body", [
    "team: alpha\nname: y\nspec:\n  priority: [high]\n",
    "team: alpha\nname: y\nspec: {2024-01-01: 1}\n",
    "team: alpha\nname: y\nspec:\n  image: !!binary aGVsbG8=\n",
    "team: alpha\nname: y\nspec: &a [*a]\n",
    "- 1\n- 2\n",
    "just a string",
    "team: {? [1, 2] : 3}\n",
    "team: alpha\nname: .nan\nspec:\n  priority: .inf\n",
])
def test_odd_yaml_submissions_get_400(cached, teammate, aws_cluster, body):
    r = teammate.client.post(JOBS, body.encode(), content_type="application/yaml")
    assert r.status_code == 400, (r.status_code, r.content[:300])


@pytest.mark.parametrize("body", [
    ("team: alpha\nname: x\nspec:\n  max_runtime_seconds: " + "1" * 5000 + "\n").encode(),  # int() digit limit
    b"team: alpha\nname: 2024-13-45\n",  # matches YAML's timestamp pattern, but month 13
    b"team: alpha\nname: 2024-02-30 10:00:00\n",  # February 30th
], ids=["int-over-4300-digits", "month-13", "february-30"])
def test_yaml_scalars_that_pyyaml_cannot_construct_get_400_not_500(teammate, aws_cluster, body):
    """PyYAML's SafeLoader raises a plain ValueError (not yaml.YAMLError) from int()/datetime() for these;
    core.parsers.YAMLParser only catches RecursionError, UnicodeDecodeError and YAMLError."""
    teammate.client.raise_request_exception = False
    r = teammate.client.post(JOBS, body, content_type="application/yaml")
    assert r.status_code == 400, (r.status_code, r.content[:200])


# --- NUL and overlong values ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("name", "a" * 64), ("name", "a\x00b"), ("team", "al\x00pha"),
                                         ("image", "x\x00y"), ("image", "x" * 513)])
def test_nul_and_overlong_values_get_400_and_store_nothing(cached, teammate, aws_cluster, submission, field, value):
    if field == "image":
        submission["spec"]["image"] = value
    else:
        submission[field] = value
    before = (Job.objects.count(), JobEvent.objects.count())
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400, r.content
    assert (Job.objects.count(), JobEvent.objects.count()) == before


def test_parseable_deep_nesting_inside_spec_is_400(owner, aws_cluster, submission):
    depth = 900
    body = json.dumps(submission)
    body = body.replace('"max_retries": 1', '"max_retries": 1, "deep": ' + "[" * depth + "]" * depth)
    before = Job.objects.count()
    response = owner.client.generic("POST", "/api/v1/jobs/", body.encode(), content_type="application/json")
    assert response.status_code == 400
    assert Job.objects.count() == before


# --- node floods ---------------------------------------------------------------------------------------------------

def _spec_with_list(items: int) -> str:
    """A YAML body whose nodes are: the top mapping (1), ``team`` and its value (2), ``name`` and its value (2),
    ``spec`` and its mapping (2), that mapping's key ``extra`` (1), a flow list (1) of ``items`` scalars:
    9 + ``items`` nodes."""
    return "team: alpha\nname: flood\nspec:\n  extra: [" + ",".join("1" for _ in range(items)) + "]\n"


def test_a_document_at_the_node_limit_is_built_and_one_past_it_is_refused_unbuilt(settings):
    from core.parsers import load_yaml, yaml_max_nodes

    limit = settings.JOB_SPEC_MAX_BYTES // 2  # each node costs at least 2 bytes of the spec's JSON encoding
    assert yaml_max_nodes() == limit
    assert len(load_yaml(_spec_with_list(limit - 9))["spec"]["extra"]) == limit - 9
    with pytest.raises(ParseError, match=f"more than {limit} nodes"):
        load_yaml(_spec_with_list(limit - 8))


@pytest.mark.parametrize("body", [
    "a: &x 1\nb: *x\n",
    "team: alpha\nname: y\nspec:\n  image: &i img\n  command: [*i]\n",
])
def test_yaml_aliases_are_refused_wherever_they_point(body):
    from core.parsers import load_yaml

    with pytest.raises(ParseError, match="aliases are not accepted"):
        load_yaml(body)


def test_a_node_flood_under_the_size_cap_is_refused_with_its_reason_and_stores_nothing(cached, teammate,
                                                                                      aws_cluster, settings):
    from core.limits import yaml_max_bytes

    body = _spec_with_list(yaml_max_bytes() // 2 - 100).encode()[:yaml_max_bytes()]
    before = (Job.objects.count(), JobEvent.objects.count())
    r = teammate.client.post(JOBS, body, content_type="application/yaml")
    assert r.status_code == 400
    assert "nodes" in r.json()["detail"]
    assert (Job.objects.count(), JobEvent.objects.count()) == before


def test_thousands_of_unknown_keys_answer_a_bounded_list_of_errors(teammate, aws_cluster, submission):
    before = counts()
    document = {**submission, **{f"k{i}": 1 for i in range(5000)}}
    response = post_raw(teammate, json.dumps(document))
    assert_rejected(response, before)
    errors = response.json()
    assert len(errors) == 51  # 50 listed, and the count of the rest
    assert errors["k0"] == ["unknown field; expected one of team, name, kind, spec, after"]
    assert errors["non_field_errors"] == ["4950 more error(s) not listed; fix the ones above first."]


def test_a_long_unknown_key_is_shown_cut(teammate, aws_cluster, submission):
    before = counts()
    response = post_raw(teammate, json.dumps({**submission, "k" * 5000: 1}))
    assert_rejected(response, before)
    assert list(response.json()) == ["k" * 120 + "..."]


def test_a_json_body_over_the_cap_is_refused_unparsed(teammate, submission, settings):
    before = counts()
    padding = " " * (4 * settings.JOB_SPEC_MAX_BYTES)  # whitespace: valid JSON, only its size is wrong
    response = post_raw(teammate, json.dumps(submission) + padding)
    assert_rejected(response, before)
    assert response.json() == {"detail": f"JSON body over {4 * settings.JOB_SPEC_MAX_BYTES} bytes"}
