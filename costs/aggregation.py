"""Aggregates of the cost ledger and of the utilization rollups, by team, cluster, accelerator, job or UTC day.

The one implementation behind ``/api/v1/costs/``, ``/api/v1/utilization/``,
the web UI's cost pages and the reports (``costs.reports``).

Cost: ``aggregate_window`` reads the day rollups (``DailyCostRollup`` per
team, cluster and accelerator; ``JobDailyCost`` per job; kept by the
accrual) for the whole UTC days of a window and the ledger only for the
partial days at its edges, each read from the side with less time: the
entries inside the window, or the day's rollups less the entries outside it
(a window ending now: today's rollups, no entries; ``spend.edge_outside``).
So a 30-day query reads ~30 rollup rows per group and at most half a day of
entries per edge, whatever the ledger's length, with the same totals to the last
1e-9 USD as summing the entries (``aggregate_costs``, still used for a
queryset of entries). Aggregation is pushed to the database (GROUP BY); an
entry counts in the window that contains its ``interval_start``, the rule
budgets use. Entries of unknown cost (no price in force) count their
GPU-hours and no USD; every figure carries them beside its USD
(``unpriced_gpu_hours``, ``unpriced_vcpu_hours``, read from the ledger's
unpriced rows), and a figure none of which is priced is null, never 0.

Energy: the kWh the GPUs drew (DCGM's energy counter, per attempt and UTC
day in the rollups; null where not measured, never 0) and their cost at the
cluster's electricity price, a line of its own beside the GPU cost (an
unknown price leaves the cost null and its kWh in ``energy_unpriced_kwh``,
never $0).

Utilization rows aggregate UtilizationRollup exactly: average utilization
is sample weighted (``sum(util_sum) / sum(samples)``), "no data" is null,
coverage is observed over allocated GPU time and the idle share is idle
over observed GPU time (observed time follows Prometheus' lookback:
``costs.prometheus.WindowUsage``). Rollups are per UTC day, so a
window ``[start, end)`` selects whole days: those whose midnight-to-midnight
span starts in ``[floor(start), end)`` (``filter_days``).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal

from django.db.models import Count, DurationField, ExpressionWrapper, F, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from core.money import LEDGER_QUANTUM, rounding_difference, shown_usd, usd_cents
from runners.models import CPU_ACCELERATOR, Cluster

from .catalog import electricity_price_at, electricity_rows
from .models import CostEntry, DailyCostRollup, JobDailyCost
from .spend import (
    edge_outside,
    entries_in,
    exact_seconds,
    first_entry_since,
    gpu_seconds,
    rollups_in,
    utc_midnight,
    window_parts,
)

# Output key -> lookup, per group_by (the ledger and the rollups name them alike; the ledger's "day" is annotated).
GROUP_KEYS = {
    "team": {"team": "team__slug"},
    "cluster": {"cluster": "cluster__name"},
    "accelerator": {"accelerator": "accelerator__name"},
    "job": {"job": "job_id", "job_name": "job__name"},
    "attempt": {"job": "job_id", "attempt": "attempt_id", "attempt_number": "attempt__number"},
    "day": {"day": "day"},
}
# The ledger's keys: the public ones and, inside, per attempt and UTC day (beside the utilization rollups).
LEDGER_KEYS = {**GROUP_KEYS, "attempt_day": {"attempt": "attempt_id", "day": "day"}}
UTC_DAY = TruncDate("interval_start", tzinfo=UTC)
# Summed per (group, milli-GPUs) and multiplied by the GPUs in Python: SQLite cannot multiply a duration in SQL.
HELD_TIME = ExpressionWrapper(F("interval_end") - F("interval_start"), output_field=DurationField())
# The columns ``add_utilization`` puts on cost rows.
UTILIZATION_COLUMNS = ("avg_gpu_util_percent", "observed_gpu_hours", "idle_gpu_hours", "unobserved_gpu_hours",
                       "idle_percent", "coverage_percent", "idle_cost_usd", "idle_unpriced_gpu_hours",
                       "idle_unpriced_vcpu_hours")


def group_order(group: tuple) -> tuple:
    """The sort key of a group key (team slug, job id, day...): numbers in numeric order (job 2 before job 10), other
    values as text after them, None last."""
    return tuple((0, x, "") if isinstance(x, int | float) and not isinstance(x, bool) else
                 (1 if x is not None else 2, 0, str(x)) for x in group)


def _zero() -> list:
    """An empty group: [GPU-seconds, USD (priced), unpriced GPU-seconds, unpriced vCPU-seconds]."""
    return [Decimal(0), Decimal(0), Decimal(0), Decimal(0)]


def _ledger_sums(entries, group_by: str, sums: dict[tuple, list]) -> None:
    """Add ledger ``entries``' [GPU-seconds, USD] per group key of ``group_by`` to ``sums`` (one GROUP BY query)."""
    if group_by in ("day", "attempt_day"):
        entries = entries.annotate(day=UTC_DAY)
    lookups = list(LEDGER_KEYS[group_by].values())
    for part in entries.values(*lookups, "gpu_milli").annotate(held=Sum(HELD_TIME), cost=Sum("amount_usd")).order_by():
        row = sums.setdefault(tuple(part[lookup] for lookup in lookups), _zero())
        row[0] += gpu_seconds(part["gpu_milli"], exact_seconds(part["held"] or dt.timedelta()))
        row[1] += part["cost"] or Decimal(0)


