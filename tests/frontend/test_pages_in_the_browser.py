"""What a user sees on each page, in headless Chromium against a live server: the log's node picker, a finished
job's cost and timeline, the costs chart over its date range and its form's errors, the job filters, the styled
404 page and the favicon, the admin link and its names, a report's aligned cells, the submit page's default
accelerator and the estimate that stays the same from preview to job page, and a readable "Why it waits" box."""

from __future__ import annotations

import datetime as dt
import re
import time
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from costs.reports.build import generate_report
from jobs.models import Job, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from jobs.tasks import dispatch_attempt
from runners.models import Accelerator
from tests.support.factories import make_attempt, make_cost_entry, make_job, make_job_row

from .conftest import settled, shoot, sign_in

# Each node prints its rank; rank 1 waits a little so the page has time to poll while the job runs.
BY_RANK = ["python", "-c", "import os, time; print('log line of rank', os.environ['RANK'], flush=True); "
                           "time.sleep(1 + 2 * int(os.environ['RANK']))"]


@pytest.fixture
def fleet(funded_local_cluster, settings):
    """The funded local cluster; pages poll every second."""
    settings.UI_POLL_SECONDS = 1
    return {"cluster": funded_local_cluster, "pool": funded_local_cluster.node_pools.get(name="gpu")}


def test_the_node_picker_switches_the_log_between_nodes(live_server, fleet, page, teams, owner):
    cluster, pool = fleet["cluster"], fleet["pool"]
    job = make_job_row(teams[0], owner.user, pool.accelerator, name="two-nodes", nodes=2,
                       spec={"command": BY_RANK, "env": {}})
    assert try_admit(job.pk) == "admitted"
    job.refresh_from_db()
    assert dispatch_attempt(job.current_attempt_id) == "dispatched"
    deadline = time.monotonic() + 30
    while Job.objects.get(pk=job.pk).state != JobState.SUCCEEDED:
        assert time.monotonic() < deadline
        reconcile_cluster(cluster)
        time.sleep(0.3)

    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    logs = page.locator("#job-logs")
    expect(logs).to_contain_text("log line of rank 0")
    expect(page.get_by_label("Node", exact=True)).to_have_value("0")
    settled(logs)
    page.get_by_label("Node", exact=True).select_option("1")
    expect(logs).to_contain_text("log line of rank 1")
    expect(logs).not_to_contain_text("log line of rank 0")
    expect(logs.locator(".help")).to_have_text(f"Node 1 of attempt 1 on {cluster.name}.")
    shoot(page, "job-log-node-1")


def test_a_finished_job_shows_its_cost_and_names_the_submitter_once(live_server, fleet, page, teams, owner):
    job = make_job(teams[0], owner.user, fleet["pool"].accelerator, name="done")
    make_attempt(job, fleet["cluster"], fleet["pool"], state=JobState.SUCCEEDED)
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    status = page.locator("#job-status")
    expect(status).to_contain_text("Cost: $0.00")
    expect(status).not_to_contain_text("Cost so far")
    submitted = page.locator(".timeline li").first
    expect(submitted).to_contain_text("Submitted by owner.")
    assert submitted.text_content().count("owner") == 1, submitted.text_content()


@pytest.fixture
def costs_over_days(fleet, teams, owner):
    """alpha's cost on three UTC days: $2 five days ago, $4 three days ago, $6 yesterday."""
    job = make_job(teams[0], owner.user, fleet["pool"].accelerator, name="costly")
    attempt = make_attempt(job, fleet["cluster"], fleet["pool"], started_at=timezone.now() - dt.timedelta(days=6),
                           state=JobState.SUCCEEDED)
    today = timezone.now().astimezone(dt.timezone.utc).date()
    days = {today - dt.timedelta(days=n): usd for n, usd in ((5, 2), (3, 4), (1, 6))}
    for day, usd in days.items():
        start = dt.datetime.combine(day, dt.time(10), tzinfo=dt.timezone.utc)
        make_cost_entry(attempt, start, dt.timedelta(hours=1), Decimal(usd), gpus=1, usd_per_gpu_hour=str(usd))
    return today, days


def chart_of(page, canvas_id: str) -> dict:
    """The Chart.js chart drawn on ``canvas_id``: labels, values, its type, x axis title, painted pixels."""
    return page.evaluate("""(id) => {
        const canvas = document.getElementById(id);
        const chart = Chart.getChart(canvas);
        const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let painted = 0;
        for (let i = 3; i < data.length; i += 4) { if (data[i] !== 0) painted++; }
        return {labels: chart.data.labels, values: chart.data.datasets[0].data, type: chart.config.type,
                x_title: chart.options.scales.x.title.text, painted: painted};
    }""", canvas_id)


