"""End-to-end tests of the example workloads (no Django needed).

* ``examples/train_gpt.py`` run as two local processes with exactly the
  environment an Indexed Kubernetes Job gives each pod, and as a plain single
  process;
* resuming from ``checkpoint.pt``;
* ``examples/serve.py`` answering ``/healthz`` and ``/generate``;
* the job specs in ``examples/jobs`` parse and have the expected shape.

Every subprocess runs with a timeout and is killed in ``finally`` blocks.
Run with ``python -m pytest tests/examples -q``.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runners.kubernetes.serving_load import parse_server_counters
from runners.local.endpoint import LATENCY_BUCKETS
from tests.support.net import free_port

from .workloads import REPO, SERVE, TRAIN, clean_env, kill

JOBS = REPO / "examples" / "jobs"

TRAIN_TIMEOUT_S = 120
STEP_RE = re.compile(r"^step=(\d+) loss=(\d+\.\d{4}) tokens_per_s=(\d+\.\d) mfu=(\d+\.\d{4}|n/a)$")
FINAL_RE = re.compile(r"^final step=(\d+) loss=(\S+) ")
RESUME_RE = re.compile(r"^resumed from step (\d+)\b")

def run_indexed_job(args: list[str], workdir: Path, nodes: int = 2) -> list[tuple[int, str]]:
    """Run ``train_gpt.py`` as ``nodes`` processes, one per "node", like an Indexed Job.

    Each process gets exactly MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
    NODE_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE. Returns ``[(returncode,
    combined output)]`` by rank.
    """
    port = str(free_port())
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for rank in range(nodes):
            log = open(workdir / f"rank{rank}.log", "w+")
            logs.append(log)
            env = clean_env(
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(nodes),
                RANK=str(rank), NODE_RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
            )
            procs.append(subprocess.Popen(
                [sys.executable, str(TRAIN), *args], cwd=REPO, env=env,
                stdout=log, stderr=subprocess.STDOUT,
            ))
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        results = []
        for proc, log in zip(procs, logs, strict=True):
            log.seek(0)
            results.append((proc.returncode, log.read()))
        return results
    finally:
        for proc in procs:
            kill(proc)
        for log in logs:
            log.close()


def parse_steps(output: str) -> list[tuple[int, float]]:
    """``[(step, loss)]`` from the ``step=... loss=...`` lines, checking their exact format."""
    rows = []
    for line in output.splitlines():
        if line.startswith("step="):
            m = STEP_RE.match(line)
            assert m, f"malformed log line: {line!r}"
            rows.append((int(m.group(1)), float(m.group(2))))
    return rows


def assert_ok(results: list[tuple[int, str]]) -> None:
    for rank, (rc, out) in enumerate(results):
        assert rc == 0, f"rank {rank} exited {rc}:\n{out[-4000:]}"


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-node, 30-step training run with a checkpoint directory (shared by several tests)."""
    workdir = tmp_path_factory.mktemp("train")
    ckpt_dir = workdir / "ckpt"
    started = time.monotonic()
    results = run_indexed_job(
        ["--steps", "30", "--log-every", "10", "--checkpoint-dir", str(ckpt_dir)], workdir
    )
    return {"results": results, "ckpt_dir": ckpt_dir, "wall_s": time.monotonic() - started}


