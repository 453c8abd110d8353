"""``examples/evaluate_gpt.py``, the gate of the train -> evaluate -> serve pipeline: its held-out loss is the mean
cross-entropy of the checkpoint on the held-out windows (recomputed here from the logits), it falls with training,
and the exit status is 1 above the threshold (argument or env), 0 at or below it, 2 without a checkpoint."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .workloads import REPO, TRAIN, clean_env

EVALUATE = REPO / "examples" / "evaluate_gpt.py"
TIMEOUT_S = 180
LINE = re.compile(r"^eval_loss=([0-9.]+) perplexity=([0-9.]+) tokens=(\d+) windows=(\d+)", re.MULTILINE)


def train(directory: Path, steps: int) -> None:
    proc = subprocess.run([sys.executable, str(TRAIN), "--steps", str(steps), "--batch-size", "8", "--log-every",
                           str(steps), "--checkpoint-dir", str(directory)],
                          cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-2000:]


def evaluate(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EVALUATE), *args], cwd=REPO, env=clean_env(**env),
                          capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[int, Path]:
    found = {}
    for steps in (1, 30):
        directory = tmp_path_factory.mktemp(f"ckpt{steps}")
        train(directory, steps)
        found[steps] = directory
    return found


def independent_loss(directory: Path, max_windows: int = 8) -> float:
    """The held-out loss computed here: log-softmax of the logits, the true next byte's log-probability, averaged."""
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import evaluate_gpt
        from gpt import load_checkpoint, model_from_checkpoint
    finally:
        sys.path.pop(0)
    model = model_from_checkpoint(load_checkpoint(directory / "checkpoint.pt"))
    ids = list(evaluate_gpt.held_out_text().encode("utf-8"))
    size = model.config.block_size + 1
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(min(max_windows, len(ids) // size)):
            window = torch.tensor(ids[w * size:(w + 1) * size], dtype=torch.int64)
            logits, _ = model(window[None, :-1])
            logp = torch.log_softmax(logits[0].double(), dim=-1)
            total -= float(logp[torch.arange(size - 1), window[1:]].sum())
            count += size - 1
    return total / count


def test_the_loss_is_the_mean_cross_entropy_on_the_held_out_windows(checkpoints):
    proc = evaluate("--checkpoint-dir", str(checkpoints[30]), "--max-windows", "8")
    assert proc.returncode == 0, proc.stderr
    loss, perplexity, tokens, windows = LINE.search(proc.stdout).groups()
    expected = independent_loss(checkpoints[30])
    assert abs(float(loss) - expected) < 1e-3
    assert abs(float(perplexity) - math.exp(expected)) < 0.05 * math.exp(expected)
    assert (int(windows), int(tokens)) == (8, 8 * 128)


def test_training_lowers_the_held_out_loss_below_a_model_that_learned_nothing(checkpoints):
    losses = {}
    for steps, directory in checkpoints.items():
        proc = evaluate("--checkpoint-dir", str(directory))
        assert proc.returncode == 0, proc.stderr
        losses[steps] = float(LINE.search(proc.stdout).group(1))
    assert losses[30] < losses[1] - 0.5
    assert 4.3 < losses[1] < math.log(256) + 0.5  # near ln 256 = 5.55: it barely trained


def test_the_gate_exits_1_above_the_threshold_and_0_at_or_below_it(checkpoints):
    proc = evaluate("--checkpoint-dir", str(checkpoints[1]), "--max-loss", "4.0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: held-out loss" in proc.stdout and "above the threshold 4" in proc.stdout
    proc = evaluate("--checkpoint-dir", str(checkpoints[1]), EVAL_MAX_LOSS="6")  # the threshold from env
    assert proc.returncode == 0 and "passed: held-out loss" in proc.stdout
    proc = evaluate(EVAL_CHECKPOINT_DIR=str(checkpoints[1]), EVAL_MAX_LOSS="4.0")
    assert proc.returncode == 1


def test_without_a_checkpoint_it_exits_2_and_bad_thresholds_are_refused(tmp_path):
    proc = evaluate("--checkpoint-dir", str(tmp_path))
    assert proc.returncode == 2 and "cannot load checkpoint" in proc.stderr
    proc = evaluate("--checkpoint-dir", str(tmp_path), "--max-loss", "-1")
    assert proc.returncode == 2 and "must be a positive finite number" in proc.stderr  # argparse's usage error
