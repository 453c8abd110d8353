"""The web UI in real headless Chromium (Debian's ``chromium`` driven by Playwright) against a live server.

Sign in, submit a job through the form and watch it reach RUNNING and SUCCEEDED on the local runner (the
scheduling, dispatch and reconcile steps a Celery worker would run are called from the test thread while the
browser polls), cancel another job, and see the costs chart drawn. Screenshots of the main pages go to
``artifacts/screenshots/``.
"""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from costs.reports.build import generate_report
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from jobs.tasks import dispatch_attempt
from tests.support.factories import make_attempt, make_cost_entry, make_job

from .conftest import shoot


@pytest.fixture
def local_fleet(funded_local_cluster, settings, teams, owner):
    """``funded_local_cluster`` (pages polling every second) with 3 days of alpha's cost: a job of yesterday's."""
    settings.UI_POLL_SECONDS = 1
    cluster = funded_local_cluster
    pool = cluster.node_pools.get(name="gpu")
    old = make_job(teams[0], owner.user, pool.accelerator, name="yesterdays-job")
    attempt = make_attempt(old, cluster, pool, started_at=timezone.now() - dt.timedelta(days=3),
                           state=JobState.SUCCEEDED)
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now() - dt.timedelta(hours=1))
    for days, hours in ((3, 2), (2, 5), (1, 3)):
        start = timezone.now() - dt.timedelta(days=days)
        make_cost_entry(attempt, start, dt.timedelta(hours=hours), Decimal(hours * 2), gpus=1, usd_per_gpu_hour="2.00")
    return {"cluster": cluster, "pool": pool}


def drive_until(page, job: Job, cluster, state: str, timeout: float = 30.0) -> None:
    """Reconcile ``cluster`` (the worker's periodic step) until the browser's job page shows ``state``."""
    deadline = time.monotonic() + timeout
    while page.locator("#job-state").text_content() != state:
        assert time.monotonic() < deadline, f"the page never showed {state}; job is {Job.objects.get(pk=job.pk).state}"
        reconcile_cluster(cluster)
        page.wait_for_timeout(300)


def test_a_researchers_day_in_the_browser(live_server, local_fleet, page, teams, owner):
    base = live_server.url
    cluster, pool = local_fleet["cluster"], local_fleet["pool"]

    page.goto(f"{base}/jobs/")
    expect(page).to_have_url(f"{base}/login/?next=/jobs/")
    page.get_by_label("Username").fill("owner")
    page.get_by_label("Password").fill("pw-owner")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Jobs", exact=True)).to_be_visible()
    page.goto(f"{base}/")
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.locator("#cost-30d")).to_be_visible()
    shoot(page, "dashboard")

    # Submit through the form, after a preview.
    page.goto(f"{base}/jobs/new/")
    page.get_by_label("Team").select_option("alpha")
    page.get_by_label("Name").fill("browser-job")
    page.get_by_label("Command").fill(
        "python -c \"import time; print('hello from the browser test', flush=True); time.sleep(4)\"")
    page.get_by_label("Accelerator").select_option(pool.accelerator.name)
    page.get_by_label("GPUs per node").fill("1")
    page.get_by_label("Max runtime (seconds)").fill("120")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#preview-placement")).to_contain_text(cluster.name)
    expect(page.locator("#preview-quota")).to_have_text("allows it now")
    shoot(page, "submit")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#job-state")).to_have_text("QUEUED")
    job = Job.objects.get(name="browser-job")
    assert page.url == f"{base}/jobs/{job.pk}/"

    # The worker's steps, from this thread, while the page polls.
    assert try_admit(job.pk) == "admitted"
    job.refresh_from_db()
    assert dispatch_attempt(job.current_attempt_id) == "dispatched"
    drive_until(page, job, cluster, JobState.RUNNING)
    expect(page.locator("#job-logs")).to_contain_text("hello from the browser test")
    shoot(page, "job-running")
    drive_until(page, job, cluster, JobState.SUCCEEDED)
    expect(page.locator(".timeline")).to_contain_text("RUNNING")
    expect(page.get_by_role("link", name="Cancel this job…")).to_have_count(0)  # final: nothing to cancel
    shoot(page, "job-succeeded")

    # Cancel another job, with confirmation.
    other = make_job(teams[0], owner.user, pool.accelerator, name="to-cancel")
    page.goto(f"{base}/jobs/{other.pk}/")
    page.get_by_role("link", name="Cancel this job…").click()
    page.get_by_role("button", name="Yes, cancel the job").click()
    expect(page.locator("#job-state")).to_have_text("CANCELLED")

    page.goto(f"{base}/jobs/")
    expect(page.locator(f'[data-job-state="{job.pk}"]')).to_have_text("SUCCEEDED")
    shoot(page, "jobs")

    # The costs chart is drawn: a Chart.js instance on the canvas, with painted pixels.
    page.goto(f"{base}/costs/")
    expect(page.locator("#cost-chart")).to_be_visible()
    drawn = page.evaluate("""() => {
        const canvas = document.getElementById('cost-chart');
        const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let painted = 0;
        for (let i = 3; i < data.length; i += 4) { if (data[i] !== 0) painted++; }
        return {chart: Chart.getChart(canvas) !== undefined, painted: painted, points: Chart.getChart(canvas).data.labels.length};
    }""")
    assert drawn["chart"] and drawn["painted"] > 1000 and drawn["points"] == 30, drawn  # a bar per day of 30
    shoot(page, "costs")

    for name, path in (("clusters", "/clusters/"), ("team", "/teams/alpha/")):
        page.goto(f"{base}{path}")
        shoot(page, name)
    expect(page.get_by_role("heading", name="Quotas", exact=True)).to_be_visible()
    now = timezone.now()
    report, _ = generate_report(teams[0], now - dt.timedelta(days=7), now, "weekly")
    page.goto(f"{base}/reports/")
    page.get_by_role("link", name="alpha").click()
    expect(page.get_by_role("heading", name="Ten most expensive jobs")).to_be_visible()
    assert page.url == f"{base}/reports/{report.pk}/"
    shoot(page, "report")
