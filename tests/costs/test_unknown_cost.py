"""Cost unknown: GPU-hours accrued without a price, shown in the API and the UI, alerted once per attempt.

The ledger rows are written here: priced ones beside unpriced ones (the marker: a NULL price and amount).
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import Decimal

import pytest
from django.core import mail

from costs.models import CostEntry, UnknownCostAlert
from costs.unknown import check_unknown_costs, unknown_cost
from jobs.models import JobState
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job_row
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db
T = dt.datetime(2026, 11, 30, 9, tzinfo=UTC)
H = dt.timedelta(hours=1)


def unpriced(attempt, start, hours, gpus):
    return CostEntry.objects.create(attempt=attempt, job=attempt.job, team=attempt.job.team, cluster=attempt.cluster,
                                    accelerator=attempt.node_pool.accelerator, interval_start=start,
                                    interval_end=start + hours * H, gpu_milli=gpus * 1000, usd_per_gpu_hour=None,
                                    amount_usd=None)


@pytest.fixture
def ledger(teams, owner, catalog, budget_factory):
    alpha = teams[0]
    owner.user.email = "owner@example.com"
    owner.user.save()
    budget_factory(alpha, "1000.00", action="alert")
    priced_cluster, priced_pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"])
    lost_cluster, lost_pool = make_cluster("moved", "aws", "eu-nowhere-1", catalog["H100-80GB"])
    priced = make_job_row(alpha, owner.user, catalog["H100-80GB"], name="priced", state=JobState.RUNNING)
    lost = make_job_row(alpha, owner.user, catalog["H100-80GB"], name="lost", gpus_per_node=2, state=JobState.RUNNING)
    a_priced = make_attempt(priced, priced_cluster, priced_pool, gpus=1, started_at=T)
    a_lost = make_attempt(lost, lost_cluster, lost_pool, gpus=2, started_at=T + H)
    for i in range(3):  # three accrual runs: both attempts accrue each time, the unpriced one without a price
        make_cost_entry(a_priced, T + i * H, H, Decimal("6.88"))
        unpriced(a_lost, T + H + i * H, 1, 2)
    return {"alpha": alpha, "priced": priced, "lost": lost, "owner": owner, "attempt": a_lost}


def test_unknown_cost_says_since_when_for_how_many_gpu_hours_and_which_pool(ledger):
    found = unknown_cost(team=ledger["alpha"])
    assert (found.since, found.gpu_hours, found.attempts) == (T + H, 6.0, 1)  # 2 GPUs x 3 h
    assert found.message == ("cost unknown since 2026-11-30 10:00 UTC for 6.00 GPU-hours: "
                             "no price for moved/h100-80gb-on-demand (H100-80GB, on-demand)")
    assert unknown_cost(job=ledger["priced"]) is None
    assert unknown_cost(team=ledger["alpha"], until=T + 2 * H).gpu_hours == 2.0


def test_the_api_shows_cost_unknown_on_the_job_and_the_team_budget(ledger):
    client = ledger["owner"].client
    jobs = {j["name"]: j for j in client.get("/api/v1/jobs/").json()["results"]}
    assert jobs["priced"]["cost_unknown"] is None and jobs["priced"]["accrued_cost_usd"] is not None
    assert jobs["lost"]["cost_unknown"]["gpu_hours"] == 6.0
    assert dt.datetime.fromisoformat(jobs["lost"]["cost_unknown"]["since"]) == T + H
    detail = client.get(f"/api/v1/jobs/{ledger['lost'].pk}/").json()
    assert detail["cost_unknown"]["message"].startswith("cost unknown since 2026-11-30 10:00 UTC for 6.00 GPU-hours")
    (status,) = client.get("/api/v1/budget-status/").json()
    assert status["cost_unknown"]["gpu_hours"] == 6.0
    assert "median daily spend" in status["forecast_method"] and status["forecast_window"]["last_day"]


def test_the_job_page_and_the_dashboard_say_cost_unknown(ledger):
    client = signed_in(ledger["owner"])
    page = client.get(f"/jobs/{ledger['lost'].pk}/").content.decode()
    assert 'id="job-cost-unknown"' in page and "Cost unknown since 2026-11-30 10:00 UTC for 6.00 GPU-hours" in page
    assert 'id="job-cost-unknown"' not in client.get(f"/jobs/{ledger['priced'].pk}/").content.decode()
    dashboard = client.get("/").content.decode()
    assert "alpha: cost unknown since 2026-11-30 10:00 UTC for 6.00 GPU-hours" in dashboard
    assert 'id="forecast-method"' in dashboard


def test_the_alert_fires_once_per_attempt_over_several_checks(ledger, staff):
    staff.user.email = "finance@example.com"
    staff.user.save()
    fired = check_unknown_costs(T + 4 * H)
    assert [a.attempt_id for a in fired] == [ledger["attempt"].pk] and fired[0].gpu_hours == 6.0
    assert len(mail.outbox) == 1 and set(mail.outbox[0].to) == {"owner@example.com", "finance@example.com"}
    assert "no price for moved/h100-80gb-on-demand" in mail.outbox[0].body
    unpriced(ledger["attempt"], T + 4 * H, 1, 2)  # it keeps accruing without a price
    assert check_unknown_costs(T + 5 * H) == [] and check_unknown_costs(T + 6 * H) == []
    assert UnknownCostAlert.objects.count() == 1 and len(mail.outbox) == 1
