"""Cancel in every state, concurrent cancels, cancel racing admission; quota and budget edits by the wrong people."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from jobs.lifecycle import NotCancellable, cancel_job
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.scheduler import schedule_pending
from jobs.states import StaleState
from quotas.models import Budget, Quota, QuotaEvent
from tests.support.factories import make_attempt, make_job
from tests.core.test_states import EXPECTED_EDGES

S = JobState


def assert_chain(job, start=S.QUEUED):
    events = list(JobEvent.objects.filter(job=job, kind="state").order_by("created_at", "id"))
    state = start
    for event in events:
        assert event.from_state == state, [(e.from_state, e.to_state) for e in events]
        assert (event.from_state, event.to_state) in EXPECTED_EDGES
        state = event.to_state
    job.refresh_from_db()
    assert job.state == state


def web(persona) -> Client:
    client = Client()
    client.force_login(persona.user)
    return client


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
def test_cancel_in_each_state(owner, teammate, aws_cluster, h100, teams, redis_broker, state, status, after):
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
    page = web(owner).post(f"/jobs/{job.pk}/cancel/")
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


def test_cancel_with_stale_in_memory_cancelling_raises_not_cancellable(teammate, aws_cluster, h100, teams, redis_broker):
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

def _run_threads(*targets):
    barrier = threading.Barrier(len(targets))
    results, errors = [None] * len(targets), []

    def wrap(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=wrap, args=(i, fn)) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("state", [S.QUEUED, S.RUNNING])
def test_two_concurrent_cancels(owner, teammate, aws_cluster, h100, teams, redis_broker, state):
    for _ in range(5):
        job = make_job(teams[0], teammate.user, h100)
        if state == S.RUNNING:
            make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
        clients = []
        for persona in (owner, teammate):
            from rest_framework.test import APIClient
            c = APIClient()
            c.credentials(HTTP_AUTHORIZATION=f"Token {persona.key}")
            clients.append(c)
        results, errors = _run_threads(*(lambda c=c: c.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code
                                         for c in clients))
        assert not errors, errors
        assert sorted(results) == [200, 409], results
        job.refresh_from_db()
        assert job.state == (S.CANCELLED if state == S.QUEUED else S.CANCELLING)
        assert_chain(job, start=state)


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

        results, errors = _run_threads(lambda: schedule_pending(), cancel)
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
        assert_chain(job)
        # tidy up so the next job has room
        JobAttempt.objects.filter(job=job, ended_at__isnull=True).update(ended_at=job.created_at)
        Job.objects.filter(pk=job.pk).exclude(state=S.CANCELLED).update(state=S.FAILED)


# --- quota and budget edits ---------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("nominal_gpus", -1), ("nominal_gpus", "8"), ("nominal_gpus", 8.0), ("nominal_gpus", True), ("nominal_gpus", None),
    ("nominal_gpus", 2**31), ("nominal_gpus", 2**64), ("borrowing_limit_gpus", -5), ("max_gpus_per_job", "x"),
    ("lending_limit_gpus", 17), ("lending_limit_gpus", -1), ("accelerator", "TPU"), ("accelerator", None),
    ("cluster", "nowhere"), ("cluster", ["aws-use1"]), ("team", "beta"), ("team", "nope"), ("team", None),
    ("team", ["alpha"]), ("nominal_gpus", [8]), ("nominal_gpus", {"v": 8}),
])
def test_bad_quota_patch_is_400(owner, alpha_objects, beta_objects, field, value):
    quota = alpha_objects["quota"]
    events = QuotaEvent.objects.count()
    response = owner.client.patch(f"/api/v1/quotas/{quota.pk}/", {field: value}, format="json")
    assert response.status_code == 400, (field, value, response.status_code, response.content[:300])
    assert field in response.json()
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 16
    assert QuotaEvent.objects.count() == events


def test_quota_lowered_below_use_is_accepted_and_audited(owner, alpha_objects, aws_cluster, h100, teams, teammate):
    job = make_job(teams[0], teammate.user, h100, gpus_per_node=8, nodes=2)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    response = owner.client.patch(f"/api/v1/quotas/{alpha_objects['quota'].pk}/", {"nominal_gpus": 0}, format="json")
    assert response.status_code == 200
    assert QuotaEvent.objects.filter(action="updated").exists()


def test_member_viewer_and_outsider_cannot_edit_quota_or_budget(teammate, viewer, outsider, alpha_objects):
    quota, budget = alpha_objects["quota"], alpha_objects["budget"]
    for persona, status in ((teammate, 403), (viewer, 403), (outsider, 404)):
        assert persona.client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": 1}, format="json").status_code == status
        assert persona.client.put(f"/api/v1/quotas/{quota.pk}/", {"team": "alpha", "accelerator": "H100-80GB",
                                                                   "nominal_gpus": 1}, format="json").status_code == status
        assert persona.client.patch(f"/api/v1/budgets/{budget.pk}/", {"amount_usd": "1"}, format="json").status_code == status
        assert persona.client.delete(f"/api/v1/quotas/{quota.pk}/").status_code in (status, 405)
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
    quotas, budgets, events = Quota.objects.count(), Budget.objects.count(), QuotaEvent.objects.count()
    r = owner.client.post("/api/v1/quotas/", {"team": "beta", "accelerator": "L4", "nominal_gpus": 4}, format="json")
    assert r.status_code == 400 and "team" in r.json()
    r = owner.client.post("/api/v1/budgets/", {"team": "beta", "amount_usd": "5"}, format="json")
    assert r.status_code == 400 and "team" in r.json()
    r = owner.client.patch(f"/api/v1/quotas/{beta_objects['quota'].pk}/", {"team": "alpha", "nominal_gpus": 99}, format="json")
    assert r.status_code == 404
    r = owner.client.patch(f"/api/v1/budgets/{beta_objects['budget'].pk}/", {"team": "alpha"}, format="json")
    assert r.status_code == 404
    r = owner.client.patch(f"/api/v1/budgets/{alpha_objects['budget'].pk}/", {"team": "beta"}, format="json")
    assert r.status_code == 400
    assert (Quota.objects.count(), Budget.objects.count(), QuotaEvent.objects.count()) == (quotas, budgets, events)
    assert Quota.objects.get(pk=beta_objects["quota"].pk).nominal_gpus == 8


@pytest.mark.parametrize("field,value", [
    ("amount_usd", "-1"), ("amount_usd", "0"), ("amount_usd", "NaN"), ("amount_usd", "Infinity"),
    ("amount_usd", "1e20"), ("amount_usd", "0.001"), ("amount_usd", "abc"), ("amount_usd", True),
    ("amount_usd", None), ("amount_usd", [1]), ("alert_thresholds", [True]), ("alert_thresholds", [0]),
    ("alert_thresholds", [1001]), ("alert_thresholds", "50"), ("alert_thresholds", ["50"]),
    ("action", "kill"), ("period", "weekly"), ("stop_running", "yes"), ("stop_running", 1),
    ("starts_at", "2026-01-01T00:00:00"), ("starts_at", "2026-02-30T00:00:00Z"), ("ends_at", "2026-01-01T00:00:00+25:00"),
])
def test_bad_budget_patch_is_400(owner, alpha_objects, field, value):
    budget = alpha_objects["budget"]
    response = owner.client.patch(f"/api/v1/budgets/{budget.pk}/", {field: value}, format="json")
    assert response.status_code == 400, (field, value, response.status_code, response.content[:300])
    assert str(Budget.objects.get(pk=budget.pk).amount_usd) == "1000.00"


def test_web_quota_edit_applies_api_rules(owner, alpha_objects):
    quota = alpha_objects["quota"]
    client = web(owner)
    url = f"/teams/alpha/quotas/{quota.pk}/edit/"
    base = {"nominal_gpus": 16, "borrowing_limit_gpus": 0, "max_gpus_per_job": 0, "lending_limit_gpus": ""}
    for bad in ({"nominal_gpus": -1}, {"nominal_gpus": "x"}, {"nominal_gpus": 2**40}, {"lending_limit_gpus": 17}):
        response = client.post(url, {**base, **bad})
        assert response.status_code == 200, bad  # the form again, with its error
        quota.refresh_from_db()
        assert quota.nominal_gpus == 16 and quota.lending_limit_gpus is None, bad


def test_web_member_cannot_edit(teammate, alpha_objects):
    client = web(teammate)
    quota, budget = alpha_objects["quota"], alpha_objects["budget"]
    assert client.post(f"/teams/alpha/quotas/{quota.pk}/edit/", {"nominal_gpus": 1}).status_code == 403
    assert client.post(f"/teams/alpha/budgets/{budget.pk}/edit/", {"amount_usd": "1"}).status_code == 403
    assert client.post("/teams/alpha/budgets/new/", {"amount_usd": "1"}).status_code == 403


@pytest.mark.parametrize("amount", ["-5", "0", "NaN", "1e20"])
def test_web_budget_amount_must_be_positive(owner, alpha_objects, amount):
    client = web(owner)
    response = client.post("/teams/alpha/budgets/new/", {"period": "monthly", "amount_usd": amount,
                                                          "alert_thresholds": "50", "action": "alert"})
    assert response.status_code == 200
    assert Budget.objects.count() == 1


# --- web submission: the same hostile YAML ------------------------------------------------------------

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
def test_web_submit_hostile_yaml(owner, aws_cluster, text):
    jobs = Job.objects.count()
    for url in ("/jobs/new/", "/jobs/new/preview/"):
        response = web(owner).post(url, {"spec_yaml": text})
        assert response.status_code == 200, url
    assert Job.objects.count() == jobs
