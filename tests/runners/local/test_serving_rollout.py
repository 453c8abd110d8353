"""A serving job of the demo's model rolled out to the checkpoint of a later training job under load, replica by
replica, with no failed request and every replica serving the new model at the end; a rollout to a checkpoint that
never gets ready rolled back with no failed request; bad requests answered 400 with the field and the reason."""

from __future__ import annotations

import datetime as dt
import shutil
import threading
from pathlib import Path

import pytest
import requests
from django.utils import timezone

from jobs.models import Job, JobAttempt, JobEvent, JobState, ServingRollout
from jobs.reconcile import reconcile_cluster
from quotas.models import Quota
from runners.local.runner import checkpoint_dir
from serving.rollout import start_rollout, step_rollouts
from tests.support.factories import make_job_row
from tests.support.local_runner import wait_until
from tests.support.personas import signed_in

from . import test_autoscaled_serving as serving
from .test_autoscaled_serving import PROMPT, Load

checkpoint = serving.checkpoint  # the fixtures of the demo's model served on the local runner
serving_job = serving.serving_job


@pytest.fixture
def trained(two_node_local_cluster, teams, user, catalog, checkpoint):
    """``trained(name, with_checkpoint=True)``: a SUCCEEDED training job of alpha whose checkpoint directory (the
    local runner's) holds the module's checkpoint, or nothing; returns the job."""

    def make(name: str, with_checkpoint: bool = True) -> Job:
        job = make_job_row(teams[0], user, catalog["H100-80GB"], name=name, state=JobState.SUCCEEDED)
        directory = checkpoint_dir(job.pk)
        directory.mkdir(parents=True)
        if with_checkpoint:
            shutil.copy(Path(checkpoint) / "checkpoint.pt", directory / "checkpoint.pt")
        return job

    return make


def served_by(job: Job) -> str:
    """The ``X-Checkpoint`` a replica serving ``job``'s checkpoint answers with: that file's absolute path."""
    return str((checkpoint_dir(job.pk) / "checkpoint.pt").resolve())


def roll(attempt: JobAttempt) -> ServingRollout:
    """Step the job's rollout (and reconcile its cluster) until it is no longer rolling; the rollout."""

    def ended():
        threading.Event().wait(0.3)
        reconcile_cluster(attempt.cluster)
        step_rollouts()
        rollout = ServingRollout.objects.filter(job_id=attempt.job_id).order_by("-id").first()
        return rollout if rollout.state != ServingRollout.State.ROLLING else None

    return wait_until(ended, 180, "the rollout to end")


def roll_under_load(attempt: JobAttempt, start) -> tuple[ServingRollout, list]:
    """Under a load of 3 clients on the job's endpoint: ``start()`` a rollout, step it to its end, take 20 answers
    more; the rollout and the ``X-Checkpoint`` of each answer after it. Every answer was a 200."""
    load = Load(attempt.runner_state["endpoint"], clients=3, header="X-Checkpoint")
    wait_until(lambda: len(load.answers) >= 10, 30, "answers under load")
    start()
    rollout = roll(attempt)
    seen = len(load.answers)
    wait_until(lambda: len(load.answers) >= seen + 20, 60, "answers after the rollout")
    load.stop()
    assert load.errors == [] and {status for status, _ in load.answers} == {200}
    return rollout, [c for _, c in load.answers[seen:]]


