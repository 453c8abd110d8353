"""Utilization and cost reports: the numbers of one scope and period, their HTML/CSV renderings, PNG charts and e-mail.

Money comes from the append-only ledger (``costs.CostEntry``; an entry counts in
the period holding its ``interval_start``, the rule of the costs API and of
budgets); utilization and idle GPU time from ``costs.UtilizationRollup``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
from decimal import Decimal
from email.mime.image import MIMEImage

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from core.money import usd_cents
from costs.aggregation import aggregate_costs, aggregate_utilization, filter_days
from costs.budgets import admin_emails, budget_status
from costs.models import CostEntry, UtilizationRollup
from quotas.models import Budget, Quota, Team

from .models import Report

log = logging.getLogger(__name__)

PERIOD_LENGTH = {Report.Kind.DAILY: dt.timedelta(days=1), Report.Kind.WEEKLY: dt.timedelta(days=7)}
TOP_JOBS = 10
# Below this share of the expected DCGM samples a period's utilization is reported as incomplete (percent).
COVERAGE_COMPLETE_PERCENT = 95.0


def period_window(kind: str, at: dt.datetime | None = None) -> tuple[dt.datetime, dt.datetime]:
    """The last complete period of ``kind`` before ``at`` (default now), as aware UTC ``[start, end)``.

    ``daily``: the previous UTC day. ``weekly``: the previous ISO week (Monday 00:00 UTC to Monday).
    Raises KeyError for another kind.
    """
    length = PERIOD_LENGTH[kind]
    at = (at or timezone.now()).astimezone(dt.timezone.utc)
    end = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == Report.Kind.WEEKLY:
        end -= dt.timedelta(days=end.weekday())
    return end - length, end


def _percent_change(now: Decimal | float, before: Decimal | float) -> float | None:
    """``(now - before) / before`` in percent, 2 decimals; None when there is nothing to compare to."""
    if not before:
        return None
    return round(float((Decimal(str(now)) - Decimal(str(before))) / Decimal(str(before)) * 100), 2)


def _ledger(team: Team | None, start: dt.datetime, end: dt.datetime):
    entries = CostEntry.objects.filter(interval_start__gte=start, interval_start__lt=end)
    return entries.filter(team=team) if team is not None else entries


def _top_jobs(entries) -> list[dict]:
    """The ``TOP_JOBS`` jobs with the highest cost in ``entries``: id, name, team, GPU-hours, USD (cents)."""
    sums = {}
    for row in entries.values("job_id", "job__name", "team__slug", "amount_usd"):
        item = sums.setdefault(row["job_id"], {"job": row["job_id"], "job_name": row["job__name"],
                                               "team": row["team__slug"], "cost": Decimal(0)})
        item["cost"] += row["amount_usd"]
    rows, _ = aggregate_costs(entries, "job")
    hours = {r["job"]: r["gpu_hours"] for r in rows}
    ranked = sorted(sums.values(), key=lambda r: (-r["cost"], r["job"]))[:TOP_JOBS]
    return [{"job": r["job"], "job_name": r["job_name"], "team": r["team"], "gpu_hours": hours.get(r["job"], 0.0),
             "cost_usd": usd_cents(r["cost"])} for r in ranked]


def _quota_use(team: Team | None, gpu_hours_by_accelerator: dict[str, float], hours: float) -> list[dict]:
    """Per accelerator: nominal and borrowing GPUs (summed over the scope's teams), GPU-hours used, average GPUs
    in use (GPU-hours / period hours) and that average as a percent of nominal (null without nominal quota)."""
    quotas = Quota.objects.filter(cluster__isnull=True).select_related("accelerator")
    if team is not None:
        quotas = quotas.filter(team=team)
    nominal: dict[str, list[int]] = {}
    for q in quotas:
        pair = nominal.setdefault(q.accelerator.name, [0, 0])
        pair[0] += q.nominal_gpus
        pair[1] += q.borrowing_limit_gpus
    rows = []
    for name in sorted(set(nominal) | set(gpu_hours_by_accelerator)):
        used = gpu_hours_by_accelerator.get(name, 0.0)
        avg = round(used / hours, 3) if hours else 0.0
        nom, borrow = nominal.get(name, [0, 0])
        rows.append({"accelerator": name, "nominal_gpus": nom, "borrowing_limit_gpus": borrow, "gpu_hours": used,
                     "avg_gpus_in_use": avg, "percent_of_nominal": round(avg / nom * 100, 2) if nom else None})
    return rows


def _budgets(team: Team | None, end: dt.datetime) -> list[dict]:
    """Every budget of the scope in force at the period's last instant: spent, committed, remaining, forecast (USD).

    ``costs.budgets.budget_status`` counts the whole budget period's ledger as known when the report is generated
    (for a scheduled report, minutes after the period ends).
    """
    budgets = Budget.objects.select_related("team")
    if team is not None:
        budgets = budgets.filter(team=team)
    at = min(end, timezone.now()) - dt.timedelta(microseconds=1)
    rows = []
    for budget in budgets:
        status = budget_status(budget, at)
        if status is None:
            continue
        rows.append({"team": budget.team.slug, "period": budget.period, "action": budget.action,
                     "period_start": status.period_start.isoformat(), "period_end": status.period_end.isoformat(),
                     "amount_usd": usd_cents(status.amount_usd), "spent_usd": usd_cents(status.spent_usd),
                     "committed_usd": usd_cents(status.committed_usd), "remaining_usd": usd_cents(status.remaining_usd),
                     "forecast_usd": usd_cents(status.forecast_usd),
                     "spent_percent": round(float(status.spent_percent), 2)})
    return rows


def _utilization(team: Team | None, start: dt.datetime, end: dt.datetime, ledger_gpu_hours: float) -> dict:
    """Average utilization (percent, sample weighted), coverage (percent), idle GPU-hours and USD over the period.

    ``missing`` is True when GPUs were billed but no DCGM sample exists (the
    average is then null, never 0 %); ``partial`` when coverage is under
    ``COVERAGE_COMPLETE_PERCENT``.
    """
    rollups = filter_days(UtilizationRollup.objects.all(), start, end)
    if team is not None:
        rollups = rollups.filter(team=team)
    _, total = aggregate_utilization(rollups, "team")
    coverage = None if total["coverage"] is None else round(total["coverage"] * 100, 2)
    missing = ledger_gpu_hours > 0 and total["avg_gpu_util_percent"] is None
    partial = not missing and coverage is not None and coverage < COVERAGE_COMPLETE_PERCENT
    note = ""
    if missing:
        note = "GPU metrics are missing for this period: utilization and idle time are not available."
    elif partial:
        note = f"GPU metrics cover only {coverage}% of the expected samples: utilization figures are incomplete."
    return {"avg_gpu_util_percent": total["avg_gpu_util_percent"], "coverage_percent": coverage,
            "idle_gpu_hours": None if missing else total["idle_gpu_hours"],
            "idle_cost_usd": None if missing else total["idle_cost_usd"],
            "missing": missing, "partial": partial, "note": note}


def build_report_data(team: Team | None, start: dt.datetime, end: dt.datetime) -> dict:
    """The numbers of a report for ``team`` (None: every team) over ``[start, end)``, JSON-ready.

    Keys: ``scope``, ``period_start``/``period_end`` (ISO), ``hours`` (period
    length), ``totals`` and ``by_accelerator``/``by_cluster``/``by_day``
    (GPU-hours, USD cents as strings), ``utilization`` (see ``_utilization``),
    ``top_jobs``, ``quota_use``, ``budgets`` and ``previous`` (the equal-length
    period before, with percent changes; null where the previous value is 0).
    """
    entries = _ledger(team, start, end)
    by_accelerator, totals = aggregate_costs(entries, "accelerator")
    by_cluster, _ = aggregate_costs(entries, "cluster")
    by_day, _ = aggregate_costs(entries, "day")
    previous_start = start - (end - start)
    _, previous = aggregate_costs(_ledger(team, previous_start, start), "team")
    hours = (end - start).total_seconds() / 3600
    return {
        "scope": team.slug if team is not None else "platform",
        "team": team.slug if team is not None else None,
        "period_start": start.isoformat(),
        "period_end": end.isoformat(),
        "hours": hours,
        "totals": totals,
        "by_accelerator": by_accelerator,
        "by_cluster": by_cluster,
        "by_day": by_day,
        "utilization": _utilization(team, start, end, totals["gpu_hours"]),
        "top_jobs": _top_jobs(entries),
        "quota_use": _quota_use(team, {r["accelerator"]: r["gpu_hours"] for r in by_accelerator}, hours),
        "budgets": _budgets(team, end),
        "previous": {
            "period_start": previous_start.isoformat(),
            "period_end": start.isoformat(),
            "gpu_hours": previous["gpu_hours"],
            "cost_usd": previous["cost_usd"],
            "gpu_hours_change_percent": _percent_change(totals["gpu_hours"], previous["gpu_hours"]),
            "cost_change_percent": _percent_change(Decimal(totals["cost_usd"]), Decimal(previous["cost_usd"])),
        },
    }


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
    for metric in ("avg_gpu_util_percent", "coverage_percent", "idle_gpu_hours", "idle_cost_usd"):
        value = util[metric]
        writer.writerow(["utilization", data["scope"], metric, "no data" if value is None else value])
    for rank, job in enumerate(data["top_jobs"], start=1):
        item = f"{rank}:{job['job']}:{job['job_name']}"
        writer.writerow(["top_job", item, "gpu_hours", job["gpu_hours"]])
        writer.writerow(["top_job", item, "cost_usd", job["cost_usd"]])
    for row in data["quota_use"]:
        for metric in ("nominal_gpus", "borrowing_limit_gpus", "gpu_hours", "avg_gpus_in_use", "percent_of_nominal"):
            writer.writerow(["quota", row["accelerator"], metric, "" if row[metric] is None else row[metric]])
    for row in data["budgets"]:
        for metric in ("amount_usd", "spent_usd", "committed_usd", "remaining_usd", "forecast_usd"):
            writer.writerow(["budget", f"{row['team']}:{row['period']}", metric, row[metric]])
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
    """The report body as HTML (``frontend/report_body.html``); ``chart_urls`` maps chart names to image URLs
    (``cid:`` references in e-mail)."""
    return render_to_string("frontend/report_body.html", {"data": data, "chart_urls": chart_urls or {}})


def generate_report(team: Team | None, start: dt.datetime, end: dt.datetime, kind: str = Report.Kind.CUSTOM
                    ) -> tuple[Report, bool]:
    """Compute and store the report of ``team`` (None: platform-wide) for ``[start, end)``.

    Idempotent per (scope, kind, period): a second run refreshes the stored
    row. Returns ``(report, created)``.
    """
    data = build_report_data(team, start, end)
    with transaction.atomic():
        report, created = Report.objects.select_for_update().update_or_create(
            team=team, kind=kind, period_start=start, period_end=end,
            defaults={"data": data, "html": render_html(data), "csv": render_csv(data)},
        )
    return report, created


def report_recipients(report: Report) -> list[str]:
    """Who gets ``report`` by e-mail: its team's admins; platform staff for a platform-wide report."""
    if report.team_id is not None:
        return admin_emails(report.team_id)
    from django.contrib.auth import get_user_model

    return sorted(e for e in get_user_model().objects.filter(is_staff=True, is_active=True)
                  .values_list("email", flat=True) if e)


def send_report(report: Report) -> int:
    """E-mail ``report`` (HTML with PNG charts inline by ``cid:``, the CSV attached) through Django's mail.

    Returns the number of messages sent (0 when the scope has no recipient).
    """
    recipients = report_recipients(report)
    if not recipients:
        return 0
    charts = render_charts(report.data)
    html = render_html(report.data, {name: f"cid:{name}" for name in charts})
    totals = report.data["totals"]
    text = (f"{report}: {totals['gpu_hours']} GPU-hours, ${totals['cost_usd']}.\n"
            f"{report.data['utilization']['note']}\nThe full report is attached as CSV.\n")
    message = EmailMultiAlternatives(
        subject=f"[controlplane] {report.kind} report {report.scope_name} {report.period_start:%Y-%m-%d}",
        body=text, from_email=settings.DEFAULT_FROM_EMAIL, to=recipients,
    )
    message.attach_alternative(html, "text/html")
    for name, png in charts.items():
        image = MIMEImage(png, "png")
        image.add_header("Content-ID", f"<{name}>")
        image.add_header("Content-Disposition", "inline", filename=f"{name}.png")
        message.attach(image)
    message.attach(f"report-{report.scope_name}-{report.period_start:%Y%m%d}.csv", report.csv, "text/csv")
    return message.send()


def generate_reports(kind: str, scope: str = "all", at: dt.datetime | None = None) -> list[int]:
    """Generate (and e-mail, when new) the ``kind`` reports of the last complete period before ``at``.

    ``scope``: ``all`` (every team and the platform), ``platform``, or a team
    slug. Returns the ids of the reports. Raises Team.DoesNotExist for an
    unknown slug, KeyError for an unknown kind.
    """
    start, end = period_window(kind, at)
    if scope == "all":
        targets = [*Team.objects.all(), None]
    elif scope == "platform":
        targets = [None]
    else:
        targets = [Team.objects.get(slug=scope)]
    ids = []
    for team in targets:
        report, created = generate_report(team, start, end, kind)
        if created:
            send_report(report)
        ids.append(report.pk)
        log.info("report %s generated (%s)", report, "new" if created else "refreshed")
    return ids

