"""The job submission as pydantic models, and its validation into the columns admission reads.

``JobSubmission`` (``team``, ``name``, ``kind``, ``spec``) and the models below it are the one declaration of
what a client may submit: the API's OpenAPI schema is generated from them (drf-spectacular's pydantic
extension), the web form reads its choices, defaults and limits from their JSON schema (:func:`field_schema`),
and :func:`validated_submission` validates a submission with them, in one ``model_validate`` call.

Validation is strict: JSON/YAML types must already be right (``"3"`` is not 3, ``true`` is not 1), strings
are trimmed and may not be blank or hold NUL, unknown keys are refused. The rules one field cannot state run
as model validators with the lookups they need (the submitter's team, the accelerator and its largest node
pool, the priority class table, the checkpoint's job): they need the :class:`Lookups` given as the
validation context, and are skipped without one (a structural check only).

Errors are field-keyed JSON with flat dotted paths, e.g. ``{"spec.resources.gpus_per_node": ["..."]}``
(``non_field_errors`` for the document as a whole); nothing is stored for a rejected request. The encoded
spec is measured before anything else (``settings.JOB_SPEC_MAX_BYTES``), so an oversized one costs no
further work.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Max, Q
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from rest_framework import serializers
from rest_framework.settings import api_settings

from core.fields import INT32_MAX
from core.gpus import MIG_PROFILES, MILLI_PER_GPU, mig_profile, milli_of
from core.lookups import LookupCache
from quotas.models import Membership, Team, priority_classes
from runners.models import CPU_ACCELERATOR, Accelerator, Cluster, NodePool

from .dependencies import CHECKPOINT_ARGS, CHECKPOINT_ENV, MAX_AFTER, follow_error
from .dependencies import resolve as resolve_after
from .efficiency.memory import Layout, declaration_errors, fit_errors
from .models import PRIORITY_CLASSES, UNBOUNDED_ESTIMATE_SECONDS, Job, JobDependency, roles_in_order

SUBMIT_ROLES = (Membership.Role.ADMIN, Membership.Role.MEMBER)

# Rows every submission reads, cached per process for settings.LOOKUP_CACHE_SECONDS (core.lookups).
ACCELERATORS = LookupCache("accelerators").invalidate_on(Accelerator, NodePool)
MEMBERSHIPS = LookupCache("memberships").invalidate_on(Membership, Team, get_user_model())

# Kubernetes DNS-1123 label: the job name ends up in object names and labels.
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL_MAX = 63
DNS_1123_LABEL_ERROR = ("must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a "
                        "letter or digit, at most 63 characters (it names Kubernetes objects)")
# POSIX portable environment variable names (IEEE Std 1003.1, 8.1).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_MAX_LENGTH = 512
INFERENCE_DEFAULT_PORT = 8000
PORT_MAX = 65535
HEALTH_PATH_MAX = 1024
#: The longest autoscaling stabilization window, seconds (the HorizontalPodAutoscaler's limit: one hour).
AUTOSCALING_DELAY_MAX = 3600
#: The most parameters a declared model may have (10^15: far above any trained model).
MODEL_MAX_PARAMETERS = 10 ** 15
INFERENCE = Job.Kind.INFERENCE.value
MULTI_ROLE = Job.Kind.MULTI_ROLE.value
#: A role's name is a DNS-1123 label of at most this many characters: it names the role's Kubernetes objects
#: (``<attempt object name, at most 44>-<role>``, and the pods ``<that>-<index>-<5>``, within 63).
ROLE_NAME_MAX = 12
#: The most roles one multi-role job may have (a learner, rollouts, a reward server, a reference model... with
#: room to spare; bounds the work of validating and placing one job).
ROLES_MAX = 8


class SpecError(ValueError):
    """A submitted value that a lookup or rule refuses; the message is the reason shown to the client."""


def _refused(reason: str) -> PydanticCustomError:
    # The reason travels in the context: a template would read braces in user input as placeholders.
    return PydanticCustomError("refused", "{reason}", {"reason": reason})


def _rules_failed(errors: dict[str, list[str]]) -> PydanticCustomError:
    """Errors of a model's rules by field below it (``""``: the model itself), for :func:`error_paths`."""
    return PydanticCustomError("rules", "{errors}", {"errors": errors})


class Lookups:
    """The validation context of a submission: the submitter, and the rows its validators look up.

    ``user``: the submitting user. Filled by validation: ``team`` (Team), ``accelerator`` (Accelerator with
    ``largest_pool_gpus``), ``classes`` (priority class name -> value), ``after`` (the upstream jobs of the
    submission's ``after``: ``(Job, condition)`` pairs, ``jobs.dependencies.resolve``).
    """

    __slots__ = ("user", "team", "accelerator", "classes", "after")

    def __init__(self, user):
        self.user, self.team, self.accelerator, self.classes, self.after = user, None, None, None, []


# --- Field types: strict scalars, and the few types with messages of their own.

def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("null_character", "Null characters are not allowed.")
    return value


#: A non-blank string, trimmed, without NUL.
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1), AfterValidator(_no_nul)]
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
Count = Annotated[int, Field(ge=1, le=INT32_MAX)]


def _positive_number(value):
    if type(value) not in (int, float):
        raise PydanticCustomError("number_type", "A number is required.")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer beyond any float (JSON allows any number of digits)
        raise PydanticCustomError("number_too_large", "Too large: at most about 1.8e308.") from None
    if not finite:
        raise PydanticCustomError("number_type", "A number is required.")
    if value <= 0:
        raise PydanticCustomError("number_not_positive", "Must be greater than 0.")
    return value


def _gpu_amount(value):
    if type(value) is int:
        if value < 0:
            raise PydanticCustomError("gpu_amount", "Ensure this value is greater than or equal to 0.")
        if value > INT32_MAX:
            raise PydanticCustomError("gpu_amount", f"Ensure this value is less than or equal to {INT32_MAX}.")
        return value
    if type(value) is not float:
        raise PydanticCustomError("gpu_amount", "A valid integer is required. A fraction of one GPU is a number "
                                                "below 1, e.g. 0.25.")
    try:
        milli = milli_of(value)
    except ValueError:
        milli = None
    if milli is None or not 0 < milli < MILLI_PER_GPU:
        raise _refused(f"{value} is not a whole number of GPUs nor a fraction of one GPU: a fraction is between 0.01 "
                       f"and 0.99 in steps of 0.01 (e.g. 0.25); more than one GPU is a whole number")
    return value


#: GPUs per node: a whole number, or a fraction of one GPU below 1 in steps of 0.01 (``core.gpus.milli_of``).
GpuAmount = Annotated[int | float, PlainValidator(_gpu_amount), WithJsonSchema(
    {"type": "number", "minimum": 0, "maximum": INT32_MAX, "multipleOf": 0.01})]


def is_fraction(gpus_per_node) -> bool:
    """Whether a validated ``gpus_per_node`` asks a fraction of one GPU (a float: ``GpuAmount`` keeps whole numbers
    as int)."""
    return type(gpus_per_node) is float


def whole_gpus(gpus_per_node) -> int:
    """The GPU devices a pod of a validated ``gpus_per_node`` asks: the number itself, or 1 for a fraction."""
    return 1 if is_fraction(gpus_per_node) else gpus_per_node


#: A finite int or float above 0, kept as given.
PositiveNumber = Annotated[float | int, PlainValidator(_positive_number),
                           WithJsonSchema({"type": "number", "minimum": 0, "exclusiveMinimum": True})]


def string_list(*, allow_empty: bool = True, choices: tuple[str, ...] | None = None):
    """A list of strings without NUL; ``allow_empty=False``: non-empty, and no empty string in it; ``choices``:
    each item one of them (an unknown one named, with the valid ones)."""
    def check(value):
        if type(value) is not list:
            raise PydanticCustomError("list_type", "Expected a list of strings.")
        if not value and not allow_empty:
            raise PydanticCustomError("list_empty", "Must be a non-empty list of strings.")
        for index, item in enumerate(value):
            if type(item) is not str:
                raise _refused(f"Item {index} is not a string.")
            if not item and not allow_empty:
                raise _refused(f"Item {index} is an empty string.")
            if "\x00" in item:
                raise _refused(f"Item {index} contains a NUL character (\\x00).")
            if choices is not None and item not in choices:
                raise _refused(f'unknown value "{item}"; one of {", ".join(choices)}')
        return list(value)

    items = {"type": "string", "enum": list(choices)} if choices else {"type": "string", "minLength": 0 if allow_empty else 1}
    schema = {"type": "array", "items": items, **({} if allow_empty else {"minItems": 1})}
    return Annotated[list[str], PlainValidator(check), WithJsonSchema(schema)]


