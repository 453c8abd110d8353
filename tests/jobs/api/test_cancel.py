"""``POST /api/v1/jobs/{id}/cancel/``: who may cancel, the answer in every state (200 or 409, in the API and the
web UI alike), concurrent cancels (one wins), and a cancel racing an admission (the job stays consistent)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs.lifecycle import NotCancellable, cancel_job
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.states import StaleState
from tests.support.factories import make_attempt, make_job
from tests.support.personas import signed_in
from tests.support.racing import run_concurrently
from tests.support.states import assert_state_chain

JOBS = "/api/v1/jobs/"
S = JobState


# --- who may cancel ---------------------------------------------------------------------------------------------


def test_it_cancels_a_queued_job(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100)
    r = teammate.client.post(f"{JOBS}{job.pk}/cancel/")
    assert r.status_code == 200, r.content
    assert r.json()["state"] == "CANCELLED"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.ended_at is not None
    assert job.events.filter(to_state="CANCELLED", actor=teammate.user).exists()


def test_it_answers_409_when_cancelling_a_final_job(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100, state=JobState.SUCCEEDED)
    r = teammate.client.post(f"{JOBS}{job.pk}/cancel/")
    assert r.status_code == 409
    assert r.json() == {"detail": f"job {job.pk} is already SUCCEEDED"}
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


def test_it_lets_a_team_admin_cancel_a_teammates_job(owner, teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100)
    assert owner.client.post(f"{JOBS}{job.pk}/cancel/").status_code == 200


def test_it_refuses_cancel_to_members_who_did_not_submit(owner, teammate, viewer, teams, aws_cluster, h100):
    job = make_job(teams[0], owner.user, h100)
    for persona in (teammate, viewer):
        r = persona.client.post(f"{JOBS}{job.pk}/cancel/")
        assert r.status_code == 403
        assert "submitter" in r.json()["detail"]
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_it_moves_a_running_job_to_cancelling(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    r = teammate.client.post(f"{JOBS}{job.pk}/cancel/")
    assert r.status_code == 200
    assert r.json()["state"] == "CANCELLING"


# --- cancel in each state -----------------------------------------------------------------------

@pytest.mark.parametrize("state,status,after", [
    (S.QUEUED, 200, S.CANCELLED),
    (S.ADMITTED, 200, S.CANCELLING),
    (S.STARTING, 200, S.CANCELLING),
    (S.RUNNING, 200, S.CANCELLING),
    (S.CANCELLING, 409, S.CANCELLING),
    (S.SUCCEEDED, 409, S.SUCCEEDED),
    (S.FAILED, 409, S.FAILED),
    (S.CANCELLED, 409, S.CANCELLED),
    (S.REJECTED, 409, S.REJECTED),
])
def test_cancel_answers_in_each_state(owner, teammate, aws_cluster, h100, teams, redis_broker, state, status, after):
    job = make_job(teams[0], teammate.user, h100)
    if state in (S.ADMITTED, S.STARTING, S.RUNNING, S.CANCELLING):
        make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], state=state)
    else:
        Job.objects.filter(pk=job.pk).update(state=state)
    events = JobEvent.objects.count()
    response = owner.client.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == status, response.content
    job.refresh_from_db()
    assert job.state == after
    assert JobEvent.objects.count() == events + (1 if status == 200 else 0)
    # the web UI answers alike, never 500
    page = signed_in(owner).post(f"/jobs/{job.pk}/cancel/")
    assert page.status_code == 302


def test_cancel_recovering_without_live_attempt_is_immediate(owner, teammate, aws_cluster, h100, teams, redis_broker):
    job = make_job(teams[0], teammate.user, h100)
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], state=S.RECOVERING)
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=attempt.started_at)
    assert owner.client.post(f"/api/v1/jobs/{job.pk}/cancel/").json()["state"] == S.CANCELLED


def test_cancel_recovering_with_live_attempt_waits_for_cluster(owner, teammate, aws_cluster, h100, teams, redis_broker):
    job = make_job(teams[0], teammate.user, h100)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], state=S.RECOVERING)
    assert owner.client.post(f"/api/v1/jobs/{job.pk}/cancel/").json()["state"] == S.CANCELLING


def test_cancel_with_stale_in_memory_cancelling_raises_not_cancellable(
        teammate, aws_cluster, h100, teams, redis_broker):
    job = make_job(teams[0], teammate.user, h100)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], state=S.CANCELLING)
    with pytest.raises(NotCancellable):
        cancel_job(job)


def test_viewer_and_other_member_cannot_cancel(owner, viewer, teams, h100, aws_cluster):
    job = make_job(teams[0], owner.user, h100)
    assert viewer.client.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == S.QUEUED


# --- concurrency (real transactions) -----------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("state", [S.QUEUED, S.RUNNING])
def test_two_concurrent_cancels(owner, teammate, aws_cluster, h100, teams, redis_broker, state):
    for _ in range(5):
        job = make_job(teams[0], teammate.user, h100)
        if state == S.RUNNING:
            make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
        clients = []
        for persona in (owner, teammate):
            c = APIClient()
            c.credentials(HTTP_AUTHORIZATION=f"Token {persona.key}")
            clients.append(c)
        results, errors = run_concurrently(*(lambda c=c, job=job: c.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code
                                         for c in clients))
        assert not errors, errors
        assert sorted(results) == [200, 409], results
        job.refresh_from_db()
        assert job.state == (S.CANCELLED if state == S.QUEUED else S.CANCELLING)
        assert_state_chain(job, start=state)


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_admission_leaves_a_consistent_job(owner, teammate, aws_cluster, h100, teams, redis_broker,
                                                         quota_factory):
    quota_factory(teams[0], h100, 16)
    outcomes = set()
    for i in range(12):
        job = make_job(teams[0], teammate.user, h100, name=f"race-{i}")

        def cancel(job_id=job.pk):
            j = Job.objects.get(pk=job_id)
            try:
                cancel_job(j, actor=owner.user)
                return "cancelled"
            except (StaleState, NotCancellable):
                return "lost"

        results, errors = run_concurrently(lambda: schedule_pending(), cancel)
        assert not errors, errors
        outcomes.add(results[1])
        job.refresh_from_db()
        live = JobAttempt.objects.filter(job=job, ended_at__isnull=True)
        if job.state == S.CANCELLED:
            assert not live.exists()
            assert job.current_attempt_id is None or JobAttempt.objects.get(pk=job.current_attempt_id).ended_at
        elif job.state in (S.ADMITTED, S.CANCELLING):
            assert live.count() == 1 and live.get().pk == job.current_attempt_id
        else:
            pytest.fail(f"unexpected state {job.state}")
        assert_state_chain(job)
        # tidy up so the next job has room
        JobAttempt.objects.filter(job=job, ended_at__isnull=True).update(ended_at=job.created_at)
        Job.objects.filter(pk=job.pk).exclude(state=S.CANCELLED).update(state=S.FAILED)
