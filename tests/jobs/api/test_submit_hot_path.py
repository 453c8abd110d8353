"""The submission hot path: a warm submission is one SQL statement (the job and its first event, inserted
together by a statement written once per process from the models), what it stores is what the ORM would store
and what the response says, and validations running in parallel threads never mix two requests' data or errors.

The per-process lookup caches that spare it every read are tested in ``tests/core/test_lookups.py``.
"""

from __future__ import annotations

import copy
import threading

import pytest
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Upper
from django.test.utils import CaptureQueriesContext
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

from jobs import lifecycle
from jobs.models import Job, JobEvent
from jobs.spec import validated_submission
from jobs.states import record_event

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"


def _writes(queries) -> list[str]:
    return [q["sql"][:80] for q in queries.captured_queries
            if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE", "WITH"))]


def test_a_warm_submission_is_one_write_and_reads_that_do_not_grow_with_the_queue(
        cached, teammate, aws_cluster, submission):
    """The job and its event are one statement; the estimate and budget check (ADR 0036) read the fleet, the
    team's quotas and budgets in a fixed number of queries, however many jobs wait."""
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201  # warms the caches
    with CaptureQueriesContext(connection) as first:
        assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    for _ in range(20):
        assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    with CaptureQueriesContext(connection) as queries:
        r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    assert len(_writes(queries)) == 1, _writes(queries)
    assert len(queries.captured_queries) == len(first.captured_queries)
    job = Job.objects.get(pk=r.json()["id"])
    event = JobEvent.objects.get(job=job)
    assert (event.kind, event.from_state, event.to_state, event.actor) == ("submitted", "QUEUED", "QUEUED", teammate.user)
    assert event.reason == "submitted by teammate"
    assert abs((event.created_at - job.created_at).total_seconds()) < 1
    assert r.json()["created_at"] is not None and r.json()["id"] == job.pk


@pytest.mark.django_db(transaction=True)
def test_concurrent_validations_never_mix_their_data_or_errors(cached, teammate, aws_cluster, submission):
    """The models' validators are shared by every request: 8 threads validating different specs at once each
    get their own validated values and their own errors."""
    failures: list[str] = []

    def worker(index: int) -> None:
        try:
            for round_ in range(40):
                data = copy.deepcopy(submission)
                data["name"] = f"job-{index}-{round_}"
                bad = (index + round_) % 2 == 0
                if bad:
                    data["spec"]["resources"]["nodes"] = 0
                    data["spec"]["env"] = {f"BAD-{index}": "x"}
                else:
                    data["spec"]["env"] = {f"VAR_{index}": str(round_)}
                try:
                    fields, errors = validated_submission(data, teammate.user), {}
                except ValidationError as exc:
                    fields, errors = None, exc.detail
                if bad:
                    if fields is not None or set(errors) != {"spec.resources.nodes", "spec.env"} \
                            or f"BAD-{index}" not in errors["spec.env"][0]:
                        failures.append(f"{index}/{round_}: {fields} {dict(errors)}")
                elif fields is None or fields["name"] != data["name"] \
                        or fields["spec"]["env"] != {f"VAR_{index}": str(round_)}:
                    failures.append(f"{index}/{round_}: {fields} {errors}")
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


# --- what is stored --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("image,command,env", [
    ("reg.io/it's/\"quoted\":v1", ["sh", "-c", "echo '); DROP TABLE jobs_job; --"], {"Q": "'\"\\"}),
    ("reg.io/ünïcødé/图像:✓", ["python", "🚀.py"], {"U": "ß" * 1000}),
    ("r/" + "a" * 510, ["x" * 10000], {"K": "$1 $2 %s %(x)s"}),
])
def test_the_stored_job_and_its_event_match_the_response(
        cached, teammate, aws_cluster, submission, image, command, env):
    submission["name"] = "a" * 63
    submission["spec"].update(image=image, command=command, env=env)
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    job = Job.objects.get(pk=body["id"])
    assert job.name == body["name"] == "a" * 63
    assert job.spec["image"] == image and job.spec["command"] == command and job.spec["env"] == env
    assert body["spec"]["image"] == image and body["spec"]["env"] == env
    assert JobEvent.objects.filter(job=job, kind="submitted").count() == 1
    assert body["state"] == job.state == "QUEUED"


