"""A report's renderings from its data (``Report.data``): long-form CSV, the HTML body, and PNG charts for e-mail."""

from __future__ import annotations

import csv
import io

from django.template.loader import render_to_string


def render_csv(data: dict) -> str:
    """The report as long-form CSV: ``section,item,metric,value`` (one number per line, USD with cents)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["section", "item", "metric", "value"])
    writer.writerow(["period", data["scope"], "start", data["period_start"]])
    writer.writerow(["period", data["scope"], "end", data["period_end"]])
    for metric in ("gpu_hours", "cost_usd"):
        writer.writerow(["total", data["scope"], metric, data["totals"][metric]])
    for section, key in (("accelerator", "accelerator"), ("cluster", "cluster")):
        for row in data[f"by_{section}"]:
            writer.writerow([section, row[key], "gpu_hours", row["gpu_hours"]])
            writer.writerow([section, row[key], "cost_usd", row["cost_usd"]])
    util = data["utilization"]
    for metric in ("avg_gpu_util_percent", "coverage_percent", "allocated_gpu_hours", "observed_gpu_hours",
                   "idle_gpu_hours", "unobserved_gpu_hours", "idle_cost_usd"):
        value = util.get(metric)
        writer.writerow(["utilization", data["scope"], metric, "no data" if value is None else value])
    for rank, job in enumerate(data["top_jobs"], start=1):
        item = f"{rank}:{job['job'] or ''}:{job['job_name']}"
        writer.writerow(["top_job", item, "gpu_hours", job["gpu_hours"]])
        writer.writerow(["top_job", item, "cost_usd", job["cost_usd"]])
    efficiency = data.get("training_efficiency")  # absent from reports stored before the section existed
    if efficiency:
        for band in efficiency["by_mfu_band"]:
            writer.writerow(["mfu_band", band["band"], "gpu_hours", band["gpu_hours"]])
            writer.writerow(["mfu_band", band["band"], "cost_usd", band["cost_usd"]])
        writer.writerow(["low_mfu", f"below {efficiency['low_mfu']['below_percent']:g} %", "gpu_hours",
                         efficiency["low_mfu"]["gpu_hours"]])
        writer.writerow(["low_mfu", f"below {efficiency['low_mfu']['below_percent']:g} %", "cost_usd",
                         efficiency["low_mfu"]["cost_usd"]])
        for rank, job in enumerate(efficiency["top_jobs"], start=1):
            item = f"{rank}:{job['job']}:{job['job_name']}"
            for metric in ("tokens", "usd_per_million_tokens", "mfu_percent"):
                writer.writerow(["efficiency_job", item, metric, "" if job[metric] is None else job[metric]])
        for rank, job in enumerate(efficiency.get("lowest_mfu_jobs", []), start=1):
            for metric in ("mfu_percent", "cost_usd"):
                writer.writerow(["lowest_mfu_job", f"{rank}:{job['job']}:{job['job_name']}", metric, job[metric]])
    for row in data["quota_use"]:
        for metric in ("nominal_gpus", "borrowing_limit_gpus", "gpu_hours", "avg_gpus_in_use", "percent_of_nominal"):
            writer.writerow(["quota", row["accelerator"], metric, "" if row[metric] is None else row[metric]])
    for row in data["budgets"]:
        for metric in ("amount_usd", "spent_usd", "committed_usd", "remaining_usd", "forecast_usd"):
            writer.writerow(["budget", f"{row['team']}:{row['period']}", metric, row[metric]])
    unknown = data.get("cost_unknown")
    if unknown:
        writer.writerow(["cost_unknown", data["scope"], "since", unknown["since"]])
        writer.writerow(["cost_unknown", data["scope"], "gpu_hours", unknown["gpu_hours"]])
    previous = data["previous"]
    for metric in ("gpu_hours", "cost_usd", "gpu_hours_change_percent", "cost_change_percent"):
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
                                [float(r["cost_usd"]) for r in data["by_accelerator"]], "Cost by accelerator (USD)"),
        "cost_by_day": ([r["day"] for r in data["by_day"]], [float(r["cost_usd"]) for r in data["by_day"]],
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
