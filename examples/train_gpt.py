"""Train a tiny byte-level GPT with DistributedDataParallel (DDP).

Data
    The text of Python's own help topics, ``pydoc_data.topics.topics`` (a dict
    ``str -> str`` that ships with CPython); the values are concatenated in
    sorted-key order and UTF-8 encoded (~466k bytes). No download is needed.
    Rank ``r`` of ``W`` trains on the ``r``-th contiguous ``1/W`` shard of the
    bytes, sampling windows with its own seeded RNG, so ranks see different data.

Launch modes (all use ``init_method="env://"``)
    * ``python examples/train_gpt.py`` with no distributed environment: one
      process, world size 1, no process group.
    * ``torchrun --nproc-per-node N examples/train_gpt.py`` (one or more nodes).
    * An external launcher that sets exactly ``MASTER_ADDR``, ``MASTER_PORT``,
      ``WORLD_SIZE``, ``RANK``, ``NODE_RANK``, ``LOCAL_RANK`` and
      ``LOCAL_WORLD_SIZE`` (e.g. one process per pod of an Indexed Kubernetes
      Job). If ``RANK`` is missing it is derived as
      ``NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``.

    The backend is NCCL when CUDA is available (device ``cuda:LOCAL_RANK``,
    bf16 autocast), otherwise gloo on the CPU. On CPU with world size > 1 each
    process uses one intra-op thread unless ``OMP_NUM_THREADS`` is set.

Checkpointing
    With ``--checkpoint-dir`` (default: env ``CHECKPOINT_DIR``), rank 0 writes
    ``<dir>/checkpoint.pt`` (model, optimizer, step, RNG states of every rank,
    loss history) every ``--checkpoint-every`` steps and at the end, atomically
    (temporary file in the same directory, fsync, ``os.replace``). On start, if
    the file exists, rank 0 loads it and broadcasts it to all ranks (so it also
    works when the directory is only visible to rank 0), every rank restores
    from it and rank 0 prints ``resumed from step N ...``. Rank 0 also writes
    ``<dir>/metrics.json``::

        {"first_loss": float, "last_loss": float, "steps": int,
         "tokens_per_s": float, "mfu_percent": float | null, ...}

    ``first_loss`` is the loss of the first logged step of the *job*: it is
    carried over in the checkpoint, so after a resume it still is the untrained
    loss of the original run.

Checkpoint store (another cluster)
    With ``--checkpoint-uri`` (default: env ``CHECKPOINT_URI``, which the
    Kubernetes runner sets to ``<CHECKPOINT_STORE_URI>/<team>/job-<id>`` for
    every attempt of a job) the checkpoint directory is a local working copy
    of a directory in an object store every cluster reaches (an fsspec URI:
    ``s3://``, ``gs://``, ``abfs://`` with s3fs/gcsfs/adlfs installed,
    ``file://`` on a shared mount, ``memory://``). On start, before the resume
    above, rank 0 downloads the store's ``checkpoint.pt`` (and
    ``metrics.json``) when the local directory has none or an older step, and
    prints ``fetched checkpoint step N from <uri>``; an empty store means a
    fresh start, an unreachable one is an error (never a silent restart that
    would later overwrite the job's checkpoint). The other ranks wait in the
    resume broadcast meanwhile (bounded by ``--dist-timeout``). After each
    checkpoint write rank 0 uploads ``checkpoint.pt`` (``uploaded checkpoint
    step=N to <uri>``), whole or not at all (``CheckpointStore.upload``); a
    failed upload is a warning, except for the last checkpoint, where it is an
    error. ``metrics.json`` is uploaded at the end.

    Fencing: under the platform (env ``CONTROLPLANE_ATTEMPT``, the attempt
    number), rank 0 records ``{"attempt": N}`` in the store's ``owner.json``
    at start and checks it before every upload. An attempt that finds a later
    one there (it was recovered elsewhere while this one ran on a cluster the
    control plane lost) uploads nothing more and exits with status 3, instead
    of overwriting the new attempt's newer checkpoint.

Output (rank 0, stdout, flushed)
    One line per log interval (the first at the first step, then every
    ``--log-every`` steps and at the last step)::

        step=<int> loss=<float .4f> tokens_per_s=<float .1f> mfu=<float .4f | n/a>

    where ``loss`` is the mean training cross-entropy (nats/token) over the
    steps of the interval and over all ranks, ``tokens_per_s`` is the global
    (all ranks) training throughput over the interval and ``mfu`` is in
    percent, or ``n/a`` where the device's peak is unknown (on the CPU). At
    the end::

        final step=<int> loss=<float> first_loss=<float> tokens_per_s=<float> mfu=<float> ...

MFU (model FLOPs utilization)
    Per Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
    Appendix B: model FLOPs per token ``= 6*N + 12*L*C*T`` (``N`` non-embedding
    parameters, ``L`` layers, ``C`` = n_embd, ``T`` = block_size), and
    ``MFU = tokens_per_s * flops_per_token / (world_size * peak_flops_per_device)``.
    The peak per device is env ``PEAK_TFLOPS`` (TFLOP/s) if set (the control
    plane sets it on GPUs from its accelerator catalog); otherwise, on CUDA,
    the dense BF16 tensor-core peak looked up from the device name (H100/H200
    989, A100 312, L40S 362, L40 181, L4 121; an unknown GPU has no peak). On
    the CPU no peak is known (a nominal figure once gave MFUs over 100 %), so
    MFU is reported as ``n/a`` (``null`` in metrics.json).

Exit status: 0 on success, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import os
import sys
import tempfile
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

if __package__:
    from .gpt import (
        CHECKPOINT_FILENAME,
        CHECKPOINT_FORMAT_VERSION,
        GPT,
        ByteTokenizer,
        CheckpointStore,
        GPTConfig,
        checkpoint_path,
        checkpoint_step,
        load_checkpoint,
    )
else:  # run as a script: make the sibling module importable
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpt import (  # type: ignore[no-redef]
        CHECKPOINT_FILENAME,
        CHECKPOINT_FORMAT_VERSION,
        GPT,
        ByteTokenizer,
        CheckpointStore,
        GPTConfig,
        checkpoint_path,
        checkpoint_step,
        load_checkpoint,
    )

#: Dense BF16 peak TFLOP/s per device, matched as substrings of the CUDA device
#: name in this order (so "L40S" wins over "L40" over "L4").
GPU_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
)

METRICS_FILENAME = "metrics.json"


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def _sweep(name: str, parse, fallback):
    """The default of an option a parameter sweep may set: env ``SWEEP_<NAME>`` (a job array's grid value, see
    examples/jobs/sweep-gpt.yaml) parsed by ``parse``, else ``fallback``. A bad value is argparse's error."""
    text = os.environ.get(f"SWEEP_{name}")
    if not text:
        return fallback
    try:
        return parse(text)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"train_gpt.py: error: SWEEP_{name}={text!r}: {exc}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse command-line arguments (``--checkpoint-dir`` defaults to env ``CHECKPOINT_DIR``; ``--lr`` and
    ``--batch-size`` to env ``SWEEP_LR`` and ``SWEEP_BATCH_SIZE``, set for the elements of a sweep)."""
    p = argparse.ArgumentParser(
        description="Train a tiny byte-level GPT with DDP on pydoc_data topics.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--steps", type=_positive_int, default=200, help="total optimizer steps")
    p.add_argument("--batch-size", type=_positive_int, default=_sweep("BATCH_SIZE", _positive_int, 48),
                   help="sequences per rank per step (default: env SWEEP_BATCH_SIZE, else 48)")
    p.add_argument("--block-size", type=_positive_int, default=128, help="context length, tokens")
    p.add_argument("--n-layer", type=_positive_int, default=4)
    p.add_argument("--n-embd", type=_positive_int, default=64)
    p.add_argument("--n-head", type=_positive_int, default=4)
    p.add_argument("--lr", type=_positive_float, default=_sweep("LR", _positive_float, 6e-3),
                   help="peak learning rate (default: env SWEEP_LR, else 0.006)")
    p.add_argument(
        "--warmup-steps", type=int, default=10,
        help="linear LR warm-up steps (capped at 10%% of --steps)",
    )
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--log-every", type=_positive_int, default=20, help="steps between log lines")
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("CHECKPOINT_DIR") or None,
        help="directory for checkpoint.pt and metrics.json (env CHECKPOINT_DIR)",
    )
    p.add_argument("--checkpoint-every", type=_positive_int, default=100, help="steps between checkpoints")
    p.add_argument(
        "--checkpoint-uri",
        default=os.environ.get("CHECKPOINT_URI") or None,
        help="fsspec URI of the job's checkpoint directory shared by every cluster (env CHECKPOINT_URI)",
    )
    p.add_argument(
        "--dist-timeout", type=_positive_int, default=600, help="process-group timeout, seconds"
    )
    args = p.parse_args(argv)
    if args.n_embd % args.n_head:
        p.error(f"--n-embd ({args.n_embd}) must be divisible by --n-head ({args.n_head})")
    if args.warmup_steps < 0:
        p.error("--warmup-steps must be >= 0")
    if args.checkpoint_uri and not args.checkpoint_dir:
        p.error("--checkpoint-uri (env CHECKPOINT_URI) needs --checkpoint-dir (env CHECKPOINT_DIR) as working copy")
    return args


# --------------------------------------------------------------------------- #
# Distributed setup
# --------------------------------------------------------------------------- #


@dataclass
class DistContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str | None  # None when no process group was created

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the process that logs and writes files)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when a process group is initialised."""
        return self.backend is not None


