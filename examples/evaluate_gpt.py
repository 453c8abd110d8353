"""Evaluate the GPT checkpoint written by ``train_gpt.py`` on a held-out text; fail when its loss is too high.

The gate of a train -> evaluate -> serve pipeline (``examples/jobs/evaluate-gpt.yaml``, ADR 0037): the serving job
runs ``after`` this one succeeded, so a model that did not learn is never served.

* Loads ``<checkpoint-dir>/checkpoint.pt`` (``--checkpoint-dir``, default env ``EVAL_CHECKPOINT_DIR``, else
  ``CHECKPOINT_DIR``); with ``--checkpoint-uri`` (default env ``EVAL_CHECKPOINT_URI``, an fsspec URI of the
  training job's checkpoint store, see ``train_gpt.py``) and no local file, downloads it into the directory
  first.
* The held-out text is the documentation strings of a fixed list of standard-library modules
  (:data:`HELD_OUT_MODULES`): English technical prose like the training text (``pydoc_data.topics``, the
  language reference's topics), none of it in that text. It is encoded with the byte tokenizer and cut into
  consecutive non-overlapping windows of ``block_size + 1`` bytes (the checkpoint's own ``block_size``), at
  most ``--max-windows`` of them from the start: the same windows on every run, so two checkpoints compare.
* Prints ``eval_loss=<nats per token> perplexity=<exp(loss)> tokens=<predicted tokens> windows=<n>`` (the mean
  cross-entropy over every predicted token: each window's mean weighted by its token count, all equal here).
* Exit status: 0 when the loss is at most ``--max-loss`` (default env ``EVAL_MAX_LOSS``; none: no gate), 1 when
  above it (the line says by how much), 2 when the checkpoint cannot be loaded.

An untrained model predicts every byte alike: loss ln 256 = 5.545 nats, perplexity 256; a threshold below that
refuses a model that learned nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

if __package__:
    from .gpt import (
        CHECKPOINT_FILENAME,
        ByteTokenizer,
        CheckpointStore,
        checkpoint_path,
        load_checkpoint,
        model_from_checkpoint,
    )
else:  # run as a script: make the sibling module importable
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpt import (  # type: ignore[no-redef]
        CHECKPOINT_FILENAME,
        ByteTokenizer,
        CheckpointStore,
        checkpoint_path,
        load_checkpoint,
        model_from_checkpoint,
    )

#: Standard-library modules whose documentation strings make the held-out text, in this order.
HELD_OUT_MODULES = ("argparse", "collections", "csv", "datetime", "json", "logging", "pathlib", "shutil",
                    "subprocess", "tarfile", "threading", "unittest", "zipfile")
#: The loss of a model that predicts every byte alike: ln 256 nats per token.
UNIFORM_LOSS = math.log(ByteTokenizer.vocab_size)


def held_out_text() -> str:
    """The documentation strings of :data:`HELD_OUT_MODULES` (module, then its public classes and functions in
    name order), joined by blank lines."""
    import importlib
    import inspect

    parts = []
    for name in HELD_OUT_MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for attr in sorted(vars(module)):
            value = getattr(module, attr)
            if attr.startswith("_") or getattr(value, "__module__", None) != name:
                continue
            if inspect.isclass(value) or inspect.isfunction(value):
                parts.append(inspect.getdoc(value) or "")
    return "\n\n".join(p for p in parts if p)


def _threshold(text: str | None) -> float | None:
    if text in (None, ""):
        return None
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse arguments; ``--checkpoint-dir``, ``--checkpoint-uri`` and ``--max-loss`` default to env
    ``EVAL_CHECKPOINT_DIR`` (else ``CHECKPOINT_DIR``), ``EVAL_CHECKPOINT_URI`` and ``EVAL_MAX_LOSS``."""
    p = argparse.ArgumentParser(description="Evaluate a train_gpt.py checkpoint on a held-out text.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint-dir", default=os.environ.get("EVAL_CHECKPOINT_DIR")
                   or os.environ.get("CHECKPOINT_DIR") or None,
                   help="directory holding checkpoint.pt (env EVAL_CHECKPOINT_DIR, else CHECKPOINT_DIR)")
    p.add_argument("--checkpoint-uri", default=os.environ.get("EVAL_CHECKPOINT_URI") or None,
                   help="fsspec URI of the training job's checkpoint store, read when the directory lacks the "
                        "file (env EVAL_CHECKPOINT_URI)")
    p.add_argument("--max-loss", type=_threshold, default=_threshold(os.environ.get("EVAL_MAX_LOSS")),
                   help="exit 1 when the held-out loss (nats per token) is above this (env EVAL_MAX_LOSS); "
                        "none: report only")
    p.add_argument("--max-windows", type=int, default=64, help="the most held-out windows evaluated")
    p.add_argument("--batch-size", type=int, default=16, help="windows per forward pass")
    args = p.parse_args(argv)
    if not args.checkpoint_dir:
        p.error("--checkpoint-dir (or env EVAL_CHECKPOINT_DIR / CHECKPOINT_DIR) is required")
    if args.max_windows < 1 or args.batch_size < 1:
        p.error("--max-windows and --batch-size must be >= 1")
    return args


