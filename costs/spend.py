"""Spend read from the running totals: what admission, budget status and cost queries need, in constant time.

Reads the ledger's totals (``DailyCostRollup``, ``TeamSpend``, kept by
``costs.ledger`` in the transaction that writes the entries) and, for the
partial UTC days at a window's edges only, the entries themselves; never the
entries of whole days, so a figure costs the same after a month of history
as after an hour. It reads models only, so admission (in ``jobs``) can use
it without importing the accrual code above it.

Rule (the costs API's and the budgets'): an entry counts in the window that
contains its ``interval_start``. Entries never cross a UTC hour boundary
(``ENTRY_SPAN``), so a window on whole hours holds exactly the spend inside
it.

Unknown cost: GPU-seconds accrued with no price in force count at the
highest price the catalog knows for their accelerator
(``unpriced_bound_usd``), so a block budget cannot be overrun by a cluster
without a price; ``unpriced_usage`` tells per job and team how many
GPU-hours have an unknown cost and since when.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal

from django.db.models import Max, Q, Sum

from core.gpus import MILLI_PER_GPU
from core.money import LEDGER_QUANTUM
from core.sql import as_decimal, fetch, placeholders

from .models import CostEntry, DailyCostRollup, Price, TeamSpend

#: The longest a ledger entry lasts: accrual cuts entries at every UTC hour (``costs.ledger``).
ENTRY_SPAN = dt.timedelta(hours=1)


def exact_seconds(delta: dt.timedelta) -> Decimal:
    """A timedelta as an exact Decimal number of seconds (microsecond resolution)."""
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / Decimal(1_000_000)


def gpu_seconds(gpu_milli: int, seconds: Decimal) -> Decimal:
    """GPU-seconds of ``gpu_milli`` milli-GPUs (``CostEntry.gpu_milli``) held ``seconds`` seconds (exact Decimal):
    a quarter of one GPU for an hour is 900 (ADR 0040)."""
    return gpu_milli * seconds / MILLI_PER_GPU


def utc_midnight(day: dt.date) -> dt.datetime:
    """The start of UTC day ``day``, an aware datetime."""
    return dt.datetime(day.year, day.month, day.day, tzinfo=UTC)


def day_bounds(start_day: dt.date | None, end_day: dt.date | None) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The instants ``[from, to)`` that hold the UTC days ``[start_day, end_day]``: the start of ``start_day`` and
    of the day after ``end_day``, aware datetimes; an open side (``None``) stays ``None``."""
    return (utc_midnight(start_day) if start_day else None,
            utc_midnight(end_day + dt.timedelta(days=1)) if end_day else None)


def entries_starting_on(entries, start_day: dt.date | None, end_day: dt.date | None):
    """``entries`` (a ledger QuerySet) narrowed to those whose ``interval_start`` falls on the UTC days
    ``[start_day, end_day]``; an open side (``None``) is not bounded."""
    lo, hi = day_bounds(start_day, end_day)
    if lo:
        entries = entries.filter(interval_start__gte=lo)
    if hi:
        entries = entries.filter(interval_start__lt=hi)
    return entries


def sql_entries_starting_on(start_day: dt.date | None, end_day: dt.date | None, column: str = "interval_start"
                            ) -> tuple[list[str], list[dt.datetime]]:
    """The same bounds as ``entries_starting_on`` for raw SQL: ``(clauses, params)``, each clause on ``column``
    with one ``%s`` placeholder, ``params`` in the clauses' order; both empty when neither side is bounded."""
    clauses, params = [], []
    for op, bound in zip((">=", "<"), day_bounds(start_day, end_day), strict=True):
        if bound:
            clauses.append(f"{column} {op} %s")
            params.append(bound)
    return clauses, params


def rows_of_days(rows, start_day: dt.date | None, end_day: dt.date | None):
    """``rows`` (a QuerySet of a model with a ``day`` date field) narrowed to the days ``[start_day, end_day]``;
    an open side (``None``) is not bounded."""
    if start_day:
        rows = rows.filter(day__gte=start_day)
    if end_day:
        rows = rows.filter(day__lte=end_day)
    return rows


@dataclasses.dataclass(frozen=True)
class WindowParts:
    """A window ``[start, end)`` split into whole UTC days ``[first_day, end_day)`` and partial edge intervals.

    ``first_day``/``end_day`` None: open on that side (every day before /
    after); ``edges`` are ``(lo, hi)`` instants whose entries come from the
    ledger. No whole day when ``first_day >= end_day`` (then ``edges`` hold
    the whole window).
    """

    first_day: dt.date | None
    end_day: dt.date | None
    edges: tuple[tuple[dt.datetime | None, dt.datetime | None], ...]

    @property
    def has_days(self) -> bool:
        return self.first_day is None or self.end_day is None or self.first_day < self.end_day


