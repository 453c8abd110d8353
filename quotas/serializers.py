"""Serializers of teams (with members and roles), GPU quotas and money budgets: the write rules of the quotas app.

They live beside the models, not in ``quotas.api``, because the REST API, the change requests
(``quotas.changes``, which the web UI and the API both call) and their approval apply the same rules with
them. Teams are named by slug, accelerators and clusters by name. A team the user does not belong to is
reported as unknown, exactly like a missing one. The requesting user comes from the context's ``user``,
else from its ``request``.
"""

from __future__ import annotations

import math
from decimal import Decimal

from django.db import IntegrityError, transaction
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.validators import UniqueValidator

from core.fields import (
    INT32_MAX,
    AwareDateTimeField,
    ListedChoiceField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
)
from core.limits import THRESHOLD_MAX_PERCENT, threshold_out_of_range
from runners.models import Accelerator, Cluster

from .models import (
    CPU_FLAVOR,
    GPU_QUOTA_FIELDS,
    VCPU_QUOTA_FIELDS,
    AuditRecord,
    Budget,
    ChangeRequest,
    ChangeRequestEvent,
    Cohort,
    CohortQuota,
    Membership,
    PriorityClass,
    QueueingStrategy,
    Quota,
    Team,
    parent_cycle,
    quota_unit_errors,
)

# Alert thresholds are percent of the budget; above 100 warns of overspending, up to ten times the amount.


def team_fixed_after_creation(instance, team: Team, noun: str) -> Team:
    """``team`` when ``instance`` (a stored quota or budget, or None on create) belongs to it; raises
    ValidationError ("a <noun> cannot move to another team") otherwise: a team's quota or budget stays its own."""
    if instance is not None and team.pk != instance.team_id:
        raise serializers.ValidationError(f"a {noun} cannot move to another team")
    return team


class MemberSerializer(serializers.ModelSerializer):
    """A team member: username and role (``admin``, ``member``, ``viewer``)."""

    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role"]
        read_only_fields = fields


class TeamSerializer(serializers.ModelSerializer):
    """A team with its members and their roles, its cohort (name, null: the default cohort) and fair-share weight."""

    members = MemberSerializer(source="memberships", many=True, read_only=True)
    cohort = serializers.CharField(source="cohort.name", read_only=True, default=None, allow_null=True)
    weight = serializers.DecimalField(max_digits=8, decimal_places=3, read_only=True)
    queueing_strategy = serializers.CharField(read_only=True)

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "cost_center", "created_at", "members", "cohort", "weight", "queueing_strategy"]
        read_only_fields = fields


def context_user(context: dict):
    """The user a serializer acts for: ``context["user"]`` (domain callers), else the request's user (views)."""
    return context["user"] if "user" in context else context["request"].user


class NoNulLookupMixin:
    """Refuse a lookup value holding NUL as invalid (400): PostgreSQL text cannot hold one, so the query itself
    would fail with a DataError (a 500) instead of finding no row."""

    def to_internal_value(self, data):
        if isinstance(data, str) and "\x00" in data:
            self.fail("invalid")
        return super().to_internal_value(data)


class VisibleTeamField(NoNulLookupMixin, serializers.SlugRelatedField):
    """A team by slug, looked up among the requesting user's teams only (all teams for staff)."""

    default_error_messages = {
        "does_not_exist": 'unknown team "{value}", or you are not a member of it',
        "invalid": "Expected a team slug.",
    }

    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", **kwargs)

    def get_queryset(self):
        return Team.objects.visible_to(context_user(self.context))


class NamedField(NoNulLookupMixin, serializers.SlugRelatedField):
    """A related object by its ``name``, with an error that says which kind of object is unknown."""

    def __init__(self, kind: str, **kwargs):
        kwargs.setdefault("error_messages", {})["does_not_exist"] = f'unknown {kind} "{{value}}"'
        super().__init__(slug_field="name", **kwargs)


