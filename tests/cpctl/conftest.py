"""Fixtures of the CLI tests: the app served over real HTTP (pytest-django's ``live_server``), a fleet, and a runner.

The CLI is run in-process through click's ``CliRunner`` on ``cpctl.cli.main``
(stdout and stderr captured apart) or as ``python -m cpctl`` in a
subprocess; either way it reaches the API over HTTP only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpctl import cli

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    """What one CLI run left: its exit code, stdout and stderr."""

    code: int
    out: str
    err: str


@pytest.fixture
def server(live_server, transactional_db, redis_broker, monkeypatch):
    """The live server's URL; the environment's CONTROLPLANE_* variables are cleared so only the tests' count.

    Submissions enqueue scheduling passes: ``redis_broker`` sends them to Redis and purges them afterwards.
    """
    monkeypatch.delenv("CONTROLPLANE_URL", raising=False)
    monkeypatch.delenv("CONTROLPLANE_TOKEN", raising=False)
    return live_server.url


@pytest.fixture
def fleet(cluster_factory, catalog, teams, quota_factory, budget_factory):
    """An AWS H100 cluster (2 x 8 GPUs), alpha's 16-GPU quota and $1000 block budget."""
    cluster, pool = cluster_factory("aws-use1", "aws", "us-east-1", catalog["H100-80GB"], nodes=2, gpus_per_node=8)
    quota = quota_factory(teams[0], catalog["H100-80GB"], 16, borrowing=4, max_per_job=8)
    budget = budget_factory(teams[0], "1000.00")
    return {"cluster": cluster, "pool": pool, "quota": quota, "budget": budget}


def invoke(argv: list[str], env: dict | None = None, stdin: bytes | None = None) -> Result:
    """Run ``cpctl ARGV`` in-process with click's CliRunner (``env`` added to the environment, ``stdin`` as its
    input); an exception the command let through (a traceback for a user) is raised here."""
    result = CliRunner().invoke(cli.main, argv, env=env, input=stdin, prog_name="cpctl")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Result(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def run_cli(server):
    """Run ``cpctl ARGV`` against the live server as ``persona`` (or with ``token``); returns a Result."""

    def run(*argv: str, persona=None, token: str | None = None, stdin: bytes | None = None) -> Result:
        key = token if token is not None else (persona.key if persona is not None else None)
        prefix = ["--url", server] + ([f"--token={key}"] if key else [])  # "=": a key may start with "-"
        return invoke([*prefix, *argv], stdin=stdin)

    return run


def cli_env(server: str, key: str) -> dict:
    """The environment of a ``python -m cpctl`` subprocess: URL and token by variable."""
    env = dict(os.environ, CONTROLPLANE_URL=server, CONTROLPLANE_TOKEN=key)
    env["PYTHONPATH"] = str(REPO)
    return env


def spawn_cli(server: str, key: str, *argv: str) -> subprocess.Popen:
    """Start ``python -m cpctl ARGV`` in a subprocess (text stdout and stderr piped)."""
    return subprocess.Popen([sys.executable, "-m", "cpctl", *argv], cwd=REPO, env=cli_env(server, key),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
