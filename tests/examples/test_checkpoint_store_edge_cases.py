"""The checkpoint store at its edges (examples/gpt.py, train_gpt.py, serve.py, manifests.checkpoint_uri): a store
at the root of its scheme, a final upload that failed, a rerun of a finished job, a broken store, and serving
into a read-only checkpoint directory.

Real parts only: train_gpt.py/serve.py run as subprocesses or their functions in-process against file:// and
memory:// stores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from runners.kubernetes import manifests as m

from .workloads import FAST, REPO, TIMEOUT_S, TRAIN, attempt, clean_env, stored_step

sys.path.insert(0, str(REPO / "examples"))
import gpt  # noqa: E402
import serve  # noqa: E402


@pytest.mark.parametrize("store_uri", ["memory://", "memory:///", "file:///"])
def test_a_store_at_the_root_keeps_its_scheme(store_uri: str) -> None:
    """``rstrip('/')`` turned ``memory://`` into ``memory:``, which fsspec reads as a *local relative path*: the
    job's checkpoints went to ``./memory:/alpha/job-7`` in the pod's working directory, not to the store."""
    uri = m.checkpoint_uri(store_uri, "alpha", 7)
    scheme = store_uri.split(":")[0]
    assert uri == f"{scheme}:///alpha/job-7" or uri == f"{scheme}://alpha/job-7"
    store = gpt.CheckpointStore(uri)
    protocols = {store.fs.protocol} if isinstance(store.fs.protocol, str) else set(store.fs.protocol)
    assert scheme in protocols
    assert store.root.rstrip("/").endswith("/alpha/job-7") and store.root.startswith("/")
    assert not os.path.isabs(uri)  # a URI, never a cwd-relative path


def test_a_memory_store_at_the_root_really_holds_the_upload(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.pt"
    src.write_bytes(b"payload")
    name = f"job-{uuid.uuid4().hex[:8]}"
    store = gpt.CheckpointStore(m.checkpoint_uri("memory://", "alpha", 1).replace("job-1", name))
    store.upload(src, "checkpoint.pt")
    import fsspec

    assert fsspec.filesystem("memory").cat(f"/alpha/{name}/checkpoint.pt") == b"payload"
    assert not Path("memory:").exists()
    dst = tmp_path / "back.pt"
    assert store.download("checkpoint.pt", dst) and dst.read_bytes() == b"payload"


def test_a_finished_job_whose_last_upload_failed_uploads_it_on_retry(tmp_path: Path) -> None:
    """The last checkpoint's upload failed (an error: the attempt failed), the retry lands on the same cluster,
    whose claim holds the final checkpoint: it resumes at the last step and runs no step. The store must then
    get the final checkpoint, or a serving job on another cluster loads a stale model while the job SUCCEEDED."""
    first_store = tmp_path / "first"
    attempt(["--steps", "5", *FAST], tmp_path / "a", first_store.as_uri())  # local a: step 5
    lagging = tmp_path / "lagging"
    lagging.mkdir()
    final = torch.load(first_store / "checkpoint.pt", weights_only=True)
    torch.save({**final, "step": 3}, lagging / "checkpoint.pt")  # the store only got an earlier checkpoint
    out = attempt(["--steps", "5", *FAST], tmp_path / "a", lagging.as_uri())
    assert "resumed from step 5 " in out
    assert stored_step(lagging) == 5


def test_a_finished_job_rerun_does_not_upload_again(tmp_path: Path) -> None:
    """The store already holds the final step: nothing to upload (a checkpoint can be gigabytes)."""
    store = tmp_path / "store"
    attempt(["--steps", "5", *FAST], tmp_path / "a", store.as_uri())
    before = (store / "checkpoint.pt").stat().st_mtime_ns
    out = attempt(["--steps", "5", *FAST], tmp_path / "a", store.as_uri())
    assert "uploaded checkpoint" not in out
    assert (store / "checkpoint.pt").stat().st_mtime_ns == before


@pytest.mark.parametrize("broken", ["truncated", "file-as-store"])
def test_a_broken_store_fails_the_attempt_instead_of_starting_over(tmp_path: Path, broken: str) -> None:
    """Starting from step 0 would later overwrite the job's checkpoint with a worse one."""
    store = tmp_path / "store"
    if broken == "truncated":
        attempt(["--steps", "5", *FAST], tmp_path / "a", store.as_uri())
        data = (store / "checkpoint.pt").read_bytes()
        (store / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    else:
        store.write_bytes(b"not a directory")
    proc = subprocess.run([sys.executable, str(TRAIN), "--steps", "10", *FAST], cwd=REPO, capture_output=True,
                          text=True, timeout=TIMEOUT_S,
                          env=clean_env(CHECKPOINT_DIR=str(tmp_path / "b"), CHECKPOINT_URI=store.as_uri()))
    assert proc.returncode != 0, proc.stdout
    assert "step=1 " not in proc.stdout


def test_serve_fetches_from_the_store_into_a_read_only_checkpoint_dir(tmp_path: Path) -> None:
    """The Kubernetes runner mounts /checkpoints read-only in inference pods (``inference_deployment``), so a
    serving pod on a cluster without the training job's volume could never write the fetched checkpoint.pt
    there: the store was useless for serving exactly where it is needed."""
    store = tmp_path / "store"
    attempt(["--steps", "5", *FAST], tmp_path / "train", store.as_uri())
    # A directory where no process, root included, can create a file (chattr +i needs a capable filesystem).
    mount = Path("/proc/self")
    assert m.inference_deployment(m.Workload(
        name="w", namespace="cp-alpha", job_id=1, attempt_id=1, attempt_number=1, kind="inference", team="alpha",
        image="i", command=("python",),
    ))["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0].get("readOnly") is True
    try:
        generator = serve.load_generator(str(mount), 0.0, gpt.CheckpointStore(store.as_uri()))
        assert generator.checkpoint_step == 5
        assert not (mount / "checkpoint.pt").exists()
    finally:
        shutil.rmtree(Path(serve.store_cache_path(store.as_uri())).parent, ignore_errors=True)
