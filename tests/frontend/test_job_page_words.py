"""A job page in words a person reads: the estimate of a job no pool can hold while a node is cordoned, no raw
boolean, None or internal key in any state, the jobs admitted ahead of a waiting one, and GPU utilization shown
whenever it was collected (else the true reason). Expected figures are worked out from the fixtures' numbers.
"""

from __future__ import annotations

import html
import re
from decimal import Decimal

import pytest
from django.utils import timezone

from costs.models import UtilizationRollup
from jobs.models import Job, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from quotas.models import Quota
from runners.models import Cluster, Node
from tests.support.factories import make_attempt, make_cluster, make_job_row

pytestmark = pytest.mark.django_db

CATALOG_H100_AWS_USE1 = Decimal("6.88")  # USD/GPU-hour: the catalog's on-demand H100 price in us-east-1


def nodes(pool, count, *, foreign_gpus=(), cordoned=(), cpu_cores=32, memory_gib=256):
    """``count`` synced 8-GPU nodes of ``pool``; ``foreign_gpus[i]`` GPUs of node i held by others; indexes in
    ``cordoned`` cordoned by staff."""
    return [Node.objects.create(cluster=pool.cluster, node_pool=pool, name=f"{pool.name}-{i}", gpus=8,
                                cpu_milli=cpu_cores * 1000, memory_mib=memory_gib * 1024, seen_at=timezone.now(),
                                foreign_gpus=foreign_gpus[i] if i < len(foreign_gpus) else 0,
                                cordoned=i in cordoned)
            for i in range(count)]


