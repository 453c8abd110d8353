"""The audit trail: what of each governed object is recorded (``snapshot``), ``record``, which every write path
calls inside its change's transaction, and the filters the API and the pages read it with (ADR 0031).

Governed objects: quotas, budgets, cohorts, teams' fair share, priority classes, prices, clusters and their node
pools, node cordons, memberships and roles, and the decisions on change requests. Money is recorded as the
Decimal's string; a credential (a cluster's token, CA, kubeconfig, Prometheus auth) never: ``before`` says
``set`` or ``empty``, and ``after`` says ``credential changed`` when the write changed it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import urllib.parse
from decimal import Decimal

import django_filters
from django.db import router, transaction
from django.db.models.deletion import Collector

from runners.credentials import CredentialUnreadable

from .models import AuditRecord

#: The fields recorded, by model name (``Model._meta.model_name``): the ones that govern who gets what and what it
#: costs, not the bookkeeping the platform writes itself (a cluster's health, a node's last sighting).
AUDITED_FIELDS = {
    "quota": ["team_id", "accelerator_id", "cluster_id", "nominal_gpus", "borrowing_limit_gpus",
              "lending_limit_gpus", "max_gpus_per_job", "nominal_vcpus", "borrowing_limit_vcpus",
              "lending_limit_vcpus", "max_vcpus_per_job"],
    "budget": ["team_id", "period", "starts_at", "ends_at", "amount_usd", "alert_thresholds", "action",
               "stop_running"],
    "team": ["slug", "name", "cost_center", "cohort_id", "weight", "queueing_strategy"],
    "cohort": ["name", "parent_id", "weight"],
    "cohortquota": ["cohort_id", "accelerator_id", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"],
    "priorityclass": ["name", "value", "description"],
    "membership": ["team_id", "user_id", "role"],
    "price": ["provider", "region", "accelerator_id", "capacity_type", "cluster_id", "usd_per_gpu_hour", "usd_per_vcpu_hour",
              "usd_per_gib_hour", "effective_from", "source"],
    "electricityprice": None,  # every concrete field: see ``_fields``
    "cluster": ["name", "provider", "region", "backend", "api_endpoint", "prometheus_url", "emulated",
                "api_token", "ca_cert", "kubeconfig", "prometheus_auth"],
    "nodepool": ["cluster_id", "name", "accelerator_id", "capacity_type", "nodes", "gpus_per_node"],
    "node": ["cluster_id", "name", "cordoned", "cordon_note", "health"],
    "changerequest": ["team_id", "kind", "target_id", "payload", "state", "decision_note", "applied_id"],
}

#: What a record says happened.
ACTIONS = ("created", "updated", "deleted", "approved", "declined", "cordoned", "drained", "uncordoned", "cleared")

#: Credential fields, by model name: recorded as ``set``/``empty`` and ``credential changed``, never their value.
CREDENTIAL_FIELDS = {"cluster": ("api_token", "ca_cert", "kubeconfig", "prometheus_auth")}
CREDENTIAL_CHANGED = "credential changed"

#: The HTTP header an API write gives its reason in: UTF-8, percent-encoded (Discord's ``X-Audit-Log-Reason`` is the
#: same), as a header carries Latin-1 only; cpctl's ``--reason``.
REASON_HEADER = "X-Audit-Reason"
REASON_MAX = 2000


def _fields(obj) -> list[str]:
    names = AUDITED_FIELDS.get(obj._meta.model_name)
    if names is None:
        names = [f.attname for f in obj._meta.concrete_fields if not f.primary_key]
    return names


def _json(value):
    """``value`` as JSON: Decimal and datetimes as text (ISO 8601), the rest as is."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return value


def _digest(value) -> str:
    return hashlib.sha256(str(value or "").encode()).hexdigest()


def snapshot(obj) -> dict:
    """The audited values of ``obj`` (a governed model instance; ``AUDITED_FIELDS``) as a JSON-ready dict.

    Credential fields hold ``set``, ``empty`` or ``unreadable`` (stored under a key no longer configured); ``record`` compares them through a digest kept only in memory
    (the ``_credentials`` entry, which ``record`` removes before anything is stored).
    """
    secret = CREDENTIAL_FIELDS.get(obj._meta.model_name, ())
    values, digests = {}, {}
    for name in _fields(obj):
        value = getattr(obj, name)
        if name in secret:
            try:
                digests[name] = _digest(value)
                values[name] = "set" if value else "empty"
            except CredentialUnreadable:  # under a key no longer configured: a change of it is still a change
                values[name], digests[name] = "unreadable", "unreadable"
        else:
            values[name] = _json(value)
    if digests:
        values["_credentials"] = digests
    return values


def _without_digests(before: dict, after: dict) -> tuple[dict, dict]:
    """``before`` and ``after`` without their in-memory credential digests, a changed credential's ``after``
    replaced by ``credential changed``."""
    before, after = dict(before), dict(after)
    old, new = before.pop("_credentials", {}), after.pop("_credentials", {})
    for name, digest in new.items():
        if name in old and old[name] != digest:
            after[name] = CREDENTIAL_CHANGED
    return before, after


def _team_id(obj):
    if obj._meta.model_name == "team":
        return obj.pk
    return getattr(obj, "team_id", None)