def _unpriced_sums(entries, group_by: str, sums: dict[tuple, list]) -> None:
    """Add the unpriced GPU-seconds and vCPU-seconds of ledger ``entries`` (those without a price in force, the
    marker of ``costs.unknown``) per group key to ``sums``. Reads the unpriced rows only (their partial index)."""
    entries = entries.filter(usd_per_gpu_hour__isnull=True)
    if group_by in ("day", "attempt_day"):
        entries = entries.annotate(day=UTC_DAY)
    lookups = list(LEDGER_KEYS[group_by].values())
    for part in entries.values(*lookups, "gpu_milli", "cpu_milli").annotate(held=Sum(HELD_TIME)).order_by():
        row = sums.setdefault(tuple(part[lookup] for lookup in lookups), _zero())
        held = exact_seconds(part["held"] or dt.timedelta())
        row[2] += gpu_seconds(part["gpu_milli"], held)
        row[3] += Decimal(part["cpu_milli"]) / 1000 * held


def _rollup_sums(rollups, group_by: str, sums: dict[tuple, list]) -> None:
    """Add ``rollups``' (DailyCostRollup, JobDailyCost for jobs) [GPU-seconds, USD] per group key to ``sums``."""
    lookups = list(GROUP_KEYS[group_by].values())
    for part in rollups.values(*lookups).annotate(held=Sum("gpu_seconds"), cost=Sum("cost_usd")).order_by():
        row = sums.setdefault(tuple(part[lookup] for lookup in lookups), _zero())
        row[0] += part["held"] or Decimal(0)
        row[1] += part["cost"] or Decimal(0)


