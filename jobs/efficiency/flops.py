"""Model FLOPs per token, model FLOPs utilization (MFU) and cost per unit of work.

Source: Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", appendix B: training a decoder
transformer costs ``6N + 12·L·H·Q·T`` model FLOPs per token (N parameters, L layers, H heads, Q head dimension,
T sequence length; the second term is the attention over the sequence), and

    MFU = achieved tokens/s x FLOPs per token / (accelerators x peak FLOP/s per accelerator).

Recomputed activations do not count (that would be hardware FLOPs utilization, HFU). The peak is the catalog's
dense BF16 figure per accelerator (``runners.Accelerator.peak_bf16_tflops``, vendor data sheets, no sparsity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class Utilization:
    """An MFU figure, or why there is none.

    ``percent``: MFU in percent (0-100 for a sane run), None when it cannot be computed; ``reason``: why it is
    None ("" when it is not).
    """

    percent: float | None
    reason: str = ""


def transformer_parameters(layers: int, hidden_size: int, vocab_size: int = 0, sequence_length: int = 0) -> int:
    """Parameters of a GPT-style decoder of ``layers`` blocks of width ``hidden_size``.

    Per block ``12·h² + 13·h`` (attention QKV and output projections ``4h² + 4h``, a 4h MLP ``8h² + 5h``, two
    LayerNorms ``4h``), plus token and learned position embeddings ``(vocab_size + sequence_length)·h`` and the
    final LayerNorm ``2h``; the output projection is tied to the token embedding (GPT-2; Kaplan et al. 2020,
    table 1, count ``12·L·h²`` for the non-embedding part). Pass ``vocab_size=sequence_length=0`` for the
    non-embedding count.
    """
    h = hidden_size
    embeddings = (vocab_size + sequence_length) * h + 2 * h if (vocab_size or sequence_length) else 0
    return layers * (12 * h * h + 13 * h) + embeddings


def flops_per_token(parameters: float, layers: int, heads: int, head_dim: int, sequence_length: int) -> float:
    """Training model FLOPs per token: ``6·N + 12·L·H·Q·T`` (PaLM, Chowdhery et al. 2022, appendix B).

    ``parameters`` N, ``layers`` L, ``heads`` H, ``head_dim`` Q (hidden size / heads), ``sequence_length`` T
    (tokens). Returns FLOPs (a float). Raises ValueError for a negative argument.
    """
    if min(parameters, layers, heads, head_dim, sequence_length) < 0:
        raise ValueError("FLOPs per token: every argument must be >= 0")
    return 6.0 * parameters + 12.0 * layers * heads * head_dim * sequence_length


def model_flops_utilization(tokens_per_s: float | None, flops_per_token_: float | None, gpus: int,
                            peak_tflops: float | Decimal | None, *, on_cpu: bool = False,
                            cpu_only: bool = False) -> Utilization:
    """MFU of a run: ``tokens_per_s x flops_per_token / (gpus x peak_tflops x 10^12)``, in percent.

    ``tokens_per_s``: achieved training throughput over all the run's accelerators (tokens/s);
    ``flops_per_token_``: model FLOPs per token (:func:`flops_per_token`); ``gpus``: accelerators the run held;
    ``peak_tflops``: dense BF16 peak per accelerator, TFLOP/s (catalog); ``on_cpu``: the run did not use the
    accelerators (emulated GPUs); ``cpu_only``: a CPU-only job (no accelerator at all). Returns a :class:`Utilization` whose ``percent`` is None with the reason on
    the CPU, for an unknown (missing or zero) peak, without a throughput or without FLOPs per token.
    """
    if cpu_only:
        return Utilization(None, "CPU: a CPU-only job has no accelerator, so no MFU")
    if on_cpu:
        return Utilization(None, "the run used the CPU (emulated GPUs): no accelerator peak applies")
    if peak_tflops is None or not float(peak_tflops) > 0:
        return Utilization(None, "the accelerator's peak dense BF16 FLOP/s is unknown in the catalog")
    if gpus < 1:
        return Utilization(None, "the run held no GPUs")
    if tokens_per_s is None or not math.isfinite(tokens_per_s) or tokens_per_s < 0:
        return Utilization(None, "the workload reported no throughput (tokens_per_s)")
    if flops_per_token_ is None or not math.isfinite(flops_per_token_) or flops_per_token_ <= 0:
        return Utilization(None, "no model FLOPs per token: the workload reported none (flops_per_token) and the "
                                 "spec declares no model")
    return Utilization(100.0 * tokens_per_s * flops_per_token_ / (gpus * float(peak_tflops) * 1e12))


def usd_per_million_tokens(cost_usd: Decimal, tokens: int | None) -> Decimal | None:
    """``cost_usd / tokens x 10^6`` (USD per million training tokens), None without a positive token count."""
    if not tokens or tokens <= 0:
        return None
    return cost_usd * Decimal(1_000_000) / Decimal(tokens)


def spec_flops_per_token(model) -> float | None:
    """FLOPs per token of a job spec's ``model`` declaration (a mapping, ``jobs.spec.JobModel`` dumped), or None when
    it lacks ``layers``, ``hidden_size``, ``heads`` or ``sequence_length``.

    N is the declared ``parameters``, else the count of the shape without the position embedding
    (``transformer_parameters`` with ``vocab_size`` and no sequence term: the token embedding, tied to the output
    projection, takes part in a matmul per token, as ``examples/gpt.py`` counts for MFU); Q = hidden_size / heads.
    """
    layers, hidden, heads, seq = (model.get(k) for k in ("layers", "hidden_size", "heads", "sequence_length"))
    if not (layers and hidden and heads and seq):
        return None
    parameters = model.get("parameters") or transformer_parameters(layers, hidden, model.get("vocab_size") or 0)
    return flops_per_token(parameters, layers, heads, hidden / heads, seq)


#: MFU bands of the reports, percent: ``[low, high)``; the last has no upper end. Large dense-transformer training
#: reaches 46-57 % MFU at scale (PaLM, table 3: 46.2 %; Megatron-LM 2021 figures give ~52 %).
MFU_BANDS = ((0.0, 10.0), (10.0, 20.0), (20.0, 35.0), (35.0, 50.0), (50.0, None))
#: Below this MFU (percent) GPU-hours count as low-MFU in the reports.
LOW_MFU_PERCENT = 20.0
UNKNOWN_BAND = "unknown"


def band_label(low: float, high: float | None) -> str:
    """``"10-20 %"``, or ``">= 50 %"`` for the open band."""
    return f">= {low:g} %" if high is None else f"{low:g}-{high:g} %"


def mfu_band(percent: float | None) -> str:
    """The label of the band of ``MFU_BANDS`` holding ``percent``; ``UNKNOWN_BAND`` for None."""
    if percent is None:
        return UNKNOWN_BAND
    for low, high in MFU_BANDS:
        if high is None or percent < high:
            return band_label(low, high)
    raise AssertionError("unreachable: the last band is open")