class QuotaSerializer(serializers.ModelSerializer):
    """A team's GPU quota for one accelerator (optionally one cluster), in whole GPUs; or its CPU quota (accelerator
    ``CPU``), in whole vCPUs.

    Input: ``team`` (slug, fixed after creation), ``accelerator`` (name),
    ``cluster`` (name or null for all clusters), ``nominal_gpus``,
    ``borrowing_limit_gpus`` and ``max_gpus_per_job`` (integers >= 0; 0 means
    no per-job cap), ``lending_limit_gpus`` (null: all of nominal may be lent
    to the cohort; else at most nominal). ``limit_gpus`` = nominal + borrowing
    limit; ``reachable_gpus`` = what the team can actually hold: that limit,
    at most nominal + what the other teams of its cohort can lend (the number
    admission, the preview and the dashboard use). 400 on a duplicate (team,
    accelerator, cluster).

    A quota with a ``cluster`` is a cap: the team holds at most its
    ``limit_gpus`` of that accelerator on that cluster, inside its team-wide
    quota (the row without a cluster), which alone decides admission and
    fair share (docs/adr/0005-per-cluster-quotas-are-caps.md).

    A CPU quota (accelerator ``CPU``, Kueue's ``cpu`` resource of the CPU
    flavor) takes ``nominal_vcpus`` (required), ``borrowing_limit_vcpus``,
    ``max_vcpus_per_job`` and ``lending_limit_vcpus`` instead, with the same
    meanings in vCPUs (1 vCPU = 1,000 millicores of pod requests), and
    shows ``limit_vcpus`` and ``reachable_vcpus``; it has no cluster. 400
    when a quota gives numbers of the other unit, or a lending limit above
    its nominal (``quotas.models.quota_unit_errors``). A team without a CPU
    quota runs CPU-only jobs quota-free (ADR 0012).
    """

    team = VisibleTeamField()
    accelerator = NamedField("accelerator", queryset=Accelerator.objects.all())
    cluster = NamedField("cluster", queryset=Cluster.objects.all(), allow_null=True, required=False)
    nominal_gpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False)
    borrowing_limit_gpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, default=0)
    max_gpus_per_job = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, default=0)
    lending_limit_gpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, allow_null=True,
                                            default=None)
    limit_gpus = serializers.IntegerField(read_only=True)
    reachable_gpus = serializers.SerializerMethodField()
    nominal_vcpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False)
    # Omitted on a create or a PUT, these fall back to their defaults as the GPU fields do; PATCH keeps them.
    borrowing_limit_vcpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, default=0)
    max_vcpus_per_job = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, default=0)
    lending_limit_vcpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, allow_null=True,
                                             default=None)
    limit_vcpus = serializers.IntegerField(read_only=True)
    reachable_vcpus = serializers.SerializerMethodField()

    class Meta:
        model = Quota
        fields = ["id", "team", "accelerator", "cluster", "nominal_gpus", "borrowing_limit_gpus", "max_gpus_per_job",
                  "lending_limit_gpus", "limit_gpus", "reachable_gpus", "nominal_vcpus", "borrowing_limit_vcpus",
                  "max_vcpus_per_job", "lending_limit_vcpus", "limit_vcpus", "reachable_vcpus"]
        validators = []  # uniqueness is checked in validate(), with a message that names the quota

    def get_reachable_gpus(self, quota: Quota) -> int:
        return 0 if quota.is_cpu else quota.reachable_gpus()

    def get_reachable_vcpus(self, quota: Quota) -> int:
        return quota.reachable_vcpus() if quota.is_cpu else 0

    def validate_team(self, team: Team) -> Team:
        return team_fixed_after_creation(self.instance, team, "quota")

    def validate(self, attrs):
        def current(name):
            return attrs[name] if name in attrs else getattr(self.instance, name, None)

        team, accelerator, cluster = current("team"), current("accelerator"), current("cluster")
        is_cpu = accelerator is not None and accelerator.name == CPU_FLAVOR
        required = "nominal_vcpus" if is_cpu else "nominal_gpus"
        if (self.instance is None or not self.partial) and required not in attrs:  # create and PUT; PATCH keeps it
            what = "a CPU quota counts vCPUs" if is_cpu else "a GPU quota counts GPUs"
            raise serializers.ValidationError({required: [f"This field is required: {what}."]})
        errors = quota_unit_errors(is_cpu, cluster is not None,
                                   {f: current(f) for f in (*GPU_QUOTA_FIELDS, *VCPU_QUOTA_FIELDS)})
        if errors:
            raise serializers.ValidationError(errors)
        clash = Quota.objects.filter(team=team, accelerator=accelerator, cluster=cluster)
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            where = f"cluster {cluster.name}" if cluster else "all clusters"
            raise serializers.ValidationError(
                {"accelerator": [f"team {team.slug} already has a {accelerator.name} quota for {where}"]}
            )
        return attrs


