"""A report's renderings from its data (``Report.data``): long-form CSV, the HTML body, and PNG charts for e-mail."""

from __future__ import annotations

import csv
import io

from django.template.loader import render_to_string

UNKNOWN = "unknown"


def _money(writer, section: str, item, figures: dict, key: str = "cost_usd", prefix: str = "") -> None:
    """The lines of one money figure: its USD (cents; ``unknown`` when none of it is priced) and, beside it, the
    GPU-hours and vCPU-hours it leaves out for want of a price (reports stored before they were kept: none)."""
    value = figures.get(key)
    writer.writerow([section, item, key, UNKNOWN if value is None else value])
    for unit in ("gpu", "vcpu"):
        metric = f"{prefix}unpriced_{unit}_hours"
        if metric in figures:
            writer.writerow([section, item, metric, "" if figures[metric] is None else figures[metric]])


def _capacity_csv(writer, data: dict) -> None:
    """The lines of the capacity section (platform reports) or of the team's shared idle (team reports); GPU-hours
    and USD as the API gives them, ``unknown`` where a figure is (reports stored before these sections: none)."""
    capacity = data.get("capacity")
    if capacity:
        rows = [(r["cluster"], r) for r in capacity["by_cluster"]] + [("total", capacity["total"])]
        for item, row in rows:
            for metric in ("capacity_gpu_hours", "cordoned_gpu_hours", "allocated_gpu_hours",
                           "uninventoried_allocated_gpu_hours", "unallocated_gpu_hours", "unallocated_cost_usd",
                           "unpriced_unallocated_gpu_hours"):
                writer.writerow(["capacity", item, metric, UNKNOWN if row[metric] is None else row[metric]])
        for metric, difference in capacity["total"]["rounding_difference_usd"].items():
            writer.writerow(["rounding_difference", "capacity", metric, difference])
    shared = data.get("shared_idle")
    if shared:
        for metric in ("gpu_hours", "cost_usd", "unpriced_gpu_hours", "basis"):
            writer.writerow(["shared_idle", data["scope"], metric, UNKNOWN if shared[metric] is None else shared[metric]])


