"""``Authorization: Token <key>`` (or ``Bearer <key>``) authentication against hashed ApiToken rows.

Failed checks are counted per client address (rate ``token_failures``); past the rate the address gets 429 with
``Retry-After`` before its token is looked up, so guessing keys is bounded (docs/adr/0033).
"""

from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header

from core.lookups import LookupCache
from core.throttles import RateLimit, client_address

from .models import ApiToken

# Digest -> ApiToken with its user; see core.lookups for how stale an entry may be.
TOKENS = LookupCache("api-tokens").invalidate_on(ApiToken, get_user_model())
TOUCH_EVERY_SECONDS = 60


class ApiTokenAuthentication(TokenAuthentication):
    """DRF token authentication where only the SHA-256 digest of each key is stored.

    Raises AuthenticationFailed (401) for an unknown, expired or inactive
    user's token. A valid token is cached per process for
    ``settings.LOOKUP_CACHE_SECONDS``; expiry is checked on every request.
    """

    keyword = "Token"

    def authenticate(self, request):
        """DRF's token check, refused (Throttled, 429) while the client's address has ``token_failures`` failed
        checks within the rate's period; a failure (AuthenticationFailed, 401) is counted against the address."""
        words = get_authorization_header(request).split()
        if not words or words[0].lower() != self.keyword.lower().encode():
            return None  # another scheme's header, or none: not this scheme's check
        failures = RateLimit("token_failures")
        address = client_address(request)
        if (wait := failures.retry_after(address)) is not None:
            raise exceptions.Throttled(wait, detail="Too many failed token checks from this address.")
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            failures.record(address)
            raise

    def authenticate_credentials(self, key: str):
        digest = ApiToken.hash_key(key)
        token = TOKENS.get(digest, lambda: ApiToken.objects.select_related("user").filter(digest=digest).first())
        if token is None or token.is_expired():
            raise exceptions.AuthenticationFailed("Invalid or expired token.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        # Touch at most once a minute, so a busy client does not write on every request.
        now = timezone.now()
        last = token.last_used_at
        if last is None or (now - last).total_seconds() > TOUCH_EVERY_SECONDS:
            token.last_used_at = now  # the cached copy too, so other requests do not write again
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token


class BearerApiTokenAuthentication(ApiTokenAuthentication):
    """The same API tokens sent as ``Authorization: Bearer <key>`` (RFC 6750's scheme, what most HTTP clients and
    identity tooling send); ``Token <key>`` stays the documented form. Raises what ``ApiTokenAuthentication``
    raises."""

    keyword = "Bearer"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of ``BearerApiTokenAuthentication``: HTTP ``bearer`` (registered on import)."""

    target_class = BearerApiTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An API token (ApiToken), the same key as under the Token scheme."}
