"""One job's cost is one string wherever it is shown: its job page, the Costs page grouped by job, a report's page
(headless Chromium against a live server), the jobs API and ``cpctl job ID``.

Class of failure: a surface rounding the same exact sum its own way (half up, per entry, from a float), so a user
reads two costs for one job. Invariant: every surface shows the job's exact ledger sum rounded once to cents, half
to even (docs/design.md, Cost ledger). The job's three ledger entries of $0.335 sum to $1.005, where half up and
half to even part ways: $1.00 half to even, worked out here from the entries.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import ROUND_HALF_EVEN, Decimal

from click.testing import CliRunner
from django.utils import timezone
from playwright.sync_api import expect

from costs.reports.build import generate_report
from cpctl import cli
from jobs.models import Job, JobState
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job

from .conftest import sign_in

ENTRIES = [Decimal("0.335")] * 3


def test_one_jobs_cost_is_the_same_string_on_every_surface(live_server, page, catalog, teams, owner, monkeypatch):
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"])
    day = timezone.now().astimezone(dt.UTC).date() - dt.timedelta(days=1)
    start = dt.datetime.combine(day, dt.time(9), tzinfo=dt.UTC)
    job = make_job(teams[0], owner.user, catalog["H100-80GB"], name="half-cent")
    attempt = make_attempt(job, cluster, pool, gpus=1, started_at=start, ended_at=start + dt.timedelta(minutes=30),
                           state=JobState.SUCCEEDED)
    for n, amount in enumerate(ENTRIES):
        make_cost_entry(attempt, start + dt.timedelta(minutes=10 * n), dt.timedelta(minutes=10), amount,
                        usd_per_gpu_hour="2.01")
    # what accrual does with what it posts (costs.ledger: the job's accrued cost grows by exactly its entries)
    Job.objects.filter(pk=job.pk).update(accrued_cost_usd=sum(ENTRIES))
    want = "$" + str(sum(ENTRIES).quantize(Decimal("0.01"), ROUND_HALF_EVEN))
    assert want == "$1.00"  # half up would give $1.01
    midnight = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    report, _ = generate_report(teams[0], midnight, midnight + dt.timedelta(days=1))

    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    on_job_page = page.locator("#job-cost").inner_text()
    page.goto(f"{live_server.url}/costs/?group_by=job&start={day}&end={day}")
    costs_row = page.get_by_role("row").filter(has=page.get_by_role("link", name=f"#{job.pk} half-cent"))
    expect(costs_row).to_have_count(1)
    on_costs_page = costs_row.locator("td").nth(2).inner_text()
    page.goto(f"{live_server.url}/reports/{report.pk}/")
    top_jobs = page.locator("h2:text-is('Ten most expensive jobs') + table")
    report_row = top_jobs.get_by_role("row").filter(has_text=f"{job.pk} half-cent")
    expect(report_row).to_have_count(1)
    on_report_page = report_row.locator("td").nth(4).inner_text()

    api = owner.client.get(f"/api/v1/jobs/{job.pk}/").json()["accrued_cost_usd"]
    monkeypatch.delenv("CONTROLPLANE_URL", raising=False)
    monkeypatch.delenv("CONTROLPLANE_TOKEN", raising=False)
    shown = CliRunner().invoke(cli.main, ["--url", live_server.url, f"--token={owner.key}", "job", str(job.pk)],
                               prog_name="cpctl")
    assert shown.exit_code == 0, shown.output
    in_cpctl = re.search(r"^  cost\s+(\S+) accrued", shown.stdout, re.MULTILINE).group(1)

    assert (on_job_page, on_costs_page, on_report_page, "$" + api, in_cpctl) == (want,) * 5
