"""Validation of a submitted job (JSON or YAML) into the normalized spec and the columns admission reads.

Errors are field-keyed JSON with flat dotted paths, e.g.
``{"spec.resources.gpus_per_node": ["..."]}``; nothing is stored for a rejected request.

The fields are declared once, in ``jobs.specfields.SUBMISSION``; this module builds from that table the
DRF serializers (``JobSubmissionSerializer`` and its nested ones) and the plain checks of the fast path
(``fast_submission``), and holds the rules a single field cannot state (lookups, kind rules, size limit),
each written once and used by both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.db.models import Max, Q
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.settings import api_settings
from rest_framework.utils.serializer_helpers import ReturnDict

from django.contrib.auth import get_user_model

from core.fields import (
    INT32_MAX,
    ListedChoiceField,
    SharedFieldsMixin,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
)
from core.lookups import LookupCache
from quotas.models import Membership, Team, priority_classes
from runners.models import CPU_ACCELERATOR, Accelerator, NodePool

from .efficiency.memory import Layout, declaration_errors, fit_errors
from .models import Job
from .specfields import DNS_1123_LABEL, DNS_1123_LABEL_MAX, ENV_NAME, SUBMISSION, FieldType, SpecField, field_at, kind_specific

SUBMIT_ROLES = (Membership.Role.ADMIN, Membership.Role.MEMBER)

# Rows every submission reads, cached per process for settings.LOOKUP_CACHE_SECONDS (core.lookups).
ACCELERATORS = LookupCache("accelerators").invalidate_on(Accelerator, NodePool)
MEMBERSHIPS = LookupCache("memberships").invalidate_on(Membership, Team, get_user_model())


def flatten_errors(detail, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as ``{"a.b.c": [messages]}``.

    A nested serializer's ``non_field_errors`` belong to the nested field
    itself (``spec``), list items get their index (``spec.command.1``), and
    only the top level keeps ``non_field_errors``.
    """
    if isinstance(detail, Mapping):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            if key == api_settings.NON_FIELD_ERRORS_KEY and prefix:
                path = prefix
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            for sub_path, messages in flatten_errors(value, path).items():
                flat.setdefault(sub_path, []).extend(messages)
        return flat
    if isinstance(detail, list) and any(isinstance(item, (Mapping, list)) for item in detail):
        flat = {}
        for index, item in enumerate(detail):
            if item:
                flat.update(flatten_errors(item, f"{prefix}.{index}"))
        return flat
    key = prefix or api_settings.NON_FIELD_ERRORS_KEY
    return {key: [str(m) for m in (detail if isinstance(detail, list) else [detail])]}


def spec_size_bytes(spec) -> int:
    """Bytes of ``spec``'s compact UTF-8 JSON encoding (what ``settings.JOB_SPEC_MAX_BYTES`` limits)."""
    return len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def accelerator_named(value: str) -> Accelerator:
    """The Accelerator called ``value``, annotated with ``largest_pool_gpus`` (GPUs per node of its largest node
    pool that has nodes; None when none has). Cached per process (``ACCELERATORS``). Raises ValidationError for
    an unknown name, listing the known ones."""
    # One query: the accelerator and the largest node pool offering it; a pool kept with 0 nodes (gone from its
    # cluster, still referenced by attempts) offers nothing.
    accelerator = ACCELERATORS.get(value, lambda: Accelerator.objects.filter(name=value).annotate(
        largest_pool_gpus=Max("node_pools__gpus_per_node", filter=Q(node_pools__nodes__gt=0))).first())
    if accelerator is None:
        known = ", ".join(Accelerator.objects.values_list("name", flat=True))
        raise serializers.ValidationError(f'unknown accelerator "{value}"; known: {known or "none"}')
    return accelerator


def team_for_submission(user, slug: str) -> Team:
    """The team ``slug`` if ``user`` may submit jobs to it (its admin or member, or platform staff).

    Raises ValidationError otherwise; a team the user does not belong to gets the same message as an unknown
    one, so the API does not reveal which teams exist. Memberships are cached per process (``MEMBERSHIPS``).
    """
    role = None
    if user.is_staff:
        team = MEMBERSHIPS.get(("staff", slug), lambda: Team.objects.filter(slug=slug).first())
    else:  # one query: the membership with its team (none: unknown team, or not a member)
        membership = MEMBERSHIPS.get((user.pk, slug), lambda: Membership.objects.select_related("team").filter(
            team__slug=slug, user=user).first())
        team, role = (membership.team, membership.role) if membership is not None else (None, None)
    if team is None:
        raise serializers.ValidationError(f'unknown team "{slug}", or you are not a member of it')
    if not user.is_staff and role not in SUBMIT_ROLES:
        raise serializers.ValidationError(f'your role in team "{slug}" is {role}; only admins and members may submit jobs')
    return team


