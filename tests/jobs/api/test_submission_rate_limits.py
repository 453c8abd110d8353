"""Job submissions are rate limited per submitting user (300 a minute by default) and per team (1,200 a minute,
configurable): past a rate the API answers 429 with Retry-After and the web form shows the form again, 429, with
the reason. A user's submissions count before the body is read, bad ones included; a team's only once the
submission is valid, so naming a team one cannot submit to never uses up its rate."""

from __future__ import annotations

import pytest

from jobs.models import Job
from tests.support.personas import signed_in

pytestmark = pytest.mark.usefixtures("alpha_h100_quota", "aws_cluster", "redis_broker")

JOBS = "/api/v1/jobs/"


def test_a_users_submissions_are_limited_per_minute_bad_ones_included(teammate, owner, submission):
    for _ in range(300):
        assert teammate.client.post(JOBS, {}, format="json").status_code == 400
    refused = teammate.client.post(JOBS, submission, format="json")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert not Job.objects.exists()
    assert owner.client.post(JOBS, submission, format="json").status_code == 201  # another user of the team
    assert teammate.client.get(JOBS).status_code == 200  # reading is not a submission


def test_a_teams_submissions_are_limited_once_valid_and_never_by_outsiders(
    owner, teammate, outsider, submission, settings
):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "submit_team": "3/min"},
    }
    for _ in range(5):
        assert outsider.client.post(JOBS, submission, format="json").status_code == 400  # not alpha's member
        assert owner.client.post(JOBS, {**submission, "name": "Not A Name"}, format="json").status_code == 400
    for persona in (owner, teammate, owner):
        assert persona.client.post(JOBS, submission, format="json").status_code == 201
    refused = teammate.client.post(JOBS, submission, format="json")
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("Too many submissions for team alpha.")
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert Job.objects.count() == 3


def test_the_web_form_counts_the_same_submissions(teammate):
    web = signed_in(teammate)
    for _ in range(300):
        assert web.post("/jobs/new/", {"spec_yaml": "team: alpha"}).status_code == 200  # refused, the form again
    refused = web.post("/jobs/new/", {"spec_yaml": "team: alpha"})
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert b"Too many submissions: you sent more than the rate allows." in refused.content
    assert b"team: alpha" in refused.content  # what was typed is kept