def render_csv(data: dict) -> str:
    """The report as long-form CSV: ``section,item,metric,value`` (one number per line, USD with cents; every USD
    line followed by the unpriced GPU- and vCPU-hours it leaves out, ``unknown`` for a USD figure none of which
    is priced)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["section", "item", "metric", "value"])
    writer.writerow(["period", data["scope"], "start", data["period_start"]])
    writer.writerow(["period", data["scope"], "end", data["period_end"]])
    writer.writerow(["total", data["scope"], "gpu_hours", data["totals"]["gpu_hours"]])
    _money(writer, "total", data["scope"], data["totals"])
    for table, difference in (data.get("rounding_difference_usd") or {}).items():
        writer.writerow(["rounding_difference", table, "usd", difference])
    for section, key in (("accelerator", "accelerator"), ("cluster", "cluster")):
        for row in data[f"by_{section}"]:
            writer.writerow([section, row[key], "gpu_hours", row["gpu_hours"]])
            _money(writer, section, row[key], row)
    util = data["utilization"]
    for metric in ("avg_gpu_util_percent", "coverage_percent", "allocated_gpu_hours", "observed_gpu_hours",
                   "idle_gpu_hours", "unobserved_gpu_hours", "idle_cost_usd", "idle_unpriced_gpu_hours",
                   "idle_unpriced_vcpu_hours"):
        if metric not in util and metric.startswith("idle_unpriced"):
            continue  # a report stored before these were kept
        value = util.get(metric)
        writer.writerow(["utilization", data["scope"], metric, "no data" if value is None else value])
    for rank, job in enumerate(data["top_jobs"], start=1):
        item = f"{rank}:{job['job'] or ''}:{job['job_name']}"
        writer.writerow(["top_job", item, "gpu_hours", job["gpu_hours"]])
        _money(writer, "top_job", item, job)
    efficiency = data.get("training_efficiency")  # absent from reports stored before the section existed
    if efficiency:
        for band in efficiency["by_mfu_band"]:
            writer.writerow(["mfu_band", band["band"], "gpu_hours", band["gpu_hours"]])
            _money(writer, "mfu_band", band["band"], band)
        low = f"below {efficiency['low_mfu']['below_percent']:g} %"
        writer.writerow(["low_mfu", low, "gpu_hours", efficiency["low_mfu"]["gpu_hours"]])
        _money(writer, "low_mfu", low, efficiency["low_mfu"])
        for rank, job in enumerate(efficiency["top_jobs"], start=1):
            item = f"{rank}:{job['job']}:{job['job_name']}"
            for metric in ("tokens", "usd_per_million_tokens", "mfu_percent"):
                writer.writerow(["efficiency_job", item, metric, "" if job[metric] is None else job[metric]])
        for rank, job in enumerate(efficiency.get("lowest_mfu_jobs", []), start=1):
            item = f"{rank}:{job['job']}:{job['job_name']}"
            writer.writerow(["lowest_mfu_job", item, "mfu_percent", job["mfu_percent"]])
            _money(writer, "lowest_mfu_job", item, job)
    for job in data.get("serving") or ():  # absent from reports stored before the section existed
        item = f"{job['job']}:{job['job_name']}"
        for metric in ("requests", "requests_per_second", "error_rate_percent", "tokens", "gpu_hours",
                       "gpu_hours_per_million_requests"):
            writer.writerow(["serving", item, metric, "" if job[metric] is None else job[metric]])
        _money(writer, "serving", item, job)
        for metric, count in (("usd_per_million_requests", "requests"), ("usd_per_million_tokens", "tokens")):
            value = job[metric]  # none counted: empty; counted without a known price: unknown
            writer.writerow(["serving", item, metric, "" if not job[count] else UNKNOWN if value is None else value])
    for row in data["quota_use"]:
        for metric in ("nominal_gpus", "borrowing_limit_gpus", "gpu_hours", "avg_gpus_in_use", "percent_of_nominal"):
            writer.writerow(["quota", row["accelerator"], metric, "" if row[metric] is None else row[metric]])
    for row in data["budgets"]:
        item = f"{row['team']}:{row['period']}"
        writer.writerow(["budget", item, "amount_usd", row["amount_usd"]])
        _money(writer, "budget", item, row, "spent_usd")
        for metric in ("committed_usd", "remaining_usd", "forecast_usd"):
            writer.writerow(["budget", item, metric, row[metric]])
    _capacity_csv(writer, data)
    unknown = data.get("cost_unknown")
    if unknown:
        writer.writerow(["cost_unknown", data["scope"], "since", unknown["since"]])
        writer.writerow(["cost_unknown", data["scope"], "gpu_hours", unknown["gpu_hours"]])
    previous = data["previous"]
    writer.writerow(["previous_period", data["scope"], "gpu_hours", previous["gpu_hours"]])
    _money(writer, "previous_period", data["scope"], previous)
    for metric in ("gpu_hours_change_percent", "cost_change_percent"):
        value = previous[metric]
        writer.writerow(["previous_period", data["scope"], metric, "" if value is None else value])
    return out.getvalue()


def render_charts(data: dict) -> dict[str, bytes]:
    """PNG charts of the report, rendered server-side with matplotlib's Agg backend: ``{"cost_by_accelerator",
    "cost_by_day"}`` -> PNG bytes (only charts with data)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    charts = {}
    series = {
        "cost_by_accelerator": ([r["accelerator"] for r in data["by_accelerator"]],
                                [float(r["cost_usd"] or 0) for r in data["by_accelerator"]], "Cost by accelerator (USD)"),
        "cost_by_day": ([r["day"] for r in data["by_day"]], [float(r["cost_usd"] or 0) for r in data["by_day"]],
                        "Cost by day (USD)"),
    }
    for name, (labels, values, title) in series.items():
        if not labels:
            continue
        figure = Figure(figsize=(6, 3), dpi=100)
        axes = figure.subplots()
        axes.bar(labels, values, color="#1f5fa8")
        axes.set_title(title)
        axes.set_ylabel("USD")
        axes.tick_params(axis="x", labelrotation=30, labelsize=8)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        charts[name] = buffer.getvalue()
    return charts


def render_html(data: dict, chart_urls: dict[str, str] | None = None) -> str:
    """The report body as HTML (template ``costs/reports/body.html``); ``chart_urls`` maps chart names to image URLs
    (``cid:`` references in e-mail)."""
    return render_to_string("costs/reports/body.html", {"data": data, "chart_urls": chart_urls or {}})
