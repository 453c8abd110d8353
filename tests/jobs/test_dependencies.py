"""Job dependencies (``after``, ADR 0037): a pipeline of jobs submitted at once runs in order; a job whose condition
can no longer hold ends REJECTED with a reason naming its upstream, and so do the jobs after it; references to
unknown, another team's or repeated jobs are refused on ``after.<i>.job``; a job never waits for itself or for a
job that waits for it; the scheduler never admits a job before its conditions hold, and its queue reason says
what it waits for."""

from __future__ import annotations

import copy
import random

import pytest

from jobs.dependencies import MEETS, DependencyRefused, check_and_record, cycle_error, holds
from jobs.lifecycle import cancel_job, end_attempt
from jobs.models import FINAL_STATES, Job, JobAttempt, JobDependency, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from tests.support.factories import fresh, make_job_row, run
from tests.support.personas import signed_in

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"
S = JobState


@pytest.fixture
def small(submission):
    """A one-GPU job of alpha: the fleet (16 GPUs) holds many at once, so only dependencies order them."""
    def make(name: str, after=None) -> dict:
        document = copy.deepcopy(submission)
        document["name"] = name
        document["spec"]["resources"].update(gpus_per_node=1, nodes=1)
        if after is not None:
            document["after"] = after
        return document
    return make