def _edge_from_rollups(narrow, model, day: dt.date, outside, group_by: str, sums: dict[tuple, list]) -> None:
    """Add the [GPU-seconds, USD] of the entries of UTC ``day`` outside the intervals ``outside``
    (``spend.edge_outside``) per group key to ``sums``: the day's rollups (``model``, narrowed by ``narrow``) less the
    entries of ``outside``, exact. A group keeps a row only where an entry is left (the rollups' ``entries`` less
    those read), as when the edge's entries are summed (``_ledger_sums``)."""
    lookups = list(GROUP_KEYS[group_by].values())
    edge: dict[tuple, list] = {}
    for part in narrow(model.objects.filter(day=day)).values(*lookups).annotate(
            held=Sum("gpu_seconds"), cost=Sum("cost_usd"), n=Sum("entries")).order_by():
        row = edge.setdefault(tuple(part[lookup] for lookup in lookups), [Decimal(0), Decimal(0), 0])
        row[0] += part["held"] or Decimal(0)
        row[1] += part["cost"] or Decimal(0)
        row[2] += part["n"] or 0
    for lo, hi in outside:
        entries = entries_in(narrow(CostEntry.objects.all()), lo, hi)
        if group_by == "day":
            entries = entries.annotate(day=UTC_DAY)
        for part in entries.values(*lookups, "gpu_milli").annotate(
                held=Sum(HELD_TIME), cost=Sum("amount_usd"), n=Count("pk")).order_by():
            row = edge.setdefault(tuple(part[lookup] for lookup in lookups), [Decimal(0), Decimal(0), 0])
            row[0] -= gpu_seconds(part["gpu_milli"], exact_seconds(part["held"] or dt.timedelta()))
            row[1] -= part["cost"] or Decimal(0)
            row[2] -= part["n"]
    for key, (held, cost, n) in edge.items():
        if n > 0:
            row = sums.setdefault(key, _zero())
            row[0] += held
            row[1] += cost


def hours(seconds: Decimal | float) -> float:
    """Seconds (of GPUs or vCPUs) as hours, a float to 6 decimals: how the API shows GPU- and vCPU-hours."""
    return round(float(seconds) / 3600, 6)


def money(usd: Decimal, unpriced_gpu_seconds: Decimal, unpriced_vcpu_seconds: Decimal, key: str = "cost_usd",
          prefix: str = "") -> dict:
    """A shown money figure and the hours it leaves out: ``{key: cents or None, prefix + "unpriced_gpu_hours",
    prefix + "unpriced_vcpu_hours"}``. ``usd`` is the exact priced sum; the figure is None ("unknown") when it is
    0 and unpriced hours exist (``core.money.shown_usd``), so no cost nobody knows reads as $0."""
    gpu_h, vcpu_h = hours(unpriced_gpu_seconds), hours(unpriced_vcpu_seconds)
    return {key: shown_usd(usd, gpu_h + vcpu_h), f"{prefix}unpriced_gpu_hours": gpu_h,
            f"{prefix}unpriced_vcpu_hours": vcpu_h}


def present_sums(sums: dict[tuple, list], group_by: str) -> tuple[list[dict], dict]:
    """Rows ordered by key and the exact total, each rounded once from its exact sum (see ``aggregate_costs``);
    the total's ``rounding_difference_usd`` says by how much the shown rows miss it (docs/design.md, Cost ledger)."""
    keys = GROUP_KEYS[group_by]
    results = []
    for key in sorted(sums):
        seconds, cost, unpriced_gpu, unpriced_vcpu = sums[key]
        row = dict(zip(keys, key, strict=True))
        if group_by == "day":
            row["day"] = row["day"].isoformat()
        row.update(gpu_hours=hours(seconds), **money(cost, unpriced_gpu, unpriced_vcpu))
        results.append(row)
    total = [sum((v[i] for v in sums.values()), Decimal(0)) for i in range(4)]
    shown = {"gpu_hours": hours(total[0]), **money(*total[1:])}
    shown["rounding_difference_usd"] = rounding_difference(shown["cost_usd"], [r["cost_usd"] for r in results])
    return results, shown


def aggregate_costs(entries, group_by: str) -> tuple[list[dict], dict]:
    """Group ledger ``entries`` (a CostEntry queryset) by ``group_by``; returns ``(rows, total)``.

    Each row holds the group's key fields (see ``GROUP_KEYS``), ``gpu_hours``
    (float), ``cost_usd`` (string, cents, half-even; null when none of it is
    priced) and ``unpriced_gpu_hours``/``unpriced_vcpu_hours`` (accrued with
    no price in force, not in ``cost_usd``); rows are ordered by key. The
    total is the exact sum of all entries, rounded once. Raises KeyError for
    a ``group_by`` not in ``GROUP_KEYS``.
    """
    sums: dict[tuple, list] = {}
    _ledger_sums(entries, group_by, sums)
    _unpriced_sums(entries, group_by, sums)
    return present_sums(sums, group_by)


