"""Job spec validation through POST /api/v1/jobs/: every bad field answers 400 on its dotted path and stores nothing."""

from __future__ import annotations

import pytest
from django.test import override_settings
from pydantic import ValidationError

from jobs.models import Job, JobEvent
from jobs.spec import JobSubmission, error_paths
from quotas.models import Quota
from runners.kubernetes.sync import apply_pools
from tests.support.factories import make_attempt, make_job

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"


def set_path(document: dict, path: str, value) -> None:
    """Set ``a.b.c`` in a nested dict; the value ``DELETE`` removes the key."""
    *parents, leaf = path.split(".")
    for key in parents:
        document = document[key]
    if value is DELETE:
        del document[leaf]
    else:
        document[leaf] = value


DELETE = object()

# (id, dotted path to change, new value, field path expected in the errors, fragment of the message)
BAD_FIELDS = [
    ("unknown-accelerator", "spec.resources.accelerator", "TPU-v5", "spec.resources.accelerator",
     "unknown accelerator"),
    ("unknown-team", "team", "no-such-team", "team", "unknown team"),
    ("gpus-over-largest-pool", "spec.resources.gpus_per_node", 16, "spec.resources.gpus_per_node", "maximum is 8"),
    ("nodes-zero", "spec.resources.nodes", 0, "spec.resources.nodes", "greater than or equal to 1"),
    ("gpus-negative", "spec.resources.gpus_per_node", -1, "spec.resources.gpus_per_node", "greater than or equal to 0"),
    ("gpus-zero-of-a-gpu", "spec.resources.gpus_per_node", 0, "spec.resources.gpus_per_node",
     "0 GPUs is a CPU-only job, which runs on CPU node pools"),
    ("runtime-missing", "spec.max_runtime_seconds", DELETE, "spec.max_runtime_seconds", "required"),
    ("runtime-zero", "spec.max_runtime_seconds", 0, "spec.max_runtime_seconds", "greater than or equal to 1"),
    ("runtime-negative", "spec.max_runtime_seconds", -60, "spec.max_runtime_seconds", "greater than or equal to 1"),
    ("runtime-string", "spec.max_runtime_seconds", "3600", "spec.max_runtime_seconds", "valid integer"),
    ("runtime-float", "spec.max_runtime_seconds", 3600.5, "spec.max_runtime_seconds", "valid integer"),
    ("runtime-bool", "spec.max_runtime_seconds", True, "spec.max_runtime_seconds", "valid integer"),
    ("image-empty", "spec.image", "", "spec.image", "blank"),
    ("image-not-string", "spec.image", 5, "spec.image", "valid string"),
    ("command-empty", "spec.command", [], "spec.command", "non-empty list"),
    ("command-string", "spec.command", "python train.py", "spec.command", "list of strings"),
    ("command-non-string-item", "spec.command", ["python", 3], "spec.command", "Item 1 is not a string"),
    ("args-string", "spec.args", "--steps 10", "spec.args", "list of strings"),
    ("args-non-string-item", "spec.args", ["--steps", 10], "spec.args", "Item 1 is not a string"),
    ("env-bad-name-digit", "spec.env", {"1BAD": "x"}, "spec.env", "invalid environment variable name"),
    ("env-bad-name-dash", "spec.env", {"MY-VAR": "x"}, "spec.env", "invalid environment variable name"),
    ("env-non-string-value", "spec.env", {"STEPS": 10}, "spec.env", "must be a string"),
    ("env-name-trailing-newline", "spec.env", {"A\n": "x"}, "spec.env", "invalid environment variable name"),
    ("env-not-a-mapping", "spec.env", ["A=1"], "spec.env", "mapping"),
    ("unknown-priority", "spec.priority", "urgent", "spec.priority", 'unknown priority "urgent"'),
    ("name-uppercase", "name", "Train_Job", "name", "DNS-1123"),
    ("name-leading-dash", "name", "-train", "name", "DNS-1123"),
    ("name-with-dot", "name", "train.v2", "name", "DNS-1123"),
    ("name-too-long", "name", "a" * 64, "name", "63"),
    ("unknown-provider", "spec.placement.providers", ["digitalocean"], "spec.placement.providers", "unknown value"),
    ("preemptible-string", "spec.preemptible", "true", "spec.preemptible", "valid boolean"),
    ("preemptible-int", "spec.preemptible", 1, "spec.preemptible", "valid boolean"),
    ("nodes-string", "spec.resources.nodes", "2", "spec.resources.nodes", "valid integer"),
    ("gpus-bool", "spec.resources.gpus_per_node", True, "spec.resources.gpus_per_node", "valid integer"),
    ("cpu-string", "spec.resources.cpu", "4", "spec.resources.cpu", "number"),
    ("memory-zero", "spec.resources.memory_gib", 0, "spec.resources.memory_gib", "greater than 0"),
    ("cpu-beyond-float", "spec.resources.cpu", 10**400, "spec.resources.cpu", "Too large"),  # beyond a float
    ("retries-negative", "spec.max_retries", -1, "spec.max_retries", "greater than or equal to 0"),
    ("kind-unknown", "kind", "batch", "kind", "valid choice"),
    ("unknown-spec-key", "spec.gpus", 8, "spec.gpus", "unknown field"),
    ("unknown-resources-key", "spec.resources.gpu", 8, "spec.resources.gpu", "unknown field"),
    ("replicas-on-training", "spec.replicas", 2, "spec.replicas", "inference jobs only"),
    ("spec-not-a-mapping", "spec", ["image"], "spec", "Expected a dictionary"),
]