@extend_schema_field({"type": "array", "items": {"type": "number", "minimum": 0, "exclusiveMinimum": True,
                                                  "maximum": THRESHOLD_MAX_PERCENT}})
class ThresholdListField(serializers.Field):
    """Alert thresholds: a list of numbers in (0, 1000] percent of the budget; stored sorted, without repeats.

    An empty list stands for the default ``[50, 80, 100]``.
    """

    default_error_messages = {
        "not_a_list": "Expected a list of numbers (percent of the budget).",
        "not_a_number": "Item {index} is not a number.",
        "out_of_range": f"Item {{index}} ({{value}}) is outside (0, {THRESHOLD_MAX_PERCENT}] percent.",
    }

    def to_internal_value(self, data):
        if not isinstance(data, list):
            self.fail("not_a_list")
        for index, value in enumerate(data):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                self.fail("not_a_number", index=index)
            if threshold_out_of_range(value):
                self.fail("out_of_range", index=index, value=value)
        return sorted(set(data))

    def to_representation(self, value):
        return list(value)


class BudgetSerializer(serializers.ModelSerializer):
    """A team's money for a period, USD.

    Input: ``team`` (slug, fixed after creation), ``period`` (``monthly``,
    ``quarterly``, or ``custom`` with aware ``starts_at`` < ``ends_at``),
    ``amount_usd`` (Decimal > 0, cents; send it as a string to keep it exact),
    ``alert_thresholds`` (see ThresholdListField), ``action`` (``alert`` or
    ``block``) and ``stop_running`` (bool). ``window_start``/``window_end``
    show the period in force now.
    """

    team = VisibleTeamField()
    period = serializers.ChoiceField(choices=Budget.Period.choices, required=False, default=Budget.Period.MONTHLY)
    starts_at = AwareDateTimeField(required=False, allow_null=True)
    ends_at = AwareDateTimeField(required=False, allow_null=True)
    amount_usd = serializers.DecimalField(max_digits=14, decimal_places=2)
    alert_thresholds = ThresholdListField(required=False, default=list)
    action = serializers.ChoiceField(choices=Budget.Action.choices, required=False, default=Budget.Action.ALERT)
    stop_running = StrictBooleanField(required=False, default=False)
    window_start = serializers.SerializerMethodField()
    window_end = serializers.SerializerMethodField()

    class Meta:
        model = Budget
        fields = ["id", "team", "period", "starts_at", "ends_at", "amount_usd", "alert_thresholds", "action",
                  "stop_running", "window_start", "window_end"]

    def validate_team(self, team: Team) -> Team:
        return team_fixed_after_creation(self.instance, team, "budget")

    def validate_amount_usd(self, value):
        if value <= 0:
            raise serializers.ValidationError("Must be greater than 0.")
        return value

    def validate(self, attrs):
        def current(name):
            return attrs[name] if name in attrs else getattr(self.instance, name, None)

        period, starts_at, ends_at = current("period"), current("starts_at"), current("ends_at")
        if period == Budget.Period.CUSTOM:
            errors = {name: ["required for a custom period"] for name, value in
                      (("starts_at", starts_at), ("ends_at", ends_at)) if value is None}
            if errors:
                raise serializers.ValidationError(errors)
            if ends_at <= starts_at:
                raise serializers.ValidationError({"ends_at": ["must be after starts_at"]})
        elif starts_at is not None or ends_at is not None:
            raise serializers.ValidationError(
                {"period": [f"starts_at and ends_at apply to custom periods only, not {period}"]}
            )
        return attrs

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_window_start(self, budget: Budget):
        return self._window(budget)[0]

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_window_end(self, budget: Budget):
        return self._window(budget)[1]

    def _window(self, budget: Budget):
        start, end = budget.window()
        field = serializers.DateTimeField()
        return (field.to_representation(start) if start else None, field.to_representation(end) if end else None)


