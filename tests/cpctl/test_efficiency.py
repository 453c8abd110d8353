"""``cpctl job`` and ``cpctl efficiency`` show a training job's throughput, MFU, tokens and USD per million tokens
from the API (expected figures worked out here: H100 peak 989 TFLOP/s)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs.models import Job, ServingScale
from tests.support.factories import make_attempt, make_job, make_workload_metrics

from .test_read import rows


@pytest.fixture
def reported(funded_aws_cluster, teams, owner, h100):
    """A SUCCEEDED 8-GPU job whose run reported 120,000 tokens/s at 43.2e9 FLOPs per token over 50 steps of 1e6
    tokens, costing 137.60 USD."""
    job = make_job(teams[0], owner.user, h100, name="reported", gpus_per_node=8)
    attempt = make_attempt(job, funded_aws_cluster["cluster"], funded_aws_cluster["pool"], state="SUCCEEDED")
    make_workload_metrics(attempt, "config flops_per_token=43200000000 tokens_per_step=1000000\n"
                                   "step=1 loss=5.0 tokens_per_s=100000\nstep=50 loss=3.0 tokens_per_s=120000\n"
                                   "final step=50 tokens_per_s=120000\n")
    Job.objects.filter(pk=job.pk).update(accrued_cost_usd=Decimal("137.60"))
    return job


def test_job_shows_throughput_mfu_and_cost_per_million_tokens(run_cli, teammate, reported):
    result = run_cli("job", str(reported.pk), persona=teammate)
    assert result.code == 0, result.err
    lines = dict(row for row in rows(result.out)[1:] if len(row) == 2)
    assert lines["throughput"] == "120,000.0 tokens/s"
    assert lines["MFU"] == f"{100 * 1.2e5 * 43.2e9 / (8 * 989e12):.2f} %"  # 65.52 %
    assert lines["tokens"] == "50,000,000, $2.75 per million"  # 137.60 USD / 50 M tokens: 2.752, to cents


def test_efficiency_tables_each_attempt(run_cli, teammate, reported):
    result = run_cli("efficiency", str(reported.pk), persona=teammate)
    assert result.code == 0, result.err
    table = rows(result.out)
    assert table[0] == ["ATTEMPT", "STEP", "LAST TOKENS/S", "RUN TOKENS/S", "MEAN LOSS", "MFU", "TOKENS"]
    # mean loss: step 1 counts 1 step, step 50 counts 49: (5.0 + 49 x 3.0) / 50 = 3.04.
    assert table[1] == ["1", "50", "120,000.0", "120,000.0", "3.0400", "65.52 %", "50,000,000"]


def test_efficiency_of_another_team_s_job_is_not_found(run_cli, outsider, reported):
    assert run_cli("efficiency", str(reported.pk), persona=outsider).code == 5


def test_a_serving_job_shows_no_training_efficiency(run_cli, teammate, funded_aws_cluster, teams, owner, h100):
    serving = make_job(teams[0], owner.user, h100, name="serving")
    Job.objects.filter(pk=serving.pk).update(kind="inference")
    make_attempt(serving, funded_aws_cluster["cluster"], funded_aws_cluster["pool"])  # running
    result = run_cli("job", str(serving.pk), persona=teammate)
    assert result.code == 0, result.err
    assert "endpoint" in result.out and "replicas" in result.out  # the serving job's lines
    assert "throughput" not in result.out and "MFU" not in result.out, result.out


def test_a_serving_job_shows_its_autoscaling_and_a_refused_scale_up(run_cli, teammate, funded_aws_cluster, teams,
                                                                    owner, h100):
    scaling = {"min_replicas": 1, "max_replicas": 3, "target_in_flight_per_replica": 2}
    serving = make_job(teams[0], owner.user, h100, name="serving")
    Job.objects.filter(pk=serving.pk).update(kind="inference", spec={**serving.spec, "autoscaling": scaling})
    make_attempt(serving, funded_aws_cluster["cluster"], funded_aws_cluster["pool"])
    ServingScale.objects.create(job=serving, metric=2.5, desired=2, refusal={
        "reason": "budget", "message": "over budget 7 by $3.00", "replicas": 1, "desired": 2})
    result = run_cli("job", str(serving.pk), persona=teammate)
    assert result.code == 0, result.err
    assert "1..3 replicas, target 2 in flight per replica; last read 2.50, decided 2" in result.out, result.out
    assert "2 wanted, stays at 1: over budget 7 by $3.00" in result.out, result.out
