"""Change requests: a team admin asks for a quota or budget change with a reason; platform staff approve or decline.

A team cannot grant itself capacity or money (ADR 0029, after Kueue's ClusterQueues owned by the cluster
admin, Slurm's accounts set by the operator, Run:ai's and Kubecost's admin-set quotas and budgets): its
admins ask here, staff decide. The REST API (``quotas.api.change_requests``) and the web UI (``frontend``)
both call these functions, so they answer alike.

- ``request_change`` validates the requested values with the staff write path's serializers
  (``quotas.serializers``), so a request that could never be applied is refused when it is made (a
  ``ValidationError`` whose ``payload`` entry names the field), and stores the target's values then
  (``base``).
- ``approve`` moves the request from ``pending`` to ``approved`` by compare-and-set and applies the change in
  the same transaction, re-validated against the current object: a target that changed since the request (or
  is gone), or values the rules now refuse, raise ``ChangeConflict`` (the API's 409) and nothing changes.
- ``decline`` (staff, with a note) and ``withdraw`` (the requester) change nothing but the request.

Every state change writes a ``ChangeRequestEvent`` in its transaction; an approval or a decline also appends
an audit record of the decision, and an applied change the audit record of the quota or budget it changed, with
the requester's reason (``quotas.audit``, ADR 0031). The requester is mailed the decision once it is committed (Django mail,
as budget alerts are: ``costs.budgets.check_budget``).
"""

from __future__ import annotations

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from rest_framework import serializers

from . import audit
from .models import Budget, ChangeRequest, ChangeRequestEvent, Quota
from .serializers import BudgetSerializer, QuotaSerializer

#: The fields a request may set, by kind: the staff write path's writable fields but ``team`` (the request's own).
REQUEST_FIELDS = {
    ChangeRequest.Kind.QUOTA: ("accelerator", "cluster", "nominal_gpus", "borrowing_limit_gpus", "max_gpus_per_job",
                               "lending_limit_gpus", "nominal_vcpus", "borrowing_limit_vcpus", "max_vcpus_per_job",
                               "lending_limit_vcpus"),
    ChangeRequest.Kind.BUDGET: ("period", "starts_at", "ends_at", "amount_usd", "alert_thresholds", "action",
                                "stop_running"),
}
MODELS = {ChangeRequest.Kind.QUOTA: Quota, ChangeRequest.Kind.BUDGET: Budget}
SERIALIZERS = {ChangeRequest.Kind.QUOTA: QuotaSerializer, ChangeRequest.Kind.BUDGET: BudgetSerializer}


class ChangeConflict(Exception):
    """The request cannot move or be applied now: it is no longer pending, or its target changed or is gone, or
    its values no longer pass the rules. ``detail`` is the message (str) or the fields' errors (dict)."""

    def __init__(self, detail):
        super().__init__(detail if isinstance(detail, str) else "the requested values no longer pass the rules")
        self.detail = detail


def current_values(kind: str, obj) -> dict:
    """The JSON values of ``obj`` (a Quota or Budget) in ``REQUEST_FIELDS[kind]``, as the API shows them (names
    for the accelerator and cluster, USD as a string, datetimes ISO 8601)."""
    shown = SERIALIZERS[kind](obj).data
    return {name: shown[name] for name in REQUEST_FIELDS[kind]}


def _validated(kind: str, team, target, payload, user):
    """The staff write path's serializer for ``payload`` on ``target`` (None: a new object of ``team``), valid,
    acting as ``user``; ``serializers.ValidationError({"payload": {field: [reason]}})`` otherwise."""
    if not isinstance(payload, dict):
        raise serializers.ValidationError({"payload": ["Expected an object of the requested values."]})
    unknown = sorted(set(payload) - set(REQUEST_FIELDS[kind]))
    if unknown:
        fields = ", ".join(REQUEST_FIELDS[kind])
        raise serializers.ValidationError({"payload": {
            name: [f"not a field a {kind} request sets; one of {fields}"] for name in unknown}})
    if target is not None and not payload:
        raise serializers.ValidationError({"payload": [f"ask for at least one change of the {kind}"]})
    serializer = SERIALIZERS[kind](target, data={**payload, "team": team.slug}, partial=target is not None,
                                   context={"user": user})
    if not serializer.is_valid():
        raise serializers.ValidationError({"payload": serializer.errors})
    return serializer


