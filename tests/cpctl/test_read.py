"""``cpctl`` read commands and cancel against the live API: jobs, job, events, logs, cancel, quotas, budgets, costs."""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.models import Job
from tests.support.factories import make_attempt, make_cost_entry, make_job

from .conftest import spawn_cli


@pytest.fixture
def jobs(funded_aws_cluster, teams, owner, teammate, outsider, h100):
    """Alpha's QUEUED job (by the teammate, waiting for quota), alpha's RUNNING job (by the owner), beta's job."""
    alpha, beta = teams
    queued = make_job(alpha, teammate.user, h100, name="queued-one", gpus_per_node=2)
    Job.objects.filter(pk=queued.pk).update(queue_info={
        "reason": "quota", "message": "alpha uses 16 of 16 H100-80GB GPUs", "position": {"team": 1, "overall": 2}})
    running = make_job(alpha, owner.user, h100, name="running-one", gpus_per_node=4, nodes=2)
    make_attempt(running, funded_aws_cluster["cluster"], funded_aws_cluster["pool"])
    Job.objects.filter(pk=running.pk).update(accrued_cost_usd=Decimal("3.495"))
    other = make_job(beta, outsider.user, h100, name="beta-secret")
    return {"queued": queued, "running": running, "beta": other}


def rows(text: str) -> list[list[str]]:
    """A printed table's rows (header first), split on runs of two or more spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def test_jobs_is_a_table_of_the_users_teams_jobs_newest_first(run_cli, teammate, jobs):
    result = run_cli("jobs", persona=teammate)
    assert result.code == 0, result.err
    table = rows(result.out)
    assert table[0] == ["ID", "TEAM", "NAME", "STATE", "GPUS", "ACCELERATOR", "COST", "AGE"]
    running, queued = jobs["running"], jobs["queued"]
    assert table[1][:7] == [str(running.pk), "alpha", "running-one", "RUNNING", "8", "H100-80GB", "$3.50"]
    assert table[2][:7] == [str(queued.pk), "alpha", "queued-one", "QUEUED", "2", "H100-80GB", "$0.00"]
    assert table[1][7].endswith("s") and len(table) == 3
    assert "beta-secret" not in result.out


def test_jobs_filters_by_state_and_team(run_cli, teammate, jobs):
    only_running = run_cli("jobs", "--state", "running", persona=teammate)
    assert [r[2] for r in rows(only_running.out)[1:]] == ["running-one"]
    both = run_cli("jobs", "--state", "QUEUED,RUNNING", persona=teammate)
    assert [r[2] for r in rows(both.out)[1:]] == ["running-one", "queued-one"]
    none = run_cli("jobs", "--team", "beta", persona=teammate)
    assert (none.code, none.out, none.err) == (0, "", "no jobs\n")
    limited = run_cli("jobs", "--limit", "1", persona=teammate)
    assert len(rows(limited.out)) == 2 and "(1 of 2 jobs; --limit shows more)" in limited.err
    bad = run_cli("jobs", "--state", "SLEEPING", persona=teammate)
    assert bad.code == 2 and bad.err.splitlines()[1].startswith("state: ")


def test_jobs_filters_by_kind(run_cli, teammate, jobs):
    Job.objects.filter(pk=jobs["running"].pk).update(kind=Job.Kind.INFERENCE)
    serving = run_cli("jobs", "--kind", "inference", persona=teammate)
    assert [r[2] for r in rows(serving.out)[1:]] == ["running-one"]
    training = run_cli("jobs", "--kind", "training", persona=teammate)
    assert [r[2] for r in rows(training.out)[1:]] == ["queued-one"]
    running = run_cli("jobs", "--kind", "any", "--state", "RUNNING", persona=teammate)  # the state keeps every kind
    assert [r[2] for r in rows(running.out)[1:]] == ["running-one"]
    bad = run_cli("jobs", "--kind", "batch", persona=teammate)
    assert bad.code == 2 and "'batch' is not one of 'training', 'inference', 'multi-role', 'any'" in bad.err
    Job.objects.filter(pk=jobs["queued"].pk).update(kind=Job.Kind.MULTI_ROLE)
    gangs = run_cli("jobs", "--kind", "multi-role", persona=teammate)
    assert [r[2] for r in rows(gangs.out)[1:]] == ["queued-one"]


def test_jobs_json_is_the_apis_page(run_cli, teammate, jobs):
    result = run_cli("jobs", "--json", "--state", "QUEUED", persona=teammate)
    page = json.loads(result.out)
    assert page["count"] == 1 and page["results"][0]["id"] == jobs["queued"].pk
    assert page["results"][0]["queue_info"]["reason"] == "quota"


def test_job_shows_why_it_waits_and_its_queue_position(run_cli, teammate, jobs):
    queued = jobs["queued"]
    result = run_cli("job", str(queued.pk), persona=teammate)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == f"job {queued.pk}  queued-one"
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in lines[1:])
    assert fields["state"] == "QUEUED"
    assert fields["waiting for"] == "quota: alpha uses 16 of 16 H100-80GB GPUs"
    assert fields["queue position"] == "1 in team alpha, 2 overall"
    assert fields["resources"] == "1 node(s) x 2 H100-80GB = 2 GPUs"
    assert fields["team"] == "alpha (submitted by teammate)"
    # Never placed: the preview's estimate, 2 GPUs x 1 h (make_job's max runtime) x 6.88 USD/GPU-h on aws-use1.
    assert fields["cost"] == "$0.00 accrued, $13.76 estimated (worst case)"


def test_job_shows_the_current_attempt_and_json_parses(run_cli, teammate, jobs):
    running = jobs["running"]
    result = run_cli("job", str(running.pk), persona=teammate)
    assert f"#1 on aws-use1 ({jobs['running'].current_attempt.node_pool.name}), started " in result.out
    assert "waiting for" not in result.out and "queue position" not in result.out
    body = json.loads(run_cli("--json", "job", str(running.pk), persona=teammate).out)
    assert (body["state"], body["accrued_cost_usd"], body["current_attempt"]["cluster"]) == (
        "RUNNING", "3.50", "aws-use1")


def test_another_teams_job_is_not_found_exit_5(run_cli, outsider, jobs):
    result = run_cli("job", str(jobs["queued"].pk), persona=outsider)
    assert result.code == 5 and result.out == ""
    assert result.err.startswith("error: ") and result.err.rstrip().endswith("(HTTP 404)")
    assert run_cli("events", str(jobs["queued"].pk), persona=outsider).code == 5


def test_cancel_then_events_show_the_timeline(run_cli, owner, teammate, jobs):
    queued, running = jobs["queued"], jobs["running"]
    forbidden = run_cli("cancel", str(running.pk), persona=teammate)  # a member cancelling the owner's job
    assert forbidden.code == 4 and "only the submitter, a team admin or staff may cancel" in forbidden.err

    result = run_cli("cancel", str(queued.pk), persona=owner)
    assert (result.code, result.out) == (0, f"job {queued.pk}: CANCELLED\n")
    again = run_cli("cancel", str(queued.pk), persona=owner)
    assert again.code == 6 and f"job {queued.pk} is already CANCELLED (HTTP 409)" in again.err
    stopping = run_cli("cancel", str(running.pk), persona=owner)
    assert stopping.code == 0 and stopping.out.startswith(f"job {running.pk}: CANCELLING")
    suggested = stopping.out.split("`")[1]  # the command it suggests must be one that runs
    assert suggested.split()[0] == "cpctl", stopping.out
    shown = run_cli(*suggested.split()[1:], persona=owner)
    assert shown.code == 0 and "CANCELLING" in shown.out, shown.err

    events = run_cli("events", str(queued.pk), persona=teammate)
    assert events.code == 0, events.err
    table = rows(events.out)
    assert table[0] == ["TIME (UTC)", "KIND", "STATE", "ATTEMPT", "ACTOR", "REASON"]
    assert table[1][1] == "submitted"
    assert table[-1][1:] == ["state", "QUEUED -> CANCELLED", "-", "owner", "cancelled by owner"]
    page = json.loads(run_cli("events", str(queued.pk), "--json", persona=teammate).out)
    assert [e["kind"] for e in page["results"]] == ["submitted", "state"] and page["count"] == 2


def test_logs_before_any_attempt(run_cli, teammate, jobs):
    result = run_cli("logs", str(jobs["queued"].pk), persona=teammate)
    assert (result.code, result.out) == (0, "")
    assert result.err == f"job {jobs['queued'].pk} has no attempt yet: no logs\n"
    body = json.loads(run_cli("logs", str(jobs["queued"].pk), "--json", persona=teammate).out)
    assert body == {"node": 0, "attempt": None, "text": ""}
    bad_node = run_cli("logs", str(jobs["queued"].pk), "--node", "3", persona=teammate)
    assert bad_node.code == 2 and "node: the job has 1 node(s): 0 to 0" in bad_node.err


def test_quotas_table_shows_gpu_quotas_in_gpus_and_cpu_quotas_in_vcpus(run_cli, teammate, funded_aws_cluster, teams):
    from quotas.models import Quota
    from runners.models import cpu_flavor

    Quota.objects.create(team=teams[0], accelerator=cpu_flavor(), nominal_vcpus=32, borrowing_limit_vcpus=8)
    # beta lends its 2 H100 nominal to the cohort (all teams): alpha (16 + borrowing 4) can reach 16 + 2 of its 20;
    # nobody lends vCPUs, so alpha reaches its CPU nominal only
    Quota.objects.create(team=teams[1], accelerator=funded_aws_cluster["quota"].accelerator, nominal_gpus=2)
    result = run_cli("quotas", persona=teammate)
    assert rows(result.out) == [
        ["TEAM", "ACCELERATOR", "CLUSTER", "NOMINAL", "BORROWING", "LIMIT", "REACHABLE", "MAX/JOB", "UNIT"],
        ["alpha", "CPU", "all", "32", "8", "40", "32", "-", "vCPUs"],
        ["alpha", "H100-80GB", "all", "16", "4", "20", str(16 + min(4, 2)), "8", "GPUs"]]
    listed = json.loads(run_cli("quotas", "--json", persona=teammate).out)["results"]
    assert [(q["accelerator"], q["limit_gpus"], q["limit_vcpus"]) for q in listed] == [("CPU", 0, 40),
                                                                                        ("H100-80GB", 20, 0)]


@pytest.fixture
def ledger(jobs, funded_aws_cluster, teams, h100):
    """$15.50 of alpha's cost in the current budget period: two entries of the running job's attempt."""
    running = jobs["running"]
    attempt = running.current_attempt
    start, _ = funded_aws_cluster["budget"].window()
    first = max(timezone.now() - dt.timedelta(minutes=10), start)
    for offset, amount in ((0, "10.00"), (2, "5.50")):
        begin = first + dt.timedelta(minutes=offset)
        make_cost_entry(attempt, begin, dt.timedelta(minutes=1), amount, gpus=8, usd_per_gpu_hour="6.88")
    return first


def test_budgets_show_spent_committed_remaining_and_forecast(run_cli, teammate, ledger):
    statuses = json.loads(run_cli("budgets", "--json", persona=teammate).out)
    assert len(statuses) == 1 and statuses[0]["spent_usd"] == "15.50" and statuses[0]["amount_usd"] == "1000.00"
    result = run_cli("budgets", persona=teammate)
    assert result.code == 0, result.err
    header, row = rows(result.out)
    assert header == ["TEAM", "PERIOD", "ENDS", "AMOUNT", "SPENT", "COMMITTED", "REMAINING", "FORECAST", "AT 100%"]
    status = statuses[0]
    assert row[0:2] == ["alpha", "monthly"] and row[-1] == "block"
    assert row[3:8] == [f"${status[k]}" for k in ("amount_usd", "spent_usd", "committed_usd", "remaining_usd",
                                                  "forecast_usd")]
    assert run_cli("budgets", "--team", "beta", persona=teammate).err == "no budgets in force\n"


def test_costs_grouped_with_a_total(run_cli, teammate, jobs, ledger):
    by_team = run_cli("costs", persona=teammate)
    assert by_team.code == 0, by_team.err
    assert by_team.out.splitlines()[0] == "costs by team, the beginning to now (UTC); energy n/a: not measured"
    assert rows(by_team.out)[1:] == [["TEAM", "GPU-HOURS", "COST", "ENERGY KWH", "ENERGY COST"],
                                     ["alpha", "0.27", "$15.50", "n/a", "n/a"], ["TOTAL", "0.27", "$15.50", "n/a", "n/a"]]
    by_job = rows(run_cli("costs", "--group-by", "job", persona=teammate).out)
    assert by_job[1] == ["JOB", "JOB NAME", "GPU-HOURS", "COST", "ENERGY KWH", "ENERGY COST"]
    assert by_job[2] == [str(jobs["running"].pk), "running-one", "0.27", "$15.50", "n/a", "n/a"]
    day = ledger.astimezone(dt.timezone.utc).date()
    report = json.loads(run_cli("costs", "--group-by", "day", "--start", day.isoformat(), "--json",
                                persona=teammate).out)
    assert report["start"] == f"{day.isoformat()}T00:00:00+00:00"
    assert report["total"]["cost_usd"] == "15.50" and report["results"][-1]["day"] == day.isoformat()
    later = run_cli("costs", "--start", (day + dt.timedelta(days=1)).isoformat(), persona=teammate)
    assert rows(later.out)[-1] == ["TOTAL", "0.00", "$0.00", "n/a", "n/a"]


def test_costs_bad_window_is_a_field_error_exit_2(run_cli, teammate, funded_aws_cluster):
    result = run_cli("costs", "--start", "2026-11-02", "--end", "2026-11-01", persona=teammate)
    assert result.code == 2
    assert result.err.splitlines()[1:] == ["end: must be after start"]
    naive = run_cli("costs", "--start", "2026-11-01T10:00", persona=teammate)
    assert naive.code == 2 and naive.err.splitlines()[1].startswith("start: Datetime has no timezone")


def test_the_module_runs_as_a_command_with_the_environments_url_and_token(server, teammate, jobs):
    process = spawn_cli(server, teammate.key, "jobs", "--json")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert [job["name"] for job in json.loads(out)["results"]] == ["running-one", "queued-one"]
    assert teammate.key not in out + err


def test_clusters_table_says_since_when_and_why_a_cluster_is_not_healthy(run_cli, teammate, funded_aws_cluster):
    from runners.cluster_health import set_health

    cluster = funded_aws_cluster["cluster"]
    since = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)
    set_health(cluster, "degraded", "1 failed probe(s) in a row, the last: listing Jobs failed: 503", now=since)
    result = run_cli("clusters", persona=teammate)
    assert result.code == 0, result.err
    *table, note = rows(result.out)
    assert table == [["CLUSTER", "WHERE", "HEALTH", "SINCE", "LAST CONTACT", "POOL GPUS", "WHY"],
                     ["aws-use1", "aws/us-east-1", "degraded", "2026-03-04 05:06:07", "never", "16",
                      "1 failed probe(s) in a row, the last: listing Jobs failed: 503"]]
    assert note[0].startswith("POOL GPUS: each node pool's nodes x GPUs per node") and "cpctl nodes" in note[0], note
    body = json.loads(run_cli("clusters", "--json", persona=teammate).out)
    assert body["results"][0]["health_reason"].endswith("listing Jobs failed: 503")


def test_job_and_jobs_show_a_share_of_one_gpu_as_that_share(run_cli, teammate, jobs):
    queued = jobs["queued"]
    Job.objects.filter(pk=queued.pk).update(gpus_per_node=1, gpu_share_milli=250)
    result = run_cli("job", str(queued.pk), persona=teammate)
    assert result.code == 0, result.err
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in result.out.splitlines()[1:])
    assert fields["resources"] == "1 node x 0.25 of one H100-80GB"
    listing = run_cli("jobs", persona=teammate)
    assert listing.code == 0, listing.err
    header, *found = rows(listing.out)
    row = next(r for r in found if r[0] == str(queued.pk))
    assert row[header.index("GPUS")] == "0.25", listing.out


def test_job_says_one_gpu_in_the_singular(run_cli, teammate, jobs):
    queued = jobs["queued"]
    Job.objects.filter(pk=queued.pk).update(gpus_per_node=1)
    result = run_cli("job", str(queued.pk), persona=teammate)
    assert result.code == 0, result.err
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in result.out.splitlines()[1:])
    assert fields["resources"] == "1 node(s) x 1 H100-80GB = 1 GPU"
