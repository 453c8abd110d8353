"""The submission hot path: per-process lookup caches, one-statement insert, serializer fields shared by threads.

Correctness of each shortcut: a revoked token, a removed membership or a new
node pool takes effect at once in the process that made the change; the
cache never serves a token past its expiry; a submission's job and first
event are stored together; concurrent validations never see each other's
data or errors.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.lookups import LookupCache
from jobs.models import Job, JobEvent
from jobs.spec import JobSubmissionSerializer
from quotas.authentication import TOKENS
from quotas.models import ApiToken, Membership, PriorityClass
from runners.models import NodePool

JOBS = "/api/v1/jobs/"


@pytest.fixture
def cached(settings):
    """The production default: lookups cached for a few seconds."""
    settings.LOOKUP_CACHE_SECONDS = 30


def test_a_warm_submission_is_one_statement(cached, teammate, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201  # warms the caches
    with CaptureQueriesContext(connection) as queries:
        r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    assert len(queries.captured_queries) == 1, [q["sql"][:80] for q in queries.captured_queries]
    job = Job.objects.get(pk=r.json()["id"])
    event = JobEvent.objects.get(job=job)
    assert (event.kind, event.from_state, event.to_state, event.actor) == ("submitted", "QUEUED", "QUEUED", teammate.user)
    assert event.reason == "submitted by teammate"
    assert abs((event.created_at - job.created_at).total_seconds()) < 1
    assert r.json()["created_at"] is not None and r.json()["id"] == job.pk


def test_a_deleted_token_is_refused_at_once(cached, teammate, aws_cluster):
    assert teammate.client.get(JOBS).status_code == 200  # cached now
    ApiToken.objects.filter(user=teammate.user).get().delete()
    assert teammate.client.get(JOBS).status_code == 401


def test_a_deactivated_user_is_refused_at_once(cached, teammate, aws_cluster):
    assert teammate.client.get(JOBS).status_code == 200
    teammate.user.is_active = False
    teammate.user.save()
    assert teammate.client.get(JOBS).status_code == 401


def test_a_cached_token_still_expires_on_time(cached, teammate, aws_cluster):
    token = ApiToken.objects.get(user=teammate.user)
    token.expires_at = timezone.now() + dt.timedelta(hours=1)
    token.save()
    assert teammate.client.get(JOBS).status_code == 200  # cached, with its expiry
    cached_token = TOKENS.get(ApiToken.hash_key(teammate.key), lambda: None)
    assert cached_token is not None and cached_token.pk == token.pk
    cached_token.expires_at = timezone.now() - dt.timedelta(seconds=1)  # the hour has passed
    assert teammate.client.get(JOBS).status_code == 401


def test_a_removed_member_can_no_longer_submit(cached, teammate, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    Membership.objects.get(user=teammate.user).delete()
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert "team" in r.json()
    assert Job.objects.count() == 1


def test_a_new_node_pool_is_seen_by_the_next_submission(cached, teammate, aws_cluster, submission):
    submission["spec"]["resources"]["gpus_per_node"] = 16
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.resources.gpus_per_node" in r.json()
    NodePool.objects.create(cluster=aws_cluster["cluster"], name="big", accelerator=aws_cluster["pool"].accelerator,
                            nodes=1, gpus_per_node=16)
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201


def test_a_new_priority_class_is_accepted_at_once(cached, teammate, aws_cluster, submission):
    submission["spec"]["priority"] = "urgent"
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.priority" in r.json()
    PriorityClass.objects.create(name="urgent", value=5000)
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    assert Job.objects.get(pk=r.json()["id"]).priority == 5000


def test_a_zero_ttl_reads_every_time(settings):
    settings.LOOKUP_CACHE_SECONDS = 0
    loads = []
    cache = LookupCache("test-zero")
    for _ in range(3):
        cache.get("k", lambda: loads.append(1) or "v")
    assert len(loads) == 3


def test_the_cache_expires_entries_after_its_ttl(settings):
    settings.LOOKUP_CACHE_SECONDS = 30
    now = [1000.0]
    cache = LookupCache("test-ttl", timer=lambda: now[0])
    loads = []
    assert cache.get("k", lambda: loads.append(1) or "v1") == "v1"
    now[0] += 29
    assert cache.get("k", lambda: loads.append(1) or "v2") == "v1"
    now[0] += 2
    assert cache.get("k", lambda: loads.append(1) or "v3") == "v3"
    assert len(loads) == 2


def test_none_is_not_cached(settings):
    settings.LOOKUP_CACHE_SECONDS = 30
    cache = LookupCache("test-none")
    answers = iter([None, "found"])
    assert cache.get("k", lambda: next(answers)) is None
    assert cache.get("k", lambda: next(answers)) == "found"


@pytest.mark.django_db(transaction=True)
def test_concurrent_validations_never_mix_their_data_or_errors(cached, teammate, aws_cluster, submission):
    """Serializer fields are shared between instances: 8 threads validating different specs at once each
    get their own validated values and their own errors."""
    class Request:
        user = teammate.user

    failures: list[str] = []

    def worker(index: int) -> None:
        try:
            for round_ in range(40):
                data = copy.deepcopy(submission)
                data["name"] = f"job-{index}-{round_}"
                bad = (index + round_) % 2 == 0
                if bad:
                    data["spec"]["resources"]["nodes"] = 0
                    data["spec"]["env"] = {f"BAD-{index}": "x"}
                else:
                    data["spec"]["env"] = {f"VAR_{index}": str(round_)}
                serializer = JobSubmissionSerializer(data=data, context={"request": Request})
                valid = serializer.is_valid()
                if bad:
                    errors = serializer.errors
                    if valid or set(errors) != {"spec.resources.nodes", "spec.env"} \
                            or f"BAD-{index}" not in errors["spec.env"][0]:
                        failures.append(f"{index}/{round_}: {valid} {dict(errors)}")
                else:
                    spec = serializer.submission()["spec"] if valid else None
                    if not valid or serializer.validated_data["name"] != data["name"] \
                            or spec["env"] != {f"VAR_{index}": str(round_)}:
                        failures.append(f"{index}/{round_}: {valid} {serializer.errors if not valid else spec}")
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