def gpu_priced(qs):
    """``qs`` (CostEntry, DailyCostRollup or JobDailyCost rows) without those of the CPU flavor: what is priced per
    GPU-hour. A CPU node pool bills vCPU and GiB-hours (``usd_per_gpu_hour`` 0); a GPU pool's price includes its
    host (``costs.models.Price``), so the rest is the GPU-priced part of the ledger's cost."""
    return qs.exclude(**{("job__accelerator__name" if qs.model is JobDailyCost else "accelerator__name"):
                         CPU_ACCELERATOR})


def window_sums(group_by: str, start: dt.datetime | None, end: dt.datetime | None, *, scope=None,
                team_slug: str | None = None, gpus_only: bool = False, edges: str = "auto") -> dict[tuple, list]:
    """Exact ``[GPU-seconds, USD]`` per group key of ``group_by`` over ``[start, end)`` (None: open).

    Whole UTC days from the rollups, partial edge days from the ledger
    (``costs.spend.window_parts``): an edge day's entries inside the window,
    or its rollups less its entries outside the window where those span less
    time up to now (``costs.spend.edge_outside``, whose ``edges`` this
    passes; the sums are the same either way). ``scope`` narrows a queryset with a
    ``team`` field (e.g. ``lambda qs: scope_to_teams(qs, user)``); ``team_slug``
    keeps one team; ``gpus_only`` keeps the GPU-priced rows (``gpu_priced``). Raises KeyError for a ``group_by``
    not in ``GROUP_KEYS``.
    """
    GROUP_KEYS[group_by]  # noqa: B018  (KeyError before any query)
    edge_outside(None, None, timezone.now(), edges)  # ValueError for an unknown reading before any query

    def narrow(qs):
        qs = scope(qs) if scope is not None else qs
        qs = gpu_priced(qs) if gpus_only else qs
        return qs.filter(team__slug=team_slug) if team_slug else qs

    sums: dict[tuple, list] = {}
    if group_by == "attempt":  # no rollup per attempt: the ledger itself (an attempt's rows are few)
        _ledger_sums(entries_in(narrow(CostEntry.objects.all()), start, end), group_by, sums)
        _unpriced_sums(entries_in(narrow(CostEntry.objects.all()), start, end), group_by, sums)
        return sums
    parts = window_parts(start, end)
    model = JobDailyCost if group_by == "job" else DailyCostRollup
    if parts.has_days:
        _rollup_sums(rollups_in(narrow(model.objects.all()), parts), group_by, sums)
    # The job-day rollups leave out the CPU flavor by the job's accelerator, the ledger by the entry's: read the
    # edges of GPU-priced costs by job from the entries alone.
    now = timezone.now()
    for lo, hi in parts.edges:
        outside = None if gpus_only and group_by == "job" else edge_outside(
            lo, hi, now, edges, first_entry_since(lo) if edges == "auto" and lo is not None else None)
        if outside is None:
            _ledger_sums(entries_in(narrow(CostEntry.objects.all()), lo, hi), group_by, sums)
        else:
            _edge_from_rollups(narrow, model, lo.astimezone(UTC).date(), outside, group_by, sums)
    # The unpriced part straight from the ledger's unpriced rows (few, with their own index): vCPU-seconds too.
    _unpriced_sums(entries_in(narrow(CostEntry.objects.all()), start, end), group_by, sums)
    return sums


def aggregate_window(group_by: str, start: dt.datetime | None, end: dt.datetime | None, *, scope=None,
                     team_slug: str | None = None, gpus_only: bool = False,
                     edges: str = "auto") -> tuple[list[dict], dict]:
    """Costs by ``group_by`` over ``[start, end)``: ``(rows, total)`` as ``aggregate_costs`` gives for the entries
    whose ``interval_start`` lies in the window, read from the rollups and the edge days (``window_sums``; its
    ``gpus_only`` keeps the GPU-priced part; ``edges`` as ``costs.spend.edge_outside``)."""
    return present_sums(window_sums(group_by, start, end, scope=scope, team_slug=team_slug, gpus_only=gpus_only,
                                    edges=edges), group_by)


