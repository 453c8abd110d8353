"""``spec.checkpoint_from``: a serving job names the training job whose checkpoint it loads, by id or by name;
the API stores the id and refuses what is not a training job of the team, on the field's path."""

from __future__ import annotations

import copy

import pytest

from jobs.models import Job, JobState
from tests.support.factories import make_job_row

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"


@pytest.fixture
def serving(submission):
    document = copy.deepcopy(submission)
    document.update(kind="inference", name="serve")
    document["spec"]["resources"].update(nodes=1, gpus_per_node=1)
    return document


@pytest.fixture
def trained(teams, teammate, h100):
    """alpha's training jobs named train-gpt: an older SUCCEEDED one and a newer FAILED one, and beta's."""
    old = make_job_row(teams[0], teammate.user, h100, name="train-gpt", state=JobState.SUCCEEDED)
    new = make_job_row(teams[0], teammate.user, h100, name="train-gpt", state=JobState.FAILED)
    other = make_job_row(teams[1], teammate.user, h100, name="train-gpt", state=JobState.SUCCEEDED)
    return old, new, other


def test_a_serving_job_names_its_training_job_by_name_and_the_id_is_stored(teammate, aws_cluster, serving, trained):
    old, new, _ = trained
    serving["spec"]["checkpoint_from"] = "train-gpt"
    r = teammate.client.post(JOBS, serving, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["spec"]["checkpoint_from"] == old.pk  # the latest SUCCEEDED one, not the newer failed one
    serving["spec"]["checkpoint_from"] = new.pk
    r = teammate.client.post(JOBS, serving, format="json")
    assert r.status_code == 201 and r.json()["spec"]["checkpoint_from"] == new.pk


def test_without_it_the_stored_spec_says_null(teammate, aws_cluster, serving):
    r = teammate.client.post(JOBS, serving, format="json")
    assert r.status_code == 201 and r.json()["spec"]["checkpoint_from"] is None


@pytest.mark.parametrize("ref, fragment", [
    ("no-such-job", 'no training job named "no-such-job" in team "alpha"'),
    ("other-team", "no job"), ("inference", "is an inference job"), (True, "Expected a job id"),
    (0, "Expected a job id"), (" ", "Expected a job id"), ([1], "Expected a job id"),
])
def test_it_refuses_what_is_not_a_training_job_of_the_team(teammate, aws_cluster, serving, trained, teams, ref,
                                                          fragment, h100):
    if ref == "other-team":
        ref = trained[2].pk
    elif ref == "inference":
        ref = make_job_row(teams[0], teammate.user, h100, name="serve-old", kind="inference").pk
    before = Job.objects.count()
    serving["spec"]["checkpoint_from"] = ref
    r = teammate.client.post(JOBS, serving, format="json")
    assert r.status_code == 400, r.content
    assert any(fragment in m for m in r.json()["spec.checkpoint_from"]), r.json()
    assert Job.objects.count() == before


def test_a_training_job_cannot_name_one(teammate, aws_cluster, submission, trained):
    submission["spec"]["checkpoint_from"] = trained[0].pk
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert r.json()["spec.checkpoint_from"] == ["checkpoint_from applies to inference jobs only"]


def test_the_checkpoint_server_without_a_checkpoint_is_refused_on_checkpoint_from(teammate, aws_cluster, serving,
                                                                                   trained):
    serving["spec"].update(command=["python", "examples/serve.py"], args=["--host", "0.0.0.0"])
    r = teammate.client.post(JOBS, serving, format="json")
    assert r.status_code == 400
    assert list(r.json()) == ["spec.checkpoint_from"]
    assert "examples/serve.py loads a checkpoint before it serves" in r.json()["spec.checkpoint_from"][0]
    assert not Job.objects.filter(kind="inference").exists()
    serving["spec"]["checkpoint_from"] = "train-gpt"
    assert teammate.client.post(JOBS, serving, format="json").status_code == 201
    given = copy.deepcopy(serving)
    del given["spec"]["checkpoint_from"]
    given["spec"]["args"] = ["--checkpoint-uri=file:///data/ckpt"]
    assert teammate.client.post(JOBS, given, format="json").status_code == 201  # a checkpoint given directly


def test_a_serving_job_on_several_nodes_is_refused_on_nodes(teammate, aws_cluster, serving):
    serving["spec"]["resources"]["nodes"] = 2
    r = teammate.client.post(JOBS, serving, format="json")
    assert r.status_code == 400
    assert list(r.json()) == ["spec.resources.nodes"]
    assert "an inference server runs on one node, so nodes must be 1 (got 2)" in r.json()["spec.resources.nodes"][0]
    assert not Job.objects.exists()
