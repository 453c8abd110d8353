"""Session 2 attacks: lookup caches, shared serializer fields, the one-statement insert, per-cluster quotas,
the scheduler's waiting-row cache, and cpctl's command line.

Each test states the property it defends; a failing one is a bug in product code (see the report).
"""

from __future__ import annotations

import copy
import threading

import pytest
from django.utils import timezone

from cpctl.cli import main as cpctl
from jobs.lifecycle import recover_or_fail
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.scheduler import schedule_pending
from quotas.authentication import TOKENS
from quotas.models import ApiToken, Membership, PriorityClass, Quota
from runners.base import PoolCapacity
from runners.kubernetes.sync import apply_pools
from tests.support.factories import make_attempt
from tests.support.factories import fresh, run

JOBS = "/api/v1/jobs/"
S = JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def cached(settings):
    settings.LOOKUP_CACHE_SECONDS = 30


# --- 1. lookup caches: same-process staleness -------------------------------------------------------------------

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


def test_a_pool_emptied_by_sync_does_not_make_a_never_runnable_job_acceptable(
        settings, teammate, owner, alpha, aws_cluster, submission, h100):
    """A pool gone from the cluster but kept with 0 nodes (attempts refer to it) offers no GPUs; with no other pool
    the submission must get 'no node pool offers ...' (caching off: this is not about the cache).
    ResourcesSerializer.validate_accelerator's Max("node_pools__gpus_per_node") counts pools with nodes=0."""
    settings.LOOKUP_CACHE_SECONDS = 0
    from tests.support.factories import make_job
    job = make_job(alpha, owner.user, h100, name="old")
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    counts = apply_pools(aws_cluster["cluster"], [])
    assert counts["emptied"] == 1
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400, r.content


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


