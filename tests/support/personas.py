"""The personas every test acts as, after healthchecks' ``hc/test.py``.

Two teams: ``alpha`` (the personas' team) and ``beta``. The owner is alpha's admin, the teammate an alpha
member, the viewer an alpha viewer, the outsider beta's admin (a member of another team only), and staff
administer the platform. Each persona has an API client authenticated by a real token; ``signed_in`` gives a
browser-less web client with the persona's session.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from quotas.models import ApiToken, Membership, Team


class Persona:
    """A user (``user``) with its API key (``key``) and an ``APIClient`` sending ``Authorization: Token <key>``."""

    def __init__(self, user, key):
        self.user = user
        self.key = key
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Token {key}")


def make_persona(username: str, team=None, role: str = "member", *, staff: bool = False) -> Persona:
    """A user named ``username`` (password ``pw-<username>``) with a fresh API token.

    ``team`` and ``role`` (``admin``, ``member`` or ``viewer``) add a membership; ``staff`` makes a platform
    administrator.
    """
    user = get_user_model().objects.create_user(username=username, password="pw-" + username, is_staff=staff)
    if team is not None:
        Membership.objects.create(team=team, user=user, role=role)
    _, key = ApiToken.issue(user, "tests")
    return Persona(user, key)


def signed_in(persona: Persona) -> Client:
    """A Django test client with ``persona``'s session (the web UI authenticates by session, not token)."""
    client = Client()
    client.force_login(persona.user)
    return client


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
def owner(teams):
    """Alpha's admin."""
    return make_persona("owner", teams[0], "admin")


@pytest.fixture
def user(owner):
    """Alpha's admin as a plain user, for code that takes a user rather than a client (submitter, actor)."""
    return owner.user


@pytest.fixture
def teammate(teams):
    """A member of alpha: reads the team's objects, submits jobs, edits no quota or budget."""
    return make_persona("teammate", teams[0], "member")


@pytest.fixture
def viewer(teams):
    """A viewer of alpha: reads the team's objects and writes nothing."""
    return make_persona("viewer", teams[0], "viewer")


@pytest.fixture
def outsider(teams):
    """Beta's admin: a member of another team only."""
    return make_persona("outsider", teams[1], "admin")


@pytest.fixture
def staff(teams):
    """Platform staff: member of no team, administers every team and the platform-wide objects."""
    return make_persona("staff", staff=True)
