"""The job state machine of docs/design.md, Job states, written here by hand (not read from ``jobs.states``), and
checks that a job's events follow it."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

from jobs.models import JobEvent, JobState

# docs/design.md, "Job states", edge by edge.
EXPECTED_EDGES = {
    ("QUEUED", "ADMITTED"),
    ("QUEUED", "REJECTED"),
    ("QUEUED", "CANCELLED"),  # cancel before admission: nothing to delete
    ("ADMITTED", "STARTING"),
    ("ADMITTED", "FAILED"),  # dispatch error
    ("ADMITTED", "CANCELLING"),
    ("ADMITTED", "RECOVERING"),
    ("STARTING", "RUNNING"),
    ("STARTING", "FAILED"),
    ("STARTING", "CANCELLING"),
    ("STARTING", "RECOVERING"),
    ("RUNNING", "SUCCEEDED"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "CANCELLING"),
    ("RUNNING", "RECOVERING"),
    ("RECOVERING", "ADMITTED"),  # a new attempt
    ("RECOVERING", "FAILED"),  # retries used up
    ("RECOVERING", "CANCELLED"),  # cancelled while no attempt lives
    ("RECOVERING", "CANCELLING"),
    ("CANCELLING", "CANCELLED"),
}
ALL_STATES = ["QUEUED", "ADMITTED", "STARTING", "RUNNING", "RECOVERING", "CANCELLING",
              "SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"]
FINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}


def assert_event_chains_valid(jobs) -> dict[int, list]:
    """Each job's events form one chain: every event starts where the previous ended, every state event is an
    edge of EXPECTED_EDGES, and the last one ends in the job's current state. Returns the chains by job id."""
    events = defaultdict(list)
    for event in JobEvent.objects.order_by("id"):
        events[event.job_id].append(event)
    for job in jobs:
        chain = events[job.pk]
        for before, after in pairwise(chain):
            assert after.from_state == before.to_state, (job, [(e.kind, e.from_state, e.to_state) for e in chain])
            if after.kind == "state":
                assert (after.from_state, after.to_state) in EXPECTED_EDGES
        assert chain[-1].to_state == job.state
    return events


def assert_state_chain(job, start=JobState.QUEUED) -> None:
    """``job``'s state events, in order, walk edges of EXPECTED_EDGES from ``start`` to its current state
    (``job`` is read again)."""
    events = list(JobEvent.objects.filter(job=job, kind="state").order_by("created_at", "id"))
    state = start
    for event in events:
        assert event.from_state == state, [(e.from_state, e.to_state) for e in events]
        assert (event.from_state, event.to_state) in EXPECTED_EDGES
        state = event.to_state
    job.refresh_from_db()
    assert job.state == state


def state_events(job) -> list[tuple[str, str]]:
    """``(from_state, to_state)`` of ``job``'s state events, oldest first (the model's ordering)."""
    return list(JobEvent.objects.filter(job=job, kind="state").values_list("from_state", "to_state"))