def test_a_deleted_node_pool_is_seen_at_once(cached, teammate, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    aws_cluster["pool"].delete()
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.resources.accelerator" in r.json()


def test_a_deleted_priority_class_is_refused_at_once(cached, teammate, aws_cluster, submission):
    PriorityClass.objects.get_or_create(name="urgent", defaults={"value": 900})
    PriorityClass.objects.get_or_create(name="high", defaults={"value": 700})
    sub = copy.deepcopy(submission)
    sub["spec"]["priority"] = "urgent"
    assert teammate.client.post(JOBS, sub, format="json").status_code == 201
    PriorityClass.objects.filter(name="urgent").delete()
    r = teammate.client.post(JOBS, sub, format="json")
    assert r.status_code == 400 and "spec.priority" in r.json()


# --- 2. odd inputs: never a 500, never another request's data -----------------------------------------------------

ODD_VALUES = [None, True, 0, -1, 1.5, float("1e308"), "", "x" * 5000, [], [1, [2]], {}, {"a": {"b": [None]}}]
FIELD_PATHS = [("team",), ("name",), ("kind",), ("spec",), ("spec", "image"), ("spec", "command"), ("spec", "args"),
               ("spec", "env"), ("spec", "resources"), ("spec", "resources", "accelerator"),
               ("spec", "resources", "gpus_per_node"), ("spec", "resources", "nodes"), ("spec", "resources", "cpu"),
               ("spec", "priority"), ("spec", "max_runtime_seconds"), ("spec", "preemptible"),
               ("spec", "placement"), ("spec", "placement", "providers"), ("spec", "max_retries")]


@pytest.mark.parametrize("path", FIELD_PATHS, ids=".".join)
def test_odd_values_in_every_field_get_400_and_only_their_own_errors(cached, teammate, aws_cluster, submission, path):
    for value in ODD_VALUES:
        sub = copy.deepcopy(submission)
        node = sub
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        r = teammate.client.post(JOBS, sub, format="json")
        assert r.status_code in (400, 201), (path, value, r.status_code, r.content[:300])
        if r.status_code == 400:
            assert all(k.startswith(path[0]) or k == "non_field_errors" for k in r.json()), (path, value, r.json())
        # the next valid request is unaffected
        ok = teammate.client.post(JOBS, submission, format="json")
        assert ok.status_code == 201, (path, value, ok.content[:300])


@pytest.mark.parametrize("body", [
    "team: alpha\nname: y\nspec:\n  priority: [high]\n",
    "team: alpha\nname: y\nspec: {2024-01-01: 1}\n",
    "team: alpha\nname: y\nspec:\n  image: !!binary aGVsbG8=\n",
    "team: alpha\nname: y\nspec: &a [*a]\n",
    "- 1\n- 2\n",
    "just a string",
    "team: {? [1, 2] : 3}\n",
    "team: alpha\nname: .nan\nspec:\n  priority: .inf\n",
])
def test_odd_yaml_submissions_get_400(cached, teammate, aws_cluster, body):
    r = teammate.client.post(JOBS, body.encode(), content_type="application/yaml")
    assert r.status_code in (400, 415), (r.status_code, r.content[:300])


@pytest.mark.parametrize("priority", [["high"], {"high": 1}, 700, None, True, "high\x00"])
def test_a_priority_that_is_not_a_string_gets_400(cached, teammate, aws_cluster, submission, priority):
    submission["spec"]["priority"] = priority
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.priority" in r.json(), r.content


# --- 3. the one-statement insert ----------------------------------------------------------------------------------

@pytest.mark.parametrize("image,command,env", [
    ("reg.io/it's/\"quoted\":v1", ["sh", "-c", "echo '); DROP TABLE jobs_job; --"], {"Q": "'\"\\"}),
    ("reg.io/ünïcødé/图像:✓", ["python", "🚀.py"], {"U": "ß" * 1000}),
    ("r/" + "a" * 510, ["x" * 10000], {"K": "$1 $2 %s %(x)s"}),
])
def test_the_stored_job_and_its_event_match_the_response(cached, teammate, aws_cluster, submission, image, command, env):
    submission["name"] = "a" * 63
    submission["spec"].update(image=image, command=command, env=env)
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    job = Job.objects.get(pk=body["id"])
    assert job.name == body["name"] == "a" * 63
    assert job.spec["image"] == image and job.spec["command"] == command and job.spec["env"] == env
    assert body["spec"]["image"] == image and body["spec"]["env"] == env
    assert JobEvent.objects.filter(job=job, kind="submitted").count() == 1
    assert body["state"] == job.state == "QUEUED"


@pytest.mark.parametrize("field,value", [("name", "a" * 64), ("name", "a\x00b"), ("team", "al\x00pha"),
                                         ("image", "x\x00y"), ("image", "x" * 513)])
def test_nul_and_overlong_values_get_400_and_store_nothing(cached, teammate, aws_cluster, submission, field, value):
    if field == "image":
        submission["spec"]["image"] = value
    else:
        submission[field] = value
    before = (Job.objects.count(), JobEvent.objects.count())
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400, r.content
    assert (Job.objects.count(), JobEvent.objects.count()) == before


@pytest.mark.django_db(transaction=True)
def test_every_job_has_exactly_one_submitted_event_under_concurrency(cached, teammate, aws_cluster, submission):
    from django.db import connection
    from rest_framework.test import APIClient
    results = []

    def post(i):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {teammate.key}")
        sub = copy.deepcopy(submission)
        sub["name"] = f"c-{i}"
        try:
            results.append(client.post(JOBS, sub, format="json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(code == 201 for code in results) and len(results) == 8
    for job in Job.objects.filter(name__startswith="c-"):
        assert JobEvent.objects.filter(job=job, kind="submitted").count() == 1


# --- 4. per-cluster quotas ----------------------------------------------------------------------------------------

def held_on(team, cluster):
    return sum(JobAttempt.objects.filter(job__team=team, cluster=cluster, ended_at__isnull=True)
               .values_list("gpus", flat=True))


def test_a_lowered_cluster_cap_leaves_running_work_and_stops_recovery_over_it(
        cluster_factory, quota_factory, h100, alpha, submit):
    a_cluster, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=4, price="4.00")
    quota_factory(alpha, h100, nominal=64)
    cap = Quota.objects.create(team=alpha, accelerator=h100, cluster=a_cluster, nominal_gpus=16)
    j1, j2 = submit(alpha, 8, max_retries=2), submit(alpha, 8, max_retries=2)
    schedule_pending()
    (j1, at1), (j2, _) = run(j1), run(j2)
    assert held_on(alpha, a_cluster) == 16
    cap.nominal_gpus = 8
    cap.save()
    recover_or_fail(j1, at1, end_reason=JobAttempt.EndReason.PREEMPTED)
    j3 = submit(alpha, 8)
    schedule_pending()
    schedule_pending()
    assert fresh(j2).state == S.RUNNING  # left alone
    assert fresh(j1).state in (S.RECOVERING, S.FAILED) and fresh(j3).state == S.QUEUED
    assert held_on(alpha, a_cluster) == 8


def test_a_multi_node_job_counts_all_its_gpus_against_the_cluster_cap(
        cluster_factory, quota_factory, h100, alpha, submit):
    capped, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=4, price="4.00")
    quota_factory(alpha, h100, nominal=64)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=capped, nominal_gpus=8, borrowing_limit_gpus=4)
    job = submit(alpha, 8, nodes=2)
    schedule_pending()
    assert fresh(job).state == S.QUEUED and held_on(alpha, capped) == 0