def _env(value):
    if type(value) is not dict:
        raise PydanticCustomError("env_type", "Expected a mapping of variable names to string values.")
    for name, text in value.items():
        if type(name) is not str or not ENV_NAME.fullmatch(name):
            raise _refused(f'invalid environment variable name "{name}": names must match [A-Za-z_][A-Za-z0-9_]*')
        if type(text) is not str:
            raise _refused(f'the value of environment variable "{name}" must be a string')
        if "\x00" in text:
            raise _refused(f'the value of environment variable "{name}" contains a NUL character (\\x00)')
    return dict(value)


Env = Annotated[dict[str, str], PlainValidator(_env), WithJsonSchema(
    {"type": "object", "additionalProperties": {"type": "string"}})]


def choice(*values: str):
    """One of ``values`` (strings); an unknown value's error lists the valid ones."""
    allowed = frozenset(values)

    def check(value):
        if type(value) is not str or value not in allowed:
            raise _refused(f'"{value}" is not a valid choice; one of {", ".join(values)}')
        return value
    return Annotated[str, PlainValidator(check), WithJsonSchema({"type": "string", "enum": list(values)})]


def _job_reference(value):
    if value is None:
        return None
    if type(value) is int and 1 <= value <= INT32_MAX or type(value) is str and len(value) <= DNS_1123_LABEL_MAX \
            and DNS_1123_LABEL.fullmatch(value):
        return value
    raise PydanticCustomError("job_reference", "Expected a job id (a positive integer) or a job name (a DNS-1123 "
                                               "label, as job names are).")


JobReference = Annotated[int | str | None, PlainValidator(_job_reference), WithJsonSchema(
    {"oneOf": [{"type": "integer", "minimum": 1, "maximum": INT32_MAX},
               {"type": "string", "maxLength": DNS_1123_LABEL_MAX, "pattern": DNS_1123_LABEL.pattern}],
     "nullable": True})]


def _upstream_reference(value):
    if value is None:
        raise PydanticCustomError("job_reference", "This field may not be null.")
    return _job_reference(value)


UpstreamReference = Annotated[int | str, PlainValidator(_upstream_reference), WithJsonSchema(
    {"oneOf": [{"type": "integer", "minimum": 1, "maximum": INT32_MAX},
               {"type": "string", "maxLength": DNS_1123_LABEL_MAX, "pattern": DNS_1123_LABEL.pattern}]})]


def _optional(description: str, example=None):
    """A field that may be absent (then null in the stored spec) but not given as null; its schema has no
    default, and ``example`` when given."""
    def extra(schema: dict) -> None:
        schema.pop("default", None)
        if example is not None:
            schema["example"] = example
    return Field(None, description=description, json_schema_extra=extra)


def _example(value) -> dict:
    """A field's example for its schema (``example``: OpenAPI 3.0 has no JSON Schema ``examples``)."""
    return {"example": value}


class SpecModel(BaseModel):
    """A part of a submission: strict types, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


# --- The submission.

class JobResources(SpecModel):
    """``spec.resources``: what the job runs on."""

    accelerator: Text = _optional(
        "accelerator name (e.g. H100-80GB), looked up; a node pool with nodes must offer it. Absent with "
        "gpus_per_node 0: CPU (a CPU-only job, on the nodes of CPU node pools)", example="H100-80GB")
    gpus_per_node: GpuAmount = Field(
        description="GPUs on each node; at most the GPUs per node of the accelerator's largest node pool; 0: a "
        "CPU-only job (then cpu is required, and it is placed and billed by its CPU and memory). A fraction of one "
        "GPU below 1, in steps of 0.01 (e.g. 0.25), is the way to ask part of a GPU: a job on one node (and one "
        "replica) that shares a GPU with others, and is counted against quota and billed for that share only",
        json_schema_extra=_example(1))
    mig_profile: Text = _optional(
        "a MIG profile of the accelerator (e.g. 1g.10gb on A100-80GB or H100-80GB): the job's pod gets one MIG "
        "instance of it, counted and billed as the instance's share of its GPU (its memory slices over 8); with "
        "gpus_per_node 1 and nodes 1", example="1g.10gb")
    nodes: Count = Field(description="nodes the job runs on, each a distinct node of one node pool", json_schema_extra=_example(1))
    cpu: PositiveNumber = _optional("CPU cores per node; absent: no request")
    memory_gib: PositiveNumber = _optional("memory per node, GiB; absent: no request")
    alternatives: string_list(allow_empty=False) = Field(
        default_factory=list, description="other accelerators the job also accepts, by name, in order of preference "
        "after accelerator; quota and price are those of the one it gets")

    @field_validator("accelerator")
    @classmethod
    def _look_up_accelerator(cls, name: str, info: ValidationInfo) -> str:
        if info.context is not None:
            try:
                info.context.accelerator = accelerator_named(name)
            except SpecError as exc:
                raise _refused(str(exc)) from None
        return name

    @model_validator(mode="after")
    def _runs_somewhere(self, info: ValidationInfo) -> JobResources:
        if info.context is None:
            return self
        lookups = info.context
        errors = share_errors(self) or cpu_only_errors(self, lookups)
        if not errors:
            errors = alternative_errors(lookups.accelerator, self.alternatives)
        if not errors:
            errors = mig_profile_errors(lookups.accelerator, self.mig_profile)
        if not errors:
            devices = whole_gpus(self.gpus_per_node)
            errors = pool_errors(lookups.accelerator, devices)
            if errors and any(not pool_errors(accelerator_named(a), devices) for a in self.alternatives):
                errors = {}  # an alternative could hold it
        if errors:
            raise _rules_failed(errors)
        return self


class JobPlacement(SpecModel):
    """``spec.placement``: where the job may run; empty lists mean any."""

    providers: string_list(choices=tuple(Cluster.Provider.values)) = Field(
        default_factory=list, description="allowed providers (Cluster.Provider values); empty: any")
    regions: string_list() = Field(default_factory=list, description="allowed regions; empty: any")
    clusters: string_list() = Field(default_factory=list, description="allowed cluster names; empty: any")


class JobModel(SpecModel):
    """``spec.model``: the model trained, for the memory-fit check at submission and MFU."""

    parameters: Annotated[int, Field(ge=1, le=MODEL_MAX_PARAMETERS)] = _optional(
        "parameters of the model; absent: computed from layers and hidden_size "
        "(jobs.efficiency.flops.transformer_parameters)")
    layers: Count = _optional("transformer layers")
    hidden_size: Count = _optional("hidden size (model width)")
    heads: Count = _optional("attention heads; must divide hidden_size")
    vocab_size: Count = _optional("vocabulary size, tokens")
    sequence_length: Count = _optional("training sequence length, tokens")
    micro_batch_size: Count = _optional("sequences per GPU per forward pass")
    precision: choice("bf16", "fp16", "fp32") = Field(
        "bf16", description="bf16 or fp16 (mixed precision: fp32 master weights) or fp32")
    optimizer: choice("adam", "adamw", "sgd") = Field("adam", description="adam, adamw or sgd (with momentum)")
    activation_recomputation: choice("none", "selective", "full") = Field(
        "none", description="none, selective (attention recomputed) or full (every layer from its input)")


class JobParallelism(SpecModel):
    """``spec.parallelism``: how the model is split over the job's GPUs."""

    zero_stage: Annotated[int, Field(ge=0, le=3)] = Field(
        0, description="ZeRO / FSDP sharding over the data-parallel ranks: 0 (DDP), 1 (optimizer states), "
        "2 (and gradients), 3 (and parameters; FSDP full sharding)")
    tensor_parallel: Count = Field(1, description="tensor-parallel degree")
    pipeline_parallel: Count = Field(1, description="pipeline-parallel stages")
    sequence_parallel: bool = Field(False, description="sequence parallelism with the tensor parallelism")


def _health_path(value: str) -> str:
    if not value.startswith("/") or any(c.isspace() for c in value) or len(value) > HEALTH_PATH_MAX:
        raise _refused(f"must be an absolute URL path without spaces, at most {HEALTH_PATH_MAX} characters "
                       f'(e.g. "/healthz")')
    return value


