"""A cluster's health, why, and since when: the one writer of ``Cluster.health``.

Reconcile's probe (``jobs.reconcile``) and dispatch's release of an attempt
that never got objects (``jobs.lifecycle.redispatch_or_release``) move a
cluster between ``healthy``, ``degraded`` and ``unreachable`` through
``set_health``, which keeps ``health_reason`` and ``health_since`` with it
and writes a ``ClusterEvent`` for each change of health.
"""

from __future__ import annotations

import datetime as dt
import re

from django.db import transaction
from django.utils import timezone

from .models import Cluster, ClusterEvent

#: Longest reason kept, characters (a failure's first line is what helps; tracebacks are in the log).
REASON_MAX_CHARS = 500
#: ``scheme://user:password@`` in a reason: kept as ``scheme://`` (no credential is ever stored in clear).
USERINFO = re.compile(r"(\w+://)[^/@\s]+@")


def clean_reason(reason: str) -> str:
    """``reason`` without URL credentials, on one line, at most ``REASON_MAX_CHARS`` characters."""
    text = " ".join(USERINFO.sub(r"\1", reason or "").split())
    return text if len(text) <= REASON_MAX_CHARS else text[:REASON_MAX_CHARS - 1] + "…"


def set_health(cluster: Cluster, health: str, reason: str = "", *, now: dt.datetime | None = None) -> bool:
    """Set ``cluster``'s health (a ``Cluster.Health`` value) and why; returns whether the health changed.

    Compare-and-set on the health ``cluster`` was read with: a change writes ``health``, ``health_reason`` (``reason``
    cleaned by ``clean_reason``; "" for healthy) and ``health_since``
    (``now``, default the current UTC time) and one ``ClusterEvent`` in the
    same transaction. When another writer changed the health first, nothing
    is written and ``False`` returned. The same health again only refreshes
    the reason (a newer failure), with no event and the same ``since``.
    ``cluster`` is updated in memory to what was stored. Run it holding no
    other row lock: it locks only the cluster row, last in the platform's
    lock order (``jobs.scheduling``).
    """
    now = now or timezone.now()
    reason = "" if health == Cluster.Health.HEALTHY else clean_reason(reason)
    before = cluster.health
    with transaction.atomic():
        if before == health:
            if cluster.health_reason != reason:
                Cluster.objects.filter(pk=cluster.pk, health=health).update(health_reason=reason)
                cluster.health_reason = reason
            return False
        changed = Cluster.objects.filter(pk=cluster.pk, health=before).update(
            health=health, health_reason=reason, health_since=now)
        if not changed:
            return False
        ClusterEvent.objects.create(cluster_id=cluster.pk, from_health=before, to_health=health, reason=reason,
                                    created_at=now)
    cluster.health, cluster.health_reason, cluster.health_since = health, reason, now
    return True
