"""Scoping (API and web UI), money (costs API edges, Decimal sums) and authentication attacks."""

from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from costs.models import CostEntry
from frontend.models import Report
from quotas.models import ApiToken, Budget, Quota
from tests.support.factories import make_attempt


def web(persona) -> Client:
    client = Client()
    client.force_login(persona.user)
    return client


@pytest.fixture
def beta_world(beta_objects, aws_cluster, teams):
    """Beta's job with an attempt, a ledger entry and a report."""
    job = beta_objects["job"]
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    start = timezone.now().replace(microsecond=0) - dt.timedelta(hours=2)
    CostEntry.objects.create(attempt=attempt, job=job, team=teams[1], cluster=aws_cluster["cluster"],
                             accelerator=job.accelerator, interval_start=start,
                             interval_end=start + dt.timedelta(hours=1), gpus=1, usd_per_gpu_hour="7.000000",
                             amount_usd="7.000000000")
    report = Report.objects.create(team=teams[1], period_start=start, period_end=start + dt.timedelta(days=1),
                                   data={"secret": "beta"}, html="<p>beta secret</p>", csv="a,b\n")
    return {**beta_objects, "attempt": attempt, "report": report}


def api_detail_urls(world):
    job, quota, budget, report = world["job"], world["quota"], world["budget"], world["report"]
    return [
        ("get", f"/api/v1/jobs/{job.pk}/"),
        ("get", f"/api/v1/jobs/{job.pk}/events/"),
        ("get", f"/api/v1/jobs/{job.pk}/attempts/"),
        ("get", f"/api/v1/jobs/{job.pk}/logs/"),
        ("get", f"/api/v1/jobs/{job.pk}/logs/?follow=1"),
        ("post", f"/api/v1/jobs/{job.pk}/cancel/"),
        ("get", f"/api/v1/quotas/{quota.pk}/"),
        ("patch", f"/api/v1/quotas/{quota.pk}/"),
        ("put", f"/api/v1/quotas/{quota.pk}/"),
        ("get", f"/api/v1/budgets/{budget.pk}/"),
        ("patch", f"/api/v1/budgets/{budget.pk}/"),
        ("get", f"/api/v1/budget-status/{budget.pk}/"),
        ("get", f"/api/v1/reports/{report.pk}/"),
        ("get", f"/api/v1/reports/{report.pk}/csv/"),
        ("get", "/api/v1/teams/beta/"),
    ]


def test_outsider_gets_404_on_every_api_detail(owner, beta_world, redis_broker):
    for method, url in api_detail_urls(beta_world):
        kwargs = {"format": "json"} if method in ("post", "patch", "put") else {}
        data = {"nominal_gpus": 999} if method in ("patch", "put") else None
        response = getattr(owner.client, method)(url, data, **kwargs) if data else getattr(owner.client, method)(url)
        assert response.status_code == 404, (method, url, response.status_code)
    beta_world["job"].refresh_from_db()
    assert beta_world["job"].state == "RUNNING"
    assert Quota.objects.get(pk=beta_world["quota"].pk).nominal_gpus == 8


def test_outsider_gets_404_on_every_web_page(owner, beta_world):
    client = web(owner)
    job, quota, budget, report = beta_world["job"], beta_world["quota"], beta_world["budget"], beta_world["report"]
    for method, url in [
        ("get", f"/jobs/{job.pk}/"), ("get", f"/jobs/{job.pk}/status/"), ("get", f"/jobs/{job.pk}/logs/"),
        ("get", f"/jobs/{job.pk}/cancel/"), ("post", f"/jobs/{job.pk}/cancel/"),
        ("get", "/teams/beta/"), ("get", f"/teams/beta/quotas/{quota.pk}/edit/"),
        ("post", f"/teams/beta/quotas/{quota.pk}/edit/"), ("get", "/teams/beta/budgets/new/"),
        ("post", "/teams/beta/budgets/new/"), ("get", f"/teams/beta/budgets/{budget.pk}/edit/"),
        ("get", f"/reports/{report.pk}/"), ("get", f"/reports/{report.pk}.csv"),
        # beta's quota and budget through alpha's URL (the owner administers alpha)
        ("get", f"/teams/alpha/quotas/{quota.pk}/edit/"), ("post", f"/teams/alpha/quotas/{quota.pk}/edit/"),
        ("get", f"/teams/alpha/budgets/{budget.pk}/edit/"), ("post", f"/teams/alpha/budgets/{budget.pk}/edit/"),
    ]:
        response = getattr(client, method)(url, {"nominal_gpus": 999} if method == "post" else None)
        assert response.status_code == 404, (method, url, response.status_code)
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 8
    assert Budget.objects.count() == 1


