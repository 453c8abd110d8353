"""Class of failure: "recovery returns to the failure it recovers from". Invariant: a spot reclaim is counted by its
cause (end reason ``SpotReclaimed``, never charged to ``max_retries``), and for ``SPOT_RECLAIM_AVOID_SECONDS`` after
it the job's next placements take another cluster with room, cheapest first; only when none has room does the job
go back to the reclaimed cluster (SkyPilot's eager failover), and after the window the cheapest is allowed again
(ADR 0018)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from jobs.lifecycle import apply_observation, dispatch
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from quotas.models import Quota
from runners.base import Observation
from tests.support.clusters import H100_LABEL, emulated_cluster, load, state
from tests.support.factories import make_cluster, make_job_row, run

S = JobState
SPOT = {"nvidia.com/gpu.product": H100_LABEL, "karpenter.sh/capacity-type": "spot"}


@pytest.fixture
def spot_world(settings, catalog, teams, user):
    """Two emulated clusters of one 8-GPU spot node each, ``cheap`` at 1.00 and ``dear`` at 1.20 USD/GPU-h, and
    alpha's 64-GPU quota; yields ``(emulators, clusters)`` by name."""
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 0
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 1.0
    h100 = catalog["H100-80GB"]
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=64)
    emulators, clusters = {}, {}
    try:
        for name, price in (("cheap", "1.00"), ("dear", "1.20")):
            emulators[name], clusters[name] = emulated_cluster(name, "aws", "us-east-1", h100, price=price,
                                                               labels=SPOT, node_prefix="spot", nodes=1,
                                                               capacity_type="spot")
        yield emulators, clusters
    finally:
        for emulator in emulators.values():
            emulator.stop()


def preemptible_job(teams, user, catalog, max_retries: int) -> Job:
    return make_job_row(teams[0], user, catalog["H100-80GB"], name="train", gpus_per_node=8, nodes=1,
                        preemptible=True, max_retries=max_retries)


def test_after_a_spot_reclaim_attempt_two_goes_to_the_other_cluster(spot_world, teams, user, catalog):
    """Attempt 1 on the cheaper cluster; its node is reclaimed and a replacement joins the same cluster:
    attempt 2 runs on the dearer cluster, and the reclaim used no retry."""
    emulators, _ = spot_world
    job = preemptible_job(teams, user, catalog, max_retries=1)
    assert try_admit(job.pk) == "admitted"
    first = load(Job.objects.get(pk=job.pk).current_attempt_id)
    assert first.cluster.name == "cheap"
    assert dispatch(first.pk) == "dispatched"
    reconcile_cluster(first.cluster)
    assert state(first) == S.RUNNING

    cheap = emulators["cheap"]
    cheap.interrupt_spot(cheap.pods(first.pk)[0]["spec"]["nodeName"])
    cheap.add_node("cheap-spot-1", 8, SPOT)  # the replacement node joins the reclaimed cluster
    reconcile_cluster(first.cluster)

    assert state(first) == S.RECOVERING
    assert try_admit(job.pk) == "admitted"
    second = load(Job.objects.get(pk=job.pk).current_attempt_id)
    assert (second.number, second.cluster.name) == (2, "dear")
    assert load(first.pk).end_reason == "SpotReclaimed"
    assert dispatch(second.pk) == "dispatched"
    reconcile_cluster(second.cluster)
    assert state(second) == S.RUNNING


# --- the class -------------------------------------------------------------------------------------------------

def reclaim(attempt: JobAttempt, when: dt.datetime) -> None:
    """What reconcile does with a pod whose spot node the provider shut down: a ``lost`` look whose end reason the
    runner reads as ``Preempted`` (DisruptionTarget TerminationByKubelet), ended at ``when``."""
    job = Job.objects.get(pk=attempt.job_id)
    apply_observation(job, load(attempt.pk), Observation("lost", "Preempted", None,
                                                         "pod x: TerminationByKubelet: spot reclaimed",
                                                         ended_at=when))


@pytest.mark.parametrize("prices", [("1.00", "1.20"), ("2.00", "1.50", "3.00"), ("1.00", "1.00", "1.10", "5.00"),
                                    ("4.00", "3.00", "2.00", "1.00", "0.50")])
@pytest.mark.parametrize("window", [600.0, 1800.0])
def test_every_reclaimed_cluster_is_avoided_while_another_has_room_and_never_costs_a_retry(
        settings, catalog, teams, user, prices, window):
    """Spot clusters of one 8-GPU node at ``prices``; a preemptible 1 x 8 job without retries is reclaimed again
    and again: each next attempt goes to the cheapest cluster not reclaimed within the window while one is
    left (whichever cluster that is), to the cheapest of them all once every one was (nothing else has room), the
    job never fails for it, and past the window the cheapest cluster takes it again."""
    settings.SPOT_RECLAIM_AVOID_SECONDS = window
    h100 = catalog["H100-80GB"]
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=64)
    ids = {}
    for i, price in enumerate(prices):
        cluster, _ = make_cluster(f"c{i}", "aws", "us-east-1", h100, nodes=1, capacity_type="spot", price=price)
        ids[cluster.pk] = (float(price), cluster.name)
    by_price = sorted(ids, key=lambda c: (ids[c][0], ids[c][1]))
    job = preemptible_job(teams, user, catalog, max_retries=0)
    now = timezone.now()
    assert try_admit(job.pk, now) == "admitted"
    reclaimed: list[int] = []
    for turn in range(len(prices) + 1):
        job, attempt = run(job)
        expected = next((c for c in by_price if c not in reclaimed), by_price[0])
        assert attempt.cluster_id == expected, (turn, ids[attempt.cluster_id], [ids[c] for c in reclaimed])
        now += dt.timedelta(seconds=1)
        reclaim(attempt, now)
        reclaimed.append(attempt.cluster_id)
        assert Job.objects.get(pk=job.pk).state == S.RECOVERING  # max_retries 0: a reclaim costs none
        assert try_admit(job.pk, now + dt.timedelta(seconds=1)) == "admitted"
        job = Job.objects.get(pk=job.pk)
    assert job.attempts.filter(end_reason=JobAttempt.EndReason.SPOT_RECLAIMED).count() == len(prices) + 1

    job, attempt = run(job)
    reclaim(attempt, now + dt.timedelta(seconds=2))
    later = now + dt.timedelta(seconds=window + 5)  # every reclaim is older than the window
    assert try_admit(job.pk, later) == "admitted"
    assert Job.objects.get(pk=job.pk).current_attempt.cluster_id == by_price[0]


def test_a_preemption_on_an_on_demand_pool_is_no_spot_reclaim(live_clusters):
    """The same disruption on an on-demand pool keeps its end reason ``Preempted`` and steers nothing."""
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", max_retries=0)
    job, attempt = run(Job.objects.get(pk=attempt.job_id))
    reclaim(attempt, timezone.now())
    assert load(attempt.pk).end_reason == JobAttempt.EndReason.PREEMPTED