def window_parts(start: dt.datetime | None, end: dt.datetime | None) -> WindowParts:
    """Split ``[start, end)`` (aware datetimes; None: open) into whole UTC days and partial edge intervals."""
    start = start.astimezone(UTC) if start is not None else None
    end = end.astimezone(UTC) if end is not None else None
    first = None if start is None else (start.date() if start == utc_midnight(start.date())
                                        else start.date() + dt.timedelta(days=1))
    last = None if end is None else end.date()
    if first is not None and last is not None and first >= last:
        return WindowParts(first, last, ((start, end),) if start < end else ())
    edges = []
    if start is not None and start < utc_midnight(first):
        edges.append((start, utc_midnight(first)))
    if end is not None and utc_midnight(last) < end:
        edges.append((utc_midnight(last), end))
    return WindowParts(first, last, tuple(edges))


def rollups_in(rollups, parts: WindowParts):
    """``rollups`` (a DailyCostRollup queryset) narrowed to the whole days of ``parts``."""
    if parts.first_day is not None:
        rollups = rollups.filter(day__gte=parts.first_day)
    if parts.end_day is not None:
        rollups = rollups.filter(day__lt=parts.end_day)
    return rollups


def edge_outside(lo: dt.datetime | None, hi: dt.datetime | None, now: dt.datetime, edges: str = "auto",
                 since: dt.datetime | None = None) -> tuple[tuple[dt.datetime, dt.datetime], ...] | None:
    """How to read the edge interval ``[lo, hi)`` of a window (``WindowParts.edges``): None to read its entries, or
    the parts of its UTC day outside it, ``((midnight, lo), (hi, next midnight))`` less the empty ones, to read it
    as that day's rollups less the entries of those parts (the same sums: an entry counts on the day of its
    ``interval_start``, and the rollups hold exactly the day's entries, ``costs.rollups``).

    ``edges``: ``"entries"`` or ``"rollups"`` force the reading (of an edge inside one UTC day; an open or
    longer edge is always read from its entries), ``"auto"`` takes the side with less time in which the ledger
    can hold entries: time from ``since`` (the first entry's start on or after the day's midnight,
    ``first_entry_since``; None: the midnight) up to ``now`` (an aware datetime; accrual writes nothing later),
    so the partial day of a window ending now is read from its rollups, not from a day of entries. Raises
    ValueError for another ``edges``.
    """
    if edges not in ("auto", "entries", "rollups"):
        raise ValueError(f"edges must be 'auto', 'entries' or 'rollups', not {edges!r}")
    if lo is None or hi is None or edges == "entries":
        return None
    day = lo.astimezone(UTC).date()
    if day == dt.date.max:  # no following midnight to bound the day by
        return None
    midnight = utc_midnight(day)
    following = midnight + dt.timedelta(days=1)
    if hi > following:
        return None
    outside = tuple((a, b) for a, b in ((midnight, lo), (hi, following)) if a < b)
    if edges == "rollups":
        return outside
    zero, since = dt.timedelta(), max(since or midnight, midnight)
    inside_time = max(zero, min(hi, now) - max(lo, since))
    outside_time = sum((max(zero, min(b, now) - max(a, since)) for a, b in outside), zero)
    return outside if outside_time < inside_time else None


def first_entry_since(lo: dt.datetime) -> dt.datetime | None:
    """The start of the ledger's first entry starting at or after the UTC midnight of ``lo``'s day (None: there is
    none): before it the day holds no entries (``edge_outside``'s ``since``). One probe of the ``interval_start``
    index."""
    midnight = utc_midnight(lo.astimezone(UTC).date())
    return CostEntry.objects.filter(interval_start__gte=midnight).order_by("interval_start").values_list(
        "interval_start", flat=True).first()


def entries_in(entries, lo: dt.datetime | None, hi: dt.datetime | None):
    """``entries`` (a CostEntry queryset) with ``interval_start`` in ``[lo, hi)`` (None: open)."""
    if lo is not None:
        entries = entries.filter(interval_start__gte=lo)
    if hi is not None:
        entries = entries.filter(interval_start__lt=hi)
    return entries


