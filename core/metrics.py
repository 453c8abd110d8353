"""Metrics helpers shared by every process: each Celery pool process serves its own counters.

Counters and histograms of work done in a worker (admissions, dispatches,
accrual) live in that worker's pool process. ``start_worker_exporter`` is
connected to Celery's ``worker_process_init`` by ``controlplane.celery`` and
serves them on ``CELERY_METRICS_PORT + <pool process index>`` when that
setting is not 0; Prometheus scrapes those ports and sums with ``sum by``.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def start_worker_exporter(**_kwargs) -> None:
    """In each prefork pool process: serve this process' counters on ``CELERY_METRICS_PORT + index`` if set."""
    from billiard.process import current_process
    from django.conf import settings
    from prometheus_client import start_http_server

    base = getattr(settings, "CELERY_METRICS_PORT", 0)
    if not base:
        return
    port = base + int(getattr(current_process(), "index", 0) or 0)
    try:
        start_http_server(port, addr=settings.CELERY_METRICS_ADDR)
    except OSError as exc:
        log.warning("worker metrics not served on port %s: %s", port, exc)
        return
    log.info("worker metrics on http://%s:%s/metrics", settings.CELERY_METRICS_ADDR, port)
