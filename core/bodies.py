"""Request bodies within a size budget, and keep-alive connections that stay usable after a refused body.

``RequestBodyMiddleware`` answers 413 to a body whose declared ``Content-Length`` is over
``settings.REQUEST_BODY_MAX_BYTES`` before anything reads it, and after every response reads and drops whatever
the view left unread of a smaller body (a parser that refused at its own cap, a view that never reads), so the
next request on a kept-alive connection starts where the server expects it.

``must_close`` is the rule gunicorn's ``pre_request`` hook (``controlplane/gunicorn_conf.py``) applies: a body
the application will neither read nor drop (over the limit, or chunked, which Django does not read) makes the
server answer ``Connection: close`` and close, instead of announcing keep-alive and then dropping the
connection because its own bounded drain (64 KiB in gunicorn 27) gave up.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError

from core.middleware import wants_json

#: Bytes read at a time when dropping an unread body.
DRAIN_CHUNK_BYTES = 64 * 1024


def declared_length(value) -> int | None:
    """``Content-Length`` as a non-negative int, or None when absent or malformed (``value``: the header's text)."""
    try:
        length = int(value)
    except (TypeError, ValueError):
        return None
    return length if length >= 0 else None


def must_close(content_length, transfer_encoding) -> bool:
    """Whether a request whose headers say ``content_length`` and ``transfer_encoding`` (text or None) must end
    its connection: a chunked body (Django reads none of it), or a declared length over
    ``settings.REQUEST_BODY_MAX_BYTES`` (refused unread)."""
    if transfer_encoding and "chunked" in transfer_encoding.lower():
        return True
    length = declared_length(content_length)
    return length is not None and length > settings.REQUEST_BODY_MAX_BYTES


def too_large_response(request: HttpRequest, length: int) -> HttpResponse:
    """413 saying the limit (JSON for the API, plain text for the UI); never echoes the body."""
    limit = settings.REQUEST_BODY_MAX_BYTES
    detail = f"Request body of {length} bytes is over the limit of {limit} bytes."
    if wants_json(request):
        return JsonResponse({"detail": detail, "limit_bytes": limit}, status=413)
    return HttpResponse(detail, status=413, content_type="text/plain; charset=utf-8")


def drain(request: HttpRequest) -> int:
    """Read and drop what is left of ``request``'s body (at most its declared length, which the middleware
    bounded); the bytes dropped. A client that went away ends the drain quietly."""
    dropped = 0
    try:
        while chunk := request.read(DRAIN_CHUNK_BYTES):
            dropped += len(chunk)
    except (OSError, UnreadablePostError):
        pass
    return dropped


class RequestBodyMiddleware:
    """413 for a declared body over ``settings.REQUEST_BODY_MAX_BYTES`` (unread); after the view, the rest of a
    smaller body read and dropped, so a kept-alive connection stays in step."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        length = declared_length(request.META.get("CONTENT_LENGTH"))
        if length is not None and length > settings.REQUEST_BODY_MAX_BYTES:
            return too_large_response(request, length)
        response = self.get_response(request)
        if length:
            drain(request)
        return response