def submit(persona, document) -> dict:
    r = persona.client.post(JOBS, document, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def finish(job_id: int, to_state: str = S.SUCCEEDED) -> None:
    """Run the job ``job_id`` (ADMITTED, or already RUNNING) and end its attempt in ``to_state``, as the lifecycle
    does."""
    job = Job.objects.get(pk=job_id)
    job, attempt = run(job) if job.state == S.ADMITTED else (job, job.current_attempt)
    end_attempt(job, attempt, to_state, reason=f"exit code {0 if to_state == S.SUCCEEDED else 1}",
                end_reason=JobAttempt.EndReason.SUCCEEDED if to_state == S.SUCCEEDED else JobAttempt.EndReason.FAILED,
                exit_code=0 if to_state == S.SUCCEEDED else 1)


def states(*ids: int) -> list[str]:
    found = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    return [found[i] for i in ids]


# --- a pipeline -------------------------------------------------------------------------------------------------


def test_a_pipeline_of_three_jobs_runs_in_order(teammate, aws_cluster, small):
    train = submit(teammate, small("train-gpt"))
    evaluate = submit(teammate, small("evaluate-gpt", [{"job": "train-gpt"}]))
    serve = submit(teammate, small("serve-gpt", [{"job": evaluate["id"], "condition": "succeeded"}]))
    assert evaluate["after"] == [{"job": train["id"], "name": "train-gpt", "condition": "succeeded",
                                  "state": "QUEUED", "met": False}]
    assert evaluate["queue_info"]["reason"] == "dependency"
    ids = train["id"], evaluate["id"], serve["id"]

    schedule_pending()
    assert states(*ids) == [S.ADMITTED, S.QUEUED, S.QUEUED]
    schedule_pending()  # still nothing while training runs
    run(Job.objects.get(pk=train["id"]))
    schedule_pending()
    assert states(*ids) == [S.RUNNING, S.QUEUED, S.QUEUED]

    finish(train["id"])
    assert fresh(Job.objects.get(pk=evaluate["id"])).queue_info == {}  # nothing left to wait for
    schedule_pending()
    assert states(*ids) == [S.SUCCEEDED, S.ADMITTED, S.QUEUED]
    info = Job.objects.get(pk=serve["id"]).queue_info
    assert info["message"] == f"waits for job {evaluate['id']} (evaluate-gpt) to succeed"

    finish(evaluate["id"])
    schedule_pending()
    assert states(*ids) == [S.SUCCEEDED, S.SUCCEEDED, S.ADMITTED]
    admitted = {j: Job.objects.get(pk=j).admitted_at for j in ids}
    ended = {j: Job.objects.get(pk=j).ended_at for j in ids[:2]}
    assert ended[ids[0]] <= admitted[ids[1]] and ended[ids[1]] <= admitted[ids[2]]


def test_a_failed_evaluation_leaves_serving_and_its_dependents_never_runnable(teammate, aws_cluster, small):
    train = submit(teammate, small("train-gpt"))
    evaluate = submit(teammate, small("evaluate-gpt", [{"job": train["id"]}]))
    serve = submit(teammate, small("serve-gpt", [{"job": evaluate["id"]}]))
    probe = submit(teammate, small("probe", [{"job": serve["id"]}]))
    cleanup = submit(teammate, small("cleanup", [{"job": evaluate["id"], "condition": "failed"}]))
    schedule_pending()
    finish(train["id"])
    schedule_pending()
    finish(evaluate["id"], S.FAILED)

    assert states(serve["id"], probe["id"], cleanup["id"]) == [S.REJECTED, S.REJECTED, S.QUEUED]
    serving = Job.objects.get(pk=serve["id"])
    assert serving.state_reason == (f"job {evaluate['id']} (evaluate-gpt) ended FAILED; this job waited for it "
                                    f"to succeed")
    event = serving.events.get(to_state=S.REJECTED)
    assert event.data == {"reason": "dependency", "upstream": evaluate["id"], "upstream_state": "FAILED",
                          "condition": "succeeded"}
    assert Job.objects.get(pk=probe["id"]).state_reason == (f"job {serve['id']} (serve-gpt) ended REJECTED; this job "
                                                            f"waited for it to succeed")
    assert serving.ended_at is not None and serving.queue_info == {}
    schedule_pending()
    assert states(cleanup["id"]) == [S.ADMITTED]  # its condition (failed) holds
    view = teammate.client.get(f"{JOBS}{serve['id']}/").json()
    assert view["after"][0]["met"] is False and view["after"][0]["state"] == "FAILED"


def test_a_cancelled_upstream_rejects_its_dependents_in_the_cancels_transaction(teammate, teams, aws_cluster, small):
    train = submit(teammate, small("train-gpt"))
    evaluate = submit(teammate, small("evaluate-gpt", [{"job": train["id"], "condition": "succeeded"}]))
    report = submit(teammate, small("report", [{"job": train["id"], "condition": "ended"}]))
    cancel_job(Job.objects.get(pk=train["id"]), actor=teammate.user)
    assert states(train["id"], evaluate["id"], report["id"]) == [S.CANCELLED, S.REJECTED, S.QUEUED]
    assert "ended CANCELLED" in Job.objects.get(pk=evaluate["id"]).state_reason
    schedule_pending()
    assert states(report["id"]) == [S.ADMITTED]


def test_a_succeeded_upstream_rejects_a_job_waiting_for_its_failure(teammate, aws_cluster, small):
    train = submit(teammate, small("train-gpt"))
    alert = submit(teammate, small("alert", [{"job": train["id"], "condition": "failed"}]))
    schedule_pending()
    finish(train["id"])
    assert states(alert["id"]) == [S.REJECTED]
    assert Job.objects.get(pk=alert["id"]).state_reason == (f"job {train['id']} (train-gpt) ended SUCCEEDED; this "
                                                            f"job waited for it to fail")


def test_a_job_waiting_for_two_upstreams_names_the_one_left(teammate, aws_cluster, small):
    a = submit(teammate, small("prep-a"))
    b = submit(teammate, small("prep-b"))
    both = submit(teammate, small("merge", [{"job": a["id"]}, {"job": b["id"], "condition": "ended"}]))
    assert both["queue_info"]["message"] == (f"waits for job {a['id']} (prep-a) to succeed and job {b['id']} "
                                             f"(prep-b) to end")
    schedule_pending()
    finish(a["id"])
    info = Job.objects.get(pk=both["id"]).queue_info
    assert info["message"] == f"waits for job {b['id']} (prep-b) to end"
    assert [w["job"] for w in info["waits_for"]] == [b["id"]]
    page = signed_in(teammate).get(f"/jobs/{both['id']}/")
    assert page.status_code == 200
    assert f"waits for job {b['id']} (prep-b) to end" in page.content.decode()
    assert 'id="job-after"' in page.content.decode()


# --- refused references -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("after, path, fragment", [
    ([{"job": 999999}], "after.0.job", 'no job 999999 in team "alpha"'),
    ([{"job": "nope"}], "after.0.job", 'no job named "nope" in team "alpha"'),
    ([{"job": "beta-job"}], "after.0.job", 'no job named "beta-job"'),
    ([{"job": "BETA"}], "after.0.job", "Expected a job id"),
    ([{"job": None}], "after.0.job", "may not be null"),
    ([{"job": True}], "after.0.job", "Expected a job id"),
    ([{"job": "own", "condition": "afterok"}], "after.0.condition", "one of succeeded, ended, failed"),
    ([{"job": "own", "when": "x"}], "after.0.when", "unknown field"),
    ([{"job": "own"}, {"job": "own"}], "after.1.job", "is already listed at after.0"),
    ({"job": "own"}, "after", "valid list"),
    ([{"job": "own"}] * 21, "after", "no more than 20 items"),
])
def test_bad_references_are_refused_on_their_field(teammate, outsider, teams, h100, aws_cluster, small, after, path,
                                                   fragment):
    make_job_row(teams[0], teammate.user, h100, name="own")
    beta = make_job_row(teams[1], outsider.user, h100, name="beta-job")
    before = (Job.objects.count(), JobDependency.objects.count())
    r = teammate.client.post(JOBS, small("eval", after), format="json")
    assert r.status_code == 400, r.content
    assert any(fragment in m for m in r.json()[path]), r.json()
    assert (Job.objects.count(), JobDependency.objects.count()) == before
    # another team's job by id reads as unknown: nothing says it exists
    r = teammate.client.post(JOBS, small("eval", [{"job": beta.pk}]), format="json")
    assert r.status_code == 400 and r.json() == {"after.0.job": [f'no job {beta.pk} in team "alpha"']}


