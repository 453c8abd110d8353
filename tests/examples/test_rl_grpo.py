"""The GRPO example (``examples/rl_grpo.py``): its three roles run as local processes with the platform's role
environment, its arithmetic against values worked out by hand, and its job spec.

Every subprocess runs with a timeout and is killed in ``finally`` blocks. No Django needed.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from examples.gpt import GPT, GPTConfig
from examples.rl_grpo import group_advantages, grpo_loss, parse_args, reward
from examples.workload_metrics import WorkloadMetrics
from jobs.efficiency.protocol import parse_exposition, parse_line
from tests.support.net import free_port

from .workloads import REPO, clean_env, kill

RL = REPO / "examples" / "rl_grpo.py"
TIMEOUT_S = 120
#: A model and batch small enough for a few seconds per run on one shared core.
TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--prompts-per-step", "2",
        "--group-size", "6", "--max-new-tokens", "8", "--sample-every", "0"]
LEARNER_STEP = re.compile(r"^step=(\d+) reward=(\S+) tokens_per_s=(\S+) loss=(\S+) tokens=(\d+) logprob_gap=(\S+)$")
ROLLOUT_STEP = re.compile(r"^step=(\d+) version=(\d+) tokens_per_s=(\S+) samples_per_s=(\S+) tokens=(\d+)$")
WEIGHTS = re.compile(r"^weights version=(\d+) bytes=\d+$")
_ROLE_VARIABLES = ("CONTROLPLANE_ROLE", "CONTROLPLANE_ROLE_INDEX", "CONTROLPLANE_ROLES",
                   "CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES", "CONTROLPLANE_ROLE_LEARNER_ADDRESSES",
                   "CONTROLPLANE_METRICS_PORT")


def role_env(**extra: str) -> dict[str, str]:
    """A clean environment (no job or role variables of the caller's shell) plus ``extra``."""
    env = {k: v for k, v in clean_env().items() if k not in _ROLE_VARIABLES}
    env.update(extra)
    return env


def start_job(tmp_path: Path, learner_args: list[str], rollouts: int = 2) -> tuple[subprocess.Popen, list, list]:
    """Start ``rollouts`` rollout processes and one learner on 127.0.0.1 as the platform's runners would: role,
    index, the role list, each rollout's ``PORT`` and the rollouts' addresses for the learner. Returns the
    learner, the rollouts and the open log files (``learner.log``, ``rollout<i>.log`` in ``tmp_path``)."""
    ports = [free_port() for _ in range(rollouts)]
    common = {"CONTROLPLANE_ROLES": "learner,rollout",
              "CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES": ",".join(f"127.0.0.1:{p}" for p in ports)}
    logs, procs = [], []
    for index, port in enumerate(ports):
        log = open(tmp_path / f"rollout{index}.log", "w+")
        logs.append(log)
        env = role_env(CONTROLPLANE_ROLE="rollout", CONTROLPLANE_ROLE_INDEX=str(index), PORT=str(port), **common)
        procs.append(subprocess.Popen([sys.executable, str(RL), "--host", "127.0.0.1", "--learner-timeout", "60"],
                                      cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    log = open(tmp_path / "learner.log", "w+")
    logs.append(log)
    env = role_env(CONTROLPLANE_ROLE="learner", CONTROLPLANE_ROLE_INDEX="0", **common)
    learner = subprocess.Popen([sys.executable, str(RL), *learner_args], cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    return learner, procs, logs


def finish(learner: subprocess.Popen, rollouts: list[subprocess.Popen], logs: list) -> tuple[list[int], list[str]]:
    """Wait for every process (at most ``TIMEOUT_S`` in all); their exit statuses and outputs, rollouts first."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for proc in [*rollouts, learner]:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
        return [p.returncode for p in [*rollouts, learner]], outputs
    finally:
        for proc in [*rollouts, learner]:
            kill(proc)
        for log in logs:
            log.close()


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """``(status, body)`` of one request, for error statuses too."""
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, "the rollout exited before it answered"
        try:
            if http("GET", url)[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the rollout never answered /healthz"
        time.sleep(0.2)


# --------------------------------------------------------------------------- #
# The three roles
# --------------------------------------------------------------------------- #


def test_learner_and_two_rollouts_raise_the_reward(tmp_path: Path) -> None:
    steps = 24
    learner, rollouts, logs = start_job(tmp_path, ["--steps", str(steps), "--lr", "1e-2", *TINY])
    statuses, outputs = finish(learner, rollouts, logs)
    *rollout_outputs, learner_output = outputs
    assert statuses == [0, 0, 0], "\n".join(o[-3000:] for o in outputs)

    rows = [m for m in map(LEARNER_STEP.match, learner_output.splitlines()) if m]
    assert [int(m.group(1)) for m in rows] == list(range(1, steps + 1)), learner_output
    rewards = [float(m.group(2)) for m in rows]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    # Vowels are 5 of 256 bytes: a fresh model's samples hold few; GRPO makes them more frequent.
    first, last = statistics.mean(rewards[:4]), statistics.mean(rewards[-4:])
    assert first < 0.1 and last > first + 0.2, rewards
    # The rollouts sampled with the learner's exact weights: the log-probabilities agree to rounding.
    assert all(float(m.group(6)) < 1e-3 for m in rows)
    final = [line for line in learner_output.splitlines() if line.startswith("final ")]
    assert len(final) == 1 and f"final step={steps} " in final[0] and f"first_reward={rewards[0]:g}" in final[0]

    # The platform's parser reads the learner's lines as progress reports and skips the example's own keys.
    report = parse_line(rows[-1].group(0))
    assert report is not None and report.kind == "progress"
    assert report.values["step"] == steps and report.values["tokens_per_s"] > 0
    assert "reward" not in report.values

    for index, output in enumerate(rollout_outputs):
        versions = [int(m.group(1)) for m in map(WEIGHTS.match, output.splitlines()) if m]
        assert versions == list(range(steps)), output  # one push a step, in order
        generated = [m for m in map(ROLLOUT_STEP.match, output.splitlines()) if m]
        # Each rollout samples one group (prompt j goes to rollout j mod 2) of 6 x 8 bytes a step.
        assert [int(m.group(2)) for m in generated] == list(range(steps))
        assert [int(m.group(5)) for m in generated] == [48 * (k + 1) for k in range(steps)]
        assert all(float(m.group(3)) > 0 for m in generated)
        assert f"final step={steps} " in output and f"rollout {index} stopped status=0" in output


def test_learner_starts_from_a_train_gpt_checkpoint(tmp_path: Path) -> None:
    # A checkpoint in train_gpt.py's format whose model writes "a" after any context: the final LayerNorm's
    # weight is 0, so its output is its bias, which is the (tied) embedding row of "a", scaled far above the rest.
    config = GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32)
    model = GPT(config)
    with torch.no_grad():
        direction = torch.ones(config.n_embd)
        model.tok_emb.weight[ord("a")] = direction
        model.ln_f.weight.zero_()
        model.ln_f.bias.copy_(40 * direction)
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    torch.save({"format_version": 1, "model_config": config.to_dict(), "model": model.state_dict(), "step": 7},
               ckpt_dir / "checkpoint.pt")

    learner, rollouts, logs = start_job(tmp_path, ["--steps", "2", "--init-checkpoint", str(ckpt_dir),
                                                   "--prompts-per-step", "2", "--group-size", "4",
                                                   "--max-new-tokens", "8"], rollouts=1)
    statuses, (rollout_output, learner_output) = finish(learner, rollouts, logs)
    assert statuses == [0, 0], learner_output + rollout_output
    assert f"start=checkpoint {ckpt_dir / 'checkpoint.pt'} step=7" in learner_output
    rows = [m for m in map(LEARNER_STEP.match, learner_output.splitlines()) if m]
    assert [float(m.group(2)) for m in rows] == [1.0, 1.0]  # every sampled byte is "a"


def test_learner_refuses_a_missing_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(RL), "--role", "learner", "--rollouts", "127.0.0.1:9",
                           "--init-checkpoint", str(tmp_path / "nothing")],
                          cwd=REPO, env=role_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 2
    assert "no checkpoint at" in proc.stderr


def test_learner_gives_up_on_a_rollout_that_never_answers() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.run([sys.executable, str(RL), "--role", "learner", "--rollouts", address,
                           "--connect-timeout", "1", *TINY],
                          cwd=REPO, env=role_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"not healthy after 1 s: {address}" in proc.stderr
    assert not re.search(r"^step=", proc.stdout, re.MULTILINE)


def test_rollout_answers_conflict_without_weights_and_stops_without_a_learner(tmp_path: Path) -> None:
    port = free_port()
    log = open(tmp_path / "rollout.log", "w+")
    proc = subprocess.Popen([sys.executable, str(RL), "--host", "127.0.0.1", "--learner-timeout", "3"], cwd=REPO,
                            env=role_env(CONTROLPLANE_ROLE="rollout", PORT=str(port)), stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(f"{base}/healthz", proc)
        body = {"prompts": [[65]], "n": 2, "max_new_tokens": 4, "temperature": 1.0, "seed": 1, "version": 0}
        status, answer = http("POST", f"{base}/generate", json.dumps(body).encode())
        assert status == 409 and json.loads(answer)["error"] == "wrong_weights"
        status, answer = http("POST", f"{base}/generate", b"{not json")
        assert status == 400
        status, answer = http("POST", f"{base}/weights", b"not a torch file")
        assert status == 400 and json.loads(answer)["error"] == "invalid_request"
        assert proc.wait(timeout=TIMEOUT_S) == 4  # nobody asked for anything for 3 s
        log.seek(0)
        assert "no request from the learner" in log.read()
    finally:
        kill(proc)
        log.close()


def test_role_comes_from_the_environment_and_must_be_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_ROLE", "learner")
    monkeypatch.setenv("CONTROLPLANE_ROLES", "learner,rollout")
    monkeypatch.setenv("CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES", "10.0.0.5:8000, 10.0.0.6:8000")
    args = parse_args([])
    assert args.role == "learner" and args.rollouts == ["10.0.0.5:8000", "10.0.0.6:8000"]
    assert parse_args(["--rollouts", "127.0.0.1:1"]).rollouts == ["127.0.0.1:1"]  # the flag wins
    monkeypatch.setenv("CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES", "10.0.0.5")
    with pytest.raises(SystemExit):
        parse_args([])  # an address without a port
    monkeypatch.delenv("CONTROLPLANE_ROLE")
    with pytest.raises(SystemExit):
        parse_args([])  # no role at all


# --------------------------------------------------------------------------- #
# Arithmetic
# --------------------------------------------------------------------------- #


def test_group_advantages_match_a_hand_computed_example() -> None:
    rewards = [[0.25, 0.5, 0.75, 1.0], [0.3, 0.3, 0.3, 0.3]]
    # Group 1: mean 0.625, sample variance (0.375² + 0.125² + 0.125² + 0.375²) / 3 = 0.3125 / 3.
    std = math.sqrt(0.3125 / 3)
    expected = [[(r - 0.625) / (std + 1e-4) for r in rewards[0]], [0.0] * 4]
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64)).tolist()
    for row, expected_row in zip(got, expected, strict=True):
        assert row == pytest.approx(expected_row, rel=1e-12, abs=1e-12)
    assert expected[0][3] == pytest.approx(1.1615, abs=1e-4)
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0], [2.0]]))  # a group of one has no spread


def test_grpo_loss_clips_the_ratio_and_adds_the_kl_estimate() -> None:
    old = torch.zeros(2, 1, dtype=torch.float64)
    new = torch.full((2, 1), math.log(1.5), dtype=torch.float64)  # ratio 1.5
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, kl = grpo_loss(new, old, advantages, clip_eps=0.2)
    # A > 0: min(1.5, 1.2) = 1.2; A < 0: min(-1.5, -1.2) = -1.5; loss = -(1.2 - 1.5) / 2.
    assert loss.item() == pytest.approx(0.15, rel=1e-12) and kl.item() == 0.0
    ref = new + math.log(2)  # log(pi_ref / pi) = log 2: KL estimate 2 - log 2 - 1
    loss, kl = grpo_loss(new, old, advantages, clip_eps=0.2, ref_logp=ref, kl_coef=0.5)
    assert kl.item() == pytest.approx(1 - math.log(2), rel=1e-12)
    assert loss.item() == pytest.approx(0.15 + 0.5 * (1 - math.log(2)), rel=1e-12)


def test_reward_is_the_fraction_of_vowel_bytes() -> None:
    assert reward(list(b"aXe!")) == 0.5
    assert reward(list(b"AEIOU")) == 0.0  # lower case only
    assert reward([]) == 0.0


def test_workload_metrics_print_and_expose_extra_keys() -> None:
    import io

    out = io.StringIO()
    metrics = WorkloadMetrics(stream=out, rank=0, port=0, extra_keys=("reward",))
    metrics.report(3, reward=0.25, tokens_per_s=100.5)
    assert out.getvalue() == "step=3 reward=0.25 tokens_per_s=100.5\n"
    exposition = metrics.exposition()
    assert "workload_reward 0.25" in exposition
    report = parse_exposition(exposition)
    assert report is not None and dict(report.values) == {"step": 3, "tokens_per_s": 100.5}
    with pytest.raises(TypeError):
        metrics.report(4, accuracy=1.0)
    with pytest.raises(ValueError):
        WorkloadMetrics(stream=out, rank=0, port=0, extra_keys=("tokens_per_s",))


# --------------------------------------------------------------------------- #
# Job spec
# --------------------------------------------------------------------------- #


def test_job_spec_has_a_learner_and_two_rollouts_whose_arguments_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    doc = yaml.safe_load((REPO / "examples" / "jobs" / "rl-grpo.yaml").read_text())
    assert doc["name"] == "rl-grpo" and doc["kind"] == "multi-role" and doc["team"]
    roles = doc["spec"]["roles"]
    assert set(roles) == {"learner", "rollout"}
    assert roles["learner"]["resources"]["nodes"] == 1 and roles["rollout"]["resources"]["nodes"] == 2
    assert 0 < roles["rollout"]["port"] < 65536
    for name, role in roles.items():
        assert role["resources"]["gpus_per_node"] == 0 and role["resources"]["cpu"] >= 1
        assert (REPO / role["command"][-1]).resolve() == RL
        monkeypatch.setenv("CONTROLPLANE_ROLE", name)
        monkeypatch.setenv("CONTROLPLANE_ROLES", ",".join(roles))
        monkeypatch.setenv("CONTROLPLANE_ROLE_ROLLOUT_ADDRESSES", "10.0.0.5:8000,10.0.0.6:8000")
        monkeypatch.setenv("PORT", str(roles["rollout"]["port"]))
        args = parse_args(role["args"])
        assert args.role == name
