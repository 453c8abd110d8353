"""Lists that hide nothing: the job filter's "any" kind keeps inference jobs when filtering by state, the job list
shows each job's duration and cost, the dashboard lists the user's recent jobs in every state (a rejected one
included) and says what "use of limit" divides by."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.models import Job, JobState
from quotas.models import Quota
from tests.support.factories import make_attempt, make_job_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_pair(teams, owner, teammate, aws_cluster, h100):
    """A RUNNING training job and a RUNNING inference job of alpha, and a SUCCEEDED training job."""
    alpha = teams[0]
    training = make_job_row(alpha, teammate.user, h100, name="train", state=JobState.RUNNING)
    serving = make_job_row(alpha, teammate.user, h100, name="serve", kind="inference", state=JobState.RUNNING)
    done = make_job_row(alpha, teammate.user, h100, name="done", state=JobState.SUCCEEDED)
    return {"training": training, "serving": serving, "done": done}


def test_filtering_by_state_keeps_every_kind_on_the_page_and_in_the_api(teammate_web, running_pair):
    form = teammate_web.get("/jobs/").content.decode()
    select = form.split('name="kind"')[1].split("</select>")[0]
    assert select.index('value="any"') < select.index('value="training"'), select  # the form's default
    page = teammate_web.get("/jobs/?state=RUNNING&kind=any").content.decode()
    assert "#%d train" % running_pair["training"].pk in page and "#%d serve" % running_pair["serving"].pk in page
    assert "#%d done" % running_pair["done"].pk not in page
    listed = teammate_web.get("/api/v1/jobs/?state=RUNNING&kind=any").json()
    names = sorted(j["name"] for j in listed.get("results", listed))
    assert names == ["serve", "train"]
    only = teammate_web.get("/api/v1/jobs/?kind=inference").json()
    assert [j["name"] for j in only.get("results", only)] == ["serve"]
    bad = teammate_web.get("/api/v1/jobs/?kind=batch")
    assert bad.status_code == 400 and "any" in str(bad.json()["kind"]), bad.content


def test_the_job_list_shows_duration_and_cost(teammate_web, running_pair):
    started = timezone.now() - dt.timedelta(hours=3)
    Job.objects.filter(pk=running_pair["done"].pk).update(
        started_at=started, ended_at=started + dt.timedelta(hours=2, minutes=5, seconds=30),
        accrued_cost_usd=Decimal("14.305"))  # half to even: 14.30
    page = teammate_web.get("/jobs/").content.decode()
    row = page.split("#%d done" % running_pair["done"].pk)[1].split("</tr>")[0]
    assert "<td>2 h 05 min</td>" in row and "<td>$14.30</td>" in row, row
    queued = page.split("#%d train" % running_pair["training"].pk)[1].split("</tr>")[0]
    assert "<td>—</td>" in queued and "<td>$0.00</td>" in queued, queued  # never started, nothing billed
    assert "<th scope=\"col\">Duration</th>" in page and "<th scope=\"col\">Cost</th>" in page


def test_the_job_lists_caption_says_the_order_it_shows(teammate_web, running_pair):
    assert "<caption>Jobs, newest first" in teammate_web.get("/jobs/").content.decode()
    page = teammate_web.get("/jobs/", {"ordering": "-priority"}).content.decode()
    assert "<caption>Jobs, highest priority first" in page and "newest first" not in page
    assert "<caption>Jobs, oldest first" in teammate_web.get("/jobs/", {"ordering": "created_at"}).content.decode()


def test_the_dashboard_lists_my_rejected_job_and_not_other_peoples(teammate_web, teammate, owner, teams, h100):
    alpha = teams[0]
    rejected = make_job_row(alpha, teammate.user, h100, name="too-expensive",
                            state=JobState.REJECTED, state_reason="estimated $9.00 is over the whole budget of $5.00")
    other = make_job_row(alpha, owner.user, h100, name="owners-own", state=JobState.SUCCEEDED)
    page = teammate_web.get("/").content.decode()
    recent = page.split('id="recent-jobs"')[1].split("</table>")[0]
    assert "#%d too-expensive" % rejected.pk in recent and "REJECTED" in recent, recent
    assert "over the whole budget of $5.00" in recent
    assert "#%d owners-own" % other.pk not in recent


def test_use_of_limit_names_what_it_divides_by(teammate_web, teammate, teams, h100, aws_cluster):
    alpha, beta = teams
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=4, borrowing_limit_gpus=4)
    Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=2)  # all beta can lend: 2
    job = make_job_row(alpha, teammate.user, h100, name="two", gpus_per_node=2)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    page = teammate_web.get("/").content.decode()
    table = page.split('class="quota-use"')[1].split("</table>")[0]
    # alpha can reach 4 nominal + min(4 borrowing, 2 lendable) = 6 GPUs; 2 in use is 33 % of them.
    assert '<th scope="col">Limit it can reach</th>' in table and "<td>6 GPUs</td>" in table, table
    assert "33 % of 6 GPUs" in table, table


def test_one_gpu_in_use_reads_in_the_singular(teammate_web, teammate, teams, h100, aws_cluster):
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=4)
    job = make_job_row(teams[0], teammate.user, h100, name="one", gpus_per_node=1)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    table = teammate_web.get("/").content.decode().split('class="quota-use"')[1].split("</table>")[0]
    assert "<td>1 GPU</td>" in table and "1 GPUs" not in table, table
