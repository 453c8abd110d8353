"""Money and use: ``budgets`` (current periods), ``costs`` (the ledger, grouped), ``utilization`` (GPU
utilization from the Prometheus rollups, grouped) and ``capacity`` (the fleet's capacity and unallocated GPU-hours
and their cost)."""

from __future__ import annotations

import datetime as dt

import click

from cpctl.errors import EXIT_OK
from cpctl.options import Api, api_command
from cpctl.output import err, gpu_hours, money, out, percent, rounding_gap, table, usd, when

GROUP_BY_CHOICES = ("team", "cluster", "accelerator", "job", "day")


@api_command("budgets", "budgets' current period: spent, committed, remaining, forecast")
@click.option("--team", help="team slug")
def budgets(api: Api, team: str | None) -> int:
    """Each budget's current period (``budget-status/``): amount, spent, committed, remaining, forecast (USD)."""
    statuses = api.client.get("budget-status/")
    if team:
        statuses = [s for s in statuses if s.get("team") == team]
    if api.shown_as_json(statuses):
        return EXIT_OK
    if not statuses:
        err("no budgets in force")
        return EXIT_OK
    rows = [[s["team"], s["period"], when(s.get("period_end"))[:10], usd(s["amount_usd"]), money(s, "spent_usd"),
             usd(s["committed_usd"]), usd(s["remaining_usd"]), usd(s["forecast_usd"]), s["action"]]
            for s in statuses]
    table(["TEAM", "PERIOD", "ENDS", "AMOUNT", "SPENT", "COMMITTED", "REMAINING", "FORECAST", "AT 100%"], rows,
          right=("AMOUNT", "SPENT", "COMMITTED", "REMAINING", "FORECAST"))
    return EXIT_OK


def as_api_time(value: str | None) -> str | None:
    """A ``--start``/``--end`` value for the API: a bare date ``YYYY-MM-DD`` means its midnight UTC; anything
    else is sent as given (the API wants ISO 8601 with an offset and says so otherwise)."""
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value).isoformat() + "T00:00:00Z" if len(value) == 10 else value
    except ValueError:
        return value


def window_options(fn):
    """``--group-by``, ``--start``, ``--end`` and ``--team``, the query of ``costs`` and ``utilization``."""
    for option in reversed((
            click.option("--group-by", type=click.Choice(GROUP_BY_CHOICES), default="team", help="default team"),
            click.option("--start", help="ISO 8601 datetime with offset, or a date (midnight UTC); inclusive"),
            click.option("--end", help="ISO 8601 datetime with offset, or a date (midnight UTC); exclusive"),
            click.option("--team", help="team slug"))):
        fn = option(fn)
    return fn


def window_query(group_by: str, start: str | None, end: str | None, team: str | None) -> dict:
    """The ``group_by``/``start``/``end``/``team`` query of ``costs/`` and ``utilization/``."""
    params = {"group_by": group_by}
    for name, value in (("start", as_api_time(start)), ("end", as_api_time(end))):
        if value is not None:
            params[name] = value
    if team:
        params["team"] = team
    return params


def window(report: dict) -> str:
    """``<start> to <end>`` of a costs or utilization answer (open ends in words)."""
    return (f"{when(report.get('start')) if report.get('start') else 'the beginning'} to "
            f"{when(report.get('end')) if report.get('end') else 'now'}")


def grouped_table(report: dict, group_by: str, headers: list[str], cells, right: tuple[str, ...]) -> None:
    """Print the rows of a grouped answer (keys, then ``cells(row)``) and a TOTAL row of ``cells(total)``."""
    keys = ["job", "job_name"] if group_by == "job" else [group_by]
    rows = [[row.get(k) for k in keys] + cells(row) for row in report["results"]]
    rows.append(["TOTAL"] + [""] * (len(keys) - 1) + cells(report.get("total") or {}))
    table([k.replace("_", " ").upper() for k in keys] + headers, rows, right=("JOB",) + right)


def energy_cells(row: dict) -> list[str]:
    """A costs row's energy: kWh (``n/a``: not measured, never 0) and its cost (``n/a`` when not measured,
    ``unknown`` when no electricity price is known, ``$x + unknown`` when only part of it is priced)."""
    kwh = row.get("energy_kwh")
    if kwh is None:
        return ["n/a", "n/a"]
    cost, unpriced = row.get("energy_cost_usd"), row.get("energy_unpriced_kwh") or 0
    shown = "unknown" if cost is None else usd(cost) + (" + unknown" if unpriced else "")
    return [f"{float(kwh):,.2f}", shown]


@api_command("costs", "cost from the ledger, grouped, with the GPUs' energy")
@window_options
def costs(api: Api, group_by: str, start: str | None, end: str | None, team: str | None) -> int:
    """GPU-hours and USD from the cost ledger, grouped by team, cluster, accelerator, job or UTC day, and beside them
    the GPUs' energy in kWh and its cost at the cluster's electricity price (a separate line, not in COST)."""
    report = api.client.get("costs/", window_query(group_by, start, end, team))
    if api.shown_as_json(report):
        return EXIT_OK
    out(f"costs by {report['group_by']}, {window(report)} (UTC); energy n/a: not measured")
    figures = ("GPU-HOURS", "COST", "ENERGY KWH", "ENERGY COST")
    grouped_table(report, group_by, list(figures),
                  lambda row: [gpu_hours(row.get("gpu_hours")), money(row), *energy_cells(row)],
                  right=figures)
    difference = (report.get("total") or {}).get("rounding_difference_usd")
    if difference not in (None, "0.00"):  # each row and the total rounded once (docs/design.md, Cost ledger)
        out(f"each row and the TOTAL are their exact sums rounded to cents: the rows {rounding_gap(difference)}")
    return EXIT_OK


