"""The Nodes and Utilization pages in headless Chromium against a live server: the figures a user reads in their cells
are the API's for the same nodes and days, and the ones worked out by hand (``fleet_data``); staff cordon a healthy
node from the Nodes page, a member sees no button and is refused the action."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.utils import timezone
from playwright.sync_api import expect

from tests.support.personas import signed_in

from .conftest import shoot, sign_in
from .fleet_data import make_fleet, make_node_use, make_use

FIGURES = slice(3, 10)  # GPUs, allocated, free, vCPU, vCPU free, GiB, GiB free (after cluster, pool, accelerator)


def api_figures(node: dict) -> tuple[str, ...]:
    """A node of ``/api/v1/nodes/`` as the page should show it: GPUs, millicores as vCPU, MiB as GiB (0.1)."""
    tenth = Decimal("0.1")
    return (str(node["gpus"]), str(node["allocated_gpus"]), str(node["free_gpus"]),
            *(str((Decimal(node[k]) / 1000).quantize(tenth)) for k in ("cpu_milli", "free_cpu_milli")),
            *(str((Decimal(node[k]) / 1024).quantize(tenth)) for k in ("memory_mib", "free_memory_mib")))


def test_the_nodes_page_shows_the_apis_figures_and_staff_cordon_a_healthy_node(live_server, page, staff, owner,
                                                                              aws_cluster, cpu, teams, h100):
    fleet = make_fleet(aws_cluster, cpu, teams, owner.user, h100)
    api = {n["name"]: n for n in staff.client.get("/api/v1/nodes/", {"page_size": 100}).json()["results"]}
    sign_in(page, live_server.url, "staff")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Nodes").click()
    expect(page.get_by_role("heading", name="Nodes", exact=True)).to_be_visible()
    shoot(page, "nodes")
    for name, expected in fleet["expected"].items():
        row = page.locator(f'tr[data-node="{name}"]')
        read = tuple(row.locator("td").all_inner_texts()[FIGURES])
        free = "0 (unhealthy)" if name == "n1" else expected[2]  # a node that takes no work says why
        assert read[2] == free, name
        assert read[:2] + read[3:] == api_figures(api[name])[:2] + api_figures(api[name])[3:] == expected[:2] + expected[3:], name
        assert api_figures(api[name])[2] == expected[2], name
    expect(page.locator('tr[data-node="n1"]')).to_contain_text("XID 79 (GPU has fallen off the bus)")

    healthy = page.locator('tr[data-node="cpu-1"]')
    healthy.get_by_label("Reason for cpu-1").fill("kernel update")
    healthy.get_by_role("button", name="Cordon").click()
    expect(page.locator('tr[data-node="cpu-1"]').get_by_role("button", name="Uncordon")).to_be_visible()
    after = staff.client.get("/api/v1/nodes/", {"cluster": "gcp-usc1"}).json()["results"]
    assert {n["name"]: (n["cordoned"], n["takes_work"]) for n in after}["cpu-1"] == (True, False)

    page.get_by_role("button", name="Sign out").click()
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/nodes/")
    expect(page.locator('tr[data-node="cpu-0"]')).to_be_visible()
    expect(page.get_by_role("button", name="Cordon")).to_have_count(0)
    expect(page.get_by_role("button", name="Drain")).to_have_count(0)
    n0 = fleet["n0"].pk
    assert signed_in(owner).post(f"/nodes/{n0}/cordon/").status_code == 403
    assert owner.client.get(f"/api/v1/nodes/{n0}/").json()["cordoned"] is False


def api_cells(row: dict) -> list[str]:
    """A ``/api/v1/utilization/`` row as the page's cells should read."""
    def hours(v):
        return "n/a" if v is None else f"{v:.2f}"
    idle_cost = "n/a" if row["idle_gpu_hours"] is None else (
        "unknown" if row["idle_cost_usd"] is None else f"${row['idle_cost_usd']}")
    return [hours(row["gpu_hours"]),
            "n/a" if row["avg_gpu_util_percent"] is None else f"{row['avg_gpu_util_percent']:.1f}",
            "n/a" if row["coverage_percent"] is None else f"{row['coverage_percent']:.0f}",
            hours(row["idle_gpu_hours"]), idle_cost, hours(row["unobserved_gpu_hours"]),
            "unknown" if row["unobserved_cost_usd"] is None else f"${row['unobserved_cost_usd']}"]


