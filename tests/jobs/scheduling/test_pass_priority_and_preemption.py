"""The fair-share pass against the database: preemption end to end, quota release on every end, positions in
the API, and the audited API for quotas, cohorts, weights, lending limits and priority classes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs.lifecycle import apply_observation, cancel_job, end_attempt, preempt_attempt, recover_or_fail
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending, try_admit
from jobs.scheduling.snapshot import team_used_gpus
from quotas.models import Cohort, PriorityClass, Quota, QuotaEvent, Team
from runners.base import Observation
from tests.conftest import fresh, make_persona, run

S = JobState
pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(db):
    persona = make_persona("staff")
    persona.user.is_staff = True
    persona.user.save(update_fields=["is_staff"])
    return persona


# --- preemption through the pass ---------------------------------------------------------------

def test_a_team_within_nominal_preempts_the_newest_borrowing_job_and_the_victim_waits(
        cluster_factory, quota_factory, h100, alpha, beta, submit, django_capture_on_commit_callbacks):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="4.20")  # 16 GPUs
    quota_factory(alpha, h100, nominal=8, borrowing=8)
    quota_factory(beta, h100, nominal=8)
    first, second = submit(alpha, 8, preemptible=True), submit(alpha, 8, preemptible=True)
    assert schedule_pending().admitted == [first.pk, second.pk]  # the second borrows beta's idle 8
    run(first), run(second)
    wanted = submit(beta, 8)

    with django_capture_on_commit_callbacks() as callbacks:
        result = schedule_pending()

    assert result.admitted == [wanted.pk]
    victim = fresh(second)
    assert victim.state == S.RECOVERING
    ended = JobAttempt.objects.get(job=victim)
    assert ended.end_reason == JobAttempt.EndReason.PREEMPTED and ended.ended_at is not None
    assert fresh(first).state == S.RUNNING
    assert (team_used_gpus(alpha.pk, h100.pk), team_used_gpus(beta.pk, h100.pk)) == (8, 8)
    admitted_event = JobEvent.objects.get(job=wanted, to_state=S.ADMITTED)
    assert admitted_event.data["preempted_job_ids"] == [second.pk]
    assert len(callbacks) >= 2  # the victim's object deletion and the preemptor's dispatch, after commit

    # no loop: the victim waits behind beta's job, which runs within its nominal and is never preempted
    for _ in range(3):
        assert schedule_pending().admitted == []
    victim = fresh(second)
    assert victim.state == S.RECOVERING and victim.queue_info["reason"] == "quota"
    assert fresh(wanted).state == S.ADMITTED


def test_a_borrowing_team_waits_without_preempting(cluster_factory, quota_factory, h100, alpha, beta, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=8, borrowing=8)
    quota_factory(beta, h100, nominal=4, borrowing=8)
    quota_factory(Team.objects.create(slug="gamma", name="Gamma"), h100, nominal=4)
    hog = submit(alpha, 8, nodes=2, preemptible=True)
    schedule_pending()
    run(hog)
    job = submit(beta, 8)  # 8 > beta's nominal 4: it would borrow, so it may not preempt
    assert schedule_pending().admitted == []
    assert fresh(hog).state == S.RUNNING and fresh(job).state == S.QUEUED


# --- quota release on every kind of end -----------------------------------------------------------

def test_quota_is_released_on_every_kind_of_end(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=8, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=64)
    jobs = [submit(alpha, 8, max_retries=3) for _ in range(6)]
    schedule_pending()
    running = [run(j) for j in jobs]
    assert team_used_gpus(alpha.pk, h100.pk) == 48

    (j0, a0), (j1, a1), (j2, a2), (j3, a3), (j4, a4), (j5, a5) = running
    end_attempt(j0, a0, S.SUCCEEDED, reason="exit 0", end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
    assert team_used_gpus(alpha.pk, h100.pk) == 40
    apply_observation(j1, a1, Observation(phase="failed", end_reason="OOMKilled", exit_code=137))
    assert fresh(j1).state == S.FAILED and team_used_gpus(alpha.pk, h100.pk) == 32
    cancel_job(j2)  # RUNNING -> CANCELLING: GPUs held until the objects are gone
    assert team_used_gpus(alpha.pk, h100.pk) == 32
    end_attempt(fresh(j2), a2, S.CANCELLED, reason="objects deleted", end_reason=JobAttempt.EndReason.CANCELLED)
    assert team_used_gpus(alpha.pk, h100.pk) == 24
    preempt_attempt(j3, a3, reason="test")
    assert fresh(j3).state == S.RECOVERING and team_used_gpus(alpha.pk, h100.pk) == 16
    recover_or_fail(j4, a4, end_reason=JobAttempt.EndReason.EVICTED)
    assert fresh(j4).state == S.RECOVERING and team_used_gpus(alpha.pk, h100.pk) == 8
    apply_observation(j5, a5, Observation(phase="lost", end_reason="NodeLost"))
    assert fresh(j5).state == S.RECOVERING and team_used_gpus(alpha.pk, h100.pk) == 0
    assert not JobAttempt.objects.filter(job__team=alpha, ended_at__isnull=True).exists()


def test_try_admit_keeps_its_contract(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    a, b = submit(alpha, 8), submit(alpha, 8)
    assert try_admit(a.pk) == "admitted"
    assert try_admit(a.pk) == "skipped"
    assert try_admit(b.pk) == "waiting"
    assert try_admit(submit(alpha, 16, nodes=2).pk) == "rejected"


# --- positions and reasons in the API ---------------------------------------------------------------

def test_the_api_shows_why_a_job_waits_and_its_positions(cluster_factory, quota_factory, h100, alpha, beta, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    quota_factory(beta, h100, nominal=8)
    owner = make_persona("reader", alpha, "member")
    running = submit(alpha, 8)
    a1, b1, a2 = submit(alpha, 8), submit(beta, 8), submit(alpha, 4)
    schedule_pending()
    assert fresh(running).state == S.ADMITTED
    body = owner.client.get(f"/api/v1/jobs/{a2.pk}/").json()
    # a1 waits on alpha's quota (8 of 8 used); a2 waits behind it; beta's b1 waits for capacity (the pool is full)
    assert body["queue_info"]["reason"] == "priority" and body["queue_info"]["behind_job_id"] == a1.pk
    assert body["position"] == {"team": 2, "overall": 3}
    first = owner.client.get(f"/api/v1/jobs/{a1.pk}/").json()
    assert first["queue_info"]["reason"] == "quota" and first["position"] == {"team": 1, "overall": 1}
    assert (first["queue_info"]["used_gpus"], first["queue_info"]["nominal_gpus"]) == (8, 8)
    assert fresh(b1).queue_info["reason"] == "capacity" and fresh(b1).queue_info["position"] == {"team": 1, "overall": 2}
    assert owner.client.get(f"/api/v1/jobs/{running.pk}/").json()["position"] is None


# --- the audited API --------------------------------------------------------------------------------

def test_a_team_admin_sets_a_lending_limit_and_the_change_is_recorded(h100, alpha, quota_factory):
    quota = quota_factory(alpha, h100, nominal=8)
    admin = make_persona("boss", alpha, "admin")
    r = admin.client.patch(f"/api/v1/quotas/{quota.pk}/", {"lending_limit_gpus": 2}, format="json")
    assert r.status_code == 200, r.content
    assert Quota.objects.get(pk=quota.pk).lending_limit_gpus == 2
    event = QuotaEvent.objects.get(object_type="quota", object_id=quota.pk)
    assert (event.actor, event.action) == (admin.user, "updated")
    assert (event.old["lending_limit_gpus"], event.new["lending_limit_gpus"]) == (None, 2)
    r = admin.client.patch(f"/api/v1/quotas/{quota.pk}/", {"lending_limit_gpus": 9}, format="json")
    assert r.status_code == 400 and "lending_limit_gpus" in r.json()
    assert QuotaEvent.objects.count() == 1


def test_staff_set_a_teams_cohort_and_weight_and_members_may_not(alpha, staff):
    Cohort.objects.create(name="research")
    member = make_persona("member", alpha, "admin")
    assert member.client.patch("/api/v1/teams/alpha/", {"weight": "2"}, format="json").status_code == 403
    r = staff.client.patch("/api/v1/teams/alpha/", {"cohort": "research", "weight": "2.5"}, format="json")
    assert r.status_code == 200, r.content
    team = Team.objects.get(pk=alpha.pk)
    assert (team.cohort.name, team.weight) == ("research", Decimal("2.5"))
    event = QuotaEvent.objects.get(object_type="team")
    assert event.old == {"cohort_id": None, "weight": "1.000"} and event.new["weight"] == "2.500"
    body = member.client.get("/api/v1/teams/alpha/").json()
    assert (body["cohort"], body["weight"]) == ("research", "2.500")
    assert staff.client.patch("/api/v1/teams/alpha/", {"weight": "0"}, format="json").status_code == 400


def test_cohorts_and_priority_classes_are_edited_by_staff_and_audited(alpha, staff, h100, cluster_factory):
    member = make_persona("member", alpha, "member")
    assert member.client.post("/api/v1/cohorts/", {"name": "x"}, format="json").status_code == 403
    assert staff.client.post("/api/v1/cohorts/", {"name": "research"}, format="json").status_code == 201
    classes = member.client.get("/api/v1/priority-classes/").json()["results"]
    assert [(c["name"], c["value"]) for c in classes] == [("low", 100), ("normal", 500), ("high", 1000)]
    r = staff.client.post("/api/v1/priority-classes/", {"name": "urgent", "value": 2000}, format="json")
    assert r.status_code == 201, r.content
    assert set(QuotaEvent.objects.values_list("object_type", "action")) == {("cohort", "created"),
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
