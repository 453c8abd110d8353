"""The fields of a job submission, declared once.

``SUBMISSION`` is the whole document a client submits (``team``, ``name``,
``kind``, ``spec`` and everything under ``spec``) as a tree of
:class:`SpecField`: key, type, bounds, default and meaning. ``jobs.spec``
builds both validators of a submission from it: the DRF serializers (their
error messages and the OpenAPI schema) and the plain checks of the fast
submission path, which must accept exactly what the serializers accept. A new
field is one line here; a new :class:`FieldType` also needs its two builders
in ``jobs.spec`` (the module refuses to import without them).

What a single field cannot say stays in code, in one place each, used by both
paths: the lookups (team membership, the accelerator and its largest node
pool, the priority class table), the kind rules (``kinds``), and the size
limit of the encoded spec (``settings.JOB_SPEC_MAX_BYTES``).

This module declares only; it imports no DRF.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from core.fields import INT32_MAX
from runners.models import Cluster

from .models import PRIORITY_CLASSES, Job

# Kubernetes DNS-1123 label: the job name ends up in object names and labels.
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL_MAX = 63
# POSIX portable environment variable names (IEEE Std 1003.1, 8.1).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_MAX_LENGTH = 512
INFERENCE_DEFAULT_PORT = 8000
PORT_MAX = 65535


class FieldType(enum.Enum):
    """What a field's value is; each type has a DRF builder and a fast check in ``jobs.spec``."""

    STRING = "string"  # a non-blank string, trimmed (a str in the fast path: ASCII, nothing to trim)
    INTEGER = "integer"  # an int between min_value and max_value inclusive; no bool, float or string
    BOOLEAN = "boolean"  # true or false only
    POSITIVE_NUMBER = "positive_number"  # a finite int or float above 0
    STRING_LIST = "string_list"  # a list of strings without NUL; allow_empty=False: non-empty, no empty items
    ENV = "env"  # a mapping of POSIX variable names (ENV_NAME) to strings without NUL
    CHOICE = "choice"  # one of choices
    PRIORITY = "priority"  # a name in the quotas.PriorityClass table (read when validated)
    OBJECT = "object"  # a mapping of the child fields (``fields``); unknown keys are refused
    JOB_REF = "job_ref"  # a job of the submission's team, by id (int) or name (str), or null; stored as the id


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()


@dataclass(frozen=True)
class SpecField:
    """One field of a job submission.

    ``name``: its key in the enclosing mapping. ``type``: a :class:`FieldType`.
    ``doc``: what it means, with its unit. ``default``: the value when the key
    is absent, or a zero-argument callable that makes it (``list``, ``dict``);
    a field with a default is optional. ``optional``: may be absent without a
    default (the stored spec then holds null). ``min_value``/``max_value``:
    inclusive integer bounds. ``max_length``: characters of a string.
    ``pattern``/``pattern_error``: a string must match the compiled regex in
    full, else the error says ``pattern_error``. ``allow_empty``: whether a
    string list may be ``[]`` or hold ``""``. ``choices``: allowed values
    (CHOICE: values or ``(value, label)`` pairs; STRING_LIST: values).
    ``kinds``: the job kinds the field applies to (empty: all); for others it
    is refused, and for them its ``default`` is set once the kind is known.
    ``looked_up``: the value names a row (team, accelerator) that validation
    replaces by the row; the stored spec keeps the name. ``fields``: the
    children of an OBJECT.
    """

    name: str
    type: FieldType
    doc: str
    default: Any = NO_DEFAULT
    optional: bool = False
    min_value: int | None = None
    max_value: int | None = None
    max_length: int | None = None
    pattern: re.Pattern | None = None
    pattern_error: str = ""
    allow_empty: bool = True
    choices: tuple | None = None
    kinds: tuple[str, ...] = ()
    looked_up: bool = False
    fields: tuple[SpecField, ...] = ()
    kept_when_absent: bool = True

    def __post_init__(self):
        if (self.type is FieldType.OBJECT) != bool(self.fields):
            raise ValueError(f"{self.name}: an OBJECT has child fields, and only an OBJECT")
        if (self.type is FieldType.CHOICE) and not self.choices:
            raise ValueError(f"{self.name}: a CHOICE needs choices")
        if self.pattern is not None and not self.pattern_error:
            raise ValueError(f"{self.name}: a pattern needs its pattern_error")
        if self.kinds and self.default is NO_DEFAULT:
            raise ValueError(f"{self.name}: a field of some kinds only needs the default those kinds get")

    @property
    def required(self) -> bool:
        """Whether the key must be present: no default and not ``optional`` (a kind-specific field never is)."""
        return self.default is NO_DEFAULT and not self.optional and not self.kinds

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    def default_value(self):
        """A fresh default (a new list or dict each time for ``default=list``/``dict``)."""
        return self.default() if callable(self.default) else self.default

    @property
    def choice_values(self) -> tuple:
        """The allowed values of ``choices`` without their labels."""
        return tuple(c[0] if isinstance(c, tuple) else c for c in self.choices or ())

    def child(self, name: str) -> SpecField:
        """The child field ``name`` of an OBJECT; KeyError if it has none."""
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(name)