@pytest.mark.parametrize("query", [
    "team=beta", "cluster=aws-use1", "submitter=outsider", "ordering=team__slug", "ordering=-submitter__username",
    "state=RUNNING&team=beta", "accelerator=H100-80GB&team=beta", "team=beta&team=alpha",
])
def test_job_list_filters_do_not_leak(owner, beta_world, query):
    response = owner.client.get(f"/api/v1/jobs/?{query}")
    assert response.status_code in (200, 400)
    if response.status_code == 200:
        assert all(row["team"] != "beta" for row in response.json()["results"]), query
    page = web(owner).get(f"/jobs/?{query}")
    assert page.status_code == 200
    assert b"beta-job" not in page.content
    rows = web(owner).get(f"/jobs/rows/?{query}")
    assert b"beta-job" not in rows.content


@pytest.mark.parametrize("url", [
    "/api/v1/quotas/?team=beta", "/api/v1/budgets/?team=beta", "/api/v1/reports/?team=beta",
    "/api/v1/quotas/?ordering=team__slug", "/api/v1/budget-status/?team=beta", "/api/v1/teams/?slug=beta",
])
def test_lists_with_team_params_do_not_leak(owner, beta_world, url):
    response = owner.client.get(url)
    assert response.status_code == 200, response.content
    assert b"beta" not in response.content.replace(b'"alpha"', b""), response.content


@pytest.mark.parametrize("group_by", ["team", "cluster", "accelerator", "job", "day"])
def test_costs_and_utilization_do_not_leak(owner, beta_world, group_by):
    for url in ("/api/v1/costs/", "/api/v1/utilization/"):
        response = owner.client.get(url, {"group_by": group_by, "team": "beta"})
        assert response.status_code == 200
        body = response.json()
        assert body["results"] == [], (url, body)
        assert body["total"]["gpu_hours"] == 0
    response = owner.client.get("/api/v1/costs/", {"group_by": group_by, "with_utilization": "true"})
    assert response.json()["results"] == []
    csv = web(owner).get("/costs.csv", {"group_by": group_by, "team": "beta"})
    assert csv.status_code in (200, 400)
    assert b"7.00" not in csv.content
    page = web(owner).get("/costs/", {"group_by": group_by, "team": "beta"})
    assert page.status_code == 200
    assert b"7.00" not in page.content


def test_outsider_dashboard_and_lists_do_not_show_beta(owner, beta_world):
    client = web(owner)
    for url in ("/", "/jobs/", "/teams/", "/reports/", "/costs/"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert b"beta-job" not in response.content and b"beta secret" not in response.content, url


# --- money --------------------------------------------------------------------------------------

def entry(attempt, team, cluster, start, amount, minutes=1):
    return CostEntry.objects.create(attempt=attempt, job=attempt.job, team=team, cluster=cluster,
                                    accelerator=attempt.job.accelerator, interval_start=start,
                                    interval_end=start + dt.timedelta(minutes=minutes), gpus=1,
                                    usd_per_gpu_hour="6.000000", amount_usd=amount)


@pytest.fixture
def alpha_ledger(alpha_objects, aws_cluster, teams):
    attempt = make_attempt(alpha_objects["job"], aws_cluster["cluster"], aws_cluster["pool"])
    base = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.timezone.utc)
    # 0.1 + 0.2 (x10) in the ledger: binary floats would drift; Decimals sum to exactly 3.00.
    for i in range(10):
        entry(attempt, teams[0], aws_cluster["cluster"], base + dt.timedelta(minutes=2 * i), "0.100000000")
        entry(attempt, teams[0], aws_cluster["cluster"], base + dt.timedelta(minutes=2 * i + 1), "0.200000000")
    # half-even at presentation: 0.005 alone on another day
    entry(attempt, teams[0], aws_cluster["cluster"], base + dt.timedelta(days=1), "0.005000000")
    return base


def test_decimal_sums_are_exact(owner, alpha_ledger):
    response = owner.client.get("/api/v1/costs/", {"group_by": "day"})
    assert response.status_code == 200
    body = response.json()
    assert [r["cost_usd"] for r in body["results"]] == ["3.00", "0.00"]
    assert body["total"]["cost_usd"] == "3.00"  # 3.005 rounded half-even once
    for group_by in ("team", "cluster", "accelerator", "job"):
        assert owner.client.get("/api/v1/costs/", {"group_by": group_by}).json()["total"]["cost_usd"] == "3.00"


@pytest.mark.parametrize("start,end", [
    ("2026-03-10T17:30:00+05:30", "2026-03-10T18:00:00+05:30"),  # 12:00-12:30 UTC
    ("2026-03-10T07:00:00-05:00", "2026-03-10T07:30:00-05:00"),
    ("2026-03-10T12:00:00Z", "2026-03-10T12:30:00Z"),
])
def test_offsets_select_the_same_utc_window(owner, alpha_ledger, start, end):
    body = owner.client.get("/api/v1/costs/", {"start": start, "end": end}).json()
    assert body["total"]["cost_usd"] == "3.00", body