@dataclasses.dataclass
class Spend:
    """A team's spend in a window: priced USD and GPU-seconds of unknown cost per accelerator id."""

    cost_usd: Decimal = Decimal(0)
    unpriced_gpu_seconds: dict[int, Decimal] = dataclasses.field(default_factory=lambda: defaultdict(Decimal))
    unpriced_vcpu_seconds: Decimal = Decimal(0)

    @property
    def unpriced_gpu_hours(self) -> Decimal:
        return sum(self.unpriced_gpu_seconds.values(), Decimal(0)) / 3600

    @property
    def unpriced_vcpu_hours(self) -> Decimal:
        """vCPU-hours accrued without a price (CPU node pools)."""
        return self.unpriced_vcpu_seconds / 3600


def period_spend(team_ids, start: dt.datetime, end: dt.datetime) -> dict[int, Spend]:
    """Spend of each team in ``team_ids`` with ``interval_start`` in ``[start, end)``; team id -> Spend.

    One statement on the rollups of the whole days (``core.sql``: admission
    and budget status repeat it) and one or two queries on the ledger's
    partial edge days (plus one for unknown-cost rows there), and one on the
    window's unknown-cost rows of CPU pools (their vCPU-seconds, index
    ``costentry_unpriced``), for any number of teams. Every team asked for has
    an entry.
    """
    team_ids = list(team_ids)
    found = {t: Spend() for t in team_ids}
    if not team_ids:
        return found
    parts = window_parts(start, end)
    if parts.has_days:
        bounds = [(c, d) for c, d in (("day >= %s", parts.first_day), ("day < %s", parts.end_day)) if d is not None]
        for team_id, acc, cost, unpriced in fetch(
                f'SELECT team_id, accelerator_id, SUM(cost_usd), SUM(unpriced_gpu_seconds) '
                f'FROM "{DailyCostRollup._meta.db_table}" WHERE team_id IN ({placeholders(len(team_ids))})'
                + "".join(f" AND {c}" for c, _ in bounds) + " GROUP BY team_id, accelerator_id",
                [*team_ids, *(d for _, d in bounds)]):
            found[team_id].cost_usd += as_decimal(cost, 9) or 0
            unpriced = as_decimal(unpriced, 9)
            if unpriced:
                found[team_id].unpriced_gpu_seconds[acc] += unpriced
    for lo, hi in parts.edges:
        edge = entries_in(CostEntry.objects.filter(team_id__in=team_ids), lo, hi)
        for team_id, cost in edge.order_by().values_list("team_id").annotate(c=Sum("amount_usd")):
            found[team_id].cost_usd += cost or 0
        for team_id, acc, milli, lo_, hi_ in edge.filter(usd_per_gpu_hour__isnull=True).values_list(
                "team_id", "accelerator_id", "gpu_milli", "interval_start", "interval_end"):
            found[team_id].unpriced_gpu_seconds[acc] += gpu_seconds(milli, exact_seconds(hi_ - lo_))
    cpu = entries_in(CostEntry.objects.filter(team_id__in=team_ids, usd_per_gpu_hour__isnull=True, cpu_milli__gt=0),
                     start, end)
    for team_id, milli, lo_, hi_ in cpu.values_list("team_id", "cpu_milli", "interval_start", "interval_end"):
        found[team_id].unpriced_vcpu_seconds += Decimal(milli) / 1000 * exact_seconds(hi_ - lo_)
    return found


def highest_prices() -> dict[int, Decimal]:
    """Accelerator id -> the highest USD per GPU-hour of any catalog row or override, at any time (one query)."""
    return dict(Price.objects.order_by().values_list("accelerator_id").annotate(m=Max("usd_per_gpu_hour")))


def unpriced_bound_usd(spend: Spend, prices: dict[int, Decimal] | None = None) -> Decimal:
    """USD at which ``spend``'s unknown-cost GPU-seconds count against a budget: each accelerator's at its
    highest catalog price (``highest_prices``; an accelerator the catalog never priced at the highest price of
    the whole catalog), ``GPU-seconds / 3600 x USD per GPU-hour`` rounded to 1e-9 half even."""
    if not spend.unpriced_gpu_seconds:
        return Decimal(0)
    prices = highest_prices() if prices is None else prices
    fallback = max(prices.values(), default=Decimal(0))
    total = sum((seconds * prices.get(acc, fallback) / 3600 for acc, seconds in spend.unpriced_gpu_seconds.items()),
                Decimal(0))
    return total.quantize(LEDGER_QUANTUM, ROUND_HALF_EVEN)


def ledger_usd(team_id: int, start: dt.datetime, end: dt.datetime) -> Decimal:
    """Priced USD of the team's ledger entries with ``interval_start`` in ``[start, end)`` (``period_spend``)."""
    return period_spend([team_id], start, end)[team_id].cost_usd


