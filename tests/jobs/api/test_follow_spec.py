"""``spec.follow``: a serving job follows a training job (by name: every run of it; by id: that job). The API
starts it from the newest SUCCEEDED run, refuses on the field's path what it cannot follow, and refuses a training
run that would wait for a server following it (a cycle)."""

from __future__ import annotations

import copy

import pytest

from jobs.models import Job, JobDependency, JobState
from tests.support.factories import make_job_row

from .test_checkpoint_from import JOBS, serving, trained  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")


@pytest.fixture
def server(serving):  # noqa: F811 - the fixture imported above
    """A serving job of ``examples/serve.py`` (a checkpoint loader) for alpha, without a checkpoint named."""
    serving["spec"].update(command=["python", "examples/serve.py"], args=["--host", "0.0.0.0"])
    return serving


@pytest.fixture
def runs(trained, teams, teammate, h100):  # noqa: F811 - the fixture imported above
    """alpha's runs of train-gpt, ids growing: SUCCEEDED, FAILED (``trained``'s), SUCCEEDED, RUNNING; and beta's
    SUCCEEDED one."""
    first, failed, other = trained
    second = make_job_row(teams[0], teammate.user, h100, name="train-gpt", state=JobState.SUCCEEDED)
    return first, second, make_job_row(teams[0], teammate.user, h100, name="train-gpt", state=JobState.RUNNING), other


def test_a_follower_by_name_starts_from_the_newest_succeeded_run_and_shows_what_it_follows(
        teammate, aws_cluster, server, runs):
    first, second, third, _ = runs
    server["spec"]["follow"] = {"job": "train-gpt"}
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["spec"]["follow"] == {"job": "train-gpt"}
    assert body["spec"]["checkpoint_from"] == second.pk  # the newest SUCCEEDED, not the RUNNING third
    shown = teammate.client.get(f"{JOBS}{body['id']}/").json()["serving"]["follow"]
    assert shown == {"job": "train-gpt", "newest_run": second.pk}
    # an older checkpoint_from gives way to the newest run: a follower serves the newest
    server["spec"]["checkpoint_from"] = first.pk
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 201 and r.json()["spec"]["checkpoint_from"] == second.pk
    # following one job still running (a pipeline's training step), it serves what checkpoint_from names meanwhile
    server["spec"]["follow"] = {"job": third.pk}
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 201 and r.json()["spec"]["checkpoint_from"] == first.pk


def test_a_follower_of_a_run_not_succeeded_yet_must_wait_for_it(teammate, aws_cluster, server, runs,
                                                                  trained):  # noqa: F811 - a fixture
    third = runs[2]
    server["spec"]["follow"] = {"job": third.pk}
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 400, r.content
    assert list(r.json()) == ["spec.follow.job"]
    assert f"no run of {third.pk} has SUCCEEDED yet" in r.json()["spec.follow.job"][0]
    server["spec"]["follow"] = {"job": trained[1].pk}  # FAILED: no run of it ever succeeds
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 400 and f"ended FAILED and no run of {trained[1].pk} has SUCCEEDED" in r.json()[
        "spec.follow.job"][0]
    server["spec"]["follow"] = {"job": third.pk}
    server["after"] = [{"job": third.pk}]
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["spec"]["checkpoint_from"] == third.pk and r.json()["spec"]["follow"] == {"job": third.pk}


def test_the_stored_spec_of_a_server_that_follows_nothing_has_no_follow(teammate, aws_cluster, server, runs):
    server["spec"]["checkpoint_from"] = "train-gpt"
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 201 and "follow" not in r.json()["spec"]
    assert teammate.client.get(f"{JOBS}{r.json()['id']}/").json()["serving"]["follow"] is None


@pytest.mark.parametrize("ref, path, fragment", [
    ("no-such-job", "spec.follow.job", 'no training job named "no-such-job" in team "alpha"'),
    ("other-team", "spec.follow.job", "no job"),
    ("inference", "spec.follow.job", "is not a training job (inference); follow names a training job"),
    ("own-location", "spec.follow.job", "writes its checkpoint where its --checkpoint-dir says"),
    ("server-names-its-checkpoint", "spec.follow", "remove --checkpoint-dir"),
    (0, "spec.follow.job", "Expected a job id"),
])
def test_it_refuses_what_it_cannot_follow_on_the_field(teammate, aws_cluster, server, runs, teams, h100, ref, path,
                                                       fragment):
    if ref == "other-team":
        ref = runs[3].pk
    elif ref == "inference":
        ref = make_job_row(teams[0], teammate.user, h100, name="serve-old", kind="inference").pk
    elif ref == "own-location":
        spec = {"command": ["python", "examples/train_gpt.py"], "args": ["--checkpoint-dir=/data/mine"]}
        ref = make_job_row(teams[0], teammate.user, h100, name="train-elsewhere", state=JobState.SUCCEEDED,
                           spec=spec).name
    elif ref == "server-names-its-checkpoint":
        server["spec"]["args"] = ["--checkpoint-dir", "/data/model"]
        ref = "train-gpt"
    before = Job.objects.count()
    server["spec"]["follow"] = {"job": ref}
    r = teammate.client.post(JOBS, server, format="json")
    assert r.status_code == 400, r.content
    assert any(fragment in m for m in r.json()[path]), r.json()
    assert Job.objects.count() == before


def test_a_training_job_cannot_follow(teammate, aws_cluster, submission, runs):
    submission["spec"]["follow"] = {"job": "train-gpt"}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert r.json()["spec.follow"] == ["follow applies to inference jobs only"]


def test_a_run_that_would_wait_for_a_server_following_it_is_refused_as_a_cycle(teammate, aws_cluster, server,
                                                                               submission, runs):
    server["spec"]["follow"] = {"job": "train-gpt"}
    server = teammate.client.post(JOBS, server, format="json").json()["id"]
    # an evaluation that waits for the server, and a run of train-gpt that waits for the evaluation
    evaluation = copy.deepcopy(submission)
    evaluation.update(name="evaluate", after=[{"job": server, "condition": "ended"}])
    evaluate = teammate.client.post(JOBS, evaluation, format="json")
    assert evaluate.status_code == 201, evaluate.content
    for upstream in (server, evaluate.json()["id"]):
        run = copy.deepcopy(submission)
        run.update(name="train-gpt", after=[{"job": runs[1].pk}, {"job": upstream, "condition": "ended"}])
        before = Job.objects.count()
        r = teammate.client.post(JOBS, run, format="json")
        assert r.status_code == 400, r.content
        assert list(r.json()) == ["after.1.job"]
        assert f"job {server} (serve) follows the runs of train-gpt" in r.json()["after.1.job"][0]
        assert Job.objects.count() == before and not JobDependency.objects.filter(job__name="train-gpt").exists()
    # a run of another name may wait for it
    run = copy.deepcopy(submission)
    run.update(name="train-other", after=[{"job": server, "condition": "ended"}])
    assert teammate.client.post(JOBS, run, format="json").status_code == 201
