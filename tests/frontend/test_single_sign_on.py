"""Single sign-on of the web UI against a real OpenID Connect provider (ADR 0032).

The provider (django-oauth-toolkit, ``tests.support.oidc_provider``) runs as its own process on 127.0.0.1, one per
module; the control plane is the live server, configured at it through its settings. In Chromium: a user signs in
with the provider's form, lands on the page asked for, and has the memberships its groups claim maps to; a later
sign-in with other groups changes them. Without a browser (``requests``, as an attacker would): a callback with a
state this browser was not given is refused, and so are ID tokens that are tampered with, expired, for another
client, from another issuer, signed by another key or not signed.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
import secrets
import time
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from playwright.sync_api import expect

from frontend.sso import SSO_FAILED
from quotas.groupmap import parse_group_map
from quotas.models import AuditRecord, Membership, OidcIdentity, Team
from quotas.oidc import OidcBackend
from tests.support.oidc import start_provider

from .conftest import shoot

PROVIDER_NAME = "Test provider"
GROUP_MAP = parse_group_map(
    '{"ml-alpha": "alpha:member", "ml-alpha-leads": "alpha:admin",'
    ' "ml-beta-readers": "beta:viewer", "ml-gamma": "gamma:member",'
    ' "ml-platform": "platform-admin"}'
)


@pytest.fixture(scope="module")
def provider(live_server, tmp_path_factory):
    """The test provider, its one client allowed to return to the live server's callback."""
    started = start_provider(tmp_path_factory.mktemp("oidc-provider"), f"{live_server.url}/oidc/callback/")
    yield started
    started.stop()


@pytest.fixture
def sso(provider, settings):
    """The control plane pointed at the provider (single sign-on on), with ``GROUP_MAP``."""
    for name, value in provider.control_plane_settings(PROVIDER_NAME, GROUP_MAP).items():
        setattr(settings, name, value)
    return provider


def roles_of(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_a_user_signs_in_through_the_provider_and_gets_the_teams_its_groups_map_to(live_server, sso, page, teams):
    base = live_server.url
    local = get_user_model().objects.create_user("alice", email="alice@example.com", password="pw-alice")
    sso.set_user(
        "alice", "provider-pw", ["ml-alpha", "ml-beta-readers", "ml-gamma", "unmapped"], email="alice@example.com"
    )

    page.goto(f"{base}/teams/alpha/")
    expect(page).to_have_url(f"{base}/login/?next=/teams/alpha/")
    shoot(page, "sign-in-with-provider")
    page.get_by_role("button", name=f"Sign in with {PROVIDER_NAME}").click()
    expect(page.get_by_role("heading", name="Test provider")).to_be_visible()
    assert page.url.startswith(sso.issuer.removesuffix("/o"))
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("provider-pw")
    page.get_by_role("button", name="Continue").click()

    expect(page.get_by_role("heading", name="Team Alpha (alpha)")).to_be_visible()
    expect(page).to_have_url(f"{base}/teams/alpha/")
    identity = OidcIdentity.objects.select_related("user").get(issuer=sso.issuer)
    user = identity.user
    # Matched by sub, never by email: the local "alice" with the same address is another account.
    assert user.pk != local.pk and user.username == "alice-2" and user.email == "alice@example.com"
    assert identity.groups == ["ml-alpha", "ml-beta-readers", "ml-gamma", "unmapped"]
    assert roles_of(user) == {"alpha": "member", "beta": "viewer"} and not user.is_staff
    assert not Team.objects.filter(slug="gamma").exists()
    expect(page.locator("header form.logout span")).to_have_text("alice-2")
    expect(page.get_by_text("alice-2 — member")).to_be_visible()
    page.goto(f"{base}/teams/")
    expect(page.get_by_role("link", name="Alpha (alpha)")).to_be_visible()
    expect(page.get_by_role("link", name="Beta (beta)")).to_be_visible()
    shoot(page, "signed-in-with-provider")

    # The provider moves alice to the leads and the platform group: the next sign-in follows.
    page.get_by_role("button", name="Sign out").click()
    sso.set_user("alice", "provider-pw", ["ml-alpha-leads", "ml-platform"], email="alice@example.com")
    page.goto(f"{base}/login/?next=/teams/beta/")
    page.get_by_role("button", name=f"Sign in with {PROVIDER_NAME}").click()
    # Still signed in at the provider: straight back, no form.
    expect(page.get_by_role("heading", name="Team Beta (beta)")).to_be_visible()
    expect(page.locator("header form.logout span")).to_have_text("alice-2 (staff)")
    user.refresh_from_db()
    assert roles_of(user) == {"alpha": "admin"} and user.is_staff
    assert AuditRecord.objects.filter(object_type="membership", action="deleted", object_repr__contains="beta").exists()

    # Local accounts still sign in with their password beside the provider's button.
    page.get_by_role("button", name="Sign out").click()
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("pw-alice")
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.locator("header form.logout span")).to_have_text("alice")
    assert roles_of(local) == {}


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


