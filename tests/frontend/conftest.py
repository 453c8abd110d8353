"""Fixtures of the web UI tests: browser-less clients signed in as the personas (the UI authenticates by session),
and a headless Chromium page (Debian's ``chromium`` driven by Playwright) with its sign-in and screenshots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.support.personas import signed_in

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture
def page(monkeypatch):
    """A Chromium page (1280 x 900); Playwright's sync API keeps an event loop in this thread, so the test's own
    ORM calls are marked safe (they are plain synchronous calls between browser steps)."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        yield page
        browser.close()


def shoot(page, name: str) -> None:
    """A full-page screenshot of ``page`` as ``artifacts/screenshots/<name>.png``."""
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def settled(locator) -> None:
    """Wait until htmx has processed ``locator``'s swapped-in content: htmx marks new elements ``htmx-added``
    and binds their ``hx-*`` triggers only when it removes that class after its settle delay, so a change made
    before then fires no request."""
    expect(locator).not_to_have_class(re.compile(r"\bhtmx-added\b"))
    expect(locator.locator(".htmx-added")).to_have_count(0)


def sign_in(page, base: str, username: str) -> None:
    """Sign in through the login form as ``username`` (the personas' password is ``pw-<username>``)."""
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


@pytest.fixture
def owner_web(owner):
    return signed_in(owner)


@pytest.fixture
def teammate_web(teammate):
    return signed_in(teammate)


@pytest.fixture
def outsider_web(outsider):
    return signed_in(outsider)