def assert_nothing_stored():
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0


@pytest.mark.parametrize("change, value, field, fragment",
                         [case[1:] for case in BAD_FIELDS], ids=[case[0] for case in BAD_FIELDS])
def test_it_rejects_a_bad_field_on_its_path(teammate, aws_cluster, submission, change, value, field, fragment):
    set_path(submission, change, value)
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400, r.content
    errors = r.json()
    assert field in errors, errors
    assert any(fragment in message for message in errors[field]), errors[field]
    assert_nothing_stored()


def test_it_reports_every_bad_field_at_once(teammate, aws_cluster, submission):
    submission["name"] = "Bad Name"
    submission["spec"]["resources"]["nodes"] = 0
    submission["spec"]["env"] = {"9X": "1"}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert {"name", "spec.resources.nodes", "spec.env"} <= set(r.json())
    assert_nothing_stored()


def test_it_rejects_a_team_the_user_is_not_a_member_of_like_an_unknown_one(outsider, aws_cluster, submission):
    r = outsider.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert r.json()["team"] == ['unknown team "alpha", or you are not a member of it']
    assert_nothing_stored()


def test_it_refuses_a_viewer_with_the_reason(viewer, aws_cluster, submission):
    r = viewer.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert "only admins and members may submit" in r.json()["team"][0]
    assert_nothing_stored()


def test_it_lets_staff_submit_for_any_team(staff, aws_cluster, submission, teams, h100):
    Quota.objects.create(team=teams[1], accelerator=h100, nominal_gpus=16)
    submission["team"] = "beta"
    r = staff.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["team"] == "beta"


def test_it_says_the_largest_pool_in_the_gpu_error(teammate, aws_cluster, submission):
    submission["spec"]["resources"]["gpus_per_node"] = 9
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.json()["spec.resources.gpus_per_node"] == [
        "9 GPUs per node is more than any H100-80GB node pool has; the maximum is 8"
    ]


def test_it_rejects_an_accelerator_no_pool_offers(teammate, aws_cluster, submission):
    submission["spec"]["resources"].update(accelerator="L4", gpus_per_node=1)
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert "no node pool offers L4" in r.json()["spec.resources.accelerator"][0]
    assert_nothing_stored()


