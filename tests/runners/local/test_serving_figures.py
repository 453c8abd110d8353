"""The figures of the demo's model served on the local runner: the endpoint counts requests, 5xx answers, tokens and
latencies, the pass keeps them, and the API shows them with the GPU-hours and USD per million requests the ledger
billed (computed here from its entries)."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
from decimal import ROUND_HALF_EVEN, Decimal

import requests
from django.utils import timezone

from costs.ledger import accrue_attempt
from costs.models import CostEntry
from jobs.models import ServingSample
from runners.local.layout import read_json
from runners.local.runner import attempt_dir
from runners.models import Cluster
from serving.autoscaler import autoscale

from .test_autoscaled_serving import PROMPT, checkpoint, generate, serving_job  # noqa: F401 - fixtures


def test_the_pass_keeps_what_the_demo_model_served_and_the_api_shows_its_figures(serving_job, owner):  # noqa: F811
    attempt = serving_job(1)
    endpoint = attempt.runner_state["endpoint"]
    now = timezone.now()
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=now)
    autoscale(now)  # the first sample: nothing served yet (readiness checks are no requests)

    answers = [generate(endpoint) for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 6
    assert {a.headers["X-Generated-Tokens"] for a in answers} == {str(PROMPT["max_new_tokens"])}
    assert {a.json()["generated_tokens"] for a in answers} == {PROMPT["max_new_tokens"]}
    child = read_json(attempt_dir(attempt) / "node-0.pid")["child"]["pid"]
    subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(child)], check=True)  # the only replica dies
    lost = requests.post(f"{endpoint}/generate", json=PROMPT, timeout=60)  # not idempotent: not sent again
    assert lost.status_code in (502, 503)

    later = now + dt.timedelta(seconds=15)
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=later)
    accrue_attempt(attempt.pk, later)
    autoscale(later)
    samples = list(ServingSample.objects.filter(job_id=attempt.job_id).order_by("at"))
    assert [s.requests for s in samples] == [0, 7] and [s.errors for s in samples] == [0, 1]
    assert samples[-1].tokens == 6 * PROMPT["max_new_tokens"] and samples[-1].latency_buckets["+Inf"] == 7

    figures = owner.client.get(f"/api/v1/jobs/{attempt.job_id}/").json()["serving"]["figures"]
    assert (figures["requests"], figures["errors"], figures["tokens"]) == (7, 1, 6 * PROMPT["max_new_tokens"])
    assert figures["error_rate_percent"] == round(100 / 7, 4)
    assert 0 < figures["latency_p50_ms"] <= figures["latency_p99_ms"]
    entries = list(CostEntry.objects.filter(job_id=attempt.job_id))  # all within the hour before ``later``
    gpu_hours = sum(Decimal(e.gpu_milli) / 1000 * Decimal(str((e.interval_end - e.interval_start).total_seconds()))
                    for e in entries) / 3600
    assert figures["gpu_hours"] == round(float(gpu_hours), 6)
    usd = sum(e.amount_usd for e in entries)
    per_million = usd * 1_000_000 / 7
    assert per_million >= Decimal("0.01")
    assert figures["usd_per_million_requests"] == str(per_million.quantize(Decimal("0.01"), ROUND_HALF_EVEN))
    assert figures["replicas"] == [[samples[0].at.isoformat(), 1]]
