"""``cpctl submit --dry-run``, ``POST /api/v1/jobs/preview/`` and the web form's preview say the same of one spec:
the chosen pool, every other candidate with its price and why it was not chosen, the estimate, quota and budget;
a job its budget can never cover is refused by all three (ADR 0036), and nothing is stored."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import yaml
from django.utils.html import escape

from jobs.models import Job
from tests.support.factories import make_cluster
from tests.support.personas import signed_in

from .test_submit import EXAMPLE

PREVIEW = "/api/v1/jobs/preview/"


def document(**spec_changes) -> dict:
    """The train-gpt example (2 nodes x 1 H100, 900 s) for team alpha, with ``spec_changes``."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["team"] = "alpha"
    doc["spec"].update(spec_changes)
    return doc


def written(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def three_pools(h100):
    """Beside aws-use1 (2 x 8 H100 at 6.88 USD/GPU-h): a cheaper 2-node pool and a cheapest 1-node one."""
    make_cluster("gcp-two", "gcp", "us-central1", h100, nodes=2, gpus_per_node=8, price="2.00")
    make_cluster("gcp-one", "gcp", "us-central1", h100, nodes=1, gpus_per_node=8, price="1.25")


def test_the_cli_the_api_and_the_form_show_the_same_dry_run(run_cli, owner, funded_aws_cluster, h100, tmp_path):
    three_pools(h100)
    doc = document()
    api = owner.client.post(PREVIEW, doc, format="json")
    assert api.status_code == 200, api.content
    body = api.json()
    # 2 GPUs x 0.25 h: 2.00 USD/GPU-h on gcp-two (gcp-one has one node, the job needs two distinct ones).
    assert body["placement"]["cluster"] == "gcp-two" and body["estimated_cost_usd"] == "1.00"
    assert body["outcome"] == "admit" and body["refusal"] is None
    rows = {c["cluster"]: c for c in body["candidates"]}
    assert set(rows) == {"gcp-one", "gcp-two", "aws-use1"}
    assert rows["gcp-one"]["why_not"] == "its nodes can hold 1 of the job's 2 pods (GPUs, CPU or memory per node)"
    aws_per_hour = 2 * Decimal("6.88")
    assert Decimal(rows["aws-use1"]["usd_per_hour"]) == aws_per_hour
    assert rows["aws-use1"]["estimated_cost_usd"] == f"{aws_per_hour / 4:.2f}"
    assert "more than the chosen" in rows["aws-use1"]["why_not"]
    assert [c["chosen"] for c in body["candidates"]].count(True) == 1

    as_json = run_cli("submit", str(written(tmp_path, doc)), "--dry-run", "--json", persona=owner)
    assert as_json.code == 0, as_json.err
    assert json.loads(as_json.out) == body

    shown = run_cli("submit", str(written(tmp_path, doc)), "--dry-run", persona=owner)
    assert shown.code == 0, shown.err
    assert "gcp-two" in shown.out and "$1.00" in shown.out and "it would be admitted now" in shown.out
    for row in body["candidates"]:
        assert (row["why_not"] or "chosen") in shown.out

    page = signed_in(owner).post("/jobs/new/preview/", {"team": "alpha", "spec_yaml": yaml.safe_dump(doc)})
    html = page.content.decode()
    assert "gcp-two" in html and "$1.00" in html
    for row in body["candidates"]:
        assert escape(row["why_not"] or "chosen") in html
    assert "disabled" not in html
    assert not Job.objects.exists()
    # Submitting it answers the preview's estimate.
    submitted = owner.client.post("/api/v1/jobs/", doc, format="json")
    assert submitted.status_code == 201 and submitted.json()["estimated_cost_usd"] == body["estimated_cost_usd"]


def test_a_job_its_budget_can_never_cover_is_refused_by_all_three(run_cli, owner, funded_aws_cluster, h100,
                                                                   tmp_path):
    three_pools(h100)
    doc = document(max_runtime_seconds=300 * 3600)  # cheapest: 2 GPUs x 300 h x 2.00 = 1200 USD > the 1000 budget
    budget = funded_aws_cluster["budget"]
    body = owner.client.post(PREVIEW, doc, format="json").json()
    assert body["outcome"] == "refused"
    assert body["refusal"]["field"] == "spec.max_runtime_seconds"
    assert f"budget #{budget.pk}" in body["refusal"]["message"]
    assert "$1200.00 is over the whole budget of $1000.00" in body["refusal"]["message"]

    submitted = owner.client.post("/api/v1/jobs/", doc, format="json")
    assert submitted.status_code == 400
    assert submitted.json() == {"spec.max_runtime_seconds": [body["refusal"]["message"]]}

    dry = run_cli("submit", str(written(tmp_path, doc)), "--dry-run", persona=owner)
    assert dry.code == 2 and body["refusal"]["message"] in dry.out
    real = run_cli("submit", str(written(tmp_path, doc)), persona=owner)
    assert real.code == 2 and "spec.max_runtime_seconds" in real.err

    web = signed_in(owner)
    html = web.post("/jobs/new/preview/", {"team": "alpha", "spec_yaml": yaml.safe_dump(doc)}).content.decode()
    assert 'id="submit-button" disabled' in html and escape(body["refusal"]["message"]) in html
    form = web.post("/jobs/new/", {"team": "alpha", "spec_yaml": yaml.safe_dump(doc)})
    assert form.status_code == 200 and escape(body["refusal"]["message"]) in form.content.decode()
    assert not Job.objects.exists()


def test_a_job_that_fits_once_running_work_ends_is_previewed_as_waiting_not_refused(
        run_cli, owner, funded_aws_cluster, h100, tmp_path):
    doc = document(max_runtime_seconds=60 * 3600)  # 2 GPUs x 60 h x 6.88 = 825.60 USD, within 1000
    first = owner.client.post("/api/v1/jobs/", doc, format="json")
    assert first.status_code == 201 and first.json()["estimated_cost_usd"] == "825.60"
    from jobs.scheduling.passes import schedule_pending

    schedule_pending()  # admitted: 825.60 committed, 174.40 left until it ends
    assert Job.objects.get().state == "ADMITTED"
    body = owner.client.post(PREVIEW, {**doc, "name": "second"}, format="json").json()
    assert body["outcome"] == "wait" and body["refusal"] is None and body["budget"]["ok"] is False
    assert owner.client.post("/api/v1/jobs/", {**doc, "name": "second"}, format="json").status_code == 201


def test_a_cpu_only_job_short_of_memory_is_told_which_resource_and_by_how_much(run_cli, owner, cpu, tmp_path):
    """The dry run names the short resource with numbers, as the waiting job's page would: here memory (each of
    the CPU pool's 4 nodes of 64 GiB has 60 GiB taken by pods not ours, 4 GiB free; the job needs 8 GiB)."""
    from runners.models import Node

    Node.objects.filter(node_pool__accelerator=cpu).update(foreign_memory_mib=60 * 1024)
    doc = document()
    doc["spec"]["resources"] = {"gpus_per_node": 0, "nodes": 1, "cpu": 2, "memory_gib": 8}
    doc["spec"]["placement"], doc["spec"]["preemptible"] = {}, False
    body = owner.client.post(PREVIEW, doc, format="json").json()
    assert body["fits_now"] is False and body["outcome"] == "wait", body
    assert body["capacity"]["short_of"] == "memory", body["capacity"]
    message = body["capacity"]["message"]
    assert "1 node with 2 vCPU and 8 GiB free" in message and "only 4 GiB memory free at most" in message, message

    shown = run_cli("submit", str(written(tmp_path, doc)), "--dry-run", persona=owner)
    assert shown.code == 0, shown.err
    assert "it would wait for free memory (GiB)" in shown.out and "8 GiB" in shown.out, shown.out
    assert "wait for capacity" not in shown.out

    html = signed_in(owner).post("/jobs/new/preview/", {"team": "alpha", "spec_yaml": yaml.safe_dump(doc)})
    page = html.content.decode()
    assert "the job would wait for free memory (GiB)" in page and escape(message) in page, page
    assert not Job.objects.exists()
