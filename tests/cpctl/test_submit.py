"""``cpctl submit`` against the live API: YAML and JSON documents, overrides, field errors, bad tokens, --wait."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from jobs.lifecycle import cancel_job
from jobs.models import Job

from .conftest import REPO, invoke, spawn_cli

EXAMPLE = REPO / "examples" / "jobs" / "train-gpt.yaml"


def write_yaml(tmp_path: Path, **changes) -> Path:
    """The train-gpt example for team alpha, with ``changes`` to its top level, as a .yaml file."""
    document = yaml.safe_load(EXAMPLE.read_text())
    document.update(team="alpha", **changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_it_submits_a_yaml_document_and_prints_the_id_and_state(run_cli, owner, funded_aws_cluster, tmp_path):
    result = run_cli("submit", str(write_yaml(tmp_path)), persona=owner)
    assert result.code == 0, result.err
    job = Job.objects.get()
    assert (job.name, job.team.slug, job.submitter, job.nodes, job.gpus_per_node) == (
        "train-gpt", "alpha", owner.user, 2, 1)
    assert job.spec["args"] == ["--steps", "200", "--log-every", "20", "--checkpoint-every", "50"]
    assert result.out == f"job {job.pk} submitted: train-gpt (team alpha), QUEUED\n"


def test_it_submits_the_example_as_is_with_team_and_name_overridden(run_cli, owner, funded_aws_cluster):
    result = run_cli("submit", str(EXAMPLE), "--team", "alpha", "--name", "my-run", persona=owner)
    assert result.code == 0, result.err
    job = Job.objects.get()
    assert (job.team.slug, job.name, job.state) == ("alpha", "my-run", "QUEUED")
    assert f"job {job.pk} submitted: my-run (team alpha), QUEUED" in result.out


@pytest.mark.parametrize("overrides", [[], ["--name", "renamed"]], ids=["as-is", "rewritten-with-an-override"])
def test_a_yaml_key_named_twice_is_refused_with_the_key_and_nothing_is_stored(run_cli, owner, funded_aws_cluster,
                                                                              tmp_path, overrides):
    path = write_yaml(tmp_path)
    path.write_text(path.read_text().replace("spec:\n", "spec:\n  max_runtime_seconds: 60\n", 1))
    result = run_cli("submit", str(path), *overrides, persona=owner)
    assert result.code == 2 and 'duplicate key "max_runtime_seconds"' in result.err, (result.out, result.err)
    assert not Job.objects.exists()


def test_it_submits_json_and_json_output_parses(run_cli, teammate, funded_aws_cluster, tmp_path):
    document = yaml.safe_load(EXAMPLE.read_text())
    document.update(team="alpha", name="from-json")
    path = tmp_path / "job.json"
    path.write_text(json.dumps(document))
    result = run_cli("submit", str(path), "--json", persona=teammate)
    assert result.code == 0, result.err
    body = json.loads(result.out)
    assert (body["name"], body["state"], body["submitter"], body["total_gpus"]) == (
        "from-json", "QUEUED", "teammate", 2)
    assert Job.objects.get().pk == body["id"]


def test_a_refused_document_prints_each_field_path_and_exits_2_storing_nothing(
        run_cli, owner, funded_aws_cluster, tmp_path):
    document = yaml.safe_load(EXAMPLE.read_text())
    document["team"] = "alpha"
    document["spec"]["resources"].update(gpus_per_node=-1, accelerator="Z80")
    document["spec"]["max_runtime_seconds"] = "soon"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    result = run_cli("submit", str(path), persona=owner)
    assert result.code == 2
    assert result.out == ""
    lines = result.err.splitlines()
    assert lines[0] == "error: the API refused the request (HTTP 400):"
    paths = {line.split(": ", 1)[0] for line in lines[1:]}
    assert {"spec.resources.gpus_per_node", "spec.resources.accelerator", "spec.max_runtime_seconds"} <= paths
    assert all(": " in line for line in lines[1:])
    assert Job.objects.count() == 0


def test_a_team_without_quota_for_the_accelerator_is_refused_with_the_field_and_reason(
        run_cli, owner, aws_cluster, tmp_path):
    result = run_cli("submit", str(write_yaml(tmp_path)), persona=owner)
    assert result.code == 2 and result.out == ""
    assert result.err.splitlines() == [
        "error: the API refused the request (HTTP 400):",
        "spec.resources.accelerator: team alpha has no quota for H100-80GB GPUs: no nominal quota and nothing to "
        "borrow, so a job of 2 GPUs (2 x 1) could never run"]
    assert Job.objects.count() == 0


def test_a_yaml_syntax_error_is_the_apis_detail_and_exit_2(run_cli, owner, funded_aws_cluster, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nspec: [unclosed\n")
    result = run_cli("submit", str(path), persona=owner)
    assert result.code == 2
    assert "YAML parse error" in result.err and "(HTTP 400)" in result.err
    assert Job.objects.count() == 0


def test_a_missing_file_exits_2_without_a_request(run_cli, owner, tmp_path):
    result = run_cli("submit", str(tmp_path / "nope.yaml"), persona=owner)
    assert result.code == 2
    assert result.err.startswith(f"error: cannot read {tmp_path / 'nope.yaml'}")


def test_a_bad_token_is_a_401_with_the_apis_detail_and_exit_3_and_is_never_printed(run_cli, owner, funded_aws_cluster):
    secret = "not-a-token-3f9c1d2e"
    result = run_cli("submit", str(EXAMPLE), "--team", "alpha", token=secret)
    assert result.code == 3
    assert "Invalid or expired token. (HTTP 401)" in result.err
    assert "CONTROLPLANE_TOKEN" in result.err
    assert secret not in result.out + result.err
    assert Job.objects.count() == 0
    missing = run_cli("jobs")
    assert missing.code == 3 and "Authentication credentials were not provided" in missing.err


def test_an_unreachable_server_is_a_one_line_hint_with_the_url(db):
    result = invoke(["--url", "http://127.0.0.1:9", "jobs"], env={"CONTROLPLANE_TOKEN": "secret-token-value"})
    assert result.code == 7
    assert result.err == ("error: cannot reach the control plane at http://127.0.0.1:9: is it running? "
                          "Set --url or CONTROLPLANE_URL\n")
    assert "secret-token-value" not in result.out + result.err


def test_submit_wait_in_a_subprocess_follows_the_job_and_exits_1_when_it_is_cancelled(
        server, owner, funded_aws_cluster):
    process = spawn_cli(server, owner.key, "submit", str(EXAMPLE), "--team", "alpha", "--wait", "--interval", "0.2")
    try:
        deadline = time.monotonic() + 30
        while not Job.objects.exists():
            assert time.monotonic() < deadline and process.poll() is None, process.communicate()
            time.sleep(0.1)
        job = Job.objects.get()
        time.sleep(0.5)  # let it poll the QUEUED job at least once
        cancel_job(job, actor=owner.user)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, (out, err)
    lines = out.splitlines()
    assert lines[0] == f"job {job.pk} submitted: train-gpt (team alpha), QUEUED"
    assert lines[-2].endswith(f"job {job.pk}: CANCELLED: cancelled by owner")
    assert lines[-1].startswith(f"job {job.pk} ended CANCELLED")
    assert owner.key not in out + err


def test_it_submits_json_from_stdin(run_cli, owner, funded_aws_cluster):
    document = yaml.safe_load(EXAMPLE.read_text())
    document.update(team="alpha", name="from-stdin")
    result = run_cli("submit", "-", persona=owner, stdin=json.dumps(document).encode())
    assert result.code == 0, result.err
    assert Job.objects.get().name == "from-stdin"


def test_issued_keys_never_start_like_an_option(db):
    """A key starting with "-" would read as an option after ``--token`` (``--token=KEY`` is safe either way)."""
    from django.contrib.auth import get_user_model

    from quotas.models import ApiToken

    user = get_user_model().objects.create(username="keys")
    keys = [ApiToken.issue(user, f"k{i}")[1] for i in range(300)]
    assert not [k for k in keys if k[0] in "-_"]
    assert len(set(keys)) == 300


def test_a_cpu_only_document_is_submitted_and_shown_by_its_cpu_and_memory(run_cli, owner, funded_aws_cluster):
    from costs.seed import seed_cpu_prices
    from runners.models import cpu_flavor
    from tests.support.factories import make_cluster

    seed_cpu_prices()
    make_cluster("gcp-cpu", "gcp", "us-central1", cpu_flavor(), nodes=1, gpus_per_node=0)
    example = REPO / "examples" / "jobs" / "prepare-data-cpu.yaml"
    result = run_cli("submit", str(example), "--team", "alpha", persona=owner)
    assert result.code == 0, result.err
    job = Job.objects.get()
    assert (job.accelerator.name, job.gpus_per_node, job.total_gpus) == ("CPU", 0, 0)
    shown = run_cli("job", str(job.pk), persona=owner)
    assert "1 node(s) x 1 CPU cores, 2 GiB (CPU-only, no GPUs)" in shown.out, shown.out


def test_resubmit_submits_the_jobs_submission_again_as_a_new_job(run_cli, owner, teammate, funded_aws_cluster):
    """``cpctl resubmit ID``: a new job of the same team and spec by the caller, under ``--name`` if given; a job
    the caller cannot see exits non-zero with the API's word and stores nothing."""
    assert run_cli("submit", str(EXAMPLE), "--team", "alpha", persona=owner).code == 0
    first = Job.objects.get()
    result = run_cli("resubmit", str(first.pk), "--name", "again", persona=teammate)
    assert result.code == 0, result.err
    again = Job.objects.exclude(pk=first.pk).get()
    assert (again.name, again.team_id, again.spec, again.submitter) == ("again", first.team_id, first.spec,
                                                                        teammate.user)
    assert result.out == f"job {again.pk} submitted from job {first.pk}: again (team alpha), QUEUED\n"
    missing = run_cli("resubmit", str(again.pk + 100), persona=owner)
    assert missing.code != 0 and "HTTP 404" in missing.err, missing.err
    assert Job.objects.count() == 2