class Browser:
    """A cookie jar with GET and POST that never follow redirects: a browser reduced to what the flow needs."""

    def __init__(self):
        self.jar = requests.cookies.RequestsCookieJar()

    def get(self, url: str) -> requests.Response:
        return self._kept(requests.get(url, cookies=self.jar, allow_redirects=False, timeout=10))

    def post(self, url: str, data: dict) -> requests.Response:
        return self._kept(requests.post(url, data=data, cookies=self.jar, allow_redirects=False, timeout=10))

    def _kept(self, answer: requests.Response) -> requests.Response:
        self.jar.update(answer.cookies)
        return answer


def through_provider(browser: Browser, url: str, username: str, password: str, stop_at: str) -> str:
    """Follow redirects from ``url`` as a browser, filling the provider's sign-in form once; the first location
    that starts with ``stop_at`` (not fetched)."""
    signed_in = False
    for _ in range(10):
        answer = browser.get(url)
        if answer.status_code in (301, 302, 303):
            url = urljoin(url, answer.headers["Location"])
            if url.startswith(stop_at):
                return url
            continue
        assert answer.status_code == 200 and not signed_in, (answer.status_code, answer.text[:300])
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', answer.text)[1]
        next_url = re.search(r'name="next" value="([^"]*)"', answer.text)[1].replace("&amp;", "&")
        posted = browser.post(
            url, {"csrfmiddlewaretoken": token, "username": username, "password": password, "next": next_url}
        )
        assert posted.status_code == 302, posted.text[:300]
        url, signed_in = urljoin(url, posted.headers["Location"]), True
    raise AssertionError(f"no redirect to {stop_at}")


def test_a_callback_with_a_state_this_browser_was_not_given_is_refused(live_server, sso, teams):
    sso.set_user("mallory", "provider-pw", ["ml-alpha"])
    browser = Browser()
    start = f"{live_server.url}/oidc/authenticate/?next=/teams/alpha/"
    callback = through_provider(browser, start, "mallory", "provider-pw", f"{live_server.url}/oidc/callback/")
    query = parse_qs(urlsplit(callback).query)
    forged = f"{live_server.url}/oidc/callback/?{urlencode({'code': query['code'][0], 'state': 'forged'})}"
    assert browser.get(forged).status_code == 400
    assert not OidcIdentity.objects.exists()
    # The real state completes the same sign-in (the refusal was the state's, not the code's).
    answer = browser.get(callback)
    assert (answer.status_code, answer.headers["Location"]) == (302, "/teams/alpha/")
    assert roles_of(OidcIdentity.objects.get().user) == {"alpha": "member"}
    # And the code and state cannot be played again.
    assert browser.get(callback).status_code == 400