def visible_text(page: str) -> str:
    """What a person reads of a page: the text outside tags, scripts, styles and the spec's YAML (which shows the
    submitted spec as written)."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    page = re.sub(r'<pre class="code">.*?</pre>', " ", page, flags=re.S)
    page = re.sub(r"<[^>]+>", " ", page)
    return html.unescape(page)


RAW = re.compile(r"\b(True|False|None)\b|\b[a-z]+(?:_[a-z0-9]+)+\b")
#: Names a person types, not internal keys: the throughput key a workload reports (docs: training efficiency).
PUBLIC_NAMES = {"tokens_per_s"}


def test_a_cordoned_node_leaves_the_estimate_at_the_pools_price_and_says_why(teammate, teammate_web, aws_cluster, alpha, h100):
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=16)
    nodes(aws_cluster["pool"], 2, cordoned=(1,))
    job = make_job_row(alpha, teammate.user, h100, gpus_per_node=8, nodes=2, max_runtime=3600)
    schedule_pending()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.queue_info["short_of"] == "cordon"
    page = visible_text(teammate_web.get(f"/jobs/{job.pk}/").content.decode())
    usd = (16 * CATALOG_H100_AWS_USE1).quantize(Decimal("0.01"))  # 16 GPUs x 1 h
    assert "unknown" not in page.split("Log tail")[0]
    assert f"${usd} at aws-use1's $6.88/GPU-hour, where it would run once the fleet allows: no node pool can hold " \
           f"it as the fleet is now; it waits for cordoned nodes back in service" in " ".join(page.split())


def test_an_accelerator_without_any_priced_pool_is_still_unknown(teammate, teammate_web, alpha, h100):
    cluster, pool = make_cluster("dc1", "onprem", "dc1", h100, nodes=2)  # no catalog price on premises
    nodes(pool, 2)
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=16)
    job = make_job_row(alpha, teammate.user, h100, gpus_per_node=8)
    page = " ".join(visible_text(teammate_web.get(f"/jobs/{job.pk}/").content.decode()).split())
    assert "Estimated cost: unknown (no node pool with a price offers H100-80GB)." in page


@pytest.fixture
def jobs_in_every_state(teammate, teammate_web, aws_cluster, alpha, h100):
    """Team alpha's jobs, decided by a real pass on 2 nodes (node 0 half taken by others, node 1 cordoned): one
    never placeable (2 whole nodes), one waiting for free GPUs (8 on one node), one over quota, one behind a
    StrictFIFO head, one admitted; and running, finished and rejected ones."""
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=16)
    nodes(aws_cluster["pool"], 2, foreign_gpus=(4,), cordoned=(1,))
    user = teammate.user
    made = {"never": make_job_row(alpha, user, h100, name="never", gpus_per_node=8, nodes=2),
            "gpus": make_job_row(alpha, user, h100, name="gpus", gpus_per_node=8),
            "small": make_job_row(alpha, user, h100, name="small", gpus_per_node=2),
            "quota": make_job_row(alpha, user, h100, name="quota", gpus_per_node=8, nodes=2)}
    schedule_pending()
    cluster = aws_cluster["cluster"]
    running = make_job_row(alpha, user, h100, name="running", state=JobState.ADMITTED)
    make_attempt(running, cluster, aws_cluster["pool"])
    done = make_job_row(alpha, user, h100, name="done", state=JobState.ADMITTED)
    make_attempt(done, cluster, aws_cluster["pool"], ended_at=timezone.now(), state=JobState.SUCCEEDED)
    made.update(running=running, done=done,
                rejected=make_job_row(alpha, user, h100, name="rejected", state=JobState.REJECTED,
                                      state_reason="over the whole budget"))
    return {k: Job.objects.get(pk=j.pk) for k, j in made.items()}


def test_no_job_page_shows_a_raw_boolean_none_or_internal_key(teammate_web, jobs_in_every_state):
    jobs = jobs_in_every_state
    assert jobs["never"].queue_info["never_placeable"] is True  # the facts the page must put in words
    assert jobs["gpus"].queue_info["reason"] == "capacity" and jobs["quota"].queue_info["reason"] == "quota"
    for name, job in jobs.items():
        for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/status/"):
            text = visible_text(teammate_web.get(url).content.decode())
            raw = sorted({m.group(0) for m in RAW.finditer(text)} - PUBLIC_NAMES)
            assert raw == [], f"{name} {url}: {raw}"


def test_a_never_placeable_job_is_told_so_in_a_sentence(teammate_web, jobs_in_every_state):
    job = jobs_in_every_state["never"]
    text = " ".join(visible_text(teammate_web.get(f"/jobs/{job.pk}/").content.decode()).split())
    assert "No node pool can hold it as the fleet is now: it waits for the fleet to change" in text
    assert "It waits for cordoned nodes back in service" in text
    assert "Never placeable" not in text and "Fleet change" not in text


def test_a_job_admitted_ahead_is_named_on_the_page_the_api_and_the_timeline(teammate, teammate_web, aws_cluster, alpha, h100):
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=16)
    nodes(aws_cluster["pool"], 2, foreign_gpus=(4, 4))  # 4 GPUs free on each node: no whole node
    head = make_job_row(alpha, teammate.user, h100, name="head", gpus_per_node=8, nodes=2)
    small = make_job_row(alpha, teammate.user, h100, name="small", gpus_per_node=1)
    result = schedule_pending()
    assert result.admitted == [small.pk]
    head.refresh_from_db()
    want = (f"Job {small.pk} (1 GPU) was admitted ahead because it fits now; this job needs 2 nodes with 8 GPUs "
            f"free.")
    assert head.queue_info["overtaken"] == want
    assert head.queue_info["overtaken_by"] == [{"job_id": small.pk, "team_id": alpha.pk, "gpus": 1, "vcpu": 0}]
    body = teammate_web.get(f"/api/v1/jobs/{head.pk}/").json()
    assert body["queue_info"]["overtaken"] == want
    assert JobEvent.objects.filter(job=head, kind="waiting", reason=want).count() == 1
    page = " ".join(visible_text(teammate_web.get(f"/jobs/{head.pk}/").content.decode()).split())
    assert want in page
    schedule_pending()  # a pass that admits nothing keeps what happened, with no second event
    head.refresh_from_db()
    assert head.queue_info["overtaken"] == want
    assert JobEvent.objects.filter(job=head, kind="waiting", reason=want).count() == 1


def emulated_attempt(job, h100, prometheus_url=""):
    cluster, pool = make_cluster("emu", "local", "local", h100, nodes=1, gpus_per_node=4, price="0.50")
    Cluster.objects.filter(pk=cluster.pk).update(emulated=True, prometheus_url=prometheus_url)
    cluster.refresh_from_db()
    return make_attempt(job, cluster, pool, ended_at=timezone.now(), state=JobState.SUCCEEDED)


def test_emulated_gpus_without_prometheus_name_the_missing_prometheus(teammate_web, alpha_objects, h100, settings):
    settings.COSTS_PROMETHEUS_URL = ""
    job = alpha_objects["job"]
    emulated_attempt(job, h100)
    text = " ".join(visible_text(teammate_web.get(f"/jobs/{job.pk}/").content.decode()).split())
    assert "Not observed: no Prometheus is configured for cluster emu, so no GPU samples are read." in text
    assert "emulated GPUs (processes" not in text


def test_emulated_gpus_with_prometheus_but_no_samples_say_emulated(teammate_web, alpha_objects, h100, settings):
    job = alpha_objects["job"]
    emulated_attempt(job, h100, prometheus_url="http://prometheus.example:9090")
    text = " ".join(visible_text(teammate_web.get(f"/jobs/{job.pk}/").content.decode()).split())
    assert "Not observed: the job ran on emulated GPUs (processes on the CPU)" in text


def test_utilization_collected_on_emulated_gpus_is_shown(teammate_web, alpha_objects, h100):
    job = alpha_objects["job"]
    attempt = emulated_attempt(job, h100, prometheus_url="http://prometheus.example:9090")
    # 4 GPUs x 1 h, every sample seen, 20.7 % on average
    UtilizationRollup.objects.create(
        attempt=attempt, job=job, team=job.team, cluster=attempt.cluster, accelerator=h100,
        day=attempt.started_at.date(), gpu_seconds=4 * 3600, samples=960, expected_samples=960,
        util_sum=960 * 20.7, avg_gpu_util_percent=20.7, observed_gpu_seconds=4 * 3600, util_metric="DCGM_FI_DEV_GPU_UTIL")
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    text = " ".join(visible_text(page).split())
    assert 'id="job-util-empty"' not in page and "Not observed" not in text
    assert re.search(r"<td>#1</td>.*?<td>20\.7 %</td>", page, flags=re.S)


def test_a_job_that_has_not_started_is_not_collected_yet(teammate_web, alpha_objects):
    job = alpha_objects["job"]
    text = " ".join(visible_text(teammate_web.get(f"/jobs/{job.pk}/").content.decode()).split())
    assert "Not collected yet: the job has not started running." in text


def test_a_cpu_only_job_that_ran_says_nothing_about_gpu_utilization(teammate, teammate_web, alpha):
    from runners.models import cpu_flavor

    cluster, pool = make_cluster("gcp-cpu", "gcp", "us-central1", cpu_flavor(), nodes=2, gpus_per_node=0)
    job = make_job_row(alpha, teammate.user, cpu_flavor(), name="prep", gpus_per_node=0)
    make_attempt(job, cluster, pool, ended_at=timezone.now(), state=JobState.SUCCEEDED)
    page = teammate_web.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="util-h"' not in page and "emulated" not in page and 'id="job-util-empty"' not in page


def test_the_preview_of_a_job_a_cordon_keeps_out_says_so_and_gives_the_estimate(teammate_web, alpha_objects,
                                                                                 aws_cluster):
    nodes(aws_cluster["pool"], 2, cordoned=(0,))
    form = {"team": "alpha", "name": "gang", "kind": "training", "image": "python:3.11",
            "command": "python -c 'print(1)'", "accelerator": "H100-80GB", "gpus_per_node": "8", "nodes": "2",
            "max_runtime_seconds": "7200", "priority": "normal"}
    page = " ".join(visible_text(teammate_web.post("/jobs/new/preview/", form).content.decode()).split())
    usd = (16 * 2 * CATALOG_H100_AWS_USE1).quantize(Decimal("0.01"))  # 16 GPUs x 2 h
    assert ("No node pool can hold it as the fleet is now; it waits for cordoned nodes back in service." in page)
    assert f"${usd}" in page and "No healthy cluster matches" not in page


def test_a_queued_jobs_page_and_api_answer_give_one_estimate_over_its_alternatives(teammate, teammate_web, alpha,
                                                                                     h100):
    """A job asking for H100-80GB or else A100-80GB, where only an A100 pool (3.00 USD/GPU-hour) exists: the
    preview places it on the alternative, and the job's page, its API answer and what submitting it answered give
    that one estimate: 2 GPUs x 1 h x 3.00 = $6.00."""
    from runners.models import Accelerator

    a100 = Accelerator.objects.get(name="A100-80GB")
    _, pool = make_cluster("gcp-usc1", "gcp", "us-central1", a100, nodes=1, price="3.00")
    nodes(pool, 1)
    for accelerator in (h100, a100):
        Quota.objects.create(team=alpha, accelerator=accelerator, nominal_gpus=8)
    submission = {"team": "alpha", "name": "either", "kind": "training",
                  "spec": {"image": "python:3.11", "command": ["python", "train.py"], "max_runtime_seconds": 3600,
                           "resources": {"accelerator": "H100-80GB", "gpus_per_node": 2, "nodes": 1,
                                         "alternatives": ["A100-80GB"]}}}
    r = teammate.client.post("/api/v1/jobs/", submission, format="json")
    assert r.status_code == 201, r.content
    job = r.json()["id"]
    expected = "6.00"
    assert r.json()["estimated_cost_usd"] == expected
    assert teammate.client.get(f"/api/v1/jobs/{job}/").json()["estimated_cost_usd"] == expected
    page = " ".join(visible_text(teammate_web.get(f"/jobs/{job}/").content.decode()).split())
    assert f"× max runtime): ${expected} at gcp-usc1's" in page, page[:1500]