def setup_distributed(timeout_s: int) -> DistContext:
    """Initialise ``torch.distributed`` from the environment, if there is one.

    No ``WORLD_SIZE``/``MASTER_ADDR`` in the environment means a plain single
    process (no process group). Otherwise the process group is created with
    ``init_method="env://"``; this covers ``torchrun`` and launchers that only
    set ``MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, NODE_RANK, LOCAL_RANK,
    LOCAL_WORLD_SIZE``.
    """
    env = os.environ
    use_cuda = torch.cuda.is_available()
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
    node_rank = int(env.get("NODE_RANK", env.get("GROUP_RANK", "0")))
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    if "WORLD_SIZE" not in env and "MASTER_ADDR" not in env:
        return DistContext(0, 1, 0, 1, 0, device, None)

    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE") if not env.get(k)]
    if missing:
        raise SystemExit(f"error: distributed launch is missing env {', '.join(missing)}")
    world_size = int(env["WORLD_SIZE"])
    if "RANK" not in env:
        env["RANK"] = str(node_rank * local_world_size + local_rank)
    rank = int(env["RANK"])
    if not 0 <= rank < world_size:
        raise SystemExit(f"error: RANK={rank} outside [0, WORLD_SIZE={world_size})")

    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return DistContext(rank, world_size, local_rank, local_world_size, node_rank, device, backend)


