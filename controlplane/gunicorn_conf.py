"""gunicorn's server hooks for the web process: ``gunicorn -c python:controlplane.gunicorn_conf controlplane.wsgi``.

``pre_request`` marks a request whose body the application will not read to its end (over
``REQUEST_BODY_MAX_BYTES``, or chunked) to close its connection, so the answer says ``Connection: close`` and the
server closes cleanly. Without it gunicorn announces keep-alive, drains at most 64 KiB of the unread body after
the answer, then drops the connection, and the client's next request on it fails (core/bodies.py; ADR 0033).
"""

from __future__ import annotations


def pre_request(worker, req) -> None:
    """gunicorn's hook, called before the application sees ``req`` (gunicorn's parsed request: ``headers`` is a
    list of (upper-case name, value)); logs the request line at debug level as gunicorn's default hook does."""
    from core.bodies import must_close  # the application (and so the settings) is loaded by then

    worker.log.debug("%s %s", req.method, req.path)
    headers = dict(req.headers)
    if must_close(headers.get("CONTENT-LENGTH"), headers.get("TRANSFER-ENCODING")):
        req.force_close()
