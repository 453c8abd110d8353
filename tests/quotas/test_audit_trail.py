"""The audit trail (ADR 0031): every write path of a governed object appends one record with the actor, the values
before and after and the reason, in the change's own transaction; records cannot be changed or deleted (in Python
and, on PostgreSQL, by trigger); the API, the page and the team's page show staff every record and anyone else
their own teams' only.

Expected values are written out from the requests the tests make, never read back from the code under test.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import ProgrammingError, connection, transaction
from django.test import Client
from django.utils import timezone

from costs.models import Price
from quotas import changes
from quotas.audit import record, snapshot
from quotas.models import AuditRecord, Membership, Quota, Team
from runners.models import Node
from tests.support.personas import signed_in

AUDIT = "/api/v1/audit/"


def only_record(**match) -> AuditRecord:
    """The one record matching ``match``; fails when there are none or several."""
    found = list(AuditRecord.objects.filter(**match))
    assert len(found) == 1, [(r.object_type, r.action, r.object_id) for r in AuditRecord.objects.all()]
    return found[0]


@pytest.fixture
def node(aws_cluster):
    """A GPU node of aws-use1's pool, as a sync records it."""
    return Node.objects.create(cluster=aws_cluster["cluster"], node_pool=aws_cluster["pool"], name="ip-10-0-0-1",
                               gpus=8, cpu_milli=64_000, memory_mib=512 * 1024, seen_at=timezone.now())


@pytest.fixture
def root(teams):
    """A superuser's web client (the Django admin)."""
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-root"))
    return client


# --- each write path ---------------------------------------------------------------------------------------------

def test_an_api_quota_change_records_who_before_after_and_the_reason_from_the_header(staff, alpha_objects):
    quota = alpha_objects["quota"]
    reason = "a second training run — für das Team"  # UTF-8, percent-encoded as cpctl sends it
    r = staff.client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": 24}, format="json",
                           headers={"X-Audit-Reason": urllib.parse.quote(reason, safe=" ")})
    assert r.status_code == 200, r.content
    rec = only_record(object_type="quota", object_id=quota.pk)
    assert (rec.actor_id, rec.actor_name, rec.action, rec.team_id, rec.reason) == (
        staff.user.pk, "staff", "updated", quota.team_id, reason)
    assert (rec.before["nominal_gpus"], rec.after["nominal_gpus"]) == (16, 24)
    assert [name for name, _, _ in rec.changes] == ["nominal_gpus"]


def test_api_budget_writes_record_money_as_decimal_strings(staff, alpha_objects, alpha):
    budget = alpha_objects["budget"]
    assert staff.client.patch(f"/api/v1/budgets/{budget.pk}/", {"amount_usd": "2500.10"}, format="json",
                              headers={"X-Audit-Reason": "finance approved Q3"}).status_code == 200
    created = staff.client.post("/api/v1/budgets/", {"team": "alpha", "amount_usd": "0.30"}, format="json")
    assert created.status_code == 201, created.content
    updated = only_record(object_type="budget", object_id=budget.pk, action="updated")
    assert (updated.before["amount_usd"], updated.after["amount_usd"], updated.reason) == (
        "1000.00", "2500.10", "finance approved Q3")
    new = only_record(object_type="budget", action="created")
    assert (new.object_id, new.before, new.after["amount_usd"], new.reason, new.team_id) == (
        created.json()["id"], {}, "0.30", "", alpha.pk)


def test_a_refused_api_write_records_nothing(staff, owner, alpha_objects):
    quota = alpha_objects["quota"]
    assert staff.client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": -1}, format="json").status_code == 400
    assert owner.client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": 99}, format="json").status_code == 403
    assert not AuditRecord.objects.exists()


def test_node_cordon_uncordon_and_clear_from_the_api_are_recorded(staff, node):
    assert staff.client.post(f"/api/v1/nodes/{node.pk}/cordon/", {"note": "reseating GPU 3"},
                             format="json").status_code == 200
    assert staff.client.post(f"/api/v1/nodes/{node.pk}/uncordon/", {}, format="json",
                             headers={"X-Audit-Reason": "GPU reseated"}).status_code == 200
    assert staff.client.post(f"/api/v1/nodes/{node.pk}/clear/", {}, format="json",
                             headers={"X-Audit-Reason": "false alarm"}).status_code == 200
    got = [(r.action, r.reason, r.before["cordoned"], r.after["cordoned"], r.team_id)
           for r in AuditRecord.objects.filter(object_type="node", object_id=node.pk).order_by("id")]
    assert got == [("cordoned", "reseating GPU 3", False, True, None), ("uncordoned", "GPU reseated", True, False, None),
                   ("cleared", "false alarm", False, False, None)]