def peak_flops_per_device(device: torch.device) -> tuple[float | None, str]:
    """Peak FLOP/s of one device and where the figure came from.

    Returns ``(flops_per_second, source)``, or ``(None, why)`` when no peak is
    known (the CPU, an unlisted GPU without ``PEAK_TFLOPS``); see the module
    docstring for the lookup order (env ``PEAK_TFLOPS``, CUDA device-name table).
    """
    override = os.environ.get("PEAK_TFLOPS")
    if override:
        try:
            value = float(override)
        except ValueError:
            value = -1.0
        if value > 0 and math.isfinite(value):
            return value * 1e12, "env PEAK_TFLOPS"
        print(f"warning: ignoring invalid PEAK_TFLOPS={override!r}", file=sys.stderr, flush=True)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, tflops in GPU_PEAK_TFLOPS:
            if key.lower() in name.lower():
                return tflops * 1e12, f"table ({name})"
        return None, f"unknown GPU ({name}): set PEAK_TFLOPS"
    return None, "CPU: no known peak"


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #


def load_corpus() -> torch.Tensor:
    """Return the training text as a ``uint8`` tensor of shape ``(n_bytes,)``.

    The text is the values of ``pydoc_data.topics.topics`` concatenated in
    sorted-key order, encoded with :class:`ByteTokenizer` (UTF-8 bytes).
    """
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    return torch.tensor(ByteTokenizer().encode(text), dtype=torch.uint8)