def test_the_utilization_page_shows_the_apis_figures_by_job_and_team(live_server, page, owner, aws_cluster, teams,
                                                                    h100):
    used = make_use(aws_cluster, teams, owner.user, h100)
    today = timezone.now().astimezone(dt.UTC).date()
    window = {"start": f"{today - dt.timedelta(days=6)}T00:00:00Z", "end": f"{today + dt.timedelta(days=1)}T00:00:00Z"}
    # worked out by hand at $6.88 per GPU-hour: big 12 of 16 GPU-h observed (75 %), 3 idle ($20.64), 4 unobserved
    # ($27.52); small 3 GPU-h never observed ($20.64, no coverage: no samples); alpha both: 19 GPU-h, 7 unobserved
    # ($48.16), coverage that of the observed job
    expected = {str(used["big"].pk): ["16.00", "40.0", "75", "3.00", "$20.64", "4.00", "$27.52"],
                str(used["small"].pk): ["3.00", "n/a", "n/a", "n/a", "n/a", "3.00", "$20.64"],
                "alpha": ["19.00", "40.0", "75", "3.00", "$20.64", "7.00", "$48.16"]}

    sign_in(page, live_server.url, "owner")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Utilization").click()
    expect(page.get_by_role("heading", name="Utilization", exact=True)).to_be_visible()
    shoot(page, "utilization")
    for group_by in ("job", "team"):
        api = owner.client.get("/api/v1/utilization/", {"group_by": group_by, **window}).json()["results"]
        table = page.locator(f"#utilization-{group_by}")
        keys = table.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
        assert keys == [str(r[group_by]) for r in api]
        for row in api:
            read = table.locator(f'tr[data-key="{row[group_by]}"] td').all_inner_texts()
            assert read == api_cells(row) == expected[str(row[group_by])], row[group_by]
    yesterday = (today - dt.timedelta(days=1)).isoformat()
    bars = page.locator("#utilization-over-time svg g.bar title").all_text_contents()
    assert len(bars) == 7
    assert f"{yesterday}: busy GPU-hours 9.00, idle GPU-hours 3.00, unobserved GPU-hours 7.00" in bars


def test_a_nodes_utilization_cells_are_the_apis_per_node_figures(live_server, page, owner, aws_cluster, teams, h100):
    used = make_use(aws_cluster, teams, owner.user, h100)
    key = make_node_use(aws_cluster, used["big"])
    today = timezone.now().astimezone(dt.UTC).date()
    window = {"start": f"{today - dt.timedelta(days=6)}T00:00:00Z", "end": f"{today + dt.timedelta(days=1)}T00:00:00Z"}
    api = {f"{r['cluster']}/{r['node']}": r
           for r in owner.client.get("/api/v1/utilization/", {"group_by": "node", **window}).json()["results"]}
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/utilization/")
    expect(page.locator("#node-utilization-rule")).to_contain_text("never also idle")
    row = page.locator(f'#utilization-node tr[data-key="{key}"]')
    read = [row.locator(f'td[data-column="{c}"]').inner_text() for c in ("observed", "utilization", "idle")]
    mine = api[key]
    from_api = [f"{mine['observed_gpu_hours']:.2f}", f"{mine['avg_gpu_util_percent']:.1f}",
                f"{mine['idle_gpu_hours']:.2f}"]
    # by hand: big's 12 observed GPU-hours at 40 %, 3 idle, all on n-big; its 16 GPU-hours allocated there
    assert read == from_api == ["12.00", "40.0", "3.00"]
    assert mine["gpu_hours"] == 16.0
    assert row.locator("td").nth(1).inner_text() == "16.00"  # allocated, from the capacity figures