def test_the_costs_chart_spans_the_chosen_days_on_a_date_axis(live_server, costs_over_days, page):
    today, days = costs_over_days
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/costs/")  # the last 30 days
    chart = chart_of(page, "cost-chart")
    expected = [(today - dt.timedelta(days=29 - n)).isoformat() for n in range(30)]
    assert chart["labels"] == expected and chart["x_title"] == "Day (UTC)" and chart["type"] == "bar"
    expect(page.get_by_label("From (UTC day)")).to_have_value(expected[0])  # the inputs say which days these are
    expect(page.get_by_label("To (UTC day, inclusive)")).to_have_value(expected[-1])
    assert dict(zip(chart["labels"], chart["values"], strict=True)) == {
        d: float(days.get(dt.date.fromisoformat(d), 0)) for d in expected}
    shoot(page, "costs-30-days")

    one_day = (today - dt.timedelta(days=3)).isoformat()
    page.goto(f"{live_server.url}/costs/?group_by=day&start={one_day}&end={one_day}")
    chart = chart_of(page, "cost-chart")
    assert chart["labels"] == [one_day] and chart["values"] == [4.0] and chart["painted"] > 1000  # a bar, not a dot
    shoot(page, "costs-one-day")


def test_a_reversed_date_range_is_an_error_next_to_the_field_and_keeps_the_form_in_one_row(live_server, fleet, page,
                                                                                         owner):
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/costs/?group_by=day&start=2026-11-10&end=2026-11-01")
    error = page.locator("#id_end_errors")
    expect(error).to_have_text("the end day (2026-11-01) is before the start day (2026-11-10)")
    tops = page.evaluate("""() => ['id_group_by', 'id_start', 'id_end', 'id_team'].map(
        id => Math.round(document.querySelector(`label[for=${id}]`).getBoundingClientRect().top))""")
    assert max(tops) - min(tops) <= 1, tops  # the fields stay side by side; the error sits under its own field
    button, end_input = page.get_by_role("button", name="Show").bounding_box(), page.locator("#id_end").bounding_box()
    assert abs(button["y"] - end_input["y"]) < 10  # and the button stays on their row
    box, end_box = error.bounding_box(), page.locator("#id_end").bounding_box()
    assert box["y"] > end_box["y"] and abs(box["x"] - end_box["x"]) < 30
    shoot(page, "costs-range-error")


def test_the_job_filters_have_human_labels_date_inputs_and_say_the_format(live_server, fleet, page, owner):
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/jobs/")
    labels = page.locator("form.filters label").all_text_contents()
    assert labels == ["Team (slug)", "State", "Kind", "Accelerator", "Cluster", "Submitted by (username)",
                      "Array (id)", "Submitted from (UTC)", "Submitted before (UTC)", "Order by"]
    expect(page.get_by_label("Submitted from (UTC)")).to_have_attribute("type", "datetime-local")
    page.goto(f"{live_server.url}/jobs/?created_after=last+tuesday")
    expect(page.locator("form.filters .errors")).to_have_text(
        "Enter a date/time as YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z], e.g. 2026-11-01T00:00:00Z, or a date "
        "YYYY-MM-DD (its midnight UTC)")


def test_a_missing_page_is_the_styled_404_and_the_favicon_exists(live_server, fleet, page, owner):
    sign_in(page, live_server.url, "owner")
    response = page.goto(f"{live_server.url}/no/such/page/")
    assert response.status == 404
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()  # the site's own layout, not Django's
    expect(page.get_by_role("link", name="Your jobs")).to_have_attribute("href", "/jobs/")
    shoot(page, "not-found")
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert page.request.get(f"{live_server.url}{icon}").status == 200
    ico = page.request.get(f"{live_server.url}/favicon.ico")
    assert ico.status == 200 and ico.headers["content-type"].startswith("image/svg")


def test_staff_reach_the_admin_from_the_ui_and_its_names_are_english(live_server, fleet, page, staff):
    staff.user.is_superuser = True
    staff.user.save()
    sign_in(page, live_server.url, "staff")
    page.get_by_role("link", name="Admin").click()
    expect(page.get_by_role("link", name="Cost entries")).to_be_visible()
    expect(page.get_by_role("link", name="Ledger discrepancies")).to_be_visible()
    expect(page.get_by_role("link", name="API tokens")).to_be_visible()
    assert "entrys" not in page.content() and "discrepancys" not in page.content()


