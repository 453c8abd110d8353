"""CHECKPOINT_STORE_URI: every attempt of a job, on whichever cluster it lands, gets the same CHECKPOINT_URI.

A PersistentVolumeClaim lives in one cluster; the object store is shared by
all of them, so a job recovered on another cluster (another cloud) finds its
checkpoints there. The manifests are those the backend really sends to the
kmock emulators (``conftest.py`` of this folder), validated against the
Kubernetes 1.33 schema.
"""

from __future__ import annotations

import pytest
import time_machine
from django.utils import timezone

from jobs.models import Job, JobState
from jobs.reconcile import reconcile_all
from jobs.scheduling.passes import try_admit
from runners.kubernetes import manifests as m

from .steps import load, start, state, validate, watch_fail_past_the_grace, workload

S = JobState
STORE = "s3://ml-checkpoints/controlplane"


def env_of(obj: dict) -> dict[str, str]:
    """``{name: value}`` of the env of the (single) container of a Job or Deployment; asserts names are unique."""
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), f"duplicate env: {names}"
    return {e["name"]: e.get("value") for e in container["env"]}


def lose_cluster_and_recover(emulated_clusters, attempt):
    """Make ``attempt``'s cluster unreachable past the grace period; returns the job's next (admitted) attempt."""
    emulators, _ = emulated_clusters
    emulators.stop(attempt.cluster.name)
    with time_machine.travel(timezone.now()) as clock:
        watch_fail_past_the_grace(clock, reconcile_all, 600)
    assert state(attempt) == S.RECOVERING and load(attempt.pk).end_reason == "NodeLost"
    assert try_admit(attempt.job_id) == "admitted"
    return load(Job.objects.get(pk=attempt.job_id).current_attempt_id)


def test_attempts_on_two_clusters_get_the_same_checkpoint_uri(emulated_clusters, admitted, settings):
    settings.CHECKPOINT_STORE_URI = STORE + "/"  # a trailing slash makes no double slash
    first = admitted(nodes=2, max_retries=1)
    _, job_a, _ = start(emulated_clusters, first)  # start() validates what was sent
    second = lose_cluster_and_recover(emulated_clusters, first)
    assert (second.number, second.cluster.name) == (2, "aws-use1") != (first.number, first.cluster.name)
    _, job_b, _ = start(emulated_clusters, second)

    uri = f"{STORE}/alpha/job-{first.job_id}"
    for job in (job_a, job_b):
        validate(job)
        env = env_of(job)
        assert env["CHECKPOINT_URI"] == uri
        assert env["CHECKPOINT_DIR"] == "/checkpoints"  # still the local working directory
    assert env_of(job_a)["CONTROLPLANE_ATTEMPT"] == "1" and env_of(job_b)["CONTROLPLANE_ATTEMPT"] == "2"


def test_another_job_of_the_team_gets_another_directory(emulated_clusters, admitted, settings):
    settings.CHECKPOINT_STORE_URI = STORE
    one, other = admitted(), admitted()
    uris = {env_of(start(emulated_clusters, attempt)[1])["CHECKPOINT_URI"] for attempt in (one, other)}
    assert uris == {f"{STORE}/alpha/job-{one.job_id}", f"{STORE}/alpha/job-{other.job_id}"}


def test_without_the_setting_there_is_no_checkpoint_uri(emulated_clusters, admitted, settings):
    settings.CHECKPOINT_STORE_URI = ""
    _, job, _ = start(emulated_clusters, admitted())
    env = env_of(job)
    assert "CHECKPOINT_URI" not in env and env["CHECKPOINT_DIR"] == "/checkpoints"


@pytest.mark.parametrize("kind,nodes", [("training", 1), ("training", 3), ("inference", 1)])
def test_manifests_with_a_store_validate_and_carry_it_in_every_pod(kind, nodes):
    uri = m.checkpoint_uri(STORE, "alpha", 7)
    assert uri == f"{STORE}/alpha/job-7"
    for obj in m.manifests(workload(kind=kind, nodes=nodes, checkpoint_uri=uri)):
        validate(obj)
        if obj["kind"] in ("Job", "Deployment"):
            assert env_of(obj)["CHECKPOINT_URI"] == uri


def test_a_checkpoint_uri_in_the_job_spec_wins_and_is_not_duplicated():
    """A serving job names the store directory of the training job it serves."""
    mine = "gs://elsewhere/alpha/job-3"
    w = workload(kind="inference", nodes=1, env=(("CHECKPOINT_URI", mine),),
                 checkpoint_uri=m.checkpoint_uri(STORE, "alpha", 7))
    (deployment,) = [o for o in m.manifests(w) if o["kind"] == "Deployment"]
    validate(deployment)
    assert env_of(deployment)["CHECKPOINT_URI"] == mine


def test_no_store_means_no_uri():
    assert m.checkpoint_uri("", "alpha", 7) == ""


@pytest.mark.parametrize("kind,nodes", [("training", 1), ("training", 2), ("inference", 1)])
def test_a_job_env_naming_platform_variables_gets_the_platforms_values_once(kind, nodes):
    """The local runner lets the platform's CHECKPOINT_DIR, rendezvous and CONTROLPLANE_* win; so do the manifests,
    without sending the name twice (the kubelet would hide the first, and the API server warns)."""
    w = workload(kind=kind, nodes=nodes, env=(("CHECKPOINT_DIR", "/checkpoints/train-gpt"), ("MASTER_ADDR", "evil"),
                                                ("CONTROLPLANE_TEAM", "beta"), ("SEED", "1")))
    for obj in m.manifests(w):
        if obj["kind"] not in ("Job", "Deployment"):
            continue
        validate(obj)
        env = env_of(obj)  # asserts each name appears once
        assert env["CHECKPOINT_DIR"] == "/checkpoints" and env["CONTROLPLANE_TEAM"] == "alpha"
        assert env["SEED"] == "1"
        if kind == "training":
            # one node rendezvouses with itself; more with node 0 behind the job's headless service
            assert env["MASTER_ADDR"] == ("127.0.0.1" if nodes == 1 else "job-7-1-0.job-7-1.cp-alpha.svc")


def test_checkpoint_env_keeps_a_spec_override_even_empty() -> None:
    """A job may opt out of the store with CHECKPOINT_URI="" in its spec env: no second CHECKPOINT_URI."""
    w = m.Workload(name="w", namespace="cp-alpha", job_id=3, attempt_id=1, attempt_number=1, kind="training",
                   team="alpha", image="i",
                   command=("python",), env=(("CHECKPOINT_URI", ""),), checkpoint_uri="s3://b/p/alpha/job-3")
    env = m._container(w, m._platform_env(w), [])["env"]
    assert [e["value"] for e in env if e["name"] == "CHECKPOINT_URI"] == [""]