def record(actor, action: str, obj, before: dict, after: dict, reason: str = "", *,
           object_id: int | None = None) -> AuditRecord:
    """Append one audit record of ``action`` (``created``, ``updated``, ``deleted``, ``approved``, ``declined``,
    ``withdrawn``, ``cordoned``, ``drained``, ``uncordoned``, ``cleared``) on ``obj`` by ``actor`` (a user; None or anonymous:
    the system), with ``before`` and ``after`` from ``snapshot`` (``{}`` for a creation's before and a
    deletion's after) and ``reason`` (text, at most 2,000 characters kept).

    Call it inside the change's transaction (``transaction.atomic``), after the change is written and before
    it commits: a change that fails then rolls its record back, and a record never exists without its change.
    ``object_id``: the id when ``obj`` has none any more (deleted). The record's team is the object's.
    """
    actor = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    before, after = _without_digests(before, after)
    return AuditRecord.objects.create(
        actor=actor, actor_name=actor.get_username() if actor is not None else "", action=action,
        object_type=obj._meta.model_name, object_id=object_id if object_id is not None else obj.pk,
        object_repr=str(obj)[:200], team_id=_team_id(obj), before=before, after=after,
        reason=(reason or "").strip()[:REASON_MAX])


def deletion_snapshots(obj) -> list[tuple[object, int, dict]]:
    """``[(instance, pk, snapshot)]`` of ``obj`` and of every governed object (``AUDITED_FIELDS``) its deletion
    deletes with it by cascade (a cluster's node pools, quotas and prices; a team's quotas, budgets and
    memberships), read before the delete with Django's own deletion ``Collector``. Call before deleting; pass
    the result to ``record_deletions`` after. Class: a change made by a cascade that no record says."""
    collector = Collector(using=router.db_for_write(type(obj)), origin=obj)
    collector.collect([obj])
    found: dict[tuple[str, int], object] = {(obj._meta.label, obj.pk): obj}
    for model, instances in collector.data.items():
        if model._meta.model_name in AUDITED_FIELDS:
            found.update(((model._meta.label, i.pk), i) for i in instances)
    for queryset in collector.fast_deletes:
        if queryset.model._meta.model_name in AUDITED_FIELDS:
            found.update(((queryset.model._meta.label, i.pk), i) for i in queryset)
    for instance in found.values():
        str(instance)  # loads what its name reads (a pool's cluster) while it exists, for the record after
    return [(instance, pk, snapshot(instance)) for (_, pk), instance in found.items()]


def record_deletions(actor, obj, snapshots: list[tuple[object, int, dict]], reason: str = "") -> None:
    """Append a ``deleted`` record for ``obj`` and each object deleted with it (``deletion_snapshots``, taken
    before the delete); those deleted with it say so in their reason. Call in the delete's transaction."""
    for instance, pk, before in snapshots:
        why = reason if instance is obj else f"{reason} (deleted with {obj._meta.model_name} {obj})".strip()
        record(actor, "deleted", instance, before, {}, why, object_id=pk)


def reason_of(request) -> str:
    """The reason an HTTP request gives for its change: the ``X-Audit-Reason`` header (API, cpctl ``--reason``;
    percent-encoded UTF-8) or the ``reason`` form field (the web UI's forms); empty when none."""
    given = urllib.parse.unquote(request.headers.get(REASON_HEADER) or "")
    if not given and request.method == "POST":
        given = request.POST.get("reason", "") if hasattr(request, "POST") else ""
    return given.strip()[:REASON_MAX]


class AuditedWriteMixin:
    """For a DRF viewset: create, update and destroy that append an audit record (the request's user, the
    object's values before and after, the reason of ``reason_of``) in the same transaction as the write."""

    def perform_create(self, serializer):
        with transaction.atomic():
            super().perform_create(serializer)
            record(self.request.user, "created", serializer.instance, {}, snapshot(serializer.instance),
                   reason_of(self.request))

    def perform_update(self, serializer):
        with transaction.atomic():
            before = snapshot(serializer.instance)
            super().perform_update(serializer)
            record(self.request.user, "updated", serializer.instance, before, snapshot(serializer.instance),
                   reason_of(self.request))

    def perform_destroy(self, instance):
        with transaction.atomic():
            snapshots = deletion_snapshots(instance)
            super().perform_destroy(instance)
            record_deletions(self.request.user, instance, snapshots, reason_of(self.request))


def visible_records(user, records=None):
    """The audit records (of ``records``, a queryset; default all) ``user`` may read: all for staff; otherwise
    those of the user's teams (any role), never a platform-wide object's (a cluster, price, cohort, priority class
    or node: no team) nor another team's."""
    records = AuditRecord.objects.all() if records is None else records
    if user.is_staff:
        return records
    return records.filter(team__memberships__user=user)


class AuditFilterSet(django_filters.FilterSet):
    """Audit records by ``team`` (slug), ``object_type`` (``quota``, ``budget``, ``cluster``...), ``object_id``,
    ``actor`` (username), ``action`` and ``since``/``until`` (ISO 8601 datetimes, ``[since, until)``; without an
    offset: UTC). The API list and the audit page both read with it."""

    team = django_filters.CharFilter(field_name="team__slug", label="Team")
    object_type = django_filters.ChoiceFilter(choices=[(name, name) for name in AUDITED_FIELDS], label="Object type")
    object_id = django_filters.NumberFilter(min_value=1, label="Object id")
    actor = django_filters.CharFilter(field_name="actor_name", label="Actor (username)")
    action = django_filters.ChoiceFilter(choices=[(name, name) for name in ACTIONS], label="Action")
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte", label="Since (UTC)")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt", label="Until (UTC)")

    class Meta:
        model = AuditRecord
        fields = ["team", "object_type", "object_id", "actor", "action", "since", "until"]