def _record(request: ChangeRequest, actor, from_state: str, to_state: str, note: str = "") -> None:
    ChangeRequestEvent.objects.create(request=request, actor=actor, from_state=from_state, to_state=to_state,
                                      note=note)


def request_change(*, user, team, kind: str, target_id: int | None, payload: dict, reason: str) -> ChangeRequest:
    """Store a pending request by ``user`` for a change of ``team``'s quota or budget, with its creation event.

    ``kind``: ``quota`` or ``budget``; ``target_id``: the team's object to change (None: a new one);
    ``payload``: the requested values (``REQUEST_FIELDS[kind]``; on a target, the fields to change). Who may
    ask is the caller's check (``quotas.permissions.may_request_changes``). Raises
    ``serializers.ValidationError`` naming ``target`` (no such object of the team), ``reason`` (blank) or
    ``payload`` and its field (what the staff write path would refuse), and stores nothing then.
    """
    target = None
    if target_id is not None:
        target = MODELS[kind].objects.filter(pk=target_id, team=team).first()
        if target is None:
            raise serializers.ValidationError({"target": [f"team {team.slug} has no {kind} {target_id}"]})
    if not (reason or "").strip():
        raise serializers.ValidationError({"reason": ["say why the team needs the change"]})
    serializer = _validated(kind, team, target, payload, user)
    payload = dict(payload)
    if "amount_usd" in payload:  # money stays exact text, whatever JSON number it came as
        payload["amount_usd"] = str(serializer.validated_data["amount_usd"])
    with transaction.atomic():
        change = ChangeRequest.objects.create(
            team=team, kind=kind, target_id=target_id, payload=payload, reason=reason.strip(), requested_by=user,
            base=current_values(kind, target) if target is not None else {})
        _record(change, user, "", ChangeRequest.State.PENDING)
    return change


def _decide(change: ChangeRequest, user, to_state: str, note: str, **fields) -> None:
    """Compare-and-set ``change`` from pending to ``to_state`` (with ``fields``) and write its event; inside the
    caller's transaction. ``ChangeConflict`` when it is no longer pending (another decision won)."""
    moved = ChangeRequest.objects.filter(pk=change.pk, state=ChangeRequest.State.PENDING).update(
        state=to_state, **fields)
    if not moved:
        state = ChangeRequest.objects.filter(pk=change.pk).values_list("state", flat=True).first()
        raise ChangeConflict(f"request {change.pk} is {state} already; only a pending request can be {to_state}")
    _record(change, user, ChangeRequest.State.PENDING, to_state, note)


def _audit_decision(change: ChangeRequest, user, before: dict) -> None:
    """Append the audit record of the decision on ``change`` (its values before, read before the compare-and-set),
    with the requester's reason; inside the decision's transaction."""
    change.refresh_from_db()
    audit.record(user, change.state, change, before, audit.snapshot(change), change.reason)


def _apply(change: ChangeRequest, user):
    """Apply ``change``'s payload as ``user`` (staff) to its locked target, or create the new object; the applied
    object. ``ChangeConflict`` when the target is gone, changed since the request, or the values fail the rules
    now."""
    kind = change.kind
    target = None
    if change.target_id is not None:
        target = MODELS[kind].objects.select_for_update().filter(pk=change.target_id, team=change.team_id).first()
        if target is None:
            raise ChangeConflict(f"{kind} {change.target_id} no longer exists; decline the request")
        now = current_values(kind, target)
        changed = {name: (value, now.get(name)) for name, value in change.base.items() if now.get(name) != value}
        if changed:
            what = ", ".join(f"{name} was {old!r}, is {new!r}" for name, (old, new) in sorted(changed.items()))
            raise ChangeConflict(f"{kind} {change.target_id} changed since the request ({what}); decline it and "
                                 "ask again on the current values")
    try:
        serializer = _validated(kind, change.team, target, change.payload, user)
    except serializers.ValidationError as exc:
        raise ChangeConflict(exc.detail) from exc
    before = audit.snapshot(target) if target is not None else {}
    applied = serializer.save()
    audit.record(user, "updated" if target is not None else "created", applied, before, audit.snapshot(applied),
                 f"change request {change.pk} by {_requester(change)}: {change.reason}")
    return applied


