"""Utilization and cost reports: the numbers of one scope and period, stored as a Report, and their generation.

Renderings are ``costs.reports.render``, e-mail ``costs.reports.mail``.
Shown money follows the one table rule (docs/design.md, Cost ledger): each row
and each total is its exact sum rounded once to cents, so a job, team or day
shows the same figure here as in the API, the UI and the CLI; where a
section's rows miss the total by rounding, ``totals.rounding_difference_usd``
says by how much. The top jobs end with an "other jobs" row. Money comes from the append-only ledger (``costs.CostEntry``; an entry counts in
the period holding its ``interval_start``, the rule of the costs API and of
budgets), read through its day rollups for whole days
(``costs.aggregation.aggregate_window``); utilization and idle GPU time from
``costs.UtilizationRollup``.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.money import rounding_difference, usd_cents
from jobs.models import Job
from jobs.serving_figures import service_figures
from quotas.models import CPU_FLAVOR, Budget, Quota, Team

from ..aggregation import aggregate_window, filter_days, hours, money, utilization_window, window_sums
from ..capacity import capacity_report, with_rounding
from ..forecast import committed_at, forecast
from ..models import CostEntry, Report, UtilizationRollup
from ..spend import period_spend
from ..unknown import unknown_cost, unknown_cost_json
from .efficiency import training_efficiency
from .render import render_csv, render_html

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


def period_errors(start: dt.datetime, end: dt.datetime) -> dict[str, str]:
    """Why ``[start, end)`` (aware datetimes) cannot be the period of a report asked for on demand: ``{field:
    reason}`` for ``end`` (at or before ``start``; longer than ``REPORTS_MAX_PERIOD_DAYS`` days, which bounds the
    work of one request), empty when it can be."""
    if end <= start:
        return {"end": f"must be after start ({start.isoformat()})"}
    longest = dt.timedelta(days=settings.REPORTS_MAX_PERIOD_DAYS)
    if end - start > longest:
        return {"end": f"the period is {(end - start).total_seconds() / 86400:g} days long; a report covers at most "
                       f"{settings.REPORTS_MAX_PERIOD_DAYS} days (REPORTS_MAX_PERIOD_DAYS)"}
    return {}


def _percent_change(now: Decimal | float, before: Decimal | float) -> float | None:
    """``(now - before) / before`` in percent, 2 decimals; None when there is nothing to compare to."""
    if not before:
        return None
    return round(float((Decimal(str(now)) - Decimal(str(before))) / Decimal(str(before)) * 100), 2)


def _costs(team: Team | None, group_by: str, start: dt.datetime, end: dt.datetime, *, exact: bool = False):
    """Costs of the scope over ``[start, end)`` by ``group_by``: ``(rows, total)``, or with ``exact`` the exact
    ``{key: [GPU-seconds, USD]}`` (``costs.aggregation``)."""
    scope = (lambda qs: qs.filter(team=team)) if team is not None else None
    if exact:
        return window_sums(group_by, start, end, scope=scope)
    return aggregate_window(group_by, start, end, scope=scope)


def _ledger(team: Team | None, start: dt.datetime, end: dt.datetime):
    """The scope's ledger entries starting in ``[start, end)``: the per-attempt view the efficiency section needs."""
    entries = CostEntry.objects.filter(interval_start__gte=start, interval_start__lt=end)
    return entries.filter(team=team) if team is not None else entries


def _top_jobs(team: Team | None, start: dt.datetime, end: dt.datetime) -> list[dict]:
    """The ``TOP_JOBS`` jobs with the highest cost in the period (id, name, team, GPU-hours, USD cents), then one
    row ``job: null, job_name: "other jobs (N)"`` for the rest; each row its exact sum rounded once, as everywhere
    (the report says by how much the rows miss the total, ``rounding_difference_usd``)."""
    sums = _costs(team, "job", start, end, exact=True)
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1][1], -kv[1][2], kv[0][0]))
    top, rest = ranked[:TOP_JOBS], ranked[TOP_JOBS:]
    teams = dict(Job.objects.filter(pk__in=[job for (job, _), _ in top]).values_list("pk", "team__slug"))
    shown = [({"job": job, "job_name": name, "team": teams[job]}, figures) for (job, name), figures in top]
    if rest:
        shown.append(({"job": None, "job_name": f"other jobs ({len(rest)})", "team": None},
                      [sum((f[i] for _, f in rest), Decimal(0)) for i in range(4)]))
    rows = []
    for row, (seconds, cost, unpriced_gpu, unpriced_vcpu) in shown:
        row.update(gpu_hours=hours(seconds), **money(cost, unpriced_gpu, unpriced_vcpu))
        rows.append(row)
    return rows


