"""The Celery application of ``benchmarks/scale_out.py``'s workers: the control plane's own app, unchanged, plus a
record of every finished ``jobs.tasks.reconcile_cluster`` task.

Started as ``celery -A benchmarks.scale_out_worker worker ...``. After each ``reconcile_cluster`` task the pool
process pushes one JSON object onto the Redis list ``DONE_KEY`` of the broker (``CELERY_BROKER_URL``):
``{"worker": hostname, "cluster_id": int, "observed": int, "full_list": bool, "skipped": bool}``. The benchmark
reads that list to know when a round has ended and which worker took which cluster; the task itself runs as in
production.
"""

from __future__ import annotations

import json
import os

from celery.signals import task_postrun

from controlplane.celery import app

DONE_KEY = "bench:scale_out:done"

_redis = None


def _record(sender=None, task=None, args=None, retval=None, **_kwargs) -> None:
    global _redis
    if getattr(task, "name", "") != "jobs.tasks.reconcile_cluster":
        return
    import redis

    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    result = retval if isinstance(retval, dict) else {}
    _redis.rpush(DONE_KEY, json.dumps({
        "worker": task.request.hostname, "cluster_id": (args or [None])[0],
        "observed": int(result.get("observed") or 0), "full_list": bool(result.get("full_list")),
        "skipped": "skipped" in result, "error": "error" in result or "unreachable" in result}))


task_postrun.connect(_record, weak=False)

__all__ = ["app", "DONE_KEY"]
