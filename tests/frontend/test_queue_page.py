"""The Queue page in Chromium: the positions, fair share, borrowing, what each job waits for and why a later job
went ahead, as a person reads them, checked against the jobs API and against values worked out by hand from a
real scheduling pass on two nodes whose other tenants hold 4 of their 8 GPUs each."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from jobs.models import JobState
from jobs.scheduling.passes import schedule_pending
from quotas.models import Quota
from runners.models import Node
from tests.support.factories import make_job_row
from tests.support.personas import signed_in

from .conftest import shoot, sign_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(aws_cluster, teams, teammate, outsider, h100):
    """alpha (nominal 8 + 10 borrowing) submits a 2 x 8 GPU job, beta (nominal 8) an 8-GPU job, then alpha a 1-GPU
    job and an 8-GPU one; each node has 4 GPUs free. One pass: the 1-GPU job is admitted, the rest wait."""
    alpha, beta = teams
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=8, borrowing_limit_gpus=10)
    Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=8)
    for i in range(2):
        Node.objects.create(cluster=aws_cluster["cluster"], node_pool=aws_cluster["pool"], name=f"n{i}", gpus=8,
                            cpu_milli=32000, memory_mib=256 * 1024, seen_at=timezone.now(), foreign_gpus=4)
    jobs = {"head": make_job_row(alpha, teammate.user, h100, name="head", gpus_per_node=8, nodes=2),
            "beta": make_job_row(beta, outsider.user, h100, name="beta-one", gpus_per_node=8),
            "small": make_job_row(alpha, teammate.user, h100, name="small", gpus_per_node=1),
            "third": make_job_row(alpha, teammate.user, h100, name="third", gpus_per_node=8)}
    result = schedule_pending()
    assert result.admitted == [jobs["small"].pk]
    return jobs


def cell(page, job, col: str) -> str:
    return " ".join(page.locator(f"#queue-job-{job.pk} [data-col={col}]").inner_text().split())


def test_the_queue_page_reads_as_the_api_and_the_pass_say(live_server, page, queue, staff):
    small = queue["small"]
    # by hand: the queue's order is submission (one priority): head, beta, third wait; small was admitted, so
    # alpha uses 1 GPU: head (16) would borrow 1 + 16 - 8 = 9, third (8) 1 + 8 - 8 = 1; beta uses none of its 8
    expected = {
        "head": {"overall": "1", "team-position": "1", "borrowing": "yes: 9 GPUs above nominal",
                 "waits-for": "free GPUs",
                 "overtaken": f"Job {small.pk} (1 GPU) was admitted ahead because it fits now; this job needs 2 "
                              f"nodes with 8 GPUs free."},
        "beta": {"overall": "2", "team-position": "1", "borrowing": "no: within nominal quota",
                 "waits-for": "free GPUs",
                 "overtaken": f"Job {small.pk} (1 GPU) was admitted ahead because it fits now; this job needs 1 "
                              f"node with 8 GPUs free."},
        "third": {"overall": "3", "team-position": "2", "borrowing": "yes: 1 GPU above nominal",
                  "waits-for": "free GPUs"},
    }
    api = signed_in(staff).get("/api/v1/jobs/", {"state": "QUEUED"}).json()["results"]
    by_id = {j["id"]: j for j in api}
    sign_in(page, live_server.url, "staff")
    page.get_by_role("link", name="Queue").click()
    expect(page.get_by_role("heading", name="Queue")).to_be_visible()
    assert " ".join(page.locator("#queue-count").inner_text().split()) == "3 jobs waiting."
    for name, want in expected.items():
        job = queue[name]
        shown = {col: cell(page, job, col) for col in ("overall", "team-position", "borrowing", "waits-for")}
        assert shown == {k: v for k, v in want.items() if k != "overtaken"}, name
        position = by_id[job.pk]["queue_info"]["position"]
        assert (int(shown["overall"]), int(shown["team-position"])) == (position["overall"], position["team"])
        assert cell(page, job, "why").startswith(by_id[job.pk]["queue_info"]["message"][:60])
        if "overtaken" in want:
            assert cell(page, job, "overtaken") == want["overtaken"] == by_id[job.pk]["queue_info"]["overtaken"]
        else:
            expect(page.locator(f"#queue-job-{job.pk} [data-col=overtaken]")).to_have_count(0)
    # alpha used 1 GPU (the small job) of its 8 nominal
    assert cell(page, queue["head"], "share") == "uses 1 of 8 GPUs nominal (+10 borrowing limit), weight 1, BestEffortFIFO"
    expect(page.locator(f"#queue-job-{small.pk}")).to_have_count(0)
    shoot(page, "queue")


def test_a_member_sees_only_their_teams_waiting_jobs(live_server, page, queue, teammate):
    sign_in(page, live_server.url, "teammate")
    page.goto(f"{live_server.url}/queue/")
    expect(page.locator(f"#queue-job-{queue['head'].pk}")).to_have_count(1)
    expect(page.locator(f"#queue-job-{queue['beta'].pk}")).to_have_count(0)
    assert queue["head"].state == JobState.QUEUED


def test_borrowing_is_the_part_above_nominal_and_says_when_the_limit_is_in_the_way():
    from frontend.queue_pages import borrowing_text

    share = {"unit": "GPUs", "used": 6, "nominal": 8, "borrowing_limit": 4, "quota": True}
    assert borrowing_text(2, share) == "no: within nominal quota"
    assert borrowing_text(3, share) == "yes: 1 GPU above nominal"
    assert borrowing_text(6, share) == "yes: 4 GPUs above nominal"
    assert borrowing_text(7, share) == ("it would need 5 GPUs above nominal, more than the team's borrowing limit of "
                                        "4 allows now")
    assert borrowing_text(2, {**share, "unit": "vCPU", "quota": False}) == "no: quota-free"