def shard_for_rank(data: torch.Tensor, rank: int, world_size: int, block_size: int) -> torch.Tensor:
    """Return rank ``rank``'s contiguous ``1/world_size`` slice of ``data`` (shape ``(n,)``).

    Raises ``SystemExit`` if the shard is too short to hold one
    ``block_size + 1`` window.
    """
    n = data.numel()
    shard = data[rank * n // world_size : (rank + 1) * n // world_size]
    if shard.numel() < block_size + 2:
        raise SystemExit(
            f"error: shard of {shard.numel()} bytes too small for block_size={block_size} "
            f"(world_size={world_size})"
        )
    return shard


def get_batch(
    shard: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample random windows from ``shard``.

    Returns ``(x, y)``, each ``int64`` of shape ``(batch_size, block_size)`` on
    ``device``, where ``y[:, t]`` is the token following ``x[:, t]``.
    """
    starts = torch.randint(0, shard.numel() - block_size - 1, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(block_size + 1)[None, :]
    chunk = shard[index].long()
    x, y = chunk[:, :-1], chunk[:, 1:]
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous(), y.contiguous()


def data_seed(seed: int, rank: int, step: int = 0) -> int:
    """Seed of rank ``rank``'s batch RNG (``step`` > 0 when re-seeding after a resume)."""
    return (seed * 1_000_003 + rank * 7_919 + step * 104_729) % (2**63 - 1)


# --------------------------------------------------------------------------- #
# Optimisation helpers
# --------------------------------------------------------------------------- #


def make_optimizer(model: GPT, lr: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on biases / LayerNorm gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int) -> float:
    """Learning rate for 1-based ``step``: linear warm-up, then cosine decay to 10% of peak."""
    if warmup_steps > 0 and step <= warmup_steps:
        return peak_lr * step / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return peak_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------- #
# Checkpoint / metrics I/O
# --------------------------------------------------------------------------- #


def atomic_write(path: str, write: Any) -> None:
    """Write a file atomically: ``write(fileobj)`` into a temp file next to ``path``, then ``os.replace``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; let other users (e.g. a serving job) read it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def gather_data_rng_states(ctx: DistContext, generator: torch.Generator) -> list[torch.Tensor]:
    """Collective: the batch-RNG state of every rank, indexed by rank (CPU ``uint8`` tensors)."""
    state = generator.get_state()
    if not ctx.distributed:
        return [state]
    local = state.to(ctx.device)  # NCCL needs CUDA tensors; gloo uses CPU ones
    states = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(states, local)
    return [s.cpu() for s in states]


def broadcast_state(ctx: DistContext, obj: Any) -> Any:
    """Collective: return rank 0's ``obj`` on every rank.

    ``obj`` is serialised with ``torch.save`` and read back with
    ``weights_only=True`` (tensors, numbers, strings, lists, dicts, ``None``).
    Implemented with plain tensor broadcasts because
    ``broadcast_object_list`` needs numpy, which is not a dependency here.
    """
    if not ctx.distributed:
        return obj
    payload = bytearray()
    if ctx.is_main:
        buf = io.BytesIO()
        torch.save(obj, buf)
        payload = bytearray(buf.getbuffer())
    size = torch.tensor([len(payload)], dtype=torch.int64, device=ctx.device)
    dist.broadcast(size, src=0)
    if not ctx.is_main:
        payload = bytearray(int(size.item()))
    host = torch.frombuffer(payload, dtype=torch.uint8)  # shares memory with payload
    wire = host.to(ctx.device) if ctx.device.type == "cuda" else host
    dist.broadcast(wire, src=0)
    if ctx.is_main:
        return obj
    if wire is not host:
        host.copy_(wire.cpu())
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


def save_checkpoint(
    ctx: DistContext,
    path: str,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    step: int,
    generator: torch.Generator,
    extra: dict[str, Any],
) -> None:
    """Collective (all ranks must call it): rank 0 atomically writes the checkpoint to ``path``."""
    data_states = gather_data_rng_states(ctx, generator)
    if not ctx.is_main:
        return
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "data": data_states}
    if ctx.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(ctx.device)
    state = {
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "model_config": model.config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "world_size": ctx.world_size,
        "rng": rng,
        **extra,
    }
    atomic_write(path, lambda fh: torch.save(state, fh))


def write_metrics(directory: str, metrics: dict[str, Any]) -> None:
    """Atomically write ``<directory>/metrics.json``."""
    payload = (json.dumps(metrics, indent=2, sort_keys=True) + "\n").encode()
    atomic_write(os.path.join(directory, METRICS_FILENAME), lambda fh: fh.write(payload))


def fetch_from_store(store: CheckpointStore, directory: str) -> int | None:
    """Rank 0 only: make ``<directory>/checkpoint.pt`` the newer of the local one and the store's.

    Downloads the store's checkpoint (to a temporary file) and keeps it when
    the directory has none or an older step, together with the store's
    ``metrics.json`` if there is one. Returns the step fetched, or None when
    the store has no checkpoint or the local one is as new. Raises the
    store's errors other than "not found" (see ``CheckpointStore.download``).
    """
    return sync_from_store(store, directory)[0]


def sync_from_store(store: CheckpointStore, directory: str) -> tuple[int | None, int | None]:
    """``fetch_from_store``, returning (the step fetched or None, the store's step or None when it has none)."""
    local = checkpoint_path(directory)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".store-checkpoint.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        if not store.download(CHECKPOINT_FILENAME, tmp):
            return None, None
        step = checkpoint_step(tmp)
        if os.path.exists(local) and checkpoint_step(local) >= step:
            return None, step
        os.replace(tmp, local)
        store.download(METRICS_FILENAME, os.path.join(directory, METRICS_FILENAME))
        return step, step
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


#: The store's record of the attempt that writes it: ``{"attempt": <number>}`` (see ``claim_store``).
OWNER_FILENAME = "owner.json"


class SupersededAttempt(RuntimeError):
    """A later attempt of the job writes the checkpoint store: this one must stop and write nothing."""


def attempt_number() -> int:
    """This process's attempt of the job: env ``CONTROLPLANE_ATTEMPT`` (set by both runners); 0 outside the
    platform, which turns the fencing of ``claim_store`` off."""
    try:
        return max(0, int(os.environ.get("CONTROLPLANE_ATTEMPT", "0")))
    except ValueError:
        return 0


def check_owner(store: CheckpointStore, attempt: int) -> None:
    """Raise SupersededAttempt when the store's owner record names an attempt later than ``attempt``.

    The platform recovers a job lost with its cluster on another cluster; the old attempt may still run
    where the control plane cannot reach it until that cluster returns. Attempt numbers only grow, so the
    record is a fencing token: the old attempt stops at its next checkpoint instead of overwriting the new
    attempt's newer checkpoint. (A check and the upload after it are not atomic: an upload already under
    way when the new attempt claims the store can still land once; the new attempt's next upload wins.)
    """
    if attempt <= 0:
        return
    owner = store.read_json(OWNER_FILENAME) or {}
    try:
        later = int(owner.get("attempt", 0))
    except (TypeError, ValueError):
        later = 0
    if later > attempt:
        raise SupersededAttempt(f"attempt {later} of this job writes {store.uri} now; attempt {attempt} stops")


def claim_store(store: CheckpointStore, attempt: int) -> None:
    """Rank 0, at start: record ``attempt`` as the store's writer, after ``check_owner`` (attempt 0: nothing)."""
    if attempt <= 0:
        return
    check_owner(store, attempt)
    store.write_json(OWNER_FILENAME, {"attempt": attempt})


def upload_to_store(store: CheckpointStore, path: str, step: int, final: bool, attempt: int = 0) -> None:
    """Rank 0 only: upload ``path`` (a checkpoint of ``step``) to the store as ``checkpoint.pt``.

    A failure is printed as a warning (the next checkpoint tries again) unless
    ``final``, where it is raised: success then means the store holds the
    job's last checkpoint. Raises SupersededAttempt (uploading nothing) when a
    later attempt than ``attempt`` owns the store (``check_owner``).
    """
    check_owner(store, attempt)
    try:
        store.upload(path, CHECKPOINT_FILENAME)
    except Exception as exc:
        if final:
            raise
        print(f"warning: upload of checkpoint step={step} to {store.uri} failed: {exc!r}",
              file=sys.stderr, flush=True)
        return
    print(f"uploaded checkpoint step={step} to {store.url(CHECKPOINT_FILENAME)}", flush=True)


def load_resume_state(ctx: DistContext, directory: str | None) -> dict[str, Any] | None:
    """Collective: rank 0 loads ``<directory>/checkpoint.pt`` if present and shares it with all ranks."""
    ckpt = None
    if ctx.is_main and directory:
        path = checkpoint_path(directory)
        if os.path.exists(path):
            ckpt = load_checkpoint(path)
    return broadcast_state(ctx, ckpt)


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #


def log(ctx: DistContext, message: str) -> None:
    """Print ``message`` (flushed) on rank 0 only."""
    if ctx.is_main:
        print(message, flush=True)


def train(args: argparse.Namespace, ctx: DistContext, store: CheckpointStore | None = None) -> dict[str, Any]:
    """Run the training loop; returns the final metrics dict (meaningful on rank 0).

    ``store``: the job's checkpoint store (``--checkpoint-uri``), if any.
    """
    device = ctx.device
    if device.type == "cpu" and ctx.world_size > 1 and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # identical initial weights on every rank

    store_step: int | None = None  # the store's checkpoint step (rank 0), None: it has none
    if store is not None and ctx.is_main:
        claim_store(store, attempt_number())  # before reading: an older attempt stops uploading from now on
        fetched, store_step = sync_from_store(store, args.checkpoint_dir)
        if fetched is not None:
            log(ctx, f"fetched checkpoint step {fetched} from {store.url(CHECKPOINT_FILENAME)}")
    ckpt = load_resume_state(ctx, args.checkpoint_dir)
    config = GPTConfig(
        block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd
    )
    if ckpt is not None:
        saved = GPTConfig.from_dict(ckpt["model_config"])
        if saved != config:
            log(ctx, f"warning: using the checkpoint's model config {saved} instead of {config}")
        config = saved

    model = GPT(config).to(device)
    optimizer = make_optimizer(model, args.lr)
    generator = torch.Generator().manual_seed(data_seed(args.seed, ctx.rank))
    start_step = 0
    first_loss: float | None = None
    last_loss: float | None = None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_step = int(ckpt["step"])
        first_loss = ckpt.get("first_loss")
        last_loss = ckpt.get("last_loss")
        rng = ckpt.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], device)
        data_states = rng.get("data") or []
        if len(data_states) == ctx.world_size:
            generator.set_state(data_states[ctx.rank])
        else:  # world size changed: fresh, still rank-distinct, stream
            generator.manual_seed(data_seed(args.seed, ctx.rank, start_step))
        log(ctx, f"resumed from step {start_step} checkpoint={checkpoint_path(args.checkpoint_dir)}")
    del ckpt

    ddp_model: torch.nn.Module = model
    if ctx.distributed:
        ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    data = load_corpus()
    shard = shard_for_rank(data, ctx.rank, ctx.world_size, config.block_size)
    flops_per_token = model.flops_per_token()
    peak_flops, peak_source = peak_flops_per_device(device)
    tokens_per_step = args.batch_size * config.block_size * ctx.world_size  # global
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda" and torch.cuda.is_bf16_supported()
        else nullcontext()
    )
    log(
        ctx,
        f"config world_size={ctx.world_size} backend={ctx.backend or 'none'} device={device.type} "
        f"params={model.num_params()} flops_per_token={flops_per_token} "
        f"tokens_per_step={tokens_per_step} corpus_bytes={data.numel()} shard_bytes={shard.numel()} "
        f"peak_tflops={'n/a' if peak_flops is None else f'{peak_flops / 1e12:g}'} ({peak_source}) "
        f"threads={torch.get_num_threads()}",
    )

    def mfu_percent(tokens_per_s: float) -> float | None:
        if peak_flops is None:
            return None
        return 100.0 * tokens_per_s * flops_per_token / (peak_flops * ctx.world_size)

    def mfu_text(tokens_per_s: float) -> str:
        mfu = mfu_percent(tokens_per_s)
        return "n/a" if mfu is None else f"{mfu:.4f}"

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ckpt_path = checkpoint_path(args.checkpoint_dir) if args.checkpoint_dir else None
    warmup_steps = min(args.warmup_steps, max(1, args.steps // 10))
    model.train()
    interval_loss = torch.zeros((), device=device)
    interval_steps = 0
    sync()
    t_start = t_interval = time.perf_counter()
    t_after_first: float | None = None  # excludes warm-up from the run-level throughput
    tokens_per_s = 0.0

    for step in range(start_step + 1, args.steps + 1):
        lr = lr_at(step, args.steps, args.lr, warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(shard, args.batch_size, config.block_size, generator, device)
        with autocast:
            _, loss = ddp_model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        interval_loss += loss.detach()
        interval_steps += 1

        if step == start_step + 1 or step % args.log_every == 0 or step == args.steps:
            stats = torch.stack([interval_loss, torch.tensor(float(interval_steps), device=device)])
            if ctx.distributed:
                dist.all_reduce(stats)  # sums over ranks
            sync()
            now = time.perf_counter()
            last_loss = (stats[0] / stats[1]).item()
            if first_loss is None:
                first_loss = last_loss
            tokens_per_s = interval_steps * tokens_per_step / max(now - t_interval, 1e-9)
            log(
                ctx,
                f"step={step} loss={last_loss:.4f} tokens_per_s={tokens_per_s:.1f} "
                f"mfu={mfu_text(tokens_per_s)}",
            )
            if t_after_first is None:
                t_after_first = now
            interval_loss.zero_()
            interval_steps = 0
            t_interval = time.perf_counter()  # checkpoint time is charged to the next interval

        if ckpt_path and (step % args.checkpoint_every == 0 or step == args.steps):
            save_checkpoint(
                ctx, ckpt_path, model, optimizer, step, generator,
                {"first_loss": first_loss, "last_loss": last_loss, "args": vars(args)},
            )
            if store is not None and ctx.is_main:
                upload_to_store(store, ckpt_path, step, final=step == args.steps, attempt=attempt_number())

    if store is not None and ctx.is_main and ckpt_path and start_step >= args.steps and (
            store_step is None or store_step < start_step):
        # No step ran (resumed at the last one) but the store lags behind the local checkpoint, e.g. the
        # previous attempt's final upload failed: upload it, or the job succeeds with a stale store.
        upload_to_store(store, ckpt_path, start_step, final=True, attempt=attempt_number())

    sync()
    t_end = time.perf_counter()
    steps_run = max(0, args.steps - start_step)
    if steps_run > 1 and t_after_first is not None and t_end > t_after_first:
        run_tokens_per_s = (steps_run - 1) * tokens_per_step / (t_end - t_after_first)
    elif steps_run > 0:
        run_tokens_per_s = steps_run * tokens_per_step / max(t_end - t_start, 1e-9)
    else:
        run_tokens_per_s = 0.0
    return {
        "first_loss": first_loss,
        "last_loss": last_loss,
        "steps": max(args.steps, start_step),
        "steps_this_run": steps_run,
        "resumed_from_step": start_step if start_step else None,
        "tokens_per_s": run_tokens_per_s,
        "mfu_percent": mfu_percent(run_tokens_per_s),
        "flops_per_token": flops_per_token,
        "params": model.num_params(),
        "peak_tflops_per_device": None if peak_flops is None else peak_flops / 1e12,
        "world_size": ctx.world_size,
        "elapsed_s": t_end - t_start,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = parse_args(argv)
    store = None
    if args.checkpoint_uri:
        try:  # on every rank, so a configuration error stops them all at once
            store = CheckpointStore(args.checkpoint_uri)
        except (ImportError, ValueError) as exc:
            print(f"error: checkpoint store {args.checkpoint_uri}: {exc}", file=sys.stderr, flush=True)
            return 2
    ctx = setup_distributed(args.dist_timeout)
    try:
        metrics = train(args, ctx, store)
        if ctx.is_main:
            fmt = lambda v: "nan" if v is None else f"{v:.4f}"  # noqa: E731
            print(
                f"final step={metrics['steps']} loss={fmt(metrics['last_loss'])} "
                f"first_loss={fmt(metrics['first_loss'])} "
                f"tokens_per_s={metrics['tokens_per_s']:.1f} "
                f"mfu={'n/a' if metrics['mfu_percent'] is None else format(metrics['mfu_percent'], '.4f')} "
                f"elapsed_s={metrics['elapsed_s']:.2f} world_size={ctx.world_size}",
                flush=True,
            )
            if args.checkpoint_dir:
                write_metrics(args.checkpoint_dir, metrics)
                if store is not None:
                    check_owner(store, attempt_number())
                    try:
                        store.upload(os.path.join(args.checkpoint_dir, METRICS_FILENAME), METRICS_FILENAME)
                    except Exception as exc:
                        print(f"warning: upload of {METRICS_FILENAME} to {store.uri} failed: {exc!r}",
                              file=sys.stderr, flush=True)
        if ctx.distributed:
            dist.barrier()  # nobody reports success before rank 0's files are durable
    except SupersededAttempt as exc:  # rank 0; the other ranks fail when it leaves the process group
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        if ctx.distributed:
            leave_process_group(ctx)
    return 0


def leave_process_group(ctx: DistContext, timeout_s: float = 30.0) -> None:
    """Tear the process group down with rank 0 last.

    Rank 0 hosts the rendezvous store (``MASTER_ADDR:MASTER_PORT``). When it
    exits first, a rank still tearing down its gloo connections sees them
    reset from a background thread and the process aborts ("terminate called
    without an active exception", exit code 134) after a run that succeeded.
    So every other rank counts itself out on the store once its group is
    gone, and rank 0 waits for them (up to ``timeout_s`` seconds) before it
    destroys its own.
    """
    store = dist.distributed_c10d._get_default_store()  # kept: it outlives the group for the count below
    if ctx.rank != 0:
        dist.destroy_process_group()
        try:
            store.add("controlplane_left", 1)
        except Exception:  # noqa: BLE001 - rank 0 gave up waiting and is gone: nothing left to tell
            pass
        return
    deadline = time.monotonic() + timeout_s
    while store.add("controlplane_left", 0) < ctx.world_size - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
