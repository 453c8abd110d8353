"""Fair-share settings through the API, audited: lending limits, cohorts, team weights and priority classes by
staff only (a team admin asks through a change request, ADR 0029); every change recorded in the audit trail."""

from decimal import Decimal

import pytest

from jobs.models import Job
from quotas.models import AuditRecord, Cohort, PriorityClass, Quota, Team

pytestmark = pytest.mark.django_db


def test_staff_set_a_lending_limit_and_the_change_is_recorded(h100, alpha, quota_factory, staff):
    quota = quota_factory(alpha, h100, nominal=8)
    admin = staff
    r = admin.client.patch(f"/api/v1/quotas/{quota.pk}/", {"lending_limit_gpus": 2}, format="json")
    assert r.status_code == 200, r.content
    assert Quota.objects.get(pk=quota.pk).lending_limit_gpus == 2
    event = AuditRecord.objects.get(object_type="quota", object_id=quota.pk)
    assert (event.actor, event.action) == (admin.user, "updated")
    assert (event.before["lending_limit_gpus"], event.after["lending_limit_gpus"]) == (None, 2)
    r = admin.client.patch(f"/api/v1/quotas/{quota.pk}/", {"lending_limit_gpus": 9}, format="json")
    assert r.status_code == 400 and "lending_limit_gpus" in r.json()
    assert AuditRecord.objects.count() == 1


def test_staff_set_a_teams_cohort_and_weight_and_members_may_not(alpha, staff, owner):
    Cohort.objects.create(name="research")
    member = owner  # even the team's admin
    assert member.client.patch("/api/v1/teams/alpha/", {"weight": "2"}, format="json").status_code == 403
    r = staff.client.patch("/api/v1/teams/alpha/", {"cohort": "research", "weight": "2.5"}, format="json")
    assert r.status_code == 200, r.content
    team = Team.objects.get(pk=alpha.pk)
    assert (team.cohort.name, team.weight) == ("research", Decimal("2.5"))
    event = AuditRecord.objects.get(object_type="team")
    assert event.before == {"slug": "alpha", "name": alpha.name, "cost_center": alpha.cost_center, "cohort_id": None,
                            "weight": "1.000", "queueing_strategy": "BestEffortFIFO"}
    assert event.after["weight"] == "2.500"
    body = member.client.get("/api/v1/teams/alpha/").json()
    assert (body["cohort"], body["weight"]) == ("research", "2.500")
    assert staff.client.patch("/api/v1/teams/alpha/", {"weight": "0"}, format="json").status_code == 400


def test_staff_set_a_teams_queueing_strategy_with_kueues_names(alpha, staff):
    assert staff.client.get("/api/v1/teams/alpha/").json()["queueing_strategy"] == "BestEffortFIFO"
    r = staff.client.patch("/api/v1/teams/alpha/", {"queueing_strategy": "StrictFIFO"}, format="json")
    assert r.status_code == 200, r.content
    assert Team.objects.get(pk=alpha.pk).queueing_strategy == "StrictFIFO"
    r = staff.client.patch("/api/v1/teams/alpha/", {"queueing_strategy": "FIFO"}, format="json")
    assert r.status_code == 400 and "queueing_strategy" in r.json()
    assert Team.objects.get(pk=alpha.pk).queueing_strategy == "StrictFIFO"


def test_cohorts_and_priority_classes_are_edited_by_staff_and_audited(alpha, staff, h100, cluster_factory, teammate,
                                                                    alpha_h100_quota):
    member = teammate
    assert member.client.post("/api/v1/cohorts/", {"name": "x"}, format="json").status_code == 403
    assert staff.client.post("/api/v1/cohorts/", {"name": "research"}, format="json").status_code == 201
    classes = member.client.get("/api/v1/priority-classes/").json()["results"]
    assert [(c["name"], c["value"]) for c in classes] == [("low", 100), ("normal", 500), ("high", 1000)]
    r = staff.client.post("/api/v1/priority-classes/", {"name": "urgent", "value": 2000}, format="json")
    assert r.status_code == 201, r.content
    assert set(AuditRecord.objects.values_list("object_type", "action")) == {("cohort", "created"),
                                                                           ("priorityclass", "created")}
    # the new class is accepted by job validation at once, with its value
    cluster_factory("aws-use1", "aws", "us-east-1", h100)
    spec = {"image": "python:3.11", "command": ["python"], "priority": "urgent", "max_runtime_seconds": 60,
            "resources": {"accelerator": h100.name, "gpus_per_node": 1, "nodes": 1}}
    r = member.client.post("/api/v1/jobs/", {"team": "alpha", "name": "u", "spec": spec}, format="json")
    assert r.status_code == 201, r.content
    assert Job.objects.get(pk=r.json()["id"]).priority == 2000
    PriorityClass.objects.filter(name="urgent").delete()
    r = member.client.post("/api/v1/jobs/", {"team": "alpha", "name": "u", "spec": spec}, format="json")
    assert r.status_code == 400 and "urgent" in str(r.json())