def windows(ids: list[int], block_size: int, limit: int) -> torch.Tensor:
    """Consecutive non-overlapping windows of ``block_size + 1`` token ids from the start of ``ids``, at most
    ``limit``: ``int64`` of shape ``(n, block_size + 1)``. Raises ValueError when not even one fits."""
    n = min(limit, len(ids) // (block_size + 1))
    if n < 1:
        raise ValueError(f"the held-out text ({len(ids)} tokens) is shorter than one window of {block_size + 1}")
    return torch.tensor(ids[:n * (block_size + 1)], dtype=torch.int64).view(n, block_size + 1)


@torch.no_grad()
def evaluate(model, data: torch.Tensor, batch_size: int) -> tuple[float, int]:
    """``(mean cross-entropy in nats per predicted token, predicted tokens)`` of ``model`` on ``data`` (windows,
    shape ``(n, T + 1)``: each predicts its last ``T`` tokens from the ``T`` before)."""
    total, tokens = 0.0, 0
    for start in range(0, data.size(0), batch_size):
        chunk = data[start:start + batch_size]
        x, y = chunk[:, :-1], chunk[:, 1:]
        _, loss = model(x, y)
        total += float(loss) * y.numel()
        tokens += y.numel()
    return total / tokens, tokens


def main(argv: list[str] | None = None) -> int:
    """Evaluate and print the line; the exit status is the gate's (see the module docstring)."""
    args = parse_args(argv)
    path = checkpoint_path(args.checkpoint_dir)
    try:
        if not os.path.exists(path) and args.checkpoint_uri:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            CheckpointStore(args.checkpoint_uri).download(CHECKPOINT_FILENAME, path)
        ckpt = load_checkpoint(path)
        model = model_from_checkpoint(ckpt)
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
        print(f"error: cannot load checkpoint {path}: {exc}", file=sys.stderr, flush=True)
        return 2
    torch.manual_seed(0)
    data = windows(ByteTokenizer().encode(held_out_text()), model.config.block_size, args.max_windows)
    loss, tokens = evaluate(model, data, args.batch_size)
    print(f"eval_loss={loss:.4f} perplexity={math.exp(loss):.2f} tokens={tokens} windows={data.size(0)} "
          f"checkpoint_step={ckpt.get('step', 'unknown')}", flush=True)
    if args.max_loss is not None and loss > args.max_loss:
        print(f"FAILED: held-out loss {loss:.4f} is above the threshold {args.max_loss:g} by "
              f"{loss - args.max_loss:.4f} nats per token (an untrained model: {UNIFORM_LOSS:.4f})", flush=True)
        return 1
    if args.max_loss is not None:
        print(f"passed: held-out loss {loss:.4f} is at most the threshold {args.max_loss:g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
