"""Fixtures of the web UI tests: browser-less clients signed in as the personas (the UI authenticates by session)."""

from __future__ import annotations

import pytest

from tests.support.personas import signed_in


@pytest.fixture
def owner_web(owner):
    return signed_in(owner)


@pytest.fixture
def teammate_web(teammate):
    return signed_in(teammate)


@pytest.fixture
def outsider_web(outsider):
    return signed_in(outsider)
