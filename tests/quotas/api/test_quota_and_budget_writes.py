"""Writes to quotas and budgets (staff's alone, ADR 0029): bad values answer 400 on their field and change nothing
(no audit event either); the team's admins, members and viewers cannot write (403) and outsiders get 404 for
another team's objects; per-cluster
quotas cannot be duplicated or moved onto each other; a quota lowered below use is accepted and audited."""

from __future__ import annotations

import pytest

from quotas.models import AuditRecord, Budget, Quota
from tests.support.factories import make_attempt, make_job


@pytest.mark.parametrize("field,value", [
    ("nominal_gpus", -1), ("nominal_gpus", "8"), ("nominal_gpus", 8.0), ("nominal_gpus", True), ("nominal_gpus", None),
    ("nominal_gpus", 2**31), ("nominal_gpus", 2**64), ("borrowing_limit_gpus", -5), ("max_gpus_per_job", "x"),
    ("lending_limit_gpus", 17), ("lending_limit_gpus", -1), ("accelerator", "TPU"), ("accelerator", None),
    ("cluster", "nowhere"), ("cluster", ["aws-use1"]), ("team", "beta"), ("team", "nope"), ("team", None),
    ("team", ["alpha"]), ("nominal_gpus", [8]), ("nominal_gpus", {"v": 8}),
])
def test_bad_quota_patch_is_400(staff, alpha_objects, beta_objects, field, value):
    quota = alpha_objects["quota"]
    events = AuditRecord.objects.count()
    response = staff.client.patch(f"/api/v1/quotas/{quota.pk}/", {field: value}, format="json")
    assert response.status_code == 400, (field, value, response.status_code, response.content[:300])
    assert field in response.json()
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 16
    assert AuditRecord.objects.count() == events


def test_quota_lowered_below_use_is_accepted_and_audited(staff, alpha_objects, aws_cluster, h100, teams, teammate):
    job = make_job(teams[0], teammate.user, h100, gpus_per_node=8, nodes=2)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    response = staff.client.patch(f"/api/v1/quotas/{alpha_objects['quota'].pk}/", {"nominal_gpus": 0}, format="json")
    assert response.status_code == 200
    assert AuditRecord.objects.filter(action="updated").exists()


def test_member_viewer_and_outsider_cannot_edit_quota_or_budget(teammate, viewer, outsider, alpha_objects):
    quota, budget = alpha_objects["quota"], alpha_objects["budget"]
    for persona, status in ((teammate, 403), (viewer, 403), (outsider, 404)):
        assert persona.client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": 1}, format="json").status_code == status
        assert persona.client.put(f"/api/v1/quotas/{quota.pk}/", {"team": "alpha", "accelerator": "H100-80GB",
                                                                   "nominal_gpus": 1}, format="json").status_code == status
        assert persona.client.patch(f"/api/v1/budgets/{budget.pk}/", {"amount_usd": "1"}, format="json").status_code == status
        assert persona.client.delete(f"/api/v1/quotas/{quota.pk}/").status_code == 405  # quotas are never deleted
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 16
    assert str(Budget.objects.get(pk=budget.pk).amount_usd) == "1000.00"


def test_member_cannot_create_quota_or_budget(teammate, viewer, alpha_objects, catalog):
    for persona in (teammate, viewer):
        r = persona.client.post("/api/v1/quotas/", {"team": "alpha", "accelerator": "L4", "nominal_gpus": 4}, format="json")
        assert r.status_code == 403
        r = persona.client.post("/api/v1/budgets/", {"team": "alpha", "amount_usd": "5"}, format="json")
        assert r.status_code == 403
    assert Quota.objects.count() == 1 and Budget.objects.count() == 1


def test_admin_of_alpha_cannot_touch_beta(owner, alpha_objects, beta_objects, catalog):
    quotas, budgets, events = Quota.objects.count(), Budget.objects.count(), AuditRecord.objects.count()
    r = owner.client.post("/api/v1/quotas/", {"team": "beta", "accelerator": "L4", "nominal_gpus": 4}, format="json")
    assert r.status_code == 403  # no create by anyone but staff, whatever the team
    r = owner.client.post("/api/v1/budgets/", {"team": "beta", "amount_usd": "5"}, format="json")
    assert r.status_code == 403
    r = owner.client.patch(f"/api/v1/quotas/{beta_objects['quota'].pk}/", {"team": "alpha", "nominal_gpus": 99}, format="json")
    assert r.status_code == 404
    r = owner.client.patch(f"/api/v1/budgets/{beta_objects['budget'].pk}/", {"team": "alpha"}, format="json")
    assert r.status_code == 404
    r = owner.client.patch(f"/api/v1/budgets/{alpha_objects['budget'].pk}/", {"team": "beta"}, format="json")
    assert r.status_code == 403  # alpha's budget, which its admin sees but does not write
    assert (Quota.objects.count(), Budget.objects.count(), AuditRecord.objects.count()) == (quotas, budgets, events)
    assert Quota.objects.get(pk=beta_objects["quota"].pk).nominal_gpus == 8


