"""Dispatch in batches (docs/adr/0047): one task dispatches many admitted attempts, recording those whose objects
exist in one transaction per cluster. Against emulated API servers: each started job has exactly one Job object and
one ADMITTED -> STARTING event naming its attempt, billed from the object's creation; a cluster that does not answer
or an attempt the API server refuses holds up no other; a batch delivered again creates nothing twice."""

from __future__ import annotations

import datetime as dt

import pytest

from jobs.enqueue import dispatch_batches
from jobs.lifecycle import attach_placement_rows, dispatch_many, record_started
from jobs.models import Job, JobAttempt, JobEvent, JobState
from runners.base import TransientDispatchError, backend_for
from tests.support.clusters import load, state
from tests.support.kubernetes import Fault


def created_at(world, attempt: JobAttempt) -> dt.datetime:
    """The creationTimestamp of ``attempt``'s one Job object on its emulated cluster."""
    (obj,) = world.emulators[attempt.cluster.name].objects("Job", attempt.pk)
    return dt.datetime.fromisoformat(obj["metadata"]["creationTimestamp"].replace("Z", "+00:00"))


def starting_events(attempt: JobAttempt) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job_id=attempt.job_id, kind="state", to_state=JobState.STARTING))


def assert_started_once(world, attempt: JobAttempt) -> None:
    """``attempt``'s job is STARTING with one event naming the attempt, one Job object, billed from its creation."""
    assert state(attempt) == JobState.STARTING
    (event,) = starting_events(attempt)
    assert (event.from_state, event.attempt_id) == (JobState.ADMITTED, attempt.pk)
    row = load(attempt.pk)
    assert row.started_at == created_at(world, attempt)
    assert [kind for kind, _ in row.runner_state["objects"]] == ["Job"]


@pytest.mark.django_db(transaction=True)
def test_a_cluster_that_does_not_answer_holds_up_its_own_attempts_alone(live_clusters):
    world = live_clusters
    gcp = [world.admit(cluster="gcp-usc1") for _ in range(2)]
    aws = [world.admit(cluster="aws-use1") for _ in range(2)]
    world.emulators["aws-use1"].stop()
    with pytest.raises(TransientDispatchError, match="2 of 4 attempt"):
        dispatch_many([a.pk for a in aws + gcp])
    for attempt in gcp:
        assert_started_once(world, attempt)
    for attempt in aws:
        assert state(attempt) == JobState.ADMITTED and load(attempt.pk).started_at is None
        assert starting_events(attempt) == []

    world.emulators["aws-use1"].start()  # the retry of the same batch
    outcomes = dispatch_many([a.pk for a in aws + gcp])
    assert outcomes == {**{a.pk: "dispatched" for a in aws}, **{a.pk: "skipped" for a in gcp}}
    for attempt in aws + gcp:
        assert_started_once(world, attempt)


@pytest.mark.django_db(transaction=True)
def test_an_answered_transient_error_leaves_that_attempt_waiting_and_starts_the_rest(live_clusters):
    world = live_clusters
    attempts = [world.admit(cluster="gcp-usc1") for _ in range(3)]
    world.emulators["gcp-usc1"].inject(Fault(503, method="POST", path="/jobs", count=1))  # the first create
    with pytest.raises(TransientDispatchError):
        dispatch_many([a.pk for a in attempts])
    assert [state(a) for a in attempts] == [JobState.ADMITTED, JobState.STARTING, JobState.STARTING]

    assert dispatch_many([a.pk for a in attempts]) == {attempts[0].pk: "dispatched", attempts[1].pk: "skipped",
                                                       attempts[2].pk: "skipped"}
    for attempt in attempts:
        assert_started_once(world, attempt)


