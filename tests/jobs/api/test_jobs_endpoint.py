"""The jobs API: submit (JSON and YAML), read, filter and order, and the events, attempts and logs of a job;
the response of a submission is what a read of the stored job shows. Cancelling is in ``test_cancel.py``."""

from __future__ import annotations

import copy
import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from jobs.models import PRIORITY_CLASSES, Job, JobEvent, JobState
from runners import base
from tests.support.factories import make_attempt, make_job
from tests.support.personas import make_persona

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")

JOBS = "/api/v1/jobs/"


def test_it_submits_a_json_job_as_queued(teammate, aws_cluster, submission, h100):
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["state"] == "QUEUED"
    assert (body["team"], body["submitter"]) == ("alpha", "teammate")
    assert (body["name"], body["kind"]) == ("train-small", "training")
    assert r["Location"] == f"http://testserver{reverse('job-detail', kwargs={'pk': body['id']})}"
    assert teammate.client.get(r["Location"]).json()["id"] == body["id"]
    job = Job.objects.get(pk=body["id"])
    assert (job.accelerator, job.gpus_per_node, job.nodes) == (h100, 8, 2)
    assert job.priority == PRIORITY_CLASSES["high"]
    assert job.preemptible is True and job.max_runtime_seconds == 3600 and job.max_retries == 1
    assert list(job.events.values_list("kind", flat=True)) == ["submitted"]
    assert job.events.get().actor == teammate.user
    # Not placed yet: the preview's estimate, 2 x 8 GPUs x 1 h at the pool's 6.88 USD/GPU-h (aws_cluster).
    assert body["estimated_cost_usd"] == "110.08"


def test_the_estimate_is_the_previews_until_the_job_is_placed_then_gpus_x_runtime_x_price(
        teammate, teams, aws_cluster, submission, h100):
    from jobs.scheduling.passes import schedule_pending

    submission["spec"]["max_runtime_seconds"] = 5400  # 1.5 h
    job_id = teammate.client.post(JOBS, submission, format="json").json()["id"]
    # Before placement, the job's own answer gives the preview's estimate (the pool it would run on); the list null.
    assert teammate.client.get(f"{JOBS}{job_id}/").json()["estimated_cost_usd"] == "165.12"
    assert teammate.client.get(JOBS).json()["results"][0]["estimated_cost_usd"] is None
    schedule_pending()
    body = teammate.client.get(f"{JOBS}{job_id}/").json()
    assert body["state"] == "ADMITTED"
    # 2 nodes x 8 GPUs x 1.5 h x 6.88 USD/GPU-h (AWS us-east-1 H100 on demand, costs/data/SOURCES.md)
    assert body["estimated_cost_usd"] == "165.12"


def test_it_stores_the_spec_normalized_with_defaults(teammate, aws_cluster):
    minimal = {"team": "alpha", "name": "tiny", "spec": {
        "image": "python:3.11", "command": ["python", "-V"],
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "max_runtime_seconds": 60}}
    r = teammate.client.post(JOBS, minimal, format="json")
    assert r.status_code == 201, r.content
    assert Job.objects.get(pk=r.json()["id"]).spec == {
        "image": "python:3.11", "command": ["python", "-V"], "args": [], "env": {},
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1, "cpu": None, "memory_gib": None,
                      "alternatives": []},
        "priority": "normal", "max_runtime_seconds": 60, "preemptible": False,
        "placement": {"providers": [], "regions": [], "clusters": []}, "max_retries": 0,
    }
    assert r.json()["kind"] == "training"


def example_yaml(name: str) -> str:
    """An example job document from examples/jobs/, for team alpha."""
    path = Path(settings.BASE_DIR) / "examples" / "jobs" / name
    document = yaml.safe_load(path.read_text())
    document["team"] = "alpha"
    return yaml.safe_dump(document)


@pytest.mark.parametrize("content_type", ["application/yaml", "text/yaml"])
@pytest.mark.parametrize("example, kind", [("train-gpt.yaml", "training"), ("serve-gpt.yaml", "inference"),
                                           ("evaluate-gpt.yaml", "training"), ("serve-gpt-autoscaled.yaml", "inference")])
def test_it_submits_the_yaml_examples(teammate, aws_cluster, example, kind, content_type):
    trained = None
    if example != "train-gpt.yaml":  # it names the example training job: its checkpoint, or the job it runs after
        trained = teammate.client.post(JOBS, data=example_yaml("train-gpt.yaml"), content_type=content_type).json()
    r = teammate.client.post(JOBS, data=example_yaml(example), content_type=content_type)
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["state"] == "QUEUED" and body["kind"] == kind
    assert JobEvent.objects.filter(job_id=body["id"], kind="submitted").exists()
    if kind == "inference":
        assert body["spec"]["checkpoint_from"] == trained["id"]
    if example == "evaluate-gpt.yaml":
        assert [(a["job"], a["condition"]) for a in body["after"]] == [(trained["id"], "succeeded")]
        assert body["queue_info"]["message"] == f"waits for job {trained['id']} (train-gpt) to succeed"


