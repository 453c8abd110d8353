"""``examples/train_gpt.py`` with a checkpoint store (env CHECKPOINT_URI): an attempt on another cluster resumes.

Each attempt runs with its own, empty local CHECKPOINT_DIR per rank (as a pod's
emptyDir on another cluster would be) and the same ``file://`` store URI (the
Kubernetes runner's ``<CHECKPOINT_STORE_URI>/<team>/job-<id>``). The store's
checkpoint is read back independently with ``torch.load``. Nothing here
touches the database.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from tests.support.net import free_port

from .workloads import FAST, REPO, SERVE, TIMEOUT_S, TRAIN, attempt, clean_env, stored_step

STEP_RE = re.compile(r"^step=(\d+) loss=")
RESUME_RE = re.compile(r"^resumed from step (\d+) ")
FETCH_RE = re.compile(r"^fetched checkpoint step (\d+) from (\S+)$")
UPLOAD_RE = re.compile(r"^uploaded checkpoint step=(\d+) to (\S+)$")

def matches(regex: re.Pattern, output: str) -> list[re.Match]:
    return [m for m in map(regex.match, output.splitlines()) if m]


def steps(output: str) -> list[int]:
    return [int(m.group(1)) for m in matches(STEP_RE, output)]


def test_an_attempt_on_another_cluster_resumes_from_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store" / "alpha" / "job-1"
    uri = store.as_uri()  # file:///.../store/alpha/job-1

    first = attempt(["--steps", "12", *FAST], tmp_path / "a", uri, nodes=2)
    assert not matches(FETCH_RE, first) and not matches(RESUME_RE, first)
    assert steps(first) == [1, 5, 10, 12]
    assert [int(m.group(1)) for m in matches(UPLOAD_RE, first)] == [5, 10, 12]
    assert stored_step(store) == 12
    first_metrics = json.loads((store / "metrics.json").read_text())
    assert first_metrics["steps"] == 12
    assert sorted(p.name for p in store.iterdir()) == ["checkpoint.pt", "metrics.json"]  # no temporary left

    # Attempt 2 "on another cluster": different, empty local directories; the same URI.
    second = attempt(["--steps", "20", *FAST], tmp_path / "b", uri, nodes=2)
    assert [(int(m.group(1)), m.group(2)) for m in matches(FETCH_RE, second)] == [(12, f"{uri}/checkpoint.pt")]
    assert [int(m.group(1)) for m in matches(RESUME_RE, second)] == [12]
    assert steps(second) == [13, 15, 20]
    assert stored_step(store) == 20
    metrics = json.loads((store / "metrics.json").read_text())
    assert metrics["steps"] == 20 and metrics["resumed_from_step"] == 12
    # The job's untrained loss travelled with the checkpoint from the other "cluster".
    assert metrics["first_loss"] == pytest.approx(first_metrics["first_loss"])
    assert metrics["last_loss"] < metrics["first_loss"]
    assert not (tmp_path / "b" / "rank1" / "checkpoint.pt").exists()  # rank 1 got the state by broadcast
    assert sorted(p.name for p in store.iterdir()) == ["checkpoint.pt", "metrics.json"]


@pytest.mark.parametrize("store_exists", [False, True], ids=["missing", "empty"])
def test_a_missing_or_empty_store_starts_fresh_and_fills_it(tmp_path: Path, store_exists: bool) -> None:
    store = tmp_path / "store" / "alpha" / "job-2"
    if store_exists:
        store.mkdir(parents=True)
    out = attempt(["--steps", "5", *FAST], tmp_path / "a", store.as_uri())
    assert not matches(FETCH_RE, out) and not matches(RESUME_RE, out)
    assert steps(out) == [1, 5]
    assert stored_step(store) == 5


def test_the_newer_of_the_local_and_the_store_checkpoint_wins(tmp_path: Path) -> None:
    """The same cluster again (a claim still holding an older or a newer checkpoint than the store)."""
    store = tmp_path / "store"
    attempt(["--steps", "5", *FAST], tmp_path / "a", store.as_uri())  # local a and the store: step 5
    attempt(["--steps", "10", *FAST], tmp_path / "b", store.as_uri())  # the store: step 10; local a is older
    out = attempt(["--steps", "15", *FAST], tmp_path / "a", store.as_uri())
    assert [int(m.group(1)) for m in matches(FETCH_RE, out)] == [10]
    assert [int(m.group(1)) for m in matches(RESUME_RE, out)] == [10]
    assert stored_step(store) == 15

    older = tmp_path / "older"  # a store lagging behind the local directory (its uploads failed, say)
    older.mkdir()
    newest = torch.load(store / "checkpoint.pt", weights_only=True)
    torch.save({**newest, "step": 3}, older / "checkpoint.pt")
    torch.save(newest, tmp_path / "b" / "rank0" / "checkpoint.pt")  # step 15
    out = attempt(["--steps", "20", *FAST], tmp_path / "b", older.as_uri())
    assert not matches(FETCH_RE, out)
    assert [int(m.group(1)) for m in matches(RESUME_RE, out)] == [15]
    assert stored_step(older) == 20


@pytest.mark.parametrize("args,env,message", [
    (["--checkpoint-uri", "nosuchprotocol://bucket/job-1"], {"CHECKPOINT_DIR": "ckpt"}, "nosuchprotocol"),
    ([], {"CHECKPOINT_URI": "memory://job-1"}, "needs --checkpoint-dir"),
])
def test_a_store_it_cannot_use_is_a_configuration_error(tmp_path: Path, args, env, message) -> None:
    env = {k: (str(tmp_path / v) if k == "CHECKPOINT_DIR" else v) for k, v in env.items()}
    proc = subprocess.run([sys.executable, str(TRAIN), "--steps", "1", *args], cwd=REPO, env=clean_env(**env),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "step=" not in proc.stdout


def test_serve_fetches_the_checkpoint_from_the_store(tmp_path: Path) -> None:
    """A serving pod on another cluster: empty CHECKPOINT_DIR, the training job's CHECKPOINT_URI."""
    store = tmp_path / "store"
    attempt(["--steps", "5", *FAST], tmp_path / "train", store.as_uri())
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, str(SERVE), "--host", "127.0.0.1"], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT,
                            env=clean_env(CHECKPOINT_DIR=str(tmp_path / "serve"), CHECKPOINT_URI=store.as_uri(),
                                          PORT=str(port)))
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", method="POST",
                                         data=json.dumps({"prompt": "def ", "max_new_tokens": 4}).encode())
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    reply = json.loads(response.read())
                break
            except OSError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.2)
        assert reply["checkpoint_step"] == 5
        assert (tmp_path / "serve" / "checkpoint.pt").is_file()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        log.close()
    assert "fetched checkpoint from " + store.as_uri() in (tmp_path / "serve.log").read_text()


