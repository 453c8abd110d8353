"""A job's next attempt is not dispatched while the pods of its previous one, deleted by a preemption, still run out
their termination grace (Terminating, containers running, GPUs held): a job never runs twice at once.

Class: a job running twice (two writers of one checkpoint, and GPUs booked twice). Invariant (the simulator's
``no_duplicate_run``): never more pods of a job alive than its nodes x replicas. The simulator's regression
scenario ``preempted_pods_still_stopping`` plays it across clusters.
"""

from __future__ import annotations

import time

import pytest

from jobs.lifecycle import delete_ended_attempt, dispatch, preempt_attempt
from jobs.models import Job, JobState
from jobs.scheduling.passes import try_admit
from runners.base import TransientDispatchError
from tests.support.clusters import load


def alive(emulator, attempt) -> list[dict]:
    return [p for p in emulator.pods(attempt.pk) if p["status"].get("phase") == "Running"]


@pytest.mark.parametrize("grace", [30.0, 120.0])
def test_the_next_attempt_waits_until_the_preempted_pods_stopped(live_clusters, grace):
    world = live_clusters
    first = world.running("gcp-usc1", preemptible=True, gpus=4)
    emulator = world.emulator(first)
    emulator.termination_grace = grace
    preempt_attempt(Job.objects.get(pk=first.job_id), first, reason="preempted for a job within its nominal quota")
    assert delete_ended_attempt(first.pk) is False  # the DELETE was accepted; the pods run out their grace
    assert alive(emulator, first)

    assert try_admit(first.job_id) == "admitted"
    second = load(Job.objects.get(pk=first.job_id).current_attempt_id)
    with pytest.raises(TransientDispatchError, match="still stopping"):
        dispatch(second.pk)
    assert Job.objects.get(pk=first.job_id).state == JobState.ADMITTED
    assert not world.emulators[second.cluster.name].pods(second.pk)

    emulator.step(now=time.time() + grace + 1)  # the grace is over: the old pods are gone
    assert not alive(emulator, first)
    assert dispatch(second.pk) == "dispatched"
    assert Job.objects.get(pk=first.job_id).state == JobState.STARTING


def test_a_previous_attempt_that_stopped_at_once_holds_nothing_up(live_clusters):
    world = live_clusters
    first = world.running("gcp-usc1", preemptible=True, gpus=4)
    preempt_attempt(Job.objects.get(pk=first.job_id), first, reason="preempted for a job within its nominal quota")
    delete_ended_attempt(first.pk)
    assert try_admit(first.job_id) == "admitted"
    assert dispatch(Job.objects.get(pk=first.job_id).current_attempt_id) == "dispatched"
