"""``cpctl utilization``, ``reports``, ``report ID [--csv]`` against the live API, and the hint an empty node log
gets."""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal

import pytest

from costs.models import UtilizationRollup
from costs.reports.build import generate_report
from jobs.models import Job, JobState
from runners.models import Cluster
from tests.costs.test_capacity import T0, allocate, sync_fleet
from tests.support.factories import make_attempt, make_cost_entry, make_job

DAY = dt.datetime(2026, 3, 10, tzinfo=dt.timezone.utc)


def rows(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


@pytest.fixture
def used(funded_aws_cluster, teams, owner, h100):
    """alpha's job "big" on DAY: 8 GPUs x 2 h at $6.88 billed; 480 samples averaging 40 %, 4 of 16 GPU-h idle;
    and a job whose other node has DCGM no data (a rollup without samples)."""
    cluster, pool = funded_aws_cluster["cluster"], funded_aws_cluster["pool"]
    big = make_job(teams[0], owner.user, h100, name="big", gpus_per_node=8)
    attempt = make_attempt(big, cluster, pool, state="SUCCEEDED")
    make_cost_entry(attempt, DAY + dt.timedelta(hours=10), dt.timedelta(hours=2), 8 * 2 * Decimal("6.88"),
                    gpus=8)
    UtilizationRollup.objects.create(
        attempt=attempt, job=big, team=teams[0], cluster=cluster, accelerator=h100, day=DAY.date(),
        gpu_seconds=16 * 3600, samples=480, expected_samples=480, util_sum=480 * 40.0, avg_gpu_util_percent=40.0,
        observed_gpu_seconds=16 * 3600, idle_gpu_seconds=4 * 3600)
    return {"big": big, "attempt": attempt}


def test_utilization_is_a_table_by_job_with_a_total(run_cli, owner, used):
    result = run_cli("utilization", "--group-by", "job", "--start", "2026-03-10", "--end", "2026-03-11",
                     persona=owner)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("GPU utilization by job, 2026-03-10 00:00:00 to 2026-03-11 00:00:00 (UTC)")
    table = rows("\n".join(lines[1:]))
    assert table[0] == ["JOB", "JOB NAME", "GPU-HOURS", "AVG UTIL", "COVERAGE", "IDLE GPU-H", "IDLE %", "IDLE COST"]
    idle_usd = 8 * 2 * Decimal("6.88") / 4  # a quarter of the job's GPU-hours were idle
    assert table[1] == [str(used["big"].pk), "big", "16.00", "40.0%", "100%", "4.00", "25.0%",
                        f"${idle_usd:.2f}"]
    assert table[-1][0] == "TOTAL" and table[-1][-5] == "40.0%"
    as_json = json.loads(run_cli("utilization", "--json", persona=owner).out)
    assert as_json["results"][0]["avg_gpu_util_percent"] == 40.0


def test_reports_list_show_and_csv(run_cli, owner, outsider, used, teams):
    report, _ = generate_report(teams[0], DAY, DAY + dt.timedelta(days=1), "daily")
    listed = run_cli("reports", persona=owner)
    assert listed.code == 0, listed.err
    table = rows(listed.out)
    assert table[0] == ["ID", "SCOPE", "KIND", "FROM (UTC)", "TO (UTC)", "GPU-HOURS", "COST", "AVG UTIL"]
    assert table[1] == [str(report.pk), "alpha", "daily", "2026-03-10 00:00:00", "2026-03-11 00:00:00", "16.00",
                        "$110.08", "40.0%"]

    shown = run_cli("report", str(report.pk), persona=owner)
    assert shown.code == 0, shown.err
    assert shown.out.splitlines()[0] == f"report {report.pk}  daily for alpha, 2026-03-10 00:00:00 to " \
                                        "2026-03-11 00:00:00 UTC"
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in shown.out.splitlines()[1:4])
    assert fields["cost"] == "$110.08" and fields["GPU-hours"] == "16.00"
    assert fields["utilization"].startswith("40.0% average, 100% observed; idle 4.00 GPU-h (25.0%) = $27.52")
    assert "Top jobs" in shown.out and re.search(rf"{used['big'].pk}\s+big\s+alpha\s+16\.00\s+\$110\.08", shown.out)

    csv = run_cli("report", str(report.pk), "--csv", persona=owner)
    assert csv.code == 0 and csv.out.rstrip("\n") == report.csv.rstrip("\n")
    assert csv.out.startswith("section,item,metric,value")
    assert run_cli("report", str(report.pk), persona=outsider).code == 5  # another team's report


def test_no_reports_says_when_they_come(run_cli, owner, teams):
    result = run_cli("reports", persona=owner)
    assert (result.code, result.out) == (0, "")
    assert "06:00 UTC" in result.err


