"""The OpenID Connect client of the web UI's single sign-on: mozilla-django-oidc's authorization code flow (with
PKCE and a nonce), stricter about the ID token, and accounts from ``quotas.sso`` (ADR 0032).

mozilla-django-oidc checks the ID token's signature (``OIDC_RP_SIGN_ALGO``, keys from ``OIDC_OP_JWKS_ENDPOINT``),
its ``exp`` when present, and the nonce; it leaves out the audience and the issuer. ``OidcBackend`` checks what
OpenID Connect Core 1.0 section 3.1.3.7 asks of a client: ``iss`` is ``OIDC_OP_ISSUER``, ``aud`` holds
``OIDC_RP_CLIENT_ID`` (and ``azp`` names it when there are several audiences), ``exp`` and ``iat`` are present
and ``exp`` is in the future (``OIDC_CLOCK_SKEW_SECONDS`` of leeway), and the userinfo answer's ``sub`` is the
ID token's. A token that fails any check, or a provider that cannot be reached, signs nobody in: the callback
sends the browser back to the sign-in page.

Single sign-on is on when ``OIDC_RP_CLIENT_ID`` is set (``enabled``); the backend stays in
``AUTHENTICATION_BACKENDS`` either way and answers nothing while it is off.
"""

from __future__ import annotations

import logging

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from . import sso

logger = logging.getLogger(__name__)

#: Claims every ID token must carry (OpenID Connect Core 1.0, section 2).
REQUIRED_ID_TOKEN_CLAIMS = ("iss", "sub", "aud", "exp", "iat")


def enabled() -> bool:
    """Whether single sign-on is configured (``OIDC_RP_CLIENT_ID`` is set)."""
    return bool(getattr(settings, "OIDC_RP_CLIENT_ID", ""))


def provider_name() -> str:
    """The provider's name on the sign-in page's button (``OIDC_PROVIDER_NAME``)."""
    return settings.OIDC_PROVIDER_NAME


class OidcBackend(OIDCAuthenticationBackend):
    """Signs in the user of a verified authorization code callback; answers ``None`` while single sign-on is off
    and for every request that is not such a callback (so local password sign-in is untouched)."""

    def __init__(self, *args, **kwargs):
        if enabled():
            super().__init__(*args, **kwargs)
        else:
            self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        """The user of ``request``, an authorization code callback, or ``None``: refused tokens and an unreachable
        provider are logged (warning) and sign nobody in."""
        # Only the callback view's call (it passes the nonce it kept), never a password form's that happens to carry
        # code and state in its query string.
        if not enabled() or request is None or "nonce" not in kwargs:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except (SuspiciousOperation, sso.ClaimsRefused) as exc:
            logger.warning("single sign-on refused: %s", exc)
        except requests.RequestException as exc:
            logger.warning("single sign-on failed: the provider did not answer as expected: %s", exc)
        except IntegrityError as exc:  # the same new subject signing in twice at once: the other sign-in won
            logger.warning("single sign-on failed: %s", exc)
        return None

    def get_user(self, user_id):
        """The active user ``user_id`` or ``None``: Django's own rule (mozilla-django-oidc's also returns a user
        deactivated since they signed in, who would then stay signed in)."""
        return ModelBackend.get_user(self, user_id)

    def verify_token(self, token, **kwargs):
        """The claims of the ID token ``token`` once verified; raises ``SuspiciousOperation`` for any token that fails,
        also one malformed enough to break the library's own reading (no key id, not a JWS)."""
        try:
            return super().verify_token(token, **kwargs)
        except (jwt.PyJWTError, KeyError, ValueError) as exc:
            raise SuspiciousOperation(f"ID token refused: {exc!r}") from None

    def _verify_jws(self, payload, key):
        """The claims of the JWS ``payload`` after checking its algorithm, signature, issuer, audience and times;
        raises ``SuspiciousOperation`` naming the first check that fails."""
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(f"ID token algorithm {header.get('alg')!r} is not {self.OIDC_RP_SIGN_ALGO}")
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.OIDC_OP_ISSUER,
                leeway=settings.OIDC_CLOCK_SKEW_SECONDS,
                options={"require": list(REQUIRED_ID_TOKEN_CLAIMS)},
            )
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("ID token refused: several audiences and azp is not this client")
        return claims

    def verify_claims(self, claims):
        """Every verified set of claims with a ``sub`` may sign in; access comes from the groups claim."""
        return bool(claims.get("sub"))

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims (``payload``) overlaid with the userinfo endpoint's; raises
        ``SuspiciousOperation`` when the two name different subjects."""
        userinfo = super().get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the userinfo answer is about another subject than the ID token")
        return {**payload, **userinfo}

    def get_or_create_user(self, access_token, id_token, payload):
        """The user the verified claims sign in (``quotas.sso.sign_in``), memberships synchronised."""
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            raise SuspiciousOperation("the claims have no 'sub'")
        return sso.sign_in(
            settings.OIDC_OP_ISSUER,
            claims,
            group_map=settings.OIDC_GROUP_MAP,
            groups_claim=settings.OIDC_GROUPS_CLAIM,
            username_claim=settings.OIDC_USERNAME_CLAIM,
        )
