"""Reports: ``reports`` (the stored ones, newest first), ``report ID [--csv]`` (one report's figures or CSV) and
``build-report`` (a report of a team, or the platform, over any period, built now)."""

from __future__ import annotations

import sys

import click

from cpctl.commands.costs import as_api_time
from cpctl.errors import EXIT_BAD_INPUT, EXIT_OK, CliError
from cpctl.options import POSITIVE_INT, Api, api_command
from cpctl.output import err, fields, gpu_hours, money, out, percent, table, usd, when


@api_command("reports", "list stored utilization and cost reports, newest first")
@click.option("--team", help="team slug (platform: the platform-wide reports)")
@click.option("--kind", type=click.Choice(("daily", "weekly", "custom")), help="only reports of this kind")
@click.option("--limit", type=POSITIVE_INT, default=50, help="at most this many reports (default 50)")
def reports(api: Api, team: str | None, kind: str | None, limit: int) -> int:
    """Stored reports, newest first: id, scope, kind, period, GPU-hours, cost (USD), average utilization."""
    params = {"ordering": "-period_end"}
    if kind:
        params["kind"] = kind
    page = api.client.get_pages("reports/", params, limit=limit)
    found = [r for r in page["results"] if not team or (r.get("team") or "platform") == team]
    if api.shown_as_json({**page, "results": found}):
        return EXIT_OK
    if not found:
        err("no reports (daily ones are made at 06:00 UTC, weekly ones on Mondays; "
            "cpctl build-report makes one of any period now)")
        return EXIT_OK
    rows = []
    for r in found:
        data = r.get("data") or {}
        totals, util = data.get("totals") or {}, data.get("utilization") or {}
        rows.append([r["id"], r.get("team") or "platform", r["kind"], when(r["period_start"]),
                     when(r["period_end"]), gpu_hours(totals.get("gpu_hours")), money(totals),
                     percent(util.get("avg_gpu_util_percent"))])
    table(["ID", "SCOPE", "KIND", "FROM (UTC)", "TO (UTC)", "GPU-HOURS", "COST", "AVG UTIL"], rows,
          right=("ID", "GPU-HOURS", "COST", "AVG UTIL"))
    if page["count"] > len(page["results"]):
        err(f"({len(page['results'])} of {page['count']} reports; --limit shows more)")
    return EXIT_OK


def _unpriced(text: str, hours) -> str:
    """``text`` with the GPU-hours it leaves out for want of a price beside it, when there are any."""
    return text + (f" + {float(hours):,.2f} GPU-h unpriced" if hours and float(hours) else "")


def _known(value, shown) -> str:
    """``shown(value)``, or ``unknown`` for null (never 0)."""
    return "unknown" if value is None else shown(value)


def capacity_cells(row: dict) -> list:
    """A capacity row of a report (``data.capacity``): capacity, cordoned, allocated, unallocated GPU-hours and the
    unallocated cost with its unpriced GPU-hours; ``unknown`` for a null figure."""
    return [_known(row.get(k), gpu_hours) for k in ("capacity_gpu_hours", "cordoned_gpu_hours",
                                                    "allocated_gpu_hours", "unallocated_gpu_hours")] + [
        _unpriced(_known(row.get("unallocated_cost_usd"), usd), row.get("unpriced_unallocated_gpu_hours"))]


def report_fields(data: dict) -> list[tuple[str, str]]:
    """A report's headline lines: GPU-hours, cost and its change on the period before, utilization, the team's
    shared idle cost (team reports), note."""
    totals, util, previous = data.get("totals") or {}, data.get("utilization") or {}, data.get("previous") or {}
    change = previous.get("cost_change_percent")
    pairs = [
        ("GPU-hours", gpu_hours(totals.get("gpu_hours"))),
        ("cost", money(totals) + ("" if change is None else f" ({change:+.1f}% on the period before)")),
        ("utilization", f"{percent(util.get('avg_gpu_util_percent'))} average, "
                        f"{percent(util.get('coverage_percent'), 0)} observed"
                        + (f"; idle {gpu_hours(util.get('idle_gpu_hours'))} GPU-h ({percent(util.get('idle_percent'))})"
                           f" = {money(util, 'idle_cost_usd', 'idle_')}" if util.get("idle_gpu_hours") is not None
                           else "")),
    ]
    shared = data.get("shared_idle")
    if shared:
        pairs.append(("shared idle", f"{gpu_hours(shared['gpu_hours'])} GPU-h = "
                      + _unpriced(_known(shared["cost_usd"], usd), shared["unpriced_gpu_hours"])
                      + f", {shared['basis']}; not in the cost above"))
    if util.get("note"):
        pairs.append(("note", util["note"]))
    return pairs


