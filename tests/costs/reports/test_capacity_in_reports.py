"""Capacity in reports: a platform report's capacity section and a team report's share of the idle cost are the
figures ``/api/v1/capacity/`` gives for the same window, in the report's data, HTML, CSV and ``cpctl report ID``.

Class of failure: a report of the fleet's money says nothing of what the fleet's unused capacity cost, or says it
with other figures than the API (another rounding, another window), or folds a team's share of the idle cost into
the team's own cost, or shows an unpriced cluster's idle as $0.00. Invariants: each capacity figure of a report
equals the API's for its period to the cent; a team's cost total is its own ledger, the shared idle beside it;
unknown cost reads "unknown" with its unpriced GPU-hours.

Fleet: ``aws-use1`` (priced, $6.88 per GPU-hour on demand: the seeded catalog) two 8-GPU nodes seen for 4 hours,
64 GPU-hours; ``onprem`` (no price in the catalog) one 8-GPU node seen for 2 hours, 16 GPU-hours. Alpha ran one
8-GPU job for 1 hour on aws-use1: 8 GPU-hours allocated, 56 unallocated there, 56 x 6.88 = 385.28 USD, all of it
alpha's share (the only team on that cluster); onprem's idle stays unshared.
"""

from __future__ import annotations

import datetime as dt
import html
from decimal import Decimal

import pytest

from costs.reports.build import generate_report
from cpctl.commands.reports import show_report
from runners.models import Cluster
from tests.costs.test_capacity import T0, allocate, expected, generate, sync_fleet

pytestmark = pytest.mark.django_db
START, END = T0, T0 + dt.timedelta(hours=4)
FIGURES = ("capacity_gpu_hours", "cordoned_gpu_hours", "allocated_gpu_hours", "uninventoried_allocated_gpu_hours",
           "unallocated_gpu_hours", "unallocated_cost_usd", "unpriced_unallocated_gpu_hours")


@pytest.fixture
def fleet(catalog, teams, user, h100):
    aws = Cluster.objects.create(name="aws-use1", provider="aws", region="us-east-1", backend="kubernetes")
    onprem = Cluster.objects.create(name="onprem", provider="onprem", region="lab", backend="kubernetes")
    sync_fleet(aws, {i: {"node-a": ("on-demand", 8, True), "node-b": ("on-demand", 8, True)} for i in range(241)})
    sync_fleet(onprem, {i: {"node-x": ("on-demand", 8, True)} for i in range(121)})
    allocate(aws, teams, user, h100, [(0, ["node-a"], 8, 60, 120)])
    return aws, onprem


def api(persona, group_by: str) -> dict:
    response = persona.client.get("/api/v1/capacity/", {"group_by": group_by, "start": START.isoformat(),
                                                         "end": END.isoformat()})
    assert response.status_code == 200, response.content
    return response.json()


def cpctl_report(persona, report_id: int, capsys) -> str:
    """``cpctl report ID``'s text for the API's answer to ``reports/ID/``."""
    body = persona.client.get(f"/api/v1/reports/{report_id}/")
    assert body.status_code == 200, body.content
    capsys.readouterr()
    show_report(body.json())
    return capsys.readouterr().out


def test_a_platform_report_shows_the_apis_capacity_per_cluster_and_unknown_for_the_unpriced_one(fleet, staff,
                                                                                                capsys):
    report, _ = generate_report(None, START, END)
    section = report.data["capacity"]
    answer = api(staff, "cluster")
    assert section["by_cluster"] == [{"cluster": r["cluster"], **{k: r[k] for k in FIGURES}}
                                     for r in answer["results"]]
    assert {k: section["total"][k] for k in FIGURES} == {k: answer["total"][k] for k in FIGURES}

    # the figures worked out from the fleet above
    aws, onprem = section["by_cluster"]
    assert (aws["cluster"], Decimal(aws["capacity_gpu_hours"]), Decimal(aws["unallocated_gpu_hours"]),
            aws["unallocated_cost_usd"]) == ("aws-use1", 64, 56, str(56 * Decimal("6.88")))
    assert (onprem["cluster"], Decimal(onprem["capacity_gpu_hours"]), onprem["unallocated_cost_usd"],
            Decimal(onprem["unpriced_unallocated_gpu_hours"])) == ("onprem", 16, None, 16)
    assert Decimal(section["total"]["unallocated_gpu_hours"]) == 56 + 16
    assert section["total"]["unallocated_cost_usd"] == "385.28"  # the priced part; 16 GPU-hours beside it

    csv = report.csv.splitlines()
    for line in ("capacity,aws-use1,unallocated_cost_usd,385.28", "capacity,onprem,unallocated_cost_usd,unknown",
                 "capacity,onprem,unpriced_unallocated_gpu_hours,16.000000",
                 "capacity,total,unallocated_gpu_hours,72.000000"):
        assert line in csv
    assert '<td class="unallocated-cost">unknown + 16.00 GPU-h without a price</td>' in report.html
    assert '<td class="unallocated-cost">$385.28</td>' in report.html
    assert '<td class="unallocated-cost">$385.28 + 16.00 GPU-h without a price</td>' in report.html  # the total
    assert "$0.00" not in report.html.split("<h2>Capacity</h2>")[1].split("</table>")[0]

    shown = cpctl_report(staff, report.pk, capsys)
    lines = [line.split() for line in shown.splitlines()]
    assert ["aws-use1", "64.00", "0.00", "8.00", "56.00", "$385.28"] in lines
    assert ["onprem", "16.00", "0.00", "0.00", "16.00", "unknown", "+", "16.00", "GPU-h", "unpriced"] in lines


