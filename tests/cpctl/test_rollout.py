"""``cpctl rollout JOB --checkpoint-from-job N`` against the live API: a rollout started (202) and printed, a bad one
a field error (exit 2) with its reason, another team's job not found (exit 5); a serving job that follows a training
job rolled out when a run of it succeeds, and ``cpctl job`` showing what it follows and what started the rollout."""

from __future__ import annotations

import json

from jobs.models import Job, JobEvent, JobState, ServingRollout
from jobs.states import transition
from serving.tasks import autoscale_serving
from tests.support.factories import make_attempt, make_job_row
from tests.support.local_runner import emulated_local_cluster_for


def test_rollout_starts_a_rolling_update_and_refuses_a_bad_one_with_the_field_and_reason(
        run_cli, local_runs, settings, monkeypatch, teams, owner, teammate, outsider, h100):
    cluster = emulated_local_cluster_for(settings, monkeypatch, teams[0], h100, nodes=1)
    trained = make_job_row(teams[0], owner.user, h100, name="train-v2", state=JobState.SUCCEEDED)
    unfinished = make_job_row(teams[0], owner.user, h100, name="train-v3", state=JobState.RUNNING)
    serve = make_job_row(teams[0], owner.user, h100, name="serve", kind="inference", state=JobState.QUEUED,
                         spec={"command": ["python", "examples/serve.py"], "checkpoint_from": None})
    make_attempt(serve, cluster, cluster.node_pools.get(accelerator=h100), state=JobState.RUNNING)

    missing = run_cli("rollout", str(serve.pk), persona=owner)
    assert missing.code == 2 and "--checkpoint-from-job" in missing.err
    bad = run_cli("rollout", str(serve.pk), "--checkpoint-from-job", str(unfinished.pk), persona=owner)
    assert bad.code == 2 and (f"checkpoint_from_job: job {unfinished.pk} is RUNNING; only a SUCCEEDED training "
                              f"job's checkpoint is rolled out") in bad.err, bad.err
    forbidden = run_cli("rollout", str(serve.pk), "--checkpoint-from-job", str(trained.pk), persona=teammate)
    assert forbidden.code == 4
    hidden = run_cli("rollout", str(serve.pk), "--checkpoint-from-job", str(trained.pk), persona=outsider)
    assert hidden.code == 5
    assert not ServingRollout.objects.exists()

    started = run_cli("rollout", str(serve.pk), "--checkpoint-from-job", str(trained.pk), "--json", persona=owner)
    assert started.code == 0, started.err
    body = json.loads(started.out)
    assert (body["state"], body["from"], body["to"], body["job"]) == ("rolling", serve.pk, trained.pk, serve.pk)
    assert JobEvent.objects.get(job=serve, kind="rollout_started").actor == owner.user
    again = run_cli("rollout", str(serve.pk), "--checkpoint-from-job", str(trained.pk), persona=owner)
    assert again.code == 2 and "is under way" in again.err
    assert Job.objects.get(pk=serve.pk).spec["checkpoint_from"] is None  # set when the rollout is done


def test_a_follower_rolls_out_when_a_run_succeeds_and_cpctl_job_shows_what_started_it(
        run_cli, local_runs, settings, monkeypatch, teams, owner, h100):
    cluster = emulated_local_cluster_for(settings, monkeypatch, teams[0], h100, nodes=1)
    first = make_job_row(teams[0], owner.user, h100, name="train-gpt", state=JobState.SUCCEEDED)
    spec = {"command": ["python", "examples/serve.py"], "checkpoint_from": first.pk, "follow": {"job": "train-gpt"}}
    serve = make_job_row(teams[0], owner.user, h100, name="serve", kind="inference", spec=spec)
    make_attempt(serve, cluster, cluster.node_pools.get(accelerator=h100), state=JobState.RUNNING)
    waiting = make_job_row(teams[0], owner.user, h100, name="serve-later", kind="inference", spec=spec)
    admitted = make_job_row(teams[0], owner.user, h100, name="serve-admitted", kind="inference", spec=spec,
                            state=JobState.ADMITTED)
    assert [r for r in autoscale_serving.apply().get() if "follow" in r] == []  # each serves the newest run

    run = transition(make_job_row(teams[0], owner.user, h100, name="train-gpt", state=JobState.RUNNING),
                     JobState.SUCCEEDED, reason="exit 0")
    results = [r for r in autoscale_serving.apply().get() if "follow" in r]
    assert results == [
        {"job": serve.pk, "follow": "rollout_started", "run": run.pk},
        {"job": waiting.pk, "follow": "start_checkpoint_set", "run": run.pk},
        {"job": admitted.pk, "follow": "waiting", "run": run.pk, "note": "the job is ADMITTED"}]
    rollout = ServingRollout.objects.get(job=serve)
    assert (rollout.from_job_id, rollout.to_job_id, rollout.trigger_job_id, rollout.actor) == (
        first.pk, run.pk, run.pk, None)
    assert JobEvent.objects.get(job=serve, kind="rollout_started").data["trigger"] == run.pk
    followed = JobEvent.objects.get(job=waiting, kind="checkpoint_followed")
    assert followed.data == {"trigger": run.pk, "from": first.pk, "to": run.pk}
    assert Job.objects.get(pk=waiting.pk).spec["checkpoint_from"] == run.pk
    assert Job.objects.get(pk=admitted.pk).spec["checkpoint_from"] == first.pk  # its attempt reads the old spec

    shown = run_cli("job", str(serve.pk), persona=owner)
    assert shown.code == 0, shown.err
    assert (f"the runs of training job train-gpt: each newer run that succeeds is rolled out to (newest succeeded: "
            f"job {run.pk})") in shown.out
    assert (f"rolling: from the checkpoint of job {first.pk} to that of job {run.pk}, 0 replica(s) updated; started "
            f"because job {run.pk}, which it follows, succeeded") in shown.out

    # rolled back: the run is not tried again, and a rollout by hand to an older checkpoint stands
    ServingRollout.objects.filter(pk=rollout.pk).update(state=ServingRollout.State.ROLLED_BACK)
    assert [r for r in autoscale_serving.apply().get() if r.get("job") == serve.pk and "follow" in r] == []
    assert ServingRollout.objects.filter(job=serve).count() == 1