def report_sections(data: dict) -> list[tuple[str, list[str], list[list]]]:
    """A report's tables as ``(title, headers, rows)``: top jobs, quota use, budgets, capacity per cluster with its
    total (platform reports)."""
    capacity = data.get("capacity") or {}
    capacity_rows = [[r.get("cluster"), *capacity_cells(r)] for r in capacity.get("by_cluster") or []]
    if capacity:
        capacity_rows.append(["TOTAL", *capacity_cells(capacity["total"])])
    return [
        ("Top jobs", ["JOB", "NAME", "TEAM", "GPU-HOURS", "COST"], [
            [j.get("job"), j.get("job_name"), j.get("team"), gpu_hours(j.get("gpu_hours")), money(j)]
            for j in data.get("top_jobs") or []]),
        ("Quota use", ["ACCELERATOR", "NOMINAL", "GPU-HOURS", "AVG GPUS", "OF NOMINAL"], [
            [q.get("accelerator"), q.get("nominal_gpus"), gpu_hours(q.get("gpu_hours")),
             f"{float(q.get('avg_gpus_in_use') or 0):.2f}", percent(q.get("percent_of_nominal"))]
            for q in data.get("quota_use") or []]),
        ("Budgets", ["TEAM", "PERIOD", "AMOUNT", "SPENT", "REMAINING", "SPENT %"], [
            [b.get("team"), b.get("period"), usd(b.get("amount_usd")), money(b, "spent_usd"),
             usd(b.get("remaining_usd")), percent(b.get("spent_percent"))] for b in data.get("budgets") or []]),
        ("Capacity", ["CLUSTER", "CAPACITY GPU-H", "CORDONED", "ALLOCATED", "UNALLOCATED", "UNALLOCATED COST"],
         capacity_rows),
    ]


@api_command("report", "show one report's figures, or its CSV")
@click.argument("id", metavar="ID", type=int)
@click.option("--csv", "as_csv", is_flag=True, help="print the report's CSV (section,item,metric,value)")
def report(api: Api, id: int, as_csv: bool) -> int:  # noqa: A002 - the argument's name in the usage line
    """One report: its totals, change on the period before, utilization, top jobs, quota use, budgets, and the
    fleet's capacity (platform reports) or the team's shared idle cost (team reports); or its
    CSV (``--csv``, as the API gives it)."""
    if as_csv:
        text = api.client.request("GET", f"reports/{id}/csv/").text
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return EXIT_OK
    body = api.client.get(f"reports/{id}/")
    if not api.shown_as_json(body):
        show_report(body)
    return EXIT_OK


def show_report(body: dict) -> None:
    """Print one report of the API (``reports/{id}/``): its headline, figures and tables."""
    data = body.get("data") or {}
    out(f"report {body['id']}  {body['kind']} for {body.get('team') or 'the platform'}, "
        f"{when(body['period_start'])} to {when(body['period_end'])} UTC")
    fields(report_fields(data))
    for title, headers, rows in report_sections(data):
        if rows:
            out()
            out(title)
            table(headers, rows, right=tuple(h for h in headers
                                             if h not in ("NAME", "TEAM", "ACCELERATOR", "PERIOD", "CLUSTER")))


@api_command("build-report", "build a report of a team (or the platform) over any period, now")
@click.option("--team", help="team slug (a member's team; staff: any)")
@click.option("--platform", is_flag=True, help="platform-wide, every team (staff only) instead of --team")
@click.option("--start", required=True, help="ISO 8601 datetime with offset, or a date (midnight UTC); inclusive")
@click.option("--end", required=True, help="ISO 8601 datetime with offset, or a date (midnight UTC); exclusive")
def build_report(api: Api, team: str | None, platform: bool, start: str, end: str) -> int:
    """Build the report of ``--team`` (or ``--platform``) over ``[--start, --end)`` now (``POST reports/``), store
    it and print it as ``report ID`` does. The same team and period again refreshes the stored one. Bad input
    (an unknown team, the end before the start, a period longer than the API allows) exits 2 with the reason."""
    if bool(team) == platform:
        raise CliError(EXIT_BAD_INPUT, "error: give --team TEAM or --platform (one of them)")
    body = {"start": as_api_time(start), "end": as_api_time(end)}
    if team:
        body["team"] = team
    report_body = api.client.post("reports/", body)
    if not api.shown_as_json(report_body):
        show_report(report_body)
    return EXIT_OK


COMMANDS = [reports, report, build_report]