class CohortQuotaViewSerializer(serializers.ModelSerializer):
    """A cohort's own quota of one accelerator, as its cohort shows it (read only)."""

    accelerator = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = CohortQuota
        fields = ["id", "accelerator", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"]
        read_only_fields = fields


class LostRaceAnswers400Mixin:
    """For a ModelSerializer whose model has unique fields: ``create`` and ``update`` save in a savepoint, and a
    uniqueness race lost to another request (the serializer's checks passed, the insert or update met the other's
    committed row: PostgreSQL's ``unique_violation``) answers 400 with ``lost_race_errors(data)`` (``{field:
    [reason]}``, as the checks would have answered had they run after the other request), not an
    ``IntegrityError`` and a 500. The savepoint keeps the caller's transaction usable."""

    def lost_race_errors(self, data: dict) -> dict[str, list[str]]:
        """The 400's errors for validated ``data`` whose save lost a uniqueness race; override per model."""
        return {"non_field_errors": ["conflicts with another object saved at the same time"]}

    def create(self, validated_data):
        return self._saved(lambda: super(LostRaceAnswers400Mixin, self).create(validated_data), validated_data)

    def update(self, instance, validated_data):
        return self._saved(lambda: super(LostRaceAnswers400Mixin, self).update(instance, validated_data),
                           validated_data)

    def _saved(self, save, data: dict):
        try:
            with transaction.atomic():
                return save()
        except IntegrityError as exc:
            raise serializers.ValidationError(self.lost_race_errors(data)) from exc


class CohortSerializer(LostRaceAnswers400Mixin, serializers.ModelSerializer):
    """A cohort (a slug ``name``), the slugs of its teams, its place in a tree of cohorts (ADR 0046): ``parent``
    (a cohort's name, null: a root), ``children`` (names, read only), ``weight`` (> 0, its fair-sharing weight
    among its siblings) and its own ``quotas`` (read only; written at ``cohort-quotas/``). Teams without a cohort
    share the default one. 400 on ``parent`` when the parent chain would loop back to the cohort or be deeper than
    ``quotas.models.MAX_COHORT_DEPTH``."""

    teams = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)
    parent = NamedField("cohort", queryset=Cohort.objects.all(), allow_null=True, required=False)
    children = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    weight = serializers.DecimalField(max_digits=8, decimal_places=3, min_value=Decimal("0.001"), required=False)
    quotas = CohortQuotaViewSerializer(many=True, read_only=True)

    class Meta:
        model = Cohort
        fields = ["id", "name", "parent", "children", "weight", "quotas", "teams", "created_at"]
        read_only_fields = ["id", "teams", "children", "quotas", "created_at"]

    def lost_race_errors(self, data: dict) -> dict[str, list[str]]:
        """A cohort of this name was stored by another request since the check: 400 on ``name``."""
        return {"name": ["cohort with this name already exists."]}

    def validate_parent(self, parent: Cohort | None) -> Cohort | None:
        loop = parent_cycle(self.instance.pk if self.instance is not None else None,
                            parent.pk if parent is not None else None)
        if loop:
            raise serializers.ValidationError(loop)
        return parent


