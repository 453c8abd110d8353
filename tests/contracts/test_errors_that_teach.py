"""Bad query parameters and bodies answer with what would have worked: comma lists where the CLI takes them, the
valid choices, the datetime format (and the ``%2B`` hint when an offset's ``+`` arrived as a space), and the media
types a 415 accepts."""

from __future__ import annotations

import pytest

from jobs.models import Job, JobState
from tests.support.factories import make_job_row

JOBS = "/api/v1/jobs/"


@pytest.fixture
def finished(teams, owner, h100):
    """alpha's jobs: one SUCCEEDED, one CANCELLED, one FAILED."""
    return {state: make_job_row(teams[0], owner.user, h100, name=state.lower(), state=state)
            for state in (JobState.SUCCEEDED, JobState.CANCELLED, JobState.FAILED)}


def names(response) -> set[str]:
    assert response.status_code == 200, response.content
    return {row["name"] for row in response.json()["results"]}


def test_state_takes_a_comma_list_as_the_cli_does_and_repeats_too(owner, finished):
    assert names(owner.client.get(JOBS + "?state=SUCCEEDED,CANCELLED")) == {"succeeded", "cancelled"}
    assert names(owner.client.get(JOBS + "?state=succeeded&state=failed")) == {"succeeded", "failed"}


def test_an_unknown_state_lists_the_valid_ones(owner, finished):
    r = owner.client.get(JOBS + "?state=SUCCEEDED,SLEEPING")
    assert r.status_code == 400
    (message,) = r.json()["state"]
    assert message.startswith("unknown SLEEPING; one of QUEUED, ADMITTED,")
    assert all(state in message for state in JobState.values)
    r = owner.client.get(JOBS + "?kind=batch")
    assert r.json() == {"kind": ['unknown value "batch"; one of any, training, inference, multi-role']}


def test_group_by_lists_the_valid_choices(owner):
    for path, choices in (("/api/v1/costs/", "team, cluster, accelerator, job, attempt, day"),
                          ("/api/v1/utilization/", "team, cluster, accelerator, job, attempt, day, node")):
        r = owner.client.get(path, {"group_by": "week"})
        assert r.status_code == 400
        assert r.json()["group_by"] == [f'"week" is not a valid choice; one of {choices}']


@pytest.mark.parametrize("path, name", [("/api/v1/costs/", "start"), (JOBS, "created_after")])
def test_an_offset_whose_plus_arrived_as_a_space_says_to_encode_it(owner, path, name):
    r = owner.client.get(f"{path}?{name}=2026-11-01T00:00:00+01:00")  # a literal "+" in a URL is a space
    assert r.status_code == 400
    (message,) = r.json()[name]
    assert "%2B" in message and "2026-11-01T00:00:00%2B01:00" in message
    encoded = owner.client.get(f"{path}?{name}=2026-11-01T00:00:00%2B01:00")
    assert encoded.status_code == 200


@pytest.mark.parametrize("path, name", [("/api/v1/costs/", "start"), (JOBS, "created_after")])
def test_a_bad_datetime_names_the_format(owner, path, name):
    r = owner.client.get(path, {name: "yesterday"})
    assert r.status_code == 400
    (message,) = r.json()[name]
    assert "YYYY-MM-DDThh:mm" in message and "2026-11-01T00:00:00Z" in message and "%2B" not in message


@pytest.mark.parametrize("path, name", [("/api/v1/costs/", "start"), (JOBS, "created_after")])
def test_a_bad_date_says_a_plain_date_is_taken_too(owner, path, name):
    r = owner.client.get(path, {name: "2026-13-01"})  # no 13th month
    assert r.status_code == 400
    (message,) = r.json()[name]
    assert "or a date YYYY-MM-DD (its midnight UTC)" in message, message
    assert owner.client.get(path, {name: "2026-11-01"}).status_code == 200


def test_yaml_without_its_content_type_answers_415_naming_what_is_accepted(owner, aws_cluster):
    before = Job.objects.count()
    body = b"team: alpha\nname: x\n"
    r = owner.client.generic("POST", JOBS, body, content_type="application/x-www-form-urlencoded")  # curl's default
    assert r.status_code == 415
    detail = r.json()["detail"]
    assert 'unsupported media type "application/x-www-form-urlencoded"' in detail
    for accepted in ("application/json", "application/yaml", "text/yaml"):
        assert accepted in detail
    assert 'curl -H "Content-Type: application/yaml"' in detail
    assert Job.objects.count() == before


def test_an_unknown_choice_in_a_submission_lists_the_valid_ones(owner, submission, funded_aws_cluster):
    bad = {**submission, "kind": "batch"}
    r = owner.client.post(JOBS, bad, format="json")
    assert r.status_code == 400
    assert r.json() == {"kind": [f'"batch" is not a valid choice; one of {", ".join(Job.Kind.values)}']}
    assert not Job.objects.exists()
