"""Fixtures of the web UI tests: browser-less clients signed in as the personas, and team alpha's and beta's objects."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.api.conftest import alpha_objects, beta_objects, fleet, staff, viewer  # noqa: F401 (fixtures)


def signed_in(persona) -> Client:
    """A Django test client with ``persona``'s session (the UI authenticates by session, not token)."""
    client = Client()
    client.force_login(persona.user)
    return client


@pytest.fixture
def owner_web(owner):
    return signed_in(owner)


@pytest.fixture
def teammate_web(teammate):
    return signed_in(teammate)


@pytest.fixture
def outsider_web(outsider):
    return signed_in(outsider)
