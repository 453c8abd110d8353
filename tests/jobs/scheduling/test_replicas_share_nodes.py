"""Class of failure: "accepted but never placeable" (admission and placement disagree). Invariant: a job accepted at
submission (201) is placeable on some pool of the fleet as it stands when empty, and a job no pool could ever hold
is refused at submission with 400 naming the field and the reason; the submission check and the placement count
a node's room for a job with the same function (``jobs.scheduling.core.pods_on``; ADR 0019). An inference job's
replicas may share a node (spread first), and its Deployment only prefers to spread them, so the kube-scheduler
never refuses what placement promised."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.exceptions import ValidationError

from core.lookups import clear_all
from jobs.lifecycle import dispatch
from jobs.models import Job, JobState
from jobs.scheduling.core import NodeBook, NodeRoom, PlacementRequest, PoolOffer
from jobs.scheduling.passes import schedule_pending
from jobs.scheduling.preview import preview_submission
from jobs.spec import validated_submission
from quotas.models import Quota
from runners.kubernetes import manifests as m
from runners.models import Node, NodePool
from tests.runners.kubernetes.steps import validate, workload
from tests.support.clusters import state
from tests.support.factories import make_cluster

JOBS = "/api/v1/jobs/"


def serving(replicas: int, gpus: int, nodes: int = 1) -> dict:
    """An inference submission of alpha: ``replicas`` x ``nodes`` pods of ``gpus`` H100 GPUs."""
    return {"team": "alpha", "name": "serve", "kind": "inference", "spec": {
        "image": "registry.example/serve:1", "command": ["python", "serve.py"], "replicas": replicas, "port": 8000,
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes},
        "max_runtime_seconds": 600}}


def training(nodes: int, gpus: int) -> dict:
    return {"team": "alpha", "name": "train", "kind": "training", "spec": {
        "image": "registry.example/train:1", "command": ["python", "train.py"],
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes},
        "max_runtime_seconds": 600}}


def synced(pool, count: int, gpus: int) -> None:
    for i in range(count):
        Node.objects.create(cluster=pool.cluster, node_pool=pool, name=f"{pool.cluster.name}-n{i}", gpus=gpus,
                            cpu_milli=64_000, memory_mib=512 * 1024, seen_at=timezone.now())


@pytest.fixture
def two_by_eight(h100, teams):
    """One cluster whose H100 pool is 2 synced nodes x 8 GPUs; alpha may hold 32 GPUs."""
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=32)
    _, pool = make_cluster("aws-use1", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="3.00")
    synced(pool, 2, 8)
    return pool


def test_three_replicas_of_two_gpus_on_two_eight_gpu_nodes_are_accepted_and_placed(teammate, two_by_eight):
    r = teammate.client.post(JOBS, serving(3, 2), format="json")
    assert r.status_code == 201, r.json()

    schedule_pending()

    job = Job.objects.get(pk=r.json()["id"])
    assert job.state == JobState.ADMITTED, job.queue_info
    placed = job.current_attempt.placement["nodes"]
    assert len(placed) == 3 and set(placed) == {"aws-use1-n0", "aws-use1-n1"}  # spread over both, then shared
    assert job.current_attempt.gpus == 6


def test_three_replicas_of_two_gpus_run_on_an_emulated_cluster_of_two_eight_gpu_nodes(live_clusters):
    world = live_clusters
    attempt = world.admit(kind="inference", replicas=3, gpus=2, cluster="gcp-usc1")
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    assert state(attempt) == JobState.RUNNING
    assert len(world.emulators["gcp-usc1"].pods(attempt.pk)) == 3


def test_replicas_that_no_pool_could_ever_hold_are_refused_naming_replicas(teammate, two_by_eight):
    r = teammate.client.post(JOBS, serving(3, 6), format="json")  # one 6-GPU pod per 8-GPU node: 2 at most
    assert r.status_code == 400
    assert r.json() == {"spec.replicas": [
        "3 replicas of 1 x 6 GPUs (3 pods) is more than any H100-80GB node pool can hold, with replicas sharing "
        "nodes; the largest holds 2 such pods"]}
    assert not Job.objects.exists()


def test_each_replica_is_a_deployment_pinned_to_its_own_booked_node():
    """Two replicas booked on gpu-a and one on gpu-b: each replica's Deployment pins its one pod to its own node,
    so the kube-scheduler cannot put a second one on gpu-b, and no anti-affinity is needed to spread them."""
    w = workload(kind="inference", nodes=1, replicas=3, node_names=("gpu-a", "gpu-a", "gpu-b"))
    pinned = []
    for index in range(3):
        deployment = m.inference_deployment(w, index)
        validate(deployment)
        spec = deployment["spec"]["template"]["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        (values,) = {tuple(e["values"]) for t in terms for e in t["matchExpressions"]
                     if e["key"] == "kubernetes.io/hostname"}
        pinned.append(values)
        assert "podAntiAffinity" not in spec["affinity"] and deployment["spec"]["replicas"] == 1
    assert pinned == [("gpu-a",), ("gpu-a",), ("gpu-b",)]


# --- the class: submission accepts iff placement on the empty fleet finds a place -----------------------------

FLEETS = st.lists(st.tuples(st.integers(1, 4), st.sampled_from([1, 2, 4, 8]), st.booleans()), min_size=1,
                  max_size=3)
SHAPES = st.one_of(
    st.tuples(st.just("training"), st.integers(1, 6), st.sampled_from([1, 2, 3, 4, 6, 8])),
    st.tuples(st.just("inference"), st.integers(1, 9), st.sampled_from([1, 2, 3, 4, 6, 8])),
)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=FLEETS, shape=SHAPES)
def test_submission_accepts_exactly_what_placement_on_the_empty_fleet_can_place(h100, teams, owner, fleet, shape):
    """Fleets of pools (``n`` nodes x ``g`` GPUs, synced node rows or not) and job shapes (training nodes x GPUs,
    inference replicas x GPUs): ``validated_submission`` accepts iff the scheduler's placement (the preview's,
    which asks the pass's ``Room``) finds a place on the fleet with nothing running."""
    kind, count, gpus = shape
    submitted = training(count, gpus) if kind == "training" else serving(count, gpus)
    try:
        with transaction.atomic():
            clear_all()
            Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=1000)
            for i, (nodes, per_node, rows) in enumerate(fleet):
                _, pool = make_cluster(f"c{i}", "aws", "us-east-1", h100, nodes=nodes, gpus_per_node=per_node,
                                       price=f"{i + 1}.00")
                if rows:
                    synced(pool, nodes, per_node)
            try:
                fields = validated_submission(submitted, owner.user)
                accepted = True
            except ValidationError:
                accepted = False
            resources = {"accelerator": h100, "gpus_per_node": gpus, "nodes": count if kind == "training" else 1,
                         "replicas": count if kind == "inference" else 1, "priority": 500, "preemptible": False,
                         "max_runtime_seconds": 600}
            placed = preview_submission(teams[0], resources, {}, kind=kind).fits_now
            assert accepted == placed, (fleet, shape, accepted and fields["resources"])
            assert NodePool.objects.count() == len(fleet)
            raise _RollBack
    except _RollBack:
        pass
    finally:
        clear_all()