def _quota_use(team: Team | None, gpu_hours_by_accelerator: dict[str, float], hours: float) -> list[dict]:
    """Per accelerator: nominal and borrowing GPUs (summed over the scope's teams), GPU-hours used, average GPUs
    in use (GPU-hours / period hours) and that average as a percent of nominal (null without nominal quota). CPU
    quotas count vCPUs, not GPUs, and are left out."""
    quotas = Quota.objects.filter(cluster__isnull=True).exclude(accelerator__name=CPU_FLAVOR).select_related(
        "accelerator")
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
    """Every budget of the scope in force at the period's last instant, as it stood then: the report's own period.

    Spent: the budget period's ledger up to the report's end (entries after
    it belong to later reports); committed: what the jobs running at that
    instant could still spend (``costs.forecast.committed_at``); forecast:
    ``costs.forecast.forecast`` from that instant, with its method.
    """
    budgets = Budget.objects.select_related("team")
    if team is not None:
        budgets = budgets.filter(team=team)
    at = min(end, timezone.now()) - dt.timedelta(microseconds=1)
    rows = []
    for budget in budgets:
        start, period_end = budget.window(at)
        if start is None or period_end is None or not (start <= at < period_end):
            continue
        spend = period_spend([budget.team_id], start, at + dt.timedelta(microseconds=1))[budget.team_id]
        spent = spend.cost_usd
        committed = committed_at(budget.team_id, at)
        basis = forecast(budget.team_id, period_end, at, spent, committed)
        remaining = budget.amount_usd - spent - committed
        rows.append({"team": budget.team.slug, "period": budget.period, "action": budget.action,
                     "period_start": start.isoformat(), "period_end": period_end.isoformat(),
                     "as_of": (at + dt.timedelta(microseconds=1)).isoformat(),
                     "amount_usd": usd_cents(budget.amount_usd),
                     **money(spent, spend.unpriced_gpu_hours * 3600, spend.unpriced_vcpu_seconds, "spent_usd"),
                     "committed_usd": usd_cents(committed), "remaining_usd": usd_cents(remaining),
                     "forecast_usd": usd_cents(basis.forecast_usd), "forecast_method": basis.method,
                     "forecast_rate_usd_per_day": usd_cents(basis.rate_usd_per_day),
                     "spent_percent": round(float(spent / budget.amount_usd * 100), 2) if budget.amount_usd else 0.0})
    return rows


def _utilization(team: Team | None, start: dt.datetime, end: dt.datetime, ledger_gpu_hours: float) -> dict:
    """Average utilization (percent, sample weighted), coverage (observed of allocated GPU time, percent), idle
    GPU-hours, their share of the observed time (percent) and USD over the period.

    ``missing`` is True when GPUs were billed but no DCGM sample exists (the
    average is then null, never 0 %); ``partial`` when coverage is under
    ``COVERAGE_COMPLETE_PERCENT``.
    """
    rollups = filter_days(UtilizationRollup.objects.all(), start, end)
    if team is not None:
        rollups = rollups.filter(team=team)
    _, total = utilization_window(rollups, "team", start, end,
                                  scope=(lambda qs: qs.filter(team=team)) if team is not None else None)
    hours = {k: total[k] for k in ("gpu_hours", "observed_gpu_hours", "unobserved_gpu_hours")}
    coverage = None if total["coverage"] is None else round(total["coverage"] * 100, 2)
    missing = ledger_gpu_hours > 0 and total["avg_gpu_util_percent"] is None
    partial = not missing and coverage is not None and coverage < COVERAGE_COMPLETE_PERCENT
    note = ""
    if missing:
        note = "GPU metrics are missing for this period: utilization and idle time are not available."
    elif partial:
        note = f"GPU metrics cover only {coverage}% of the allocated GPU time: utilization figures are incomplete."
    if not missing and abs(hours["gpu_hours"] - ledger_gpu_hours) > 0.001:
        note = (note + " " if note else "") + (
            f"Utilization covers {hours['gpu_hours']} allocated GPU-hours, the ledger {ledger_gpu_hours}: attempts on "
            f"clusters without GPU metrics, whole UTC days of runs crossing the period's edges and accrual not yet "
            f"caught up with running jobs make the difference.")
    return {"avg_gpu_util_percent": total["avg_gpu_util_percent"], "coverage_percent": coverage,
            "allocated_gpu_hours": hours["gpu_hours"], "observed_gpu_hours": hours["observed_gpu_hours"],
            "unobserved_gpu_hours": hours["unobserved_gpu_hours"], "util_metric": total["util_metric"],
            "idle_gpu_hours": None if missing else total["idle_gpu_hours"],
            "idle_percent": None if missing else total["idle_percent"],
            "idle_cost_usd": None if missing else total["idle_cost_usd"],
            "idle_unpriced_gpu_hours": None if missing else total["idle_unpriced_gpu_hours"],
            "idle_unpriced_vcpu_hours": None if missing else total["idle_unpriced_vcpu_hours"],
            "missing": missing, "partial": partial, "note": note}