def test_two_node_training_reduces_loss(trained: dict[str, Any]) -> None:
    results = trained["results"]
    assert_ok(results)
    out0, out1 = results[0][1], results[1][1]

    steps = parse_steps(out0)
    assert [s for s, _ in steps] == [1, 10, 20, 30]
    first_loss, last_loss = steps[0][1], steps[-1][1]
    assert first_loss > 5.0  # ~ln(256) = 5.55 for an untrained byte-level model
    assert last_loss < first_loss - 1.0, steps
    assert "world_size=2" in out0 and "backend=gloo" in out0
    assert not parse_steps(out1), "only rank 0 should log"

    final = [m for m in map(FINAL_RE.match, out0.splitlines()) if m]
    assert len(final) == 1 and int(final[0].group(1)) == 30
    assert float(final[0].group(2)) == pytest.approx(last_loss, abs=1e-4)

    metrics = json.loads((trained["ckpt_dir"] / "metrics.json").read_text())
    assert metrics["steps"] == 30
    assert metrics["first_loss"] == pytest.approx(first_loss, abs=1e-4)
    assert metrics["last_loss"] == pytest.approx(last_loss, abs=1e-4)
    assert metrics["last_loss"] < metrics["first_loss"]
    # On the CPU no peak is known: MFU is n/a, never a figure from a nominal peak.
    assert metrics["tokens_per_s"] > 0 and metrics["mfu_percent"] is None
    assert all(line.endswith("mfu=n/a") for line in out0.splitlines() if line.startswith("step="))
    assert (trained["ckpt_dir"] / "checkpoint.pt").is_file()
    assert not [p for p in trained["ckpt_dir"].iterdir() if p.name.endswith(".tmp")]