class _RollBack(Exception):
    """Leaves the example's atomic block, rolling its rows back."""


def test_pods_share_a_node_only_when_the_nodes_are_too_few():
    """Spread first: as many distinct nodes as pods when the pool has them; otherwise dealt round by round."""
    def offer(nodes):
        return PoolOffer(1, 1, "c", "aws", "r", "on-demand", len(nodes), 8, sum(nodes), Decimal(1),
                         node_rooms=tuple(NodeRoom(f"n{i}", 8, f) for i, f in enumerate(nodes)))

    for free, pods, expect in (([8, 8, 8], 3, {"n0": 1, "n1": 1, "n2": 1}), ([8, 8], 3, None),
                               ([8, 8], 5, None), ([2, 8], 2, {"n0": 1, "n1": 1})):
        book = NodeBook([offer(free)])
        found = book.fit(1, PlacementRequest(pods, 2, share_nodes=True))
        got = Counter(book.names(1, found))
        assert sum(got.values()) == pods
        if expect is not None:
            assert dict(got) == expect
        else:
            assert len(got) == len(free)  # every node used, none over its room
        assert all(got[f"n{i}"] * 2 <= f for i, f in enumerate(free))
    assert NodeBook([offer([2, 2])]).fit(1, PlacementRequest(3, 2, share_nodes=True)) is None
    assert NodeBook([offer([8, 8])]).fit(1, PlacementRequest(3, 2)) is None  # training: a node per pod
