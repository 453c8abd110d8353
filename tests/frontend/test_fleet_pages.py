"""The Nodes, Utilization and Clusters pages read without a browser: filters, empty states, bad input refused next to
the field, GPU and CPU nodes counted apart with each pool's vCPU and memory, and who may act on a node."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
import time_machine

from jobs.models import JobAttempt
from runners.models import Cluster, Node
from tests.costs.test_capacity import allocate, sync_fleet
from tests.support.factories import make_attempt, make_job
from tests.support.personas import signed_in

from .fleet_data import make_fleet, make_use

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(aws_cluster, cpu, teams, user, h100):
    return make_fleet(aws_cluster, cpu, teams, user, h100)


def shown_nodes(html: str) -> list[str]:
    return re.findall(r'data-node="([^"]+)"', html)


def test_the_nodes_page_lists_every_node_and_filters_by_cluster_and_health(owner, fleet):
    web = signed_in(owner)
    assert shown_nodes(web.get("/nodes/").content.decode()) == ["n0", "n1", "cpu-0", "cpu-1", "cpu-2", "cpu-3"]
    assert shown_nodes(web.get("/nodes/", {"cluster": "aws-use1"}).content.decode()) == ["n0", "n1"]
    page = web.get("/nodes/", {"health": "unhealthy"}).content.decode()
    assert shown_nodes(page) == ["n1"] and "XID 79 (GPU has fallen off the bus)" in page
    assert shown_nodes(web.get("/nodes/", {"cluster": "gcp-usc1", "health": "healthy"}).content.decode()) == [
        "cpu-0", "cpu-1", "cpu-2", "cpu-3"]
    Node.objects.filter(name="cpu-2").update(cordoned=True, cordon_note="by staff: disk")
    assert shown_nodes(web.get("/nodes/", {"health": "cordoned"}).content.decode()) == ["cpu-2"]


def test_a_filter_matching_nothing_says_so_and_a_bad_one_is_refused_next_to_the_field(owner, fleet):
    web = signed_in(owner)
    page = web.get("/nodes/", {"cluster": "aws-use1", "health": "suspect"})
    assert page.status_code == 200 and "No node matches these filters." in page.content.decode()
    bad = web.get("/nodes/", {"cluster": "no-such-cluster"})
    assert bad.status_code == 400
    assert "Select a valid choice. no-such-cluster is not one of the available choices." in bad.content.decode()
    assert shown_nodes(bad.content.decode()) == []


def test_without_any_node_the_page_says_none_was_synced(owner, db):
    page = signed_in(owner).get("/nodes/").content.decode()
    assert "No node has been synced yet" in page


def test_only_staff_get_the_node_buttons_and_drain_moves_the_work_off(owner, staff, fleet):
    n0 = fleet["n0"]
    member_page = signed_in(owner).get("/nodes/").content.decode()
    assert "Cordon</button>" not in member_page and "Drain</button>" not in member_page
    assert signed_in(owner).post(f"/nodes/{n0.pk}/drain/").status_code == 403
    web = signed_in(staff)
    assert "Cordon</button>" in web.get("/nodes/").content.decode()
    answer = web.post(f"/nodes/{n0.pk}/drain/", {"next": "/nodes/?cluster=aws-use1", "reason": "reseat GPU 3"})
    assert (answer.status_code, answer["Location"]) == (302, "/nodes/?cluster=aws-use1")
    n0.refresh_from_db()
    assert n0.cordoned and n0.cordon_note == "by staff: reseat GPU 3"
    moved = JobAttempt.objects.get(job__name="on-n0")
    assert (moved.ended_at is not None, moved.end_reason, moved.job.state) == (True, "Preempted", "RECOVERING")
    assert web.post(f"/nodes/{n0.pk}/uncordon/", {"next": "https://elsewhere.example/"})["Location"] == "/clusters/"


def test_the_clusters_page_counts_gpu_and_cpu_nodes_apart_with_each_pools_cpu_and_memory(owner, fleet):
    page = signed_in(owner).get("/clusters/").content.decode()
    assert "2 GPU nodes; 1 needs attention:" in page
    assert "0 GPU nodes and 4 CPU nodes; all healthy and taking work." in page
    pool = fleet["cpu_pool"]
    row = re.search(rf'<tr id="pool-{pool.pk}">(.*?)</tr>', page, re.S).group(1)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    # 4 x 16 vCPU, 6 held; 4 x 64 GiB, 10 held
    assert cells[6:10] == ["64.0", "58.0", "256.0", "246.0"]


@pytest.fixture
def used(aws_cluster, teams, user, h100):
    return make_use(aws_cluster, teams, user, h100)


def test_the_window_selects_whole_utc_days(owner, used):
    web = signed_in(owner)
    week = web.get("/utilization/").content.decode()  # the default: the last 7 UTC days
    assert f'data-key="{used["big"].pk}"' in week and f'data-key="{used["old"].pk}"' not in week
    assert "<strong>19.00</strong> GPU-hours billed" in week  # 16 + 3
    month = web.get("/utilization/", {"window": "30d"}).content.decode()
    assert f'data-key="{used["old"].pk}"' in month and "<strong>21.00</strong> GPU-hours billed" in month
    today = web.get("/utilization/", {"window": "1d"}).content.decode()
    assert "No GPU-hours were billed to your teams in this window." in today


def test_a_bad_window_or_sort_is_refused_next_to_the_field(owner, db):
    bad = signed_in(owner).get("/utilization/", {"window": "2w", "sort": "name"})
    text = bad.content.decode()
    assert bad.status_code == 400
    assert "Select a valid choice. 2w is not one of the available choices." in text
    assert "Select a valid choice. name is not one of the available choices." in text


def test_another_teams_use_is_not_shown(outsider, used):
    page = signed_in(outsider).get("/utilization/").content.decode()
    assert "No GPU-hours were billed to your teams in this window." in page and "big" not in page


def job_keys(page: str) -> list[int]:
    jobs = re.search(r'<table id="utilization-job">(.*?)</table>', page, re.S).group(1)
    return [int(k) for k in re.findall(r'data-key="(\d+)"', jobs)]


def test_sorting_by_a_figure_puts_the_largest_first(owner, used):
    web = signed_in(owner)
    small, big = used["small"].pk, used["big"].pk
    assert job_keys(web.get("/utilization/").content.decode()) == [small, big]  # by job id
    # small: 3 unobserved GPU-hours, big: 16 - 12 = 4
    assert job_keys(web.get("/utilization/", {"sort": "unobserved_gpu_hours"}).content.decode()) == [big, small]


@pytest.fixture
def inventoried(catalog, teams, user, h100):
    """The capacity page's fleet (``tests/frontend/test_capacity_page.py``): aws-use1's node-a and node-b, 8 GPUs
    each, seen 4 hours from 2026-03-02 22:30 UTC, 8 GPUs held 1 h on node-a and 30 min on node-b at $6.88; lab's
    node-z, 4 GPUs for 1 h, unpriced."""
    aws = Cluster.objects.create(name="aws-use1", provider="aws", region="us-east-1", backend="kubernetes")
    sync_fleet(aws, {i: {"node-a": ("on-demand", 8, True), "node-b": ("on-demand", 8, True)} for i in range(241)})
    allocate(aws, teams, user, h100, [(0, ["node-a"], 8, 60, 120), (0, ["node-b"], 8, 60, 90)])
    lab = Cluster.objects.create(name="lab", provider="onprem", region="lab", backend="kubernetes")
    sync_fleet(lab, {i: {"node-z": ("on-demand", 4, True)} for i in range(61)})


def cells(html: str, table: str) -> dict[str, list[str]]:
    """``{row key: its cells' text}`` of the table ``table`` of a page."""
    body = re.search(rf'<table id="{table}">(.*?)</table>', html, re.S).group(1)
    return {key: [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for key, row in re.findall(r'<tr data-key="([^"]+)">(.*?)</tr>', body, re.S)}


def test_the_nodes_allocation_is_the_capacity_apis_for_the_same_days(owner, inventoried):
    with time_machine.travel(dt.datetime(2026, 3, 4, 12, tzinfo=dt.UTC), tick=False):
        page = signed_in(owner).get("/utilization/").content.decode()  # the last 7 UTC days: 02-26 to 03-04
        api = owner.client.get("/api/v1/capacity/", {"group_by": "node", "start": "2026-02-26T00:00:00Z",
                                                     "end": "2026-03-05T00:00:00Z"}).json()["results"]
    # 8 GPUs x 4 h each; node-a held 8 x 1 h, node-b 8 x 0.5 h; the rest at $6.88; node-z 4 x 1 h, no price
    expected = {"aws-use1/node-a": ["32.00", "8.00", "24.00", "0.00", "$165.12"],
                "aws-use1/node-b": ["32.00", "4.00", "28.00", "0.00", "$192.64"],
                "lab/node-z": ["4.00", "0.00", "4.00", "0.00", "unknown"]}
    from_api = {f"{r['cluster']}/{r['node']}": [
        *(f"{Decimal(r[k]):.2f}" for k in ("capacity_gpu_hours", "allocated_gpu_hours", "unallocated_gpu_hours",
                                           "cordoned_gpu_hours")),
        "unknown" if r["unallocated_cost_usd"] is None else f"${r['unallocated_cost_usd']}"] for r in api}
    # No DCGM sample on any node: nothing observed, no average, no idle (n/a) beside the allocation.
    shown = {key: [*c[:2], *c[5:]] for key, c in cells(page, "utilization-node").items()}
    assert shown == from_api == expected
    assert {key: c[2:5] for key, c in cells(page, "utilization-node").items()} == dict.fromkeys(
        expected, ["0.00", "n/a", "n/a"])


def test_a_cordoned_nodes_gpus_are_not_free_on_the_nodes_page_nor_in_the_api(owner, staff, aws_cluster, teams, h100):
    node = Node.objects.create(cluster=aws_cluster["cluster"], node_pool=aws_cluster["pool"], name="n0", gpus=8,
                               cpu_milli=64_000, memory_mib=512 * 1024, seen_at=aws_cluster["cluster"].created_at)
    held = 5
    job = make_job(teams[0], owner.user, h100, name="on-n0", gpus_per_node=held)
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], gpus=held)
    JobAttempt.objects.filter(pk=attempt.pk).update(placement={"nodes": ["n0"], "gpus_per_node": held})
    web = signed_in(owner)
    assert f"8 GPUs, {held} allocated and {8 - held} free;" in web.get("/nodes/").content.decode()
    assert signed_in(staff).post(f"/nodes/{node.pk}/cordon/", {"reason": "reseat"}).status_code == 302
    page = web.get("/nodes/").content.decode()
    assert f"8 GPUs, {held} allocated and 0 free ({8 - held} more unallocated on nodes that take no work now);" in page
    row = re.search(rf'<tr id="node-{node.pk}"(.*?)</tr>', page, re.S).group(1)
    assert '<td class="num">0 <span class="hint">(cordoned)</span></td>' in row
    body = owner.client.get(f"/api/v1/nodes/{node.pk}/").json()
    figures = ("allocated_gpus", "free_gpus", "free_cpu_milli", "free_memory_mib", "takes_work")
    assert tuple(body[k] for k in figures) == (held, 0, 0, 0, False)
