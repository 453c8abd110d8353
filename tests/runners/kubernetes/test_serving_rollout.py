"""Rolling a serving job to another checkpoint on Kubernetes (docs/adr/0041-autoscaled-serving.md, "pinned
replicas"): each replica is a Deployment pinned to the node booked for it, so the rollout keeps its surge (the last
booked slot) while it changes each old replica's pod template in its own slot, then retires the surge and releases
the last booking; at every step the booking (``placement.nodes``, the attempt's GPUs) and the pods agree. A new
replica that crashes rolls the rollout back: the old checkpoint everywhere, the surge retired and released.

On an emulated API server whose Deployment controller recreates a changed template's pod (strategy Recreate) and a
kube-scheduler that binds by node affinity and free GPUs (``tests.support.kube_scheduler.bind``).
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import Job, JobEvent, JobState, ServingRollout
from jobs.reconcile import reconcile_cluster
from runners.base import backend_for
from runners.kubernetes import manifests as m
from serving.autoscaler import apply_replicas
from serving.replicas import add_replica
from serving.rollout import start_rollout, step_rollouts
from tests.support.clusters import load, state
from tests.support.factories import make_job_row

from . import test_autoscaled_serving as autoscaled
from .steps import validate
from .test_autoscaled_serving import hostnames, live_deployments, serving

cluster = autoscaled.cluster  # the fixture: three 8-GPU nodes and a kube-scheduler

S = JobState
CLAIM = "team-checkpoints"
STORE = "s3://ml-checkpoints/cp"


@pytest.fixture
def stores(settings):
    """Checkpoints on a claim and in a store, so a replica's checkpoint shows in its pod template three ways."""
    settings.K8S_CHECKPOINT_CLAIM = CLAIM
    settings.CHECKPOINT_STORE_URI = STORE


def on_checkpoint(deployment: dict, job_id: int) -> bool:
    """Whether ``deployment``'s pod template loads job ``job_id``'s checkpoint: the claim's subPath, CHECKPOINT_URI
    and the checkpoint annotation all name it (written here from the documented layout, not from the code)."""
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    (mount,) = container["volumeMounts"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return (mount["subPath"] == f"job-{job_id}" and env["CHECKPOINT_URI"] == f"{STORE}/alpha/job-{job_id}"
            and template["metadata"]["annotations"]["controlplane.io/checkpoint-job"] == str(job_id))


def check_booking(emulator, attempt_id: int) -> list[str]:
    """The booking and the cluster agree: one live Deployment per booked node, slot ``i`` pinned to
    ``placement.nodes[i]``, each live pod (not being deleted) on its slot's node, and the attempt's GPUs 8 per
    booked node; the booked nodes."""
    attempt = load(attempt_id)
    booked = attempt.placement["nodes"]
    deployments = live_deployments(emulator, attempt)
    assert [d["metadata"]["name"] for d in deployments] == [f"{attempt.object_name}-{i}" for i in range(len(booked))]
    assert [hostnames(d) for d in deployments] == [[n] for n in booked]
    pods = [p for p in emulator.pods(attempt_id) if not p["metadata"].get("deletionTimestamp")]
    assert sorted(int(p["metadata"]["labels"][m.LABEL_REPLICA]) for p in pods) == list(range(len(booked)))
    assert all(p["spec"]["nodeName"] == booked[int(p["metadata"]["labels"][m.LABEL_REPLICA])] for p in pods)
    assert attempt.gpus == 8 * len(booked) == 8 * Job.objects.get(pk=attempt.job_id).replicas
    for deployment in deployments:
        validate({k: deployment[k] for k in ("apiVersion", "kind", "spec")}
                 | {"metadata": {k: deployment["metadata"][k] for k in ("name", "namespace", "labels")}})
    return booked


def step(emulator, row, attempt_id: int) -> ServingRollout:
    """One rollout step, the cluster's controllers and a reconcile; the booking checked after each; the rollout."""
    (result,) = step_rollouts()
    assert "error" not in result, result
    check_booking(emulator, attempt_id)
    emulator.step()
    reconcile_cluster(row)
    check_booking(emulator, attempt_id)
    assert state(load(attempt_id)) == S.RUNNING
    return ServingRollout.objects.get(pk=result["rollout"])


def test_a_rollout_updates_each_pinned_replica_in_its_slot_and_releases_the_surge(
        stores, cluster, teams, user, catalog):
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row, replicas=2)
    booked = check_booking(emulator, attempt.pk)
    assert len(booked) == 2
    before = {p["metadata"]["uid"] for p in emulator.pods(attempt.pk)}
    assert all(on_checkpoint(d, attempt.job_id) for d in live_deployments(emulator, attempt))
    trained = make_job_row(teams[0], user, catalog["H100-80GB"], name="v2", state=S.SUCCEEDED)

    rollout = start_rollout(attempt.job_id, checkpoint_from_job_id=trained.pk, actor=None)
    seen_nodes = []
    for _ in range(20):
        rollout = step(emulator, row, attempt.pk)
        seen_nodes.append(load(attempt.pk).placement["nodes"])
        if rollout.state != ServingRollout.State.ROLLING:
            break
    assert rollout.state == ServingRollout.State.DONE, rollout.reason
    assert rollout.replicas_updated == 2
    assert max(len(n) for n in seen_nodes) == 3  # a surge was booked on the third node...
    assert seen_nodes[-1] == booked  # ...and released: the two original slots, on their nodes
    deployments = live_deployments(emulator, attempt)
    assert len(deployments) == 2 and all(on_checkpoint(d, trained.pk) for d in deployments)
    assert not any(m.PROBATION_ANNOTATION in (d["metadata"].get("annotations") or {}) for d in deployments)
    pods = [p for p in emulator.pods(attempt.pk) if not p["metadata"].get("deletionTimestamp")]
    assert not {p["metadata"]["uid"] for p in pods} & before  # every pod made anew, on the new checkpoint
    assert Job.objects.get(pk=attempt.job_id).spec["checkpoint_from"] == trained.pk
    assert [e.data["replicas"] for e in JobEvent.objects.filter(job_id=attempt.job_id, kind="scale")
            .order_by("id")] == [3, 2]
    assert not JobEvent.objects.filter(job_id=attempt.job_id, kind="replica_replaced").exists()

    # A later scale-up loads the new checkpoint too.
    assert add_replica(attempt.job_id, timezone.now(), {"desired": 3}) is None
    attempt = load(attempt.pk)
    assert apply_replicas(backend_for(attempt.cluster), attempt, 3)
    emulator.step()
    check_booking(emulator, attempt.pk)
    assert all(on_checkpoint(d, trained.pk) for d in live_deployments(emulator, attempt))