def test_after_in_the_yaml_makes_a_pipeline_and_cpctl_job_shows_what_it_waits_for(
        run_cli, owner, funded_aws_cluster, tmp_path):
    assert run_cli("submit", str(write_yaml(tmp_path)), persona=owner).code == 0
    train = Job.objects.get()
    result = run_cli("submit", str(write_yaml(tmp_path, name="evaluate-gpt", after=[{"job": "train-gpt"}])),
                     persona=owner)
    assert result.code == 0, result.err
    evaluate = Job.objects.get(name="evaluate-gpt")
    shown = run_cli("job", str(evaluate.pk), persona=owner)
    assert shown.code == 0, shown.err
    assert f"waits for job {train.pk} (train-gpt) to succeed" in shown.out
    assert f"job {train.pk} (train-gpt) succeeded: QUEUED, not met yet" in shown.out


def test_an_unknown_job_in_after_is_refused_on_its_path_with_exit_2(run_cli, owner, funded_aws_cluster, tmp_path):
    result = run_cli("submit", str(write_yaml(tmp_path, after=[{"job": "no-such-job"}])), persona=owner)
    assert result.code == 2 and result.out == ""
    assert 'after.0.job: no job named "no-such-job" in team "alpha"' in result.err
    assert Job.objects.count() == 0
