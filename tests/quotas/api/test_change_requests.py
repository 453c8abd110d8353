"""Change requests end to end (ADR 0029): a team admin asks, with a reason, for new quota or budget values checked
by the staff write path's rules; staff approve (exactly the requested values are applied, once, even when two
approvals race) or decline with a note; the requester withdraws; an approval of a request whose object changed
since answers 409 and changes nothing; the requester is mailed the decision."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core import mail

from quotas import changes
from quotas.models import AuditRecord, Budget, ChangeRequest, ChangeRequestEvent, Quota
from tests.support.personas import signed_in
from tests.support.racing import run_concurrently

REQUESTS = "/api/v1/change-requests/"


@pytest.fixture
def mailed_owner(owner):
    owner.user.email = "owner@example.com"
    owner.user.save()
    return owner


def ask(persona, **body):
    return persona.client.post(REQUESTS, {"team": "alpha", "reason": "a second training run", **body}, format="json")


def quota_values(quota_id: int) -> dict:
    return Quota.objects.filter(pk=quota_id).values().get()


def test_a_team_admin_asks_staff_approve_and_exactly_the_requested_values_are_applied(
        mailed_owner, staff, alpha_objects, django_capture_on_commit_callbacks):
    owner, quota = mailed_owner, alpha_objects["quota"]
    before = quota_values(quota.pk)
    r = ask(owner, kind="quota", target=quota.pk, payload={"nominal_gpus": 24, "borrowing_limit_gpus": 4})
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["state"], body["requested_by"], body["target"]) == ("pending", "owner", quota.pk)
    assert body["base"]["nominal_gpus"] == 16
    assert quota_values(quota.pk) == before  # asking changes nothing

    with django_capture_on_commit_callbacks(execute=True):  # the mail goes once the approval is committed
        r = staff.client.post(f"{REQUESTS}{body['id']}/approve/", {"note": "fits the fleet"}, format="json")
    assert r.status_code == 200, r.content
    assert (r.json()["state"], r.json()["decided_by"], r.json()["applied"]) == ("approved", "staff", quota.pk)
    assert quota_values(quota.pk) == {**before, "nominal_gpus": 24, "borrowing_limit_gpus": 4}
    event = AuditRecord.objects.get(object_type="quota", object_id=quota.pk)
    assert (event.actor, event.before["nominal_gpus"], event.after["nominal_gpus"]) == (staff.user, 16, 24)
    assert list(ChangeRequestEvent.objects.filter(request_id=body["id"]).values_list("from_state", "to_state")) == [
        ("", "pending"), ("pending", "approved")]
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["owner@example.com"]
    assert "approved" in mail.outbox[0].subject and "fits the fleet" in mail.outbox[0].body


def test_a_new_budget_is_requested_and_created_with_the_requested_values(owner, staff, alpha_objects):
    r = ask(owner, kind="budget", payload={"amount_usd": "250.50", "period": "quarterly", "action": "block"})
    assert r.status_code == 201, r.content
    assert Budget.objects.count() == 1
    approved = staff.client.post(f"{REQUESTS}{r.json()['id']}/approve/", {}, format="json").json()
    budget = Budget.objects.get(pk=approved["applied"])
    assert (budget.team.slug, budget.amount_usd, budget.period, budget.action) == (
        "alpha", Decimal("250.50"), "quarterly", "block")


@pytest.mark.parametrize("payload, field", [
    ({"nominal_gpus": -1}, "nominal_gpus"), ({"nominal_gpus": "lots"}, "nominal_gpus"),
    ({"lending_limit_gpus": 17}, "lending_limit_gpus"), ({"nominal_vcpus": 4}, "nominal_vcpus"),
    ({"accelerator": "TPU"}, "accelerator"), ({"team": "beta"}, "team"), ({"colour": "red"}, "colour"),
])
def test_a_quota_request_that_could_never_be_applied_is_400_naming_the_field(owner, alpha_objects, payload, field):
    r = ask(owner, kind="quota", target=alpha_objects["quota"].pk, payload=payload)
    assert r.status_code == 400, r.content
    assert field in r.json()["payload"], r.json()
    assert not ChangeRequest.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({"kind": "budget", "payload": {"amount_usd": "0"}}, "payload"),
    ({"kind": "budget", "payload": {"period": "custom"}}, "payload"),
    ({"kind": "budget", "payload": {}}, "payload"),
    ({"kind": "budget", "payload": []}, "payload"),
    ({"kind": "budget", "target": 999999, "payload": {"amount_usd": "5"}}, "target"),
    ({"kind": "budget", "payload": {"amount_usd": "5"}, "reason": "  "}, "reason"),
    ({"kind": "seats", "payload": {}}, "kind"),
])
def test_a_bad_budget_request_is_400_and_stores_nothing(owner, alpha_objects, body, field):
    if body.get("payload") == {}:
        body["target"] = alpha_objects["budget"].pk  # asks for no change of it
    r = ask(owner, **body)
    assert r.status_code == 400 and field in r.json(), r.content
    if field == "payload" and isinstance(r.json()["payload"], dict) and "amount_usd" in body["payload"]:
        assert "amount_usd" in r.json()["payload"]
    assert not ChangeRequest.objects.exists()


def test_only_the_teams_admins_ask_and_each_sees_only_their_teams_requests(owner, teammate, viewer, outsider, staff,
                                                                           alpha_objects, beta_objects):
    for persona in (teammate, viewer):
        assert ask(persona, kind="budget", payload={"amount_usd": "5"}).status_code == 403
    refused = ask(outsider, kind="budget", payload={"amount_usd": "5"})
    assert refused.status_code == 400 and "team" in refused.json()
    assert not ChangeRequest.objects.exists()
    mine = ask(owner, kind="budget", payload={"amount_usd": "5"}).json()
    theirs = outsider.client.post(REQUESTS, {"team": "beta", "kind": "budget", "payload": {"amount_usd": "7"},
                                             "reason": "beta's evaluation"}, format="json").json()
    for persona, seen in ((owner, {mine["id"]}), (teammate, {mine["id"]}), (viewer, {mine["id"]}),
                          (outsider, {theirs["id"]}), (staff, {mine["id"], theirs["id"]})):
        assert {r["id"] for r in persona.client.get(REQUESTS).json()["results"]} == seen
    assert outsider.client.get(f"{REQUESTS}{mine['id']}/").status_code == 404


def test_decline_needs_a_note_changes_nothing_but_the_request_and_mails_the_requester(
        mailed_owner, staff, owner, alpha_objects, django_capture_on_commit_callbacks):
    quota = alpha_objects["quota"]
    before = quota_values(quota.pk)
    change = ask(owner, kind="quota", target=quota.pk, payload={"nominal_gpus": 100}).json()
    assert staff.client.post(f"{REQUESTS}{change['id']}/decline/", {}, format="json").status_code == 400
    assert owner.client.post(f"{REQUESTS}{change['id']}/decline/", {"note": "mine"}, format="json").status_code == 403
    assert owner.client.post(f"{REQUESTS}{change['id']}/approve/", {}, format="json").status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        r = staff.client.post(f"{REQUESTS}{change['id']}/decline/", {"note": "the fleet has 16 H100s"},
                              format="json")
    assert r.status_code == 200 and r.json()["state"] == "declined"
    assert r.json()["decision_note"] == "the fleet has 16 H100s"
    assert quota_values(quota.pk) == before
    # the decline is in the audit trail, the quota untouched is not
    assert list(AuditRecord.objects.values_list("object_type", "action", "actor_name")) == [
        ("changerequest", "declined", staff.user.username)]
    assert len(mail.outbox) == 1 and "declined" in mail.outbox[0].subject
    assert "the fleet has 16 H100s" in mail.outbox[0].body
    assert staff.client.post(f"{REQUESTS}{change['id']}/approve/", {}, format="json").status_code == 409
    assert quota_values(quota.pk) == before


def test_the_requester_withdraws_a_pending_request_and_it_can_no_longer_be_approved(owner, teammate, staff,
                                                                                    alpha_objects):
    budget = alpha_objects["budget"]
    change = ask(owner, kind="budget", target=budget.pk, payload={"amount_usd": "1000000.00"}).json()
    assert teammate.client.post(f"{REQUESTS}{change['id']}/withdraw/").status_code == 403
    assert staff.client.post(f"{REQUESTS}{change['id']}/withdraw/").status_code == 403  # the requester's alone
    r = owner.client.post(f"{REQUESTS}{change['id']}/withdraw/")
    assert r.status_code == 200 and r.json()["state"] == "withdrawn"
    assert owner.client.post(f"{REQUESTS}{change['id']}/withdraw/").status_code == 409
    r = staff.client.post(f"{REQUESTS}{change['id']}/approve/", {}, format="json")
    assert r.status_code == 409 and "withdrawn" in r.json()["detail"]
    assert Budget.objects.get(pk=budget.pk).amount_usd == Decimal("1000.00")
    assert not mail.outbox


def test_approving_a_request_whose_object_changed_since_is_409_and_changes_nothing(owner, staff, alpha_objects):
    quota = alpha_objects["quota"]
    change = ask(owner, kind="quota", target=quota.pk, payload={"nominal_gpus": 24}).json()
    assert staff.client.patch(f"/api/v1/quotas/{quota.pk}/", {"borrowing_limit_gpus": 8}, format="json").status_code == 200
    before = quota_values(quota.pk)
    r = staff.client.post(f"{REQUESTS}{change['id']}/approve/", {}, format="json")
    assert r.status_code == 409, r.content
    assert "changed since the request" in r.json()["detail"] and "borrowing_limit_gpus" in r.json()["detail"]
    assert quota_values(quota.pk) == before
    assert ChangeRequest.objects.get(pk=change["id"]).state == "pending"  # still to decline
    assert list(ChangeRequestEvent.objects.values_list("to_state", flat=True)) == ["pending"]


def test_approving_a_request_whose_object_is_gone_is_409(owner, staff, alpha_objects):
    budget = alpha_objects["budget"]
    change = ask(owner, kind="budget", target=budget.pk, payload={"amount_usd": "5"}).json()
    budget.delete()
    r = staff.client.post(f"{REQUESTS}{change['id']}/approve/", {}, format="json")
    assert r.status_code == 409 and "no longer exists" in r.json()["detail"]
    assert not Budget.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_approvals_at_once_apply_the_change_once(owner, staff, alpha_objects):
    quota = alpha_objects["quota"]
    change = ask(owner, kind="quota", target=quota.pk, payload={"nominal_gpus": 24}).json()
    approve = lambda: changes.approve(change["id"], staff.user, "ok").state  # noqa: E731 - two of the same
    results, errors = run_concurrently(approve, approve)
    assert [r for r in results if r is not None] == ["approved"], (results, errors)
    assert len(errors) == 1 and isinstance(errors[0], changes.ChangeConflict), errors
    assert "is approved already" in str(errors[0])
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 24
    assert AuditRecord.objects.filter(object_type="quota", object_id=quota.pk).count() == 1
    assert list(ChangeRequestEvent.objects.values_list("to_state", flat=True)) == ["pending", "approved"]


def test_in_the_web_ui_a_team_admin_is_sent_to_the_request_form_and_staff_approve_it(owner, staff, alpha_objects):
    quota = alpha_objects["quota"]
    web = signed_in(owner)
    edit = web.get(f"/teams/alpha/quotas/{quota.pk}/edit/")
    assert edit.status_code == 302 and edit["Location"] == f"/teams/alpha/quotas/{quota.pk}/request/"
    form = web.get(edit["Location"]).content.decode()
    assert 'name="reason"' in form and "Send the request" in form
    fields = {"nominal_gpus": "16", "borrowing_limit_gpus": "0", "lending_limit_gpus": "", "max_gpus_per_job": "0"}
    bad = web.post(edit["Location"], {**fields, "lending_limit_gpus": "17", "reason": "x"})
    assert bad.status_code == 200 and "at most the nominal quota" in bad.content.decode()
    unchanged = web.post(edit["Location"], {**fields, "reason": "nothing"})
    assert unchanged.status_code == 200 and "change at least one value" in unchanged.content.decode()
    assert not ChangeRequest.objects.exists()
    sent = web.post(edit["Location"], {**fields, "nominal_gpus": "24", "reason": "a second training run"})
    assert sent.status_code == 302 and sent["Location"] == "/requests/"
    change = ChangeRequest.objects.get()
    assert (change.payload, change.reason, change.requested_by) == ({"nominal_gpus": 24}, "a second training run",
                                                                    owner.user)
    mine = web.get("/requests/").content.decode()
    assert f"/requests/{change.pk}/withdraw/" in mine and f"/requests/{change.pk}/approve/" not in mine
    assert web.post(f"/requests/{change.pk}/approve/").status_code == 403
    staff_web = signed_in(staff)
    page = staff_web.get("/requests/").content.decode()
    assert "a second training run" in page and f"/requests/{change.pk}/approve/" in page
    assert staff_web.post(f"/requests/{change.pk}/approve/").status_code == 302
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 24


def test_in_the_web_ui_a_team_admin_requests_a_budget_and_staff_decline_it(owner, staff, alpha_objects):
    web = signed_in(owner)
    assert web.get("/teams/alpha/budgets/new/")["Location"] == "/teams/alpha/budgets/request/"
    sent = web.post("/teams/alpha/budgets/request/", {"period": "monthly", "amount_usd": "300.00",
                                                      "alert_thresholds": "50, 80", "action": "alert",
                                                      "reason": "evaluation runs"})
    assert sent.status_code == 302, sent.content.decode()[:2000]
    change = ChangeRequest.objects.get()
    assert change.payload["amount_usd"] == "300.00" and change.payload["alert_thresholds"] == [50, 80]
    staff_web = signed_in(staff)
    assert staff_web.post(f"/requests/{change.pk}/decline/", {"note": ""}).status_code == 302
    assert ChangeRequest.objects.get().state == "pending"  # a decline needs its note
    assert staff_web.post(f"/requests/{change.pk}/decline/", {"note": "use the monthly one"}).status_code == 302
    assert ChangeRequest.objects.get().state == "declined" and Budget.objects.count() == 1
