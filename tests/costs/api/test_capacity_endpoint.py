"""``/api/v1/capacity/``: the fleet's capacity and unallocated GPU-hours over HTTP, bad queries refused with the
field and the reason, and team rows (idle shared by allocation) only of the user's own teams."""

from __future__ import annotations

import datetime as dt

import pytest

from runners.models import Cluster
from tests.costs.test_capacity import SYNC, T0, allocate, sync_fleet
from tests.support.personas import make_persona

pytestmark = pytest.mark.django_db
WINDOW = {"start": T0.isoformat(), "end": (T0 + dt.timedelta(hours=4)).isoformat()}


@pytest.fixture
def used_fleet(catalog, teams, user, h100):
    """Two 8-GPU nodes for 4 hours (64 GPU-hours); alpha ran 8 GPUs for 1 hour, beta 8 GPUs for 30 minutes."""
    cluster = Cluster.objects.create(name="aws-use1", provider="aws", region="us-east-1", backend="kubernetes")
    sync_fleet(cluster, {i: {"node-a": ("on-demand", 8, True), "node-b": ("on-demand", 8, True)} for i in range(241)})
    allocate(cluster, teams, user, h100, [(0, ["node-a"], 8, 60, 120), (1, ["node-b"], 8, 60, 90)])
    return cluster


def test_capacity_by_cluster_over_http(owner, used_fleet):
    body = owner.client.get("/api/v1/capacity/", {"group_by": "cluster", **WINDOW}).json()
    (row,) = body["results"]
    assert row["cluster"] == "aws-use1"
    assert (row["capacity_gpu_hours"], row["allocated_gpu_hours"], row["unallocated_gpu_hours"]) == (
        "64.000000", "12.000000", "52.000000")
    assert row["unallocated_cost_usd"] == "357.76"  # 52 GPU-h x 6.88 USD
    assert body["total"]["capacity_cost_usd"] == "440.32"


def test_team_rows_share_idle_by_allocation_and_show_only_the_users_teams(owner, used_fleet, teams):
    body = owner.client.get("/api/v1/capacity/", {"group_by": "team", **WINDOW}).json()
    assert [r["team"] for r in body["results"]] == ["alpha"]
    (alpha,) = body["results"]
    # shared per cluster and UTC day: 2 March 22:30-24:00 has 24 GPU-h, alpha and beta 4 each (23:30-24:00), so 16
    # idle shared 4 : 4; 3 March 00:00-02:30 has 40 GPU-h, alpha 4 (00:00-00:30), beta none, so alpha takes all 36
    assert alpha["shared_idle_gpu_hours"] == "44.000000"
    staff = make_persona("root", staff=True)
    rows = staff.client.get("/api/v1/capacity/", {"group_by": "team", **WINDOW}).json()["results"]
    assert [r["team"] for r in rows] == ["alpha", "beta"]
    assert sum(float(r["shared_idle_gpu_hours"]) for r in rows) == pytest.approx(52, abs=1e-5)
    assert sum(float(r["total_cost_usd"]) for r in rows) == pytest.approx(440.32, abs=0.011)


@pytest.mark.parametrize("params,field", [
    ({"group_by": "pod"}, "group_by"),
    ({"start": "2026-03-02T00:00:00"}, "start"),  # naive
    ({"start": WINDOW["end"], "end": WINDOW["start"]}, "end"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-06-01T00:00:00Z"}, "start"),  # over the longest window
    ({"cluster": "no-such-cluster"}, "cluster"),
])
def test_bad_queries_are_400_naming_the_field(owner, db, params, field):
    response = owner.client.get("/api/v1/capacity/", params)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


def test_a_cluster_filter_keeps_to_that_cluster(owner, used_fleet, catalog):
    other = Cluster.objects.create(name="gcp-usc1", provider="gcp", region="us-central1", backend="kubernetes")
    sync_fleet(other, {i: {"node-z": ("on-demand", 4, True)} for i in range(61)})
    rows = owner.client.get("/api/v1/capacity/", {"group_by": "node", "cluster": "gcp-usc1", **WINDOW}).json()
    assert [(r["cluster"], r["node"], r["capacity_gpu_hours"]) for r in rows["results"]] == [
        ("gcp-usc1", "node-z", "4.000000")]
    assert SYNC == dt.timedelta(seconds=60)