@pytest.mark.django_db(transaction=True)
def test_every_job_has_exactly_one_submitted_event_under_concurrency(cached, teammate, aws_cluster, submission):
    results = []

    def post(i):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {teammate.key}")
        sub = copy.deepcopy(submission)
        sub["name"] = f"c-{i}"
        try:
            results.append(client.post(JOBS, sub, format="json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(code == 201 for code in results) and len(results) == 8
    for job in Job.objects.filter(name__startswith="c-"):
        assert JobEvent.objects.filter(job=job, kind="submitted").count() == 1


# --- the job+event INSERT written once per process ----------------------------------------------------------------

def _resources(accelerator) -> dict:
    return {"accelerator": accelerator, "gpus_per_node": 2, "nodes": 1, "priority": 700, "preemptible": True,
            "max_runtime_seconds": 1234, "max_retries": 3}


ODD_SPEC = {"image": "x", "none": None, "pct": "100%s %% %(x)s", "uni": "ü\u2028\\", "nested": [[], {}, 1.5, True]}


@pytest.mark.django_db
def test_the_cached_insert_stores_what_django_save_stores(teams, user, h100):
    accelerator = h100
    alpha = teams[0]
    lifecycle._JOB_WITH_EVENT_SQL.clear()  # compiled from the first job below
    cached = [lifecycle.store_submitted_job(team=alpha, submitter=user, name=f"c{i}", kind="training",
                                            spec=dict(ODD_SPEC, i=i), resources=_resources(accelerator))
              for i in range(2)]  # the second one reuses the compiled statement
    r = _resources(accelerator)
    orm = Job(team=alpha, submitter=user, name="orm", kind="training", spec=dict(ODD_SPEC, i=1),
              accelerator=r["accelerator"], gpus_per_node=2, nodes=1, priority=700, preemptible=True,
              max_runtime_seconds=1234, max_retries=3)
    orm.save(force_insert=True)
    record_event(orm, "submitted", f"submitted by {user}", actor=user)

    skip = {"id", "name", "created_at", "updated_at"}
    row = lambda pk: {k: v for k, v in Job.objects.filter(pk=pk).values().get().items() if k not in skip}  # noqa: E731
    assert row(cached[1].pk) == row(orm.pk)
    assert Job.objects.get(pk=cached[1].pk).spec == dict(ODD_SPEC, i=1)
    for job in cached:
        stored = Job.objects.get(pk=job.pk)
        assert stored.created_at == job.created_at and stored.updated_at == job.updated_at
        assert stored.created_at is not None and stored.created_at != cached[0].created_at or job is cached[0]
    ev = lambda pk: {k: v for k, v in JobEvent.objects.filter(job_id=pk).values().get().items()  # noqa: E731
                     if k not in {"id", "job_id", "created_at"}}
    assert ev(cached[1].pk) == ev(orm.pk)


@pytest.mark.django_db
def test_an_expression_in_the_first_job_does_not_poison_the_cached_statement(teams, user, h100):
    """The statement was compiled (and cached) from the first job *before* its values were checked: an
    expression there (rejected with ValueError) stayed baked into the SQL of every later submission."""
    accelerator = h100
    alpha = teams[0]
    r = _resources(accelerator)
    bad = Job(team=alpha, submitter=user, name=Upper(Value("shout")), kind="training", spec={},
              accelerator=accelerator, gpus_per_node=1, nodes=1)
    lifecycle._JOB_WITH_EVENT_SQL.clear()
    with pytest.raises(ValueError):
        lifecycle._insert_job_with_event(bad, JobEvent(kind="submitted", reason="x", data={}, from_state="QUEUED",
                                                       to_state="QUEUED"))
    job = lifecycle.store_submitted_job(team=alpha, submitter=user, name="quiet", kind="training", spec={},
                                        resources=r)
    assert Job.objects.get(pk=job.pk).name == "quiet"