@pytest.mark.parametrize("field,value", [
    ("amount_usd", "-1"), ("amount_usd", "0"), ("amount_usd", "NaN"), ("amount_usd", "Infinity"),
    ("amount_usd", "1e20"), ("amount_usd", "0.001"), ("amount_usd", "abc"), ("amount_usd", True),
    ("amount_usd", None), ("amount_usd", [1]), ("alert_thresholds", [True]), ("alert_thresholds", [0]),
    ("alert_thresholds", [1001]), ("alert_thresholds", "50"), ("alert_thresholds", ["50"]),
    ("action", "kill"), ("period", "weekly"), ("stop_running", "yes"), ("stop_running", 1),
    ("starts_at", "2026-01-01T00:00:00"), ("starts_at", "2026-02-30T00:00:00Z"), ("ends_at", "2026-01-01T00:00:00+25:00"),
])
def test_bad_budget_patch_is_400(staff, alpha_objects, field, value):
    budget = alpha_objects["budget"]
    response = staff.client.patch(f"/api/v1/budgets/{budget.pk}/", {field: value}, format="json")
    assert response.status_code == 400, (field, value, response.status_code, response.content[:300])
    assert str(Budget.objects.get(pk=budget.pk).amount_usd) == "1000.00"


@pytest.mark.parametrize("patch", [{"nominal_gpus": -1}, {"nominal_gpus": "lots"}, {"nominal_gpus": 2**40},
                                   {"borrowing_limit_gpus": -5}, {"cluster": 999999}, {"cluster": "nope"},
                                   {"cluster": ["x"]}, {"nominal_gpus": None}, {"nominal_gpus": 1.5}])
def test_bad_per_cluster_quota_values_get_400(staff, alpha, h100, aws_cluster, patch):
    body = {"team": alpha.slug, "accelerator": h100.name, "cluster": aws_cluster["cluster"].name, "nominal_gpus": 8,
            "borrowing_limit_gpus": 0}
    body.update(patch)
    r = staff.client.post("/api/v1/quotas/", body, format="json")
    assert r.status_code == 400, (r.status_code, r.content[:300])


def test_a_duplicate_per_cluster_quota_gets_400_not_500(staff, alpha, h100, aws_cluster):
    body = {"team": alpha.slug, "accelerator": h100.name, "cluster": aws_cluster["cluster"].name, "nominal_gpus": 8}
    assert staff.client.post("/api/v1/quotas/", body, format="json").status_code == 201
    r = staff.client.post("/api/v1/quotas/", {**body, "nominal_gpus": 64}, format="json")
    assert r.status_code == 400, (r.status_code, r.content[:300])
    assert Quota.objects.filter(team=alpha, cluster=aws_cluster["cluster"]).count() == 1


def test_moving_a_per_cluster_quota_onto_an_existing_one_gets_400_not_500(
        staff, alpha, h100, aws_cluster, quota_factory, cluster_factory):
    other, _ = cluster_factory("other", "gcp", "us-central1", h100)
    quota_factory(alpha, h100, nominal=16)
    body = {"team": alpha.slug, "accelerator": h100.name, "nominal_gpus": 8}
    a = staff.client.post("/api/v1/quotas/", {**body, "cluster": aws_cluster["cluster"].name}, format="json").json()["id"]
    b = staff.client.post("/api/v1/quotas/", {**body, "cluster": other.name}, format="json").json()["id"]
    for patch, target in (({"cluster": None}, a), ({"cluster": other.name}, a), ({"cluster": aws_cluster["cluster"].name}, b)):
        r = staff.client.patch(f"/api/v1/quotas/{target}/", patch, format="json")
        assert r.status_code == 400, (patch, r.status_code, r.content[:300])
