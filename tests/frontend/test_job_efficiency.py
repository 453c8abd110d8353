"""The job page's training-efficiency section: throughput, MFU (or why none), tokens, USD per million tokens and
the throughput chart by step (figures worked out here: H100 peak 989 TFLOP/s)."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from jobs.models import Job
from tests.support.factories import make_attempt, make_cluster, make_job, make_workload_metrics

pytestmark = pytest.mark.django_db


def test_the_job_page_shows_throughput_mfu_and_cost_per_million_tokens(teammate_web, teams, owner, catalog):
    cluster, pool = make_cluster("aws-h100", "aws", "us-east-1", catalog["H100-80GB"])
    job = make_job(teams[0], owner.user, catalog["H100-80GB"], name="reported", gpus_per_node=8)
    attempt = make_attempt(job, cluster, pool, state="SUCCEEDED")
    make_workload_metrics(attempt, "config flops_per_token=43200000000 tokens_per_step=1000000\n"
                                   "step=1 tokens_per_s=100000\nstep=50 tokens_per_s=120000\n"
                                   "final step=50 tokens_per_s=120000\n")
    Job.objects.filter(pk=job.pk).update(accrued_cost_usd=Decimal("137.60"))
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert '<dd id="job-throughput">120000.0 tokens/s</dd>' in page
    assert f'<dd id="job-mfu">{100 * 1.2e5 * 43.2e9 / (8 * 989e12):.2f} %</dd>' in page
    assert '<dd id="job-usd-per-million-tokens">$2.75</dd>' in page  # 137.60 USD over 5e7 tokens: 2.752
    chart = json.loads(re.search(r'<script id="job-throughput-chart-data" type="application/json">(.*?)</script>',
                                 page).group(1))
    assert chart["labels"] == [1, 50] and chart["datasets"][0]["data"] == [100000.0, 120000.0]


def test_a_job_on_emulated_gpus_says_why_it_has_no_mfu(teammate_web, teams, owner, catalog):
    cluster, pool = make_cluster("local", "local", "this-machine", catalog["H100-80GB"], backend="local")
    cluster.emulated = True
    cluster.save(update_fields=["emulated"])
    job = make_job(teams[0], owner.user, catalog["H100-80GB"], name="on-cpu")
    make_workload_metrics(make_attempt(job, cluster, pool), "config flops_per_token=1000\nstep=1 tokens_per_s=10\n")
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert '<dd id="job-mfu">n/a: the run used the CPU (emulated GPUs)' in page
