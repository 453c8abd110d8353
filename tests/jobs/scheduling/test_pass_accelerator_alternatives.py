"""Accelerator alternatives: a job lists acceptable accelerators in order of preference; it runs on the first that
admits it, and quota is charged on the one it got."""

from __future__ import annotations

from jobs.models import Job, JobAttempt
from jobs.scheduling.passes import schedule_pending
from jobs.scheduling.snapshot import team_used_gpus
from tests.support.factories import fresh

JOBS = "/api/v1/jobs/"


def test_a_job_runs_on_its_alternative_when_its_accelerator_is_full_and_is_charged_there(
        teammate, cluster_factory, quota_factory, alpha, catalog, submission):
    h100, l4 = catalog["H100-80GB"], catalog["L4"]
    _, h100_pool = cluster_factory("h", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="6.88")
    _, l4_pool = cluster_factory("l", "gcp", "us-central1", l4, nodes=1, gpus_per_node=8, price="0.80")
    quota_factory(alpha, h100, 8)
    quota_factory(alpha, l4, 8)
    submission["spec"]["placement"] = {}
    submission["spec"]["preemptible"] = False
    submission["spec"]["resources"] = {"accelerator": "H100-80GB", "gpus_per_node": 8, "nodes": 1}
    first = teammate.client.post(JOBS, submission, format="json")
    assert first.status_code == 201, first.content
    schedule_pending()
    assert fresh(Job.objects.get(pk=first.json()["id"])).current_attempt.node_pool_id == h100_pool.pk
    submission["name"] = "second"
    submission["spec"]["resources"]["alternatives"] = ["L4"]
    second = teammate.client.post(JOBS, submission, format="json")
    assert second.status_code == 201, second.content
    schedule_pending()
    job = fresh(Job.objects.get(pk=second.json()["id"]))
    assert job.state == "ADMITTED" and job.current_attempt.node_pool_id == l4_pool.pk
    assert (team_used_gpus(alpha.pk, h100.pk), team_used_gpus(alpha.pk, l4.pk)) == (8, 8)
    assert job.spec["resources"]["alternatives"] == ["L4"]


def test_an_unknown_alternative_answers_400_on_its_field(teammate, aws_cluster, submission):
    submission["spec"]["resources"]["alternatives"] = ["TPU-v5"]
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and list(r.json()) == ["spec.resources.alternatives"]
    assert not JobAttempt.objects.exists() and not Job.objects.exists()
