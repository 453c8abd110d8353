"""``cpctl rollout JOB --checkpoint-from-job N`` against the live API: a rollout started (202) and printed, a bad one
a field error (exit 2) with its reason, another team's job not found (exit 5)."""

from __future__ import annotations

import json

from jobs.models import Job, JobEvent, JobState, ServingRollout
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