class JobAutoscaling(SpecModel):
    """``spec.autoscaling`` of a serving job: the replica count follows the load, by the rule of the Kubernetes
    HorizontalPodAutoscaler (``jobs.serving``; docs/adr/0041-autoscaled-serving.md)."""

    min_replicas: Annotated[int, Field(ge=0, le=INT32_MAX)] = Field(
        description="the fewest replicas; the job starts with this many (at least 1) unless replicas says otherwise; "
        "0 only with scale_to_zero", json_schema_extra=_example(1))
    scale_to_zero: bool = Field(
        False, description="with min_replicas 0: after scale_down_delay_seconds without requests the last replica "
        "is released (its GPUs and billing stop); the endpoint holds the next request while one replica is admitted "
        "and starts (up to SERVING_HOLD_SECONDS, then 503), and answers 503 with the reason if it is refused")
    max_replicas: Count = Field(description="the most replicas; every replica beyond the running ones is admitted "
                                "under the team's quota and budget", json_schema_extra=_example(3))
    target_in_flight_per_replica: PositiveNumber = _optional(
        "the mean number of requests in flight per replica the autoscaler aims at (read at the job's endpoint); "
        "exactly one target is required")
    target_rps_per_replica: PositiveNumber = _optional(
        "the requests per second per replica the autoscaler aims at (read at the job's endpoint); exactly one "
        "target is required")
    scale_up_delay_seconds: Annotated[int, Field(ge=0, le=AUTOSCALING_DELAY_MAX)] = Field(
        0, description="scale-up stabilization window, seconds: the replicas rise to the lowest count recommended "
        "over this window (the HorizontalPodAutoscaler's behavior.scaleUp.stabilizationWindowSeconds; 0: at once)")
    scale_down_delay_seconds: Annotated[int, Field(ge=0, le=AUTOSCALING_DELAY_MAX)] = Field(
        300, description="scale-down stabilization window, seconds: the replicas fall to the highest count "
        "recommended over this window (behavior.scaleDown.stabilizationWindowSeconds; the Kubernetes default 300)")

    @model_validator(mode="after")
    def _one_target_within_bounds(self) -> JobAutoscaling:
        errors: dict[str, list[str]] = {}
        if self.max_replicas < self.min_replicas:
            errors["max_replicas"] = [f"must be at least min_replicas ({self.min_replicas}); got {self.max_replicas}"]
        if self.min_replicas == 0 and not self.scale_to_zero:
            errors["min_replicas"] = ["0 only with scale_to_zero: true (the last replica released when idle, the "
                                      "first request held while one starts)"]
        if self.scale_to_zero and self.min_replicas != 0:
            errors["scale_to_zero"] = [f"applies with min_replicas 0; got min_replicas {self.min_replicas}"]
        targets = [name for name in ("target_in_flight_per_replica", "target_rps_per_replica")
                   if getattr(self, name) is not None]
        if len(targets) != 1:
            errors["target_in_flight_per_replica" if not targets else targets[1]] = [
                "exactly one of target_in_flight_per_replica and target_rps_per_replica is required"
                + (f" (got {' and '.join(targets)})" if targets else "")]
        if errors:
            raise _rules_failed(errors)
        return self


def _priority(name: str, info: ValidationInfo) -> str:
    # Read per submission (cached per process, core.lookups): the table may change.
    classes = priority_classes()
    if info.context is not None:
        info.context.classes = classes
    if name not in classes:
        raise _refused(f'unknown priority "{name}"; one of {", ".join(classes)}')
    return name


def _for_kinds(*kinds: str) -> dict:
    """The schema mark of a spec field of some job kinds only (``x-job-kinds``); :data:`KIND_SPECIFIC` reads it."""
    return {"x-job-kinds": list(kinds)}


class JobFollow(SpecModel):
    """``spec.follow``: the training job whose checkpoints a serving job follows (TensorFlow Serving's ``latest``
    model version policy; KServe and Seldon serve a model version a pipeline's deploy step sets). The server starts
    from the newest SUCCEEDED run (``checkpoint_from``, when not given) and rolls out to each newer run that
    succeeds (docs/adr/0041-autoscaled-serving.md)."""

    job: UpstreamReference = Field(
        description="the training job followed: its name (every run of that name in the team, e.g. a retraining "
        "resubmitted nightly) or its id (that job: one rollout when it succeeds); it must exist already and write "
        "its checkpoint to its checkpoint directory (CHECKPOINT_DIR)", json_schema_extra=_example("train-gpt"))


class JobSpec(SpecModel):
    """``spec``: what to run (image, command, args, env), on what (resources), how (priority, limits, placement).

    ``max_runtime_seconds`` is required for training jobs: it bounds the cost estimate that admission checks
    against the budget; a serving job without one runs until cancelled.
    ``replicas``, ``port``, ``health_path``, ``autoscaling``, ``checkpoint_from`` and ``follow`` apply to inference jobs
    only (``x-job-kinds``).
    """

    image: Annotated[Text, Field(max_length=IMAGE_MAX_LENGTH)] = Field(
        description="container image reference", json_schema_extra=_example("python:3.11"))
    command: string_list(allow_empty=False) = Field(
        default_factory=list, description="the container's command; absent: the image's ENTRYPOINT runs with args "
        "(then required)")
    args: string_list() = Field(default_factory=list, description="arguments after the command (or the image's "
                                                                  "ENTRYPOINT)")
    env: Env = Field(default_factory=dict, description="environment variables, name to value")
    resources: JobResources = Field(description="what the job runs on")
    priority: Annotated[str, AfterValidator(_priority)] = Field(
        "normal", validate_default=True, description=f"priority class name (quotas.PriorityClass; by default {', '.join(PRIORITY_CLASSES)});"
        " higher values go first")
    max_runtime_seconds: Count = Field(
        None, description="run-time limit, seconds; bounds the cost estimate that admission checks against the "
        "budget. Required for training jobs; for inference optional: absent, the server runs until cancelled "
        f"(its estimate then counts {UNBOUNDED_ESTIMATE_SECONDS // 86400} days)",
        json_schema_extra=_example(3600))
    preemptible: bool = Field(False, description="may run on spot capacity, and be preempted")
    placement: JobPlacement = Field(default_factory=JobPlacement,
                                    description="where the job may run; absent: anywhere")
    max_retries: Int32 = Field(0, description="new attempts after a failed one: a lost attempt (node or cluster "
                               "loss, eviction) or a container that exits non-zero; for inference also one "
                               "OOM-killed. 1: at most 2 attempts. Preemption, spot reclaim, an unhealthy node and "
                               "an unschedulable or undispatched attempt use no retry; a training job OOM-killed, "
                               "past its max runtime or whose image cannot be pulled fails at once")
    model: JobModel = _optional("the model trained, for the memory-fit check at submission (training jobs) and MFU; "
                                "absent: no check")
    parallelism: JobParallelism = _optional("how the model is split over the job's GPUs; absent: DDP")
    replicas: Count = Field(1, description="serving replicas, behind the job's one endpoint; with autoscaling the "
                            "count it starts with (default: min_replicas)", json_schema_extra=_for_kinds(INFERENCE))
    port: Annotated[int, Field(ge=1, le=PORT_MAX)] = Field(
        INFERENCE_DEFAULT_PORT, description="the container port the Service targets (env PORT on Kubernetes; the "
        "local runner gives every attempt a free PORT of its own)", json_schema_extra=_for_kinds(INFERENCE))
    health_path: Annotated[Text, AfterValidator(_health_path)] = Field(
        "/healthz", description="the path every replica answers readiness checks on (a 2xx or 3xx answer: ready); "
        "a replica that is starting or failing them gets no requests (Kubernetes: the pods' httpGet readiness "
        "probe; the local runner: its endpoint's checks)", json_schema_extra=_for_kinds(INFERENCE))
    autoscaling: JobAutoscaling = Field(
        None, description="replicas that follow the load between min_replicas and max_replicas; absent: a fixed "
        "number of replicas", json_schema_extra=_for_kinds(INFERENCE))
    checkpoint_from: JobReference = Field(
        None, description="the training job of the same team whose checkpoint the server loads: its id, or its name "
        "(the team's latest SUCCEEDED training job of that name, else its latest); stored as the id. The runners "
        "point CHECKPOINT_DIR (and on Kubernetes the checkpoint mount and CHECKPOINT_URI) at that job's "
        "checkpoints; null: the job's own", json_schema_extra=_for_kinds(INFERENCE))
    follow: JobFollow = Field(
        None, description="a training job whose runs the server follows: each newer run of it that SUCCEEDS is "
        "rolled out to (one surge replica at a time, rolled back if a new replica is not ready). It starts from "
        "the newest SUCCEEDED run (while none has: checkpoint_from, else the run it waits for in after); absent: "
        "the checkpoint changes only by an explicit rollout", json_schema_extra=_for_kinds(INFERENCE))


