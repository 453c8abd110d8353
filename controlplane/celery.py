"""The Celery application of the control plane.

Configuration comes from Django settings under the ``CELERY_`` prefix; tasks
live in each app's ``tasks.py``.
"""

import logging
import os

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init, worker_process_init

from core.metrics import start_worker_exporter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# --- worker-side Django connection handling and warm-up ----------------------------------------------------------
# Celery's Django fixup closes every database connection before and after each task unless
# ``CELERY_DB_REUSE_MAX`` is set, which ignores ``CONN_MAX_AGE``: each task paid a fresh PostgreSQL connection.
# With a reuse max the fixup force-closes only every that many tasks; between them Django's own
# ``close_old_connections`` (below, as Django does per request) drops connections that are past
# ``CONN_MAX_AGE``, broken by an error, or left out of autocommit.
app.conf.setdefault("CELERY_DB_REUSE_MAX", 1000)  # read under this name by celery.fixups.django


def _close_old_connections(sender=None, **_kwargs) -> None:
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # an eager task runs inside the caller's transaction (and the tests' atomic blocks)
    from django.db import close_old_connections

    close_old_connections()


task_prerun.connect(_close_old_connections, weak=False)
task_postrun.connect(_close_old_connections, weak=False)
worker_process_init.connect(start_worker_exporter, weak=False)  # CELERY_METRICS_PORT + pool index


@worker_init.connect(weak=False)
def _warm_kubernetes_client(**_kwargs) -> None:
    """Import the Kubernetes API classes the runner uses before the first task (the client imports them lazily,
    with their pydantic models: seconds of CPU that otherwise stall the first dispatch of every worker)."""
    try:
        from kubernetes import client as k8s

        for name in ("CoreV1Api", "BatchV1Api", "AppsV1Api", "VersionApi"):
            getattr(k8s, name)
    except Exception:  # a warm-up only; the first task imports it for real
        logging.getLogger(__name__).warning("kubernetes client warm-up failed", exc_info=True)