def _requester(change: ChangeRequest) -> str:
    return change.requested_by.get_username() if change.requested_by else "a deleted user"


def approve(change_id: int, user, note: str = "") -> ChangeRequest:
    """Approve pending request ``change_id`` as ``user`` (staff; the caller's check) and apply exactly its values,
    in one transaction; the request afterwards. ``ChangeConflict`` (nothing changes) when it is not pending, or
    its target is gone or changed since, or the rules refuse its values now; ``ChangeRequest.DoesNotExist``
    for an unknown id. Two approvals at once apply it once: the second's compare-and-set waits for the first's
    row lock and then finds it approved."""
    change = ChangeRequest.objects.select_related("team", "requested_by").get(pk=change_id)
    with transaction.atomic():
        before = audit.snapshot(change)
        _decide(change, user, ChangeRequest.State.APPROVED, note, decided_by=user, decided_at=timezone.now(),
                decision_note=note)
        applied = _apply(change, user)
        ChangeRequest.objects.filter(pk=change.pk).update(applied_id=applied.pk)
        _audit_decision(change, user, before)
        transaction.on_commit(lambda: notify_requester(change.pk))
    change.refresh_from_db()
    return change


def decline(change_id: int, user, note: str) -> ChangeRequest:
    """Decline pending request ``change_id`` as ``user`` (staff; the caller's check) with ``note`` (why; required,
    ``serializers.ValidationError`` on ``note`` if blank); nothing else changes. ``ChangeConflict`` when it is
    not pending."""
    if not (note or "").strip():
        raise serializers.ValidationError({"note": ["say why the request is declined"]})
    change = ChangeRequest.objects.get(pk=change_id)
    with transaction.atomic():
        before = audit.snapshot(change)
        _decide(change, user, ChangeRequest.State.DECLINED, note.strip(), decided_by=user,
                decided_at=timezone.now(), decision_note=note.strip())
        _audit_decision(change, user, before)
        transaction.on_commit(lambda: notify_requester(change.pk))
    change.refresh_from_db()
    return change


def withdraw(change_id: int, user) -> ChangeRequest:
    """Withdraw pending request ``change_id`` as its requester ``user`` (the caller's check); nothing else
    changes and nobody is mailed. ``ChangeConflict`` when it is not pending."""
    change = ChangeRequest.objects.get(pk=change_id)
    with transaction.atomic():
        _decide(change, user, ChangeRequest.State.WITHDRAWN, "", decided_at=timezone.now())
    change.refresh_from_db()
    return change


def describe(change: ChangeRequest) -> str:
    """One line: what ``change`` asks for (``quota 3 of alpha: nominal_gpus=8``)."""
    what = f"{change.kind} {change.target_id}" if change.target_id else f"a new {change.kind}"
    values = ", ".join(f"{name}={value}" for name, value in change.payload.items())
    return f"{what} of {change.team.slug}: {values}"


def notify_requester(change_id: int) -> bool:
    """Mail the requester of decided request ``change_id`` the decision and its note (Django mail from
    ``DEFAULT_FROM_EMAIL``); False when they have no address or the request is undecided."""
    change = ChangeRequest.objects.select_related("team", "requested_by", "decided_by").get(pk=change_id)
    email = change.requested_by.email if change.requested_by else ""
    if not email or change.state not in (ChangeRequest.State.APPROVED, ChangeRequest.State.DECLINED):
        return False
    who = change.decided_by.username if change.decided_by else "platform staff"
    send_mail(
        subject=f"[controlplane] {change.team.slug}: change request {change.pk} {change.state}",
        message=(f"Your request {change.pk} ({describe(change)}) was {change.state} by {who}.\n"
                 f"Your reason: {change.reason}\n"
                 + (f"Note: {change.decision_note}\n" if change.decision_note else "")),
        from_email=settings.DEFAULT_FROM_EMAIL, recipient_list=[email],
    )
    return True