def test_a_rollout_under_load_moves_every_replica_to_the_new_checkpoint_with_no_failed_request(
        serving_job, trained, owner):
    old, new = trained("train-v1"), trained("train-v2")
    attempt = serving_job(2, checkpoint_from=old.pk)

    def start():
        answer = owner.client.post(f"/api/v1/jobs/{attempt.job_id}/rollout/", {"checkpoint_from_job": new.pk},
                                   format="json")
        assert answer.status_code == 202, answer.content
        body = answer.json()
        assert body["state"] == "rolling" and (body["from"], body["to"]) == (old.pk, new.pk)

    rollout, after = roll_under_load(attempt, start)
    assert rollout.state == "done" and rollout.replicas_updated == 2, rollout.reason
    assert serving.endpoint_metric(attempt, "controlplane_endpoint_failed_requests_total") == 0
    assert set(after) == {served_by(new)}
    # every replica listed serves the new model
    state = JobAttempt.objects.get(pk=attempt.pk).runner_state
    assert len(state["replicas"]) == 2 and not set(state["replicas"]) & set(attempt.runner_state["replicas"])
    for address in state["replicas"]:
        assert requests.get(f"http://{address}/healthz", timeout=5).headers["X-Checkpoint"] == served_by(new)
    # the job's logs are those of the replicas serving now, not of the ones the rollout retired
    for node, address in enumerate(state["replicas"]):
        text = owner.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?node={node}").json()["text"]
        assert f"serving on http://{address} " in text, (node, address, text[-500:])
    assert owner.client.get(f"/api/v1/jobs/{attempt.job_id}/logs/?node=2").status_code == 400
    # the job's size and booking are as before; it loads the new checkpoint from now on
    job = Job.objects.get(pk=attempt.job_id)
    assert job.state == JobState.RUNNING and job.replicas == 2 and job.spec["checkpoint_from"] == new.pk
    assert JobAttempt.objects.get(pk=attempt.pk).gpus == 2
    kinds = list(JobEvent.objects.filter(job=job, kind__startswith="rollout").values_list("kind", flat=True))
    assert kinds == ["rollout_started", "rollout_done"]
    shown = owner.client.get(f"/api/v1/jobs/{job.pk}/").json()["serving"]["rollout"]
    assert {k: shown[k] for k in ("state", "from", "to", "replicas_updated")} == {
        "state": "done", "from": old.pk, "to": new.pk, "replicas_updated": 2}
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert (f'done: from the checkpoint of job <a href="/jobs/{old.pk}/">#{old.pk}</a> to that of job '
            f'<a href="/jobs/{new.pk}/">#{new.pk}</a>, 2 replicas updated') in page


def test_a_rollout_to_a_checkpoint_that_never_gets_ready_rolls_back_with_no_failed_request(serving_job, trained,
                                                                                          owner, outsider, teams):
    old, empty = trained("train-v1"), trained("train-broken", with_checkpoint=False)
    attempt = serving_job(2, checkpoint_from=old.pk, max_retries=1)
    url = f"/api/v1/jobs/{attempt.job_id}/rollout/"
    unfinished = make_job_row(attempt.job.team, owner.user, attempt.job.accelerator, name="train-v3",
                              state=JobState.RUNNING)
    theirs = make_job_row(teams[1], outsider.user, attempt.job.accelerator, name="x", state=JobState.SUCCEEDED)
    for ref, reason in ((unfinished.pk, f"job {unfinished.pk} is RUNNING; only a SUCCEEDED training job's "
                                        f"checkpoint is rolled out"),
                        (theirs.pk, f'no job {theirs.pk} in team "{attempt.job.team.slug}"'),
                        (old.pk, f"the replicas serve the checkpoint of job {old.pk} already"),
                        (attempt.job_id, f"job {attempt.job_id} is not a training job (inference); a checkpoint "
                                         f"comes from a training job")):
        refused = owner.client.post(url, {"checkpoint_from_job": ref}, format="json")
        assert (refused.status_code, refused.json()) == (400, {"checkpoint_from_job": [reason]})
    assert not ServingRollout.objects.exists()

    def start():
        answer = owner.client.post(url, {"checkpoint_from_job": empty.pk}, format="json")
        assert answer.status_code == 202, answer.content

    rollout, after = roll_under_load(attempt, start)
    assert rollout.state == "rolled_back" and "ended before it was ready" in rollout.reason
    assert set(after) == {served_by(old)}
    assert serving.endpoint_metric(attempt, "controlplane_endpoint_failed_requests_total") == 0
    job = Job.objects.get(pk=attempt.job_id)
    assert job.state == JobState.RUNNING and job.replicas == 2 and job.spec["checkpoint_from"] == old.pk
    assert JobAttempt.objects.get(pk=attempt.pk).gpus == 2
    assert JobAttempt.objects.get(pk=attempt.pk).runner_state["replicas"] == attempt.runner_state["replicas"]
    # the new replica's failure was the rollout's, not a lost replica's
    assert not JobEvent.objects.filter(job=job, kind="replica_replaced").exists()
    assert JobEvent.objects.filter(job=job, kind="rollout_rolled_back").count() == 1


