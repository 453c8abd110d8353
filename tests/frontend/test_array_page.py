"""The page of a job array: status, counts, cost, grid and elements as the API gives them; cancel for who may; team
scoping (another team's array is a 404); the job page links an element to its array."""

from __future__ import annotations

import copy
import re

import pytest

from jobs.models import Job, JobArray, JobState
from jobs.scheduling.passes import schedule_pending
from tests.support.factories import VALID_SPEC, run
from tests.support.personas import signed_in

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")


@pytest.fixture
def sweep(teammate, cluster_factory, h100):
    cluster_factory("roomy", "aws", "us-east-1", h100, nodes=4, gpus_per_node=8, price="2.00")
    spec = copy.deepcopy(VALID_SPEC)
    spec["resources"].update(gpus_per_node=1, nodes=1)
    body = {"team": "alpha", "name": "lr-sweep", "kind": "training", "spec": spec,
            "array": {"grid": {"lr": [0.1, 0.2, 0.4], "bs": [8, 16]}, "parallelism": 2}}
    r = teammate.client.post("/api/v1/arrays/", body, format="json")
    assert r.status_code == 201, r.content
    schedule_pending()
    run(Job.objects.get(array_id=r.json()["id"], array_index=0))
    return JobArray.objects.get(pk=r.json()["id"])


def text_of(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert match, element_id
    return match.group(1).strip()


def test_the_page_shows_what_the_api_answers(teammate, sweep):
    api = teammate.client.get(f"/api/v1/arrays/{sweep.pk}/").json()
    html = signed_in(teammate).get(f"/arrays/{sweep.pk}/").content.decode()
    assert text_of(html, "array-status") == api["status"] == "running"
    assert text_of(html, "array-cost") == f"${api['cost_usd']}"
    for state, n in api["counts"].items():
        assert text_of(html, f"array-count-{state}") == str(n)
    assert (api["counts"]["running"], api["counts"]["admitted"], api["counts"]["queued"]) == (1, 1, 4)
    table = html[html.index('id="array-elements"'):]
    assert "lr-sweep-0" in table and "lr-sweep-1" in table and "lr-sweep-2" not in table  # 2 made
    assert "<li><code>lr</code>: 0.1, 0.2, 0.4</li>" in html
    assert 'id="array-cancel"' in html  # the submitter may cancel
    job_page = signed_in(teammate).get(f"/jobs/{Job.objects.get(array=sweep, array_index=1).pk}/").content.decode()
    assert f'href="/arrays/{sweep.pk}/"' in job_page and "Element 1 of" in job_page


def test_cancel_from_the_page_stops_every_element(teammate, sweep):
    client = signed_in(teammate)
    assert client.get(f"/arrays/{sweep.pk}/cancel/").status_code == 200
    assert client.post(f"/arrays/{sweep.pk}/cancel/").status_code == 302
    assert not Job.objects.filter(array=sweep, state__in=(JobState.QUEUED, JobState.RUNNING)).exists()
    assert JobArray.objects.get(pk=sweep.pk).state == JobArray.State.CANCELLED
    html = client.get(f"/arrays/{sweep.pk}/").content.decode()
    assert text_of(html, "array-status") == "cancelling" and 'id="array-cancel"' not in html


def test_only_the_team_sees_it_and_a_viewer_may_not_cancel(viewer, outsider, sweep):
    assert signed_in(outsider).get(f"/arrays/{sweep.pk}/").status_code == 404
    assert signed_in(outsider).post(f"/arrays/{sweep.pk}/cancel/").status_code == 404
    html = signed_in(viewer).get(f"/arrays/{sweep.pk}/").content.decode()
    assert 'id="array-cancel"' not in html
    assert signed_in(viewer).post(f"/arrays/{sweep.pk}/cancel/").status_code == 403
    assert JobArray.objects.get(pk=sweep.pk).state == JobArray.State.OPEN