@pytest.mark.parametrize("failing", ["surge", "in_place"])
def test_a_new_replica_that_crashes_rolls_back_to_the_old_checkpoint_and_releases_the_surge(
        stores, cluster, teams, user, catalog, failing):
    emulator, row = cluster
    attempt = serving(teams, user, catalog, emulator, row, replicas=2)
    booked = check_booking(emulator, attempt.pk)
    trained = make_job_row(teams[0], user, catalog["H100-80GB"], name="v2", state=S.SUCCEEDED)
    rollout = start_rollout(attempt.job_id, checkpoint_from_job_id=trained.pk, actor=None)
    for _ in range(10):  # up to the new replica to fail: the surge, or the first replica updated in its slot
        rollout = step(emulator, row, attempt.pk)
        pending = rollout.progress.get("pending")
        if pending and (pending["surge"] if failing == "surge" else not pending["surge"]):
            break
    else:
        raise AssertionError(f"no {failing} replica was started")
    new = [p for p in emulator.pods(attempt.pk) if p["metadata"]["labels"][m.LABEL_REPLICA] == pending["key"]
           and p["metadata"]["annotations"]["controlplane.io/checkpoint-job"] == str(trained.pk)]
    assert len(new) == 1
    emulator.crash_pod(new[0]["metadata"]["name"], exit_code=1)  # the new checkpoint does not load
    reconcile_cluster(row)  # on probation: no lost replica of the attempt
    assert state(load(attempt.pk)) == S.RUNNING

    rollout = step(emulator, row, attempt.pk)
    assert rollout.state == ServingRollout.State.ROLLED_BACK, rollout.reason
    assert load(attempt.pk).placement["nodes"] == booked  # the surge released
    deployments = live_deployments(emulator, attempt)
    assert len(deployments) == 2 and all(on_checkpoint(d, attempt.job_id) for d in deployments)
    assert not any(m.PROBATION_ANNOTATION in (d["metadata"].get("annotations") or {}) for d in deployments)
    pods = [p for p in emulator.pods(attempt.pk) if not p["metadata"].get("deletionTimestamp")]
    assert {p["metadata"]["annotations"]["controlplane.io/checkpoint-job"] for p in pods} == {str(attempt.job_id)}
    assert "checkpoint_from" not in Job.objects.get(pk=attempt.job_id).spec
    assert [e.data["replicas"] for e in JobEvent.objects.filter(job_id=attempt.job_id, kind="scale")
            .order_by("id")] == [3, 2]
    assert not JobEvent.objects.filter(job_id=attempt.job_id, kind="replica_replaced").exists()
    emulator.step()
    reconcile_cluster(row)
    assert state(load(attempt.pk)) == S.RUNNING
    check_booking(emulator, attempt.pk)