@pytest.mark.django_db(transaction=True)
def test_objects_created_by_a_run_that_never_recorded_them_are_adopted_once(live_clusters):
    """A worker killed after its creates and before its transaction: the batch delivered again finds the objects
    (409, owned by the attempt) and bills them from their creation; a third delivery changes nothing."""
    world = live_clusters
    attempts = [world.admit(cluster="gcp-usc1") for _ in range(3)]
    backend_for(attempts[1].cluster).dispatch(load(attempts[1].pk))  # created, not recorded
    before = created_at(world, attempts[1])

    assert dispatch_many([a.pk for a in attempts]) == dict.fromkeys((a.pk for a in attempts), "dispatched")
    assert created_at(world, attempts[1]) == before
    for attempt in attempts:
        assert_started_once(world, attempt)
    assert dispatch_many([a.pk for a in attempts]) == dict.fromkeys((a.pk for a in attempts), "skipped")
    for attempt in attempts:
        assert_started_once(world, attempt)


@pytest.mark.django_db(transaction=True)
def test_an_attempt_refused_for_good_fails_alone(live_clusters):
    world = live_clusters
    good = world.admit(cluster="gcp-usc1")
    refused = world.admit(cluster="gcp-usc1", command=())  # no command nor args: refused before any create
    last = world.admit(cluster="gcp-usc1")
    outcomes = dispatch_many([good.pk, refused.pk, last.pk])
    assert outcomes == {good.pk: "dispatched", refused.pk: "failed", last.pk: "dispatched"}
    assert_started_once(world, good)
    assert_started_once(world, last)
    assert state(refused) == JobState.FAILED
    assert load(refused.pk).end_reason == JobAttempt.EndReason.DISPATCH_ERROR
    assert world.emulators["gcp-usc1"].objects("Job", refused.pk) == []


@pytest.mark.django_db(transaction=True)
def test_a_job_that_moved_on_is_skipped(live_clusters):
    world = live_clusters
    attempts = [world.admit(cluster="gcp-usc1") for _ in range(2)]
    Job.objects.filter(pk=attempts[0].job_id).update(state=JobState.CANCELLING)
    assert dispatch_many([a.pk for a in attempts] + [10 ** 9]) == {attempts[0].pk: "skipped",
                                                                    attempts[1].pk: "dispatched", 10 ** 9: "skipped"}
    assert world.emulators["gcp-usc1"].objects("Job", attempts[0].pk) == []


@pytest.mark.django_db(transaction=True)
def test_a_job_moved_between_its_create_and_the_record_is_left_as_moved_and_the_rest_start(live_clusters):
    """The record's compare-and-set: of a batch whose objects were created, the job a cancel moved meanwhile keeps
    the cancel's state, gets no STARTING event and its attempt no start; the others start, each with one event
    naming its attempt and the reason, in the database and in memory."""
    world = live_clusters
    attempts = [world.admit(cluster="gcp-usc1") for _ in range(3)]
    rows = list(JobAttempt.objects.select_related("job__team", "job__submitter")
                .filter(pk__in=[a.pk for a in attempts]).order_by("pk"))
    created = []
    for row in rows:
        attach_placement_rows(row)
        created.append((row, backend_for(row.cluster).dispatch(row)))
    raced = rows[1]
    before = load(raced.pk)
    Job.objects.filter(pk=raced.job_id).update(state=JobState.CANCELLING)  # a cancel, after the create

    assert record_started(created) == {rows[0].pk: "dispatched", raced.pk: "raced", rows[2].pk: "dispatched"}

    for row in (rows[0], rows[2]):
        assert_started_once(world, row)
        assert Job.objects.get(pk=row.job_id).state_reason == "objects created on gcp-usc1"
        assert (row.job.state, row.started_at) == (JobState.STARTING, created_at(world, row))
    assert state(raced) == JobState.CANCELLING and starting_events(raced) == []
    after = load(raced.pk)
    assert (after.started_at, after.runner_state) == (before.started_at, before.runner_state)
    assert raced.job.state == JobState.ADMITTED and raced.started_at is None


def test_batches_hold_one_cluster_each_and_at_most_the_batch_size():
    pairs = [(1, 10), (2, 20), (3, 10), (4, 10), (5, 20), (6, 10)]
    assert dispatch_batches(pairs, size=2) == [[1, 3], [4, 6], [2, 5]]
    assert dispatch_batches([], size=2) == []
