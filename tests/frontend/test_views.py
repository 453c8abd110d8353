"""Every web UI page tried by the owner (team admin), the teammate (member) and the outsider (another team's admin).

Another team's object is a 404 on every page; edits are for team admins and staff (403 for members, who can see).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from costs.models import CostEntry, Report
from costs.reports.build import generate_report
from jobs.models import Job, JobState
from quotas.models import AuditRecord, Budget, Quota
from runners.models import NodePool
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job, make_job_row
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


def add_cost(job, attempt, start: dt.datetime, hours: int, price: str) -> CostEntry:
    """A ledger entry of ``attempt`` over ``hours`` hours from ``start`` at ``price`` USD/GPU-hour."""
    return make_cost_entry(attempt, start, dt.timedelta(hours=hours), Decimal(attempt.gpus * hours) * Decimal(price),
                           usd_per_gpu_hour=price)


@pytest.fixture
def objects(alpha_objects, beta_objects):
    """Both teams' jobs, quotas and budgets, and one report per team."""
    now = timezone.now()
    reports = {}
    for name, objs in (("alpha", alpha_objects), ("beta", beta_objects)):
        reports[name], _ = generate_report(objs["job"].team, now - dt.timedelta(days=1), now)
    return {"alpha": alpha_objects, "beta": beta_objects, "reports": reports}


def alpha_pages(objects) -> list[str]:
    """Every page about one of team alpha's objects."""
    job, quota, budget = objects["alpha"]["job"], objects["alpha"]["quota"], objects["alpha"]["budget"]
    report = objects["reports"]["alpha"]
    return [f"/jobs/{job.pk}/", f"/jobs/{job.pk}/status/", f"/jobs/{job.pk}/logs/", f"/jobs/{job.pk}/cancel/",
            "/teams/alpha/", f"/teams/alpha/quotas/{quota.pk}/request/", f"/teams/alpha/budgets/{budget.pk}/request/",
            "/teams/alpha/budgets/request/", f"/reports/{report.pk}/", f"/reports/{report.pk}.csv",
            f"/api/v1/reports/{report.pk}/"]


LIST_PAGES = ["/", "/jobs/", "/jobs/rows/", "/jobs/new/", "/queue/", "/teams/", "/clusters/", "/nodes/", "/costs/",
              "/costs.csv", "/capacity/", "/utilization/", "/reports/", "/requests/", "/audit/", "/notifications/"]


