"""Reports of any team and period on demand: ``POST /api/v1/reports/`` and the Reports page's form.

The expected totals are summed here from the ledger rows the test writes (an entry counts in the period holding
its ``interval_start``, the ledger's rule), for windows drawn at any hour across several days.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from django.core import mail
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from costs.models import Report
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db
T0 = dt.datetime(2026, 3, 9, tzinfo=UTC)  # the ledger below spans 2026-03-09 .. 2026-03-13
HOUR = dt.timedelta(hours=1)
# (team index, hours after T0, duration in hours, GPUs, USD per GPU-hour): alpha's and beta's jobs over 4 days.
LINES = [(0, 3, 1, 8, "6.88"), (0, 10, 2, 8, "6.88"), (0, 23, 1, 4, "3.00"), (0, 24, 1, 4, "3.00"),
         (1, 30, 5, 1, "6.88"), (0, 47, 1, 2, "2.29"), (0, 50, 1, 1, "6.875"), (0, 71, 3, 8, "6.88"),
         (1, 72, 1, 8, "6.88"), (0, 90, 1, 3, "1.111")]


def cents(amount: Decimal) -> str:
    return str(amount.quantize(Decimal("0.01"), ROUND_HALF_EVEN))


@pytest.fixture
def ledger(teams, owner, outsider, catalog):
    """``LINES`` written to the ledger; returns them with their exact amounts."""
    cluster, pool = make_cluster("aws-h100", "aws", "us-east-1", catalog["H100-80GB"])
    attempts = [make_attempt(make_job(team, owner.user if i == 0 else outsider.user, catalog["H100-80GB"],
                                      name=f"job-{i}", gpus_per_node=8), cluster, pool, state="SUCCEEDED")
                for i, team in enumerate(teams)]
    written = []
    for team, start, hours, gpus, price in LINES:
        amount = gpus * hours * Decimal(price)
        make_cost_entry(attempts[team], T0 + start * HOUR, hours * HOUR, amount, gpus=gpus, usd_per_gpu_hour=price)
        written.append((team, T0 + start * HOUR, gpus * hours, amount))
    return written


def expected_totals(ledger, team: int | None, start: dt.datetime, end: dt.datetime) -> dict:
    lines = [line for line in ledger if (team is None or line[0] == team) and start <= line[1] < end]
    return {"gpu_hours": float(sum(gpu_hours for _, _, gpu_hours, _ in lines)),
            "cost_usd": cents(sum((amount for *_, amount in lines), Decimal(0))),
            "unpriced_gpu_hours": 0.0, "unpriced_vcpu_hours": 0.0}  # every entry of the ledger here is priced


def body(team, start: dt.datetime, end: dt.datetime) -> dict:
    return {**({"team": team} if team else {}), "start": start.isoformat(), "end": end.isoformat()}


@hypothesis_settings(max_examples=15, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(start_hour=st.integers(min_value=-24, max_value=100), hours=st.integers(min_value=1, max_value=120),
       scope=st.sampled_from(["alpha", "beta", None]))
def test_the_report_asked_for_totals_what_the_ledger_holds_for_its_period(ledger, teammate, staff, start_hour, hours,
                                                                          scope):
    start, end = T0 + start_hour * HOUR, T0 + (start_hour + hours) * HOUR
    client = staff.client if scope != "alpha" else teammate.client  # a member asks for its team; staff any
    response = client.post("/api/v1/reports/", body(scope, start, end), format="json")
    assert response.status_code in (200, 201), response.content[:300]
    report = response.json()
    team = {"alpha": 0, "beta": 1, None: None}[scope]
    assert report["data"]["totals"] == expected_totals(ledger, team, start, end)
    assert (report["team"], report["kind"], report["source"]) == (scope, "custom", "request")
    assert report["period_start"] == start.isoformat().replace("+00:00", "Z")
    assert client.get(f"/api/v1/reports/{report['id']}/").json()["data"] == report["data"]  # GET reads it back


def test_asked_again_the_report_is_refreshed_not_added_and_never_mailed(ledger, teammate, viewer):
    start, end = T0, T0 + 2 * dt.timedelta(days=1)
    first = teammate.client.post("/api/v1/reports/", body("alpha", start, end), format="json")
    again = viewer.client.post("/api/v1/reports/", body("alpha", start, end), format="json")  # viewers may too
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"] and again.json()["requested_by"] == "viewer"
    assert Report.objects.count() == 1 and mail.outbox == []


@pytest.mark.parametrize("who, payload, field, reason", [
    ("teammate", {"team": "alpha", "start": "2026-03-11T00:00:00Z", "end": "2026-03-10T00:00:00Z"}, "end",
     "must be after start"),
    ("teammate", {"team": "alpha", "start": "2026-03-10T00:00:00Z", "end": "2026-03-10T00:00:00Z"}, "end",
     "must be after start"),
    ("teammate", {"team": "alpha", "start": "2026-01-01T00:00:00Z", "end": "2026-04-04T00:00:00Z"}, "end",
     "92 days (REPORTS_MAX_PERIOD_DAYS)"),
    ("teammate", {"team": "gamma", "start": "2026-03-10T00:00:00Z", "end": "2026-03-11T00:00:00Z"}, "team",
     'unknown team "gamma"'),
    ("outsider", {"team": "alpha", "start": "2026-03-10T00:00:00Z", "end": "2026-03-11T00:00:00Z"}, "team",
     'unknown team "alpha", or you are not a member of it'),
    ("teammate", {"start": "2026-03-10T00:00:00Z", "end": "2026-03-11T00:00:00Z"}, "team", "for staff only"),
    ("teammate", {"team": "alpha", "start": "2026-03-10T00:00:00", "end": "2026-03-11T00:00:00Z"}, "start",
     "no timezone"),
    ("teammate", {"team": "alpha", "start": "yesterday", "end": "2026-03-11T00:00:00Z"}, "start", "wrong format"),
    ("teammate", {"team": "alpha", "start": "2026-03-10T00:00:00Z"}, "end", "required"),
    ("staff", {"team": ["alpha"], "start": "2026-03-10T00:00:00Z", "end": "2026-03-11T00:00:00Z"}, "team",
     "Expected a team slug"),
])
def test_bad_input_is_a_400_naming_the_field_and_the_reason(request, ledger, who, payload, field, reason):
    response = request.getfixturevalue(who).client.post("/api/v1/reports/", payload, format="json")
    assert response.status_code == 400, response.content[:300]
    assert reason in " ".join(response.json()[field]), response.json()
    assert not Report.objects.exists()


def test_the_longest_period_allowed_is_accepted(ledger, teammate, settings):
    settings.REPORTS_MAX_PERIOD_DAYS = 3
    start = T0 + dt.timedelta(hours=5)
    ok = teammate.client.post("/api/v1/reports/", body("alpha", start, start + dt.timedelta(days=3)), format="json")
    longer = teammate.client.post("/api/v1/reports/", body("alpha", start, start + dt.timedelta(days=3, seconds=1)),
                                  format="json")
    assert (ok.status_code, longer.status_code) == (201, 400)
    assert "a report covers at most 3 days" in longer.json()["end"][0]


def test_the_reports_page_builds_one_for_a_team_and_refuses_bad_days(ledger, teammate, outsider, staff):
    web = signed_in(teammate)
    page = web.get("/reports/")
    assert page.status_code == 200 and b'aria-label="Build a report"' in page.content
    assert b"__platform__" not in page.content  # the platform is for staff
    answer = web.post("/reports/", {"team": "alpha", "start": "2026-03-09", "end": "2026-03-10"})
    report = Report.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/reports/{report.pk}/"
    assert (report.team.slug, report.period_start, report.period_end) == ("alpha", T0, T0 + dt.timedelta(days=2))
    assert report.data["totals"] == expected_totals(ledger, 0, T0, T0 + dt.timedelta(days=2))
    assert b"$" + report.data["totals"]["cost_usd"].encode() in web.get(answer["Location"]).content

    refused = web.post("/reports/", {"team": "alpha", "start": "2026-03-10", "end": "2026-03-09"})
    assert refused.status_code == 400 and b"is before the start day" in refused.content
    too_long = web.post("/reports/", {"team": "alpha", "start": "2026-01-01", "end": "2026-04-03"})
    assert too_long.status_code == 400 and b"a report covers at most 92 days" in too_long.content
    other = web.post("/reports/", {"team": "beta", "start": "2026-03-09", "end": "2026-03-10"})
    assert other.status_code == 400 and b"Select a valid choice" in other.content
    assert Report.objects.count() == 1

    platform = signed_in(staff).post("/reports/", {"team": "__platform__", "start": "2026-03-09", "end": "2026-03-12"})
    assert platform.status_code == 302
    assert Report.objects.get(team=None).data["totals"] == expected_totals(ledger, None, T0, T0 + dt.timedelta(days=4))