STRING, INTEGER, OBJECT, STRING_LIST = FieldType.STRING, FieldType.INTEGER, FieldType.OBJECT, FieldType.STRING_LIST
INFERENCE = Job.Kind.INFERENCE.value

RESOURCES = (
    SpecField("accelerator", STRING, "accelerator name (e.g. H100-80GB), looked up; a node pool with nodes must "
              "offer it. Absent with gpus_per_node 0: CPU (a CPU-only job, on the nodes of CPU node pools)",
              looked_up=True, optional=True),
    SpecField("gpus_per_node", INTEGER, "GPUs on each node; at most the GPUs per node of the accelerator's largest "
              "node pool; 0: a CPU-only job (then cpu is required, and it is placed and billed by its CPU and "
              "memory)", min_value=0, max_value=INT32_MAX),
    SpecField("nodes", INTEGER, "nodes the job runs on, each a distinct node of one node pool",
              min_value=1, max_value=INT32_MAX),
    SpecField("cpu", FieldType.POSITIVE_NUMBER, "CPU cores per node; absent: no request", optional=True),
    SpecField("memory_gib", FieldType.POSITIVE_NUMBER, "memory per node, GiB; absent: no request", optional=True),
    SpecField("alternatives", STRING_LIST, "other accelerators the job also accepts, by name, in order of preference "
              "after accelerator; quota and price are those of the one it gets", default=list, allow_empty=False),
)

PLACEMENT = (
    SpecField("providers", STRING_LIST, "allowed providers (Cluster.Provider values); empty: any",
              default=list, choices=tuple(Cluster.Provider.values)),
    SpecField("regions", STRING_LIST, "allowed regions; empty: any", default=list),
    SpecField("clusters", STRING_LIST, "allowed cluster names; empty: any", default=list),
)

#: The most parameters a declared model may have (10^15: far above any trained model).
MODEL_MAX_PARAMETERS = 10 ** 15

MODEL = (
    SpecField("parameters", INTEGER, "parameters of the model; absent: computed from layers and hidden_size "
              "(jobs.efficiency.flops.transformer_parameters)", optional=True, min_value=1,
              max_value=MODEL_MAX_PARAMETERS),
    SpecField("layers", INTEGER, "transformer layers", optional=True, min_value=1, max_value=INT32_MAX),
    SpecField("hidden_size", INTEGER, "hidden size (model width)", optional=True, min_value=1, max_value=INT32_MAX),
    SpecField("heads", INTEGER, "attention heads; must divide hidden_size", optional=True, min_value=1,
              max_value=INT32_MAX),
    SpecField("vocab_size", INTEGER, "vocabulary size, tokens", optional=True, min_value=1, max_value=INT32_MAX),
    SpecField("sequence_length", INTEGER, "training sequence length, tokens", optional=True, min_value=1,
              max_value=INT32_MAX),
    SpecField("micro_batch_size", INTEGER, "sequences per GPU per forward pass", optional=True, min_value=1,
              max_value=INT32_MAX),
    SpecField("precision", FieldType.CHOICE, "bf16 or fp16 (mixed precision: fp32 master weights) or fp32",
              default="bf16", choices=("bf16", "fp16", "fp32")),
    SpecField("optimizer", FieldType.CHOICE, "adam, adamw or sgd (with momentum)", default="adam",
              choices=("adam", "adamw", "sgd")),
    SpecField("activation_recomputation", FieldType.CHOICE, "none, selective (attention recomputed) or full "
              "(every layer from its input)", default="none", choices=("none", "selective", "full")),
)

PARALLELISM = (
    SpecField("zero_stage", INTEGER, "ZeRO / FSDP sharding over the data-parallel ranks: 0 (DDP), 1 (optimizer "
              "states), 2 (and gradients), 3 (and parameters; FSDP full sharding)", default=0, min_value=0,
              max_value=3),
    SpecField("tensor_parallel", INTEGER, "tensor-parallel degree", default=1, min_value=1, max_value=INT32_MAX),
    SpecField("pipeline_parallel", INTEGER, "pipeline-parallel stages", default=1, min_value=1,
              max_value=INT32_MAX),
    SpecField("sequence_parallel", FieldType.BOOLEAN, "sequence parallelism with the tensor parallelism",
              default=False),
)

