"""No one but platform staff changes a quota, budget, cohort, priority class, price or cluster (ADR 0029).

Each persona of team alpha (its admin, a member, a viewer) and an outsider (beta's admin) tries every way in: the
REST API (POST to the list, PUT, PATCH and DELETE of the object), the web UI's forms (POST) and the Django admin
(add, change and delete); every row of those tables, and the audit trail, is compared before and after. Staff
make the same changes through the API and the web UI, and a superuser through the Django admin.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from costs.models import Price
from quotas.models import AuditRecord, Budget, ChangeRequest, Cohort, PriorityClass, Quota
from runners.models import Cluster
from tests.support.personas import signed_in

MODELS = (Quota, Budget, Cohort, PriorityClass, Price, Cluster, AuditRecord, ChangeRequest)
PERSONAS = ("owner", "teammate", "viewer", "outsider")


def rows() -> dict:
    """Every row of the guarded tables (and of the audit trail), as values, in primary-key order."""
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in MODELS}


@pytest.fixture
def world(alpha_objects, beta_objects, aws_cluster, h100):
    """Alpha's 16-GPU quota and $1000 budget, a cohort, a priority class, a catalog price and a cluster."""
    return {
        "quotas": alpha_objects["quota"], "budgets": alpha_objects["budget"],
        "cohorts": Cohort.objects.create(name="research"),
        "priority-classes": PriorityClass.objects.create(name="spare", value=300),
        "prices": Price.objects.filter(accelerator=h100).first(),
        "clusters": aws_cluster["cluster"],
    }


#: A body that would raise the object's capacity or money (or rename the platform's objects), per API prefix.
BODIES = {
    "quotas": {"team": "alpha", "accelerator": "H100-80GB", "nominal_gpus": 100, "borrowing_limit_gpus": 100},
    "budgets": {"team": "alpha", "amount_usd": "1000000.00", "action": "alert"},
    "cohorts": {"name": "mine"},
    "priority-classes": {"name": "mine", "value": 100000},
    "prices": {"provider": "aws", "region": "us-east-1", "accelerator": "H100-80GB", "usd_per_gpu_hour": "0.01"},
    "clusters": {"name": "aws-use1", "provider": "aws", "region": "us-west-2", "backend": "kubernetes"},
}


@pytest.mark.parametrize("persona", PERSONAS)
def test_no_persona_changes_a_quota_budget_cohort_priority_class_price_or_cluster_through_the_api(
        request, persona, world):
    client = request.getfixturevalue(persona).client
    before = rows()
    for prefix, obj in world.items():
        body = BODIES[prefix]
        attempts = [("post", f"/api/v1/{prefix}/", body)] + [
            (method, f"/api/v1/{prefix}/{obj.pk}/", body) for method in ("put", "patch", "delete")]
        for method, url, data in attempts:
            response = getattr(client, method)(url, data, format="json")
            hidden = persona == "outsider" and prefix in ("quotas", "budgets") and method != "post"
            # 404: another team's object; 405: a method the resource never serves (prices are read-only, quotas,
            # budgets and clusters are never deleted); 403 otherwise.
            assert response.status_code in ((404, 405) if hidden else (403, 405)), (persona, method, url,
                                                                                    response.content)
            if prefix in ("quotas", "budgets", "cohorts", "priority-classes") and method in ("post", "put", "patch"):
                assert response.status_code == (404 if hidden else 403), (persona, method, url)
    assert rows() == before


@pytest.mark.parametrize("persona", PERSONAS)
def test_no_persona_changes_a_quota_or_budget_through_the_web_forms(request, persona, world):
    web = signed_in(request.getfixturevalue(persona))
    quota, budget = world["quotas"], world["budgets"]
    before = rows()
    quota_form = {"nominal_gpus": "100", "borrowing_limit_gpus": "100", "lending_limit_gpus": "", "max_gpus_per_job": "0"}
    budget_form = {"period": "monthly", "amount_usd": "1000000.00", "alert_thresholds": "50", "action": "alert"}
    for url, form in ((f"/teams/alpha/quotas/{quota.pk}/edit/", quota_form),
                      (f"/teams/alpha/budgets/{budget.pk}/edit/", budget_form),
                      ("/teams/alpha/budgets/new/", budget_form)):
        response = web.post(url, form)
        assert response.status_code == (404 if persona == "outsider" else 403), (persona, url)
    assert rows() == before


