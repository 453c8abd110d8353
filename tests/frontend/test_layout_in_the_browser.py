"""What a user sees laid out, in headless Chromium against a live server: the dashboard's running-jobs table spans
the page, not half of it, and a training job's throughput chart is drawn at a readable width."""

from __future__ import annotations

from playwright.sync_api import expect

from jobs.models import JobState
from tests.support.factories import make_attempt, make_cluster, make_job, make_workload_metrics

from .conftest import shoot, sign_in


def test_the_dashboards_running_jobs_table_spans_the_page(live_server, page, teams, owner, aws_cluster, h100):
    job = make_job(teams[0], owner.user, h100, name="wide-enough")
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], state=JobState.RUNNING)
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/")
    running = page.locator("section[aria-labelledby='running-h'] table")
    expect(running).to_contain_text("wide-enough")
    main = page.locator("main").bounding_box()
    table = running.bounding_box()
    # main has 1em padding on each side; the table takes the whole content width, not half of it.
    assert table["width"] >= 0.9 * (main["width"] - 32), (table, main)
    shoot(page, "dashboard-running-wide")


def test_the_throughput_chart_is_drawn_wide(live_server, page, teams, owner, catalog):
    cluster, pool = make_cluster("aws-h100", "aws", "us-east-1", catalog["H100-80GB"])
    job = make_job(teams[0], owner.user, catalog["H100-80GB"], name="charted", gpus_per_node=8)
    attempt = make_attempt(job, cluster, pool, state=JobState.SUCCEEDED)
    make_workload_metrics(attempt, "config flops_per_token=43200000000 tokens_per_step=1000000\n"
                                   "step=1 tokens_per_s=100000\nstep=50 tokens_per_s=120000\n")
    sign_in(page, live_server.url, "owner")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    canvas = page.locator("#job-throughput-chart")
    expect(canvas).to_be_visible()
    page.wait_for_function("() => window.Chart && Chart.getChart(document.getElementById('job-throughput-chart'))")
    box = canvas.bounding_box()
    assert box["width"] >= 256 and box["height"] >= 100, box  # 16rem at least, never a few pixels
    page.set_viewport_size({"width": 360, "height": 800})  # a phone: still at least 16rem
    page.wait_for_timeout(300)
    assert canvas.bounding_box()["width"] >= 256, canvas.bounding_box()
    shoot(page, "job-throughput-chart")
