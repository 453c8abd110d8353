"""Memory per GPU of a training job from its declared model and parallelism, and the smallest change that fits.

Model states (weights, gradients, optimizer states) follow ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", section 3 and table 1): with mixed precision (bf16 or
fp16) each parameter takes 2 bytes of weights, 2 of gradients and K = 12 of Adam optimizer states (fp32 master
weights, momentum, variance), 16 bytes in all; over Nd data-parallel ranks stage 1 shards the optimizer states
(``4Ψ + 12Ψ/Nd``), stage 2 the gradients too (``2Ψ + 14Ψ/Nd``), stage 3 the weights too (``16Ψ/Nd``). By the same
accounting SGD with momentum keeps K = 8 (fp32 master weights, momentum) under mixed precision; in fp32 the
weights and gradients take 4 bytes each and the optimizer keeps no master copy (Adam K = 8, SGD K = 4).
Tensor parallelism of degree t divides the model states by t, pipeline parallelism of p stages by p.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
section 4 (16-bit activations, sequence length s, micro-batch b, hidden size h, heads a, tensor-parallel degree t),
in bytes per transformer layer:

* no recomputation: ``s·b·h·(34 + 5·a·s/h)`` for t = 1; ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` with tensor
  parallelism; ``s·b·h·(34/t + 5·a·s/(h·t))`` with tensor and sequence parallelism (section 4.2.2);
* selective recomputation (the attention's ``5·a·s/h`` term is recomputed): ``s·b·h·34/t`` with sequence
  parallelism, ``s·b·h·(10 + 24/t)`` without (section 5);
* full recomputation: only each layer's input, ``2·s·b·h`` (``/t`` with sequence parallelism) (section 4.3).

Pipeline parallelism of p stages holds ``ceil(L/p)`` layers per stage, and in the 1F1B schedule the first stage
holds the activations of p micro-batches (section 4.2.3); it is the most loaded stage, so the estimate is
``per_layer x ceil(L/p) x p``. fp32 activations count twice the 16-bit bytes. Embedding and output-layer
activations, the CUDA context, communication buffers and allocator fragmentation are not counted: the estimate is
a lower bound of what the job needs.

Everything here is pure: mappings of the spec's ``model`` and ``parallelism`` objects (``jobs.spec.JobModel``, ``JobParallelism``, dumped) in,
numbers and messages out. Sizes are bytes; messages show GiB (2^30 bytes, the unit of the catalog's
``memory_gib``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .flops import transformer_parameters

GIB = 2 ** 30
#: Bytes per parameter of (weights, gradients, optimizer states) by (precision, optimizer); ZeRO section 3.1.
STATE_BYTES = {
    ("mixed", "adam"): (2, 2, 12),
    ("mixed", "sgd"): (2, 2, 8),
    ("fp32", "adam"): (4, 4, 8),
    ("fp32", "sgd"): (4, 4, 4),
}
PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adam", "adamw", "sgd")
RECOMPUTATION = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
#: The most nodes the "more GPUs" suggestion looks at.
MAX_SUGGESTED_NODES = 4096


@dataclass(frozen=True)
class Layout:
    """How a job runs: ``gpus`` in all (nodes x GPUs per node), ZeRO ``zero_stage`` (0: plain DDP),
    ``tensor`` and ``pipeline`` parallel degrees, ``sequence_parallel`` (with tensor parallelism)."""

    gpus: int
    zero_stage: int = 0
    tensor: int = 1
    pipeline: int = 1
    sequence_parallel: bool = False

    @property
    def data_parallel(self) -> int:
        """Data-parallel ranks Nd = gpus / (tensor x pipeline)."""
        return self.gpus // (self.tensor * self.pipeline)


@dataclass(frozen=True)
class Estimate:
    """Memory per GPU in bytes: ``weights``, ``gradients``, ``optimizer_states``, ``activations`` (None when the
    model's shape is not declared), on a layout with ``data_parallel`` ranks."""

    weights: float
    gradients: float
    optimizer_states: float
    activations: float | None
    data_parallel: int

    @property
    def model_states(self) -> float:
        """Weights + gradients + optimizer states, bytes."""
        return self.weights + self.gradients + self.optimizer_states

    @property
    def total(self) -> float:
        """Everything counted, bytes (activations as 0 when unknown)."""
        return self.model_states + (self.activations or 0.0)

    def breakdown(self) -> str:
        """``"weights 1.00 GiB + gradients ... = total X GiB"`` for messages."""
        acts = "activations not estimated (declare layers, hidden_size, heads, sequence_length, micro_batch_size)" \
            if self.activations is None else f"activations {self.activations / GIB:.2f} GiB"
        return (f"weights {self.weights / GIB:.2f} GiB + gradients {self.gradients / GIB:.2f} GiB + optimizer states "
                f"{self.optimizer_states / GIB:.2f} GiB + {acts} = {self.total / GIB:.2f} GiB per GPU "
                f"({self.data_parallel} data-parallel ranks)")


def precision_class(model: Mapping) -> str:
    """``"mixed"`` for bf16/fp16 (the default), ``"fp32"`` for fp32."""
    return "fp32" if model.get("precision") == "fp32" else "mixed"


def parameters_of(model: Mapping) -> int | None:
    """The declared ``parameters``, else the count from the shape (``transformer_parameters``), else None."""
    if model.get("parameters"):
        return int(model["parameters"])
    if model.get("layers") and model.get("hidden_size"):
        return transformer_parameters(model["layers"], model["hidden_size"], model.get("vocab_size") or 0,
                                      model.get("sequence_length") or 0)
    return None


def model_states(parameters: float, layout: Layout, precision: str = "mixed", optimizer: str = "adam"
                 ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes per GPU for ``parameters`` Ψ on ``layout`` (ZeRO section 3).

    ``precision``: ``"mixed"`` or ``"fp32"``; ``optimizer``: ``"adam"`` (also AdamW) or ``"sgd"``. Ψ is divided
    by the tensor and pipeline degrees, then stage 1 shards the optimizer states over the data-parallel ranks,
    stage 2 also the gradients, stage 3 also the weights. Raises KeyError for an unknown precision/optimizer.
    """
    w, g, k = STATE_BYTES[(precision, "sgd" if optimizer == "sgd" else "adam")]
    psi = parameters / (layout.tensor * layout.pipeline)
    nd = layout.data_parallel
    stage = layout.zero_stage
    return (w * psi / (nd if stage >= 3 else 1), g * psi / (nd if stage >= 2 else 1), k * psi / (nd if stage >= 1 else 1))


def activations_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                          recomputation: str = "none") -> float:
    """Activation bytes of one transformer layer (Korthikanti et al. 2022, sections 4-5; see the module docstring).

    ``s`` sequence length, ``b`` micro-batch (sequences), ``h`` hidden size, ``a`` heads, ``t`` tensor-parallel
    degree; ``recomputation`` ``"none"``, ``"selective"`` or ``"full"``. 16-bit activations.
    """
    sbh = s * b * h
    sp = sequence_parallel or t == 1
    if recomputation == "full":
        return 2 * sbh / (t if sp else 1)
    attention = 0.0 if recomputation == "selective" else 5 * a * s / (h * t)
    linear = 34 / t if sp else 10 + 24 / t
    return sbh * (linear + attention)


def estimate(model: Mapping, layout: Layout) -> Estimate:
    """Memory per GPU of the declared ``model`` (the spec's ``model`` object) on ``layout``.

    Model states from :func:`model_states`; activations from :func:`activations_per_layer` for
    ``ceil(layers / pipeline)`` layers and ``pipeline`` micro-batches in flight on the first stage, None when the
    shape (layers, hidden_size, heads, sequence_length, micro_batch_size) is incomplete. Raises ValueError when
    neither ``parameters`` nor ``layers`` and ``hidden_size`` are declared.
    """
    parameters = parameters_of(model)
    if parameters is None:
        raise ValueError("declare parameters, or layers and hidden_size")
    precision = precision_class(model)
    weights, gradients, optimizer = model_states(parameters, layout, precision, model.get("optimizer") or "adam")
    activations = None
    shape = [model.get(k) for k in ("layers", "hidden_size", "heads", "sequence_length", "micro_batch_size")]
    if all(shape):
        layers, h, a, s, b = shape
        per_layer = activations_per_layer(s, b, h, a, layout.tensor, layout.sequence_parallel,
                                          model.get("activation_recomputation") or "none")
        activations = per_layer * math.ceil(layers / layout.pipeline) * layout.pipeline
        if precision == "fp32":
            activations *= 2
    return Estimate(weights, gradients, optimizer, activations, layout.data_parallel)


def declaration_errors(model: Mapping | None, layout: Layout) -> dict[str, list[str]]:
    """Impossible values of a declaration, by field path below ``spec`` (``"model.heads"``,
    ``"parallelism.tensor_parallel"``...); empty when the declaration is consistent.

    Refused: a model with neither ``parameters`` nor ``layers`` and ``hidden_size``; heads that do not divide
    ``hidden_size``; a tensor-parallel degree that does not divide the heads; parallel degrees whose product
    does not divide the job's GPUs; a pipeline deeper than the layers.
    """
    errors: dict[str, list[str]] = {}
    model = model or {}
    t, p = layout.tensor, layout.pipeline
    if model and parameters_of(model) is None:
        errors["model"] = ["declare parameters, or layers and hidden_size (and heads, sequence_length, "
                           "micro_batch_size for the activations)"]
    h, a, layers = model.get("hidden_size"), model.get("heads"), model.get("layers")
    if h and a and h % a:
        errors["model.heads"] = [f"{a} heads do not divide hidden_size {h}: each head needs hidden_size / heads "
                                 f"dimensions"]
    if layout.gpus % t:
        errors["parallelism.tensor_parallel"] = [f"tensor_parallel {t} does not divide the job's {layout.gpus} GPUs"]
    elif layout.gpus % (t * p):
        errors["parallelism.pipeline_parallel"] = [
            f"tensor_parallel x pipeline_parallel = {t} x {p} = {t * p} does not divide the job's {layout.gpus} GPUs"]
    if a and t > 1 and a % t and "parallelism.tensor_parallel" not in errors:
        errors["parallelism.tensor_parallel"] = [f"tensor_parallel {t} does not divide the {a} heads"]
    if layers and p > layers:
        errors.setdefault("parallelism.pipeline_parallel", []).append(
            f"pipeline_parallel {p} is deeper than the model's {layers} layers")
    return errors


@dataclass(frozen=True)
class Change:
    """One change of the submission that makes the job fit: the ``field`` path (below the submission), its new
    ``value`` and the resulting ``estimate``."""

    field: str
    value: object
    estimate: Estimate

    def describe(self) -> str:
        return f"{self.field}: {self.value} ({self.estimate.total / GIB:.2f} GiB per GPU)"


def smallest_changes(model: Mapping, layout: Layout, capacity_bytes: float, *, gpus_per_node: int,
                     accelerators: Iterable[tuple[str, float]] = ()) -> list[Change]:
    """The smallest change of each kind that makes ``model`` fit ``capacity_bytes`` per GPU, in this order: a
    higher ZeRO stage, activation recomputation, more nodes (of ``gpus_per_node`` GPUs), a larger accelerator
    (``accelerators``: ``(name, memory bytes)`` pairs of the catalog). Each keeps everything else as declared;
    kinds where no value fits are left out (the list may be empty)."""
    changes: list[Change] = []

    def fits(m: Mapping, lay: Layout, capacity: float = capacity_bytes) -> Estimate | None:
        est = estimate(m, lay)
        return est if est.total <= capacity else None

    for stage in ZERO_STAGES[layout.zero_stage + 1:]:
        lay = Layout(layout.gpus, stage, layout.tensor, layout.pipeline, layout.sequence_parallel)
        if (est := fits(model, lay)) is not None:
            changes.append(Change("spec.parallelism.zero_stage", stage, est))
            break
    current = model.get("activation_recomputation") or "none"
    if estimate(model, layout).activations is not None:
        for mode in RECOMPUTATION[RECOMPUTATION.index(current) + 1:]:
            if (est := fits({**model, "activation_recomputation": mode}, layout)) is not None:
                changes.append(Change("spec.model.activation_recomputation", mode, est))
                break
    if layout.zero_stage >= 1:  # without sharding, more data-parallel ranks hold the same bytes each
        # Node counts whose GPUs the model-parallel group divides are the multiples of ``step``; the estimate
        # falls as they grow, so the smallest that fits is found by bisection.
        group = layout.tensor * layout.pipeline
        step = group // math.gcd(group, gpus_per_node)
        current = layout.gpus // gpus_per_node

        def at(k: int) -> Layout:
            return Layout(k * step * gpus_per_node, layout.zero_stage, layout.tensor, layout.pipeline,
                          layout.sequence_parallel)

        low, high = current // step + 1, MAX_SUGGESTED_NODES // step
        if low <= high and fits(model, at(high)) is not None:
            while low < high:
                middle = (low + high) // 2
                low, high = (low, middle) if fits(model, at(middle)) is not None else (middle + 1, high)
            changes.append(Change("spec.resources.nodes", low * step, estimate(model, at(low))))
    for name, memory in sorted(accelerators, key=lambda pair: (pair[1], pair[0])):
        if memory > capacity_bytes and (est := fits(model, layout, memory)) is not None:
            changes.append(Change("spec.resources.accelerator", name, est))
            break
    return changes


def fit_errors(model: Mapping, layout: Layout, accelerator: str, memory_gib: float, *, gpus_per_node: int,
               accelerators: Iterable[tuple[str, float]] | Callable[[], Iterable[tuple[str, float]]] = ()
               ) -> dict[str, list[str]]:
    """``{"model": [the estimate broken down, the smallest changes that fit]}`` when ``model`` on ``layout``
    needs more than the ``memory_gib`` GiB of one ``accelerator``; empty when it fits.

    ``accelerators``: the catalog's ``(name, memory GiB)`` pairs, for the "larger accelerator" change, or a
    function returning them (called only when the job does not fit).
    Call only on a declaration without :func:`declaration_errors`.
    """
    capacity = memory_gib * GIB
    est = estimate(model, layout)
    if est.total <= capacity:
        return {}
    if callable(accelerators):
        accelerators = accelerators()
    changes = smallest_changes(model, layout, capacity, gpus_per_node=gpus_per_node,
                               accelerators=[(n, m * GIB) for n, m in accelerators])
    messages = [f"does not fit the {memory_gib:g} GiB of one {accelerator}: {est.breakdown()}"]
    if changes:
        messages.append("smallest changes that fit: " + "; ".join(c.describe() for c in changes))
    else:
        messages.append("no single change fits (higher ZeRO stage, recomputation, more nodes, a larger "
                        "accelerator); use more tensor or pipeline parallelism, or a smaller micro-batch")
    return {"model": messages}