def test_a_token_the_control_plane_refuses_sends_the_browser_back_to_the_sign_in_page(
    live_server, sso, settings, teams
):
    settings.OIDC_OP_ISSUER = "http://127.0.0.1:1/o"  # the provider's tokens now come from an unexpected issuer
    sso.set_user("oscar", "provider-pw", ["ml-platform"])
    browser = Browser()
    start = f"{live_server.url}/oidc/authenticate/?next=/teams/alpha/"
    callback = through_provider(browser, start, "oscar", "provider-pw", f"{live_server.url}/oidc/callback/")
    answer = browser.get(callback)
    assert (answer.status_code, answer.headers["Location"]) == (302, "/login/")
    assert SSO_FAILED in browser.get(f"{live_server.url}/login/").text
    assert not OidcIdentity.objects.exists() and not get_user_model().objects.filter(is_staff=True).exists()


@pytest.fixture
def id_token(sso):
    """A real ID token of the provider for the control plane's client, and its nonce: the authorization code flow
    run by hand (PKCE, the provider's form), the code exchanged at the token endpoint."""
    sso.set_user("trent", "provider-pw", ["ml-alpha"])
    verifier, challenge = pkce()
    nonce, redirect_uri = secrets.token_urlsafe(16), sso.redirect_uri
    query = urlencode(
        {
            "response_type": "code",
            "client_id": sso.client_id,
            "redirect_uri": redirect_uri,
            "scope": "openid email profile",
            "state": "s",
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
    )
    callback = through_provider(
        Browser(), f"{sso.discovery['authorization_endpoint']}?{query}", "trent", "provider-pw", redirect_uri
    )
    code = parse_qs(urlsplit(callback).query)["code"][0]
    tokens = requests.post(
        sso.discovery["token_endpoint"],
        timeout=10,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
            "client_id": sso.client_id,
            "client_secret": sso.client_secret,
        },
    )
    assert tokens.status_code == 200, tokens.text
    return tokens.json()["id_token"], nonce


def provider_signed(sso, claims: dict, key_pem: bytes | None = None) -> str:
    """``claims`` signed as the provider signs (RS256, its key id), or with ``key_pem`` instead of its key."""
    kid = requests.get(sso.discovery["jwks_uri"], timeout=10).json()["keys"][0]["kid"]
    return jwt.encode(claims, key_pem or sso.signing_key_pem, algorithm="RS256", headers={"kid": kid})


def test_the_providers_own_token_is_accepted(sso, id_token):
    token, nonce = id_token
    claims = OidcBackend().verify_token(token, nonce=nonce)
    assert claims["iss"] == sso.issuer and claims["aud"] == sso.client_id and claims["groups"] == ["ml-alpha"]


def test_tampered_expired_misaddressed_or_unsigned_id_tokens_are_refused(sso, id_token):
    token, nonce = id_token
    claims = jwt.decode(token, options={"verify_signature": False})
    header, payload, signature = token.split(".")
    forged_payload = (
        base64.urlsafe_b64encode(json.dumps({**claims, "groups": ["ml-platform"]}).encode()).rstrip(b"=").decode()
    )
    now = int(time.time())
    kid = jwt.get_unverified_header(token)["kid"]
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    an_hour = int(dt.timedelta(hours=1).total_seconds())
    refused = {
        "tampered": f"{header}.{forged_payload}.{signature}",
        "expired": provider_signed(sso, {**claims, "iat": now - 2 * an_hour, "exp": now - an_hour}),
        "other audience": provider_signed(sso, {**claims, "aud": "another-client"}),
        "other issuer": provider_signed(sso, {**claims, "iss": "http://127.0.0.1:1/o"}),
        "no expiry": provider_signed(sso, {key: value for key, value in claims.items() if key != "exp"}),
        "other key": provider_signed(sso, claims, other_key),
        "unsigned": jwt.encode(claims, None, algorithm="none"),
        "unsigned with the key id": jwt.encode(claims, None, algorithm="none", headers={"kid": kid}),
        "not a token": "not.a.token",
        "other nonce": token,
    }
    backend = OidcBackend()
    for name, forged in refused.items():
        with pytest.raises(SuspiciousOperation):
            backend.verify_token(forged, nonce="another" if name == "other nonce" else nonce)
            pytest.fail(f"{name} was accepted")
