"""The per-process lookup caches (``core.lookups``) never serve a stale row: a revoked token, a removed or
demoted member, a renamed team or accelerator, a new, shrunk or deleted node pool, a new or deleted priority
class takes effect at once in the process that made the change, however it was made (a save, a delete, a bulk
update, a transaction still open while another request loads the row); and the cache never serves a token past
its expiry.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from core.lookups import LookupCache
from jobs.models import Job
from quotas.authentication import TOKENS
from quotas.models import ApiToken, Membership, PriorityClass
from runners.base import PoolCapacity
from runners.kubernetes.sync import apply_pools
from runners.models import NodePool

JOBS = "/api/v1/jobs/"

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("alpha_h100_quota")]


# --- the cache itself ----------------------------------------------------------------------------------------------

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


# --- rows changed through the ORM are seen at once -----------------------------------------------------------------

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


def test_a_member_turned_viewer_can_no_longer_submit(cached, teammate, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    m = Membership.objects.get(user=teammate.user)
    m.role = Membership.Role.VIEWER
    m.save()
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "team" in r.json()


def test_a_renamed_team_slug_is_refused_under_the_old_name(cached, teammate, alpha, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    alpha.slug = "alpha-renamed"
    alpha.save()
    assert teammate.client.post(JOBS, submission, format="json").status_code == 400
    sub = copy.deepcopy(submission)
    sub["team"] = "alpha-renamed"
    assert teammate.client.post(JOBS, sub, format="json").status_code == 201


def test_a_renamed_accelerator_is_refused_under_the_old_name(cached, teammate, aws_cluster, submission, h100):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    h100.name = "H100-renamed"
    h100.save()
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.resources.accelerator" in r.json()


def test_a_new_node_pool_is_seen_by_the_next_submission(cached, teammate, aws_cluster, submission):
    submission["spec"]["resources"]["gpus_per_node"] = 16
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.resources.gpus_per_node" in r.json()
    NodePool.objects.create(cluster=aws_cluster["cluster"], name="big", accelerator=aws_cluster["pool"].accelerator,
                            nodes=2, gpus_per_node=16)  # room for the submission's 2 nodes
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201


def test_a_deleted_node_pool_is_seen_at_once(cached, teammate, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    aws_cluster["pool"].delete()
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.resources.accelerator" in r.json()


def test_a_deleted_cluster_takes_its_pools_out_of_validation_at_once(cached, teammate, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    Job.objects.all().delete()
    aws_cluster["cluster"].delete()  # cascades to the node pool
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.resources.accelerator" in r.json(), r.content


def test_a_new_priority_class_is_accepted_at_once(cached, teammate, aws_cluster, submission):
    submission["spec"]["priority"] = "urgent"
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.priority" in r.json()
    PriorityClass.objects.create(name="urgent", value=5000)
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    assert Job.objects.get(pk=r.json()["id"]).priority == 5000


def test_a_deleted_priority_class_is_refused_at_once(cached, teammate, aws_cluster, submission):
    PriorityClass.objects.get_or_create(name="urgent", defaults={"value": 900})
    PriorityClass.objects.get_or_create(name="high", defaults={"value": 700})
    sub = copy.deepcopy(submission)
    sub["spec"]["priority"] = "urgent"
    assert teammate.client.post(JOBS, sub, format="json").status_code == 201
    PriorityClass.objects.filter(name="urgent").delete()
    r = teammate.client.post(JOBS, sub, format="json")
    assert r.status_code == 400 and "spec.priority" in r.json()


# --- rows changed by bulk updates (no signal) are seen at once -----------------------------------------------------

def test_a_node_pool_shrunk_by_sync_is_seen_by_the_next_submission(cached, teammate, aws_cluster, submission):
    """apply_pools shrinks gpus_per_node with QuerySet.update(): no post_save, so ACCELERATORS keeps the old max."""
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    apply_pools(aws_cluster["cluster"], [PoolCapacity(name=aws_cluster["pool"].name, accelerator="H100-80GB",
                                                capacity_type="on-demand", nodes=2, gpus_per_node=4)])
    r = teammate.client.post(JOBS, submission, format="json")  # still asks 8 GPUs per node
    assert r.status_code == 400, r.content
    assert "spec.resources.gpus_per_node" in r.json()


def test_a_node_pool_shrunk_by_sync_is_refused_without_the_cache_too(settings, teammate, aws_cluster, submission):
    """Control: with caching off the same shrink is refused, so the stale answer above comes from the cache."""
    settings.LOOKUP_CACHE_SECONDS = 0
    apply_pools(aws_cluster["cluster"], [PoolCapacity(name=aws_cluster["pool"].name, accelerator="H100-80GB",
                                                capacity_type="on-demand", nodes=2, gpus_per_node=4)])
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400, r.content


# --- invalidations racing a load or a transaction are not lost -----------------------------------------------------

def test_an_invalidation_during_an_in_flight_token_load_is_not_lost(cached, teammate, aws_cluster):
    """Request A misses TOKENS and reads the token row; meanwhile the token is deleted (post_delete empties TOKENS);
    then A stores what it read. LookupCache.get loads outside its lock and only checks that the TTLCache object is
    the same, not that no clear() happened, so the deleted token goes back in and authenticates for the whole TTL.
    The interleaving is what two gthread workers produce; here it is driven in one thread for determinism."""
    digest = ApiToken.hash_key(teammate.key)

    def load_while_revoked():
        row = ApiToken.objects.select_related("user").filter(digest=digest).first()  # A's read
        ApiToken.objects.get(digest=digest).delete()  # B revokes; the signal clears TOKENS
        return row

    TOKENS.get(digest, load_while_revoked)
    assert not ApiToken.objects.filter(digest=digest).exists()
    assert teammate.client.get(JOBS).status_code == 401


@pytest.mark.django_db(transaction=True)
def test_a_membership_removed_in_a_transaction_is_not_recached_from_the_old_row(
        cached, teammate, aws_cluster, submission):
    """post_delete empties MEMBERSHIPS when the DELETE runs, not when it commits. A request of another thread of
    the same process that runs between the two reads the still-committed membership and caches it; after the
    commit the removed member keeps submitting for the whole TTL. Real code only, two threads, one process."""
    codes = []

    def other_request():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {teammate.key}")
        try:
            codes.append(client.post(JOBS, {**submission, "name": "during"}, format="json").status_code)
        finally:
            connection.close()

    with transaction.atomic():
        Membership.objects.get(user=teammate.user).delete()
        t = threading.Thread(target=other_request)
        t.start()
        t.join(30)
    assert codes == [201]  # before the commit the membership still stands: fine
    r = teammate.client.post(JOBS, {**submission, "name": "after"}, format="json")
    assert r.status_code == 400, "the removed member still submits after the commit (stale MEMBERSHIPS entry)"


@pytest.mark.django_db(transaction=True)
def test_a_token_revoked_in_a_transaction_is_not_recached_from_the_old_row(cached, teammate, aws_cluster):
    codes = []

    def other_request():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {teammate.key}")
        try:
            codes.append(client.get(JOBS).status_code)
        finally:
            connection.close()

    # Touched just now: the request below does not write last_used_at (which would wait on the deleted row's lock).
    ApiToken.objects.filter(user=teammate.user).update(last_used_at=timezone.now())
    with transaction.atomic():
        ApiToken.objects.filter(user=teammate.user).delete()
        t = threading.Thread(target=other_request)
        t.start()
        t.join(30)
    assert codes == [200]
    assert teammate.client.get(JOBS).status_code == 401, "the revoked token still authenticates after the commit"