def test_a_name_takes_the_teams_most_recent_job_of_that_name(teammate, teams, h100, aws_cluster, small):
    older = make_job_row(teams[0], teammate.user, h100, name="train-gpt", state=S.SUCCEEDED)
    newer = make_job_row(teams[0], teammate.user, h100, name="train-gpt")
    assert older.pk < newer.pk
    view = submit(teammate, small("eval", [{"job": "train-gpt"}]))
    assert [a["job"] for a in view["after"]] == [newer.pk]


def test_an_upstream_that_already_ended_the_wrong_way_is_refused(teammate, teams, h100, aws_cluster, small):
    failed = make_job_row(teams[0], teammate.user, h100, name="train-gpt", state=S.FAILED)
    r = teammate.client.post(JOBS, small("eval", [{"job": failed.pk}]), format="json")
    assert r.status_code == 400
    assert r.json()["after.0.job"][0].startswith(f"job {failed.pk} (train-gpt) already ended FAILED, so the "
                                                 f"condition succeeded can never hold")
    done = make_job_row(teams[0], teammate.user, h100, name="prep", state=S.SUCCEEDED)
    view = submit(teammate, small("eval", [{"job": done.pk}]))  # already met: it waits for nothing
    assert view["queue_info"] == {} and view["after"][0]["met"] is True
    schedule_pending()
    assert states(view["id"]) == [S.ADMITTED]


def _upstream_fails_at_the_lock(upstream_id: int):
    """A query wrapper (Django's ``connection.execute_wrapper``) that marks job ``upstream_id`` FAILED just before
    the submission's ``SELECT ... FOR UPDATE`` of its upstreams runs: the upstream ended between validation and
    storing, as another worker's transition would make it."""
    fired = []

    def wrapper(execute, sql, params, many, context):
        if not fired and "FOR UPDATE" in sql and '"jobs_job"' in sql and upstream_id in (params or ()):
            fired.append(sql)
            execute('UPDATE "jobs_job" SET "state" = %s WHERE "id" = %s', (S.FAILED, upstream_id), False, context)
        return execute(sql, params, many, context)
    return wrapper, fired


@pytest.mark.parametrize("way", ["api", "web form"])
def test_an_upstream_ending_during_the_submission_is_a_refusal_on_its_field(teammate, teams, h100, aws_cluster,
                                                                             small, way):
    from django.db import connection

    upstream = make_job_row(teams[0], teammate.user, h100, name="train-gpt")
    document = small("eval", [{"job": upstream.pk}])
    before = Job.objects.count()
    wrapper, fired = _upstream_fails_at_the_lock(upstream.pk)
    with connection.execute_wrapper(wrapper):
        if way == "api":
            r = teammate.client.post(JOBS, document, format="json")
        else:
            import yaml
            r = signed_in(teammate).post("/jobs/new/", {"team": document["team"],
                                                                 "spec_yaml": yaml.safe_dump(document)})
    assert fired, "the submission never locked its upstream"
    expected = (f"job {upstream.pk} (train-gpt) already ended FAILED, so the condition succeeded can never hold")
    if way == "api":
        assert r.status_code == 400, r.content
        assert r.json() == {"after.0.job": [expected]}
    else:
        assert r.status_code == 200  # the form again, with the refusal beside the document
        assert f"after.0.job: {expected}" in r.content.decode()
    assert Job.objects.count() == before and not JobDependency.objects.exists()