@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True})
class PositiveNumberField(serializers.Field):
    """A finite number above zero (integer or float, not a string or boolean), returned unchanged."""

    default_error_messages = {"invalid": "A number is required.", "not_positive": "Must be greater than 0.",
                              "too_large": "Too large: at most about 1.8e308."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        try:
            finite = math.isfinite(data)
        except OverflowError:  # an integer beyond any float (JSON allows any number of digits)
            self.fail("too_large")
        if not finite:
            self.fail("invalid")
        if data <= 0:
            self.fail("not_positive")
        return data

    def to_representation(self, value):
        return value


@extend_schema_field({"type": "array", "items": {"type": "string"}})
class StringListField(serializers.Field):
    """A list of strings; ``allow_empty=False`` also refuses ``[]`` and empty strings in it."""

    default_error_messages = {
        "not_a_list": "Expected a list of strings.",
        "empty": "Must be a non-empty list of strings.",
        "not_a_string": "Item {index} is not a string.",
        "blank_item": "Item {index} is an empty string.",
        "null_character": "Item {index} contains a NUL character (\\x00).",
    }

    def __init__(self, *, allow_empty: bool = True, choices=None, **kwargs):
        self.allow_empty = allow_empty
        self.choices = tuple(choices) if choices is not None else None
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, list):
            self.fail("not_a_list")
        if not data and not self.allow_empty:
            self.fail("empty")
        for index, item in enumerate(data):
            if not isinstance(item, str):
                self.fail("not_a_string", index=index)
            if not self.allow_empty and not item:
                self.fail("blank_item", index=index)
            if "\x00" in item:
                self.fail("null_character", index=index)
            if self.choices is not None and item not in self.choices:
                raise serializers.ValidationError(f'unknown value "{item}"; one of {", ".join(self.choices)}')
        return list(data)

    def to_representation(self, value):
        return list(value)


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class EnvField(serializers.Field):
    """Environment variables: a mapping of POSIX names (``[A-Za-z_][A-Za-z0-9_]*``) to string values."""

    default_error_messages = {
        "not_a_dict": "Expected a mapping of variable names to string values.",
        "bad_name": 'invalid environment variable name "{name}": names must match [A-Za-z_][A-Za-z0-9_]*',
        "bad_value": 'the value of environment variable "{name}" must be a string',
        "null_character": 'the value of environment variable "{name}" contains a NUL character (\\x00)',
    }

    def to_internal_value(self, data):
        if not isinstance(data, Mapping):
            self.fail("not_a_dict")
        for name, value in data.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                self.fail("bad_name", name=name)
            if not isinstance(value, str):
                self.fail("bad_value", name=name)
            if "\x00" in value:
                self.fail("null_character", name=name)
        return dict(data)

    def to_representation(self, value):
        return dict(value)


class StrictSerializer(serializers.Serializer):
    """A serializer that refuses keys it does not declare (a typo must not be silently dropped)."""

    def to_internal_value(self, data):
        if not isinstance(data, Mapping):
            return super().to_internal_value(data)  # raises DRF's "Invalid data. Expected a dictionary"
        unknown = sorted(str(key) for key in data if key not in self.fields)
        errors = {key: [f"unknown field; expected one of {', '.join(self.fields)}"] for key in unknown}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            errors = {**exc.detail, **errors}
        if errors:
            raise serializers.ValidationError(errors)
        return value


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"}], "nullable": True})
class JobReferenceField(serializers.Field):
    """A job by id (a positive integer) or by name (a DNS-1123 label), or null; returned unchanged (the lookup,
    which needs the submission's team, is :func:`checkpoint_job`)."""

    default_error_messages = {"invalid": "Expected a job id (a positive integer) or a job name (a DNS-1123 label, "
                                         "as job names are)."}

    def __init__(self, **kwargs):
        kwargs["allow_null"] = True
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, str)):
            self.fail("invalid")
        if isinstance(data, int) and not 1 <= data <= INT32_MAX or isinstance(data, str) and not (
                len(data) <= DNS_1123_LABEL_MAX and DNS_1123_LABEL.fullmatch(data)):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