ADMIN_PATHS = {"quotas": "quotas/quota", "budgets": "quotas/budget", "cohorts": "quotas/cohort",
               "priority-classes": "quotas/priorityclass", "prices": "costs/price", "clusters": "runners/cluster"}


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_django_admin_is_no_way_in_for_any_persona(request, persona, world):
    web = signed_in(request.getfixturevalue(persona))
    before = rows()
    for prefix, obj in world.items():
        path = ADMIN_PATHS[prefix]
        for url, data in ((f"/admin/{path}/add/", BODIES[prefix]),
                          (f"/admin/{path}/{obj.pk}/change/", BODIES[prefix]),
                          (f"/admin/{path}/{obj.pk}/delete/", {"post": "yes"})):
            response = web.post(url, data)
            assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), (persona, url)
    assert web.get("/admin/").status_code == 302
    assert rows() == before


def test_staff_change_each_of_them_through_the_api(staff, world):
    quota, budget = world["quotas"], world["budgets"]
    client = staff.client
    assert client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": 4}, format="json").status_code == 200
    assert client.patch(f"/api/v1/budgets/{budget.pk}/", {"amount_usd": "5.00"}, format="json").status_code == 200
    assert client.patch(f"/api/v1/cohorts/{world['cohorts'].pk}/", {"name": "vision"}, format="json").status_code == 200
    assert client.patch(f"/api/v1/priority-classes/{world['priority-classes'].pk}/", {"value": 301},
                        format="json").status_code == 200
    assert client.patch(f"/api/v1/clusters/{world['clusters'].pk}/", {"region": "us-east-2"},
                        format="json").status_code == 200
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 4
    assert Budget.objects.get(pk=budget.pk).amount_usd == Decimal("5.00")
    assert Cohort.objects.get(pk=world["cohorts"].pk).name == "vision"
    assert PriorityClass.objects.get(pk=world["priority-classes"].pk).value == 301
    assert Cluster.objects.get(pk=world["clusters"].pk).region == "us-east-2"


def test_staff_change_a_quota_and_a_budget_through_the_web_forms(staff, world):
    web = signed_in(staff)
    quota, budget = world["quotas"], world["budgets"]
    assert web.post(f"/teams/alpha/quotas/{quota.pk}/edit/", {"nominal_gpus": "4", "borrowing_limit_gpus": "0",
                                                              "lending_limit_gpus": "", "max_gpus_per_job": "0"}
                    ).status_code == 302
    assert web.post(f"/teams/alpha/budgets/{budget.pk}/edit/", {"period": "monthly", "amount_usd": "5.00",
                                                               "alert_thresholds": "50", "action": "block"}
                    ).status_code == 302
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 4
    assert Budget.objects.get(pk=budget.pk).amount_usd == Decimal("5.00")


def test_a_superuser_changes_a_quota_and_a_price_through_the_django_admin(world):
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")
    web = signed_in(type("P", (), {"user": admin})())
    quota, price = world["quotas"], world["prices"]
    response = web.post(f"/admin/quotas/quota/{quota.pk}/change/", {
        "team": quota.team_id, "accelerator": quota.accelerator_id, "cluster": "", "nominal_gpus": "4",
        "borrowing_limit_gpus": "0", "lending_limit_gpus": "", "max_gpus_per_job": "0", "nominal_vcpus": "0",
        "borrowing_limit_vcpus": "0", "lending_limit_vcpus": "", "max_vcpus_per_job": "0"})
    assert response.status_code == 302, response.content[:500]
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 4
    assert web.post(f"/admin/costs/price/{price.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Price.objects.filter(pk=price.pk).exists()
