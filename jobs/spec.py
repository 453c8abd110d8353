"""Validation of a submitted job (JSON or YAML) into the normalized spec and the columns admission reads.

Errors are field-keyed JSON with flat dotted paths, e.g.
``{"spec.resources.gpus_per_node": ["..."]}``; nothing is stored for a rejected request.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from django.conf import settings
from django.db.models import Max, Q
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings
from rest_framework.utils.serializer_helpers import ReturnDict

from django.contrib.auth import get_user_model

from core.fields import INT32_MAX, SharedFieldsMixin, StrictBooleanField, StrictCharField, StrictIntegerField
from core.lookups import LookupCache
from quotas.models import Membership, Team, priority_classes
from runners.models import Accelerator, Cluster, NodePool

from .models import PRIORITY_CLASSES, Job

# Kubernetes DNS-1123 label: the job name ends up in object names and labels.
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL_MAX = 63
# POSIX portable environment variable names (IEEE Std 1003.1, 8.1).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_MAX_LENGTH = 512
SUBMIT_ROLES = (Membership.Role.ADMIN, Membership.Role.MEMBER)
INFERENCE_ONLY = ("replicas", "port")
INFERENCE_DEFAULT_PORT = 8000

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


# --- The job spec.

class ResourcesSerializer(SharedFieldsMixin, StrictSerializer):
    """``spec.resources``: accelerator name, GPUs per node, nodes; optional CPU cores and memory (GiB) per node."""

    accelerator = StrictCharField()
    gpus_per_node = StrictIntegerField(min_value=1, max_value=INT32_MAX)
    nodes = StrictIntegerField(min_value=1, max_value=INT32_MAX)
    cpu = PositiveNumberField(required=False)
    memory_gib = PositiveNumberField(required=False)

    def validate_accelerator(self, value: str) -> Accelerator:
        return accelerator_named(value)

    def validate(self, attrs):
        accelerator = attrs["accelerator"]
        largest = accelerator.largest_pool_gpus
        if largest is None:
            raise serializers.ValidationError(
                {"accelerator": [f"no node pool offers {accelerator.name} GPUs, so the job could never run"]}
            )
        if attrs["gpus_per_node"] > largest:
            raise serializers.ValidationError(
                {"gpus_per_node": [f"{attrs['gpus_per_node']} GPUs per node is more than any {accelerator.name} "
                                   f"node pool has; the maximum is {largest}"]}
            )
        return attrs


class PlacementSerializer(SharedFieldsMixin, StrictSerializer):
    """``spec.placement``: allowed providers (Cluster.Provider values), regions and cluster names; empty means any."""

    providers = StringListField(choices=Cluster.Provider.values, required=False, default=list)
    regions = StringListField(required=False, default=list)
    clusters = StringListField(required=False, default=list)


class PriorityClassField(serializers.ChoiceField):
    """A priority class name from the ``quotas.PriorityClass`` table, read when the spec is validated."""

    def to_internal_value(self, data):
        # Read per call, and without storing anything on the field: it is shared between requests.
        names = list(priority_classes())
        if isinstance(data, str) and data in names:
            return data
        raise serializers.ValidationError(f'unknown priority "{data}"; one of {", ".join(names)}', code="invalid_choice")


class JobSpecSerializer(SharedFieldsMixin, StrictSerializer):
    """``spec``: what to run (image, command, args, env), on what (resources), how (priority, limits, placement).

    ``max_runtime_seconds`` is required: it bounds the cost estimate that
    admission checks against the budget. ``replicas`` (default 1) and
    ``port`` (the container port the Service targets, default 8000) apply to
    inference only.
    """

    image = StrictCharField(max_length=IMAGE_MAX_LENGTH)
    command = StringListField(allow_empty=False)
    args = StringListField(required=False, default=list)
    env = EnvField(required=False, default=dict)
    resources = ResourcesSerializer()
    priority = PriorityClassField(choices=list(PRIORITY_CLASSES), required=False, default="normal")
    max_runtime_seconds = StrictIntegerField(min_value=1, max_value=INT32_MAX)
    preemptible = StrictBooleanField(required=False, default=False)
    placement = PlacementSerializer(required=False)
    max_retries = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, default=0)
    replicas = StrictIntegerField(min_value=1, max_value=INT32_MAX, required=False)
    port = StrictIntegerField(min_value=1, max_value=65535, required=False)

    def to_internal_value(self, data):
        # Measured before anything else, so an oversized spec costs no further work.
        if isinstance(data, Mapping):
            try:
                size = spec_size_bytes(data)
            except (TypeError, ValueError, RecursionError) as exc:  # YAML keys such as dates or bytes; deep nesting
                raise serializers.ValidationError([f"the spec cannot be encoded as JSON: {exc}"]) from exc
            if size > settings.JOB_SPEC_MAX_BYTES:
                raise serializers.ValidationError(
                    [f"the spec's JSON encoding is {size} bytes, over the limit of {settings.JOB_SPEC_MAX_BYTES} bytes"]
                )
        return super().to_internal_value(data)


class JobSubmissionSerializer(SharedFieldsMixin, StrictSerializer):
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

    team = StrictCharField()
    name = StrictCharField(max_length=DNS_1123_LABEL_MAX)
    kind = serializers.ChoiceField(choices=Job.Kind.choices, required=False, default=Job.Kind.TRAINING)
    spec = JobSpecSerializer()

    @property
    def errors(self):
        return ReturnDict(flatten_errors(super().errors), serializer=self)

    def validate_team(self, slug: str) -> Team:
        return team_for_submission(self.context["request"].user, slug)

    def validate_name(self, name: str) -> str:
        if not DNS_1123_LABEL.fullmatch(name):
            raise serializers.ValidationError(
                "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or "
                "digit, at most 63 characters (it names Kubernetes objects)"
            )
        return name

    def validate(self, attrs):
        spec = attrs["spec"]
        if attrs["kind"] == Job.Kind.INFERENCE:
            spec.setdefault("replicas", 1)
            spec.setdefault("port", INFERENCE_DEFAULT_PORT)
            return attrs
        misplaced = [name for name in INFERENCE_ONLY if name in spec]
        if misplaced:
            raise serializers.ValidationError(
                {"spec": {name: [f"{name} applies to inference jobs only"] for name in misplaced}}
            )
        return attrs

    def normalized_spec(self) -> dict:
        """The validated spec as stored on the Job: every optional key present, the accelerator by name."""
        spec = self.validated_data["spec"]
        resources = spec["resources"]
        placement = spec.get("placement") or {}
        normalized = {
            "image": spec["image"],
            "command": spec["command"],
            "args": spec["args"],
            "env": spec["env"],
            "resources": {
                "accelerator": resources["accelerator"].name,
                "gpus_per_node": resources["gpus_per_node"],
                "nodes": resources["nodes"],
                "cpu": resources.get("cpu"),
                "memory_gib": resources.get("memory_gib"),
            },
            "priority": spec["priority"],
            "max_runtime_seconds": spec["max_runtime_seconds"],
            "preemptible": spec["preemptible"],
            "placement": {
                "providers": placement.get("providers", []),
                "regions": placement.get("regions", []),
                "clusters": placement.get("clusters", []),
            },
            "max_retries": spec["max_retries"],
        }
        for name in INFERENCE_ONLY:
            if name in spec:
                normalized[name] = spec[name]
        return normalized

    def submission(self) -> dict:
        """Keyword arguments for ``submit_job``: team, submitter, name, kind, spec and the resource columns."""
        data = self.validated_data
        spec = data["spec"]
        resources = spec["resources"]
        return {
            "team": data["team"],
            "submitter": self.context["request"].user,
            "name": data["name"],
            "kind": data["kind"],
            "spec": self.normalized_spec(),
            "resources": {
                "accelerator": resources["accelerator"],
                "gpus_per_node": resources["gpus_per_node"],
                "nodes": resources["nodes"],
                "priority": priority_classes()[spec["priority"]],
                "preemptible": spec["preemptible"],
                "max_runtime_seconds": spec["max_runtime_seconds"],
                "max_retries": spec["max_retries"],
            },
        }


# --- The fast path of a plain, valid submission.

_SUBMISSION_KEYS = frozenset({"team", "name", "kind", "spec"})
_SPEC_KEYS = frozenset(JobSpecSerializer._declared_fields)
_RESOURCES_KEYS = frozenset(ResourcesSerializer._declared_fields)
_PLACEMENT_KEYS = frozenset(PlacementSerializer._declared_fields)
_KINDS = frozenset(Job.Kind.values)
_PROVIDERS = frozenset(Cluster.Provider.values)


def _plain_str(value, max_length: int | None = None) -> bool:
    """What a StrictCharField accepts unchanged: an ASCII str, not blank, without outer whitespace or NUL."""
    return (type(value) is str and value != "" and value.isascii() and "\x00" not in value
            and value == value.strip() and (max_length is None or len(value) <= max_length))


def _int_in(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _str_list(value, *, allow_empty: bool, choices: frozenset | None = None) -> bool:
    """What StringListField accepts: a list of str without NUL (non-empty items, and the list, if not allow_empty)."""
    if type(value) is not list or (not allow_empty and not value):
        return False
    for item in value:
        if type(item) is not str or "\x00" in item or (not allow_empty and not item):
            return False
        if choices is not None and item not in choices:
            return False
    return True


def _positive_number(value) -> bool:
    try:
        return type(value) in (int, float) and math.isfinite(value) and value > 0
    except OverflowError:  # an int beyond any float: the serializer refuses it
        return False


def fast_submission(data, user) -> dict | None:
    """``submit_job``'s keyword arguments for a plain, valid submission, or None to leave it to the serializer.

    The hot path of ``POST /api/v1/jobs/``: the same rules as ``JobSubmissionSerializer`` and the same result
    as its ``submission()``, checked with plain comparisons instead of DRF's per-field machinery (which cost
    more than admission itself). It only accepts what it is sure the serializer accepts unchanged (JSON
    types exactly, ASCII names, no whitespace to trim); anything else, valid or not, returns None and goes
    through the serializer, which then writes the 400 with its field paths. A property test
    (``tests/api/test_fast_submission.py``) holds both to the same answers over generated submissions.
    """
    if type(data) is not dict or not data.keys() <= _SUBMISSION_KEYS or not {"team", "name", "spec"} <= data.keys():
        return None
    slug, name, kind, spec = data["team"], data["name"], data.get("kind", Job.Kind.TRAINING.value), data["spec"]
    if not (_plain_str(slug) and _plain_str(name, DNS_1123_LABEL_MAX) and DNS_1123_LABEL.fullmatch(name)
            and type(kind) is str and kind in _KINDS):
        return None
    if type(spec) is not dict or not spec.keys() <= _SPEC_KEYS:
        return None
    try:
        if spec_size_bytes(spec) > settings.JOB_SPEC_MAX_BYTES:
            return None
    except (TypeError, ValueError, RecursionError):
        return None
    resources, placement = spec.get("resources"), spec.get("placement", {})
    env, args = spec.get("env", {}), spec.get("args", [])
    priority, preemptible = spec.get("priority", "normal"), spec.get("preemptible", False)
    max_retries = spec.get("max_retries", 0)
    if not (_plain_str(spec.get("image"), IMAGE_MAX_LENGTH) and _str_list(spec.get("command"), allow_empty=False)
            and _str_list(args, allow_empty=True) and _int_in(spec.get("max_runtime_seconds"), 1, INT32_MAX)
            and type(preemptible) is bool and _int_in(max_retries, 0, INT32_MAX) and type(priority) is str):
        return None
    if type(env) is not dict or not all(type(k) is str and ENV_NAME.fullmatch(k) and type(v) is str and "\x00" not in v
                                        for k, v in env.items()):
        return None
    if type(resources) is not dict or not resources.keys() <= _RESOURCES_KEYS:
        return None
    gpus, nodes = resources.get("gpus_per_node"), resources.get("nodes")
    if not (_plain_str(resources.get("accelerator")) and _int_in(gpus, 1, INT32_MAX) and _int_in(nodes, 1, INT32_MAX)):
        return None
    if any(key in resources and not _positive_number(resources[key]) for key in ("cpu", "memory_gib")):
        return None
    if type(placement) is not dict or not placement.keys() <= _PLACEMENT_KEYS:
        return None
    if not (_str_list(placement.get("providers", []), allow_empty=True, choices=_PROVIDERS)
            and _str_list(placement.get("regions", []), allow_empty=True)
            and _str_list(placement.get("clusters", []), allow_empty=True)):
        return None
    inference = {}
    if kind == Job.Kind.INFERENCE:
        inference = {"replicas": spec.get("replicas", 1), "port": spec.get("port", INFERENCE_DEFAULT_PORT)}
        if not (_int_in(inference["replicas"], 1, INT32_MAX) and _int_in(inference["port"], 1, 65535)):
            return None
    elif any(key in spec for key in INFERENCE_ONLY):
        return None
    classes = priority_classes()
    if priority not in classes:
        return None
    try:
        team = team_for_submission(user, slug)
        accelerator = accelerator_named(resources["accelerator"])
    except serializers.ValidationError:
        return None
    if accelerator.largest_pool_gpus is None or gpus > accelerator.largest_pool_gpus:
        return None
    normalized = {
        "image": spec["image"], "command": list(spec["command"]), "args": list(args), "env": dict(env),
        "resources": {"accelerator": accelerator.name, "gpus_per_node": gpus, "nodes": nodes,
                      "cpu": resources.get("cpu"), "memory_gib": resources.get("memory_gib")},
        "priority": priority, "max_runtime_seconds": spec["max_runtime_seconds"], "preemptible": preemptible,
        "placement": {"providers": list(placement.get("providers", [])), "regions": list(placement.get("regions", [])),
                      "clusters": list(placement.get("clusters", []))},
        "max_retries": max_retries,
        **inference,
    }
    return {
        "team": team, "submitter": user, "name": name, "kind": kind, "spec": normalized,
        "resources": {"accelerator": accelerator, "gpus_per_node": gpus, "nodes": nodes,
                      "priority": classes[priority], "preemptible": preemptible,
                      "max_runtime_seconds": spec["max_runtime_seconds"], "max_retries": max_retries},
    }


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