@override_settings(JOB_SPEC_MAX_BYTES=2048)
def test_it_rejects_a_spec_over_the_size_limit_on_spec(teammate, aws_cluster, submission):
    submission["spec"]["env"] = {"BIG": "x" * 4096}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert "over the limit of 2048 bytes" in r.json()["spec"][0]
    assert_nothing_stored()


def test_it_rejects_a_spec_over_64_kib(teammate, aws_cluster, submission):
    submission["spec"]["env"] = {f"V{i}": "x" * 1000 for i in range(70)}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert "65536 bytes" in r.json()["spec"][0]
    assert_nothing_stored()


def test_it_rejects_a_body_that_is_not_an_object(teammate, aws_cluster):
    r = teammate.client.post(JOBS, ["not", "a", "job"], format="json")
    assert r.status_code == 400
    assert "non_field_errors" in r.json()
    assert_nothing_stored()


def test_it_rejects_malformed_yaml(teammate, aws_cluster):
    r = teammate.client.post(JOBS, data="team: [alpha\n", content_type="application/yaml")
    assert r.status_code == 400
    assert "YAML parse error" in r.json()["detail"]
    assert_nothing_stored()


def test_it_rejects_yaml_aliases(teammate, aws_cluster):
    document = "a: &x [1, 2]\nb: *x\n"
    r = teammate.client.post(JOBS, data=document, content_type="application/yaml")
    assert r.status_code == 400
    assert "aliases" in r.json()["detail"]


def test_it_accepts_inference_with_replicas_and_port(teammate, aws_cluster, submission):
    submission.update(kind="inference", name="serve")
    submission["spec"].update(replicas=2, port=8080)
    submission["spec"]["resources"]["nodes"] = 1  # 2 replicas x 1 node: they fit the 2 x 8 pool (ADR 0019)
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["spec"]["replicas"] == 2
    assert r.json()["spec"]["port"] == 8080


def paths_of(document) -> dict:
    with pytest.raises(ValidationError) as caught:
        JobSubmission.model_validate(document)  # no context: the structure and the kind rules only
    return error_paths(caught.value)


def test_error_paths_join_nested_paths():
    spec = {"image": "x", "command": ["x"], "resources": {"gpus_per_node": 1, "nodes": 0}, "max_runtime_seconds": 1}
    assert paths_of({"team": "alpha", "name": "ok", "spec": spec}) == {
        "spec.resources.nodes": ["Ensure this value is greater than or equal to 1."]}
    assert paths_of(["not", "a", "job"]) == {
        "non_field_errors": ["Invalid data. Expected a dictionary, but got list."]}
    # A rule of the submission (not a field's own check) is reported on the field it names.
    del spec["command"]
    spec.update(resources={"gpus_per_node": 1, "nodes": 1}, port=80)
    assert paths_of({"team": "alpha", "name": "ok", "spec": spec}) == {
        "spec.command": ["required unless args are given (the image's ENTRYPOINT then runs with them)"],
        "spec.port": ["port applies to inference jobs only"]}


def test_a_pool_emptied_by_sync_does_not_make_a_never_runnable_job_acceptable(
        settings, teammate, owner, alpha, aws_cluster, submission, h100):
    """A pool gone from the cluster but kept with 0 nodes (attempts refer to it) offers no GPUs; with no other pool
    the submission must get 'no node pool offers ...' (caching off: this is not about the cache).
    ResourcesSerializer.validate_accelerator's Max("node_pools__gpus_per_node") counts pools with nodes=0."""
    settings.LOOKUP_CACHE_SECONDS = 0
    job = make_job(alpha, owner.user, h100, name="old")
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    counts = apply_pools(aws_cluster["cluster"], [])
    assert counts["emptied"] == 1
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400, r.content


@pytest.mark.parametrize("priority", [["high"], {"high": 1}, 700, None, True, "high\x00"])
def test_a_priority_that_is_not_a_string_gets_400(cached, teammate, aws_cluster, submission, priority):
    submission["spec"]["priority"] = priority
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.priority" in r.json(), r.content
