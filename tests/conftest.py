"""Shared fixtures: the catalog, a local cluster, and the three personas (owner, teammate, outsider).

``make test`` runs the suite on PostgreSQL and Redis (DATABASE_URL and
CELERY_BROKER_URL set by the Makefile); the personas follow healthchecks'
``hc/test.py``: an owner (team admin), a teammate (member) and an outsider
(member of another team only).
"""

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from core.lookups import clear_all
from costs.models import Price
from costs.seed import CATALOG_EFFECTIVE_FROM, seed_accelerators, seed_prices
from quotas.models import ApiToken, Budget, Membership, Quota, Team
from runners.models import Accelerator, Cluster, NodePool


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Personas have passwords; the production hasher's PBKDF2 rounds would only slow the suite."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_lookup_caches():
    """A test's rolled-back rows send no signal: start and end every test with empty per-process lookup caches
    (the scheduler's cache of waiting rows among them), and with no scheduling-pass pause left by another test's
    pass (``jobs.scheduling.pacing.record_pass``)."""
    from jobs.scheduling import pacing

    clear_all()
    client = pacing.schedule_flag_client()
    if client is not None:
        client.delete(pacing.SCHEDULE_LAST_PASS_KEY)
    yield
    clear_all()


@pytest.fixture
def catalog(db):
    """Accelerators and the public price catalog."""
    seed_accelerators()
    seed_prices()
    return {a.name: a for a in Accelerator.objects.all()}


@pytest.fixture
def h100(catalog):
    return catalog["H100-80GB"]


def make_cluster(name, provider, region, accelerator, *, nodes=2, gpus_per_node=8, capacity_type="on-demand",
                 backend="kubernetes", price=None):
    """A cluster with one node pool; ``price`` (USD/GPU-h) adds a cluster override in force since the catalog epoch."""
    cluster = Cluster.objects.create(name=name, provider=provider, region=region, backend=backend)
    pool = NodePool.objects.create(cluster=cluster, name=f"{accelerator.name.lower()}-{capacity_type}",
                                   accelerator=accelerator, capacity_type=capacity_type, nodes=nodes,
                                   gpus_per_node=gpus_per_node)
    if price is not None:
        Price.objects.create(provider=provider, region=region, accelerator=accelerator, capacity_type=capacity_type,
                             cluster=cluster, usd_per_gpu_hour=Decimal(price), effective_from=CATALOG_EFFECTIVE_FROM)
    return cluster, pool


@pytest.fixture
def cluster_factory(catalog):
    return make_cluster


class Persona:
    """A user with an API client authenticated by a real token."""

    def __init__(self, user, key):
        self.user = user
        self.key = key
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Token {key}")


def make_persona(username, team=None, role="member"):
    user = get_user_model().objects.create_user(username=username, password="pw-" + username)
    if team is not None:
        Membership.objects.create(team=team, user=user, role=role)
    _, key = ApiToken.issue(user, "tests")
    return Persona(user, key)


@pytest.fixture
def teams(db):
    """Two teams: ``alpha`` (the personas' team) and ``beta`` (the outsider's)."""
    return Team.objects.create(slug="alpha", name="Alpha"), Team.objects.create(slug="beta", name="Beta")


@pytest.fixture
def alpha(teams):
    return teams[0]


@pytest.fixture
def beta(teams):
    return teams[1]


@pytest.fixture
def user(alpha):
    """The alpha team's admin, as a plain user (no API client)."""
    return make_persona("owner", alpha, "admin").user


@pytest.fixture
def owner(teams):
    return make_persona("owner", teams[0], "admin")


@pytest.fixture
def teammate(teams):
    return make_persona("teammate", teams[0], "member")


@pytest.fixture
def outsider(teams):
    return make_persona("outsider", teams[1], "admin")


@pytest.fixture
def quota_factory(db):
    def make(team, accelerator, nominal, borrowing=0, max_per_job=0):
        return Quota.objects.create(team=team, accelerator=accelerator, nominal_gpus=nominal,
                                    borrowing_limit_gpus=borrowing, max_gpus_per_job=max_per_job)
    return make


@pytest.fixture
def budget_factory(db):
    def make(team, amount, action="block", period="monthly"):
        return Budget.objects.create(team=team, amount_usd=Decimal(amount), action=action, period=period)
    return make


TEST_BROKER_URL = "redis://127.0.0.1:6379/15"  # as in the Makefile's `make test`


@pytest.fixture
def submit(h100, user):
    """Create a QUEUED job the way the API stores one (columns plus the validated spec), for scheduler tests.

    ``submit(team, gpus_per_node, nodes=1, *, priority, preemptible, max_runtime, placement, max_retries,
    accelerator)``; jobs are named ``job-1``, ``job-2``... in creation order.
    """
    from jobs.models import Job

    counter = iter(range(1, 10_000))

    def make(team, gpus_per_node, nodes=1, *, priority=500, preemptible=False, max_runtime=3600, placement=None,
             max_retries=0, accelerator=None):
        accelerator = accelerator or h100
        spec = {
            "image": "python:3.11", "command": ["python", "train.py"],
            "resources": {"accelerator": accelerator.name, "gpus_per_node": gpus_per_node, "nodes": nodes},
            "priority": priority, "max_runtime_seconds": max_runtime, "preemptible": preemptible,
            "placement": placement or {}, "max_retries": max_retries,
        }
        return Job.objects.create(
            team=team, submitter=user, name=f"job-{next(counter)}", kind="training", spec=spec,
            accelerator=accelerator, gpus_per_node=gpus_per_node, nodes=nodes, priority=priority,
            preemptible=preemptible, max_runtime_seconds=max_runtime, max_retries=max_retries,
        )
    return make


def fresh(job):
    """``job`` read again from the database."""
    from jobs.models import Job

    return Job.objects.get(pk=job.pk)


def run(job):
    """Take an ADMITTED job to RUNNING through the lifecycle (objects created, then all pods running);
    returns the job (read again) and its attempt."""
    from jobs.lifecycle import mark_started
    from jobs.states import transition

    job = fresh(job)
    attempt = job.current_attempt
    mark_started(job, attempt, {"test": True})
    transition(job, "RUNNING", reason="all nodes running", attempt=attempt)
    return fresh(job), attempt


@pytest.fixture
def redis_broker():
    """Send the on-commit tasks (schedule, dispatch) to Redis db 15, never to the filesystem queue under var/.

    Under ``make test`` CELERY_BROKER_URL already is that; otherwise the app is
    pointed there before it opens its first connection. Purged afterwards.
    """
    from controlplane.celery import app

    url, options = app.conf.broker_url, app.conf.broker_transport_options
    if not str(url).startswith("redis://"):
        app.conf.broker_url, app.conf.broker_transport_options = TEST_BROKER_URL, {}
    with app.pool.acquire(block=True) as conn:
        assert conn.transport.driver_type == "redis", (
            "the Celery app already holds connections to a non-Redis broker; run with CELERY_BROKER_URL=" + TEST_BROKER_URL)
    from jobs.scheduling import pacing

    def forget_passes():  # no pacing pause left over from another test's pass, no flag either
        client = pacing.schedule_flag_client()
        client.delete(pacing.SCHEDULE_LAST_PASS_KEY, pacing.SCHEDULE_PENDING_KEY)

    forget_passes()
    yield app.conf.broker_url
    pacing.SCHEDULE_NOTIFIER.flush()  # publishes of this test's submissions land before the purge, not in the next test
    forget_passes()
    app.control.purge()
    app.conf.broker_url, app.conf.broker_transport_options = url, options