def _unknown(team: Team | None, end: dt.datetime) -> dict | None:
    """GPU-hours accrued without a price up to the report's end (``costs.unknown``), or None when every cost is known."""
    return unknown_cost_json(unknown_cost(team=team, until=end))


#: The capacity figures a platform report keeps per cluster and in total (``costs.capacity``, as the API shows them).
CAPACITY_FIGURES = ("capacity_gpu_hours", "cordoned_gpu_hours", "allocated_gpu_hours",
                    "uninventoried_allocated_gpu_hours", "unallocated_gpu_hours", "unallocated_cost_usd",
                    "unpriced_unallocated_gpu_hours")
SHARED_IDLE_BASIS = "shared in proportion to allocation per cluster and day, as OpenCost's shareIdle"


def _capacity(start: dt.datetime, end: dt.datetime) -> dict:
    """The fleet's capacity over ``[start, end)`` per cluster and in total, as ``/api/v1/capacity/?group_by=cluster``
    shows it for the same window (``costs.capacity.capacity_report`` through ``with_rounding``: GPU-hours as exact
    strings, USD as cents strings, None where unknown): ``{"by_cluster": [...], "total": {...}}``, the total's
    ``rounding_difference_usd`` kept for the unallocated cost only."""
    rows, total = with_rounding(*capacity_report("cluster", start, end))
    shown = [{"cluster": r["cluster"], **{k: r[k] for k in CAPACITY_FIGURES}} for r in rows]
    whole = {k: total[k] for k in CAPACITY_FIGURES}
    whole["rounding_difference_usd"] = {k: v for k, v in total["rounding_difference_usd"].items()
                                        if k in CAPACITY_FIGURES}
    return {"by_cluster": shown, "total": whole}


def _shared_idle(team: Team, start: dt.datetime, end: dt.datetime) -> dict:
    """``team``'s share of the fleet's unallocated GPU-hours and cost over ``[start, end)``: its row of
    ``capacity_report("team", ...)`` (OpenCost's ``shareIdle``, docs/design.md "Capacity and unallocated"), as
    ``/api/v1/capacity/?group_by=team`` shows it: ``gpu_hours`` (exact string), ``cost_usd`` (cents, None when
    none of it is priced), ``unpriced_gpu_hours`` and the ``basis`` in words. A team that used no cluster has a
    share of 0. Never part of the report's cost totals, which are the team's own ledger."""
    rows, _ = with_rounding(*capacity_report("team", start, end, team_ids={team.pk}))
    row = rows[0] if rows else {"shared_idle_gpu_hours": "0.000000", "shared_idle_cost_usd": usd_cents(Decimal(0)),
                                "unpriced_shared_idle_gpu_hours": "0.000000"}
    return {"gpu_hours": row["shared_idle_gpu_hours"], "cost_usd": row["shared_idle_cost_usd"],
            "unpriced_gpu_hours": row["unpriced_shared_idle_gpu_hours"], "basis": SHARED_IDLE_BASIS}


#: The figures of a serving job a report keeps, from ``jobs.serving_figures.service_figures``.
SERVING_KEYS = ("requests", "requests_per_second", "error_rate_percent", "tokens", "gpu_hours", "unpriced_gpu_hours",
                "gpu_hours_per_million_requests", "usd_per_million_requests", "usd_per_million_tokens")


def _serving(team: Team | None, start: dt.datetime, end: dt.datetime) -> list[dict]:
    """The serving jobs of ``team`` (None: every team) that served within ``[start, end)``, costliest in GPU-hours
    first: ``job``, ``job_name``, ``team``, ``cost_usd`` (the priced part, cents; null when none is priced) and the
    figures of ``SERVING_KEYS`` over the period (``service_figures`` without latency: its ledger entries pro rata
    of their part inside the period, so a job's GPU-hours here may differ from its top-jobs row by the part of an
    entry at the period's edges). USD per million requests is null when any of its GPU-hours has no price."""
    jobs = Job.objects.filter(kind=Job.Kind.INFERENCE, serving_samples__at__gt=start,
                              serving_samples__at__lte=end).select_related("team").distinct()
    if team is not None:
        jobs = jobs.filter(team=team)
    rows = []
    for job in jobs:
        figures = service_figures(job, start, end, detail=False)
        rows.append({"job": job.pk, "job_name": job.name, "team": job.team.slug, "cost_usd": figures["usd"],
                     **{key: figures[key] for key in SERVING_KEYS}})
    return sorted(rows, key=lambda r: (-r["gpu_hours"], r["job"]))


