"""Resubmitting a job: ``POST /api/v1/jobs/{id}/resubmit/`` submits the job's stored submission again as a new job
of its team, by the caller, validated like any submission; ``cpctl resubmit`` and the web form's ``?from=`` carry
the same document. The expected specs are the stored spec of the job resubmitted, read from the database."""

from __future__ import annotations

import pytest
import yaml
from django.urls import reverse

from jobs.models import Job, JobState
from quotas.models import Quota
from tests.jobs.api.test_jobs_endpoint import example_yaml
from tests.support.personas import signed_in

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"


def submitted(client, example: str) -> Job:
    r = client.post(JOBS, data=example_yaml(example), content_type="application/yaml")
    assert r.status_code == 201, r.content
    return Job.objects.get(pk=r.json()["id"])


@pytest.mark.parametrize("example", ["train-gpt.yaml", "serve-gpt.yaml"])
def test_a_resubmission_is_a_new_queued_job_with_the_same_spec_by_the_caller(teammate, owner, aws_cluster, example):
    if example == "serve-gpt.yaml":
        submitted(teammate.client, "train-gpt.yaml")  # the checkpoint the serving example names
    first = submitted(teammate.client, example)
    r = owner.client.post(f"{JOBS}{first.pk}/resubmit/", {}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["id"] != first.pk and body["state"] == JobState.QUEUED
    assert r["Location"] == f"http://testserver{reverse('job-detail', kwargs={'pk': body['id']})}"
    again = Job.objects.get(pk=body["id"])
    assert (again.team_id, again.name, again.kind, again.spec) == (first.team_id, first.name, first.kind, first.spec)
    assert again.submitter == owner.user
    assert Job.objects.get(pk=first.pk).state == first.state  # the job itself is not changed


def test_a_resubmission_may_take_a_new_name_and_a_bad_one_is_a_400_on_name(teammate, aws_cluster):
    first = submitted(teammate.client, "train-gpt.yaml")
    r = teammate.client.post(f"{JOBS}{first.pk}/resubmit/", {"name": "second-try"}, format="json")
    assert r.status_code == 201 and r.json()["name"] == "second-try"
    count = Job.objects.count()
    r = teammate.client.post(f"{JOBS}{first.pk}/resubmit/", {"name": "Not A Name!"}, format="json")
    assert r.status_code == 400 and "name" in r.json(), r.content
    assert Job.objects.count() == count


def test_a_resubmission_is_checked_against_todays_rules(teammate, aws_cluster):
    """The team lost its H100 quota since: a job that fit then is refused now, on the same field a new submission
    is refused on, and nothing is stored."""
    first = submitted(teammate.client, "train-gpt.yaml")
    fresh = teammate.client.post(JOBS, data=example_yaml("train-gpt.yaml"), content_type="application/yaml")
    Quota.objects.filter(team__slug="alpha").delete()
    refused_new = teammate.client.post(JOBS, data=example_yaml("train-gpt.yaml"), content_type="application/yaml")
    count = Job.objects.count()
    r = teammate.client.post(f"{JOBS}{first.pk}/resubmit/", {}, format="json")
    assert fresh.status_code == 201
    assert (r.status_code, set(r.json())) == (refused_new.status_code, set(refused_new.json())), r.content
    assert r.status_code == 400
    assert Job.objects.count() == count


def test_a_viewer_sees_the_job_but_may_not_resubmit_it(teammate, viewer, aws_cluster):
    first = submitted(teammate.client, "train-gpt.yaml")
    assert viewer.client.get(f"{JOBS}{first.pk}/").status_code == 200
    count = Job.objects.count()
    r = viewer.client.post(f"{JOBS}{first.pk}/resubmit/", {}, format="json")
    assert r.status_code == 403 and "viewer" in r.json()["detail"]
    assert Job.objects.count() == count


def test_the_submit_form_opens_with_the_jobs_submission_and_submits_it(teammate, aws_cluster):
    """``/jobs/new/?from=<id>``: the YAML box holds the job's submission; posting the form as it opened stores a
    new job with the same spec. Another team's job or a malformed id is a 404."""
    first = submitted(teammate.client, "train-gpt.yaml")
    web = signed_in(teammate)
    page = web.get(f"/jobs/new/?from={first.pk}")
    assert page.status_code == 200
    form = page.context["form"]
    document = yaml.safe_load(form.initial["spec_yaml"])
    assert (document["team"], document["name"], document["kind"]) == ("alpha", first.name, first.kind)
    r = web.post("/jobs/new/", {"team": "alpha", "spec_yaml": form.initial["spec_yaml"]})
    assert r.status_code == 302, r.content[:2000]
    again = Job.objects.latest("pk")
    assert again.pk != first.pk and again.spec == first.spec
    assert web.get("/jobs/new/?from=x1").status_code == 404
    assert web.get(f"/jobs/new/?from={again.pk + 1000}").status_code == 404


def test_the_job_page_offers_a_resubmit_to_members_only(teammate, viewer, aws_cluster):
    first = submitted(teammate.client, "train-gpt.yaml")
    link = f"/jobs/new/?from={first.pk}"
    assert link in signed_in(teammate).get(f"/jobs/{first.pk}/").content.decode()
    viewed = signed_in(viewer).get(f"/jobs/{first.pk}/")
    assert viewed.status_code == 200 and link not in viewed.content.decode()