def test_a_cordon_whose_record_cannot_be_written_does_not_happen(staff, node):
    """The change and its record are one transaction: with the table refusing inserts (a trigger the test adds),
    the cordon fails and the node stays as it was."""
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE FUNCTION refuse_insert() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION USING MESSAGE = 'no room for the record'; END; $$ LANGUAGE plpgsql;
            CREATE TRIGGER refuse_insert BEFORE INSERT ON quotas_auditrecord
                FOR EACH ROW EXECUTE FUNCTION refuse_insert();""")
    with pytest.raises(Exception, match="no room for the record"):
        staff.client.post(f"/api/v1/nodes/{node.pk}/cordon/", {"note": "reseating"}, format="json")
    assert Node.objects.filter(pk=node.pk).values_list("cordoned", "cordon_note").get() == (False, "")
    assert not AuditRecord.objects.exists()


def test_the_web_forms_and_node_buttons_record_the_reason_field(staff, alpha_objects, node):
    web = signed_in(staff)
    quota, budget = alpha_objects["quota"], alpha_objects["budget"]
    r = web.post(f"/teams/alpha/quotas/{quota.pk}/edit/", {
        "nominal_gpus": "20", "borrowing_limit_gpus": "0", "max_gpus_per_job": "0", "lending_limit_gpus": "",
        "nominal_vcpus": "0", "borrowing_limit_vcpus": "0", "max_vcpus_per_job": "0", "lending_limit_vcpus": "",
        "reason": "new hires"})
    assert r.status_code == 302, r.content.decode()[:1000]
    r = web.post(f"/teams/alpha/budgets/{budget.pk}/edit/", {
        "period": "monthly", "amount_usd": "1200.00", "alert_thresholds": "50, 80, 100", "action": "block",
        "reason": "price rise"})
    assert r.status_code == 302, r.content.decode()[:1000]
    assert web.post(f"/nodes/{node.pk}/cordon/", {"reason": "fan noise"}).status_code == 302
    got = {(r.object_type, r.action): (r.actor_name, r.reason) for r in AuditRecord.objects.all()}
    assert got == {("quota", "updated"): ("staff", "new hires"), ("budget", "updated"): ("staff", "price rise"),
                   ("node", "cordoned"): ("staff", "fan noise")}
    assert only_record(object_type="budget").after["amount_usd"] == "1200.00"


def test_admin_edits_of_prices_and_memberships_are_recorded_with_the_reason(root, alpha, teammate, h100):
    price = Price.objects.filter(accelerator=h100, cluster=None).first()
    form = root.get(f"/admin/costs/price/{price.pk}/change/").context["adminform"].form
    data = {name: ("" if value is None else value) for name, value in form.initial.items() if name in form.fields}
    data["effective_from_0"], data["effective_from_1"] = price.effective_from.strftime("%Y-%m-%d %H:%M:%S").split()
    data.update({"usd_per_gpu_hour": "7.250000", "audit_reason": "list price 2027"})
    data.pop("effective_from", None)
    r = root.post(f"/admin/costs/price/{price.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[:3000]
    rec = only_record(object_type="price", object_id=price.pk)
    assert (rec.actor_name, rec.reason, rec.before["usd_per_gpu_hour"], rec.after["usd_per_gpu_hour"]) == (
        "root", "list price 2027", str(price.usd_per_gpu_hour), "7.250000")

    membership = Membership.objects.get(team=alpha, user=teammate.user)
    r = root.post(f"/admin/quotas/membership/{membership.pk}/change/",
                  {"team": alpha.pk, "user": teammate.user.pk, "role": "admin", "audit_reason": "new team lead"})
    assert r.status_code == 302, r.content.decode()[:3000]
    rec = only_record(object_type="membership", object_id=membership.pk)
    assert (rec.team_id, rec.before["role"], rec.after["role"], rec.reason) == (alpha.pk, "member", "admin",
                                                                               "new team lead")
    r = root.post("/admin/quotas/membership/", {"action": "delete_selected", "_selected_action": [membership.pk],
                                                "post": "yes"})
    assert r.status_code == 302
    gone = only_record(object_type="membership", action="deleted")
    assert (gone.object_id, gone.before["role"], gone.after, gone.team_id) == (membership.pk, "admin", {}, alpha.pk)


def test_admin_inline_membership_changes_of_a_team_are_recorded(root, alpha, teammate, viewer):
    rows = list(Membership.objects.filter(team=alpha).order_by("pk"))
    data = {"slug": alpha.slug, "name": alpha.name, "cost_center": "", "cohort": "", "weight": "1",
            "queueing_strategy": "BestEffortFIFO", "audit_reason": "reorganisation",
            "memberships-TOTAL_FORMS": str(len(rows)), "memberships-INITIAL_FORMS": str(len(rows)),
            "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}
    for i, m in enumerate(rows):
        data.update({f"memberships-{i}-id": m.pk, f"memberships-{i}-team": alpha.pk,
                     f"memberships-{i}-user": m.user_id, f"memberships-{i}-role": m.role})
        if m.user_id == teammate.user.pk:
            data[f"memberships-{i}-role"] = "viewer"
        if m.user_id == viewer.user.pk:
            data[f"memberships-{i}-DELETE"] = "on"
    r = root.post(f"/admin/quotas/team/{alpha.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[:3000]
    got = sorted((r.action, r.before.get("user_id"), r.before.get("role"), r.after.get("role"), r.reason)
                 for r in AuditRecord.objects.filter(object_type="membership"))
    assert got == [("deleted", viewer.user.pk, "viewer", None, "reorganisation"),
                   ("updated", teammate.user.pk, "member", "viewer", "reorganisation")]


def test_an_approval_records_the_decision_and_the_applied_change_with_the_requesters_reason(
        owner, staff, alpha_objects):
    quota = alpha_objects["quota"]
    change = changes.request_change(user=owner.user, team=quota.team, kind="quota", target_id=quota.pk,
                                    payload={"nominal_gpus": 24}, reason="a second training run")
    assert staff.client.post(f"/api/v1/change-requests/{change.pk}/approve/", {"note": "fits"},
                             format="json").status_code == 200
    decision = only_record(object_type="changerequest", object_id=change.pk)
    assert (decision.action, decision.actor_name, decision.reason, decision.before["state"],
            decision.after["state"], decision.after["decision_note"]) == (
        "approved", "staff", "a second training run", "pending", "approved", "fits")
    applied = only_record(object_type="quota", object_id=quota.pk)
    assert (applied.action, applied.before["nominal_gpus"], applied.after["nominal_gpus"]) == ("updated", 16, 24)
    assert applied.reason == f"change request {change.pk} by owner: a second training run"


def test_an_approval_that_conflicts_records_nothing(owner, staff, alpha_objects):
    quota = alpha_objects["quota"]
    change = changes.request_change(user=owner.user, team=quota.team, kind="quota", target_id=quota.pk,
                                    payload={"nominal_gpus": 24}, reason="more")
    Quota.objects.filter(pk=quota.pk).update(nominal_gpus=12)  # moved since the request
    assert staff.client.post(f"/api/v1/change-requests/{change.pk}/approve/", {}, format="json").status_code == 409
    assert not AuditRecord.objects.exists()


def test_deleting_the_actor_or_the_team_keeps_their_records(staff, h100):
    gamma = Team.objects.create(slug="gamma", name="Gamma")
    quota = Quota.objects.create(team=gamma, accelerator=h100, nominal_gpus=4)
    assert staff.client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": 6}, format="json").status_code == 200
    pk, team_pk, quota_pk = only_record(object_type="quota").pk, gamma.pk, quota.pk
    staff.user.delete()
    gamma.delete()
    rec = AuditRecord.objects.get(pk=pk)
    assert (rec.actor_name, rec.team_id, rec.object_id, rec.after["nominal_gpus"]) == ("staff", team_pk, quota_pk, 6)
    assert rec.object_repr.startswith("gamma H100")
    assert staff.client.get(f"{AUDIT}{pk}/").status_code == 401  # the deleted user's token is gone with it


def test_deleting_a_cluster_records_each_governed_object_its_cascade_deletes(root, aws_cluster, alpha, h100):
    """A cluster's deletion deletes its node pools, per-cluster quotas and price overrides with it (CASCADE): each
    gets a ``deleted`` record saying with what, in the same transaction, not only the cluster."""
    cluster, pool = aws_cluster["cluster"], aws_cluster["pool"]
    quota = Quota.objects.create(team=alpha, accelerator=h100, cluster=cluster, nominal_gpus=4)
    price = Price.objects.create(provider="aws", region="us-east-1", accelerator=h100, capacity_type="on-demand",
                                 cluster=cluster, usd_per_gpu_hour="5.00", effective_from=timezone.now())
    r = root.post(f"/admin/runners/cluster/{cluster.pk}/delete/", {"post": "yes"})  # the admin's confirmation
    assert r.status_code == 302, r.content
    deleted = {(rec.object_type, rec.object_id): rec for rec in AuditRecord.objects.filter(action="deleted")}
    assert set(deleted) == {("cluster", cluster.pk), ("nodepool", pool.pk), ("quota", quota.pk),
                            ("price", price.pk)}
    assert deleted[("cluster", cluster.pk)].reason == "" and deleted[("cluster", cluster.pk)].actor_name == "root"
    assert deleted[("quota", quota.pk)].reason == "(deleted with cluster aws-use1)"
    assert (deleted[("quota", quota.pk)].team_id, deleted[("quota", quota.pk)].before["nominal_gpus"]) == (alpha.pk, 4)
    assert Decimal(deleted[("price", price.pk)].before["usd_per_gpu_hour"]) == Decimal("5.00")


# --- append-only -------------------------------------------------------------------------------------------------

@pytest.fixture
def one_record(alpha_objects):
    quota = alpha_objects["quota"]
    return record(None, "updated", quota, snapshot(quota), snapshot(quota), "kept")


def test_a_stored_record_refuses_save_delete_and_bulk_changes_in_python(one_record):
    one_record.reason = "rewritten"
    for attempt in (one_record.save, one_record.delete, lambda: AuditRecord.objects.update(reason="x"),
                    lambda: AuditRecord.objects.filter(pk=one_record.pk).delete()):
        with pytest.raises(AuditRecord.AppendOnly):
            attempt()
    assert AuditRecord.objects.get(pk=one_record.pk).reason == "kept"


@pytest.mark.parametrize("sql", ["UPDATE quotas_auditrecord SET reason = 'rewritten' WHERE id = %s",
                                 "DELETE FROM quotas_auditrecord WHERE id = %s"])
def test_postgresql_refuses_update_and_delete_of_a_record(one_record, sql):
    assert connection.vendor == "postgresql"
    with pytest.raises(ProgrammingError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [one_record.pk])
    assert AuditRecord.objects.filter(pk=one_record.pk).values_list("reason", flat=True).get() == "kept"


def test_the_admin_shows_records_read_only(root, one_record):
    assert root.get(f"/admin/quotas/auditrecord/{one_record.pk}/change/").status_code == 200
    assert root.get("/admin/quotas/auditrecord/add/").status_code == 403
    assert root.get(f"/admin/quotas/auditrecord/{one_record.pk}/delete/").status_code == 403
    r = root.post(f"/admin/quotas/auditrecord/{one_record.pk}/change/", {"reason": "rewritten"})
    assert r.status_code == 403
    assert AuditRecord.objects.get(pk=one_record.pk).reason == "kept"


# --- reading: API filters, isolation by persona, pages -----------------------------------------------------------

@pytest.fixture
def trail(staff, alpha_objects, beta_objects, node):
    """Staff change alpha's quota and budget, beta's quota, and cordon a node (a platform-wide object); the records'
    ids by name."""
    a_quota, a_budget, b_quota = alpha_objects["quota"], alpha_objects["budget"], beta_objects["quota"]
    for url, body, reason in [(f"/api/v1/quotas/{a_quota.pk}/", {"nominal_gpus": 20}, "alpha grows"),
                              (f"/api/v1/budgets/{a_budget.pk}/", {"amount_usd": "1500.00"}, "alpha budget"),
                              (f"/api/v1/quotas/{b_quota.pk}/", {"nominal_gpus": 4}, "beta shrinks")]:
        assert staff.client.patch(url, body, format="json", headers={"X-Audit-Reason": reason}).status_code == 200
    assert staff.client.post(f"/api/v1/nodes/{node.pk}/cordon/", {"note": "bad GPU"}, format="json").status_code == 200
    return {r.reason: r.pk for r in AuditRecord.objects.all()}


def reasons(answer) -> set[str]:
    assert answer.status_code == 200, answer.content[:300]
    return {r["reason"] for r in answer.json()["results"]}


def test_staff_read_every_record_and_each_team_only_its_own(trail, staff, owner, teammate, viewer, outsider):
    assert reasons(staff.client.get(AUDIT)) == {"alpha grows", "alpha budget", "beta shrinks", "bad GPU"}
    for persona in (owner, teammate, viewer):
        assert reasons(persona.client.get(AUDIT)) == {"alpha grows", "alpha budget"}
        assert reasons(persona.client.get(AUDIT, {"team": "beta"})) == set()
        assert persona.client.get(f"{AUDIT}{trail['beta shrinks']}/").status_code == 404
        assert persona.client.get(f"{AUDIT}{trail['bad GPU']}/").status_code == 404
    assert reasons(outsider.client.get(AUDIT)) == {"beta shrinks"}
    assert outsider.client.get(f"{AUDIT}{trail['alpha grows']}/").status_code == 404
    body = owner.client.get(f"{AUDIT}{trail['alpha budget']}/").json()
    assert (body["actor"], body["action"], body["object_type"], body["team"], body["before"]["amount_usd"],
            body["after"]["amount_usd"]) == ("staff", "updated", "budget", "alpha", "1000.00", "1500.00")
    assert set(body) == {"id", "at", "actor", "action", "object_type", "object_id", "object_repr", "team", "before",
                         "after", "reason"}


def test_the_api_filters_by_team_type_object_actor_action_and_time(trail, staff, alpha_objects, node):
    c = staff.client
    assert reasons(c.get(AUDIT, {"team": "alpha"})) == {"alpha grows", "alpha budget"}
    assert reasons(c.get(AUDIT, {"object_type": "quota"})) == {"alpha grows", "beta shrinks"}
    assert reasons(c.get(AUDIT, {"object_type": "quota", "object_id": alpha_objects["quota"].pk})) == {"alpha grows"}
    assert reasons(c.get(AUDIT, {"action": "cordoned"})) == {"bad GPU"}
    assert reasons(c.get(AUDIT, {"actor": "staff"})) == {"alpha grows", "alpha budget", "beta shrinks", "bad GPU"}
    assert reasons(c.get(AUDIT, {"actor": "owner"})) == set()
    cut = AuditRecord.objects.get(pk=trail["beta shrinks"]).at
    assert reasons(c.get(AUDIT, {"since": cut.isoformat()})) == {"beta shrinks", "bad GPU"}
    assert reasons(c.get(AUDIT, {"until": cut.isoformat()})) == {"alpha grows", "alpha budget"}
    future = (timezone.now() + dt.timedelta(days=1)).isoformat()
    assert reasons(c.get(AUDIT, {"since": future})) == set()
    assert c.get(AUDIT, {"action": "renamed"}).status_code == 400
    assert c.get(AUDIT, {"object_type": "job"}).status_code == 400
    assert c.get(AUDIT, {"since": "yesterday"}).status_code == 400
    page = c.get(AUDIT, {"limit": 1}).json()
    assert (page["count"], len(page["results"]), page["results"][0]["reason"]) == (4, 1, "bad GPU")  # newest first


def test_the_audit_page_and_the_team_page_show_each_reader_only_what_they_may_see(trail, staff, owner, outsider):
    page = signed_in(staff).get("/audit/").content.decode()
    assert all(reason in page for reason in ("alpha grows", "alpha budget", "beta shrinks", "bad GPU"))
    assert "1000.00 → 1500.00" in page
    filtered = signed_in(staff).get("/audit/", {"object_type": "node"}).content.decode()
    assert "bad GPU" in filtered and "alpha grows" not in filtered
    mine = signed_in(owner).get("/audit/").content.decode()
    assert "alpha grows" in mine and "beta shrinks" not in mine and "bad GPU" not in mine
    assert "beta shrinks" not in signed_in(owner).get("/audit/", {"team": "beta"}).content.decode()
    team_page = signed_in(owner).get("/teams/alpha/").content.decode()
    assert "alpha grows" in team_page and "alpha budget" in team_page and "beta shrinks" not in team_page
    assert "beta shrinks" in signed_in(outsider).get("/teams/beta/").content.decode()

