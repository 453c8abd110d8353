"""Probes for load balancers and Kubernetes: ``/healthz`` (the process answers) and ``/readyz`` (it can work).

Plain Django views without authentication or sessions, so a probe never
touches more than it checks.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger(__name__)

#: ``scheme://user:password@`` in an error text: kept as ``scheme://``.
USERINFO = re.compile(r"(\w+://)[^/@\s]+@")


def check_database() -> None:
    """Run ``SELECT 1`` on the default database; raises the driver's error when it is unreachable."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_broker() -> None:
    """Open a connection to the Celery broker, one retry at most; raises when it is unreachable."""
    from controlplane.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)


READINESS_CHECKS = {"database": check_database, "broker": check_broker}


@never_cache
@require_GET
def healthz(request) -> JsonResponse:
    """200 ``{"status": "ok"}`` while the process serves requests; checks no dependency."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request) -> JsonResponse:
    """200 when the database and the Celery broker answer, else 503 naming what failed.

    Body: ``{"status": "ok" | "unavailable", "down": ["broker", ...],
    "checks": {"database": "ok" | "<error>", "broker": ...}}``: ``down`` names
    the dependencies that failed. Error texts carry the exception class and
    message with any ``user:password@`` of a URL removed.

    The clusters jobs run on are not among the checks: a degraded or
    unreachable cluster does not stop this process from serving (taking it out
    of its load balancer would hide the cluster's state too), and this probe
    answers anyone, while a cluster's name and failure are for signed-in
    users: ``/api/v1/clusters/`` (``health``, ``health_reason``,
    ``health_since``), the Clusters page and ``cpctl clusters`` say which
    cluster is not healthy, since when and why.
    """
    checks, ready = {}, True
    for name, check in READINESS_CHECKS.items():
        try:
            check()
            checks[name] = "ok"
        except Exception as exc:  # any failure means not ready; say which and why
            log.warning("readiness check %s failed: %r", name, exc)
            checks[name] = USERINFO.sub(r"\1", f"{type(exc).__name__}: {exc}")
            ready = False
    down = [name for name, result in checks.items() if result != "ok"]
    response = JsonResponse({"status": "ok" if ready else "unavailable", "down": down, "checks": checks},
                            status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = str(settings.UNAVAILABLE_RETRY_AFTER_SECONDS)
    return response