def test_a_team_report_shows_its_share_of_the_idle_cost_beside_its_own_cost(fleet, teams, owner, capsys):
    alpha = teams[0]
    report, _ = generate_report(alpha, START, END)
    (row,) = api(owner, "team")["results"]
    shared = report.data["shared_idle"]
    assert (row["team"], shared["gpu_hours"], shared["cost_usd"], shared["unpriced_gpu_hours"]) == (
        "alpha", row["shared_idle_gpu_hours"], row["shared_idle_cost_usd"], row["unpriced_shared_idle_gpu_hours"])
    assert (Decimal(shared["gpu_hours"]), shared["cost_usd"]) == (56, "385.28")
    assert "capacity" not in report.data  # the fleet's capacity is the platform report's

    # the team's cost is its own ledger: 8 GPU-hours at 6.88, without the 385.28 shared beside it
    assert report.data["totals"]["cost_usd"] == str(8 * Decimal("6.88")) == "55.04"
    assert 'id="report-total-cost"><span class="money">$55.04</span>' in report.html
    assert "$385.28" in report.html.split('id="shared-idle"')[1].split("</p>")[0]
    assert "as OpenCost's shareIdle" in html.unescape(report.html)
    assert "shared_idle,alpha,cost_usd,385.28" in report.csv.splitlines()
    assert "total,alpha,cost_usd,55.04" in report.csv.splitlines()

    shown = cpctl_report(owner, report.pk, capsys)
    assert "shared idle  56.00 GPU-h = $385.28, shared in proportion to allocation per cluster and day" in shown
    assert "$55.04" in shown


def test_a_team_that_used_no_cluster_has_a_share_of_zero(fleet, teams):
    report, _ = generate_report(teams[1], START, END)
    assert report.data["shared_idle"]["cost_usd"] == "0.00"
    assert Decimal(report.data["shared_idle"]["gpu_hours"]) == 0


@pytest.mark.parametrize("seed", range(2))
def test_on_a_generated_fleet_every_report_figure_is_the_apis(catalog, teams, user, h100, staff, seed):
    """Nodes joining, leaving, cordoned and unseen for a while (``tests.costs.test_capacity.generate``), two teams'
    jobs, a window that cuts the run: the platform report's capacity and each team report's shared idle equal the
    API's rows and total for the window, to the cent."""
    cluster = Cluster.objects.create(name="aws-use1", provider="aws", region="us-east-1", backend="kubernetes")
    sightings = generate(seed)
    sync_fleet(cluster, sightings)
    nodes = sorted(n for n, f in expected(sightings).items() if f["type"] == "on-demand")
    allocate(cluster, teams, user, h100, [(0, nodes[:1], 2, 60, 75), (1, nodes[-1:], 1, 62, 80)])
    start, end = T0 + dt.timedelta(minutes=7, seconds=13), T0 + dt.timedelta(hours=2, minutes=1)
    section = generate_report(None, start, end)[0].data["capacity"]
    answer = staff.client.get("/api/v1/capacity/", {"group_by": "cluster", "start": start.isoformat(),
                                                     "end": end.isoformat()}).json()
    assert section["by_cluster"] == [{"cluster": r["cluster"], **{k: r[k] for k in FIGURES}}
                                     for r in answer["results"]]
    assert {k: section["total"][k] for k in FIGURES} == {k: answer["total"][k] for k in FIGURES}
    shares = {r["team"]: r for r in staff.client.get("/api/v1/capacity/", {
        "group_by": "team", "start": start.isoformat(), "end": end.isoformat()}).json()["results"]}
    for team in teams:
        shared = generate_report(team, start, end)[0].data["shared_idle"]
        row = shares[team.slug]
        assert (shared["gpu_hours"], shared["cost_usd"], shared["unpriced_gpu_hours"]) == (
            row["shared_idle_gpu_hours"], row["shared_idle_cost_usd"], row["unpriced_shared_idle_gpu_hours"])
        assert Decimal(shared["gpu_hours"]) > 0
