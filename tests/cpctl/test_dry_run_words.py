"""The dry run speaks as the pages do: a pool's price per hour with the digits it has (``$6.88``, not
``6.880000``) in the API, cpctl and the form, one GPU in the singular, and a CPU-only job's worst case in vCPUs
and GiB, never ``0 GPUs``; a placement's timeline line names the price the same way."""

from __future__ import annotations

import yaml

from jobs.models import Job, JobEvent
from tests.support.personas import signed_in

from .test_dry_run import PREVIEW, document, written


def test_a_pool_price_reads_with_its_digits_in_the_api_the_cli_and_the_form(run_cli, owner, funded_aws_cluster,
                                                                               tmp_path):
    doc = document()
    doc["spec"]["resources"].update(nodes=1, gpus_per_node=1)
    body = owner.client.post(PREVIEW, doc, format="json").json()
    # 1 GPU at the catalog's 6.88 USD/GPU-h (aws-use1), for 900 s: 6.88 / 4 = 1.72
    assert body["placement"]["usd_per_hour"] == "6.88"
    assert body["estimated_cost_usd"] == "1.72"

    shown = run_cli("submit", str(written(tmp_path, doc)), "--dry-run", persona=owner)
    assert shown.code == 0, shown.err
    assert "$1.72 (worst case: 1 GPU x 900 s)" in shown.out, shown.out
    assert "$6.88" in shown.out and "6.880000" not in shown.out and "1 GPUs" not in shown.out, shown.out

    html = signed_in(owner).post("/jobs/new/preview/", {"team": "alpha", "spec_yaml": yaml.safe_dump(doc)})
    page = html.content.decode()
    assert "<td>$6.88</td>" in page and "6.880000" not in page, page


def test_a_cpu_only_dry_run_counts_vcpus_and_gib(run_cli, owner, funded_aws_cluster, cpu, tmp_path):
    doc = document(max_runtime_seconds=3600)
    doc["spec"]["resources"] = {"accelerator": "CPU", "gpus_per_node": 0, "nodes": 2, "cpu": 4, "memory_gib": 8}
    body = owner.client.post(PREVIEW, doc, format="json").json()
    assert (body["total_gpus"], body["total_vcpus"], body["total_memory_gib"]) == (0, 8.0, 16.0)
    # 8 vCPU x 0.031611 + 16 GiB x 0.004237 USD per hour (costs/data/cpu_prices.csv, gcp us-central1)
    assert body["placement"]["usd_per_hour"] == "0.32068"

    shown = run_cli("submit", str(written(tmp_path, doc)), "--dry-run", persona=owner)
    assert shown.code == 0, shown.err
    assert "(worst case: 8 vCPUs and 16 GiB x 3600 s)" in shown.out, shown.out
    assert "0 GPUs" not in shown.out, shown.out


def test_the_placement_line_of_the_timeline_names_the_price_with_its_digits(owner, funded_aws_cluster):
    from jobs.scheduling.passes import schedule_pending

    created = owner.client.post("/api/v1/jobs/", document(), format="json")
    assert created.status_code == 201, created.content
    schedule_pending()
    job = Job.objects.get()
    assert job.state == "ADMITTED"
    placed = JobEvent.objects.get(job=job, to_state="ADMITTED")
    assert "at $6.88/GPU-h" in placed.reason and "6.880000" not in placed.reason, placed.reason


def test_a_share_of_one_gpu_is_counted_as_that_share_wherever_its_worst_case_is_worded(run_cli, owner,
                                                                                         funded_aws_cluster, tmp_path):
    """The estimate of a quarter GPU is the quarter's price; its words say a quarter too, never ``1 GPU``."""
    from django.utils import timezone

    from runners.models import Node

    pool = funded_aws_cluster["pool"]  # a time-sliced node (8 GPUs x 4 slices) for the share to go to
    Node.objects.create(cluster=pool.cluster, node_pool=pool, name="ts", gpus=8, cpu_milli=96000, memory_mib=1 << 20,
                        seen_at=timezone.now(), gpu_sharing="time-slicing", gpu_replicas=4, whole_gpus=0,
                        slice_resource="nvidia.com/gpu")
    doc = document()
    doc["spec"]["resources"].update(nodes=1, gpus_per_node=0.25)
    body = owner.client.post(PREVIEW, doc, format="json").json()
    # 0.25 GPU at 6.88 USD/GPU-h (aws-use1) for 900 s: 6.88 x 0.25 / 4 = 0.43
    assert body["total_gpus"] == 0.25 and body["estimated_cost_usd"] == "0.43", body

    shown = run_cli("submit", str(written(tmp_path, doc)), "--dry-run", persona=owner)
    assert shown.code == 0, shown.err
    assert "$0.43 (worst case: 0.25 of 1 GPU x 900 s)" in shown.out, shown.out

    page = signed_in(owner).post("/jobs/new/preview/", {"team": "alpha", "spec_yaml": yaml.safe_dump(doc)})
    assert "worst case: 0.25 of 1 GPU × max runtime" in page.content.decode(), page.content.decode()