@pytest.mark.parametrize("params,field", [
    ({"start": "2026-03-10T12:00:00"}, "start"),  # naive
    ({"end": "2026-03-10"}, "end"),
    ({"start": "2026-03-10T12:00:00Z", "end": "2026-03-10T12:00:00Z"}, "end"),
    ({"start": "2026-03-10T12:00:00Z", "end": "2026-03-10T11:00:00Z"}, "end"),
    ({"start": "2026-03-10T17:30:00+05:30", "end": "2026-03-10T12:00:00Z"}, "end"),  # the same instant
    ({"group_by": "user"}, "group_by"),
    ({"group_by": "team__slug"}, "group_by"),
    ({"start": "not a date"}, "start"),
    ({"start": "2026-02-30T00:00:00Z"}, "start"),
    ({"start": "0001-01-01T00:00:00+05:30"}, "start"),  # before datetime.min in UTC
    ({"end": "9999-12-31T23:59:59-05:00"}, "end"),  # after datetime.max in UTC
    ({"start": "2026-03-10T12:00:00+25:00"}, "start"),
    ({"with_utilization": "maybe"}, "with_utilization"),
])
def test_bad_cost_queries_are_400(owner, alpha_ledger, params, field):
    for url in ("/api/v1/costs/", "/api/v1/utilization/"):
        response = owner.client.get(url, params)
        assert response.status_code == 400, (url, params, response.status_code)
        assert field in response.json(), response.json()


@pytest.mark.parametrize("params", [
    {"start": "0001-01-01T00:00:00Z"}, {"end": "9999-12-31T23:59:59Z"},
    {"start": "1970-01-01T00:00:00+14:00", "end": "2999-01-01T00:00:00-12:00"},
    {"start": "0001-01-02T00:00:00Z", "end": "9999-12-30T00:00:00Z", "group_by": "day", "with_utilization": "1"},
])
def test_far_past_and_future_windows(owner, alpha_ledger, params):
    for url in ("/api/v1/costs/", "/api/v1/utilization/"):
        response = owner.client.get(url, params)
        assert response.status_code == 200, (url, params, response.content[:300])


@pytest.mark.parametrize("params", [
    {"start": "2026-13-01"}, {"end": "yesterday"}, {"group_by": "user"}, {"team": "beta"},
    {"start": "0001-01-01", "end": "9999-12-31"}, {"end": "0001-01-03"}, {"start": "9999-12-31"},
    {"start": "2026-02-30"},
])
def test_costs_web_page_and_csv_never_500(owner, alpha_ledger, params):
    client = web(owner)
    assert client.get("/costs/?" + urlencode(params)).status_code == 200
    assert client.get("/costs.csv?" + urlencode(params)).status_code in (200, 400)


# --- auth -------------------------------------------------------------------------------------------

def raw_client(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


@pytest.mark.parametrize("header", [
    "Token", "Token ", "Token a b", "token x", "Bearer abc", "Basic Zm9vOmJhcg==", "Token \x00",
    "Token " + "x" * 10_000, "Token caf\u00e9",
])
def test_malformed_authorization_is_401(owner, header):
    response = raw_client(header).get("/api/v1/jobs/")
    assert response.status_code == 401, (header[:20], response.status_code)


def test_expired_token_and_inactive_user(owner, teams):
    token, key = ApiToken.issue(owner.user, "short", expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert raw_client(f"Token {key}").get("/api/v1/jobs/").status_code == 401
    user = get_user_model().objects.create_user("gone", password="x", is_active=False)
    _, key = ApiToken.issue(user, "t")
    assert raw_client(f"Token {key}").get("/api/v1/jobs/").status_code == 401
    owner.user.is_active = False
    owner.user.save()
    assert owner.client.get("/api/v1/jobs/").status_code == 401


def test_session_post_without_csrf_is_refused(owner, alpha_objects, submission):
    api = APIClient(enforce_csrf_checks=True)
    api.force_login(owner.user)
    assert api.get("/api/v1/jobs/").status_code == 200
    job = alpha_objects["job"]
    assert api.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert api.post("/api/v1/jobs/", submission, format="json").status_code == 403
    assert api.patch(f"/api/v1/quotas/{alpha_objects['quota'].pk}/", {"nominal_gpus": 1}, format="json").status_code == 403
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner.user)
    assert browser.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == "QUEUED"
    assert Quota.objects.get(pk=alpha_objects["quota"].pk).nominal_gpus == 16


def test_anonymous_web_pages_redirect_to_login(alpha_objects):
    client = Client()
    job = alpha_objects["job"]
    for url in ("/", "/jobs/", f"/jobs/{job.pk}/", "/costs.csv", "/teams/alpha/", f"/jobs/{job.pk}/cancel/"):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url