def test_it_submits_an_inline_yaml_document(teammate, aws_cluster):
    document = """
    team: alpha
    name: yaml-job
    kind: training
    spec:
      image: python:3.11
      command: [python, train.py]
      env: {SEED: "1"}
      resources: {accelerator: H100-80GB, gpus_per_node: 2, nodes: 1}
      max_runtime_seconds: 600
    """
    r = teammate.client.post(JOBS, data=document.replace("\n    ", "\n"), content_type="application/yaml")
    assert r.status_code == 201, r.content
    assert r.json()["gpus_per_node"] == 2
    assert r.json()["spec"]["env"] == {"SEED": "1"}


def test_it_shows_a_job_with_its_current_attempt_and_costs(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100, gpus_per_node=8, nodes=2)
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    Job.objects.filter(pk=job.pk).update(estimated_cost_usd="110.080000", accrued_cost_usd="1.234999999")
    body = teammate.client.get(f"{JOBS}{job.pk}/").json()
    assert body["current_attempt"]["number"] == 1
    assert body["current_attempt"]["cluster"] == "aws-use1"
    assert body["current_attempt"]["node_pool"] == aws_cluster["pool"].name
    assert body["current_attempt"]["started_at"] is not None
    assert (body["estimated_cost_usd"], body["accrued_cost_usd"]) == ("110.08", "1.23")
    assert (body["accelerator"], body["nodes"], body["gpus_per_node"], body["total_gpus"]) == ("H100-80GB", 2, 8, 16)
    assert body["priority"] == 500 and body["priority_class"] == "normal"
    assert body["position"] is None
    assert attempt.object_name == f"job-{job.pk}-1"


def test_it_filters_and_orders_the_job_list(owner, teammate, teams, aws_cluster, h100, catalog):
    alpha = teams[0]
    make_job(alpha, teammate.user, h100, name="queued")
    running = make_job(alpha, owner.user, h100, name="running")
    make_attempt(running, aws_cluster["cluster"], aws_cluster["pool"])
    failed = make_job(alpha, owner.user, h100, name="failed", state=JobState.FAILED)
    Job.objects.filter(pk=failed.pk).update(priority=PRIORITY_CLASSES["high"],
                                            created_at=timezone.now() - dt.timedelta(days=2))

    def names(**params):
        r = teammate.client.get(JOBS, params)
        assert r.status_code == 200, r.content
        return sorted(j["name"] for j in r.json()["results"])

    assert names() == ["failed", "queued", "running"]
    assert names(state=["QUEUED", "RUNNING"]) == ["queued", "running"]
    assert names(submitter="owner") == ["failed", "running"]
    assert names(cluster="aws-use1") == ["running"]
    assert names(accelerator="A100-80GB") == []
    assert names(team="alpha", kind="training") == ["failed", "queued", "running"]
    assert names(created_before=(timezone.now() - dt.timedelta(days=1)).isoformat()) == ["failed"]
    assert names(created_after=(timezone.now() - dt.timedelta(days=1)).isoformat()) == ["queued", "running"]
    ordered = teammate.client.get(JOBS, {"ordering": "-priority"}).json()["results"]
    assert ordered[0]["name"] == "failed"
    assert teammate.client.get(JOBS, {"state": "SLEEPING"}).status_code == 400


def test_it_lists_the_events_of_a_job(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100)
    teammate.client.post(f"{JOBS}{job.pk}/cancel/")
    body = teammate.client.get(f"{JOBS}{job.pk}/events/").json()
    assert body["count"] == 2
    submitted, cancelled = body["results"]
    assert (submitted["kind"], submitted["actor"]) == ("submitted", "teammate")
    assert (cancelled["from_state"], cancelled["to_state"]) == ("QUEUED", "CANCELLED")


