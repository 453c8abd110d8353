"""Every operation of ``/api/schema/`` answers as the schema says, for generated requests (schemathesis): no 5xx,
every status code declared, every body valid against its declared schema, the declared content types.

A bounded number of examples per operation (``EXAMPLES``), as staff (who may call every operation) with a
real API token, against the WSGI application in this process (the test's database).
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings

from controlplane.wsgi import application
from jobs.models import JobEvent
from tests.support.factories import make_attempt, make_cluster

EXAMPLES = 5
CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
          schemathesis.checks.content_type_conformance, schemathesis.checks.response_schema_conformance]

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


@pytest.fixture
def world(staff, alpha_objects, h100, settings, tmp_path):
    """Staff's token, and objects for the generated requests to find: a cluster, alpha's quota and budget, and
    alpha's job running (an attempt with no end reason yet, an event without an actor).

    The requests reach the WSGI application directly, so Django's per-request connection cleanup is held off
    for the test (as Django's test client does): it would close the test's transaction.
    """
    settings.LOG_FOLLOW_MAX_SECONDS, settings.LOG_FOLLOW_POLL_SECONDS = 1.0, 0.2
    settings.LOCAL_RUNNER_DIR = tmp_path
    # The fuzzer sends hundreds of submissions per operation in one test: the submission rates are not its subject
    # (tests/jobs/api/test_submission_rate_limits.py checks them at their defaults).
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "submit_user": None, "submit_team": None}}
    job = alpha_objects["job"]
    make_attempt(job, *make_cluster("here", "local", "local", h100, backend="local"))
    JobEvent.objects.create(job=job, kind="state", from_state="STARTING", to_state="RUNNING", reason="all nodes running")
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield {"headers": {"Authorization": f"Token {staff.key}"}, "job": job}
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_every_answer_matches_the_schema(case, world):
    case.call_and_validate(headers=world["headers"], checks=CHECKS)


@pytest.mark.parametrize("path, query", [
    ("/api/v1/jobs/{id}/", {}),  # a running attempt: end_reason ""
    ("/api/v1/jobs/{id}/attempts/", {}),
    ("/api/v1/jobs/{id}/events/", {}),  # an event without an actor or attempt
    ("/api/v1/jobs/{id}/logs/", {"follow": "true"}),  # text/plain
])
def test_the_answers_the_schema_used_to_miss_match_it(world, path, query):
    case = schema[path]["GET"].Case(path_parameters={"id": world["job"].pk}, query=query)
    response = case.call_and_validate(headers=world["headers"], checks=CHECKS)
    assert response.status_code == 200
