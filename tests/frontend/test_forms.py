"""The web UI's forms apply the API's rules: quota and budget edits by staff only and with valid values,
hostile YAML in the job form answered with the form again, and the costs page and CSV never a 500."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from jobs.models import Job
from quotas.models import Budget
from tests.support.personas import signed_in


@pytest.mark.parametrize("params, csv_status", [
    ({"start": "2026-13-01"}, 400), ({"end": "yesterday"}, 400), ({"group_by": "user"}, 400), ({"team": "beta"}, 400),
    ({"start": "0001-01-01", "end": "9999-12-31"}, 400),
    ({"end": "0001-01-03"}, 200), ({"start": "9999-12-31"}, 400), ({"start": "2026-02-30"}, 400),
])
def test_costs_web_page_and_csv_never_500(owner, alpha_ledger, params, csv_status):
    """The page shows the form with its errors (200); the CSV download answers 400 for what the page refuses."""
    client = signed_in(owner)
    assert client.get("/costs/?" + urlencode(params)).status_code == 200
    assert client.get("/costs.csv?" + urlencode(params)).status_code == csv_status


def test_the_web_quota_form_applies_the_api_rules(staff, alpha_objects):
    quota = alpha_objects["quota"]
    client = signed_in(staff)
    url = f"/teams/alpha/quotas/{quota.pk}/edit/"
    base = {"nominal_gpus": 16, "borrowing_limit_gpus": 0, "max_gpus_per_job": 0, "lending_limit_gpus": ""}
    for bad in ({"nominal_gpus": -1}, {"nominal_gpus": "x"}, {"nominal_gpus": 2**40}, {"lending_limit_gpus": 17}):
        response = client.post(url, {**base, **bad})
        assert response.status_code == 200, bad  # the form again, with its error
        quota.refresh_from_db()
        assert quota.nominal_gpus == 16 and quota.lending_limit_gpus is None, bad


def test_a_team_admin_or_member_cannot_edit_quotas_or_budgets_in_the_web_ui(owner, teammate, alpha_objects):
    quota, budget = alpha_objects["quota"], alpha_objects["budget"]
    for persona in (owner, teammate):
        client = signed_in(persona)
        assert client.post(f"/teams/alpha/quotas/{quota.pk}/edit/", {"nominal_gpus": 1}).status_code == 403
        assert client.post(f"/teams/alpha/budgets/{budget.pk}/edit/", {"amount_usd": "1"}).status_code == 403
        assert client.post("/teams/alpha/budgets/new/", {"amount_usd": "1"}).status_code == 403
    quota.refresh_from_db()
    assert quota.nominal_gpus == 16 and str(Budget.objects.get().amount_usd) == "1000.00"


@pytest.mark.parametrize("amount", ["-5", "0", "NaN", "1e20"])
def test_a_web_budget_amount_must_be_positive(staff, alpha_objects, amount):
    client = signed_in(staff)
    response = client.post("/teams/alpha/budgets/new/", {"period": "monthly", "amount_usd": amount,
                                                          "alert_thresholds": "50", "action": "alert"})
    assert response.status_code == 200
    assert Budget.objects.count() == 1


@pytest.mark.parametrize("text", [
    "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
    "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
    "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\nteam: alpha\nname: bomb\nspec: {env: {A: x}, args: *i}\n",
    "[" * 20_000 + "]" * 20_000,
    "team: alpha\nname: x\nspec: {2024-01-01: x}\n",
    "team: !!python/object/apply:os.system ['true']\n",
    'team: alpha\nname: nul\nspec: {image: x, command: ["a\\0b"], resources: {accelerator: H100-80GB, '
    "gpus_per_node: 1, nodes: 1}, max_runtime_seconds: 60}\n",
])
def test_hostile_yaml_in_the_web_form_shows_the_form_again_and_stores_nothing(owner, aws_cluster, text):
    jobs = Job.objects.count()
    for url in ("/jobs/new/", "/jobs/new/preview/"):
        response = signed_in(owner).post(url, {"spec_yaml": text})
        assert response.status_code == 200, url
    assert Job.objects.count() == jobs


def test_the_web_yaml_box_has_the_api_size_cap(owner, aws_cluster, settings):
    # a valid submission padded with a comment past 4 x JOB_SPEC_MAX_BYTES bytes (the API's cap)
    limit = 4 * settings.JOB_SPEC_MAX_BYTES
    text = "team: alpha\nname: big\nkind: training\nspec: {image: x, command: [x]}\n#" + "x" * limit
    api = owner.client.post("/api/v1/jobs/", data=text, content_type="application/yaml")
    assert api.status_code == 400
    for url in ("/jobs/new/", "/jobs/new/preview/"):
        response = signed_in(owner).post(url, {"spec_yaml": text})
        assert response.status_code == 200, url
        assert f"YAML body over {limit} bytes" in response.content.decode(), url
    assert Job.objects.count() == 0


@pytest.mark.parametrize("thresholds, stored", [("5000", False), ("1001", False), ("0", False), ("50, 1000", True)])
def test_web_budget_thresholds_follow_the_api_limits(staff, alpha_objects, thresholds, stored):
    body = {"period": "monthly", "amount_usd": "10", "alert_thresholds": thresholds, "action": "alert"}
    signed_in(staff).post("/teams/alpha/budgets/new/", body)
    api = staff.client.post("/api/v1/budgets/", {"team": "alpha", "period": "monthly", "amount_usd": "10",
                                                 "alert_thresholds": [int(t) for t in thresholds.split(",")],
                                                 "action": "alert"}, format="json")
    assert Budget.objects.filter(amount_usd=10).count() == (2 if stored else 0)
    assert api.status_code == (201 if stored else 400)