def test_a_report_pages_label_and_value_cells_line_up(live_server, costs_over_days, page, teams):
    today, _ = costs_over_days
    start = dt.datetime.combine(today - dt.timedelta(days=7), dt.time(), tzinfo=dt.timezone.utc)
    report, _ = generate_report(teams[0], start, start + dt.timedelta(days=7), "weekly")
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/reports/{report.pk}/")
    rows = page.evaluate("""() => Array.from(document.querySelectorAll('.report-table tr')).filter(
        tr => tr.querySelector('th[scope=row]')).map(tr => {
            const th = tr.querySelector('th'), td = tr.querySelector('td');
            const text = el => { const r = document.createRange(); r.selectNodeContents(el);
                                 return r.getClientRects()[0].bottom; };
            return [Math.round(text(th)), Math.round(text(td))]; })""")
    assert len(rows) >= 5
    assert all(label == value for label, value in rows), rows  # each label's text on its value's line
    shoot(page, "report-aligned")


def test_the_reports_page_builds_a_report_of_the_chosen_days(live_server, costs_over_days, page, teams):
    today, days = costs_over_days
    first = today - dt.timedelta(days=5)
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/reports/")
    form = page.get_by_role("form", name="Build a report")
    form.get_by_label("From (UTC day)").fill(first.isoformat())
    form.get_by_label("To (UTC day, inclusive)").fill((today - dt.timedelta(days=3)).isoformat())
    form.get_by_role("button", name="Build report").click()
    expect(page).to_have_url(re.compile(r"/reports/\d+/$"))
    total = sum(usd for day, usd in days.items() if day <= today - dt.timedelta(days=3))  # $2 + $4, not yesterday's
    expect(page.locator("main")).to_contain_text(f"${total:.2f}")


def test_the_submit_page_defaults_to_an_offered_accelerator_and_the_estimate_stays_the_same(
        live_server, fleet, page, catalog, owner):
    pool = fleet["pool"]
    assert Accelerator.objects.exclude(pk=pool.accelerator_id).exists()  # others exist, alphabetically before too
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/jobs/new/")
    expect(page.get_by_label("Accelerator")).to_have_value(pool.accelerator.name)
    page.get_by_label("Name").fill("estimated")
    page.get_by_label("Command").fill("python -c 1")
    page.get_by_label("GPUs per node").fill("2")
    page.get_by_label("Max runtime (seconds)").fill("1800")
    page.get_by_role("button", name="Preview").click()
    preview_cost = page.locator("#preview-cost")
    expect(preview_cost).to_have_text(re.compile(r"^\$\d+\.\d\d$"))
    cost = preview_cost.text_content()
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#job-state")).to_have_text("QUEUED")
    estimate = page.locator("#job-estimate")
    expect(estimate).to_contain_text(f"Estimated cost (worst case: 2 GPUs × max runtime): {cost} at {fleet['cluster'].name}")
    expect(estimate).not_to_contain_text("known once")
    shoot(page, "job-estimate")


def test_why_it_waits_reads_as_words_and_stays_inside_the_page(live_server, fleet, page, teams, owner):
    job = make_job(teams[0], owner.user, fleet["pool"].accelerator, name="waiting")
    message = ("alpha asks for 8 H100-80GB GPUs; its limit is 8 (4 nominal + 4 borrowing) and 6 are in use by job "
               "41 ahead of it, so 2 are free: it runs when job 41 ends or the limit grows. ") * 3
    Job.objects.filter(pk=job.pk).update(queue_info={
        "reason": "quota", "message": message, "position": {"team": 2, "overall": 3}, "request_gpus": 8,
        "nominal_gpus": 4, "borrowing_limit_gpus": 4, "lending_limit_gpus": None,
        "blocking_job_ids": [41, 42], "an_unusually_long_key_name_that_would_not_wrap_on_its_own": "x" * 300})
    page.set_viewport_size({"width": 800, "height": 900})
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    box = page.locator("#queue-info")
    expect(box).to_contain_text("Queue position 3 overall, 2 within the team.")
    expect(box.locator("#queue-message")).to_contain_text("it runs when job 41 ends")
    facts = dict(zip(box.locator("dt").all_text_contents(), box.locator("dd").all_text_contents(), strict=True))
    assert facts["GPUs asked"] == "8" and facts["Lending limit (GPUs)"] == "no limit"
    assert facts["Blocking job ids"] == "41, 42"
    assert "request_gpus" not in box.text_content() and "None" not in box.text_content()
    overflow = page.evaluate("""() => { const b = document.getElementById('queue-info');
        return {box: b.scrollWidth - b.clientWidth, page: document.documentElement.scrollWidth - window.innerWidth}; }""")
    assert overflow == {"box": 0, "page": 0}, overflow
    shoot(page, "why-it-waits")