def test_preemption_never_takes_a_team_over_its_cluster_cap(
        cluster_factory, quota_factory, h100, alpha, beta, submit):
    capped, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=2, price="4.00")  # 16 GPUs
    quota_factory(alpha, h100, nominal=16)
    quota_factory(beta, h100, nominal=0, borrowing=16)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=capped, nominal_gpus=8)
    low = [submit(beta, 8, priority=100, preemptible=True) for _ in range(2)]
    schedule_pending()
    for j in low:
        if fresh(j).state == S.ADMITTED:
            run(j)
    a1 = submit(alpha, 8, priority=1000)
    a2 = submit(alpha, 8, priority=1000)
    for _ in range(4):
        schedule_pending()
    assert held_on(alpha, capped) == 8  # one admitted by preempting beta, the other held back by the cap
    assert sorted([fresh(a1).state, fresh(a2).state]) == sorted([S.ADMITTED, S.QUEUED])


@pytest.mark.django_db(transaction=True)
def test_racing_passes_never_exceed_a_cluster_cap(cluster_factory, quota_factory, h100, alpha, submit):
    from django.db import connection
    capped, _ = cluster_factory("capped", "aws", "us-east-1", h100, nodes=8, price="4.00")
    quota_factory(alpha, h100, nominal=64)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=capped, nominal_gpus=8)
    for _ in range(6):
        submit(alpha, 4)
    errors = []

    def one():
        try:
            schedule_pending()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert held_on(alpha, capped) == 8


@pytest.mark.parametrize("patch", [{"nominal_gpus": -1}, {"nominal_gpus": "lots"}, {"nominal_gpus": 2**40},
                                   {"borrowing_limit_gpus": -5}, {"cluster": 999999}, {"cluster": "nope"},
                                   {"cluster": ["x"]}, {"nominal_gpus": None}, {"nominal_gpus": 1.5}])
def test_bad_per_cluster_quota_values_get_400(staff, alpha, h100, aws_cluster, patch):
    body = {"team": alpha.slug, "accelerator": h100.name, "cluster": aws_cluster["cluster"].name, "nominal_gpus": 8,
            "borrowing_limit_gpus": 0}
    body.update(patch)
    r = staff.client.post("/api/v1/quotas/", body, format="json")
    assert r.status_code == 400, (r.status_code, r.content[:300])


# --- 5. the waiting-row cache -------------------------------------------------------------------------------------

def test_a_priority_change_and_a_cancel_between_passes_are_seen(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("one", "aws", "us-east-1", h100, nodes=1, price="4.00")  # room for one 8-GPU job
    quota_factory(alpha, h100, nominal=64)
    blocker = submit(alpha, 8)
    schedule_pending()
    run(blocker)
    first, second, third = submit(alpha, 8), submit(alpha, 8), submit(alpha, 8)
    schedule_pending()  # all three cached as waiting
    Job.objects.filter(pk=third.pk).update(priority=900)
    Job.objects.filter(pk=first.pk).update(state=S.CANCELLED)
    JobAttempt.objects.filter(job=blocker).update(ended_at=timezone.now())
    Job.objects.filter(pk=blocker.pk).update(state=S.SUCCEEDED)
    result = schedule_pending()
    assert result.admitted == [third.pk]
    assert fresh(first).state == S.CANCELLED and fresh(second).state == S.QUEUED


# --- 6. cpctl -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--url", "http://127.0.0.1:1", "--timeout", "inf", "jobs"],
    ["--url", "http://127.0.0.1:1", "--timeout", "1e400", "jobs"],
    ["--url", "http://127.0.0.1:1", "--token", "ключ", "jobs"],
    ["--url", "http://[::1", "jobs"],
    ["--url", "http://127.0.0.1:1", "--timeout", "nan", "jobs"],
    ["--url", "http://127.0.0.1:1", "submit", "/nonexistent/file.yaml"],
    ["--url", "http://127.0.0.1:1", "submit", "/"],
    ["--url", "http://127.0.0.1:1", "costs", "--start", "not-a-date"],
    ["--url", "http://127.0.0.1:1", "logs", "1", "--node", "-1"],
    ["--url", "http://127.0.0.1:1", "job", "-1"],
    ["--url", "ftp://x", "jobs"],
    ["--url", "", "jobs"],
    ["--url", "http://127.0.0.1:99999", "jobs"],
], ids=["timeout-inf", "timeout-1e400", "non-latin1-token", "unclosed-ipv6-url", "timeout-nan", "missing-file",
        "directory", "bad-start", "negative-node", "negative-id", "ftp-url", "empty-url", "port-99999"])