def test_every_page_sends_anonymous_users_to_sign_in(client, objects):
    for url in LIST_PAGES + alpha_pages(objects)[:-1]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_it_signs_in_with_a_password_and_lands_on_the_dashboard(client, owner):
    bad = client.post("/login/", {"username": "owner", "password": "wrong"})
    assert bad.status_code == 200 and "Please enter a correct username and password" in bad.content.decode()
    assert client.get("/login/").status_code == 200
    response = client.post("/login/", {"username": "owner", "password": "pw-owner"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_the_owner_and_the_teammate_open_every_page_of_their_team(owner_web, teammate_web, objects):
    for url in LIST_PAGES + alpha_pages(objects):
        assert owner_web.get(url).status_code == 200, url
    # Members see the team but may not ask for changes of it; the teammate submitted the job, so may cancel it.
    job = objects["alpha"]["job"]
    for url in alpha_pages(objects):
        expected = 403 if "/request/" in url else 200
        assert teammate_web.get(url).status_code == expected, url
    assert teammate_web.get(f"/jobs/{job.pk}/cancel/").status_code == 200


def test_the_outsider_gets_404_on_every_page_of_another_team(outsider_web, objects):
    for url in alpha_pages(objects):
        assert outsider_web.get(url).status_code == 404, url
    for url in LIST_PAGES:
        assert outsider_web.get(url).status_code == 200, url
    # Posting is no way around it either.
    job = objects["alpha"]["job"]
    assert outsider_web.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    assert outsider_web.post(f"/teams/alpha/budgets/{objects['alpha']['budget'].pk}/edit/",
                             {"period": "monthly", "amount_usd": "1", "action": "alert"}).status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_lists_show_only_the_users_teams(owner_web, outsider_web, objects):
    for url in ("/", "/jobs/", "/jobs/rows/"):
        mine, theirs = owner_web.get(url).content.decode(), outsider_web.get(url).content.decode()
        assert "alpha-job" in mine and "beta-job" not in mine, url
        assert "beta-job" in theirs and "alpha-job" not in theirs, url
    reports = outsider_web.get("/reports/").content.decode()
    assert f"/reports/{objects['reports']['beta'].pk}/" in reports
    assert f"/reports/{objects['reports']['alpha'].pk}/" not in reports
    api = outsider_web.get("/api/v1/reports/").json()
    assert [r["team"] for r in api["results"]] == ["beta"]


def test_the_job_list_uses_the_api_filterset(owner, owner_web, objects, h100):
    other = make_job(objects["alpha"]["job"].team, owner.user, h100, name="running-one", state=JobState.RUNNING)
    by_state = owner_web.get("/jobs/rows/?state=RUNNING").content.decode()
    assert "running-one" in by_state and "alpha-job" not in by_state
    by_submitter = owner_web.get("/jobs/rows/?submitter=teammate").content.decode()
    assert "alpha-job" in by_submitter and "running-one" not in by_submitter
    assert "No job matches" in owner_web.get("/jobs/rows/?team=beta").content.decode()
    assert "No job matches" in owner_web.get("/jobs/rows/?state=NOPE").content.decode()
    page = owner_web.get("/jobs/?state=RUNNING").content.decode()
    assert 'hx-trigger="every 3s"' in page and "/jobs/rows/?state=RUNNING" in page
    assert f"#{other.pk} running-one" in page


def test_the_job_page_shows_why_it_waits_and_its_queue_position(teammate_web, objects):
    job = objects["alpha"]["job"]
    Job.objects.filter(pk=job.pk).update(queue_info={"reason": "quota", "message": "16 of 16 GPUs in use",
                                                     "position": {"team": 2, "overall": 5}})
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert "Why it waits" in page and 'id="queue-position">5<' in page and "2 within the team" in page
    assert "16 of 16 GPUs in use" in page
    assert "Not collected yet: the job has not started running." in page
    assert 'hx-get="/jobs/%d/status/"' % job.pk in page  # live while not final


def test_a_running_job_shows_attempts_cost_and_stops_polling_when_final(teammate_web, objects):
    job = objects["alpha"]["job"]

    pool = NodePool.objects.get(cluster__name="aws-use1")
    attempt = make_attempt(job, pool.cluster, pool, started_at=timezone.now() - dt.timedelta(hours=2))
    add_cost(job, attempt, timezone.now() - dt.timedelta(hours=2), 1, "6.88")
    status = teammate_web.get(f"/jobs/{job.pk}/status/").content.decode()
    assert "aws-use1" in status and "$6.88" in status and "hx-trigger" in status
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    assert "hx-trigger" not in teammate_web.get(f"/jobs/{job.pk}/status/").content.decode()


def test_cancel_asks_for_confirmation_then_cancels(teammate_web, objects, viewer):
    job = objects["alpha"]["job"]
    confirm = teammate_web.get(f"/jobs/{job.pk}/cancel/").content.decode()
    assert "Yes, cancel the job" in confirm
    job.refresh_from_db()
    assert job.state == JobState.QUEUED  # GET changes nothing
    assert signed_in(viewer).post(f"/jobs/{job.pk}/cancel/").status_code == 403
    response = teammate_web.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    again = teammate_web.post(f"/jobs/{job.pk}/cancel/", follow=True).content.decode()
    assert "could not be cancelled" in again


def form_data(**overrides) -> dict:
    data = {"team": "alpha", "name": "from-the-form", "kind": "training", "image": "python:3.11",
            "command": "python -c 'print(1)'", "accelerator": "H100-80GB", "gpus_per_node": "2", "nodes": "1",
            "max_runtime_seconds": "7200", "priority": "normal"}
    data.update(overrides)
    return data


def test_submitting_the_form_creates_a_queued_job(teammate_web, objects):
    response = teammate_web.post("/jobs/new/", form_data())
    job = Job.objects.get(name="from-the-form")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.state == JobState.QUEUED and job.total_gpus == 2 and job.max_runtime_seconds == 7200
    assert job.spec["command"] == ["python", "-c", "print(1)"]


def test_the_form_shows_the_api_validation_errors_inline(teammate_web, objects):
    response = teammate_web.post("/jobs/new/", form_data(name="Bad_Name", accelerator="", gpus_per_node="two"))
    page = response.content.decode()
    assert response.status_code == 200
    assert "must be a DNS-1123 label" in page
    assert "A valid integer is required" in page
    assert not Job.objects.filter(name__in=["Bad_Name", "from-the-form"]).exists()


def test_the_form_refuses_a_team_without_quota_for_the_accelerator_on_the_accelerator_field(teammate_web, objects):
    objects["alpha"]["quota"].delete()
    page = teammate_web.post("/jobs/new/", form_data()).content.decode()
    assert ("team alpha has no quota for H100-80GB GPUs: no nominal quota and nothing to borrow, so a job of 2 GPUs "
            "(1 x 2) could never run") in page
    assert not Job.objects.filter(name="from-the-form").exists()


def test_the_yaml_field_submits_a_whole_submission(teammate_web, objects):
    yaml_text = ("team: alpha\nname: from-yaml\nkind: training\nspec:\n  image: python:3.11\n  command: [python, -V]\n"
                 "  resources: {accelerator: H100-80GB, gpus_per_node: 1, nodes: 1}\n  max_runtime_seconds: 60\n")
    response = teammate_web.post("/jobs/new/", {"spec_yaml": yaml_text})
    assert response.status_code == 302
    assert Job.objects.get(name="from-yaml").max_runtime_seconds == 60
    bad = teammate_web.post("/jobs/new/", {"spec_yaml": yaml_text.replace("max_runtime_seconds: 60", "colour: red")})
    page = bad.content.decode()
    assert "spec.colour: unknown field" in page
    without = teammate_web.post("/jobs/new/", {"spec_yaml": yaml_text.replace("  max_runtime_seconds: 60\n", "")})
    assert "spec.max_runtime_seconds: required for training jobs" in without.content.decode()


def test_the_outsider_cannot_submit_for_another_team(outsider_web, objects):
    page = outsider_web.post("/jobs/new/", form_data(team="alpha")).content.decode()
    assert "Select a valid choice" in page  # alpha is not among the outsider's teams
    assert not Job.objects.filter(name="from-the-form").exists()


def test_the_preview_gives_placement_cost_quota_and_budget(teammate_web, objects, h100):
    make_cluster("cheap-h100", "gcp", "us-central1", h100, nodes=1, gpus_per_node=8, price="1.25")
    page = teammate_web.post("/jobs/new/preview/", form_data(gpus_per_node="4", max_runtime_seconds="7200")
                             ).content.decode()
    expected = Decimal(4) * Decimal(7200) / Decimal(3600) * Decimal("1.25")  # 10.00 USD
    assert "cheap-h100" in page and f"${expected:.2f}" in page and "room now" in page
    assert page.count("allows it now") == 2
    # Over the team's 16 nominal GPUs and over the 1000 USD block budget: both say why.
    over = teammate_web.post("/jobs/new/preview/", form_data(gpus_per_node="8", nodes="1",
                                                             max_runtime_seconds=str(200 * 3600))).content.decode()
    assert "over the whole budget" in over
    Quota.objects.filter(team__slug="alpha").update(nominal_gpus=4)
    over_quota = teammate_web.post("/jobs/new/preview/", form_data(gpus_per_node="8")).content.decode()
    assert "over the team&#x27;s limit of 4" in over_quota
    errors = teammate_web.post("/jobs/new/preview/", form_data(accelerator="nope")).content.decode()
    assert "has errors" in errors


def test_staff_edit_quotas_and_budgets_and_it_is_audited(staff, owner_web, teammate_web, objects):
    quota, budget = objects["alpha"]["quota"], objects["alpha"]["budget"]
    staff_web = signed_in(staff)
    page = staff_web.get("/teams/alpha/").content.decode()
    assert f"/teams/alpha/quotas/{quota.pk}/edit/" in page and "Add a budget" in page
    owners = owner_web.get("/teams/alpha/").content.decode()
    assert "/edit/" not in owners and f"/teams/alpha/quotas/{quota.pk}/request/" in owners
    assert "Request a budget" in owners
    teammates = teammate_web.get("/teams/alpha/").content.decode()
    assert "/edit/" not in teammates and "/request/" not in teammates
    response = staff_web.post(f"/teams/alpha/quotas/{quota.pk}/edit/",
                              {"nominal_gpus": "24", "borrowing_limit_gpus": "8", "lending_limit_gpus": "",
                               "max_gpus_per_job": "0"})
    assert response.status_code == 302
    quota.refresh_from_db()
    assert (quota.nominal_gpus, quota.borrowing_limit_gpus) == (24, 8)
    event = AuditRecord.objects.get(object_type="quota", object_id=quota.pk)
    assert event.before["nominal_gpus"] == 16 and event.after["nominal_gpus"] == 24
    response = staff_web.post(f"/teams/alpha/budgets/{budget.pk}/edit/",
                              {"period": "monthly", "amount_usd": "2500.00", "alert_thresholds": "90, 50",
                               "action": "alert"})
    assert response.status_code == 302
    budget.refresh_from_db()
    assert budget.amount_usd == Decimal("2500.00") and budget.alert_thresholds == [50, 90]
    invalid = staff_web.post("/teams/alpha/budgets/new/", {"period": "custom", "amount_usd": "5", "action": "alert"})
    assert invalid.status_code == 200 and "a custom period needs a start" in invalid.content.decode()
    for web in (owner_web, teammate_web):
        assert web.post(f"/teams/alpha/quotas/{quota.pk}/edit/", {"nominal_gpus": "99"}).status_code == 403
    quota.refresh_from_db()
    assert quota.nominal_gpus == 24


def test_staff_edit_any_team(staff, objects):
    web = signed_in(staff)
    response = web.post("/teams/beta/budgets/new/", {"period": "quarterly", "amount_usd": "10", "action": "block",
                                                     "alert_thresholds": ""})
    assert response.status_code == 302
    assert Budget.objects.filter(team__slug="beta", period="quarterly").get().alert_thresholds == [50, 80, 100]


def test_clusters_show_capacity_free_gpus_and_price(owner_web, objects, h100):
    _, pool = make_cluster("emu", "local", "local", h100, nodes=1, gpus_per_node=4, price="0.50")
    pool.cluster.emulated = True
    pool.cluster.save()
    page = owner_web.get("/clusters/").content.decode()
    assert "aws-use1" in page and "emulated GPUs" in page and "$0.50" in page
    assert "<td>2 × 8 GPUs</td><td>16 GPUs</td>" in page  # aws-use1: 2 nodes x 8 GPUs, nothing running


def test_costs_are_scoped_grouped_and_downloadable(owner_web, outsider_web, objects):
    job = objects["alpha"]["job"]
    pool = NodePool.objects.get(cluster__name="aws-use1")
    attempt = make_attempt(job, pool.cluster, pool)
    day = timezone.now().replace(hour=1, minute=0, second=0, microsecond=0)
    add_cost(job, attempt, day, 2, "3.00")  # 1 GPU x 2 h x 3.00 = 6.00 USD
    page = owner_web.get("/costs/?group_by=team").content.decode()
    assert "$6.00" in page and 'data-chart="cost-chart-data"' in page
    assert "$6.00" not in outsider_web.get("/costs/?group_by=team").content.decode()
    csv_text = owner_web.get("/costs.csv?group_by=accelerator").content.decode().splitlines()
    assert csv_text[0] == "accelerator,gpu_hours,cost_usd,unpriced_gpu_hours,unpriced_vcpu_hours"
    assert csv_text[1] == "H100-80GB,2.0,6.00,0.0,0.0" and csv_text[-1] == "total,2.0,6.00,0.0,0.0"
    assert owner_web.get("/costs.csv?start=2026-02-02&end=2026-02-01").status_code == 400


def test_platform_reports_are_for_staff_only(owner_web, staff, objects):
    now = timezone.now()
    platform, _ = generate_report(None, now - dt.timedelta(days=1), now)
    assert owner_web.get(f"/reports/{platform.pk}/").status_code == 404
    assert signed_in(staff).get(f"/reports/{platform.pk}/").status_code == 200
    assert Report.objects.visible_to(get_user_model().objects.get(username="owner")).count() == 1


def test_anonymous_web_pages_redirect_to_login(alpha_objects):
    client = Client()
    job = alpha_objects["job"]
    for url in ("/", "/jobs/", f"/jobs/{job.pk}/", "/costs.csv", "/teams/alpha/", f"/jobs/{job.pk}/cancel/"):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url


def test_a_serving_jobs_page_shows_its_endpoint_and_training_job_while_it_runs(teammate_web, funded_aws_cluster,
                                                                             teams, owner, h100):
    trained = make_job_row(teams[0], owner.user, h100, name="train", state=JobState.SUCCEEDED)
    serving = make_job_row(teams[0], owner.user, h100, name="serve", kind="inference",
                           spec={"command": ["python", "serve.py"], "checkpoint_from": trained.pk})
    attempt = make_attempt(serving, funded_aws_cluster["cluster"], funded_aws_cluster["pool"])
    attempt.runner_state = {"endpoint": "http://serve.cp-alpha.svc:8000"}
    attempt.save(update_fields=["runner_state"])
    whole = teammate_web.get(f"/jobs/{serving.pk}/").content.decode()
    assert "Training efficiency" not in whole and 'id="job-efficiency' not in whole  # a server trains nothing
    assert "Training efficiency" in teammate_web.get(f"/jobs/{trained.pk}/").content.decode()
    page = teammate_web.get(f"/jobs/{serving.pk}/status/").content.decode()
    assert '<dd id="job-endpoint"><a href="http://serve.cp-alpha.svc:8000/healthz">' in page
    assert f'training job <a href="/jobs/{trained.pk}/">#{trained.pk}</a>' in page
    Job.objects.filter(pk=serving.pk).update(state=JobState.CANCELLED)
    page = teammate_web.get(f"/jobs/{serving.pk}/status/").content.decode()
    assert "none: it serves only while RUNNING" in page and "svc:8000" not in page


def test_a_job_running_on_emulated_gpus_without_samples_yet_says_they_are_not_in_yet(teammate_web, objects, h100):
    job = objects["alpha"]["job"]
    cluster, pool = make_cluster("emu", "local", "local", h100, nodes=1, gpus_per_node=4, price="0.50")
    cluster.emulated = True
    cluster.prometheus_url = "http://prometheus.example:9090"  # read (a local DCGM exporter may sample), none yet
    cluster.save()
    make_attempt(job, cluster, pool)  # running: not ended
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-util-empty"' in page and "Not collected yet: the job is running" in page
    assert "ran on emulated GPUs" not in page and 'id="job-usage"' not in page


def test_the_form_submits_and_previews_a_cpu_only_job(teammate_web, objects):
    from costs.seed import seed_cpu_prices
    from runners.models import cpu_flavor

    seed_cpu_prices()
    make_cluster("gcp-cpu", "gcp", "us-central1", cpu_flavor(), nodes=2, gpus_per_node=0)
    form = teammate_web.get("/jobs/new/").content.decode()
    assert "CPU (CPU-only: 0 GPUs per node, give CPU cores)" in form and 'name="cpu"' in form
    cpu_only = form_data(name="prep", accelerator="CPU", gpus_per_node="0", cpu="4", memory_gib="8",
                         max_runtime_seconds="7200")
    page = teammate_web.post("/jobs/new/preview/", cpu_only).content.decode()
    expected = (4 * Decimal("0.031611") + 8 * Decimal("0.004237")) * 2  # 2 hours of 4 vCPUs and 8 GiB
    assert "gcp-cpu" in page and f"${expected:.2f}" in page, page
    response = teammate_web.post("/jobs/new/", cpu_only)
    job = Job.objects.get(name="prep")
    assert response.status_code == 302 and job.total_gpus == 0 and job.spec["resources"]["cpu"] == 4
    missing = teammate_web.post("/jobs/new/", {**cpu_only, "name": "prep-2", "cpu": ""}).content.decode()
    assert "required for a CPU-only job" in missing


def test_the_form_opens_without_a_max_runtime_and_a_serving_job_from_it_runs_unbounded(teammate_web, objects):
    page = teammate_web.get("/jobs/new/").content.decode()
    field = page.split('name="max_runtime_seconds"')[1].split(">")[0]
    assert "value=" not in field  # no training default that would stop a server
    budget = objects["alpha"]["budget"]  # 30 days of a GPU (ADR 0036) would be over the 1000 USD block budget
    budget.amount_usd = Decimal("100000")
    budget.save()
    response = teammate_web.post("/jobs/new/", form_data(kind="inference", name="serve-it", max_runtime_seconds="",
                                                         gpus_per_node="1"))
    assert response.status_code == 302, [line for line in response.content.decode().splitlines() if "error" in line]
    assert Job.objects.get(name="serve-it").max_runtime_seconds is None
    refused = teammate_web.post("/jobs/new/", form_data(name="train-it", max_runtime_seconds="")).content.decode()
    assert "required for training jobs" in refused and not Job.objects.filter(name="train-it").exists()