def ledger_usd_prorated(team_id: int, start: dt.datetime, end: dt.datetime) -> Decimal:
    """Priced USD the team's ledger accrued inside ``[start, end)``, an entry counted by the share of it inside.

    For the burn rate. Exact: an entry holds one price and one GPU count, so
    its cost is uniform over its interval. Entries wholly inside are summed
    by the database; only those that cross an end of the window (they start
    at most ``ENTRY_SPAN`` before it) are prorated here. Index
    ``team, interval_start``: the window's entries, never the history.
    """
    team = CostEntry.objects.filter(team_id=team_id, amount_usd__isnull=False)
    inside = team.filter(interval_start__gte=start, interval_start__lt=end, interval_end__lte=end).aggregate(
        s=Sum("amount_usd"))["s"] or Decimal(0)
    crossing = team.filter(interval_start__gte=start - ENTRY_SPAN, interval_start__lt=end, interval_end__gt=start) \
        .filter(Q(interval_start__lt=start) | Q(interval_end__gt=end))
    total = Decimal(inside)
    for lo, hi, amount in crossing.values_list("interval_start", "interval_end", "amount_usd"):
        total += amount * exact_seconds(min(hi, end) - max(lo, start)) / exact_seconds(hi - lo)
    return total


def lock_team_spend(team_id: int) -> TeamSpend:
    """Lock (creating it if missing) the team's totals row for the rest of the transaction; returns it.

    Accrual updates this row before it writes the team's rollups and
    entries, so spend read after the lock includes every accrual committed
    before it and none that commits after until this transaction ends.
    Lock order: after the job, attempt and node pool rows.
    """
    return lock_team_spends([team_id])[team_id]


def lock_team_spends(team_ids) -> dict[int, TeamSpend]:
    """``lock_team_spend`` of several teams, in team id order: one locking query when every row exists (one more
    insert and lock for those missing); team id -> row. Lock order: after the job, attempt and node pool rows."""
    ids = sorted(set(team_ids))
    rows = {r.team_id: r for r in TeamSpend.objects.select_for_update(of=("self",)).filter(team_id__in=ids)
            .order_by("team_id")}
    missing = [t for t in ids if t not in rows]
    if missing:
        TeamSpend.objects.bulk_create([TeamSpend(team_id=t) for t in missing], ignore_conflicts=True)
        rows.update((r.team_id, r) for r in TeamSpend.objects.select_for_update(of=("self",))
                    .filter(team_id__in=missing).order_by("team_id"))
    return rows


@dataclasses.dataclass(frozen=True)
class UnpricedUsage:
    """GPU-hours accrued with an unknown cost (no price in force) for one job, or one team when ``job_id`` is None.

    ``since``: the start of the earliest such entry (when its cost became
    unknown); ``until``: the end of the latest (``accrued_until`` while it
    still runs unpriced).
    """

    team_id: int
    job_id: int | None
    gpu_hours: Decimal
    since: dt.datetime
    until: dt.datetime


def unpriced_usage(*, team_ids=None, job_ids=None, by: str = "job") -> list[UnpricedUsage]:
    """Unknown-cost GPU-hours per job (``by="job"``) or per team (``by="team"``), ordered by team then job.

    ``team_ids``/``job_ids`` narrow it (None: all). Reads only the ledger's
    unknown-cost rows (partial index ``costentry_unpriced``). Raises
    ValueError for another ``by``.
    """
    if by not in ("job", "team"):
        raise ValueError(f"by must be 'job' or 'team', not {by!r}")
    rows = CostEntry.objects.filter(usd_per_gpu_hour__isnull=True)
    if team_ids is not None:
        rows = rows.filter(team_id__in=list(team_ids))
    if job_ids is not None:
        rows = rows.filter(job_id__in=list(job_ids))
    sums: dict[tuple, list] = {}
    for team_id, job_id, milli, lo, hi in rows.values_list("team_id", "job_id", "gpu_milli", "interval_start",
                                                           "interval_end"):
        key = (team_id, job_id if by == "job" else None)
        s = sums.setdefault(key, [Decimal(0), lo, hi])
        s[0] += gpu_seconds(milli, exact_seconds(hi - lo))
        s[1], s[2] = min(s[1], lo), max(s[2], hi)
    return [UnpricedUsage(team, job, seconds / 3600, since, until)
            for (team, job), (seconds, since, until) in sorted(sums.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))]


def team_totals(team_ids=None) -> dict[int, TeamSpend]:
    """Team id -> its all-time totals row (``TeamSpend``): USD, GPU-seconds, unknown-cost GPU-seconds, entries."""
    rows = TeamSpend.objects.all()
    if team_ids is not None:
        rows = rows.filter(team_id__in=list(team_ids))
    return {r.team_id: r for r in rows}