def test_cpctl_answers_bad_arguments_with_a_clean_nonzero_exit(argv, capsys):
    assert cpctl(argv) != 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_duplicate_per_cluster_quota_gets_400_not_500(staff, alpha, h100, aws_cluster):
    body = {"team": alpha.slug, "accelerator": h100.name, "cluster": aws_cluster["cluster"].name, "nominal_gpus": 8}
    assert staff.client.post("/api/v1/quotas/", body, format="json").status_code == 201
    r = staff.client.post("/api/v1/quotas/", {**body, "nominal_gpus": 64}, format="json")
    assert r.status_code == 400, (r.status_code, r.content[:300])
    assert Quota.objects.filter(team=alpha, cluster=aws_cluster["cluster"]).count() == 1


def test_moving_a_per_cluster_quota_onto_an_existing_one_gets_400_not_500(staff, alpha, h100, aws_cluster, quota_factory,
                                                                           cluster_factory):
    other, _ = cluster_factory("other", "gcp", "us-central1", h100)
    quota_factory(alpha, h100, nominal=16)
    body = {"team": alpha.slug, "accelerator": h100.name, "nominal_gpus": 8}
    a = staff.client.post("/api/v1/quotas/", {**body, "cluster": aws_cluster["cluster"].name}, format="json").json()["id"]
    b = staff.client.post("/api/v1/quotas/", {**body, "cluster": other.name}, format="json").json()["id"]
    for patch, target in (({"cluster": None}, a), ({"cluster": other.name}, a), ({"cluster": aws_cluster["cluster"].name}, b)):
        r = staff.client.patch(f"/api/v1/quotas/{target}/", patch, format="json")
        assert r.status_code == 400, (patch, r.status_code, r.content[:300])


@pytest.mark.parametrize("body", [
    ("team: alpha\nname: x\nspec:\n  max_runtime_seconds: " + "1" * 5000 + "\n").encode(),  # int() digit limit
    b"team: alpha\nname: 2024-13-45\n",  # matches YAML's timestamp pattern, but month 13
    b"team: alpha\nname: 2024-02-30 10:00:00\n",  # February 30th
], ids=["int-over-4300-digits", "month-13", "february-30"])
def test_yaml_scalars_that_pyyaml_cannot_construct_get_400_not_500(teammate, aws_cluster, body):
    """PyYAML's SafeLoader raises a plain ValueError (not yaml.YAMLError) from int()/datetime() for these;
    controlplane.api.YAMLParser only catches RecursionError, UnicodeDecodeError and YAMLError."""
    teammate.client.raise_request_exception = False
    r = teammate.client.post(JOBS, body, content_type="application/yaml")
    assert r.status_code == 400, (r.status_code, r.content[:200])


@pytest.mark.parametrize("kind", ["training", "inference"])
def test_the_submit_response_is_what_a_get_of_the_stored_row_shows(cached, teammate, aws_cluster, submission, kind):
    submission["kind"] = kind
    submission["name"] = "z9-" + "é".encode().hex() + "-" + kind
    submission["spec"]["env"] = {"A": "it's \"q\" \\ ünï 🚀"}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    posted = r.json()
    got = teammate.client.get(f"{JOBS}{posted['id']}/").json()
    assert posted == got


def test_a_deleted_cluster_takes_its_pools_out_of_validation_at_once(cached, teammate, aws_cluster, submission):
    assert teammate.client.post(JOBS, submission, format="json").status_code == 201
    Job.objects.all().delete()
    aws_cluster["cluster"].delete()  # cascades to the node pool
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400 and "spec.resources.accelerator" in r.json(), r.content


@pytest.mark.django_db(transaction=True)
def test_a_membership_removed_in_a_transaction_is_not_recached_from_the_old_row(cached, teammate, aws_cluster, submission):
    """post_delete empties MEMBERSHIPS when the DELETE runs, not when it commits. A request of another thread of
    the same process that runs between the two reads the still-committed membership and caches it; after the
    commit the removed member keeps submitting for the whole TTL. Real code only, two threads, one process."""
    from django.db import connection, transaction
    from rest_framework.test import APIClient

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
    from django.db import connection, transaction
    from rest_framework.test import APIClient

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
