"""A serving job of the demo's model that follows a training job (``spec.follow``) rolls out, under load and with no
failed request, to a new run of it once that run SUCCEEDS, through the serving beat task; the event names the run
that triggered it and the API and the page show it. A run whose checkpoint never gets ready is
rolled back once and not tried again."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import requests

from jobs.models import Job, JobAttempt, JobEvent, JobState, ServingRollout
from jobs.reconcile import reconcile_cluster
from jobs.states import transition
from runners.local.runner import checkpoint_dir
from serving.tasks import autoscale_serving
from tests.support.factories import make_job_row
from tests.support.local_runner import wait_until
from tests.support.personas import signed_in

from . import test_autoscaled_serving as serving
from .test_autoscaled_serving import Load
from .test_serving_rollout import served_by

checkpoint = serving.checkpoint  # the fixtures of the demo's model served on the local runner
serving_job = serving.serving_job


def run_of(job: Job, with_checkpoint: bool = True) -> Job:
    """A new RUNNING run of training job ``job``'s name whose checkpoint directory holds ``job``'s checkpoint (or
    nothing), moved to SUCCEEDED by the state machine, as an attempt's end moves it."""
    run = make_job_row(job.team, job.submitter, job.accelerator, name=job.name, state=JobState.RUNNING)
    directory = checkpoint_dir(run.pk)
    directory.mkdir(parents=True)
    if with_checkpoint:
        shutil.copy(checkpoint_dir(job.pk) / "checkpoint.pt", directory / "checkpoint.pt")
    return transition(run, JobState.SUCCEEDED, reason="exit 0")


def pass_until_settled(attempt: JobAttempt) -> ServingRollout:
    """Run the serving beat task (and reconcile the cluster) until the job's latest rollout is no longer rolling."""

    def ended():
        threading.Event().wait(0.3)
        reconcile_cluster(attempt.cluster)
        autoscale_serving.apply()
        rollout = ServingRollout.objects.filter(job_id=attempt.job_id).order_by("-id").first()
        return rollout if rollout is not None and rollout.state != ServingRollout.State.ROLLING else None

    return wait_until(ended, 180, "the rollout to end")


def test_a_follower_rolls_out_to_each_new_run_that_succeeds_with_no_failed_request(
        serving_job, two_node_local_cluster, teams, user, catalog, checkpoint, owner):
    first = make_job_row(teams[0], user, catalog["H100-80GB"], name="train-gpt", state=JobState.SUCCEEDED)
    checkpoint_dir(first.pk).mkdir(parents=True)
    shutil.copy(Path(checkpoint) / "checkpoint.pt", checkpoint_dir(first.pk) / "checkpoint.pt")
    attempt = serving_job(2, checkpoint_from=first.pk)
    job = Job.objects.get(pk=attempt.job_id)
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "follow": {"job": "train-gpt"}})
    autoscale_serving.apply()
    assert not ServingRollout.objects.exists()  # it serves the newest run already

    load = Load(attempt.runner_state["endpoint"], clients=3, header="X-Checkpoint")
    wait_until(lambda: len(load.answers) >= 10, 30, "answers under load")
    second = run_of(first)
    rollout = pass_until_settled(attempt)
    seen = len(load.answers)
    wait_until(lambda: len(load.answers) >= seen + 20, 60, "answers after the rollout")
    load.stop()
    assert load.errors == [] and {status for status, _ in load.answers} == {200}
    assert serving.endpoint_metric(attempt, "controlplane_endpoint_failed_requests_total") == 0
    assert {c for _, c in load.answers[seen:]} == {served_by(second)}
    assert (rollout.state, rollout.from_job_id, rollout.to_job_id, rollout.trigger_job_id, rollout.actor_id) == (
        "done", first.pk, second.pk, second.pk, None), rollout.reason
    assert rollout.replicas_updated == 2
    for address in JobAttempt.objects.get(pk=attempt.pk).runner_state["replicas"]:
        assert requests.get(f"http://{address}/healthz", timeout=5).headers["X-Checkpoint"] == served_by(second)
    started = JobEvent.objects.get(job=job, kind="rollout_started")
    assert started.data["trigger"] == second.pk
    assert started.reason.startswith(f"job {second.pk}, which this job follows, SUCCEEDED: rolling 2 replica(s)")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.spec["checkpoint_from"] == second.pk and job.replicas == 2

    shown = owner.client.get(f"/api/v1/jobs/{job.pk}/").json()["serving"]
    assert shown["follow"] == {"job": "train-gpt", "newest_run": second.pk}
    assert (shown["rollout"]["trigger"], shown["rollout"]["to"], shown["rollout"]["state"]) == (
        second.pk, second.pk, "done")
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert f'started because job <a href="/jobs/{second.pk}/">#{second.pk}</a>, which it follows, succeeded' in page
    assert "the runs of training job train-gpt: each newer run that succeeds is rolled out to" in page

    # a run that leaves no checkpoint: the new replica never gets ready, the rollout is rolled back, once
    broken = run_of(first, with_checkpoint=False)
    rollout = pass_until_settled(attempt)
    assert (rollout.state, rollout.to_job_id, rollout.trigger_job_id) == ("rolled_back", broken.pk, broken.pk)
    assert "ended before it was ready" in rollout.reason
    autoscale_serving.apply()
    autoscale_serving.apply()
    assert ServingRollout.objects.filter(job=job).count() == 2  # not tried again
    job.refresh_from_db()
    assert job.spec["checkpoint_from"] == second.pk and job.replicas == 2