def add_utilization(rows: list[dict], total: dict, rollups, group_by: str) -> None:
    """Add the utilization columns (``UTILIZATION_COLUMNS``) of each group to the cost rows, in place.

    ``rows`` and ``total`` are what ``aggregate_costs`` returned for the same
    ``group_by``; ``rollups`` a UtilizationRollup queryset (already narrowed
    with ``filter_days``). Utilization comes from day rollups, so for a window
    that cuts a UTC day it covers the whole day; a group without rollups gets
    nulls ("no data").
    """
    util_rows, util_total = aggregate_utilization(rollups, group_by)
    keys = list(GROUP_KEYS[group_by])
    by_key = {tuple(r[k] for k in keys): r for r in util_rows}
    for row in rows:
        found = by_key.get(tuple(row[k] for k in keys), {})
        row.update({c: found.get(c) for c in UTILIZATION_COLUMNS})
    total.update({c: util_total[c] if util_rows else None for c in UTILIZATION_COLUMNS})


ENERGY_COLUMNS = ("energy_kwh", "energy_cost_usd", "energy_unpriced_kwh")


def energy_sums(rollups, group_by: str) -> dict:
    """Exact ``[kWh, USD, kWh without a price]`` per group key of ``group_by`` (and the total under None) of the
    UtilizationRollup queryset ``rollups`` whose energy was measured; groups without any are absent.

    A rollup's kWh are priced at the cluster's electricity price in force at
    the start of the attempt's piece of that UTC day (``catalog.electricity_price_at``),
    rounded half-even to 1e-9 USD; with no price in force they count as
    unpriced. Two queries for the prices, one for the rollups.
    """
    keys = list(GROUP_KEYS[group_by].values())
    found = list(rollups.filter(energy_kwh__isnull=False).values(
        *keys, "day", "cluster_id", "energy_kwh", "attempt__started_at").order_by())
    prices = electricity_rows(Cluster.objects.filter(pk__in={r["cluster_id"] for r in found}))
    sums: dict = {}
    for r in found:
        piece_start = max(utc_midnight(r["day"]), r["attempt__started_at"])
        price = electricity_price_at(prices[r["cluster_id"]], piece_start)
        kwh = Decimal(repr(r["energy_kwh"]))
        usd = None if price is None else (kwh * price).quantize(LEDGER_QUANTUM, ROUND_HALF_EVEN)
        key = tuple(r[k].isoformat() if k == "day" else r[k] for k in keys)
        for group in (key, None):
            s = sums.setdefault(group, [Decimal(0), Decimal(0), Decimal(0)])
            s[0] += kwh
            s[1] += usd or 0
            s[2] += kwh if usd is None else 0
    return sums


def _present_energy(s: list | None) -> dict:
    if s is None:
        return dict.fromkeys(ENERGY_COLUMNS)
    kwh, usd, unpriced = s
    return {"energy_kwh": round(float(kwh), 6), "energy_cost_usd": usd_cents(usd) if unpriced < kwh else None,
            "energy_unpriced_kwh": round(float(unpriced), 6)}


def add_energy(rows: list[dict], total: dict, rollups, group_by: str) -> None:
    """Add ``ENERGY_COLUMNS`` to the cost ``rows`` and ``total`` of ``group_by``, in place: ``energy_kwh`` (null:
    not measured), ``energy_cost_usd`` (cents; null when no measured kWh has a price) and ``energy_unpriced_kwh``.

    ``rollups``: a UtilizationRollup queryset narrowed with ``filter_days``
    (energy comes from day rollups, so a window that cuts a UTC day counts
    the whole day). Never folded into ``cost_usd``.
    """
    sums = energy_sums(rollups, group_by)
    keys = list(GROUP_KEYS[group_by])
    for row in rows:
        row.update(_present_energy(sums.get(tuple(row[k] for k in keys))))
    total.update(_present_energy(sums.get(None)))