def test_single_process_without_distributed_env() -> None:
    proc = subprocess.run(
        [sys.executable, str(TRAIN), "--steps", "5", "--log-every", "5", "--batch-size", "8"],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TRAIN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert [s for s, _ in parse_steps(proc.stdout)] == [1, 5]
    assert "world_size=1 backend=none" in proc.stdout


def test_mfu_is_measured_against_the_peak_the_platform_gives(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    proc = subprocess.run(
        [sys.executable, str(TRAIN), "--steps", "5", "--log-every", "5", "--batch-size", "8",
         "--checkpoint-dir", str(ckpt_dir)],
        cwd=REPO, env=clean_env(PEAK_TFLOPS="0.25"), capture_output=True, text=True, timeout=TRAIN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((ckpt_dir / "metrics.json").read_text())
    # PaLM's MFU (Chowdhery et al. 2022, App. B): tokens/s x FLOPs per token over the peak of one process.
    expected = 100 * metrics["tokens_per_s"] * metrics["flops_per_token"] / 0.25e12
    assert metrics["peak_tflops_per_device"] == 0.25
    assert metrics["mfu_percent"] == pytest.approx(expected, rel=1e-9)
    assert "peak_tflops=0.25 (env PEAK_TFLOPS)" in proc.stdout


def test_resume_from_checkpoint(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    common = ["--log-every", "5", "--checkpoint-every", "10", "--checkpoint-dir", str(ckpt_dir)]

    first = run_indexed_job(["--steps", "10", *common], tmp_path)
    assert_ok(first)
    assert not RESUME_RE.search(first[0][1])
    first_metrics = json.loads((ckpt_dir / "metrics.json").read_text())
    assert first_metrics["steps"] == 10

    second = run_indexed_job(["--steps", "20", *common], tmp_path)
    assert_ok(second)
    out0 = second[0][1]
    resumed = [m for m in map(RESUME_RE.match, out0.splitlines()) if m]
    assert [int(m.group(1)) for m in resumed] == [10], out0
    assert [s for s, _ in parse_steps(out0)] == [11, 15, 20]
    metrics = json.loads((ckpt_dir / "metrics.json").read_text())
    assert metrics["steps"] == 20
    assert metrics["resumed_from_step"] == 10
    # first_loss is the job's untrained loss, carried over in the checkpoint.
    assert metrics["first_loss"] == pytest.approx(first_metrics["first_loss"])
    assert metrics["last_loss"] < metrics["first_loss"]


# --------------------------------------------------------------------------- #
# Serving
# --------------------------------------------------------------------------- #


def http(method: str, url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, bytes]:
    """Send a request; returns ``(status, body)`` for success and HTTP errors alike."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def start_serve(trained: dict[str, Any], tmp_path: Path):
    """``examples/serve.py`` on a free port over ``trained``'s checkpoint, its output in ``serve.log``, waited for
    until ``/healthz`` answers 200 (60 s at most); returns ``(process, base URL, log file)``."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, str(SERVE), "--host", "127.0.0.1"],
        cwd=REPO, env=clean_env(CHECKPOINT_DIR=str(trained["ckpt_dir"]), PORT=str(port)),
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            log.close()
            raise AssertionError(f"server exited early: {(tmp_path / 'serve.log').read_text()}")
        with contextlib.suppress(OSError):
            if http("GET", f"{base}/healthz")[0] == 200:
                return proc, base, log
        if time.monotonic() >= deadline:
            kill(proc)
            log.close()
            raise AssertionError("server never became healthy")
        time.sleep(0.2)


def test_serve_generates_and_rejects_bad_input(trained: dict[str, Any], tmp_path: Path) -> None:
    assert_ok(trained["results"])
    proc, base, log = start_serve(trained, tmp_path)
    try:
        status, body = http("GET", f"{base}/healthz")
        assert status == 200
        assert body == b"ok"

        waited: list[float] = []  # each request's latency as the client saw it: at least the server's

        def timed(payload: dict) -> tuple[int, bytes]:
            started = time.monotonic()
            answer = http("POST", f"{base}/generate", payload)
            waited.append(time.monotonic() - started)
            return answer

        status, body = timed({"prompt": "The ", "max_new_tokens": 32, "temperature": 0.8})
        assert status == 200, body
        reply = json.loads(body)
        assert isinstance(reply["text"], str) and reply["text"]
        assert reply["checkpoint_step"] == 30

        greedy = {"prompt": "def ", "max_new_tokens": 16, "temperature": 0}
        replies = [json.loads(timed(greedy)[1]) for _ in range(2)]
        assert replies[0]["text"] == replies[1]["text"]  # temperature 0 is greedy, hence deterministic

        # its load, as the platform reads it on Kubernetes: 3 requests received, none in flight now
        before = time.time()
        status, body = http("GET", f"{base}/metrics")
        assert status == 200
        counters = parse_server_counters(body.decode())
        assert counters is not None and (counters.requests, counters.in_flight) == (3, 0)
        assert counters.in_flight_seconds > 0  # the 3 generations took some time
        assert before <= counters.clock <= time.time()  # the server's wall clock, Unix seconds
        # its figures: the platform endpoint's buckets, cumulative, each answer at or below the client's latency
        assert sorted(counters.buckets) == [*LATENCY_BUCKETS, float("inf")]
        for le, count in counters.buckets.items():
            assert sum(1 for s in waited if s <= le) <= count <= 3, (le, counters.buckets, waited)
        (duration,) = [f for f in text_string_to_metric_families(body.decode()) if f.type == "histogram"]
        assert 0 < next(s.value for s in duration.samples if s.name.endswith("_sum")) <= sum(waited)
        assert counters.errors == 0 and counters.tokens == sum(r["generated_tokens"] for r in [reply, *replies])

        bad_requests = [
            ({"prompt": "x", "max_new_tokens": 513, "temperature": 1.0}, "max_new_tokens"),
            ({"prompt": "x", "max_new_tokens": "ten"}, "max_new_tokens"),
            ({"max_new_tokens": 8}, "prompt"),
            ({"prompt": 42}, "prompt"),
            ({"prompt": "x", "temperature": "hot"}, "temperature"),
            ({"prompt": "x", "temperature": -1}, "temperature"),
            ({"prompt": "x", "colour": "blue"}, "colour"),
            ([1, 2, 3], "body"),
        ]
        for payload, field in bad_requests:
            status, body = http("POST", f"{base}/generate", payload)
            assert status == 400, (payload, status, body)
            error = json.loads(body)
            assert error["field"] == field and error["reason"], (payload, error)
        status, body = http("POST", f"{base}/generate", raw=b"{not json")
        assert status == 400 and json.loads(body)["field"] == "body"

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        kill(proc)
        log.close()


def test_serve_answers_the_requests_in_flight_when_stopped_and_refuses_new_connections(
        trained: dict[str, Any], tmp_path: Path) -> None:
    """A replica retired by a scale-down or a rollout gets SIGTERM after the endpoint took it out of rotation: what
    it was answering must still be answered (a POST is not retried by a proxy once sent), and a late connection
    must be refused (which a proxy retries elsewhere), never accepted and dropped."""
    import threading
    from http.client import HTTPException

    proc, base, log = start_serve(trained, tmp_path)
    outcomes: list[tuple[float, float, str]] = []  # (sent, answered, outcome)
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                status, _ = http("POST", f"{base}/generate", {"prompt": "The ", "max_new_tokens": 16})
                outcome = str(status)
            except urllib.error.URLError as exc:
                refused = isinstance(exc.reason, ConnectionRefusedError)
                outcome = "refused" if refused else f"broken: {exc.reason!r}"
            except (HTTPException, OSError) as exc:
                outcome = f"broken: {exc!r}"
            outcomes.append((sent, time.monotonic(), outcome))
            if outcome == "refused":
                return

    try:
        clients = [threading.Thread(target=client) for _ in range(2)]
        for thread in clients:
            thread.start()
        while not any(outcome == "200" for _, _, outcome in outcomes):
            time.sleep(0.05)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        stop.set()
        for thread in clients:
            thread.join(60)
    finally:
        stop.set()
        kill(proc)
        log.close()
    kinds = {outcome for _, _, outcome in outcomes}
    assert kinds <= {"200", "refused"}, outcomes  # no request accepted and then dropped
    assert any(sent < stopped < answered and outcome == "200" for sent, answered, outcome in outcomes), outcomes


# --------------------------------------------------------------------------- #
# Job specs
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name,kind", [("train-gpt", "training"), ("serve-gpt", "inference")])
def test_job_specs_parse(name: str, kind: str) -> None:
    import yaml

    doc = yaml.safe_load((JOBS / f"{name}.yaml").read_text())
    assert doc["name"] == name and doc["kind"] == kind and doc["team"]
    spec = doc["spec"]
    for key in ("image", "command", "args", "resources", "priority", "max_runtime_seconds",
                "preemptible", "max_retries", "placement"):
        assert key in spec, key
    assert (REPO / spec["command"][-1]).is_file()
    assert all(isinstance(a, str) for a in spec["command"] + spec["args"])
    assert set(spec["resources"]) >= {"accelerator", "gpus_per_node", "nodes", "cpu", "memory_gib"}
    if kind == "inference":
        assert spec["replicas"] >= 1 and 0 < spec["port"] < 65536
    else:
        assert spec["resources"]["nodes"] == 2


def test_a_sweeps_values_are_the_defaults_of_lr_and_batch_size(monkeypatch) -> None:
    from examples.train_gpt import parse_args

    monkeypatch.delenv("SWEEP_LR", raising=False)
    monkeypatch.delenv("SWEEP_BATCH_SIZE", raising=False)
    assert (parse_args([]).lr, parse_args([]).batch_size) == (6e-3, 48)
    monkeypatch.setenv("SWEEP_LR", "0.012")
    monkeypatch.setenv("SWEEP_BATCH_SIZE", "64")
    assert (parse_args([]).lr, parse_args([]).batch_size) == (0.012, 64)
    assert parse_args(["--lr", "0.1"]).lr == 0.1  # the command line still wins
    monkeypatch.setenv("SWEEP_LR", "-1")
    with pytest.raises(SystemExit, match="SWEEP_LR"):
        parse_args([])


def test_the_sweep_example_is_a_grid_over_the_training_example() -> None:
    import yaml

    doc = yaml.safe_load((JOBS / "sweep-gpt.yaml").read_text())
    assert doc["array"]["grid"] == {"lr": [0.003, 0.006, 0.012], "batch_size": [32, 64]}
    assert doc["array"]["parallelism"] == 2 and doc["kind"] == "training"
    assert (REPO / doc["spec"]["command"][-1]) == TRAIN