def test_it_lists_the_attempts_of_a_job(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    body = teammate.client.get(f"{JOBS}{job.pk}/attempts/").json()
    assert [a["number"] for a in body["results"]] == [1]
    assert body["results"][0]["cluster"] == "aws-use1"
    assert "runner_state" not in body["results"][0]


def test_it_answers_empty_logs_before_any_attempt(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100)
    r = teammate.client.get(f"{JOBS}{job.pk}/logs/")
    assert r.status_code == 200
    assert r.json() == {"node": 0, "attempt": None, "text": ""}


class FakeBackend(base.Backend):
    """A backend that remembers the logs call and returns canned text."""

    name = "fake-logs"

    def __init__(self, fail=False):
        self.calls = []
        self.fail = fail

    def logs(self, attempt, node=0, tail_lines=200):
        if self.fail:
            raise base.ClusterUnreachable("connection refused")
        self.calls.append((attempt.pk, node, tail_lines))
        return f"node {node} last {tail_lines} lines\n"


@pytest.fixture
def fake_backend_cluster(monkeypatch, aws_cluster):
    backend = FakeBackend()
    monkeypatch.setitem(base._BACKENDS, backend.name, backend)
    aws_cluster["cluster"].backend = backend.name
    aws_cluster["cluster"].save(update_fields=["backend"])
    return backend


def test_it_reads_logs_from_the_clusters_backend(teammate, teams, aws_cluster, h100, fake_backend_cluster):
    job = make_job(teams[0], teammate.user, h100, nodes=2)
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    r = teammate.client.get(f"{JOBS}{job.pk}/logs/", {"node": 1, "tail": 50})
    assert r.status_code == 200, r.content
    assert r.json() == {"node": 1, "attempt": 1, "text": "node 1 last 50 lines\n"}
    assert fake_backend_cluster.calls == [(attempt.pk, 1, 50)]


def test_it_validates_log_parameters(teammate, teams, aws_cluster, h100, fake_backend_cluster):
    job = make_job(teams[0], teammate.user, h100, nodes=2)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    assert "node" in teammate.client.get(f"{JOBS}{job.pk}/logs/", {"node": 2}).json()
    assert teammate.client.get(f"{JOBS}{job.pk}/logs/", {"node": -1}).status_code == 400
    assert teammate.client.get(f"{JOBS}{job.pk}/logs/", {"tail": 0}).status_code == 400
    assert teammate.client.get(f"{JOBS}{job.pk}/logs/", {"tail": "many"}).status_code == 400


def test_it_answers_503_when_the_cluster_is_unreachable(teammate, teams, aws_cluster, h100, fake_backend_cluster):
    fake_backend_cluster.fail = True
    job = make_job(teams[0], teammate.user, h100)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    r = teammate.client.get(f"{JOBS}{job.pk}/logs/")
    assert r.status_code == 503
    assert "unreachable" in r.json()["detail"]


def test_the_job_list_has_no_n_plus_one(teammate, teams, aws_cluster, h100, django_assert_max_num_queries):
    for i in range(5):
        job = make_job(teams[0], teammate.user, h100, name=f"j{i}")
        make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], number=1)
    with django_assert_max_num_queries(6):
        r = teammate.client.get(JOBS)
    assert r.json()["count"] == 5


def test_a_session_user_can_submit(aws_cluster, submission, client, teams):
    persona = make_persona("sessionuser", teams[0], "member")
    client.force_login(persona.user)
    r = client.post(JOBS, submission, content_type="application/json")
    assert r.status_code == 201, r.content


@pytest.mark.parametrize("kind", ["training", "inference"])
def test_the_submit_response_is_what_a_get_of_the_stored_row_shows(cached, teammate, aws_cluster, submission, kind):
    submission["kind"] = kind
    if kind == "inference":
        submission["spec"]["resources"]["nodes"] = 1  # a server runs on one node
    submission["name"] = "z9-" + "é".encode().hex() + "-" + kind
    submission["spec"]["env"] = {"A": "it's \"q\" \\ ünï 🚀"}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    posted = r.json()
    got = teammate.client.get(f"{JOBS}{posted['id']}/").json()
    assert posted == got


def test_a_serving_job_without_a_max_runtime_runs_unbounded_and_is_estimated_for_30_days(teammate, aws_cluster,
                                                                                          submission):
    """No max runtime: stored as none (no deadline, no billing cap), estimated over 30 days; training needs one."""
    from costs.ledger import billing_stop

    submission.update(kind="inference", name="serve-forever")
    submission["spec"]["resources"].update(nodes=1, gpus_per_node=1)
    del submission["spec"]["max_runtime_seconds"]
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert job.max_runtime_seconds is None and r.json()["max_runtime_seconds"] is None
    assert billing_stop(job.created_at, job.max_runtime_seconds) is None
    # 1 GPU x 720 h x 6.88 USD/GPU-h (aws_cluster's price)
    assert r.json()["estimated_cost_usd"] == f"{Decimal(720) * Decimal('6.88'):.2f}"
    training = copy.deepcopy(submission)
    training.update(kind="training", name="train-forever")
    refused = teammate.client.post(JOBS, training, format="json")
    assert refused.status_code == 400
    assert list(refused.json()) == ["spec.max_runtime_seconds"]