def checkpoint_job(team: Team, ref: int | str) -> int:
    """The id of the training job ``ref`` of ``team`` whose checkpoint a serving job loads.

    ``ref``: a job id, or a job name (the team's latest SUCCEEDED training job of that name, else its latest
    training job of that name). Raises ValidationError naming what was not found or why it does not fit.
    """
    jobs = Job.objects.filter(team=team)
    if isinstance(ref, int):
        job = jobs.filter(pk=ref).only("pk", "kind").first()
        if job is None:
            raise serializers.ValidationError(f'no job {ref} in team "{team.slug}"')
        if job.kind != Job.Kind.TRAINING:
            raise serializers.ValidationError(f"job {ref} is an {job.kind} job; checkpoint_from names a training job")
        return job.pk
    named = jobs.filter(name=ref, kind=Job.Kind.TRAINING).order_by("-created_at", "-id")
    job_id = (named.filter(state="SUCCEEDED").values_list("pk", flat=True).first()
              or named.values_list("pk", flat=True).first())
    if job_id is None:
        raise serializers.ValidationError(f'no training job named "{ref}" in team "{team.slug}"; submit it first '
                                          f"(or give the training job's id)")
    return job_id


class PriorityClassField(serializers.ChoiceField):
    """A priority class name from the ``quotas.PriorityClass`` table, read when the spec is validated."""

    def to_internal_value(self, data):
        # Read per call, and without storing anything on the field: it is shared between requests.
        names = list(priority_classes())
        if isinstance(data, str) and data in names:
            return data
        raise serializers.ValidationError(f'unknown priority "{data}"; one of {", ".join(names)}', code="invalid_choice")


class PatternCharField(StrictCharField):
    """A StrictCharField whose valid value must also match ``pattern`` in full (else ``pattern_error``).

    The pattern is checked after the field's own rules (type, blank, length), so a value gets one reason at a
    time, and it stays out of the OpenAPI schema like a ``validate_<field>`` method's rule.
    """

    def __init__(self, *, pattern, pattern_error: str, **kwargs):
        self.pattern = pattern
        self.pattern_error = pattern_error
        super().__init__(**kwargs)

    def run_validation(self, data=empty):
        value = super().run_validation(data)
        if isinstance(value, str) and not self.pattern.fullmatch(value):
            raise serializers.ValidationError(self.pattern_error)
        return value


# --- The serializer fields built from the table (jobs.specfields), one builder per field type.

def _object_serializer(field: SpecField, path: str, **kwargs) -> serializers.Serializer:
    return TableSerializer.for_path(path, field)(**kwargs)


_DRF_FIELDS: dict[FieldType, Callable[..., serializers.Field]] = {
    FieldType.STRING: lambda f, path, **kw: (
        PatternCharField(pattern=f.pattern, pattern_error=f.pattern_error, max_length=f.max_length, **kw)
        if f.pattern is not None else StrictCharField(max_length=f.max_length, **kw)),
    FieldType.INTEGER: lambda f, path, **kw: StrictIntegerField(min_value=f.min_value, max_value=f.max_value, **kw),
    FieldType.BOOLEAN: lambda f, path, **kw: StrictBooleanField(**kw),
    FieldType.POSITIVE_NUMBER: lambda f, path, **kw: PositiveNumberField(**kw),
    FieldType.STRING_LIST: lambda f, path, **kw: StringListField(allow_empty=f.allow_empty, choices=f.choices, **kw),
    FieldType.ENV: lambda f, path, **kw: EnvField(**kw),
    FieldType.CHOICE: lambda f, path, **kw: ListedChoiceField(choices=list(f.choices), **kw),
    FieldType.PRIORITY: lambda f, path, **kw: PriorityClassField(choices=list(f.choices), **kw),
    FieldType.OBJECT: _object_serializer,
    FieldType.JOB_REF: lambda f, path, **kw: JobReferenceField(**kw),
}


def serializer_field(field: SpecField, path: str) -> serializers.Field:
    """The DRF field that validates ``field`` (at dotted ``path``): its type's builder, with ``required=False``
    unless the field is required, and its default unless it applies to some job kinds only (then the kind rule
    sets it, see :func:`apply_kind`)."""
    kwargs = {}
    if not field.required:
        kwargs["required"] = False
    if field.has_default and not field.kinds:
        kwargs["default"] = field.default
    return _DRF_FIELDS[field.type](field, path, **kwargs)


