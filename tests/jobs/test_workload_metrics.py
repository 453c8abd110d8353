"""Workload metrics end to end: a real short run of examples/train_gpt.py under the local runner (log lines) and a
script serving its metrics with examples/workload_metrics.py (Prometheus exposition), read back through the API;
MFU and USD per million tokens through the API against a hand computation."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from jobs.models import Job, JobAttempt, WorkloadMetrics
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from jobs.workload import collect_workload_metrics
from runners.local.runner import attempt_dir
from tests.support.factories import make_attempt, make_job, make_job_row, make_workload_metrics
from tests.support.local_runner import dispatched, emulated_local_cluster_for, wait_until

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs/"
TINY_GPT = ["--steps", "6", "--log-every", "2", "--batch-size", "4", "--block-size", "32", "--n-layer", "1",
            "--n-embd", "32", "--n-head", "2"]
FINAL = re.compile(r"^final step=(\d+) .*\btokens_per_s=([0-9.]+) ", re.M)


@pytest.fixture
def local_cluster(local_runs, settings, monkeypatch, catalog, teams):
    """The local cluster of 1 node x 8 emulated H100 GPUs (no real GPU detected) and alpha's quota for them."""
    return emulated_local_cluster_for(settings, monkeypatch, teams[0], catalog["H100-80GB"], nodes=1)


def started(teams, user, catalog, command, args) -> JobAttempt:
    """A job running ``command`` on 1 local node, admitted and dispatched; its attempt."""
    job = make_job_row(teams[0], user, catalog["H100-80GB"], name="w", nodes=1, max_runtime=120,
                       spec={"command": command, "args": args, "env": {}})
    assert try_admit(job.pk) == "admitted"
    job.refresh_from_db()
    return dispatched(JobAttempt.objects.get(pk=job.current_attempt_id))


def reconcile_until(attempt: JobAttempt, states, timeout: float) -> Job:
    def reached():
        reconcile_cluster(attempt.cluster)
        attempt.job.refresh_from_db()
        return attempt.job.state in states
    wait_until(reached, timeout, f"job to reach {states}")
    return attempt.job


def test_a_training_run_s_reported_throughput_reads_back_equal_to_its_final_line(
        local_cluster, teams, user, catalog, teammate):
    attempt = started(teams, user, catalog, ["python", "examples/train_gpt.py"], TINY_GPT)
    job = reconcile_until(attempt, {"SUCCEEDED", "FAILED"}, timeout=120)
    log = (attempt_dir(attempt) / "node-0.log").read_text()
    assert job.state == "SUCCEEDED", log
    final_step, final_tokens_per_s = FINAL.search(log).groups()

    # Reconcile reads an ended attempt's reports before it deletes the attempt's objects; when that happened in the
    # passes above, the collection has nothing left to read for it.
    read_by_reconcile = WorkloadMetrics.objects.filter(attempt=attempt, complete=True).exists()
    assert collect_workload_metrics() == {"collected": 0 if read_by_reconcile else 1, "unreachable": 0}
    efficiency = teammate.client.get(f"{JOBS}{job.pk}/").json()["efficiency"]
    assert efficiency["tokens_per_s"] == float(final_tokens_per_s)
    run = efficiency["attempts"][0]
    assert run["source"] == "log" and run["last"]["step"] == int(final_step) == 6
    assert run["reports"] == 4  # steps 1, 2, 4 and 6
    assert run["tokens"] == 4 * 32 * 6  # batch x block x steps, one rank
    assert run["flops_source"] == "workload" and run["flops_per_token"] > 0
    assert efficiency["mfu_percent"] is None and "CPU" in efficiency["mfu_reason"]
    assert WorkloadMetrics.objects.get(attempt=attempt).complete
    assert collect_workload_metrics() == {"collected": 0, "unreachable": 0}  # an ended attempt is read once


SERVE_METRICS = """
import sys, time
sys.path.insert(0, "examples")
from workload_metrics import WorkloadMetrics
metrics = WorkloadMetrics(flops_per_token=1.5e6, tokens_per_step=4096, log_lines=False)
metrics.report(120, tokens_per_s=5120.5, loss=2.25, tokens=491520)
print("serving", flush=True)
time.sleep(60)
"""


def test_a_workload_s_prometheus_exposition_is_scraped_on_the_port_the_runner_declares(
        local_cluster, teams, user, catalog, teammate):
    attempt = started(teams, user, catalog, ["python", "-c", SERVE_METRICS], [])
    reconcile_until(attempt, {"RUNNING"}, timeout=30)
    wait_until(lambda: "serving" in (attempt_dir(attempt) / "node-0.log").read_text(), 30, "the server to start")
    assert attempt_dir(attempt).joinpath("node-0.log").read_text().strip() == "serving"  # no report in the log

    collect_workload_metrics()
    row = WorkloadMetrics.objects.get(attempt=attempt)
    assert row.source == "prometheus" and not row.complete
    assert (row.tokens_per_s, row.flops_per_token, row.tokens) == (5120.5, 1.5e6, 491520)
    body = teammate.client.get(f"{JOBS}{attempt.job_id}/efficiency/").json()
    assert body["attempts"][0]["last"] == {"step": 120, "tokens_per_s": 5120.5, "samples_per_s": None,
                                           "step_time_s": None, "loss": 2.25}
    assert [point[1:] for point in body["attempts"][0]["series"]] == [[120, 5120.5, 2.25]]


def test_mfu_and_usd_per_million_tokens_through_the_api(aws_cluster, teams, user, h100, teammate):
    job = make_job(teams[0], user, h100, gpus_per_node=8)
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], state="SUCCEEDED")
    make_workload_metrics(attempt, "config flops_per_token=43200000000 tokens_per_step=1000000\n"
                                   "step=1 tokens_per_s=100000\nstep=50 tokens_per_s=120000\n"
                                   "final step=50 tokens_per_s=120000\n")
    Job.objects.filter(pk=job.pk).update(accrued_cost_usd=Decimal("137.60"))
    efficiency = teammate.client.get(f"{JOBS}{job.pk}/").json()["efficiency"]
    # 120,000 tokens/s x 43.2e9 FLOPs = 5.184e15 FLOP/s over 8 x 989e12: 65.5207 %.
    assert efficiency["mfu_percent"] == round(100 * 1.2e5 * 43.2e9 / (8 * 989e12), 4) and efficiency["mfu_reason"] == ""
    # 50 steps x 1e6 tokens = 5e7 tokens for $137.60: $2.752 per million.
    assert efficiency["tokens"] == 50_000_000 and efficiency["usd_per_million_tokens"] == "2.752000"


def test_a_job_without_reports_has_no_mfu_and_says_why(aws_cluster, teams, user, h100, teammate):
    job = make_job(teams[0], user, h100)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    efficiency = teammate.client.get(f"{JOBS}{job.pk}/").json()["efficiency"]
    assert efficiency["tokens_per_s"] is None and efficiency["mfu_percent"] is None
    assert "throughput" in efficiency["mfu_reason"] and efficiency["usd_per_million_tokens"] is None
