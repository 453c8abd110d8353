"""``cpctl``'s command line: usage errors exit 2 with a usage message, connection options go before or after the
command's name and win over the environment, ids may be negative (the API answers 404), the entry points exit
with the command's code, tables stay one plain line per row when piped, and Ctrl-C exits 130."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys

import pytest

from jobs.models import Job

from .conftest import REPO, invoke, spawn_cli
from .test_submit import EXAMPLE

UNREACHABLE = "http://127.0.0.1:9"
COMMANDS = ["submit", "resubmit", "jobs", "job", "events", "efficiency", "cancel", "logs", "rollout", "arrays", "array", "quotas", "cohorts", "fair-share", "clusters", "budgets",
            "costs", "utilization", "capacity", "reports", "report", "build-report", "nodes", "cordon", "drain", "uncordon",
            "clear-health", "requests", "request", "approve", "decline", "withdraw", "audit",
            "subscriptions", "subscribe", "unsubscribe", "notifications"]


def test_help_lists_every_command_and_exits_0():
    for flag in ("--help", "-h"):
        result = invoke([flag])
        assert result.code == 0
        assert result.out.startswith("Usage: cpctl [OPTIONS] COMMAND")
        commands = result.out.split("Commands:\n")[1].split("\n\n")[0]  # the epilog follows a blank line
        listed = [line.split()[0] for line in commands.splitlines() if not line.startswith("   ")]
        assert listed == COMMANDS


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["jobs", "--bogus"],
    ["jobs", "--limit", "0"],
    ["reports", "--limit", "many"],
    ["costs", "--group-by", "week"],
    ["utilization", "--group-by", "Team"],
    ["--timeout", "0", "jobs"],
    ["jobs", "--timeout", "nan"],
    ["job"],
    ["job", "abc"],
    ["job", "1", "2"],
    ["logs", "1", "--tail", "0"],
    ["nodes", "--health", "sick"],
    ["reports", "--kind", "yearly"],
    ["submit", str(EXAMPLE), "--interval", "inf"],
    ["submit", str(EXAMPLE), "--dry-run", "--wait"],
    ["cordon"],
    ["drain", "n0"],
    ["audit", "--action", "renamed"],
    ["audit", "--object-id", "0"],
])
def test_a_bad_command_line_is_a_usage_message_and_exit_2_before_any_request(argv):
    result = invoke(["--url", UNREACHABLE, *argv])
    assert result.code == 2
    assert result.out == ""
    assert "Usage: cpctl" in result.err and "cannot reach" not in result.err


@pytest.mark.parametrize("argv, message", [
    (["--url", "ftp://x", "jobs"], "error: bad control plane URL ftp://x: expected http(s)://host[:port]\n"),
    (["--url", "http://127.0.0.1:99999", "jobs"], "error: bad control plane URL (CONTROLPLANE_URL or --url): "),
    (["--url", UNREACHABLE, "--token", "ключ", "jobs"], "error: the API token must be printable ASCII without "
                                                         "spaces (as issued); check CONTROLPLANE_TOKEN\n"),
    (["--url", UNREACHABLE, "logs", "1", "--follow", "--json"], "error: --json cannot be combined with --follow "
                                                                 "(the stream is plain text)\n"),
])
def test_bad_connection_settings_and_option_pairs_exit_2_with_one_line(argv, message):
    result = invoke(argv)
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith(message) and len(result.err.splitlines()) == 1


CONSOLE_SCRIPT = "import sys; sys.argv[0] = '/venv/bin/cpctl'; from cpctl.cli import main; sys.exit(main())"


def run_entry(*argv: str) -> subprocess.CompletedProcess:
    """Run what the console script ``cpctl = "cpctl.cli:main"`` runs, with ``argv``."""
    return subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["jobs", "--bogus"], 2), (["--url", "ftp://x", "jobs"], 2),
                                        (["--url", UNREACHABLE, "jobs"], 7)])
def test_the_console_script_entry_and_the_module_exit_with_the_commands_code(argv, code):
    script = run_entry(*argv)
    assert script.returncode == code, script.stderr
    module = subprocess.run([sys.executable, "-m", "cpctl", *argv], cwd=REPO, capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert module.returncode == code, module.stderr
    assert (module.stdout, module.stderr) == (script.stdout, script.stderr)
    assert "Traceback" not in script.stderr


def test_connection_options_go_after_the_command_and_win_over_those_before_and_the_environment(
        server, teammate, funded_aws_cluster):
    after = invoke(["jobs", "--url", server, f"--token={teammate.key}", "--json"])
    assert after.code == 0, after.err
    assert json.loads(after.out)["count"] == 0
    overridden = invoke(["--url", UNREACHABLE, "--token=wrong", "jobs", "--url", server, f"--token={teammate.key}"])
    assert (overridden.code, overridden.err) == (0, "no jobs\n")
    environment = {"CONTROLPLANE_URL": server, "CONTROLPLANE_TOKEN": teammate.key}
    assert invoke(["jobs"], env=environment).code == 0
    assert invoke(["jobs"], env={**environment, "CONTROLPLANE_TOKEN": "wrong"}).code == 3
    assert invoke(["--url", server, "jobs"], env={**environment, "CONTROLPLANE_URL": UNREACHABLE}).code == 0
    assert invoke(["--url", UNREACHABLE, "jobs"], env=environment).code == 7


def test_a_negative_id_is_asked_for_and_not_found(run_cli, teammate, funded_aws_cluster):
    for argv in (["job", "-1"], ["cancel", "-1", "--json"], ["events", "--json", "-7"]):
        result = run_cli(*argv, persona=teammate)
        assert result.code == 5, (argv, result.err)
        assert result.err.startswith("error: ") and result.err.rstrip().endswith("(HTTP 404)")
    node = run_cli("logs", "-1", "--node", "-1", persona=teammate)
    assert node.code == 5, node.err


def test_a_piped_table_is_plain_text_one_line_per_row_however_long(run_cli, teammate, funded_aws_cluster):
    from runners.cluster_health import set_health

    reason = "probe failed: " + " ".join(f"step-{i}" for i in range(60))  # far wider than any terminal
    set_health(funded_aws_cluster["cluster"], "degraded", reason, now=dt.datetime(2026, 3, 4, tzinfo=dt.timezone.utc))
    result = run_cli("clusters", persona=teammate)
    assert result.code == 0, result.err
    assert "\x1b" not in result.out
    lines = result.out.splitlines()
    assert len(lines) == 3 and all(line == line.rstrip() for line in lines)  # header, the cluster, what GPUS counts
    assert lines[2].startswith("POOL GPUS: ")
    assert lines[1].startswith("aws-use1  ") and lines[1].endswith("  " + reason)
    assert lines[0].index("WHY") == lines[1].index(reason)  # the header stands over its column


def test_ctrl_c_while_following_a_submitted_job_exits_130_and_the_job_keeps_running(
        server, owner, funded_aws_cluster):
    process = spawn_cli(server, owner.key, "submit", str(EXAMPLE), "--team", "alpha", "--wait", "--interval", "0.2")
    try:
        first = process.stdout.readline()  # printed once submitted: from then on it follows the job
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    job = Job.objects.get()
    assert first == f"job {job.pk} submitted: train-gpt (team alpha), QUEUED\n"
    assert process.returncode == 130, (out, err)
    assert err == f"stopped following job {job.pk}; it keeps running (cancel it with: cpctl cancel {job.pk})\n"
    assert not job.is_final