SPEC = (
    SpecField("image", STRING, "container image reference", max_length=IMAGE_MAX_LENGTH),
    SpecField("command", STRING_LIST, "the container's command; absent: the image's ENTRYPOINT runs with args "
              "(then required)", default=list, allow_empty=False),
    SpecField("args", STRING_LIST, "arguments after the command (or the image's ENTRYPOINT)", default=list),
    SpecField("env", FieldType.ENV, "environment variables, name to value", default=dict),
    SpecField("resources", OBJECT, "what the job runs on", fields=RESOURCES),
    SpecField("priority", FieldType.PRIORITY, "priority class name (quotas.PriorityClass); higher values go first",
              default="normal", choices=tuple(PRIORITY_CLASSES)),
    SpecField("max_runtime_seconds", INTEGER, "run-time limit, seconds; bounds the cost estimate that admission "
              "checks against the budget", min_value=1, max_value=INT32_MAX),
    SpecField("preemptible", FieldType.BOOLEAN, "may run on spot capacity, and be preempted", default=False),
    SpecField("placement", OBJECT, "where the job may run; absent: anywhere", optional=True, fields=PLACEMENT),
    SpecField("max_retries", INTEGER, "new attempts after a lost one (spot preemption, node or cluster loss); for "
              "inference also after the server exits with an error or is OOM-killed (a training job that exits "
              "non-zero fails)",
              default=0, min_value=0, max_value=INT32_MAX),
    SpecField("model", OBJECT, "the model trained, for the memory-fit check at submission (training jobs) and "
              "MFU; absent: no check", optional=True, fields=MODEL, kept_when_absent=False),
    SpecField("parallelism", OBJECT, "how the model is split over the job's GPUs; absent: DDP", optional=True,
              fields=PARALLELISM, kept_when_absent=False),
    SpecField("replicas", INTEGER, "serving replicas", default=1, min_value=1, max_value=INT32_MAX,
              kinds=(INFERENCE,)),
    SpecField("port", INTEGER, "the container port the Service targets (env PORT on Kubernetes; the local runner "
              "gives every attempt a free PORT of its own)", default=INFERENCE_DEFAULT_PORT,
              min_value=1, max_value=PORT_MAX, kinds=(INFERENCE,)),
    SpecField("checkpoint_from", FieldType.JOB_REF, "the training job of the same team whose checkpoint the server "
              "loads: its id, or its name (the team's latest SUCCEEDED training job of that name, else its latest); "
              "stored as the id. The runners point CHECKPOINT_DIR (and on Kubernetes the checkpoint mount and "
              "CHECKPOINT_URI) at that job's checkpoints; null: the job's own", default=None, kinds=(INFERENCE,)),
)

SUBMISSION = SpecField("submission", OBJECT, "a job submission, as in examples/jobs/*.yaml", fields=(
    SpecField("team", STRING, "slug of the job's team, looked up; the submitter must be its admin or member "
              "(platform staff: any team)", looked_up=True),
    SpecField("name", STRING, "the job's name; it names Kubernetes objects", max_length=DNS_1123_LABEL_MAX,
              pattern=DNS_1123_LABEL,
              pattern_error="must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a "
                            "letter or digit, at most 63 characters (it names Kubernetes objects)"),
    SpecField("kind", FieldType.CHOICE, "training (a batch/v1 Job) or inference (a Deployment and its Service)",
              default=Job.Kind.TRAINING, choices=tuple(Job.Kind.choices)),
    SpecField("spec", OBJECT, "what to run, on what, and how", fields=SPEC),
))


def field_at(path: str) -> SpecField:
    """The field at dotted ``path`` below the submission (``"spec.resources.nodes"``; ``""``: the submission
    itself); KeyError if none is there."""
    field = SUBMISSION
    for name in path.split(".") if path else ():
        field = field.child(name)
    return field


def walk(field: SpecField = SUBMISSION, prefix: str = "") -> Iterator[tuple[str, SpecField]]:
    """Every field below ``field`` as ``(dotted path, SpecField)``, parents before their children, in table order."""
    for child in field.fields:
        path = f"{prefix}.{child.name}" if prefix else child.name
        yield path, child
        yield from walk(child, path)


def kind_specific(field: SpecField = SUBMISSION.child("spec")) -> tuple[SpecField, ...]:
    """The children of ``field`` that apply to some job kinds only (``replicas`` and ``port`` of the spec)."""
    return tuple(child for child in field.fields if child.kinds)

