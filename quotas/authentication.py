"""``Authorization: Token <key>`` authentication against hashed ApiToken rows."""

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from .models import ApiToken


class ApiTokenAuthentication(TokenAuthentication):
    """DRF token authentication where only the SHA-256 digest of each key is stored."""

    keyword = "Token"

    def authenticate_credentials(self, key: str):
        token = ApiToken.objects.select_related("user").filter(digest=ApiToken.hash_key(key)).first()
        if token is None or token.is_expired():
            raise exceptions.AuthenticationFailed("Invalid or expired token.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        # Touch at most once a minute, so a busy client does not write on every request.
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token
