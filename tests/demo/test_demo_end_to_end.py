"""The main job end to end: ``manage.py demo --once`` with real Celery worker and beat on Redis and PostgreSQL.

The demo starts the web server, a worker and beat as separate processes,
submits through the REST API (train, evaluate and serve at once, a pipeline
the scheduler runs in order) and exits 0 only if training succeeded with a
falling loss and its evaluation passed. Afterwards the test checks the ledger independently: the cost
entries of the training attempt tile its running interval and each amount
is GPUs x seconds x price, computed here from the rows' own times; the
CPU-only job ran on the local CPU pool and each of its entries is (vCPUs x
vCPU price + GiB x GiB price) x seconds, at the catalog's CPU price.
"""

import datetime as dt
import os
import re
import subprocess
import sys
from decimal import ROUND_HALF_EVEN, Decimal
from itertools import pairwise
from pathlib import Path

import psycopg
import redis

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]


def _fresh_database(base_url: str, name: str) -> str:
    server = base_url.rsplit("/", 1)[0]
    with psycopg.connect(server.replace("postgres://", "postgresql://") + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def test_demo_once_trains_and_charges_with_real_workers(tmp_path):
    base_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane")
    # Named after this run's own database, so test runs against other databases of the server never collide.
    db_url = _fresh_database(base_url, f"{base_url.rsplit('/', 1)[1]}_demo_it")
    broker = os.environ.get("CELERY_BROKER_URL") or "redis://127.0.0.1:6379/14"
    redis.Redis.from_url(broker).flushdb()
    env = {**os.environ, "DATABASE_URL": db_url, "CELERY_BROKER_URL": broker, "CONTROLPLANE_VAR_DIR": str(tmp_path),
           "RECONCILE_INTERVAL_SECONDS": "2", "SCHEDULE_INTERVAL_SECONDS": "3", "ACCRUAL_INTERVAL_SECONDS": "5"}
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "manage.py", "demo", "--once", "--steps", "40", "--port", str(port), "--timeout", "400"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Demo OK" in out
    assert re.search(r"train-gpt\s+SUCCEEDED", out), out
    assert re.search(r"too-expensive-sweep\s+REFUSED\s+at submission: spec.max_runtime_seconds: team applied-ml's "
                     r"monthly budget #\d+ \(block\) can never cover this job", out), out
    # The trained model was served from the training job's checkpoint and answered; --once then cancelled it.
    served = re.search(r"serve-gpt\s+CANCELLED .* endpoint (http://127\.0\.0\.1:(\d+))\n", out)
    assert served, out
    assert int(served.group(2)) != port  # its own PORT, not the demo's web port
    assert re.search(r"answer\s+\".+\"", out), out
    assert "Staff: admin / " in out
    # The pipeline was submitted at once; each job was admitted only after the one it runs after SUCCEEDED.
    assert "Submitted the pipeline at once" in out
    assert re.search(r"evaluate-gpt\s+SUCCEEDED\s+held-out loss [0-9.]+ \(perplexity [0-9.]+\), threshold 4\.0", out), out
    # The GRPO job: three roles admitted as one, its reward rose, each role's cost shown.
    rl = re.search(r"rl-grpo\s+SUCCEEDED\s+reward ([0-9.]+) -> ([0-9.]+)\s+per role: learner 1 pod \$([0-9.]+), "
                   r"rollout 2 pods \$([0-9.]+)", out)
    assert rl, out
    assert float(rl.group(2)) > float(rl.group(1))
    # Part of a GPU, a MIG device and a whole GPU side by side on the emulated cluster's shared and whole nodes, each
    # told what it holds.
    assert re.search(r"gpu-quarter\s+SUCCEEDED\s+holds sharing=time-slicing share=0\.25 node=local-time-slicing-0 "
                     r"gpu=0 ", out), out
    assert re.search(r"gpu-mig-1g10gb\s+SUCCEEDED\s+holds sharing=mig-mixed share=0\.125 node=local-mig-mixed-0 "
                     r"gpu=0 mig_profile=1g\.10gb mig_instance=[12] ", out), out
    assert re.search(r"gpu-whole\s+SUCCEEDED\s+holds sharing=none share=whole ", out), out
    assert "the three ran side by side on one cluster" in out
    # Each billed its share x the hours it ran (the summary's own check; the ledger's rows are checked below).
    for name, share in (("gpu-quarter", r"0\.25"), ("gpu-mig-1g10gb", r"0\.125"), ("gpu-whole", "1")):
        assert re.search(rf"{name}\s+SUCCEEDED\s+holds .* billed [0-9.]+ GPU-h = {share} x [0-9.]+ h ", out), out
    on_demand = re.search(r"report (\d+) \(on demand, ml-research, [0-9-]+ UTC\): [0-9.]+ GPU-hours, \$([0-9.]+)", out)
    assert on_demand, out

    with psycopg.connect(db_url.replace("postgres://", "postgresql://")) as conn:
        (serving_from,), = conn.execute("SELECT spec->>'checkpoint_from' FROM jobs_job WHERE name = 'serve-gpt'")
        (report_start, report_end, report_cost, requester), = conn.execute(
            "SELECT r.period_start, r.period_end, r.data->'totals'->>'cost_usd', u.username FROM frontend_report r "
            "JOIN auth_user u ON u.id = r.requested_by_id WHERE r.id = %s AND r.kind = 'custom'",
            [int(on_demand.group(1))]).fetchall()
        (ledger_cost,), = conn.execute(
            "SELECT coalesce(sum(e.amount_usd), 0) FROM costs_costentry e JOIN quotas_team t ON t.id = e.team_id "
            "WHERE t.slug = 'ml-research' AND e.interval_start >= %s AND e.interval_start < %s",
            [report_start, report_end]).fetchall()
        reports = conn.execute("SELECT count(*) FROM frontend_report WHERE kind = 'daily'").fetchone()[0]
        pipeline = conn.execute("SELECT name, ended_at, admitted_at FROM jobs_job WHERE name IN "
                                "('train-gpt', 'evaluate-gpt', 'serve-gpt') ORDER BY id").fetchall()
        (job_id, accrued), = conn.execute("SELECT id, accrued_cost_usd FROM jobs_job WHERE name = 'train-gpt'").fetchall()
        (attempt_id, gpus, started, ended), = conn.execute(
            "SELECT id, gpus, started_at, ended_at FROM jobs_jobattempt WHERE job_id = %s", [job_id]).fetchall()
        entries = conn.execute(
            "SELECT interval_start, interval_end, gpu_milli / 1000, usd_per_gpu_hour, amount_usd FROM costs_costentry "
            "WHERE attempt_id = %s ORDER BY interval_start", [attempt_id]).fetchall()
        events = [r[0] for r in conn.execute(
            "SELECT to_state FROM jobs_jobevent WHERE job_id = %s AND kind = 'state' ORDER BY created_at, id", [job_id])]
        (prep_state, prep_accrued, prep_pool), = conn.execute(
            "SELECT j.state, j.accrued_cost_usd, p.name FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id "
            "JOIN runners_nodepool p ON p.id = a.node_pool_id WHERE j.name = 'prepare-data'").fetchall()
        cpu_entries = conn.execute(
            "SELECT e.interval_start, e.interval_end, e.gpu_milli / 1000, e.cpu_milli, e.memory_mib, e.usd_per_vcpu_hour, "
            "e.usd_per_gib_hour, e.amount_usd FROM costs_costentry e JOIN jobs_job j ON j.id = e.job_id "
            "WHERE j.name = 'prepare-data' ORDER BY e.interval_start").fetchall()
        rl_admissions = conn.execute(
            "SELECT count(*) FROM jobs_jobevent e JOIN jobs_job j ON j.id = e.job_id WHERE j.name = 'rl-grpo' "
            "AND e.kind = 'state' AND e.to_state = 'ADMITTED'").fetchone()[0]
        (rl_pods, rl_accrued), = conn.execute(  # one attempt (the join gives one row per attempt)
            "SELECT j.nodes, j.accrued_cost_usd FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id "
            "WHERE j.name = 'rl-grpo'").fetchall()
        shared = {name: (nodes, share, profile, started_at, ended_at) for name, nodes, share, profile, started_at, ended_at
                  in conn.execute(
                      "SELECT j.name, a.placement->'nodes', j.gpu_share_milli, j.mig_profile, a.started_at, a.ended_at "
                      "FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id WHERE j.name IN "
                      "('gpu-quarter', 'gpu-mig-1g10gb', 'gpu-whole')")}
        shared_entries = conn.execute(
            "SELECT j.name, e.interval_start, e.interval_end, e.gpu_milli, e.usd_per_gpu_hour, e.amount_usd "
            "FROM costs_costentry e JOIN jobs_job j ON j.id = e.job_id WHERE j.name IN "
            "('gpu-quarter', 'gpu-mig-1g10gb', 'gpu-whole') ORDER BY j.name, e.interval_start").fetchall()
    assert {name: row[:3] for name, row in shared.items()} == {
        "gpu-quarter": (["local-time-slicing-0"], 250, ""), "gpu-mig-1g10gb": (["local-mig-mixed-0"], 125, "1g.10gb"),
        "gpu-whole": (shared["gpu-whole"][0], 0, "")}
    assert shared["gpu-whole"][0][0] in ("local-node-0", "local-node-1")
    assert max(r[3] for r in shared.values()) < min(r[4] for r in shared.values())  # all three running at once
    # The ledger bills each its share: a quarter, a 1g.10gb device's eighth, a whole GPU; over exactly its run.
    billed: dict[str, list] = {}
    for name, start, end, milli, price, amount in shared_entries:
        assert milli == {"gpu-quarter": 250, "gpu-mig-1g10gb": 125, "gpu-whole": 1000}[name]
        seconds = Decimal((end - start) // dt.timedelta(microseconds=1)) / Decimal(10**6)
        expected = (Decimal(milli) / 1000 * seconds * price / Decimal(3600)).quantize(Decimal("1e-9"))
        assert abs(amount - expected) <= Decimal("1e-9")
        billed.setdefault(name, []).append((start, end))
    for name, spans in billed.items():
        assert spans[0][0] == shared[name][3] and spans[-1][1] == shared[name][4]
        assert all(a[1] == b[0] for a, b in pairwise(spans))
    assert events == ["ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]
    # One admission for the whole gang: a learner and two rollouts in one attempt of 3 pods.
    assert (rl_admissions, rl_pods) == (1, 3)
    # The roles' costs (each rounded to cents) add up to the job's ledger total.
    assert abs(Decimal(rl.group(3)) + Decimal(rl.group(4)) - rl_accrued) <= Decimal("0.01")
    assert [r[0] for r in pipeline] == ["train-gpt", "evaluate-gpt", "serve-gpt"]
    assert pipeline[0][1] <= pipeline[1][2] and pipeline[1][1] <= pipeline[2][2]  # each ended before the next was admitted
    assert int(serving_from) == job_id  # the serving job names the training job, not a path
    assert reports == 3  # the daily reports of both teams and the platform, made when the demo started
    # The report asked for on demand: alice's, its total the ledger's over its day (every ml-research job so far).
    assert requester == "alice" and report_end - report_start == dt.timedelta(days=1)
    assert Decimal(report_cost) == Decimal(on_demand.group(2)) == ledger_cost.quantize(Decimal("0.01"), ROUND_HALF_EVEN)
    assert entries, "the training attempt was never charged"
    # The entries tile [started, ended) exactly: no gap, no overlap.
    assert entries[0][0] == started and entries[-1][1] == ended
    assert all(a[1] == b[0] for a, b in pairwise(entries))
    total = Decimal(0)
    for start, end, n, price, amount in entries:
        seconds = Decimal((end - start) // dt.timedelta(microseconds=1)) / Decimal(10**6)
        expected = (Decimal(n) * seconds * price / Decimal(3600)).quantize(Decimal("1e-9"))
        assert n == gpus == 2  # two nodes of one GPU each
        assert abs(amount - expected) <= Decimal("1e-9")
        total += amount
    assert total == accrued

    assert (prep_state, prep_pool) == ("SUCCEEDED", "cpu")
    assert re.search(r"prepare-data\s+SUCCEEDED\s+vCPU-hours", out), out
    assert cpu_entries, "the CPU-only attempt was never charged"
    cpu_total = Decimal(0)
    for start, end, n, cpu_milli, memory_mib, vcpu_price, gib_price, amount in cpu_entries:
        # The seeded catalog figures of costs/data/cpu_prices.csv (GCP N2 on-demand, us-central1).
        assert (n, cpu_milli, memory_mib, vcpu_price, gib_price) == (0, 1000, 1024, Decimal("0.031611"),
                                                                     Decimal("0.004237"))
        seconds = Decimal((end - start) // dt.timedelta(microseconds=1)) / Decimal(10**6)
        expected = ((Decimal("0.031611") + Decimal("0.004237")) * seconds / Decimal(3600)).quantize(Decimal("1e-9"))
        assert abs(amount - expected) <= Decimal("1e-9")
        cpu_total += amount
    assert cpu_total > 0 and cpu_total == prep_accrued