def filter_days(rollups, start: dt.datetime | None, end: dt.datetime | None):
    """Rollups (a UtilizationRollup queryset) of the UTC days that start in ``[floor(start), end)``.

    ``start`` and ``end`` are aware datetimes; None leaves that end open.
    """
    if start is not None:
        rollups = rollups.filter(day__gte=start.astimezone(UTC).date())
    if end is not None:
        end = end.astimezone(UTC)
        last = end.date() if end.time() != dt.time() else end.date() - dt.timedelta(days=1)
        rollups = rollups.filter(day__lte=last)
    return rollups


def idle_costs(rollups) -> dict[int, tuple[Decimal, float]]:
    """Per rollup id: ``(USD, unpriced GPU-seconds)`` of its idle GPU time, the ledger of its attempt on its day
    (priced USD; GPU-seconds accrued without a price) x the idle share of its allocation.

    ``rollups`` is a UtilizationRollup queryset; rollups without idle time
    are left out. Two queries.
    """
    rows = list(rollups.filter(idle_gpu_seconds__gt=0).values("pk", "attempt_id", "day", "gpu_seconds", "idle_gpu_seconds"))
    if not rows:
        return {}
    first, last = min(r["day"] for r in rows), max(r["day"] for r in rows)
    entries = CostEntry.objects.filter(attempt_id__in={r["attempt_id"] for r in rows},
                                       interval_start__gte=utc_midnight(first),
                                       interval_start__lt=utc_midnight(last + dt.timedelta(days=1)))
    ledger: dict[tuple, list] = {}
    _ledger_sums(entries, "attempt_day", ledger)
    _unpriced_sums(entries, "attempt_day", ledger)
    found = {}
    for r in rows:
        _, usd, unpriced, _ = ledger.get((r["attempt_id"], r["day"]), _zero())
        share = r["idle_gpu_seconds"] / r["gpu_seconds"]
        found[r["pk"]] = (usd * Decimal(share), float(unpriced) * share)
    return found


SUMMED = ("gpu_seconds", "observed_gpu_seconds", "samples", "expected_samples", "util_sum", "memory_samples")


def _present(s: dict) -> dict:
    observed = s["observed_gpu_seconds"] > 0
    coverage = min(1.0, s["observed_gpu_seconds"] / s["gpu_seconds"]) if s["gpu_seconds"] else None
    return {
        "gpu_hours": round(s["gpu_seconds"] / 3600, 6),
        "observed_gpu_hours": round(s["observed_gpu_seconds"] / 3600, 6),
        "idle_gpu_hours": round(s["idle_gpu_seconds"] / 3600, 6) if observed else None,
        "unobserved_gpu_hours": round(max(0.0, s["gpu_seconds"] - s["observed_gpu_seconds"]) / 3600, 6),
        "idle_percent": round(100 * s["idle_gpu_seconds"] / s["observed_gpu_seconds"], 2) if observed else None,
        "avg_gpu_util_percent": round(s["util_sum"] / s["samples"], 3) if s["samples"] else None,
        "coverage": None if coverage is None else round(coverage, 4),
        "coverage_percent": None if coverage is None else round(100 * coverage, 2),
        "avg_memory_used_mib": round(s["memory_sum"] / s["memory_samples"], 1) if s["memory_samples"] else None,
        **(money(s["idle_usd"], s["idle_unpriced_gpu_seconds"], Decimal(0), "idle_cost_usd", "idle_") if observed
           else {"idle_cost_usd": None, "idle_unpriced_gpu_hours": None, "idle_unpriced_vcpu_hours": None}),
        "util_metric": ("mixed" if len(s["metrics"]) > 1 else next(iter(s["metrics"]))) if s["metrics"] else None,
    }