def test_a_rollout_request_is_checked_field_by_field(two_node_local_cluster, teams, user, catalog, owner, teammate,
                                                    outsider):
    serve = make_job_row(teams[0], user, catalog["H100-80GB"], name="serve", kind="inference", state=JobState.QUEUED,
                         spec={"command": ["python", "examples/serve.py"], "checkpoint_from": None})
    running = make_job_row(teams[0], user, catalog["H100-80GB"], name="train-run", state=JobState.RUNNING)
    theirs = make_job_row(teams[1], outsider.user, catalog["H100-80GB"], name="theirs", state=JobState.SUCCEEDED)
    url = f"/api/v1/jobs/{serve.pk}/rollout/"

    def post(client, body):
        return client.post(url, body, format="json")

    assert post(owner.client, {}).json() == {"checkpoint_from_job": ["This field is required."]}
    assert post(owner.client, {"checkpoint_from_job": "x"}).status_code == 400
    refused = post(owner.client, {"checkpoint_from_job": running.pk})
    assert refused.status_code == 400 and refused.json() == {
        "job": [f"job {serve.pk} is QUEUED; only a RUNNING serving job rolls out"]}
    Job.objects.filter(pk=serve.pk).update(state=JobState.RUNNING)  # no attempt: still refused, as not running
    assert "job" in post(owner.client, {"checkpoint_from_job": running.pk}).json()
    assert post(teammate.client, {"checkpoint_from_job": running.pk}).status_code == 403  # not its submitter
    assert post(outsider.client, {"checkpoint_from_job": theirs.pk}).status_code == 404  # another team's job
    assert not ServingRollout.objects.exists()


def test_without_room_for_a_surge_each_old_replica_is_replaced_in_place_with_no_failed_request(
        serving_job, trained, owner, teams):
    old, new = trained("train-v1"), trained("train-v2")
    attempt = serving_job(2, checkpoint_from=old.pk)
    Quota.objects.filter(team=teams[0]).update(nominal_gpus=2, borrowing_limit_gpus=0)  # the two replicas: all
    rollout, after = roll_under_load(
        attempt, lambda: start_rollout(attempt.job_id, checkpoint_from_job_id=new.pk, actor=owner.user))
    assert rollout.state == "done" and rollout.replicas_updated == 2, rollout.reason
    assert set(after) == {served_by(new)}
    job = Job.objects.get(pk=attempt.job_id)
    assert job.replicas == 2 and JobAttempt.objects.get(pk=attempt.pk).gpus == 2
    # nothing was admitted or released: each new replica took an old one's slot
    assert not JobEvent.objects.filter(job=job, kind="scale").exists()


def test_a_new_replica_not_ready_within_the_deadline_rolls_the_rollout_back(serving_job, trained, owner, settings):
    settings.SERVING_ROLLOUT_READY_SECONDS = 600
    old, new = trained("train-v1"), trained("train-v2")
    attempt = serving_job(1, checkpoint_from=old.pk)
    started = start_rollout(attempt.job_id, checkpoint_from_job_id=new.pk, actor=owner.user)
    now = timezone.now()
    assert [r["action"] for r in step_rollouts(now)] == ["started"]
    pending = ServingRollout.objects.get(pk=started.pk).progress["pending"]
    assert pending["surge"] and Job.objects.get(pk=attempt.job_id).replicas == 2  # admitted as a scale-up
    # 601 s on, by the rollout's clock, the new replica still starting (a model that loads too slowly)
    [result] = step_rollouts(now + dt.timedelta(seconds=601))
    assert result["action"] == "rolled_back"
    rollout = ServingRollout.objects.get(pk=started.pk)
    assert rollout.state == "rolled_back" and f"new replica {pending['key']} not ready within 600 s" in rollout.reason
    job = Job.objects.get(pk=attempt.job_id)
    assert job.replicas == 1 and JobAttempt.objects.get(pk=attempt.pk).gpus == 1  # the surge released
    assert job.spec["checkpoint_from"] == old.pk
    assert requests.post(f"{attempt.runner_state['endpoint']}/generate", json=PROMPT, timeout=60).headers[
        "X-Checkpoint"] == served_by(old)