def build_report_data(team: Team | None, start: dt.datetime, end: dt.datetime) -> dict:
    """The numbers of a report for ``team`` (None: every team) over ``[start, end)``, JSON-ready.

    Keys: ``scope``, ``period_start``/``period_end`` (ISO), ``hours`` (period
    length), ``totals`` and ``by_accelerator``/``by_cluster``/``by_day``
    (GPU-hours, USD cents as strings), ``utilization`` (see ``_utilization``),
    ``top_jobs``, ``training_efficiency`` (``costs.reports.efficiency``), ``serving`` (``_serving``: each serving
    job's requests and USD per million requests), ``quota_use``, ``budgets``,
    ``previous`` (the equal-length
    period before, with percent changes; null where the previous value is 0), and the fleet's capacity
    (``capacity``, platform reports: see ``_capacity``) or the team's share of its idle cost (``shared_idle``,
    team reports: see ``_shared_idle``; not in ``totals``).
    """
    scope = (lambda qs: qs.filter(team=team)) if team is not None else None
    by_accelerator, totals = aggregate_window("accelerator", start, end, scope=scope)
    by_cluster, _ = aggregate_window("cluster", start, end, scope=scope)
    by_day, _ = aggregate_window("day", start, end, scope=scope)
    top_jobs = _top_jobs(team, start, end)
    # One rule for every table (docs/design.md, Cost ledger): rows and total each rounded once from their exact
    # sums; what a table's rows miss of the total is said, not hidden by moving a row's cent.
    totals.pop("rounding_difference_usd")  # per table below: the report has several under one total
    rounding = {
        name: rounding_difference(totals["cost_usd"], [r["cost_usd"] for r in rows])
        for name, rows in (("by_accelerator", by_accelerator), ("by_cluster", by_cluster), ("by_day", by_day),
                           ("top_jobs", top_jobs))}
    previous_start = start - (end - start)
    _, previous = _costs(team, "team", previous_start, start)
    hours = (end - start).total_seconds() / 3600
    utilization = _utilization(team, start, end, totals["gpu_hours"])
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
        "utilization": utilization,
        "top_jobs": top_jobs,
        "rounding_difference_usd": rounding,
        "training_efficiency": training_efficiency(_ledger(team, start, end), utilization),
        "serving": _serving(team, start, end),
        "quota_use": _quota_use(team, {r["accelerator"]: r["gpu_hours"] for r in by_accelerator}, hours),
        "budgets": _budgets(team, end),
        "cost_unknown": _unknown(team, end),
        **({"capacity": _capacity(start, end)} if team is None else {"shared_idle": _shared_idle(team, start, end)}),
        "previous": {
            "period_start": previous_start.isoformat(),
            "period_end": start.isoformat(),
            **previous,
            "gpu_hours_change_percent": _percent_change(totals["gpu_hours"], previous["gpu_hours"]),
            # Priced USD against priced USD: with unpriced hours on either side the change says so beside it.
            "cost_change_percent": _percent_change(Decimal(totals["cost_usd"] or 0), Decimal(previous["cost_usd"] or 0)),
        },
    }


def generate_report(team: Team | None, start: dt.datetime, end: dt.datetime, kind: str = Report.Kind.CUSTOM, *,
                    source: str = Report.Source.REQUEST, requested_by=None) -> tuple[Report, bool]:
    """Compute and store the report of ``team`` (None: platform-wide) for ``[start, end)`` (aware datetimes).

    Idempotent per (scope, kind, period): a second run refreshes the stored
    row's numbers (the unique constraints of ``Report`` make a concurrent
    first run find the row that won). ``source`` and ``requested_by`` (a
    user) record what asked for it. Sends no mail (``costs.reports.catchup``
    does, once). Returns ``(report, created)``.
    """
    data = build_report_data(team, start, end)
    with transaction.atomic():
        report, created = Report.objects.select_for_update().update_or_create(
            team=team, kind=kind, period_start=start, period_end=end,
            defaults={"data": data, "html": render_html(data), "csv": render_csv(data), "source": source,
                      "requested_by": requested_by},
        )
    log.info("report %s generated (%s)", report, "new" if created else "refreshed")
    return report, created