# --- A multi-role job (kind ``multi-role``): several roles, each its own pod shape, admitted together.

def _role_name(name) -> str:
    if type(name) is not str or len(name) > ROLE_NAME_MAX or not DNS_1123_LABEL.fullmatch(name):
        # a bounded answer, never one that echoes the document (docs/adr/0033): the name cut as its path is
        shown = name if len(str(name)) <= MAX_PATH_SHOWN else f"{str(name)[:MAX_PATH_SHOWN]}..."
        raise _refused(f'invalid role name "{shown}": a role name must be a DNS-1123 label of at most {ROLE_NAME_MAX} '
                       f"characters (lowercase letters, digits and '-', starting and ending with a letter or digit; "
                       f"it names the role's Kubernetes objects)")
    return name


# Its schema is a plain string: OpenAPI 3.0 has no propertyNames or patternProperties (the description says the rule).
RoleName = Annotated[str, PlainValidator(_role_name), WithJsonSchema({"type": "string"})]


class JobRole(SpecModel):
    """``spec.roles.<name>``: one role of a multi-role job: what its pods run, on what, and whether the job waits
    for it to finish (``completion``)."""

    image: Annotated[Text, Field(max_length=IMAGE_MAX_LENGTH)] = Field(
        description="container image reference", json_schema_extra=_example("python:3.11"))
    command: string_list(allow_empty=False) = Field(
        default_factory=list, description="the container's command; absent: the image's ENTRYPOINT runs with args "
        "(then required)")
    args: string_list() = Field(default_factory=list, description="arguments after the command")
    env: Env = Field(default_factory=dict, description="environment variables, name to value")
    resources: JobResources = Field(description="what each of the role's pods runs on: nodes is the role's pods, "
                                    "each on a node of its own")
    port: Annotated[int, Field(ge=1, le=PORT_MAX)] = _optional(
        "the port the role's pods listen on (env PORT); the other roles find them in "
        "CONTROLPLANE_ROLE_<ROLE>_ADDRESSES; absent: the role serves nothing", example=8000)
    completion: bool = Field(True, description="the job succeeds when every role with completion true has "
                             "succeeded (the others, e.g. rollout servers, are then stopped); false: a server role "
                             "whose exit with status 0 ends nothing")


class MultiRoleSpec(SpecModel):
    """``spec`` of a ``multi-role`` job: its ``roles`` (name -> ``JobRole``) and what applies to the job as a whole
    (priority, limits, placement). Every role runs on one accelerator and all of them on one cluster, admitted
    together or not at all (docs/adr/0039-multi-role-jobs.md)."""

    roles: Annotated[dict[RoleName, JobRole], Field(min_length=1, max_length=ROLES_MAX)] = Field(description=f"the roles by name (DNS-1123 labels of at most {ROLE_NAME_MAX} "
                               f"characters), at most {ROLES_MAX}")
    priority: Annotated[str, AfterValidator(_priority)] = Field(
        "normal", validate_default=True, description="priority class name (quotas.PriorityClass)")
    max_runtime_seconds: Count = Field(description="run-time limit of the whole job, seconds; bounds its cost "
                                       "estimate", json_schema_extra=_example(3600))
    preemptible: bool = Field(False, description="must be false: a multi-role job is neither preempted nor "
                              "preempts (docs/adr/0039-multi-role-jobs.md)")
    placement: JobPlacement = Field(default_factory=JobPlacement, description="where the job may run; absent: "
                                    "anywhere")
    max_retries: Int32 = Field(0, description="new attempts of the whole job (every role) after a failed one")


#: Spec fields of some job kinds only, with those kinds: given for another kind they are refused, and they are
#: stored for their kinds only.
KIND_SPECIFIC: dict[str, tuple[str, ...]] = {
    name: tuple(field.json_schema_extra["x-job-kinds"]) for name, field in JobSpec.model_fields.items()
    if isinstance(field.json_schema_extra, dict) and "x-job-kinds" in field.json_schema_extra}
#: Spec objects stored only when given.
DECLARATIONS = ("model", "parallelism", "follow")


class JobAfter(SpecModel):
    """One entry of a submission's ``after``: a job of the same team this one waits for, and the condition."""

    job: UpstreamReference = Field(
        description="the job waited for: its id, or its name (the team's most recent job of that name); it must "
        "exist already, in the submitter's team", json_schema_extra=_example("train-gpt"))
    condition: choice(*JobDependency.Condition.values) = Field(
        JobDependency.Condition.SUCCEEDED.value, description="succeeded (it SUCCEEDED), ended (any final state) or "
        "failed (FAILED, CANCELLED or REJECTED); when it can no longer hold, this job ends REJECTED")


def _job_name(name: str) -> str:
    if not DNS_1123_LABEL.fullmatch(name):
        raise _refused(DNS_1123_LABEL_ERROR)
    return name


def _spec_shape(value) -> str:
    """The tag of the spec model ``value`` is validated with: a spec with ``roles`` is a multi-role job's."""
    if isinstance(value, MultiRoleSpec) or isinstance(value, Mapping) and "roles" in value:
        return MULTI_ROLE
    return "single-role"


#: The tags of the spec models (``_spec_shape``), which pydantic puts in an error's location after ``spec``.
SPEC_TAGS = {"single-role": JobSpec, MULTI_ROLE: MultiRoleSpec}

SubmittedSpec = Annotated[Annotated[JobSpec, Tag("single-role")] | Annotated[MultiRoleSpec, Tag(MULTI_ROLE)],
                          Discriminator(_spec_shape)]


