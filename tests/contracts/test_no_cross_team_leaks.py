"""Another team's data never shows, whatever the way in: every API detail and web page of beta's objects is a
404 to alpha's admin (writes included, which change nothing), and no filter, ordering, list, aggregate, CSV or
dashboard lets beta's jobs, money or reports through."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from costs.models import Report
from quotas.models import Budget, Quota
from tests.support.factories import make_attempt, make_cost_entry
from tests.support.personas import signed_in


@pytest.fixture
def beta_world(beta_objects, aws_cluster, teams):
    """Beta's job with an attempt, a ledger entry and a report."""
    job = beta_objects["job"]
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    start = timezone.now().replace(microsecond=0) - dt.timedelta(hours=2)
    make_cost_entry(attempt, start, dt.timedelta(hours=1), "7.000000000", gpus=1, usd_per_gpu_hour="7.00")
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
    client = signed_in(owner)
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


@pytest.mark.parametrize("query, status", [
    ("team=beta", 200), ("cluster=aws-use1", 200), ("submitter=outsider", 200),
    ("ordering=team__slug", 400), ("ordering=-submitter__username", 400),  # not orderable fields
    ("state=RUNNING&team=beta", 200), ("accelerator=H100-80GB&team=beta", 200), ("team=beta&team=alpha", 200),
])
def test_job_list_filters_do_not_leak(owner, beta_world, query, status):
    response = owner.client.get(f"/api/v1/jobs/?{query}")
    assert response.status_code == status, (query, response.content[:300])
    assert b"beta-job" not in response.content and b'"beta"' not in response.content, query
    page = signed_in(owner).get(f"/jobs/?{query}")
    assert page.status_code == 200
    assert b"beta-job" not in page.content
    rows = signed_in(owner).get(f"/jobs/rows/?{query}")
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
    csv = signed_in(owner).get("/costs.csv", {"group_by": group_by, "team": "beta"})
    assert csv.status_code == 400  # a team of which the user is not a member is a bad filter, as an unknown one
    assert b"7.00" not in csv.content
    page = signed_in(owner).get("/costs/", {"group_by": group_by, "team": "beta"})
    assert page.status_code == 200
    assert b"7.00" not in page.content


def test_outsider_dashboard_and_lists_do_not_show_beta(owner, beta_world):
    client = signed_in(owner)
    for url in ("/", "/jobs/", "/teams/", "/reports/", "/costs/"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert b"beta-job" not in response.content and b"beta secret" not in response.content, url


def test_what_alpha_sees_of_shared_cohorts_does_not_change_when_beta_uses_more(owner, staff, beta_world, teams,
                                                                                  aws_cluster):
    """Non-interference: alpha and beta share a department of an organisation (a tree of cohorts, ADR 0046, and
    one cohort for fair sharing, ADR 0045). Every figure alpha's admin reads from ``cohort-trees/`` and
    ``fair-sharing/`` is the same before and after beta runs more and its decayed usage grows, so no sum, share or
    difference of them can give beta's usage away. Staff, who may see beta, do see the change."""
    from jobs.models import JobState
    from quotas.models import Cohort, CohortQuota, Team, TeamUsage
    from tests.support.factories import make_job_row

    alpha, beta = teams
    org = Cohort.objects.create(name="org")
    dept = Cohort.objects.create(name="dept", parent=org)
    CohortQuota.objects.create(cohort=dept, accelerator=aws_cluster["pool"].accelerator, nominal_gpus=2)
    Team.objects.filter(pk__in=[alpha.pk, beta.pk]).update(cohort=dept)
    now = timezone.now()
    TeamUsage.objects.create(team=beta, gpu_seconds=3600, sampled_at=now)

    def seen(persona):
        trees = persona.client.get("/api/v1/cohort-trees/").json()
        fair = persona.client.get("/api/v1/fair-sharing/").json()
        fair.pop("at")
        for row in fair["results"]:  # beta's own figures decay with the clock (only staff see beta's row)
            if row["team"] == beta.slug:
                del row["decayed_gpu_hours"], row["weighted_gpu_hours"]
        return trees, fair

    before, staff_before = seen(owner), seen(staff)
    TeamUsage.objects.filter(team=beta).update(gpu_seconds=90 * 3600, sampled_at=now)
    job = make_job_row(beta, beta_world["job"].submitter, aws_cluster["pool"].accelerator, name="more",
                       gpus_per_node=4, state=JobState.RUNNING)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])

    assert seen(owner) == before
    assert seen(staff) != staff_before
