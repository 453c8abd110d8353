"""A CPU-only job (no GPUs) is shown in vCPU and GiB terms: its estimate counts vCPUs and GiB, its pool's price is
per vCPU-hour and per GiB-hour, and a cost of a few seconds reads as its amount, never as $0.00."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from runners.models import NodePool
from tests.frontend.test_views import form_data
from tests.support.factories import make_attempt, make_cost_entry, make_job_row

pytestmark = pytest.mark.django_db

# The catalog's CPU price for gcp us-central1 (costs/data/cpu_prices.csv), USD per vCPU-hour and per GiB-hour.
VCPU_PRICE, GIB_PRICE = "0.031611", "0.004237"


def cpu_job(team, user, flavor, *, cpu=1, memory_gib=1, nodes=1, **columns):
    spec = {"image": "python:3.11", "command": ["python", "prep.py"], "max_runtime_seconds": 3600,
            "resources": {"accelerator": "CPU", "gpus_per_node": 0, "nodes": nodes, "cpu": cpu,
                          "memory_gib": memory_gib}}
    return make_job_row(team, user, flavor, name="prep", gpus_per_node=0, nodes=nodes, spec=spec, **columns)


def test_the_preview_of_a_cpu_only_job_counts_vcpus_and_gib_at_their_prices(teammate_web, alpha_objects, cpu):
    page = teammate_web.post("/jobs/new/preview/", form_data(
        name="prep", accelerator="CPU", gpus_per_node="0", cpu="4", memory_gib="8", nodes="2",
        max_runtime_seconds="7200")).content.decode()
    assert "worst case: 8 vCPUs and 16 GiB × max runtime" in page, page
    assert f"${VCPU_PRICE}/vCPU-hour + ${GIB_PRICE}/GiB-hour" in page, page
    assert "GPU-hour" not in page and "0 GPUs" not in page, page


def test_a_cpu_only_job_page_shows_its_cost_below_a_cent_and_its_vcpu_price(teammate_web, alpha_objects, cpu):
    team, user = alpha_objects["job"].team, alpha_objects["job"].submitter
    job = cpu_job(team, user, cpu, estimated_cost_usd=Decimal("0.035848"))
    pool = NodePool.objects.get(accelerator=cpu)
    start = timezone.now() - dt.timedelta(seconds=10)
    attempt = make_attempt(job, pool.cluster, pool, gpus=0, started_at=start, usd_per_gpu_hour="0")
    make_cost_entry(attempt, start, dt.timedelta(seconds=4), Decimal("0.000039"), usd_per_gpu_hour="0")
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert "worst case: 1 vCPU and 1 GiB × max runtime): $0.04." in page, page  # 0.035848 to cents
    status = teammate_web.get(f"/jobs/{job.pk}/status/").content.decode()
    assert "$0.000039" in status and "$0.00<" not in status, status
    assert f"<td>${VCPU_PRICE}/vCPU-hour + ${GIB_PRICE}/GiB-hour</td>" in status, status
    assert "GPU-h" not in status, status


def test_a_gpu_job_keeps_its_price_per_gpu_hour(teammate_web, alpha_objects, aws_cluster):
    job = alpha_objects["job"]
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], usd_per_gpu_hour="6.88")
    status = teammate_web.get(f"/jobs/{job.pk}/status/").content.decode()
    assert "<td>$6.88/GPU-hour</td>" in status, status
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert f"worst case: {job.total_gpus} GPU" in page and "vCPU" not in page.split('id="job-estimate"')[1][:300]


def test_the_clusters_page_prices_a_cpu_pool_per_vcpu_and_gib(teammate_web, alpha_objects, cpu):
    page = teammate_web.get("/clusters/").content.decode()
    assert '<th scope="col">Price</th>' in page and "Price (USD/GPU-hour)" not in page
    assert f"${VCPU_PRICE}/vCPU-h + ${GIB_PRICE}/GiB-h" in page, page
    assert "$6.88/GPU-hour" in page  # the H100 pool of aws us-east-1, at the catalog's price


def test_a_cpu_only_jobs_attempts_dashboard_spend_and_pool_read_in_vcpu(teammate_web, alpha_objects, cpu):
    """No "0 GPUs" for work that holds none: the attempt row says what it holds, the dashboard's 30-day cost names
    the vCPU-hours it paid for, and the CPU pool reads as nodes × vCPU."""
    from costs.models import CostEntry

    team, user = alpha_objects["job"].team, alpha_objects["job"].submitter
    job = cpu_job(team, user, cpu, cpu=2, memory_gib=4)
    pool = NodePool.objects.get(accelerator=cpu)
    start = timezone.now() - dt.timedelta(seconds=30)
    attempt = make_attempt(job, pool.cluster, pool, gpus=0, started_at=start, usd_per_gpu_hour="0")
    entry = make_cost_entry(attempt, start, dt.timedelta(seconds=18), Decimal("0.000077"), gpus=0,
                            usd_per_gpu_hour="0")
    CostEntry.objects.filter(pk=entry.pk).update(cpu_milli=2000)  # 2 vCPU x 18 s = 0.01 vCPU-hours
    status = teammate_web.get(f"/jobs/{job.pk}/status/").content.decode()
    assert '<th scope="col">Holds</th>' in status and "<td>2 vCPUs, 4 GiB</td>" in status, status
    assert '<th scope="col">GPUs</th>' not in status
    dashboard = teammate_web.get("/").content.decode()
    assert "for 0.0100 vCPU-hours of CPU-only work" in dashboard, dashboard
    assert "0.00 GPU-hours" not in dashboard
    clusters = teammate_web.get("/clusters/").content.decode()
    row = clusters.split(f'<tr id="pool-{pool.pk}">')[1].split("</tr>")[0]
    assert "<td>4 × 16 vCPU</td><td>64 vCPU</td>" in row, row  # the fixture's 4 synced nodes of 16 cores
    assert "× 0<" not in row


def test_a_cpu_only_training_job_that_reported_nothing_has_no_training_efficiency(teammate_web, alpha_objects,
                                                                                  cpu):
    team, user = alpha_objects["job"].team, alpha_objects["job"].submitter
    job = cpu_job(team, user, cpu)
    pool = NodePool.objects.get(accelerator=cpu)
    make_attempt(job, pool.cluster, pool, gpus=0, started_at=timezone.now(), usd_per_gpu_hour="0")
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert job.kind == "training" and "Training efficiency" not in page