class JobSubmission(SpecModel):
    """A job submission: ``{"team", "name", "kind", "spec"}`` as in ``examples/jobs/*.yaml``.

    ``team`` must be a team where the submitter is an ``admin`` or ``member`` (staff may submit for any team);
    a team the user does not belong to gets the same answer as an unknown one, so the API does not reveal
    which teams exist.
    """

    team: Text = Field(description="slug of the job's team, looked up; the submitter must be its admin or member "
                       "(platform staff: any team)")
    name: Annotated[Text, Field(max_length=DNS_1123_LABEL_MAX), AfterValidator(_job_name)] = Field(
        description="the job's name; it names Kubernetes objects (a DNS-1123 label)")
    kind: choice(*Job.Kind.values) = Field(
        Job.Kind.TRAINING.value, description="training (a batch/v1 Job), inference (a Deployment and its Service) "
        "or multi-role (several roles admitted together: spec.roles)")
    spec: SubmittedSpec = Field(description="what to run, on what, and how; for a multi-role job its roles")
    after: list[JobAfter] = Field(
        default_factory=list, max_length=MAX_AFTER,
        description="jobs of the team this one waits for (a pipeline): it stays QUEUED, never admitted, until "
        f"every condition holds, and ends REJECTED once one can no longer hold; at most {MAX_AFTER}")

    @model_validator(mode="before")
    @classmethod
    def _roles_with_kind(cls, data):
        """A multi-role job's spec has ``roles``, and only its does (refused on ``spec.roles`` otherwise)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("spec"), Mapping):
            return data
        multi, has_roles = data.get("kind") == MULTI_ROLE, "roles" in data["spec"]
        if multi and not has_roles:
            raise _rules_failed({"spec.roles": ["required for a multi-role job: the roles by name"]})
        if has_roles and "kind" not in data:
            raise _rules_failed({"kind": [f"required for a job with spec.roles: {MULTI_ROLE}"]})
        if has_roles and not multi:
            raise _rules_failed({"spec.roles": [f"roles apply to multi-role jobs only (kind: {MULTI_ROLE})"]})
        return data

    @field_validator("team")
    @classmethod
    def _look_up_team(cls, slug: str, info: ValidationInfo) -> str:
        if info.context is not None:
            try:
                info.context.team = team_for_submission(info.context.user, slug)
            except SpecError as exc:
                raise _refused(str(exc)) from None
        return slug

    @model_validator(mode="after")
    def _kind_and_fit(self, info: ValidationInfo) -> JobSubmission:
        spec, lookups = self.spec, info.context
        if isinstance(spec, MultiRoleSpec):
            errors = role_errors(spec, lookups)
            if errors:
                raise _rules_failed({f"spec.{k}": v for k, v in errors.items()})
            return self
        errors = kind_errors(self.kind, spec) or serving_errors(self.kind, spec)
        if errors or lookups is None:
            if errors:
                raise _rules_failed({f"spec.{k}": v for k, v in errors.items()})
            return self
        errors = memory_errors(self.kind, spec, lookups.accelerator)
        if not errors and spec.checkpoint_from is not None and self.kind == INFERENCE:
            try:
                spec.checkpoint_from = checkpoint_job(lookups.team, spec.checkpoint_from)
            except SpecError as exc:
                errors = {"checkpoint_from": [str(exc)]}
        if errors:
            raise _rules_failed({f"spec.{k}": v for k, v in errors.items()})
        errors = never_errors(lookups.team, spec, lookups.accelerator, self.kind)
        if errors:
            raise _rules_failed({f"spec.{k}" if k in ("replicas", "preemptible", "autoscaling.max_replicas")
                                 else f"spec.resources.{k}" if k
                                 else "spec.resources": v for k, v in errors.items()})
        return self

    @model_validator(mode="after")
    def _upstreams(self, info: ValidationInfo) -> JobSubmission:
        lookups = info.context
        if lookups is None or not self.after:
            return self
        lookups.after, errors = resolve_after(lookups.team, [(a.job, a.condition) for a in self.after])
        if errors:
            raise _rules_failed(errors)
        return self

    @model_validator(mode="after")
    def _followed(self, info: ValidationInfo) -> JobSubmission:
        """``spec.follow`` (an inference job's): the followed job checked (``jobs.dependencies.follow_error``, 400 on
        ``spec.follow.job``), the server's own checkpoint arguments refused (a rollout points ``CHECKPOINT_DIR``
        elsewhere), and ``checkpoint_from`` set to the run it starts from: the newest SUCCEEDED run of what it
        follows; while none has succeeded, the ``checkpoint_from`` given, else the newest run it waits for."""
        spec, lookups = self.spec, info.context
        if lookups is None or isinstance(spec, MultiRoleSpec) or spec.follow is None or self.kind != INFERENCE:
            return self
        words = [*spec.command, *spec.args]
        if any(w.split("=", 1)[0] in CHECKPOINT_ARGS for w in words) or any(k in spec.env for k in CHECKPOINT_ENV):
            raise _rules_failed({"spec.follow": [
                f"a server that follows a training job loads the checkpoint its runs wrote through CHECKPOINT_DIR, "
                f"which each rollout points elsewhere; remove {', '.join((*CHECKPOINT_ARGS, *CHECKPOINT_ENV))} "
                f"from its arguments and environment"]})
        start, reason = follow_error(lookups.team, spec.follow.job, [job for job, _ in lookups.after],
                                     spec.checkpoint_from)
        if reason is not None:
            raise _rules_failed({"spec.follow.job": [reason]})
        spec.checkpoint_from = start
        return self


# --- Lookups and rules that a single field cannot state.

def spec_size_bytes(spec) -> int:
    """Bytes of ``spec``'s compact UTF-8 JSON encoding (what ``settings.JOB_SPEC_MAX_BYTES`` limits)."""
    return len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False, default=str).encode())


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


def accelerator_named(value: str) -> Accelerator:
    """The Accelerator called ``value``, annotated with ``largest_pool_gpus`` (GPUs per node of its largest node
    pool that has nodes; None when none has). Cached per process (``ACCELERATORS``). Raises SpecError for an
    unknown name, listing the known ones."""
    # One query: the accelerator and the largest node pool offering it; a pool kept with 0 nodes (gone from its
    # cluster, still referenced by attempts) offers nothing.
    accelerator = ACCELERATORS.get(value, lambda: Accelerator.objects.filter(name=value).annotate(
        largest_pool_gpus=Max("node_pools__gpus_per_node", filter=Q(node_pools__nodes__gt=0))).first())
    if accelerator is None:
        known = ", ".join(Accelerator.objects.values_list("name", flat=True))
        raise SpecError(f'unknown accelerator "{value}"; known: {known or "none"}')
    return accelerator


def team_for_submission(user, slug: str) -> Team:
    """The team ``slug`` if ``user`` may submit jobs to it (its admin or member, or platform staff).

    Raises SpecError otherwise; a team the user does not belong to gets the same message as an unknown one, so
    the API does not reveal which teams exist. Memberships are cached per process (``MEMBERSHIPS``).
    """
    role = None
    if user.is_staff:
        team = MEMBERSHIPS.get(("staff", slug), lambda: Team.objects.filter(slug=slug).first())
    else:  # one query: the membership with its team (none: unknown team, or not a member)
        membership = MEMBERSHIPS.get((user.pk, slug), lambda: Membership.objects.select_related("team").filter(
            team__slug=slug, user=user).first())
        team, role = (membership.team, membership.role) if membership is not None else (None, None)
    if team is None:
        raise SpecError(f'unknown team "{slug}", or you are not a member of it')
    if not user.is_staff and role not in SUBMIT_ROLES:
        raise SpecError(f'your role in team "{slug}" is {role}; only admins and members may submit jobs')
    return team


def checkpoint_job(team: Team, ref: int | str) -> int:
    """The id of the training job ``ref`` of ``team`` whose checkpoint a serving job loads.

    ``ref``: a job id, or a job name (the team's latest SUCCEEDED training job of that name, else its latest
    training job of that name). Raises SpecError naming what was not found or why it does not fit.
    """
    jobs = Job.objects.filter(team=team)
    if isinstance(ref, int):
        job = jobs.filter(pk=ref).only("pk", "kind").first()
        if job is None:
            raise SpecError(f'no job {ref} in team "{team.slug}"')
        if job.kind != Job.Kind.TRAINING:
            raise SpecError(f"job {ref} is an {job.kind} job; checkpoint_from names a training job")
        return job.pk
    named = jobs.filter(name=ref, kind=Job.Kind.TRAINING).order_by("-created_at", "-id")
    job_id = (named.filter(state="SUCCEEDED").values_list("pk", flat=True).first()
              or named.values_list("pk", flat=True).first())
    if job_id is None:
        raise SpecError(f'no training job named "{ref}" in team "{team.slug}"; submit it first '
                        f"(or give the training job's id)")
    return job_id


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


def share_errors(resources: JobResources) -> dict[str, list[str]]:
    """The rules of a job asking part of one GPU, errors by ``spec.resources`` field (docs/adr/0040-gpu-sharing.md):
    a fraction (``gpus_per_node`` below 1) or a ``mig_profile`` runs on one node, one device, without
    ``alternatives`` (a share is of one accelerator's GPU); not both at once. Empty for a whole-GPU job."""
    fraction, profile = is_fraction(resources.gpus_per_node), resources.mig_profile
    if not fraction and profile is None:
        return {}
    asked = (f"a fraction of one GPU (gpus_per_node {resources.gpus_per_node})" if fraction
             else f"a MIG instance (mig_profile {profile})")
    errors: dict[str, list[str]] = {}
    if fraction and profile is not None:
        errors["mig_profile"] = ["give either a fraction of a GPU (gpus_per_node below 1) or a MIG profile, not both"]
    if profile is not None and resources.gpus_per_node != 1 and not fraction:
        errors["gpus_per_node"] = [f"a job with a mig_profile gets one MIG instance: gpus_per_node must be 1 (got "
                                   f"{resources.gpus_per_node})"]
    if resources.nodes != 1:
        errors["nodes"] = [f"{asked} runs on one node: nodes must be 1 (got {resources.nodes}); a job on several "
                           f"nodes asks whole GPUs"]
    if resources.alternatives:
        errors["alternatives"] = [f"{asked} is a share of one accelerator's GPU: no alternatives"]
    return errors


def mig_profile_errors(accelerator: Accelerator, profile: str | None) -> dict[str, list[str]]:
    """Errors of ``spec.resources.mig_profile`` on ``accelerator``: the profile must be one of the accelerator's in
    NVIDIA's table (``core.gpus.MIG_PROFILES``); empty when it is, or when no profile is asked."""
    if profile is None or mig_profile(accelerator.name, profile) is not None:
        return {}
    known = MIG_PROFILES.get(accelerator.name)
    if not known:
        return {"mig_profile": [f"{accelerator.name} has no MIG profiles; MIG is offered on "
                                f"{', '.join(sorted(MIG_PROFILES))}"]}
    return {"mig_profile": [f'{accelerator.name} has no MIG profile "{profile}"; its profiles: {", ".join(known)}']}