def utilization_cells(row: dict) -> list:
    """A utilization row's figures: GPU-hours, average %, coverage % (observed of allocated time), idle GPU-hours,
    idle % (of the observed time), their USD."""
    return [gpu_hours(row.get("gpu_hours")), percent(row.get("avg_gpu_util_percent")),
            percent(row.get("coverage_percent"), 0), gpu_hours(row.get("idle_gpu_hours")),
            percent(row.get("idle_percent")),
            "-" if row.get("idle_gpu_hours") is None else money(row, "idle_cost_usd", "idle_")]


@api_command("utilization", "GPU utilization from Prometheus: average, coverage, idle GPU-hours")
@window_options
def utilization(api: Api, group_by: str, start: str | None, end: str | None, team: str | None) -> int:
    """GPU utilization from the Prometheus rollups: average, coverage, idle GPU-hours and their USD, grouped."""
    report = api.client.get("utilization/", window_query(group_by, start, end, team))
    if api.shown_as_json(report):
        return EXIT_OK
    out(f"GPU utilization by {report['group_by']}, {window(report)} (UTC); n/a: no GPU samples")
    figures = ("GPU-HOURS", "AVG UTIL", "COVERAGE", "IDLE GPU-H", "IDLE %", "IDLE COST")
    grouped_table(report, group_by, list(figures), utilization_cells, right=figures)
    return EXIT_OK


CAPACITY_GROUPS = ("cluster", "node_pool", "node", "accelerator", "day", "team")


def capacity_cells(row: dict) -> list:
    """A capacity row's figures: capacity, cordoned, allocated, unallocated GPU-hours, unallocated USD and the
    unallocated GPU-hours without a price (a USD figure shown ``-`` has no price at all)."""
    return [gpu_hours(row.get("capacity_gpu_hours")), gpu_hours(row.get("cordoned_gpu_hours")),
            gpu_hours(row.get("allocated_gpu_hours")), gpu_hours(row.get("unallocated_gpu_hours")),
            usd(row.get("unallocated_cost_usd")), gpu_hours(row.get("unpriced_unallocated_gpu_hours"))]


def team_share_cells(row: dict) -> list:
    """A team row of ``capacity --group-by team``: allocated GPU-hours and USD, shared idle GPU-hours and USD,
    their sum."""
    return [gpu_hours(row.get("allocated_gpu_hours")), usd(row.get("allocated_cost_usd")),
            gpu_hours(row.get("shared_idle_gpu_hours")), usd(row.get("shared_idle_cost_usd")),
            usd(row.get("total_cost_usd"))]


@api_command("capacity", "capacity, allocated and unallocated GPU-hours of the fleet and their cost")
@click.option("--group-by", type=click.Choice(CAPACITY_GROUPS), default="cluster", help="default cluster")
@click.option("--start", help="ISO 8601 datetime with offset, or a date (midnight UTC); default 7 days before --end")
@click.option("--end", help="ISO 8601 datetime with offset, or a date (midnight UTC); default now")
@click.option("--cluster", help="cluster name")
def capacity(api: Api, group_by: str, start: str | None, end: str | None, cluster: str | None) -> int:
    """Capacity GPU-hours (nodes x allocatable GPUs x time seen), cordoned, allocated (the ledger) and unallocated
    GPU-hours with the unallocated cost, grouped; ``--group-by team``: each team's allocation and its share of the
    idle (unallocated) cost, in proportion to its allocation per cluster and day."""
    params = window_query(group_by, start, end, None)
    if cluster:
        params["cluster"] = cluster
    report = api.client.get("capacity/", params)
    if api.shown_as_json(report):
        return EXIT_OK
    out(f"capacity by {report['group_by']}, {window(report)} (UTC); - : no price")
    if group_by == "team":
        figures = ("ALLOCATED GPU-H", "ALLOCATED", "SHARED IDLE GPU-H", "SHARED IDLE", "TOTAL")
        rows = [[r["team"]] + team_share_cells(r) for r in report["results"]]
        table(["TEAM", *figures], rows, right=figures)
        return EXIT_OK
    keys = {"node_pool": ["cluster", "node_pool", "capacity_type"], "node": ["cluster", "node"]}.get(group_by,
                                                                                                  [group_by])
    figures = ("CAPACITY GPU-H", "CORDONED", "ALLOCATED", "UNALLOCATED", "UNALLOCATED COST", "UNPRICED GPU-H")
    rows = [[r.get(k) for k in keys] + capacity_cells(r) for r in report["results"]]
    rows.append(["TOTAL"] + [""] * (len(keys) - 1) + capacity_cells(report["total"]))
    table([k.replace("_", " ").upper() for k in keys] + list(figures), rows, right=figures)
    for key, difference in (report["total"].get("rounding_difference_usd") or {}).items():
        out(f"the rows' {key} {rounding_gap(difference)}: each figure is its exact sum rounded to cents once")
    return EXIT_OK


COMMANDS = [budgets, costs, utilization, capacity]