class CohortQuotaSerializer(LostRaceAnswers400Mixin, serializers.ModelSerializer):
    """A cohort's own quota of one GPU accelerator (ADR 0046): ``cohort`` (name, fixed after creation),
    ``accelerator`` (name; not the CPU flavor), ``nominal_gpus`` (whole GPUs its subtree shares),
    ``borrowing_limit_gpus`` (the most its subtree may use above all the nominal inside it; null: no limit) and
    ``lending_limit_gpus`` (the most of its subtree's idle quota teams outside it may use; null: all). 400 on a
    duplicate (cohort, accelerator)."""

    cohort = NamedField("cohort", queryset=Cohort.objects.all())
    accelerator = NamedField("accelerator", queryset=Accelerator.objects.all())
    nominal_gpus = StrictIntegerField(min_value=0, max_value=INT32_MAX)
    borrowing_limit_gpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, allow_null=True,
                                              default=None)
    lending_limit_gpus = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, allow_null=True,
                                            default=None)

    class Meta:
        model = CohortQuota
        fields = ["id", "cohort", "accelerator", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"]
        validators = []  # uniqueness is checked in validate(), with a message that names the quota

    def lost_race_errors(self, data: dict) -> dict[str, list[str]]:
        """A quota of this cohort and accelerator was stored by another request since the check: 400 on
        ``accelerator``, as ``validate`` answers."""
        cohort = data.get("cohort", getattr(self.instance, "cohort", None))
        accelerator = data.get("accelerator", getattr(self.instance, "accelerator", None))
        return {"accelerator": [f"cohort {cohort} already has a quota of {getattr(accelerator, 'name', accelerator)}: "
                                "change that one"]}

    def validate_cohort(self, cohort: Cohort) -> Cohort:
        if self.instance is not None and cohort.pk != self.instance.cohort_id:
            raise serializers.ValidationError("a cohort quota's cohort is fixed: create one for the other cohort")
        return cohort

    def validate_accelerator(self, accelerator: Accelerator) -> Accelerator:
        if accelerator.name == CPU_FLAVOR:
            raise serializers.ValidationError("a cohort quota counts GPUs: the CPU flavor is not shared by cohorts")
        return accelerator

    def validate(self, attrs):
        cohort = attrs.get("cohort", getattr(self.instance, "cohort", None))
        accelerator = attrs.get("accelerator", getattr(self.instance, "accelerator", None))
        same = CohortQuota.objects.filter(cohort=cohort, accelerator=accelerator)
        if self.instance is not None:
            same = same.exclude(pk=self.instance.pk)
        if cohort is not None and accelerator is not None and same.exists():
            raise serializers.ValidationError(
                {"accelerator": [f"cohort {cohort} already has a quota of {accelerator.name}: change that one"]})
        return attrs


class TeamFairShareSerializer(serializers.ModelSerializer):
    """A team's place in fair sharing: ``cohort`` (name, or null for the default cohort), ``weight`` (> 0) and
    ``queueing_strategy`` (Kueue's ``BestEffortFIFO``, the default, or ``StrictFIFO``)."""

    cohort = NamedField("cohort", queryset=Cohort.objects.all(), allow_null=True, required=False)
    weight = serializers.DecimalField(max_digits=8, decimal_places=3, min_value=Decimal("0.001"), required=False)
    queueing_strategy = serializers.ChoiceField(choices=QueueingStrategy.choices, required=False)

    class Meta:
        model = Team
        fields = ["slug", "cohort", "weight", "queueing_strategy"]
        read_only_fields = ["slug"]


class PriorityClassSerializer(serializers.ModelSerializer):
    """A named job priority: ``name`` (slug), ``value`` (integer, higher goes first, unique), ``description``."""

    # Declared here, so ModelSerializer does not add the model's uniqueness check: it is spelled out.
    value = StrictIntegerField(min_value=-INT32_MAX, max_value=INT32_MAX,
                               validators=[UniqueValidator(queryset=PriorityClass.objects.all())])

    class Meta:
        model = PriorityClass
        fields = ["id", "name", "value", "description"]

    def create(self, validated_data):
        return self._saved(lambda: super(PriorityClassSerializer, self).create(validated_data), validated_data)

    def update(self, instance, validated_data):
        return self._saved(lambda: super(PriorityClassSerializer, self).update(instance, validated_data),
                           validated_data, instance)

    def _saved(self, save, data: dict, instance=None):
        """``save()`` in a savepoint; a uniqueness race lost to another request (the check above passed, the
        insert met the other's row) answers 400 on the field, as the check would have, not an IntegrityError."""
        try:
            with transaction.atomic():
                return save()
        except IntegrityError as exc:
            others = PriorityClass.objects.exclude(pk=getattr(instance, "pk", None))
            errors = {field: [f"priority class with this {field} already exists."]
                      for field in ("name", "value") if field in data and others.filter(**{field: data[field]}).exists()}
            raise serializers.ValidationError(
                errors or {"non_field_errors": ["conflicts with another priority class"]}) from exc


class ChangeRequestEventSerializer(serializers.ModelSerializer):
    """One state change of a change request: ``from_state`` (empty: its creation), ``to_state``, who, when, note."""

    actor = serializers.CharField(source="actor.username", read_only=True, default=None, allow_null=True)

    class Meta:
        model = ChangeRequestEvent
        fields = ["from_state", "to_state", "actor", "note", "created_at"]
        read_only_fields = fields


class ChangeRequestSerializer(serializers.ModelSerializer):
    """A request for a quota or budget change (ADR 0029).

    Input: ``team`` (slug, one of the user's teams), ``kind`` (``quota`` or ``budget``), ``target`` (the id of
    the team's quota or budget to change; null or left out: a new one), ``payload`` (the requested values, as
    the staff write path takes them: the fields to change of the target, or a create's body without
    ``team``; checked by the same rules, so 400 names ``payload`` and the field) and ``reason`` (text, at
    most 2,000 characters). ``base`` shows the target's values when it was requested: approval refuses (409)
    when they changed since. ``state``: ``pending``, then ``approved``, ``declined`` or ``withdrawn``;
    ``applied`` is the id of the quota or budget an approval created or changed.
    """

    team = VisibleTeamField()
    kind = ListedChoiceField(choices=ChangeRequest.Kind.choices)
    target = StrictIntegerField(source="target_id", min_value=1, max_value=2**63 - 1, required=False,
                                allow_null=True, default=None)
    payload = serializers.JSONField(help_text="the requested values: the fields of the quota or budget to set")
    reason = StrictCharField(max_length=2000, help_text="why the team needs the change")
    requested_by = serializers.CharField(source="requested_by.username", read_only=True, default=None,
                                         allow_null=True)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True, default=None, allow_null=True)
    applied = serializers.IntegerField(source="applied_id", read_only=True, allow_null=True)
    events = ChangeRequestEventSerializer(many=True, read_only=True)

    class Meta:
        model = ChangeRequest
        fields = ["id", "team", "kind", "target", "payload", "reason", "base", "state", "requested_by", "created_at",
                  "decided_by", "decided_at", "decision_note", "applied", "events"]
        read_only_fields = ["id", "base", "state", "requested_by", "created_at", "decided_by", "decided_at",
                            "decision_note", "applied", "events"]