def gpu_share_milli(resources: JobResources, accelerator: Accelerator) -> int:
    """The share of one GPU a validated job's pod holds, in milli-GPUs: a fraction's (``core.gpus.milli_of``), a
    MIG profile's (``MigProfile.share_milli``), or 0 for whole GPUs."""
    if resources.mig_profile is not None:
        return mig_profile(accelerator.name, resources.mig_profile).share_milli
    return milli_of(resources.gpus_per_node) if is_fraction(resources.gpus_per_node) else 0


def cpu_only_errors(resources: JobResources, lookups: Lookups) -> dict[str, list[str]]:
    """The rules of a CPU-only job on validated ``resources``, errors by field: an absent accelerator is CPU when
    ``gpus_per_node`` is 0 (then set, with ``lookups.accelerator``) and required otherwise; the CPU flavor has no
    GPUs, a GPU accelerator is not asked for 0 of them; a CPU-only job names its ``cpu`` (what places and bills
    it) and no ``alternatives``. Empty when the resources agree."""
    gpus = resources.gpus_per_node
    if resources.accelerator is None:
        if gpus:
            return {"accelerator": ["This field is required unless gpus_per_node is 0 (a CPU-only job)."]}
        try:
            lookups.accelerator = accelerator_named(CPU_ACCELERATOR)
        except SpecError:
            return {"accelerator": ["no CPU node pool has nodes, so a CPU-only job could never run"]}
        resources.accelerator = CPU_ACCELERATOR
    accelerator = lookups.accelerator
    if accelerator.is_cpu and gpus:
        return {"gpus_per_node": ["CPU node pools have no GPUs: a job on CPU asks gpus_per_node 0"]}
    if not accelerator.is_cpu and not gpus:
        return {"gpus_per_node": [f"0 GPUs is a CPU-only job, which runs on CPU node pools: leave out accelerator "
                                  f"(or give {CPU_ACCELERATOR}) instead of {accelerator.name}"]}
    if gpus:
        return {}
    errors = {}
    if resources.cpu is None:
        errors["cpu"] = ["required for a CPU-only job (gpus_per_node 0): the CPU cores per node it is placed and "
                         "billed by"]
    if resources.alternatives:
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
        except SpecError as exc:
            problems.append(str(exc))
    return {"alternatives": problems} if problems else {}


def role_errors(spec: MultiRoleSpec, lookups: Lookups | None) -> dict[str, list[str]]:
    """Errors by spec field (``roles.<name>.<field>``) of a validated multi-role ``spec``: a role named another's
    name, ``-`` and a digit (their pods' names would read alike: ``costs.prometheus.pod_role``), a role with
    neither command nor args, with accelerator ``alternatives``, or on another accelerator than the first role (every role
    runs on one accelerator); no role with ``completion`` (the job could never succeed); ``preemptible`` true (a
    multi-role job is neither preempted nor preempts). With ``lookups`` (the submission's), each role that can
    never run on the fleet as ``never_errors`` judges a single-role job of its shape, then the roles that can never
    run together (``jobs.scheduling.never.gang_never_fits``: over the team's quota or any pool's room, on
    ``roles``); ``lookups.accelerator`` is
    then the roles' accelerator."""
    errors: dict[str, list[str]] = {}
    if spec.preemptible:
        errors["preemptible"] = ["a multi-role job is neither preempted nor preempts (its roles are admitted and "
                                 "ended together): preemptible must be false"]
    if not any(role.completion for role in spec.roles.values()):
        errors["roles"] = ["at least one role must have completion: true, or the job could never succeed"]
    first = None
    for name, role in spec.roles.items():
        at = f"roles.{name}"
        shadowed = next((other for other in spec.roles if re.match(rf"{re.escape(other)}-[0-9]", name)), None)
        if shadowed is not None:
            errors[at] = [f"role {name} is role {shadowed}'s name, '-' and a digit: on Kubernetes pod <index> of "
                          f"role {shadowed} is named <attempt>-{shadowed}-<index>-<random suffix>, which the pods of "
                          f"role {name} (<attempt>-{name}-...) cannot be told apart from by name (the per-role "
                          f"utilization reads pod names); rename one, e.g. without the '-' before the digit"]
        if not role.command and not role.args:
            errors[f"{at}.command"] = ["required unless args are given (the image's ENTRYPOINT then runs with them)"]
        if role.resources.alternatives:
            errors[f"{at}.resources.alternatives"] = ["a role of a multi-role job runs on one accelerator: no "
                                                      "alternatives"]
        if is_fraction(role.resources.gpus_per_node) or role.resources.mig_profile is not None:
            errors[f"{at}.resources.gpus_per_node"] = ["a role of a multi-role job asks whole GPUs (or none): "
                                                       "fractions and MIG profiles are for single-role jobs"]
        accelerator = role.resources.accelerator
        if first is None:
            first = (name, accelerator)
        elif accelerator is not None and first[1] is not None and accelerator != first[1]:
            errors[f"{at}.resources.accelerator"] = [
                f"every role of a multi-role job runs on one accelerator: role {first[0]} asks {first[1]}, this one "
                f"{accelerator}"]
    if errors or lookups is None:
        return errors
    accelerator = accelerator_named(first[1])
    lookups.accelerator = accelerator
    for name, role in spec.roles.items():
        single = JobSpec.model_construct(resources=role.resources, placement=spec.placement, preemptible=False)
        for key, messages in never_errors(lookups.team, single, accelerator).items():
            errors[f"roles.{name}.resources.{key}" if key and key != "preemptible" else
                   f"roles.{name}.resources" if not key else "preemptible"] = messages
    if not errors:
        from .scheduling.never import gang_never_fits

        together = gang_never_fits(lookups.team, accelerator, [
            (name, role.resources.model_dump(include={"gpus_per_node", "nodes", "cpu", "memory_gib"}))
            for name, role in roles_in_order(spec.roles).items()], spec.placement.model_dump())
        if together:
            errors["roles"] = [together]
    return errors


def kind_errors(kind: str, spec: JobSpec) -> dict[str, list[str]]:
    """Errors by spec field of the kind rules: a training job without ``max_runtime_seconds``, a field of other
    kinds only (:data:`KIND_SPECIFIC`) given, and a spec with neither ``command`` nor ``args`` (nothing would say what to run: a container with ``args`` and no
    ``command`` runs the image's ENTRYPOINT with them, Kubernetes "Define a command and arguments")."""
    errors = {}
    shared = is_fraction(spec.resources.gpus_per_node) or spec.resources.mig_profile is not None
    if shared and kind == INFERENCE and spec.replicas > 1:
        errors["replicas"] = ["a server on part of a GPU (a fraction or a MIG profile) runs one replica: replicas "
                              f"must be 1 (got {spec.replicas}); submit one job per replica"]
    scaling = getattr(spec, "autoscaling", None)
    if shared and kind == INFERENCE and scaling is not None and scaling.max_replicas > 1:
        errors["autoscaling.max_replicas"] = [
            f"a server on part of a GPU (a fraction or a MIG profile) runs one replica, so it is not autoscaled: "
            f"max_replicas must be 1 (got {scaling.max_replicas})"]
    if kind != INFERENCE and spec.max_runtime_seconds is None:
        errors["max_runtime_seconds"] = ["required for training jobs: it bounds the run and the cost estimate that "
                                         "admission checks against the budget (a serving job may leave it out)"]
    if not spec.command and not spec.args:
        errors["command"] = ["required unless args are given (the image's ENTRYPOINT then runs with them)"]
    scaling = spec.autoscaling
    if kind == INFERENCE and scaling is not None and "replicas" in spec.model_fields_set and not (
            max(1, scaling.min_replicas) <= spec.replicas <= scaling.max_replicas):
        errors["replicas"] = [f"must be within autoscaling's min_replicas and max_replicas ({max(1, scaling.min_replicas)}.."
                              f"{scaling.max_replicas}); got {spec.replicas}"]
    for name, kinds in KIND_SPECIFIC.items():
        if kind not in kinds and name in spec.model_fields_set:
            errors[name] = [f"{name} applies to {' and '.join(kinds)} jobs only"]
    return errors


#: Commands that load a checkpoint before they serve, and exit without one (``examples/serve.py`` exits 2,
#: "cannot load checkpoint"): an inference job running one must name the training job it serves
#: (``checkpoint_from``) unless its arguments or environment point it at a checkpoint themselves.
CHECKPOINT_LOADERS = ("examples/serve.py",)
# CHECKPOINT_ARGS, CHECKPOINT_ENV (jobs.dependencies): the arguments and environment through which a loader is given
# a checkpoint directly.


