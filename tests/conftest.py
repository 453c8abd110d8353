"""The suite's root: shared support (``tests/support``) loaded as plugins, and the fixtures every test gets.

``make test`` runs the suite on PostgreSQL and Redis (DATABASE_URL and CELERY_BROKER_URL set by the Makefile).
The personas, builders and emulators live in ``tests/support``; see its package docstring.

Property tests (Hypothesis) search new random examples on every run, and a failure found is kept in the local
example database (``.hypothesis/``) and tried first next time. With ``CI`` set (the gate a change must pass) they
run the ``ci`` profile instead: ``derandomize``, the same examples on every run of the same test code (seeded from
the test), so a gate's verdict is the one a run here with ``CI=true`` gives, and the search for new failures stays
with the runs here; ``print_blob`` prints how to replay a failure.
"""

import os

import pytest
from django.core.cache import cache
from hypothesis import settings as hypothesis_settings

from core.lookups import clear_all
from jobs.scheduling import pacing

hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

pytest.register_assert_rewrite("tests.support")  # before pytest_plugins imports them: plain asserts explain failures

pytest_plugins = [
    "tests.support.personas",
    "tests.support.factories",
    "tests.support.broker",
    "tests.support.redis",
    "tests.support.prometheus",
    "tests.support.local_runner",
    "tests.support.clusters",
]


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Personas have passwords; the production hasher's PBKDF2 rounds would only slow the suite."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_lookup_caches():
    """A test's rolled-back rows send no signal: start and end every test with empty per-process lookup caches
    (the scheduler's cache of waiting rows among them), and with no scheduling-pass pause left by another test's
    pass (``jobs.scheduling.pacing.record_pass``)."""
    clear_all()
    client = pacing.schedule_flag_client()
    if client is not None:
        client.delete(pacing.SCHEDULE_LAST_PASS_KEY)
    yield
    clear_all()


@pytest.fixture(autouse=True)
def no_rate_limits_counted():
    """Every test starts with no rate limit counted (the cache is each process's memory in the tests): the
    sign-ins, token checks and submissions of one test never count against another's."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def cached(settings):
    """Per-process lookups (tokens, memberships, teams, accelerators, node pools, priority classes) cached for
    30 s, longer than any test: a stale entry would be served for the whole test."""
    settings.LOOKUP_CACHE_SECONDS = 30
