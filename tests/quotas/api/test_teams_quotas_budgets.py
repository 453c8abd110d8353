"""Teams, quotas and budgets: members read, staff write (ADR 0029), bad input changes nothing."""

from __future__ import annotations

from decimal import Decimal

import pytest

from quotas.models import Budget, Quota

QUOTAS = "/api/v1/quotas/"
BUDGETS = "/api/v1/budgets/"


def test_it_lists_teams_with_members_and_roles(owner, teammate, viewer):
    body = teammate.client.get("/api/v1/teams/").json()
    assert [t["slug"] for t in body["results"]] == ["alpha"]
    members = {m["username"]: m["role"] for m in body["results"][0]["members"]}
    assert members == {"owner": "admin", "teammate": "member", "viewer": "viewer"}
    assert teammate.client.get("/api/v1/teams/alpha/").status_code == 200
    assert teammate.client.get("/api/v1/teams/beta/").status_code == 404


def test_staff_see_every_team(staff):
    assert [t["slug"] for t in staff.client.get("/api/v1/teams/").json()["results"]] == ["alpha", "beta"]


# --- Quotas

def test_members_read_their_teams_quotas(teammate, viewer, alpha_objects, beta_objects):
    for persona in (teammate, viewer):
        body = persona.client.get(QUOTAS).json()
        assert [(q["team"], q["accelerator"], q["nominal_gpus"], q["limit_gpus"]) for q in body["results"]] == [
            ("alpha", "H100-80GB", 16, 16)
        ]