def test_a_job_cannot_depend_on_itself_or_on_a_job_that_depends_on_it(teammate, teams, h100):
    a = make_job_row(teams[0], teammate.user, h100, name="a")
    b = make_job_row(teams[0], teammate.user, h100, name="b")
    c = make_job_row(teams[0], teammate.user, h100, name="c")
    check_and_record(b, [(a, "succeeded")])
    check_and_record(c, [(b, "ended")])
    assert cycle_error(a, [a]) == (0, "job %d (a) cannot depend on itself" % a.pk)
    index, reason = cycle_error(a, [b, c])
    assert index == 0 and reason == (f"job {b.pk} (b) depends on job {a.pk} (a), directly or down its chain: waiting "
                                     f"for it would be a cycle")
    with pytest.raises(DependencyRefused) as refused:
        check_and_record(a, [(c, "succeeded")])
    assert refused.value.path == "after.0.job" and "would be a cycle" in str(refused.value)
    assert not JobDependency.objects.filter(job=a).exists()
    assert cycle_error(c, [a]) is None  # waiting further down the same chain is no cycle


def test_resubmitting_a_dependent_keeps_its_after(teammate, aws_cluster, small):
    train = submit(teammate, small("train-gpt"))
    evaluate = submit(teammate, small("evaluate-gpt", [{"job": train["id"], "condition": "ended"}]))
    r = teammate.client.post(f"{JOBS}{evaluate['id']}/resubmit/", {}, format="json")
    assert r.status_code == 201, r.content
    assert [(a["job"], a["condition"]) for a in r.json()["after"]] == [(train["id"], "ended")]


# --- the scheduler never admits early -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_the_scheduler_never_admits_a_job_before_its_conditions_hold(teammate, teams, h100, aws_cluster, seed):
    """Random pipelines (each job after up to two earlier ones, random conditions) whose jobs end at random: after
    every pass, every job that left QUEUED for ADMITTED has all its conditions met, every job still QUEUED with
    a condition that can no longer hold does not exist (it was REJECTED), and each REJECTED dependent names an
    upstream whose end its condition refuses."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    for i in range(14):
        job = make_job_row(teams[0], teammate.user, h100, name=f"j{i}")
        picks = rng.sample(jobs, k=min(len(jobs), rng.randint(0, 2)))
        edges = [(p, rng.choice(list(MEETS))) for p in picks if fresh(p).state not in FINAL_STATES]
        if edges:
            info = check_and_record(job, edges)
            Job.objects.filter(pk=job.pk).update(queue_info=info)
        jobs.append(job)
    for _ in range(30):
        schedule_pending()
        for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
            deps = list(JobDependency.objects.filter(job=job).select_related("upstream"))
            if job.state == S.QUEUED:
                assert all(d.upstream.state not in FINAL_STATES or holds(d.condition, d.upstream.state)
                           for d in deps), job
            elif job.state == S.REJECTED:
                assert any(d.upstream.state in FINAL_STATES and not holds(d.condition, d.upstream.state)
                           for d in deps), job
            else:
                admitted = job.events.get(to_state=S.ADMITTED).created_at
                for d in deps:
                    assert holds(d.condition, d.upstream.state), (job, d)
                    assert d.upstream.ended_at <= admitted, (job, d)
        admitted = [j for j in Job.objects.filter(pk__in=[j.pk for j in jobs], state=S.ADMITTED)]
        if not admitted:
            break
        for job in admitted:
            if rng.random() < 0.25:  # cancelled while admitted: the cancel path ends it
                job = cancel_job(job)
                end_attempt(job, job.current_attempt, S.CANCELLED, reason="objects deleted",
                            end_reason=JobAttempt.EndReason.CANCELLED)
            else:
                finish(job.pk, rng.choice([S.SUCCEEDED, S.FAILED]))
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True)) <= FINAL_STATES
    assert JobEvent.objects.filter(job__in=jobs, to_state=S.REJECTED).count() == \
        Job.objects.filter(pk__in=[j.pk for j in jobs], state=S.REJECTED).count()