def serving_errors(kind: str, spec: JobSpec) -> dict[str, list[str]]:
    """Errors by spec field of an inference ``spec`` that could never start: several ``resources.nodes`` for one
    server (each replica is one server on one node; the runners start ``replicas`` pods), or a checkpoint loader
    (:data:`CHECKPOINT_LOADERS`) with no ``checkpoint_from`` and no checkpoint given in its arguments or
    environment (the job's own checkpoint directory is empty: nothing trained it). Empty for a training job."""
    if kind != INFERENCE:
        return {}
    errors: dict[str, list[str]] = {}
    if spec.resources.nodes > 1:
        errors["resources.nodes"] = [
            f"an inference server runs on one node, so nodes must be 1 (got {spec.resources.nodes}); for more "
            f"servers ask for more replicas, each on a node of its own or sharing one"]
    words = [*spec.command, *spec.args]
    loader = next((w for w in words for name in CHECKPOINT_LOADERS if w == name or w.endswith("/" + name)), None)
    given = any(w.split("=", 1)[0] in CHECKPOINT_ARGS for w in words) or any(k in spec.env for k in CHECKPOINT_ENV)
    if loader is not None and spec.checkpoint_from is None and spec.follow is None and not given:
        errors["checkpoint_from"] = [
            f"{loader} loads a checkpoint before it serves, and this job names none: set checkpoint_from to the "
            f"training job whose checkpoint it serves (its id or name), or pass --checkpoint-dir or "
            f"--checkpoint-uri; without one the server would exit at start (cannot load checkpoint)"]
    return errors


def starting_replicas(spec: JobSpec) -> int:
    """The replicas a serving job starts with: ``spec.replicas`` when given, else autoscaling's ``min_replicas``,
    else 1."""
    if "replicas" not in spec.model_fields_set and spec.autoscaling is not None:
        return max(1, spec.autoscaling.min_replicas)  # a job that scales to zero starts with one
    return spec.replicas


def never_errors(team: Team, spec: JobSpec, accelerator: Accelerator,
                 kind: str = Job.Kind.TRAINING.value) -> dict[str, list[str]]:
    """Why the validated ``spec`` of a ``kind`` job on ``accelerator`` can never run for ``team``, by
    ``spec.resources`` field (``""``: the resources as a whole; ``"replicas"``: ``spec.replicas``; ``"preemptible"``:
    ``spec.preemptible``), from
    ``jobs.scheduling.never`` (which counts pods and nodes as placement does); empty when it could on its
    accelerator or on one of its alternatives (the accelerator's reasons are given)."""
    from .scheduling.never import never_fits

    resources = {"gpus_per_node": whole_gpus(spec.resources.gpus_per_node), "nodes": spec.resources.nodes,
                 "cpu": spec.resources.cpu, "memory_gib": spec.resources.memory_gib,
                 "share_milli": gpu_share_milli(spec.resources, accelerator) if not accelerator.is_cpu else 0,
                 "mig_profile": spec.resources.mig_profile or ""}
    placement = {"providers": spec.placement.providers, "regions": spec.placement.regions,
                 "clusters": spec.placement.clusters}
    replicas = starting_replicas(spec) if kind == INFERENCE else 1
    errors = never_fits(team, accelerator, resources, placement, spec.preemptible, replicas, kind)
    for name in spec.resources.alternatives:
        if not errors:
            break
        if not never_fits(team, accelerator_named(name), resources, placement, spec.preemptible, replicas, kind):
            errors = {}
    if not errors and kind == INFERENCE and spec.autoscaling is not None \
            and spec.autoscaling.max_replicas > replicas:
        # every replica up to max_replicas must be placeable and within the team's limits, or a scale-up could
        # never succeed: refused now, naming the field (the same rule as any submission, ADR 0019)
        most = never_fits(team, accelerator, resources, placement, spec.preemptible, spec.autoscaling.max_replicas,
                          kind)
        if most:
            errors = {"autoscaling.max_replicas": [m for messages in most.values() for m in messages]}
    return errors


def memory_errors(kind: str, spec: JobSpec, accelerator: Accelerator) -> dict[str, list[str]]:
    """Errors by spec field of the validated ``spec`` on ``accelerator`` for its ``model`` and ``parallelism``
    declaration: impossible values (``jobs.efficiency.memory.declaration_errors``), then, for a training job
    that declares a model, an estimate over the accelerator's memory per GPU with its breakdown and the smallest
    changes that fit (``fit_errors``). Empty without a declaration."""
    model, parallelism = spec.model, spec.parallelism
    resources = spec.resources
    if model is None and parallelism is None or not resources.gpus_per_node:
        return {}  # a CPU-only job: no GPU memory to fit, and no MFU (no accelerator peak)
    parallelism = parallelism or JobParallelism()
    layout = Layout(resources.nodes * whole_gpus(resources.gpus_per_node), parallelism.zero_stage, parallelism.tensor_parallel,
                    parallelism.pipeline_parallel, parallelism.sequence_parallel)
    declared = model.model_dump() if model is not None else None
    errors = declaration_errors(declared, layout)
    if errors or declared is None or kind != Job.Kind.TRAINING:
        return errors
    if is_fraction(resources.gpus_per_node) or resources.mig_profile is not None:
        return {}  # the fit is of whole GPUs' memory; the memory of a share is not modelled (ADR 0040)
    others = Accelerator.objects.annotate(largest=Max("node_pools__gpus_per_node", filter=Q(node_pools__nodes__gt=0)))
    return fit_errors(declared, layout, accelerator.name, accelerator.memory_gib,
                      gpus_per_node=resources.gpus_per_node,
                      accelerators=lambda: [(a.name, a.memory_gib) for a in others.filter(
                          largest__gte=resources.gpus_per_node)])


# --- Errors as flat dotted paths.

_MESSAGES = {
    "missing": "This field is required.",
    "int_type": "A valid integer is required.",
    "int_from_float": "A valid integer is required.",
    "bool_type": "Must be a valid boolean.",
    "string_type": "Not a valid string.",
    "string_unicode": "Not a valid string (not Unicode text: a lone surrogate?).",
    "string_too_short": "This field may not be blank.",
    "string_too_long": "Ensure this field has no more than {max_length} characters.",
    "too_long": "Ensure this list has no more than {max_length} items.",
    "greater_than_equal": "Ensure this value is greater than or equal to {ge}.",
    "less_than_equal": "Ensure this value is less than or equal to {le}.",
}
_NOT_A_MAPPING = ("model_type", "model_attributes_type", "dict_type")


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model of the object at ``loc`` below the submission, or None (a tag of ``SPEC_TAGS`` in ``loc`` names
    the spec's model; a role's name, a role)."""
    model: Any = JobSubmission
    for index, key in enumerate(loc):
        if index == 0 and key == "spec" and len(loc) > 1 and loc[1] in SPEC_TAGS:
            continue  # the tag that follows names the model
        if index == 1 and loc[0] == "spec" and key in SPEC_TAGS:
            model = SPEC_TAGS[key]
            continue
        if model is MultiRoleSpec and key == "roles":
            continue  # the role's name follows
        if model is MultiRoleSpec and loc[index - 1] == "roles":
            model = JobRole
            continue
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def _message(error: dict) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "refused":
        return ctx["reason"]
    if error.get("input", ...) is None and kind != "missing":
        return "This field may not be null."
    if kind in _NOT_A_MAPPING:
        return f"Invalid data. Expected a dictionary, but got {type(error['input']).__name__}."
    if kind in ("extra_forbidden", "invalid_key"):
        model = _model_at(error["loc"][:-1])
        expected = ", ".join(model.model_fields) if model is not None else ""
        return f"unknown field; expected one of {expected}"
    template = _MESSAGES.get(kind)
    return template.format(**ctx) if template is not None else error["msg"]


#: The most errors one answer lists, and the longest field path it shows (characters): a document with thousands
#: of unknown or bad keys costs a bounded answer, never one that echoes the document (docs/adr/0033).
MAX_ERRORS_SHOWN = 50
MAX_PATH_SHOWN = 120


def _shown_path(path: str) -> str:
    return path if len(path) <= MAX_PATH_SHOWN else f"{path[:MAX_PATH_SHOWN]}..."


def _field_loc(loc: tuple) -> tuple:
    """``loc`` without what pydantic adds that names no field: the spec model's tag after ``spec``
    (``SPEC_TAGS``) and a mapping key's ``[key]``."""
    if len(loc) > 1 and loc[0] == "spec" and loc[1] in SPEC_TAGS:
        loc = (loc[0], *loc[2:])
    return tuple(key for key in loc if key != "[key]")