def aggregate_utilization(rollups, group_by: str) -> tuple[list[dict], dict]:
    """Group UtilizationRollup rows by ``group_by`` (``GROUP_KEYS``); returns ``(rows, total)``.

    Each row: key fields, ``gpu_hours`` (allocated), ``observed_gpu_hours``,
    ``idle_gpu_hours``, ``unobserved_gpu_hours`` (allocated - observed),
    ``idle_percent`` (idle share of the observed GPU time, percent),
    ``avg_gpu_util_percent`` (sample weighted), ``coverage`` (observed /
    allocated GPU time, 0-1) and ``coverage_percent`` (the same in percent),
    ``avg_memory_used_mib``, ``idle_cost_usd`` (cents; null when none of it
    is priced) with ``idle_unpriced_gpu_hours``/``idle_unpriced_vcpu_hours``
    (idle GPU-hours accrued without a price), ``util_metric`` (the
    DCGM counter read, ``mixed`` or null). Without any observed time the idle
    figures are null, without any sample the averages ("no data"), never 0. Rows are ordered by
    key. Raises KeyError for a ``group_by`` not in ``GROUP_KEYS``.
    """
    keys = GROUP_KEYS[group_by]
    idle_usd = idle_costs(rollups)

    sums: dict = defaultdict(_unseen)
    for r in rollups.values("pk", *keys.values(), *SUMMED, "avg_memory_used_mib", "idle_gpu_seconds", "util_metric"):
        for group in (tuple(r[k] for k in keys.values()), None):
            s = sums[group]
            for f in SUMMED:
                s[f] += r[f]
            s["memory_sum"] += (r["avg_memory_used_mib"] or 0) * r["memory_samples"]
            s["idle_gpu_seconds"] += r["idle_gpu_seconds"] or 0
            usd, unpriced = idle_usd.get(r["pk"], (Decimal(0), 0.0))
            s["idle_usd"] += usd
            s["idle_unpriced_gpu_seconds"] += unpriced
            if r["util_metric"]:
                s["metrics"].add(r["util_metric"])
    rows = []
    for group in sorted((g for g in sums if g is not None), key=group_order):
        row = dict(zip(keys, group, strict=True))
        if group_by == "day":
            row["day"] = row["day"].isoformat()
        row.update(_present(sums[group]))
        rows.append(row)
    return rows, _present(sums[None])