def test_a_superseded_attempt_stops_before_overwriting_the_new_attempts_checkpoint(tmp_path):
    """A cluster is lost: attempt 2 resumes elsewhere while attempt 1 still runs where the control plane cannot
    reach it (frozen here with SIGSTOP, as behind a partition). Attempt 2's claim (owner.json) stops attempt 1 at
    its next checkpoint, exit status 3, and the store keeps attempt 2's final checkpoint."""
    import signal

    store = tmp_path / "store" / "alpha" / "job-5"
    uri = store.as_uri()
    old = subprocess.Popen(
        [sys.executable, str(TRAIN), "--steps", "100000", "--batch-size", "8", "--log-every", "1",
         "--checkpoint-every", "2"],
        cwd=REPO, env=clean_env(CHECKPOINT_DIR=str(tmp_path / "old"), CHECKPOINT_URI=uri, CONTROLPLANE_ATTEMPT="1"),
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = []
        for line in old.stdout:  # until attempt 1's first upload is complete
            seen.append(line)
            if UPLOAD_RE.match(line):
                old.send_signal(signal.SIGSTOP)
                break
        else:
            pytest.fail("attempt 1 ended before uploading:\n" + "".join(seen)[-3000:])
        assert json.loads((store / "owner.json").read_text()) == {"attempt": 1}
        resumed_from = stored_step(store)

        new = subprocess.run(  # attempt 2 on another cluster: an empty local directory, the same store
            [sys.executable, str(TRAIN), "--steps", str(resumed_from + 4), *FAST], cwd=REPO, text=True,
            capture_output=True, timeout=TIMEOUT_S,
            env=clean_env(CHECKPOINT_DIR=str(tmp_path / "new"), CHECKPOINT_URI=uri, CONTROLPLANE_ATTEMPT="2"))
        assert new.returncode == 0, new.stdout + new.stderr
        assert f"resumed from step {resumed_from} " in new.stdout
        assert json.loads((store / "owner.json").read_text()) == {"attempt": 2}
        final = (store / "checkpoint.pt").read_bytes()
        assert stored_step(store) == resumed_from + 4

        old.send_signal(signal.SIGCONT)  # the partition heals; attempt 1 reaches its next checkpoint
        rest = old.communicate(timeout=TIMEOUT_S)[0]
        assert old.returncode == 3, rest[-3000:]
        assert "attempt 2 of this job writes" in rest
        assert not any(UPLOAD_RE.match(line) for line in rest.splitlines())
        assert (store / "checkpoint.pt").read_bytes() == final
    finally:
        if old.poll() is None:
            old.send_signal(signal.SIGCONT)
            old.kill()
            old.wait(timeout=10)


def test_an_attempt_older_than_the_stores_owner_does_not_start(tmp_path):
    store = tmp_path / "store"
    attempt(["--steps", "5", *FAST], tmp_path / "a3", store.as_uri())  # no CONTROLPLANE_ATTEMPT: no fencing
    assert not (store / "owner.json").exists()
    (store / "owner.json").write_text(json.dumps({"attempt": 3}))
    before = (store / "checkpoint.pt").read_bytes()
    out = subprocess.run([sys.executable, str(TRAIN), "--steps", "10", *FAST], cwd=REPO, text=True,
                         capture_output=True, timeout=TIMEOUT_S,
                         env=clean_env(CHECKPOINT_DIR=str(tmp_path / "a2"), CHECKPOINT_URI=store.as_uri(),
                                       CONTROLPLANE_ATTEMPT="2"))
    assert out.returncode == 3, out.stdout + out.stderr
    assert (store / "checkpoint.pt").read_bytes() == before
    assert json.loads((store / "owner.json").read_text()) == {"attempt": 3}
