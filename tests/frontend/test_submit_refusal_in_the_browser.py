"""The submit form in headless Chromium: after a preview that says the job's budget can never cover it, Submit is
disabled with the reason beside it (ADR 0036); a preview that the budget allows enables it again."""

from __future__ import annotations

from playwright.sync_api import expect

from jobs.models import Job

from .conftest import sign_in


def test_a_refused_preview_disables_submit_with_the_reason_and_a_good_one_enables_it(
        live_server, funded_aws_cluster, page, owner):
    budget = funded_aws_cluster["budget"]
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/jobs/new/")
    page.get_by_label("Team").select_option("alpha")
    page.get_by_label("Name").fill("too-dear")
    page.get_by_label("Command").fill("python -c 1")
    page.get_by_label("GPUs per node").fill("8")
    page.get_by_label("Max runtime (seconds)").fill("100000")  # 8 GPUs x 27.8 h x 6.88 USD = 1528.89 USD > 1000
    page.get_by_role("button", name="Preview").click()
    submit = page.get_by_role("button", name="Submit")
    expect(submit).to_be_disabled()
    reason = page.locator("#submit-refused")
    expect(reason).to_contain_text(f"budget #{budget.pk}")
    expect(reason).to_contain_text("is over the whole budget of $1000.00")
    expect(page.locator("#preview-budget")).to_have_class("bad")

    page.get_by_label("Max runtime (seconds)").fill("3600")  # 55.04 USD
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#preview-budget")).to_have_text("allows it now")
    expect(submit).to_be_enabled()
    expect(page.locator("#submit-refused")).to_have_count(0)
    submit.click()
    expect(page.locator("#job-state")).to_have_text("QUEUED")
    assert Job.objects.get().name == "too-dear"