def error_paths(exc: ValidationError) -> dict[str, list[str]]:
    """``exc``'s errors as ``{"a.b.c": [messages]}`` (``non_field_errors``: the document as a whole); a model's
    rules give their errors by the fields they name. At most ``MAX_ERRORS_SHOWN`` errors are listed (the rest are
    counted in one ``non_field_errors`` message), each path cut to ``MAX_PATH_SHOWN`` characters."""
    flat: dict[str, list[str]] = {}
    shown = 0
    for error in exc.errors(include_url=False):
        if shown >= MAX_ERRORS_SHOWN:
            break
        path = ".".join(str(key) for key in _field_loc(error["loc"]))
        if error["type"] == "rules":
            for sub_path, messages in error["ctx"]["errors"].items():
                key = f"{path}.{sub_path}" if path and sub_path else (path or sub_path)
                flat.setdefault(_shown_path(key) or api_settings.NON_FIELD_ERRORS_KEY, []).extend(messages)
        else:
            flat.setdefault(_shown_path(path) or api_settings.NON_FIELD_ERRORS_KEY, []).append(_message(error))
        shown += 1
    if (hidden := exc.error_count() - shown) > 0:
        flat.setdefault(api_settings.NON_FIELD_ERRORS_KEY, []).append(
            f"{hidden} more error(s) not listed; fix the ones above first.")
    return flat


# --- A submission, validated.

_VALIDATE = JobSubmission.__pydantic_validator__.validate_python


def submission_errors(data, lookups: Lookups) -> tuple[JobSubmission | None, dict[str, list[str]]]:
    """``(the validated submission, {})`` for ``data`` with ``lookups`` filled, or ``(None, errors by dotted
    path)``. An oversized or unencodable spec is refused on ``spec`` alone, before its fields are read (the
    other fields are still checked)."""
    spec = data.get("spec") if isinstance(data, Mapping) else None
    error = spec_error(spec) if isinstance(spec, Mapping) else None
    if error is None:
        try:
            return _VALIDATE(data, context=lookups), {}
        except ValidationError as exc:
            return None, error_paths(exc)
    try:
        _VALIDATE({**data, "spec": {}}, context=lookups)
        errors = {}
    except ValidationError as exc:
        errors = {path: messages for path, messages in error_paths(exc).items()
                  if path != "spec" and not path.startswith("spec.")}
    return None, {**errors, "spec": [error]}


def stored_spec(spec: JobSpec, kind: str) -> dict:
    """The validated ``spec`` as stored on the Job, in the model's field order: every field present (an optional
    one without default as null) except those of other job kinds, absent declarations (``model``,
    ``parallelism``) and an absent ``resources.mig_profile``; a multi-role spec's roles in name order
    (``jobs.models.roles_in_order``)."""
    if isinstance(spec, MultiRoleSpec):
        stored = spec.model_dump()
        for role in stored["roles"].values():
            _without_absent_profile(role["resources"])
        return {**stored, "roles": roles_in_order(stored["roles"])}
    leave_out = {name for name, kinds in KIND_SPECIFIC.items() if kind not in kinds}
    leave_out.update(name for name in DECLARATIONS if getattr(spec, name) is None)
    stored = spec.model_dump(exclude=leave_out)
    _without_absent_profile(stored["resources"])
    return stored


def _without_absent_profile(resources: dict) -> None:
    """Drop ``mig_profile`` from stored ``resources`` when it was not given: only a MIG job's spec carries it."""
    if resources.get("mig_profile") is None:
        resources.pop("mig_profile", None)


def submission_fields(submission: JobSubmission, lookups: Lookups) -> dict:
    """``submit_job``'s keyword arguments from a ``submission`` validated with ``lookups``: team, submitter,
    name, kind, the stored spec, the columns admission reads (``resources``: accelerator row, GPUs per
    node, nodes, numeric priority, preemptible, max runtime in seconds, max retries, replicas: 1 for
    training; for a multi-role job the roles' accelerator, their largest GPUs per pod and all their pods), and
    ``after``: the upstream jobs, ``(Job, condition)`` pairs (``jobs.dependencies``)."""
    spec, kind = submission.spec, submission.kind
    classes = lookups.classes if lookups.classes is not None else priority_classes()
    if isinstance(spec, MultiRoleSpec):
        roles = [role.resources for role in spec.roles.values()]
        return {
            "team": lookups.team, "submitter": lookups.user, "name": submission.name, "kind": kind,
            "spec": stored_spec(spec, kind),
            "resources": {
                "accelerator": lookups.accelerator,
                # the columns of a single shape: the largest pod's GPUs and every role's pods; admission reads the
                # roles (jobs.scheduling.snapshot.role_shapes) and Job.total_gpus sums them
                "gpus_per_node": max(r.gpus_per_node for r in roles),
                "nodes": sum(r.nodes for r in roles),
                "priority": classes[spec.priority], "preemptible": False,
                "max_runtime_seconds": spec.max_runtime_seconds, "max_retries": spec.max_retries, "replicas": 1,
            },
            "after": list(lookups.after),
        }
    resources = spec.resources
    return {
        "team": lookups.team,
        "submitter": lookups.user,
        "name": submission.name,
        "kind": kind,
        "spec": stored_spec(spec, kind),
        "resources": {
            "accelerator": lookups.accelerator,
            "gpus_per_node": whole_gpus(resources.gpus_per_node),
            "gpu_share_milli": gpu_share_milli(resources, lookups.accelerator),
            "mig_profile": resources.mig_profile or "",
            "nodes": resources.nodes,
            "priority": classes[spec.priority],
            "preemptible": spec.preemptible,
            "max_runtime_seconds": spec.max_runtime_seconds,
            "max_retries": spec.max_retries,
            "replicas": starting_replicas(spec) if kind in KIND_SPECIFIC["replicas"] else 1,
        },
        "after": list(lookups.after),
    }


def resubmission(job) -> dict:
    """The submission document that stored ``job`` (a ``jobs.models.Job``): ``{"team": slug, "name", "kind",
    "spec"}``, its stored spec as submitted and validated then, ready for ``validated_submission`` again (a
    resubmission is validated against today's quotas, pools and rules like any submission). A
    ``checkpoint_from`` stored as a job id stays that id. Fields stored as null or as an empty list (an optional
    field left out, ``stored_spec``) are left out again, since a submission that gives them must give a value:
    the document validates to the same stored spec. Its dependencies come back as ``after`` by job id (left out
    when it has none)."""
    document = {"team": job.team.slug, "name": job.name, "kind": job.kind, "spec": _given(dict(job.spec or {}))}
    after = [{"job": upstream, "condition": condition} for upstream, condition in
             job.dependencies.order_by("position").values_list("upstream_id", "condition")]
    if after:
        document["after"] = after
    return document


def _given(value):
    """``value`` (a stored spec or part of one) without the keys whose value is None or ``[]``, at every level."""
    if isinstance(value, dict):
        return {k: _given(v) for k, v in value.items() if v is not None and v != []}
    return value


def validated_submission(data, user) -> dict:
    """``submit_job``'s keyword arguments for the submission ``data`` (parsed JSON or YAML) by ``user``.

    Raises DRF's ValidationError (a 400) with errors by dotted field path for a bad submission.
    """
    lookups = Lookups(user)
    submission, errors = submission_errors(data, lookups)
    if errors:
        raise serializers.ValidationError(errors)
    return submission_fields(submission, lookups)


@functools.cache
def _schema() -> dict:
    return JobSubmission.model_json_schema()


def field_schema(path: str) -> dict:
    """The JSON schema of the submission's field at dotted ``path`` (``"spec.resources.nodes"``), references
    resolved: its ``type``, ``default``, ``enum``, bounds, ``maxLength``, ``example`` and ``description``.
    KeyError when there is no such field."""
    schema = root = _schema()

    def resolved(schema: dict) -> dict:
        while "$ref" in schema:
            schema = {**root["$defs"][schema["$ref"].rsplit("/", 1)[1]],
                      **{k: v for k, v in schema.items() if k != "$ref"}}
        return schema

    for key in path.split("."):
        choices = schema.get("oneOf") or schema.get("anyOf")
        if "properties" not in schema and choices:  # the spec: the first model with the field
            schema = next((c for c in map(resolved, choices) if key in c.get("properties", {})), None)
            if schema is None:
                raise KeyError(key)
        schema = resolved(schema["properties"][key])
    return schema