def test_staff_create_and_update_a_quota(staff, teams, catalog, aws_cluster):
    r = staff.client.post(QUOTAS, {"team": "alpha", "accelerator": "A100-80GB", "nominal_gpus": 8,
                                   "borrowing_limit_gpus": 4, "max_gpus_per_job": 8}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["limit_gpus"] == 12 and r.json()["cluster"] is None
    quota_id = r.json()["id"]
    r = staff.client.patch(f"{QUOTAS}{quota_id}/", {"nominal_gpus": 16, "cluster": "aws-use1"}, format="json")
    assert r.status_code == 200, r.content
    quota = Quota.objects.get(pk=quota_id)
    assert (quota.nominal_gpus, quota.borrowing_limit_gpus, quota.cluster.name) == (16, 4, "aws-use1")


def test_a_member_cannot_edit_quotas(teammate, viewer, alpha_objects, catalog):
    quota = alpha_objects["quota"]
    for persona in (teammate, viewer):
        r = persona.client.patch(f"{QUOTAS}{quota.pk}/", {"nominal_gpus": 64}, format="json")
        assert r.status_code == 403
        r = persona.client.post(QUOTAS, {"team": "alpha", "accelerator": "L4", "nominal_gpus": 1}, format="json")
        assert r.status_code == 403
    quota.refresh_from_db()
    assert quota.nominal_gpus == 16
    assert Quota.objects.count() == 1


def test_an_outsider_cannot_see_or_edit_another_teams_quota(outsider, alpha_objects, beta_objects):
    quota = alpha_objects["quota"]
    assert outsider.client.get(f"{QUOTAS}{quota.pk}/").status_code == 404
    assert outsider.client.patch(f"{QUOTAS}{quota.pk}/", {"nominal_gpus": 0}, format="json").status_code == 404
    r = outsider.client.post(QUOTAS, {"team": "alpha", "accelerator": "L4", "nominal_gpus": 1}, format="json")
    assert r.status_code == 403  # only staff create quotas, for any team
    quota.refresh_from_db()
    assert quota.nominal_gpus == 16


@pytest.mark.parametrize("change, field", [
    ({"nominal_gpus": -1}, "nominal_gpus"),
    ({"nominal_gpus": "8"}, "nominal_gpus"),
    ({"nominal_gpus": 1.5}, "nominal_gpus"),
    ({"borrowing_limit_gpus": True}, "borrowing_limit_gpus"),
    ({"max_gpus_per_job": -4}, "max_gpus_per_job"),
    ({"nominal_gpus": 2**31}, "nominal_gpus"),
    ({"accelerator": "TPU"}, "accelerator"),
    ({"cluster": "nowhere"}, "cluster"),
    ({"team": "beta"}, "team"),
])
def test_bad_quota_input_changes_nothing(staff, alpha_objects, change, field):
    quota = alpha_objects["quota"]
    r = staff.client.patch(f"{QUOTAS}{quota.pk}/", change, format="json")
    assert r.status_code == 400, r.content
    assert field in r.json()
    quota.refresh_from_db()
    assert (quota.nominal_gpus, quota.borrowing_limit_gpus, quota.max_gpus_per_job) == (16, 0, 0)
    assert quota.team.slug == "alpha"


def test_a_duplicate_quota_is_refused(staff, alpha_objects):
    r = staff.client.post(QUOTAS, {"team": "alpha", "accelerator": "H100-80GB", "nominal_gpus": 1}, format="json")
    assert r.status_code == 400
    assert "already has a H100-80GB quota" in r.json()["accelerator"][0]
    assert Quota.objects.count() == 1


def test_staff_edit_any_teams_quota(staff, beta_objects):
    quota = beta_objects["quota"]
    assert staff.client.patch(f"{QUOTAS}{quota.pk}/", {"nominal_gpus": 0}, format="json").status_code == 200
    quota.refresh_from_db()
    assert quota.nominal_gpus == 0


# --- Budgets

def test_members_read_their_teams_budgets(teammate, alpha_objects, beta_objects):
    body = teammate.client.get(BUDGETS).json()
    assert [(b["team"], b["amount_usd"], b["action"], b["alert_thresholds"]) for b in body["results"]] == [
        ("alpha", "1000.00", "block", [50, 80, 100])
    ]
    assert body["results"][0]["window_start"] is not None


def test_staff_create_and_update_a_budget(staff, teams):
    r = staff.client.post(BUDGETS, {"team": "alpha", "period": "quarterly", "amount_usd": "2500.50",
                                    "alert_thresholds": [100, 50, 120.5, 50], "action": "block"}, format="json")
    assert r.status_code == 201, r.content
    budget = Budget.objects.get(pk=r.json()["id"])
    assert budget.amount_usd == Decimal("2500.50")
    assert budget.alert_thresholds == [50, 100, 120.5]
    r = staff.client.patch(f"{BUDGETS}{budget.pk}/", {"action": "alert", "stop_running": True}, format="json")
    assert r.status_code == 200, r.content
    budget.refresh_from_db()
    assert (budget.action, budget.stop_running) == ("alert", True)


def test_a_custom_budget_needs_aware_ordered_dates(staff, teams):
    base = {"team": "alpha", "period": "custom", "amount_usd": "10"}
    r = staff.client.post(BUDGETS, base, format="json")
    assert set(r.json()) == {"starts_at", "ends_at"}
    r = staff.client.post(BUDGETS, {**base, "starts_at": "2025-02-01T00:00:00", "ends_at": "2025-03-01T00:00:00Z"},
                          format="json")
    assert "timezone" in r.json()["starts_at"][0]
    r = staff.client.post(BUDGETS, {**base, "starts_at": "2025-03-01T00:00:00Z", "ends_at": "2025-02-01T00:00:00Z"},
                          format="json")
    assert r.json() == {"ends_at": ["must be after starts_at"]}
    r = staff.client.post(BUDGETS, {**base, "starts_at": "2025-02-01T00:00:00Z", "ends_at": "2025-03-01T00:00:00Z"},
                          format="json")
    assert r.status_code == 201, r.content
    assert r.json()["window_start"].startswith("2025-02-01")
    assert Budget.objects.count() == 1


def test_a_member_cannot_edit_budgets(teammate, alpha_objects):
    budget = alpha_objects["budget"]
    r = teammate.client.patch(f"{BUDGETS}{budget.pk}/", {"amount_usd": "999999"}, format="json")
    assert r.status_code == 403
    r = teammate.client.post(BUDGETS, {"team": "alpha", "amount_usd": "1"}, format="json")
    assert r.status_code == 403
    budget.refresh_from_db()
    assert budget.amount_usd == Decimal("1000.00")
    assert Budget.objects.count() == 1


def test_an_outsider_gets_404_on_another_teams_budget(outsider, alpha_objects, beta_objects):
    budget = alpha_objects["budget"]
    assert outsider.client.get(f"{BUDGETS}{budget.pk}/").status_code == 404
    assert outsider.client.put(f"{BUDGETS}{budget.pk}/", {"team": "alpha", "amount_usd": "1"},
                               format="json").status_code == 404


@pytest.mark.parametrize("change, field", [
    ({"amount_usd": "0"}, "amount_usd"),
    ({"amount_usd": "-5"}, "amount_usd"),
    ({"amount_usd": "ten"}, "amount_usd"),
    ({"amount_usd": "1.005"}, "amount_usd"),
    ({"amount_usd": True}, "amount_usd"),
    ({"alert_thresholds": [0]}, "alert_thresholds"),
    ({"alert_thresholds": [1000.01]}, "alert_thresholds"),
    ({"alert_thresholds": ["50"]}, "alert_thresholds"),
    ({"alert_thresholds": [True]}, "alert_thresholds"),
    ({"alert_thresholds": 50}, "alert_thresholds"),
    ({"action": "shutdown"}, "action"),
    ({"stop_running": "yes"}, "stop_running"),
    ({"period": "weekly"}, "period"),
    ({"starts_at": "2025-01-01T00:00:00Z"}, "period"),
])
def test_bad_budget_input_changes_nothing(staff, alpha_objects, change, field):
    budget = alpha_objects["budget"]
    r = staff.client.patch(f"{BUDGETS}{budget.pk}/", change, format="json")
    assert r.status_code == 400, r.content
    assert field in r.json()
    budget.refresh_from_db()
    assert (budget.amount_usd, budget.alert_thresholds, budget.action, budget.period, budget.stop_running) == (
        Decimal("1000.00"), [50, 80, 100], "block", "monthly", False)
