"""Sign-in rate limits: failed sign-ins counted per client address and per username, refused past the rates.

Every failed ``authenticate()`` with a request (the web UI's ``/login/``, the admin's ``/admin/login/``) is
counted by ``count_failed_sign_in`` (Django's ``user_login_failed`` signal, connected in ``QuotasConfig.ready``)
against the address (rate ``sign_in_address``) and the lower-cased username (``sign_in_username``).
``SignInThrottleMiddleware`` answers 429 with ``Retry-After`` to a sign-in POST while either count is at its
rate, before the password is checked, so guessing is bounded per address and per account (docs/adr/0033).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.utils.html import escape

from core.throttles import RateLimit, client_address

#: Paths whose POST is a sign-in (the UI's and the admin's login views).
SIGN_IN_PATHS = (settings.LOGIN_URL, "/admin/login/")


def username_key(username) -> str:
    """The username as counted: trimmed and lower-cased, so ``Alice`` and ``alice`` share one count."""
    return str(username or "").strip().lower()[:150]


def sign_in_retry_after(address: str, username: str) -> int | None:
    """Seconds before a sign-in from ``address`` for ``username`` may be tried, or None when allowed (counts
    nothing)."""
    waits = [RateLimit("sign_in_address").retry_after(address)]
    if key := username_key(username):
        waits.append(RateLimit("sign_in_username").retry_after(key))
    waits = [w for w in waits if w is not None]
    return max(waits) if waits else None


def count_failed_sign_in(sender, credentials=None, request=None, **kwargs) -> None:
    """``user_login_failed`` receiver: one failure for the request's address and the tried username
    (``credentials["username"]``); a failure without a request (a shell, a test) counts for the username only."""
    if request is not None:
        RateLimit("sign_in_address").record(client_address(request))
    if key := username_key((credentials or {}).get("username")):
        RateLimit("sign_in_username").record(key)


class SignInThrottleMiddleware:
    """429 (a short page, ``Retry-After``) for a POST to a sign-in path while its address or username is over its
    rate of failed sign-ins; every other request passes untouched."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and request.path in SIGN_IN_PATHS:
            wait = sign_in_retry_after(client_address(request), request.POST.get("username", ""))
            if wait is not None:
                return throttled_page(wait)
        return self.get_response(request)


def throttled_page(wait: int) -> HttpResponse:
    """429 with ``Retry-After: wait`` (seconds) and a page that says when to try again."""
    response = HttpResponse(
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Too many sign-in attempts</title>'
        "</head><body><main><h1>Too many sign-in attempts</h1><p>Too many failed sign-ins from this address or "
        f'for this account. Try again in {escape(wait)} seconds.</p><p><a href="{escape(settings.LOGIN_URL)}">'
        "Sign in</a></p></main></body></html>",
        status=429,
        content_type="text/html; charset=utf-8",
    )
    response["Retry-After"] = str(wait)
    return response
