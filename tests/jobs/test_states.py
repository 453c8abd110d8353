"""The job state machine (docs/design.md, Job states): every (from, to) pair, compare-and-set, and one event per change.

The expected edges are written by hand from the table of docs/design.md, Job states,
and its notes (``tests/support/states.py``), not read from ``jobs.states``; every
one of the 10 x 10 pairs is tried against the database.
"""

import itertools

import pytest
from django.db import connection, transaction

from jobs.models import Job, JobEvent, JobState
from jobs.states import InvalidTransition, StaleState, transition
from tests.support.factories import make_job_row
from tests.support.states import ALL_STATES, EXPECTED_EDGES, FINAL

S = JobState

ALL_PAIRS = list(itertools.product(ALL_STATES, ALL_STATES))


def test_the_hand_written_state_list_is_the_models_state_list():
    assert sorted(ALL_STATES) == sorted(s.value for s in JobState)
    assert not any(src in FINAL for src, _ in EXPECTED_EDGES)


@pytest.fixture
def job_in(teams, user, h100):
    """``job_in(state)``: a bare job row of alpha in ``state``, with no event yet."""
    def make(state=S.QUEUED):
        return make_job_row(teams[0], user, h100, name="j", state=state)
    return make


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_transition_succeeds_exactly_on_the_edges_of_the_design(job_in, src, dst):
    job = job_in(src)
    before = Job.objects.get(pk=job.pk)
    if (src, dst) in EXPECTED_EDGES:
        returned = transition(job, dst, reason="because")
        assert returned is job and job.state == dst
        row = Job.objects.get(pk=job.pk)
        assert row.state == dst
        assert row.state_reason == "because"
        events = list(JobEvent.objects.filter(job=job))
        assert len(events) == 1
        assert (events[0].kind, events[0].from_state, events[0].to_state, events[0].reason) == ("state", src, dst, "because")
        if dst in FINAL:
            assert row.ended_at is not None
        if dst == "ADMITTED":
            assert row.admitted_at is not None
        if dst == "RUNNING":
            assert row.started_at is not None
    else:
        with pytest.raises(InvalidTransition):
            transition(job, dst, reason="because")
        row = Job.objects.get(pk=job.pk)
        assert row.state == src
        assert row.updated_at == before.updated_at
        assert row.state_reason == before.state_reason
        assert not JobEvent.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_nothing_leaves_a_final_state(job_in):
    for final in sorted(FINAL):
        job = job_in(final)
        for dst in ALL_STATES:
            with pytest.raises(InvalidTransition):
                transition(job, dst)
        assert Job.objects.get(pk=job.pk).state == final
        assert not JobEvent.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_a_stale_in_memory_job_raises_and_writes_nothing(job_in):
    job = job_in(S.QUEUED)
    stale = Job.objects.get(pk=job.pk)
    transition(job, S.ADMITTED, reason="winner")  # another worker moves the row on
    with pytest.raises(StaleState):
        transition(stale, S.REJECTED, reason="loser")  # QUEUED -> REJECTED is an edge, but the row is ADMITTED now
    row = Job.objects.get(pk=job.pk)
    assert row.state == S.ADMITTED and row.state_reason == "winner"
    assert list(JobEvent.objects.filter(job=job).values_list("from_state", "to_state")) == [("QUEUED", "ADMITTED")]
    assert stale.state == S.QUEUED  # the loser's object is not updated either


@pytest.mark.django_db
def test_a_row_changed_behind_the_object_by_a_plain_update_is_stale_too(job_in):
    job = job_in(S.RUNNING)
    Job.objects.filter(pk=job.pk).update(state=S.CANCELLING)
    with pytest.raises(StaleState):
        transition(job, S.SUCCEEDED)
    row = Job.objects.get(pk=job.pk)
    assert row.state == S.CANCELLING and row.ended_at is None
    assert not JobEvent.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_two_racers_from_the_same_state_only_one_wins(job_in):
    job = job_in(S.RUNNING)
    a, b = Job.objects.get(pk=job.pk), Job.objects.get(pk=job.pk)
    transition(a, S.SUCCEEDED)
    with pytest.raises(StaleState):
        transition(b, S.FAILED)
    assert Job.objects.get(pk=job.pk).state == S.SUCCEEDED
    assert JobEvent.objects.filter(job=job).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_lost_compare_and_set_inside_a_transaction_leaves_it_usable(job_in):
    """transition() takes no savepoint; a StaleState it raises must not poison the caller's transaction."""
    lost, won = job_in(S.RUNNING), job_in(S.QUEUED)
    Job.objects.filter(pk=lost.pk).update(state=S.CANCELLING)
    with transaction.atomic():
        with pytest.raises(StaleState):
            transition(lost, S.SUCCEEDED)
        transition(won, S.ADMITTED, reason="same transaction, after the loss")
    assert Job.objects.get(pk=won.pk).state == S.ADMITTED
    assert JobEvent.objects.filter(job_id=won.pk).count() == 1
    assert not JobEvent.objects.filter(job_id=lost.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_state_and_event_roll_back_together_with_the_outer_transaction(job_in):
    job = job_in(S.QUEUED)
    with pytest.raises(RuntimeError), transaction.atomic():
        transition(job, S.ADMITTED, reason="about to be undone")
        assert Job.objects.get(pk=job.pk).state == S.ADMITTED  # visible inside the transaction
        assert JobEvent.objects.filter(job_id=job.pk).count() == 1
        raise RuntimeError("boom")
    row = Job.objects.get(pk=job.pk)
    assert row.state == S.QUEUED and row.admitted_at is None
    assert not JobEvent.objects.filter(job_id=job.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_failure_writing_the_event_undoes_the_state_update(job_in):
    job = job_in(S.QUEUED)
    with pytest.raises(TypeError):  # the event's data cannot be stored as JSON: the event insert fails
        transition(job, S.ADMITTED, data={"unserialisable": object()})
    row = Job.objects.get(pk=job.pk)
    assert row.state == S.QUEUED and row.admitted_at is None
    assert not JobEvent.objects.filter(job_id=job.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_committed_transition_is_durable_with_its_event(job_in):
    job = job_in(S.QUEUED)
    transition(job, S.CANCELLED, reason="user")
    connection.close()  # read back on a fresh connection: both the row and the event were committed
    assert Job.objects.get(pk=job.pk).state == S.CANCELLED
    assert list(JobEvent.objects.filter(job_id=job.pk).values_list("from_state", "to_state")) == [("QUEUED", "CANCELLED")]
