"""``cpctl job`` of a multi-role job tables its roles as the API gives them: GPU utilization, idle GPU-hours, how it
was attributed and each role's last reported throughput (figures worked out here from the rollups written)."""

from __future__ import annotations

import datetime as dt
from datetime import UTC

from costs.models import NodeUtilizationRollup, UtilizationRollup
from jobs.models import WorkloadMetrics
from tests.support.factories import make_attempt, make_job_row

from .test_read import rows

START = dt.datetime(2026, 5, 4, 10, tzinfo=UTC)


def test_job_tables_each_roles_utilization_and_throughput(run_cli, teammate, funded_aws_cluster, teams, owner, h100):
    spec = {"roles": {"learner": {"image": "python:3.11", "command": ["python", "rl.py"], "env": {},
                                  "resources": {"accelerator": "H100-80GB", "gpus_per_node": 2, "nodes": 1}},
                      "rollout": {"image": "python:3.11", "command": ["python", "rl.py"], "env": {},
                                  "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 2},
                                  "completion": False}},
            "priority": "normal", "max_runtime_seconds": 7200, "preemptible": False, "placement": {},
            "max_retries": 0}
    job = make_job_row(teams[0], owner.user, h100, name="grpo", kind="multi-role", spec=spec, nodes=3,
                       gpus_per_node=1, state="SUCCEEDED")
    attempt = make_attempt(job, funded_aws_cluster["cluster"], funded_aws_cluster["pool"], gpus=4, started_at=START,
                           ended_at=START + dt.timedelta(hours=1), state="SUCCEEDED")
    attempt.placement = {"roles": {"learner": {"nodes": ["n1"], "gpus_per_node": 2},
                                   "rollout": {"nodes": ["n2", "n3"], "gpus_per_node": 1}}}
    attempt.save(update_fields=["placement"])
    # Series without pod labels, each role on nodes of its own: (node, samples, percent sum, observed s, idle s).
    nodes = [("n1", 100, 4000.0, 7200.0, 1800.0), ("n2", 60, 600.0, 3600.0, 1800.0), ("n3", 60, 1800.0, 3600.0, 0.0)]
    common = {"attempt": attempt, "team": teams[0], "cluster": funded_aws_cluster["cluster"], "day": START.date()}
    UtilizationRollup.objects.create(**common, job=job, accelerator=h100, gpu_seconds=4 * 3600.0, samples=220,
                                     expected_samples=240.0, util_sum=6400.0, observed_gpu_seconds=14400.0,
                                     idle_gpu_seconds=3600.0)
    for node, samples, util_sum, observed, idle in nodes:
        NodeUtilizationRollup.objects.create(**common, node=node, samples=samples, util_sum=util_sum,
                                             observed_gpu_seconds=observed, idle_gpu_seconds=idle)
    WorkloadMetrics.objects.create(attempt=attempt, pods={
        "learner": {"0": {"step": 5, "tokens_per_s": 1234.5, "samples_per_s": None, "final": True}},
        "rollout": {"0": {"step": 9, "tokens_per_s": 600.0, "samples_per_s": 2.0, "final": False},
                    "1": {"step": 8, "tokens_per_s": 634.5, "samples_per_s": 2.0, "final": False}}})

    result = run_cli("job", str(job.pk), persona=teammate)
    assert result.code == 0, result.err
    table = rows(result.out.split("\n\n")[-1])
    assert table[0] == ["ROLE", "PODS", "GPUS", "GPU-H", "COST", "GPU UTIL", "IDLE GPU-H", "ATTRIBUTED BY",
                        "THROUGHPUT"]
    # learner: 4000 / 100 = 40.0 %, 1800 s idle = 0.50 h; rollout: (600 + 1800) / 120 = 20.0 %, 0.50 h idle.
    assert table[1] == ["learner", "1", "2", "0.00", "$0.00", "40.0%", "0.50", "node", "1,234.5 tok/s"]
    assert table[2] == ["rollout", "2", "2", "0.00", "$0.00", "20.0%", "0.50", "node", "1,234.5 tok/s (600.0, 634.5)"]


def test_a_cpu_only_multi_role_jobs_size_is_its_roles_summed_on_the_cli_and_the_page(run_cli, teams, owner, h100):
    from tests.support.personas import signed_in

    roles = {"learner": {"image": "python:3.11", "command": ["python", "rl.py"], "env": {},
                         "resources": {"accelerator": "CPU", "gpus_per_node": 0, "nodes": 1, "cpu": 2,
                                       "memory_gib": 4}},
             "rollout": {"image": "python:3.11", "command": ["python", "rl.py"], "env": {},
                         "resources": {"accelerator": "CPU", "gpus_per_node": 0, "nodes": 2, "cpu": 1,
                                       "memory_gib": 2}, "completion": False}}
    spec = {"roles": roles, "priority": "normal", "max_runtime_seconds": 600, "preemptible": False,
            "placement": {}, "max_retries": 0}
    job = make_job_row(teams[0], owner.user, h100, name="grpo-cpu", kind="multi-role", spec=spec, nodes=3,
                       gpus_per_node=0)
    out = run_cli("job", str(job.pk), persona=owner).out
    (line,) = [line for line in out.splitlines() if line.split(None, 1)[:1] == ["resources"]] or [out]
    assert line.split(None, 1)[1].strip() == ("learner: 1 node(s) x 2 CPU cores, 4 GiB (CPU-only, no GPUs); "
                                          "rollout: 2 node(s) x 1 CPU cores, 2 GiB (CPU-only, no GPUs) = 0 GPUs")
    # the jobs list: 1 x 2 + 2 x 1 = 4 vCPUs and 1 x 4 + 2 x 2 = 8 GiB
    page = signed_in(owner).get("/jobs/").content.decode()
    assert "4 vCPUs, 8 GiB" in page
