"""Words a person reads on a job's pages: the submit form's error for an empty Command box says what to type, the
log hint points rank 0 and the other nodes the right way and knows a finished job prints nothing more, timeline
lines are sentences, and the state a page shows is the one its timeline ends on."""

from __future__ import annotations

import re

import pytest

from jobs.models import Job, JobState
from jobs.states import transition
from tests.frontend.test_views import form_data
from tests.support.factories import make_attempt, make_job

pytestmark = pytest.mark.django_db


def test_an_empty_command_box_says_what_to_type(teammate_web, alpha_objects):
    page = teammate_web.post("/jobs/new/", form_data(command="  ")).content.decode()
    assert "Type the command the job runs, as you would in a shell, e.g. python train.py --steps 10." in page
    assert "non-empty list of strings" not in page
    preview = teammate_web.post("/jobs/new/preview/", form_data(command="")).content.decode()
    assert "Command: Type the command the job runs" in preview, preview


def test_the_submit_form_help_names_no_python_object(teammate_web, alpha_objects):
    page = teammate_web.get("/jobs/new/").content.decode()
    helps = re.findall(r'<small id="[^"]*_helptext" class="help">([^<]*)</small>', page)
    assert any("its estimate then counts 30 days" in h for h in helps), helps  # 30 x 24 h for a serving job
    dotted = [h for h in helps if re.search(r"\b[a-z_]+\.[a-z_]+\.[A-Za-z_]+\b", h)]
    assert dotted == [], dotted


def test_the_log_hint_points_each_node_the_right_way(owner_web, funded_local_cluster, teams, owner):
    pool = funded_local_cluster.node_pools.get(name="gpu")
    job = make_job(teams[0], owner.user, pool.accelerator, name="quiet", nodes=2)
    make_attempt(job, funded_local_cluster, pool)  # no process: nothing logged on either node
    rank0 = owner_web.get(f"/jobs/{job.pk}/logs/?node=0").content.decode()
    assert "Node 0 has printed nothing yet." in rank0 and "pick another node" not in rank0
    assert "only rank 0 prints" not in rank0 and "Another node may have printed: pick one above." in rank0
    rank1 = owner_web.get(f"/jobs/{job.pk}/logs/?node=1").content.decode()
    assert "Node 1 has printed nothing yet. In distributed training often only rank 0 prints: pick node 0 above." \
        in rank1, rank1
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    ended = owner_web.get(f"/jobs/{job.pk}/logs/?node=1").content.decode()
    assert "Node 1 has printed nothing in this attempt." in ended and "yet" not in ended.split('id="log-empty"')[1]


def test_timeline_lines_are_sentences(owner_web, funded_local_cluster, teams, owner):
    pool = funded_local_cluster.node_pools.get(name="gpu")
    job = make_job(teams[0], owner.user, pool.accelerator, name="lines")
    attempt = make_attempt(job, funded_local_cluster, pool, state=JobState.STARTING)
    transition(job, JobState.RUNNING, reason="all nodes running", attempt=attempt)
    page = owner_web.get(f"/jobs/{job.pk}/status/").content.decode()
    timeline = page.split('class="timeline"')[1]
    assert "Submitted by owner." in timeline, timeline
    assert "<em>submitted</em>" not in timeline  # the sentence says it
    assert "All nodes running." in timeline and "all nodes running<" not in timeline


def test_a_job_page_shows_the_state_its_timeline_ends_on(owner_web, teams, owner, h100, alpha_h100_quota):
    """The page reads the job and then its timeline; a change in between must not show QUEUED above an ADMITTED
    line: the timeline is cut at the newest event the job row was read with."""
    from frontend.views import _job_status_context, _visible_job

    job = make_job(teams[0], owner.user, h100, name="racing")
    request = type("Request", (), {"user": owner.user})()
    read = _visible_job(request, job.pk)  # the page's read: QUEUED
    moved = Job.objects.get(pk=job.pk)
    transition(moved, JobState.ADMITTED, reason="admitted on aws")  # the scheduler, after the page read the job
    context = _job_status_context(read, owner.user)
    states = [e.to_state for e in context["events"] if e.to_state]
    assert context["job"].state == JobState.QUEUED and JobState.ADMITTED not in states, states
    page = owner_web.get(f"/jobs/{job.pk}/status/").content.decode()  # read afresh: both say ADMITTED
    assert 'id="job-state">ADMITTED<' in page and "Admitted on aws." in page