class TableSerializer(SharedFieldsMixin, StrictSerializer):
    """A StrictSerializer of one OBJECT of ``jobs.specfields.SUBMISSION``: its fields are built from the table.

    A subclass names the object by ``path`` (dotted, ``""`` for the submission itself) and adds what the table
    cannot say: ``validate_<field>`` for each ``looked_up`` field, and ``validate``. An OBJECT field's serializer
    is the subclass declared for its path (declare a nested one before its parent), else a plain one.
    """

    path: str | None = None
    _by_path: dict[str, type[TableSerializer]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        path = cls.__dict__.get("path")
        if path is None:
            return
        table = field_at(path)
        cls._declared_fields = {field.name: serializer_field(field, f"{path}.{field.name}" if path else field.name)
                                for field in table.fields}
        unchecked = [field.name for field in table.fields
                     if field.looked_up and not hasattr(cls, f"validate_{field.name}")]
        if unchecked:
            raise TypeError(f"{cls.__name__} must look up {', '.join(unchecked)} in validate_<field>")
        TableSerializer._by_path[path] = cls

    @classmethod
    def for_path(cls, path: str, field: SpecField) -> type[TableSerializer]:
        """The serializer class of the OBJECT ``field`` at ``path``: the declared one, else a plain one for it."""
        if path not in cls._by_path:
            name = "".join(part.capitalize() for part in field.name.split("_")) + "Serializer"
            type(name, (TableSerializer,), {"path": path, "__doc__": field.doc, "__module__": __name__})
        return cls._by_path[path]


# --- Rules that a single field cannot state, shared by the serializers and the fast path.

def spec_error(spec: Mapping) -> str | None:
    """Why ``spec`` is refused before any of its fields is read (it cannot be encoded as JSON, or its encoding is
    over ``settings.JOB_SPEC_MAX_BYTES``), or None."""
    try:
        size = spec_size_bytes(spec)
    except (TypeError, ValueError, RecursionError) as exc:  # YAML keys such as dates or bytes; deep nesting
        return f"the spec cannot be encoded as JSON: {exc}"
    if size > settings.JOB_SPEC_MAX_BYTES:
        return f"the spec's JSON encoding is {size} bytes, over the limit of {settings.JOB_SPEC_MAX_BYTES} bytes"
    return None


def pool_errors(accelerator: Accelerator, gpus_per_node: int) -> dict[str, list[str]]:
    """Errors by ``spec.resources`` field when no node pool of ``accelerator`` (from :func:`accelerator_named`)
    could ever hold a node of the job; empty when one could."""
    largest = accelerator.largest_pool_gpus
    if largest is None and accelerator.is_cpu:
        return {"accelerator": ["no CPU node pool has nodes, so a CPU-only job could never run"]}
    if largest is None:
        return {"accelerator": [f"no node pool offers {accelerator.name} GPUs, so the job could never run"]}
    if gpus_per_node > largest:
        return {"gpus_per_node": [f"{gpus_per_node} GPUs per node is more than any {accelerator.name} "
                                  f"node pool has; the maximum is {largest}"]}
    return {}


def cpu_only_errors(attrs: dict) -> dict[str, list[str]]:
    """The rules of a CPU-only job on validated ``spec.resources`` ``attrs``, errors by field: an absent accelerator
    is CPU when ``gpus_per_node`` is 0 (set in ``attrs``) and required otherwise; the CPU flavor has no GPUs, a GPU
    accelerator is not asked for 0 of them; a CPU-only job names its ``cpu`` (what places and bills it) and no
    ``alternatives``. Empty when the resources agree."""
    gpus = attrs["gpus_per_node"]
    if "accelerator" not in attrs:
        if gpus:
            return {"accelerator": ["This field is required unless gpus_per_node is 0 (a CPU-only job)."]}
        try:
            attrs["accelerator"] = accelerator_named(CPU_ACCELERATOR)
        except serializers.ValidationError:
            return {"accelerator": ["no CPU node pool has nodes, so a CPU-only job could never run"]}
    accelerator = attrs["accelerator"]
    if accelerator.is_cpu and gpus:
        return {"gpus_per_node": ["CPU node pools have no GPUs: a job on CPU asks gpus_per_node 0"]}
    if not accelerator.is_cpu and not gpus:
        return {"gpus_per_node": [f"0 GPUs is a CPU-only job, which runs on CPU node pools: leave out accelerator "
                                  f"(or give {CPU_ACCELERATOR}) instead of {accelerator.name}"]}
    if gpus:
        return {}
    errors = {}
    if attrs.get("cpu") is None:
        errors["cpu"] = ["required for a CPU-only job (gpus_per_node 0): the CPU cores per node it is placed and "
                         "billed by"]
    if attrs.get("alternatives"):
        errors["alternatives"] = ["a CPU-only job runs on CPU node pools only: no alternatives"]
    return errors


def alternative_errors(accelerator: Accelerator, alternatives: list[str]) -> dict[str, list[str]]:
    """Errors of ``spec.resources.alternatives``: each must name a known accelerator, other than ``accelerator``
    and not twice; empty when all do."""
    problems = []
    for index, name in enumerate(alternatives):
        if name == accelerator.name or name in alternatives[:index]:
            problems.append(f'"{name}" is listed already')
            continue
        try:
            accelerator_named(name)
        except serializers.ValidationError as exc:
            problems.append(str(exc.detail[0]))
    return {"alternatives": problems} if problems else {}


def never_errors(team: Team, spec: Mapping) -> dict[str, list[str]]:
    """Why the validated ``spec`` (accelerator as a row) can never run for ``team``, by ``spec.resources`` field
    (``non_field_errors``: the resources as a whole), from ``jobs.scheduling.never``; empty when it could on its
    accelerator or on one of its alternatives (the accelerator's reasons are given)."""
    from .scheduling.never import never_fits

    resources = spec["resources"]
    replicas = spec.get("replicas") or 1
    errors = never_fits(team, resources["accelerator"], resources, spec.get("placement"), spec["preemptible"],
                        replicas)
    for name in resources.get("alternatives") or []:
        if not errors:
            break
        if not never_fits(team, accelerator_named(name), resources, spec.get("placement"), spec["preemptible"],
                          replicas):
            errors = {}
    return {(k or api_settings.NON_FIELD_ERRORS_KEY): v for k, v in errors.items()}


KIND_SPECIFIC = kind_specific()


def apply_kind(kind: str, spec: dict) -> dict[str, list[str]]:
    """Apply the kind rules to the validated ``spec`` in place: a field of some kinds only (``replicas``,
    ``port``) gets its default for those kinds; errors by spec field for those given to another kind, and for a
    spec with neither ``command`` nor ``args`` (nothing would say what to run: a container with ``args`` and no
    ``command`` runs the image's ENTRYPOINT with them, Kubernetes "Define a command and arguments")."""
    errors = {}
    if not spec.get("command") and not spec.get("args"):
        errors["command"] = ["required unless args are given (the image's ENTRYPOINT then runs with them)"]
    for field in KIND_SPECIFIC:
        if kind in field.kinds:
            spec.setdefault(field.name, field.default_value())
        elif field.name in spec:
            errors[field.name] = [f"{field.name} applies to {' and '.join(field.kinds)} jobs only"]
    return errors


def memory_errors(kind: str, spec: Mapping) -> dict[str, list[str]]:
    """Errors by spec field of the validated ``spec`` (``resources.accelerator`` a row) for its ``model`` and
    ``parallelism`` declaration: impossible values (``jobs.efficiency.memory.declaration_errors``), then, for a
    training job that declares a model, an estimate over the accelerator's memory per GPU with its breakdown
    and the smallest changes that fit (``fit_errors``). Empty without a declaration, as before it existed."""
    model, parallelism = spec.get("model"), spec.get("parallelism")
    resources = spec["resources"]
    if not model and not parallelism or not resources["gpus_per_node"]:
        return {}  # a CPU-only job: no GPU memory to fit, and no MFU (no accelerator peak)
    parallelism = parallelism or {}
    layout = Layout(resources["nodes"] * resources["gpus_per_node"], parallelism.get("zero_stage", 0),
                    parallelism.get("tensor_parallel", 1), parallelism.get("pipeline_parallel", 1),
                    parallelism.get("sequence_parallel", False))
    errors = declaration_errors(model, layout)
    if errors or not model or kind != Job.Kind.TRAINING:
        return errors
    accelerator = resources["accelerator"]
    others = Accelerator.objects.annotate(largest=Max("node_pools__gpus_per_node", filter=Q(node_pools__nodes__gt=0)))
    return fit_errors(model, layout, accelerator.name, accelerator.memory_gib, gpus_per_node=resources["gpus_per_node"],
                      accelerators=lambda: [(a.name, a.memory_gib) for a in others.filter(
                          largest__gte=resources["gpus_per_node"])])


def _store_plan(field: SpecField) -> tuple:
    """``(name, looked_up, default factory, child plan, left out when absent)`` per child of ``field``, for
    :func:`stored_spec` (a field of some kinds only, or one not ``kept_when_absent``, is left out when absent)."""
    plan = []
    for child in field.fields:
        default = child.default if callable(child.default) else (lambda d=child.default: d)
        plan.append((child.name, child.looked_up, default if child.has_default else (lambda: None),
                     _store_plan(child) if child.type is FieldType.OBJECT else None,
                     bool(child.kinds) or not child.kept_when_absent))
    return tuple(plan)


_SPEC_STORE_PLAN = _store_plan(SUBMISSION.child("spec"))


def stored_spec(values: Mapping, plan: tuple = _SPEC_STORE_PLAN) -> dict:
    """The validated spec ``values`` as stored on the Job, in table order: every field present (an optional one
    without default as null) except those of other job kinds and absent declarations (``kept_when_absent``
    False), a looked-up row by its name."""
    stored = {}
    for name, looked_up, default, children, left_out_when_absent in plan:
        if children is not None:
            if name in values or not left_out_when_absent:
                stored[name] = stored_spec(values.get(name) or {}, children)
        elif name in values:
            stored[name] = values[name].name if looked_up else values[name]
        elif not left_out_when_absent:
            stored[name] = default()
    return stored


def submission_fields(values: Mapping, submitter, classes: Mapping[str, int] | None = None) -> dict:
    """``submit_job``'s keyword arguments from validated submission ``values`` (team and accelerator as rows):
    team, submitter, name, kind, the stored spec, and the columns admission reads (``resources``: accelerator,
    GPUs per node, nodes, numeric priority from ``classes`` (default ``priority_classes()``), preemptible, max
    runtime in seconds, max retries, replicas: 1 for training)."""
    spec = values["spec"]
    resources = spec["resources"]
    classes = priority_classes() if classes is None else classes
    return {
        "team": values["team"],
        "submitter": submitter,
        "name": values["name"],
        "kind": values["kind"],
        "spec": stored_spec(spec),
        "resources": {
            "accelerator": resources["accelerator"],
            "gpus_per_node": resources["gpus_per_node"],
            "nodes": resources["nodes"],
            "priority": classes[spec["priority"]],
            "preemptible": spec["preemptible"],
            "max_runtime_seconds": spec["max_runtime_seconds"],
            "max_retries": spec["max_retries"],
            "replicas": spec.get("replicas") or 1,
        },
    }


# --- The job spec.

class ResourcesSerializer(TableSerializer):
    """``spec.resources``: accelerator name, GPUs per node, nodes; optional CPU cores and memory (GiB) per node."""

    path = "spec.resources"

    def validate_accelerator(self, value: str) -> Accelerator:
        return accelerator_named(value)

    def validate(self, attrs):
        errors = cpu_only_errors(attrs)
        if errors:
            raise serializers.ValidationError(errors)
        errors = alternative_errors(attrs["accelerator"], attrs.get("alternatives") or [])
        if not errors:
            errors = pool_errors(attrs["accelerator"], attrs["gpus_per_node"])
            if errors and any(not pool_errors(accelerator_named(a), attrs["gpus_per_node"])
                              for a in attrs.get("alternatives") or []):
                errors = {}  # an alternative could hold it
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class PlacementSerializer(TableSerializer):
    """``spec.placement``: allowed providers (Cluster.Provider values), regions and cluster names; empty means any."""

    path = "spec.placement"


class JobSpecSerializer(TableSerializer):
    """``spec``: what to run (image, command, args, env), on what (resources), how (priority, limits, placement).

    ``max_runtime_seconds`` is required: it bounds the cost estimate that
    admission checks against the budget. ``replicas`` (default 1) and
    ``port`` (the container port the Service targets, default 8000) apply to
    inference only.
    """

    path = "spec"

    def to_internal_value(self, data):
        # Measured before anything else, so an oversized spec costs no further work.
        if isinstance(data, Mapping):
            error = spec_error(data)
            if error is not None:
                raise serializers.ValidationError([error])
        return super().to_internal_value(data)


class JobSubmissionSerializer(TableSerializer):
    """A job submission: ``{"team", "name", "kind", "spec"}`` as in ``examples/jobs/*.yaml``.

    Validation needs ``context["request"]`` (the submitter). ``team`` must be
    a team where the submitter is an ``admin`` or ``member`` (staff may submit
    for any team); a team the user does not belong to gets the same answer as
    an unknown one, so the API does not reveal which teams exist.

    Errors (400): a dict of flat dotted paths to messages, e.g.
    ``{"spec.resources.accelerator": ['unknown accelerator "X"; ...']}``; an
    oversized spec is reported on ``spec``. After ``is_valid()``,
    :meth:`submission` gives the keyword arguments of
    ``jobs.lifecycle.submit_job``.
    """

    path = ""

    @property
    def errors(self):
        return ReturnDict(flatten_errors(super().errors), serializer=self)

    def validate_team(self, slug: str) -> Team:
        return team_for_submission(self.context["request"].user, slug)

    def validate(self, attrs):
        spec = attrs["spec"]
        errors = apply_kind(attrs["kind"], spec) or memory_errors(attrs["kind"], spec)
        if not errors and spec.get("checkpoint_from") is not None:
            try:
                spec["checkpoint_from"] = checkpoint_job(attrs["team"], spec["checkpoint_from"])
            except serializers.ValidationError as exc:
                errors = {"checkpoint_from": exc.detail}
        if errors:
            raise serializers.ValidationError({"spec": errors})
        errors = never_errors(attrs["team"], attrs["spec"])
        if errors:
            raise serializers.ValidationError({"spec": {"resources": errors}})
        return attrs

    def normalized_spec(self) -> dict:
        """The validated spec as stored on the Job: every optional key present, the accelerator by name."""
        return stored_spec(self.validated_data["spec"])

    def submission(self) -> dict:
        """Keyword arguments for ``submit_job``: team, submitter, name, kind, spec and the resource columns."""
        return submission_fields(self.validated_data, self.context["request"].user)


# --- The fast path of a plain, valid submission: the same table, checked with plain comparisons.

_REFUSED: Any = object()  # what a fast check returns for a value it does not accept unchanged


def _fast_string(f: SpecField):
    """What a StrictCharField accepts unchanged: an ASCII str, not blank, without outer whitespace or NUL."""
    max_length, pattern = f.max_length, f.pattern

    def check(value):
        if (type(value) is str and value != "" and value.isascii() and "\x00" not in value and value == value.strip()
                and (max_length is None or len(value) <= max_length)
                and (pattern is None or pattern.fullmatch(value) is not None)):
            return value
        return _REFUSED
    return check


def _fast_integer(f: SpecField):
    low, high = f.min_value, f.max_value

    def check(value):
        if type(value) is int and (low is None or low <= value) and (high is None or value <= high):
            return value
        return _REFUSED
    return check


def _fast_boolean(f: SpecField):
    return lambda value: value if type(value) is bool else _REFUSED


def _fast_positive_number(f: SpecField):
    def check(value):
        try:
            if type(value) in (int, float) and math.isfinite(value) and value > 0:
                return value
        except OverflowError:  # an int beyond any float: the serializer refuses it
            pass
        return _REFUSED
    return check


def _fast_string_list(f: SpecField):
    """What StringListField accepts: a list of str without NUL (non-empty items, and the list, if not allow_empty)."""
    allow_empty = f.allow_empty
    choices = frozenset(f.choices) if f.choices is not None else None

    def check(value):
        if type(value) is not list or (not allow_empty and not value):
            return _REFUSED
        for item in value:
            if type(item) is not str or "\x00" in item or (not allow_empty and not item):
                return _REFUSED
            if choices is not None and item not in choices:
                return _REFUSED
        return list(value)
    return check


def _fast_env(f: SpecField):
    def check(value):
        if type(value) is not dict or not all(type(k) is str and ENV_NAME.fullmatch(k) and type(v) is str
                                              and "\x00" not in v for k, v in value.items()):
            return _REFUSED
        return dict(value)
    return check


def _fast_choice(f: SpecField):
    values = frozenset(f.choice_values)
    return lambda value: value if type(value) is str and value in values else _REFUSED


def _fast_priority(f: SpecField):
    # A str here; whether the PriorityClass table has it is read once per submission by fast_submission.
    return lambda value: value if type(value) is str else _REFUSED


def _fast_object(f: SpecField):
    """A dict of the child fields only; each present one accepted, the required ones present, defaults filled."""
    keys = frozenset(child.name for child in f.fields)
    entries = []
    for child in f.fields:
        default = (child.default if callable(child.default) else (lambda d=child.default: d)) \
            if child.has_default and not child.kinds else None
        entries.append((child.name, child.required, default, fast_check(child)))
    entries = tuple(entries)

    def check(value):
        if type(value) is not dict or not value.keys() <= keys:
            return _REFUSED
        values = {}
        for name, required, default, check_child in entries:
            if name in value:
                checked = check_child(value[name])
                if checked is _REFUSED:
                    return _REFUSED
                values[name] = checked
            elif required:
                return _REFUSED
            elif default is not None:
                values[name] = default()
        return values
    return check


def _fast_job_ref(f: SpecField):
    # Only null: a job reference needs a lookup against the team, which the serializer does.
    return lambda value: None if value is None else _REFUSED


_FAST_CHECKS: dict[FieldType, Callable[[SpecField], Callable[[Any], Any]]] = {
    FieldType.STRING: _fast_string,
    FieldType.INTEGER: _fast_integer,
    FieldType.BOOLEAN: _fast_boolean,
    FieldType.POSITIVE_NUMBER: _fast_positive_number,
    FieldType.STRING_LIST: _fast_string_list,
    FieldType.ENV: _fast_env,
    FieldType.CHOICE: _fast_choice,
    FieldType.PRIORITY: _fast_priority,
    FieldType.OBJECT: _fast_object,
    FieldType.JOB_REF: _fast_job_ref,
}

_unbuilt = [t.name for t in FieldType if t not in _DRF_FIELDS or t not in _FAST_CHECKS]
if _unbuilt:
    raise TypeError(f"field types without a serializer field or a fast check: {', '.join(_unbuilt)}")


def fast_check(field: SpecField) -> Callable[[Any], Any]:
    """The fast path's check of ``field``: a function of the submitted value that returns what the serializer
    field would return (a copy of a list or mapping, an OBJECT's values with their defaults), or a sentinel
    for anything it is not sure the serializer field accepts unchanged. Lookups are not done here."""
    return _FAST_CHECKS[field.type](field)


_FAST_SUBMISSION = fast_check(SUBMISSION)


def fast_submission(data, user) -> dict | None:
    """``submit_job``'s keyword arguments for a plain, valid submission, or None to leave it to the serializer.

    The hot path of ``POST /api/v1/jobs/``: the same rules as ``JobSubmissionSerializer`` (the same table,
    ``jobs.specfields``, and the same shared rules) and the same result as its ``submission()``, checked with
    plain comparisons instead of DRF's per-field machinery (which cost more than admission itself). It only
    accepts what it is sure the serializer accepts unchanged (JSON types exactly, ASCII names, no whitespace to
    trim); anything else, valid or not, returns None and goes through the serializer, which then writes the 400
    with its field paths. A property test (``tests/jobs/test_fast_submission.py``) holds both to the same
    answers over generated submissions.
    """
    values = _FAST_SUBMISSION(data)
    if values is _REFUSED:
        return None
    spec = values["spec"]
    if spec_error(data["spec"]) is not None or apply_kind(values["kind"], spec):
        return None
    classes = priority_classes()
    if spec["priority"] not in classes:
        return None
    resources = spec["resources"]
    if "accelerator" not in resources or not resources["gpus_per_node"]:
        return None  # a CPU-only job: left to the serializer, which applies its rules (cpu_only_errors)
    try:
        values["team"] = team_for_submission(user, values["team"])
        resources["accelerator"] = accelerator_named(resources["accelerator"])
    except serializers.ValidationError:
        return None
    if resources.get("alternatives") or pool_errors(resources["accelerator"], resources["gpus_per_node"]) \
            or never_errors(values["team"], spec) or memory_errors(values["kind"], spec):
        return None  # alternatives: left to the serializer, which looks each one up
    return submission_fields(values, user, classes)


def validated_submission(data, context: dict) -> dict:
    """``submit_job``'s keyword arguments for the submission ``data`` by ``context["request"].user``.

    ``fast_submission`` first, else ``JobSubmissionSerializer(data, context=context)``, which raises DRF's
    ValidationError (a 400 with dotted field paths) for a bad submission.
    """
    fields = fast_submission(data, context["request"].user)
    if fields is None:
        serializer = JobSubmissionSerializer(data=data, context=context)
        serializer.is_valid(raise_exception=True)
        fields = serializer.submission()
    return fields
