"""Database trouble answers 503, never 500: a JSON body with ``Retry-After`` for the API, a styled page for the UI.

``DatabaseUnavailableMiddleware`` turns Django's ``OperationalError`` and
``InterfaceError`` (PostgreSQL down or restarting, ``too many clients``, a
connection pool that stays exhausted past its timeout, SQLite's ``database is
locked`` past its timeout) raised by a view into ``503 Service Unavailable``
with ``Retry-After`` (RFC 9110 section 10.2.3). ``handler503`` (installed as
the URLconf's ``handler500``) does the same for such an error raised outside a
view (a middleware's own query), and keeps Django's plain 500 for anything else.

The answers touch no database: the page is rendered from a string, not from a
template whose context processors would read the session and the user.
"""

from __future__ import annotations

import logging
import sys

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.templatetags.static import static
from django.utils.html import escape
from django.views.defaults import page_not_found, server_error

log = logging.getLogger(__name__)

#: The exceptions that mean "the database cannot serve now" (retrying later may succeed).
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Temporarily unavailable · GPU control plane</title><link rel="stylesheet" href="{css}">
<style>.unavailable{{max-width:40rem;margin:4rem auto;padding:1.5rem 2rem;border:1px solid #d0d7de;border-radius:8px;
font-family:system-ui,sans-serif}}.unavailable h1{{font-size:1.4rem;margin-top:0}}</style></head>
<body><header class="site-header"><a class="brand" href="/">GPU control plane</a></header>
<main id="main"><section class="unavailable" role="alert"><h1>Temporarily unavailable</h1>
<p>The {dependency} does not answer right now. Nothing you submitted was lost.</p>
<p>Try again in {retry} seconds; this page does not reload by itself.</p></section></main></body></html>
"""


def wants_json(request: HttpRequest) -> bool:
    """Whether ``request`` is an API call (under ``/api/``, or asking for JSON) rather than a page of the UI."""
    return request.path.startswith("/api/") or "application/json" in request.headers.get("Accept", "")


def unavailable_response(request: HttpRequest, dependency: str = "database") -> HttpResponse:
    """503 naming ``dependency``, with ``Retry-After: settings.UNAVAILABLE_RETRY_AFTER_SECONDS``.

    API: ``{"detail": "...", "dependency": "database", "retry_after_seconds": N}``; UI: a styled HTML page.
    """
    retry = int(settings.UNAVAILABLE_RETRY_AFTER_SECONDS)
    if wants_json(request):
        response = JsonResponse({"detail": f"The {dependency} is temporarily unavailable; retry later.",
                                 "dependency": dependency, "retry_after_seconds": retry}, status=503)
    else:
        response = HttpResponse(PAGE.format(css=static("frontend/app.css"), dependency=escape(dependency),
                                            retry=retry), status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(retry)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseUnavailableMiddleware:
    """Answer 503 (``unavailable_response``) when a view raises a database-unavailable error; logs it once."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, DATABASE_UNAVAILABLE):
            log.warning("database unavailable on %s %s: %r", request.method, request.path, exception)
            return unavailable_response(request)
        return None


def handler503(request, *args, **kwargs) -> HttpResponse:
    """The URLconf's ``handler500``: 503 when the uncaught exception is a database-unavailable error (raised
    outside a view, where no middleware's ``process_exception`` sees it), else Django's own 500 page."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return unavailable_response(request)
    return server_error(request, *args, **kwargs)


def handler404(request, exception=None) -> HttpResponse:
    """The URLconf's ``handler404``: ``{"detail": "Not found."}`` (JSON, as DRF answers) for a path under ``/api/``
    that matches no route (``/api/v1/jobs/1.5/``), Django's own page for the UI."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)