class ChangeDecisionSerializer(serializers.Serializer):
    """A decision's ``note``: optional on an approval, required on a decline (what the requester is told)."""

    note = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


class AuditRecordSerializer(serializers.ModelSerializer):
    """One audit record (ADR 0031): ``at`` (UTC), ``actor`` (username; null: the system), ``action``, the object
    (``object_type``, ``object_id``, ``object_repr``), ``team`` (slug; null: a platform-wide object), its audited
    values ``before`` and ``after`` (money as decimal strings; credentials as ``set``, ``empty`` or ``credential
    changed``) and the ``reason`` given. Read only."""

    actor = serializers.SerializerMethodField()
    team = serializers.SerializerMethodField()

    class Meta:
        model = AuditRecord
        fields = ["id", "at", "actor", "action", "object_type", "object_id", "object_repr", "team", "before", "after",
                  "reason"]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "nullable": True})
    def get_actor(self, record: AuditRecord) -> str | None:
        """The actor's username as it was (the user may be deleted since); null for the system."""
        return record.actor_name or None

    @extend_schema_field({"type": "string", "nullable": True})
    def get_team(self, record: AuditRecord) -> str | None:
        """The team's slug; null for a platform-wide object or a team deleted since."""
        try:
            return record.team.slug if record.team_id else None
        except Team.DoesNotExist:
            return None