def day_window(start: dt.datetime | None, end: dt.datetime | None) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The whole UTC days ``filter_days`` selects for ``[start, end)``, as instants ``[first midnight, last + 1)``."""
    lo = utc_midnight(start.astimezone(UTC).date()) if start is not None else None
    if end is None:
        return lo, None
    end = end.astimezone(UTC)
    try:
        return lo, utc_midnight(end.date()) + (dt.timedelta(days=1) if end.time() != dt.time() else dt.timedelta())
    except OverflowError:  # a window open to the last representable day
        return lo, None


def utilization_window(rollups, group_by: str, start: dt.datetime | None, end: dt.datetime | None, *, scope=None,
                       team_slug: str | None = None, job_id: int | None = None) -> tuple[list[dict], dict]:
    """``aggregate_utilization`` of ``rollups`` (already narrowed like the ledger: scope, team, job, days) with the
    allocation taken from the ledger: ``gpu_hours`` is the GPU-hours billed over the same whole UTC days (the
    figure the costs show), ``unobserved_gpu_hours`` what of it no DCGM sample covers. A group the ledger bills and
    Prometheus never saw (no Prometheus at all, a cluster without DCGM) is a row with its GPU-hours, all of them
    unobserved, and nulls for the averages ("no data"), never 0 GPU-hours; a group that billed no GPU-hour and
    whose rollups hold no GPU time either (CPU-only jobs alone, single-role or multi-role, whether or not a
    collection wrote them a rollup of 0 GPU-seconds: ``holds_gpu_time``) is no row. The unobserved cost is a share of the GPU-priced part of the
    ledger's cost only (``gpu_priced``): the vCPU and GiB-hours of CPU-only jobs in the same team, cluster or day
    are no GPU-hours and are not in it. Arguments as ``window_sums``; ``job_id`` keeps one job (read from its
    ledger entries)."""
    rows, total = aggregate_utilization(rollups, group_by)
    rows = [row for row in rows if holds_gpu_time(row)]
    lo, hi = day_window(start, end)
    if job_id is not None:
        entries = gpu_priced(entries_in(CostEntry.objects.filter(job_id=job_id), lo, hi))
        billed, billed_total = aggregate_costs(scope(entries) if scope is not None else entries, group_by)
    else:
        billed, billed_total = aggregate_window(group_by, lo, hi, scope=scope, team_slug=team_slug, gpus_only=True)
    keys = list(GROUP_KEYS[group_by])
    by_key = {tuple(r[k] for k in keys): r for r in rows}
    for ledger_row in billed:
        key = tuple(ledger_row[k] for k in keys)
        row = by_key.get(key)
        if row is None:
            if not ledger_row["gpu_hours"]:  # billed no GPU-hour (a CPU-only job's group): no GPU to utilize
                continue
            row = by_key[key] = {**{k: ledger_row[k] for k in keys}, **_present(_unseen())}
        billed_share(row, ledger_row)
    for row in by_key.values():
        row.setdefault("unobserved_cost_usd", None)
    total["unobserved_cost_usd"] = None
    if billed:
        billed_share(total, billed_total)
    return sorted(by_key.values(), key=lambda r: group_order(tuple(r[k] for k in keys))), total


def holds_gpu_time(row: dict) -> bool:
    """Whether a row of ``aggregate_utilization`` says anything of GPUs: allocated or observed GPU-hours, or a
    utilization or memory average. False for the rollups of CPU-only attempts (0 GPUs x their running time, no
    DCGM series), which a collection may or may not have written depending on when it ran: their group is a row
    only if the ledger billed it GPU-hours (``utilization_window``)."""
    return bool(row["gpu_hours"] or row["observed_gpu_hours"] or row["avg_gpu_util_percent"] is not None
                or row["avg_memory_used_mib"] is not None)


def billed_share(row: dict, ledger_row: dict) -> None:
    """Put the ledger's billed GPU-hours of a group (``ledger_row``, a row of ``aggregate_costs`` over the GPU-priced
    ledger rows only, ``gpu_priced``: its ``cost_usd`` is what the GPU-hours cost) on its utilization ``row``, in
    place: ``gpu_hours``, ``unobserved_gpu_hours`` (billed minus observed) and ``unobserved_cost_usd``
    (``coverage`` stays that of the rolled-up attempts' time)."""
    row["gpu_hours"] = ledger_row["gpu_hours"]
    row["unobserved_gpu_hours"] = round(max(0.0, row["gpu_hours"] - row["observed_gpu_hours"]), 6)
    row["unobserved_cost_usd"] = unobserved_cost(ledger_row["cost_usd"], row)


def unobserved_cost(cost_usd: str | None, row: dict) -> str | None:
    """The USD (cents, half-even) of a utilization ``row``'s unobserved GPU-hours: the GPU-priced part of its ledger
    cost, ``cost_usd`` (cents as a string; None: unknown; ``gpu_priced``) times the unobserved share of its billed ``gpu_hours``. None when the
    cost is unknown or nothing was billed in GPU-hours."""
    if cost_usd is None or not row["gpu_hours"]:
        return None
    share = Decimal(repr(row["unobserved_gpu_hours"])) / Decimal(repr(row["gpu_hours"]))
    return usd_cents(Decimal(cost_usd) * share)


def _unseen() -> dict:
    """The sums of a group without any utilization rollup."""
    return {**dict.fromkeys(SUMMED, 0.0), "memory_sum": 0.0, "idle_gpu_seconds": 0.0, "idle_usd": Decimal(0),
            "idle_unpriced_gpu_seconds": 0.0, "metrics": set()}
