"""A serving job's ``spec.autoscaling`` through POST /api/v1/jobs/: every bad value answers 400 on its field with the
reason and stores nothing; a good one is stored and the job starts with ``min_replicas`` replicas."""

from __future__ import annotations

import pytest

from jobs.models import Job

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"
GOOD = {"min_replicas": 1, "max_replicas": 3, "target_in_flight_per_replica": 2, "scale_up_delay_seconds": 0,
        "scale_down_delay_seconds": 60}


def serving(submission: dict, **spec) -> dict:
    submission.update(kind="inference", name="serve")
    submission["spec"]["resources"].update(nodes=1, gpus_per_node=1)
    submission["spec"].update(spec)
    return submission


@pytest.mark.parametrize("change, field, fragment", [
    ({"max_replicas": 0}, "spec.autoscaling.max_replicas", "greater than or equal to 1"),
    ({"min_replicas": 3, "max_replicas": 2}, "spec.autoscaling.max_replicas", "at least min_replicas (3)"),
    ({"target_in_flight_per_replica": None}, "spec.autoscaling.target_in_flight_per_replica", "exactly one of"),
    ({"target_rps_per_replica": 5}, "spec.autoscaling.target_rps_per_replica", "exactly one of"),
    ({"target_in_flight_per_replica": 0}, "spec.autoscaling.target_in_flight_per_replica", "greater than 0"),
    ({"scale_down_delay_seconds": -1}, "spec.autoscaling.scale_down_delay_seconds", "greater than or equal to 0"),
    ({"scale_up_delay_seconds": 7200}, "spec.autoscaling.scale_up_delay_seconds", "less than or equal to 3600"),
    ({"max_replicas": 40}, "spec.autoscaling.max_replicas", "40 replicas of 1 x 1 GPUs"),
    ({"min_replica": 1}, "spec.autoscaling.min_replica", "unknown field; expected one of min_replicas"),
    ({"min_replicas": 0}, "spec.autoscaling.min_replicas", "0 only with scale_to_zero: true"),
    ({"scale_to_zero": True}, "spec.autoscaling.scale_to_zero", "applies with min_replicas 0; got min_replicas 1"),
    ({"min_replicas": -1, "scale_to_zero": True}, "spec.autoscaling.min_replicas", "greater than or equal to 0"),
], ids=["max-zero", "max-below-min", "no-target", "two-targets", "target-zero", "negative-delay", "delay-over-an-hour",
        "max-never-fits", "unknown-key", "zero-without-scale-to-zero", "scale-to-zero-above-zero", "min-negative"])
def test_it_refuses_a_bad_autoscaling_value_on_its_field(teammate, aws_cluster, submission, change, field, fragment):
    scaling = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    r = teammate.client.post(JOBS, serving(submission, autoscaling=scaling), format="json")
    assert r.status_code == 400, r.content
    assert field in r.json(), r.json()
    assert any(fragment in m for m in r.json()[field]), r.json()[field]
    assert Job.objects.count() == 0


def test_it_refuses_replicas_outside_the_autoscaling_bounds(teammate, aws_cluster, submission):
    r = teammate.client.post(JOBS, serving(submission, replicas=5, autoscaling=GOOD), format="json")
    assert r.status_code == 400
    assert "within autoscaling's min_replicas and max_replicas (1..3); got 5" in r.json()["spec.replicas"][0]


def test_it_refuses_autoscaling_and_a_health_path_on_a_training_job(teammate, aws_cluster, submission):
    submission["spec"].update(autoscaling=GOOD, health_path="/ready")
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert r.json()["spec.autoscaling"] == ["autoscaling applies to inference jobs only"]
    assert r.json()["spec.health_path"] == ["health_path applies to inference jobs only"]


def test_it_refuses_a_health_path_that_is_not_a_path(teammate, aws_cluster, submission):
    r = teammate.client.post(JOBS, serving(submission, health_path="healthz"), format="json")
    assert r.status_code == 400
    assert "must be an absolute URL path" in r.json()["spec.health_path"][0]


def test_a_good_autoscaling_is_stored_and_the_job_starts_with_min_replicas(teammate, aws_cluster, submission):
    r = teammate.client.post(JOBS, serving(submission, autoscaling={**GOOD, "min_replicas": 2}), format="json")
    assert r.status_code == 201, r.content
    job = Job.objects.get()
    assert job.replicas == 2 and job.spec["autoscaling"]["max_replicas"] == 3
    assert job.spec["health_path"] == "/healthz"


def test_a_job_that_scales_to_zero_starts_with_one_replica_and_may_not_ask_for_none(teammate, aws_cluster, submission):
    scaling = {**GOOD, "min_replicas": 0, "scale_to_zero": True}
    refused = teammate.client.post(JOBS, serving(submission, replicas=0, autoscaling=scaling), format="json")
    assert refused.status_code == 400 and "spec.replicas" in refused.json(), refused.json()
    assert Job.objects.count() == 0
    del submission["spec"]["replicas"]
    r = teammate.client.post(JOBS, serving(submission, autoscaling=scaling), format="json")
    assert r.status_code == 201, r.content
    job = Job.objects.get()
    assert job.replicas == 1 and job.spec["autoscaling"]["scale_to_zero"] is True