def test_an_empty_node_log_gets_a_hint_naming_the_other_nodes(run_cli, owner, funded_local_cluster, teams, h100):
    pool = funded_local_cluster.node_pools.get(name="gpu")
    job = make_job(teams[0], owner.user, pool.accelerator, name="quiet", nodes=2)
    attempt = make_attempt(job, funded_local_cluster, pool)  # no process: no log file either
    result = run_cli("logs", str(job.pk), "--node", "1", persona=owner)
    assert (result.code, result.out) == (0, "")
    assert result.err == (f"(node 1 of attempt {attempt.number} has printed nothing yet; the job has 2 nodes (0 to 1) "
                          "and often only rank 0 prints: try --node 0)\n")
    rank0 = run_cli("logs", str(job.pk), "--node", "0", persona=owner)  # rank 0 is pointed to the next node
    assert rank0.err == f"(node 0 of attempt {attempt.number} has printed nothing yet; the job has 2 nodes (0 to 1): try --node 1)\n"
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    ended = run_cli("logs", str(job.pk), "--node", "1", persona=owner)
    assert ended.err.startswith(f"(node 1 of attempt {attempt.number} has printed nothing in this attempt;"), ended.err


def test_capacity_is_a_table_with_a_total_and_team_shares(run_cli, owner, catalog, teams, h100):
    """Two 8-GPU nodes seen 4 hours (64 GPU-h), alpha's job 8 GPUs for 1 hour: 56 GPU-h unallocated, $385.28."""
    cluster = Cluster.objects.create(name="aws-use1", provider="aws", region="us-east-1", backend="kubernetes")
    sync_fleet(cluster, {i: {"node-a": ("on-demand", 8, True), "node-b": ("on-demand", 8, True)} for i in range(241)})
    allocate(cluster, teams, owner.user, h100, [(0, ["node-a"], 8, 60, 120)])
    window = ["--start", T0.isoformat(), "--end", (T0 + dt.timedelta(hours=4)).isoformat()]
    result = run_cli("capacity", *window, persona=owner)
    assert result.code == 0, result.err
    table = rows("\n".join(result.out.splitlines()[1:]))
    assert table[0] == ["CLUSTER", "CAPACITY GPU-H", "CORDONED", "ALLOCATED", "UNALLOCATED", "UNALLOCATED COST",
                        "UNPRICED GPU-H"]
    assert table[1] == ["aws-use1", "64.00", "0.00", "8.00", "56.00", "$385.28", "0.00"]
    assert table[-1][0] == "TOTAL" and table[-1][4] == "56.00"
    shares = rows("\n".join(run_cli("capacity", "--group-by", "team", *window, persona=owner).out.splitlines()[1:]))
    assert shares[1] == ["alpha", "8.00", "$55.04", "56.00", "$385.28", "$440.32"]
    bad = run_cli("capacity", "--start", "2026-03-05", "--end", "2026-03-01", persona=owner)
    assert bad.code == 2 and "end" in bad.err


def test_build_report_makes_one_of_any_period_and_prints_it(run_cli, owner, used):
    result = run_cli("build-report", "--team", "alpha", "--start", "2026-03-10T09:00:00Z", "--end", "2026-03-11",
                     persona=owner)
    assert result.code == 0, result.err
    first = result.out.splitlines()[0]
    assert re.fullmatch(r"report \d+  custom for alpha, 2026-03-10 09:00:00 to 2026-03-11 00:00:00 UTC", first)
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in result.out.splitlines()[1:3])
    assert fields["cost"].startswith("$110.08") and fields["GPU-hours"] == "16.00"  # the 10:00-12:00 run
    listed = rows(run_cli("reports", "--kind", "custom", persona=owner).out)
    assert listed[1][:3] == [first.split()[1], "alpha", "custom"]


@pytest.mark.parametrize("argv, message", [
    (["--team", "alpha", "--start", "2026-03-11", "--end", "2026-03-10"], "end: must be after start"),
    (["--team", "alpha", "--start", "2026-01-01", "--end", "2026-06-01"], "a report covers at most 92 days"),
    (["--team", "gamma", "--start", "2026-03-10", "--end", "2026-03-11"], 'team: unknown team "gamma"'),
    (["--platform", "--start", "2026-03-10", "--end", "2026-03-11"], "team: required"),
    (["--team", "alpha", "--platform", "--start", "2026-03-10", "--end", "2026-03-11"], "--team TEAM or --platform"),
    (["--start", "2026-03-10", "--end", "2026-03-11"], "--team TEAM or --platform"),
])
def test_build_report_refuses_bad_input_with_the_reason_and_exit_2(run_cli, owner, teams, argv, message):
    result = run_cli("build-report", *argv, persona=owner)
    assert (result.code, result.out) == (2, "")
    assert message in result.err and "Traceback" not in result.err
