"""Running the example workloads (``examples/train_gpt.py``, ``examples/serve.py``) as the runners would: a clean
environment, Indexed-Job style ranks, a checkpoint store, and cleanup of the processes. No Django needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train_gpt.py"
SERVE = REPO / "examples" / "serve.py"
TIMEOUT_S = 120
# Small and fast: a few seconds per attempt on one CPU core.
FAST = ["--batch-size", "8", "--log-every", "5", "--checkpoint-every", "5"]

# Variables a launcher or the developer's shell might set that would change
# how the scripts behave; removed so each test controls them exactly.
_SCRUBBED_PREFIXES = ("TORCHELASTIC_",)
_SCRUBBED = {
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "CHECKPOINT_DIR", "CHECKPOINT_URI", "CONTROLPLANE_ATTEMPT", "PORT", "PEAK_TFLOPS", "OMP_NUM_THREADS",
}


def clean_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without distributed/job variables, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items()
        if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def kill(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it is still running and reap it."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def attempt(args: list[str], ckpt_dir: Path, uri: str, nodes: int = 1) -> str:
    """Run one attempt as ``nodes`` processes (one per pod of an Indexed Job), each with its own empty
    ``CHECKPOINT_DIR`` (``<ckpt_dir>/rank<r>``) and env ``CHECKPOINT_URI=uri``; returns rank 0's output.

    Fails the test if any rank exits non-zero or runs past ``TIMEOUT_S`` seconds.
    """
    port = str(free_port())
    procs = []
    try:
        for rank in range(nodes):
            env = clean_env(CHECKPOINT_DIR=str(ckpt_dir / f"rank{rank}"), CHECKPOINT_URI=uri)
            if nodes > 1:
                env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(nodes), RANK=str(rank),
                           NODE_RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
            procs.append(subprocess.Popen([sys.executable, str(TRAIN), *args], cwd=REPO, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
        for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
            assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{out[-4000:]}"
        return outputs[0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def stored_step(store: Path) -> int:
    """The step of the store's checkpoint.pt, read with torch.load (not with the example's code)."""
    return int(torch.load(store / "checkpoint.pt", map_location="cpu", weights_only=True)["step"])
