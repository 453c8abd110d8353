"""The cost ledger: turning attempts' held GPUs into CostEntry rows, with the running totals beside them.

Formula (OpenCost's allocation cost): ``amount = GPUs x seconds / 3600 x
USD per GPU-hour``, the GPUs exact in milli-GPUs (``CostEntry.gpu_milli``): a job on part of one GPU is billed its
share (a quarter for an hour: 0.25 GPU-h; ADR 0040). Rounding rule: each entry's amount is its whole
interval's cost rounded half to even to 1e-9 USD; sums are exact Decimals,
and money is rounded to cents only when shown.

Layout: an entry never crosses a UTC hour boundary or a price change, so a
month of a running attempt is at most ~744 rows, whatever the accrual
period. Each accrual extends the attempt's open entry (the one ending where
accrual stopped, at the same price and GPUs, in the same UTC hour) and
appends entries only past a boundary. Closed entries never change, except to give back what was
billed past an end learned later (``_give_back``).

Totals: in the transaction that writes the entries, the team's
``TeamSpend`` row, the ``DailyCostRollup`` rows (UTC day x team x cluster x
accelerator), the ``JobDailyCost`` rows (UTC day x job) and the job's
``accrued_cost_usd`` grow by exactly what
the entries gained (and the running GPU allocation per pool, team and node, ``costs.running``), so budgets and cost queries read totals, not entries.
``costs.rollups.rebuild_totals`` recomputes them from the entries.

A live attempt is billed up to its cluster's last contact, not up to now: time no look observed (the cluster or the
control plane down) is billed once a look sees the pods again, up to their end as reconcile recorded it.

Accrual continues from ``attempt.accrued_until`` under the job and attempt
row locks (lock order: team and cluster rows, key share only, as the
entries' foreign keys need -> job -> attempt -> totals rows -> entries); the
ledger's unique (attempt, interval_start) key refuses a second copy of an
interval. An attempt with no price in force accrues its GPU-hours with an
unknown cost (null price and amount) and never stops the others.
``accrue_running`` writes every running attempt in a few set-based
statements on PostgreSQL (one transaction); if that transaction fails, each
attempt is retried alone, so one failing attempt stops only itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections import defaultdict
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal
from itertools import pairwise

from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from core.gpus import gpus_of
from core.money import LEDGER_QUANTUM
from jobs.models import Job, JobAttempt, held_gpu_milli
from quotas.models import Team
from runners.models import Cluster, NodePool

from . import running
from .catalog import NoPrice, Rates, prices_by_pool, rates_at
from .models import ATTEMPT_DAY_KEYS, AttemptDailyCost, CostEntry, DailyCostRollup, JobDailyCost, Price, TeamSpend
from .spend import ENTRY_SPAN, exact_seconds, gpu_seconds

log = logging.getLogger(__name__)

SECONDS_PER_HOUR = Decimal(3600)
#: Rows per set-based statement (bounded by PostgreSQL's 65,535 parameters).
CHUNK = 2000


def interval_cost(gpus: int | Decimal, seconds: Decimal, usd_per_gpu_hour: Decimal | None, cpu_milli: int = 0,
                  memory_mib: int = 0, usd_per_vcpu_hour: Decimal | None = None,
                  usd_per_gib_hour: Decimal | None = None) -> Decimal | None:
    """USD for ``gpus`` GPUs (an int, or an exact Decimal share: ``Decimal("0.25")``) held ``seconds`` seconds at
    ``usd_per_gpu_hour``, plus, where the pool is priced by CPU,
    ``cpu_milli`` millicores at ``usd_per_vcpu_hour`` and ``memory_mib`` MiB at ``usd_per_gib_hour`` (GCP's
    per-vCPU and per-GiB billing), rounded to 1e-9 half-even.

    None when the price is unknown (``usd_per_gpu_hour`` None).
    """
    if usd_per_gpu_hour is None:
        return None
    per_hour = Decimal(gpus) * usd_per_gpu_hour
    if usd_per_vcpu_hour is not None:
        per_hour += Decimal(cpu_milli) / 1000 * usd_per_vcpu_hour
    if usd_per_gib_hour is not None:
        per_hour += Decimal(memory_mib) / 1024 * usd_per_gib_hour
    return (per_hour * seconds / SECONDS_PER_HOUR).quantize(LEDGER_QUANTUM, ROUND_HALF_EVEN)


def _cost(row_units: tuple[int, int, int], seconds: Decimal, rates: Rates | None) -> Decimal | None:
    """``interval_cost`` of ``(milli-GPUs, CPU millicores, memory MiB)`` at ``rates`` (None: unknown)."""
    if rates is None:
        return None
    return interval_cost(gpus_of(row_units[0]), seconds, rates.gpu, row_units[1], row_units[2], rates.vcpu, rates.gib)


def hour_floor(at: dt.datetime) -> dt.datetime:
    """The UTC hour that contains ``at`` (an aware datetime), as an aware UTC datetime."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ledger_pieces(node_pool, rows, start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime,
                                                                                      Rates | None]]:
    """Split ``[start, end)`` at UTC hour boundaries and where the price in force changes.

    ``rows`` are the pool's Price rows (``catalog.prices_by_pool``). Returns
    ``[(piece_start, piece_end, catalog.Rates or None)]``; None where no
    price is in force (``catalog.rates_at`` raises NoPrice there).
    """
    cuts = {start, end} | {r.effective_from for r in rows if start < r.effective_from < end}
    boundary = hour_floor(start) + ENTRY_SPAN
    while boundary < end:
        cuts.add(boundary)
        boundary += ENTRY_SPAN
    pieces: list[tuple[dt.datetime, dt.datetime, Decimal | None]] = []
    ordered = sorted(cuts)
    for lo, hi in pairwise(ordered):
        try:
            price = rates_at(node_pool, lo, rows)
        except NoPrice:
            price = None
        if pieces and pieces[-1][2] == price and hour_floor(pieces[-1][0]) == hour_floor(lo):
            pieces[-1] = (pieces[-1][0], hi, price)
        else:
            pieces.append((lo, hi, price))
    return pieces


@dataclasses.dataclass
class _Totals:
    """What a set of entries adds: USD (priced part), GPU-seconds (all), unpriced GPU-seconds, new rows."""

    cost: Decimal = Decimal(0)
    gpu_seconds: Decimal = Decimal(0)
    unpriced_gpu_seconds: Decimal = Decimal(0)
    entries: int = 0

    def add(self, cost: Decimal | None, gpu_seconds: Decimal, new_rows: int) -> None:
        self.cost += cost or 0
        self.gpu_seconds += gpu_seconds
        if cost is None:
            self.unpriced_gpu_seconds += gpu_seconds
        self.entries += new_rows


@dataclasses.dataclass
class _Batch:
    """Everything one accrual transaction writes."""

    extend: list[tuple[int, dt.datetime, Decimal | None]] = dataclasses.field(default_factory=list)
    insert: list[CostEntry] = dataclasses.field(default_factory=list)
    delete: list[int] = dataclasses.field(default_factory=list)
    # (job, attempt, GPU-seconds, USD or None) given back because the attempt's end was learned after accrual
    given_back: list[tuple[int, int, Decimal, Decimal | None]] = dataclasses.field(default_factory=list)
    accrued_until: list[tuple[int, dt.datetime]] = dataclasses.field(default_factory=list)
    job_usd: dict[int, Decimal] = dataclasses.field(default_factory=lambda: defaultdict(Decimal))
    teams: dict[int, _Totals] = dataclasses.field(default_factory=lambda: defaultdict(_Totals))
    rollups: dict[tuple, _Totals] = dataclasses.field(default_factory=lambda: defaultdict(_Totals))
    job_days: dict[tuple, _Totals] = dataclasses.field(default_factory=lambda: defaultdict(_Totals))
    attempt_days: dict[tuple, _Totals] = dataclasses.field(default_factory=lambda: defaultdict(_Totals))
    # the part billing GPUs, per attempt-day: [GPU-seconds, USD, unpriced GPU-seconds] (``costs.running``)
    gpu_days: dict[tuple, list] = dataclasses.field(default_factory=lambda: defaultdict(lambda: [Decimal(0)] * 3))

    def count(self, entry_start: dt.datetime, team_id: int, cluster_id: int, accelerator_id: int, job_id: int,
              attempt_id: int, cost: Decimal | None, gpu_seconds: Decimal, new_rows: int) -> None:
        day = entry_start.astimezone(UTC).date()
        self.teams[team_id].add(cost, gpu_seconds, new_rows)
        self.rollups[(day, team_id, cluster_id, accelerator_id)].add(cost, gpu_seconds, new_rows)
        self.job_days[(day, job_id, team_id)].add(cost, gpu_seconds, new_rows)
        self.attempt_days[(day, attempt_id, team_id, cluster_id, accelerator_id)].add(cost, gpu_seconds, new_rows)
        if gpu_seconds:
            g = self.gpu_days[(day, attempt_id, team_id, cluster_id, accelerator_id)]
            g[0], g[1] = g[0] + gpu_seconds, g[1] + (cost or 0)
            if cost is None:
                g[2] += gpu_seconds
        if cost:
            self.job_usd[job_id] += cost

    def add_entry(self, entry: CostEntry) -> None:
        """Append a ledger row (``entry``, unsaved) with its totals."""
        self.insert.append(entry)
        self.count(entry.interval_start, entry.team_id, entry.cluster_id, entry.accelerator_id, entry.job_id,
                   entry.attempt_id, entry.amount_usd,
                   gpu_seconds(entry.gpu_milli, exact_seconds(entry.interval_end - entry.interval_start)), 1)


def held_cpu(placement) -> tuple[int, int]:
    """``(CPU millicores, memory MiB)`` an attempt holds over all its pods, from its ``placement`` (per node x its
    nodes; ``{}``: nothing recorded, 0)."""
    placement = placement or {}
    if placement.get("roles"):  # a multi-role attempt: summed over its roles
        roles = placement["roles"].values()
        return (sum(int(r.get("cpu_milli") or 0) * len(r.get("nodes") or ()) for r in roles),
                sum(int(r.get("memory_mib") or 0) * len(r.get("nodes") or ()) for r in roles))
    nodes = len(placement.get("nodes") or ())
    return int(placement.get("cpu_milli") or 0) * nodes, int(placement.get("memory_mib") or 0) * nodes


def _locked_rows(attempts) -> list[tuple]:
    """The attempts of ``attempts`` (a JobAttempt queryset, locks included) as plain tuples for ``_plan``:
    (id, job, team, cluster, node pool, accelerator, milli-GPUs billed (``jobs.models.held_gpu_milli``: a job's share
    of one GPU, else its GPUs x 1000), started_at, ended_at, accrued_until, CPU millicores,
    memory MiB, the cluster's last contact, the job's max runtime in seconds); CPU and memory (``held_cpu``) are
    billed on CPU node pools only."""
    return [(a.pk, a.job_id, a.job.team_id, a.cluster_id, a.node_pool_id, a.node_pool.accelerator_id,
             held_gpu_milli(a.gpus, a.job.gpu_share_milli), a.started_at, a.ended_at, a.accrued_until,
             *held_cpu(a.placement), a.cluster.last_contact_at, a.job.max_runtime_seconds)
            for a in attempts.select_related("job", "node_pool", "cluster").only(
                "pk", "job_id", "job__team_id", "cluster_id", "node_pool_id", "node_pool__accelerator_id", "gpus",
                "job__gpu_share_milli", "started_at", "ended_at", "accrued_until", "placement",
                "cluster__last_contact_at", "job__max_runtime_seconds")]


def billing_stop(started_at: dt.datetime, max_runtime_seconds: int | None) -> dt.datetime | None:
    """The last instant an attempt is billed for: ``max_runtime_seconds`` after its start (None: no limit).

    Class: a worst-case estimate below the bill. The estimate admission checks (``jobs.scheduling.core.rules``:
    GPUs x max_runtime x price) counts ``max_runtime_seconds``; the ledger bills from the objects' creation,
    while the limit is enforced from later on (a Kubernetes Job's ``activeDeadlineSeconds`` counts from its
    ``status.startTime``, the local runner's from its supervisor's start, an inference Deployment's by reconcile's
    next look, ``runners.kubernetes.runner.observe_inference``) and the pods then run out their termination
    grace. Invariant: an attempt is never billed more than its estimate; the time the platform takes
    to enforce the limit is not charged (ADR 0024)."""
    if not max_runtime_seconds:
        return None
    return started_at + dt.timedelta(seconds=max_runtime_seconds)


def _due(until: dt.datetime):
    """Started attempts whose ledger stops before ``until`` and before their end, or runs past their end (an end
    learned after accrual had gone on: ``_give_back``)."""
    return (JobAttempt.objects.filter(started_at__isnull=False, started_at__lt=until)
            .exclude(Q(accrued_until__gte=until) & (Q(ended_at__isnull=True) | Q(accrued_until__lte=F("ended_at"))))
            .exclude(ended_at__isnull=False, accrued_until=F("ended_at")))


def _give_back(batch: _Batch, row: tuple, entries: list[CostEntry]) -> None:
    """Take back from the ledger what attempt ``row`` was billed after its end: ``entries`` are its entries that
    end after ``ended_at``; one that starts at or after it is removed, the one across it is cut at it (its amount
    at its own prices), and the totals shrink by exactly that.

    Class: billing on belief, corrected by evidence. A live attempt is billed up to its cluster's last contact;
    the end reconcile learns later (the pods' own finish time, e.g. from a pod deleted between two looks) may lie
    before that. Invariant (the simulator's ``billed_once``): no pod-second past the pods' end stays billed. The
    job's events say what was given back (``_note_given_back``)."""
    attempt_id, job_id, team_id, cluster_id, _pool, accelerator_id, milli, _started, ended_at = row[:9]
    units = (milli, *row[10:12])
    seconds, usd, priced = Decimal(0), Decimal(0), True
    for entry in entries:
        if entry.interval_start >= ended_at:
            batch.delete.append(entry.pk)
            cut = exact_seconds(entry.interval_end - entry.interval_start)
            delta = None if entry.amount_usd is None else -entry.amount_usd
            batch.count(entry.interval_start, team_id, cluster_id, accelerator_id, job_id, attempt_id, delta,
                        -gpu_seconds(milli, cut), -1)
        else:
            cut = exact_seconds(entry.interval_end - ended_at)
            amount = _cost(units, exact_seconds(ended_at - entry.interval_start), _entry_rates(entry))
            delta = None if amount is None else amount - entry.amount_usd
            batch.extend.append((entry.pk, ended_at, amount))
            batch.count(entry.interval_start, team_id, cluster_id, accelerator_id, job_id, attempt_id, delta,
                        -gpu_seconds(milli, cut), 0)
        seconds += gpu_seconds(milli, cut)
        if delta is None:
            priced = False
        else:
            usd -= delta
    batch.given_back.append((job_id, attempt_id, seconds, usd if priced else None))
    batch.accrued_until.append((attempt_id, ended_at))


def _entry_rates(entry: CostEntry) -> Rates | None:
    """The prices ``entry`` was written at (None: unknown cost)."""
    if entry.usd_per_gpu_hour is None:
        return None
    return Rates(entry.usd_per_gpu_hour, entry.usd_per_vcpu_hour, entry.usd_per_gib_hour)


def _plan(batch: _Batch, row: tuple, open_entry: CostEntry | None, pool, rows, until: dt.datetime,
          reconstructed: bool = False) -> Decimal:
    """Add one attempt's accrual up to ``until`` to ``batch``; returns the USD it adds (priced part).

    ``reconstructed``: the time is rebuilt after a restore (``reconstruct_gap``): new entries only, each flagged,
    never an extension of an entry the restored ledger had."""
    attempt_id, job_id, team_id, cluster_id, _pool_id, accelerator_id, milli, started_at, ended_at, accrued = row[:10]
    units, observed = (milli, *row[10:12]), row[12]
    stop = billing_stop(started_at, row[13] if len(row) > 13 else None)
    # A live attempt is billed up to the last time its cluster answered, never on belief: while the cluster (or the
    # control plane) cannot look, nobody knows whether its pods still run. Once a look comes back, the attempt's
    # time is billed on from there to its end as reconcile learned it (the pods' own finish time), so every
    # observed pod-second is billed once and a second past the pods' end never (invariant ``billed_once``).
    end = min(until, ended_at) if ended_at is not None else min(until, observed or until)
    capped = stop is not None and stop < end
    if capped:
        end = stop  # never past the max runtime the estimate counts (``billing_stop``)
    start = accrued or started_at
    # An ended attempt billed up to its stop is final: its ledger counts as reaching its end, so it is not due again.
    final = ended_at if capped and ended_at is not None and until >= ended_at else end
    if end <= start:
        if final != end and accrued != final:
            batch.accrued_until.append((attempt_id, final))
        return Decimal(0)
    added = Decimal(0)
    batch.job_usd[job_id] += 0  # the job row is locked: it is updated even when only unknown cost is added
    pieces = ledger_pieces(pool, rows, start, end)
    first_start, first_end, first_price = pieces[0]
    if (open_entry is not None and not reconstructed and open_entry.interval_end == start
            and (open_entry.gpu_milli, open_entry.cpu_milli, open_entry.memory_mib) == units
            and _entry_rates(open_entry) == first_price
            and hour_floor(open_entry.interval_start) == hour_floor(first_start)):
        amount = _cost(units, exact_seconds(first_end - open_entry.interval_start), first_price)
        delta = None if amount is None else amount - open_entry.amount_usd
        batch.extend.append((open_entry.pk, first_end, amount))
        batch.count(open_entry.interval_start, team_id, cluster_id, accelerator_id, job_id, attempt_id, delta,
                    gpu_seconds(milli, exact_seconds(first_end - first_start)), 0)
        added += delta or 0
        pieces = pieces[1:]
    for lo, hi, price in pieces:
        entry = CostEntry(attempt_id=attempt_id, job_id=job_id, team_id=team_id, cluster_id=cluster_id,
                          accelerator_id=accelerator_id, interval_start=lo, interval_end=hi, gpu_milli=milli,
                          usd_per_gpu_hour=price and price.gpu, amount_usd=_cost(units, exact_seconds(hi - lo), price),
                          cpu_milli=units[1], memory_mib=units[2], usd_per_vcpu_hour=price and price.vcpu,
                          usd_per_gib_hour=price and price.gib, reconstructed=reconstructed)
        batch.add_entry(entry)
        added += entry.amount_usd or 0
    batch.accrued_until.append((attempt_id, final))
    return added


def _accrue_rows(rows: list[tuple], until: dt.datetime, *, isolate: bool,
                 reconstructed: bool = False) -> tuple[_Batch, dict[int, Decimal]]:
    """Plan the accrual of locked attempt ``rows`` (``_locked_rows``); returns the batch and USD per attempt.

    With ``isolate`` an attempt that fails to plan is logged and left out
    (its ledger stays where it was); without, the error propagates.
    """
    pools = {p.pk: p for p in NodePool.objects.select_related("cluster", "accelerator")
             .filter(pk__in={r[4] for r in rows})}
    prices = prices_by_pool(pools.values(), Price.objects.filter(accelerator_id__in={p.accelerator_id
                                                                                     for p in pools.values()}))
    # The open entry of an attempt ends at its accrued_until and starts in that UTC hour: reading only entries from
    # the earliest such hour on keeps this an index range over the last hour or two, whatever the history.
    accrued = [r for r in rows if r[9] is not None]
    opened = {e.attempt_id: e for e in CostEntry.objects.filter(
        attempt_id__in=[r[0] for r in accrued], interval_start__gte=min(hour_floor(r[9]) for r in accrued),
        attempt__accrued_until=F("interval_end"))} if accrued else {}
    past_end = {r[0]: r for r in rows if r[8] is not None and r[9] is not None and r[9] > r[8]}
    after_end: dict[int, list[CostEntry]] = defaultdict(list)
    if past_end:
        for entry in CostEntry.objects.filter(attempt_id__in=list(past_end), interval_end__gt=F("attempt__ended_at")
                                              ).order_by("attempt_id", "interval_start"):
            after_end[entry.attempt_id].append(entry)
    batch, added = _Batch(), {}
    for row in rows:
        try:
            if row[0] in past_end:
                _give_back(batch, row, after_end.get(row[0], []))
                added[row[0]] = Decimal(0)
                continue
            added[row[0]] = _plan(batch, row, opened.get(row[0]), pools[row[4]], prices[row[4]], until,
                                  reconstructed)
        except SoftTimeLimitExceeded:  # the task's time is up: not this attempt's failure
            raise
        except Exception:
            if not isolate:
                raise
            log.exception("accrual of attempt %s failed; the other attempts accrue", row[0])
    return batch, added


def _values(rows: list[tuple], casts: tuple[str, ...]) -> tuple[str, list]:
    """A ``VALUES`` list with typed placeholders for ``rows`` and its flat parameters."""
    one = "(" + ", ".join(f"%s::{c}" for c in casts) + ")"
    return ", ".join([one] * len(rows)), [v for row in rows for v in row]


def _chunks(items: list):
    for start in range(0, len(items), CHUNK):
        yield items[start:start + CHUNK]


def _write_postgresql(batch: _Batch) -> None:
    """The batch in set-based statements, in lock order: jobs, attempts, team totals, rollups, entries."""
    job_t, attempt_t = Job._meta.db_table, JobAttempt._meta.db_table
    spend_t, rollup_t, entry_t = TeamSpend._meta.db_table, DailyCostRollup._meta.db_table, CostEntry._meta.db_table
    job_day_t, attempt_day_t = JobDailyCost._meta.db_table, AttemptDailyCost._meta.db_table
    now = timezone.now()
    with connection.cursor() as cursor:
        for chunk in _chunks(sorted(batch.job_usd.items())):
            values, params = _values(chunk, ("bigint", "numeric"))
            cursor.execute(f'UPDATE "{job_t}" AS j SET accrued_cost_usd = j.accrued_cost_usd + v.d '
                           f"FROM (VALUES {values}) AS v(id, d) WHERE j.id = v.id", params)
        for chunk in _chunks(sorted(batch.accrued_until)):
            values, params = _values(chunk, ("bigint", "timestamptz"))
            cursor.execute(f'UPDATE "{attempt_t}" AS a SET accrued_until = v.t '
                           f"FROM (VALUES {values}) AS v(id, t) WHERE a.id = v.id", params)
        sums = ("cost_usd", "gpu_seconds", "unpriced_gpu_seconds", "entries")
        added = ", ".join(f'{c} = "{{t}}".{c} + EXCLUDED.{c}' for c in sums)
        shrunk = ", ".join(f"{c} = t.{c} + v.{c}" for c in sums)
        for table, keys, conflict, rows, stamp in (
                (spend_t, ("team_id",), 1, {(k,): t for k, t in batch.teams.items()}, "updated_at"),
                (rollup_t, ("day", "team_id", "cluster_id", "accelerator_id"), 4, batch.rollups, "rebuilt_at"),
                (job_day_t, ("day", "job_id", "team_id"), 2, batch.job_days, "rebuilt_at"),
                (attempt_day_t, ATTEMPT_DAY_KEYS, 2, batch.attempt_days, "rebuilt_at")):
            casts = (("bigint",) if len(keys) == 1 else ("date",) + ("bigint",) * len(keys[1:])) + (
                "numeric", "numeric", "numeric", "bigint", "timestamptz")
            grow = sorted((*key, t.cost, t.gpu_seconds, t.unpriced_gpu_seconds, t.entries, now)
                          for key, t in rows.items() if min(t.cost, t.gpu_seconds, t.unpriced_gpu_seconds, t.entries) >= 0)
            # A row that shrinks (``_give_back``) exists already; an INSERT's proposed row would fail its CHECKs.
            shrink = sorted((*key, t.cost, t.gpu_seconds, t.unpriced_gpu_seconds, t.entries, now)
                            for key, t in rows.items() if min(t.cost, t.gpu_seconds, t.unpriced_gpu_seconds, t.entries) < 0)
            for chunk in _chunks(grow):
                values, params = _values(chunk, casts)
                cursor.execute(f'INSERT INTO "{table}" ({", ".join(keys)}, {", ".join(sums)}, {stamp}) '
                               f"VALUES {values} ON CONFLICT ({', '.join(keys[:conflict])}) DO UPDATE SET "
                               f"{added.format(t=table)}, {stamp} = EXCLUDED.{stamp}", params)
            for chunk in _chunks(shrink):
                values, params = _values(chunk, casts)
                match = " AND ".join(f"t.{k} = v.{k}" for k in keys[:conflict])
                cursor.execute(f'UPDATE "{table}" AS t SET {shrunk}, {stamp} = v.{stamp} FROM (VALUES {values}) '
                               f"AS v({', '.join(keys)}, {', '.join(sums)}, {stamp}) WHERE {match}", params)
    running.apply(batch.gpu_days)
    with connection.cursor() as cursor:
        for chunk in _chunks(sorted(batch.extend)):
            values, params = _values(chunk, ("bigint", "timestamptz", "numeric"))
            cursor.execute(f'UPDATE "{entry_t}" AS e SET interval_end = v.e, amount_usd = v.a '
                           f"FROM (VALUES {values}) AS v(id, e, a) WHERE e.id = v.id", params)
    if batch.delete:
        CostEntry.objects.filter(pk__in=batch.delete).delete()
    CostEntry.objects.bulk_create(batch.insert, batch_size=CHUNK)
    _note_given_back(batch)


def _write_generic(batch: _Batch) -> None:
    """The batch row by row (SQLite: its transactions are serialised whole, Decimal sums are kept in Python)."""
    for job_id, usd in sorted(batch.job_usd.items()):
        Job.objects.filter(pk=job_id).update(accrued_cost_usd=F("accrued_cost_usd") + usd)
    for attempt_id, until in sorted(batch.accrued_until):
        JobAttempt.objects.filter(pk=attempt_id).update(accrued_until=until)
    for team_id, t in sorted(batch.teams.items()):
        row, _ = TeamSpend.objects.get_or_create(team_id=team_id)
        row.cost_usd += t.cost
        row.gpu_seconds += t.gpu_seconds
        row.unpriced_gpu_seconds += t.unpriced_gpu_seconds
        row.entries += t.entries
        row.save()
    zero = {"gpu_seconds": 0, "cost_usd": 0, "unpriced_gpu_seconds": 0, "entries": 0}
    for model, names, rows in ((DailyCostRollup, ("day", "team_id", "cluster_id", "accelerator_id"), batch.rollups),
                               (JobDailyCost, ("day", "job_id", "team_id"), batch.job_days),
                               (AttemptDailyCost, ATTEMPT_DAY_KEYS, batch.attempt_days)):
        for key, t in sorted(rows.items()):
            row, _ = model.objects.get_or_create(**dict(zip(names, key, strict=True)), defaults=zero)
            row.cost_usd += t.cost
            row.gpu_seconds += t.gpu_seconds
            row.unpriced_gpu_seconds += t.unpriced_gpu_seconds
            row.entries += t.entries
            row.save()
    running.apply(batch.gpu_days)
    for entry_id, end, amount in sorted(batch.extend):
        CostEntry.objects.filter(pk=entry_id).update(interval_end=end, amount_usd=amount)
    if batch.delete:
        CostEntry.objects.filter(pk__in=batch.delete).delete()
    CostEntry.objects.bulk_create(batch.insert, batch_size=CHUNK)
    _note_given_back(batch)


def _note_given_back(batch: _Batch) -> None:
    """A ``billing`` event on each job whose ledger ``_give_back`` shortened, saying how much and why."""
    if not batch.given_back:
        return
    from jobs.models import JobEvent

    JobEvent.objects.bulk_create([
        JobEvent(job_id=job_id, attempt_id=attempt_id, kind="billing",
                 reason=(f"{seconds:.0f} GPU-seconds{'' if usd is None else f' (${usd:.2f})'} given back: attempt "
                         f"{attempt_id} was billed while its cluster could be reached, and ended before that, as "
                         f"the cluster told later")[:500],
                 data={"gpu_seconds": str(seconds), "usd": None if usd is None else str(usd)})
        for job_id, attempt_id, seconds, usd in batch.given_back if seconds])


def _write(batch: _Batch) -> None:
    (_write_postgresql if connection.vendor == "postgresql" else _write_generic)(batch)


def post_entries(entries: list[CostEntry]) -> None:
    """Append hand-made ledger rows (unsaved ``entries``: imports, corrections) with their running totals.

    Each entry needs its attempt, job, team, cluster, accelerator, interval,
    GPUs, price and amount set (price and amount None for an unknown cost).
    One transaction; the job's ``accrued_cost_usd`` is left as it is.
    Raises IntegrityError (nothing written) for an interval the attempt
    already has.
    """
    batch = _Batch()
    for entry in entries:
        batch.add_entry(entry)
    batch.job_usd.clear()
    with transaction.atomic():
        _write(batch)


def _share_keys(team_ids, cluster_ids, *, skip_locked: bool) -> tuple[set[int], set[int]]:
    """Take ``FOR KEY SHARE`` on the team and cluster rows the entries will reference (PostgreSQL), in id order;
    returns the ids held (with ``skip_locked``, those another transaction holds FOR UPDATE are left out).

    The lock an entry's foreign keys take anyway, taken first (the team row heads the platform's lock order):
    an admission holds its team FOR UPDATE while it waits for the team's totals row, so accrual must never
    hold a totals row and then wait for a team row. Other rows are not locked; nothing here is updated.
    """
    if connection.vendor != "postgresql":
        return set(team_ids), set(cluster_ids)
    held = []
    with connection.cursor() as cursor:
        for model, ids in ((Team, team_ids), (Cluster, cluster_ids)):
            cursor.execute(f'SELECT id FROM "{model._meta.db_table}" WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE'
                           + (" SKIP LOCKED" if skip_locked else ""), [sorted(ids)])
            held.append({row[0] for row in cursor.fetchall()})
    return held[0], held[1]


def accrue_attempt(attempt_id: int, until: dt.datetime | None = None, *, reconstructed: bool = False) -> Decimal:
    """Write ledger entries for attempt ``attempt_id`` from where accrual stopped up to ``until``.

    ``until`` defaults to now and is capped at the attempt's end, and for a
    live attempt at its cluster's last contact (``Cluster.last_contact_at``:
    time nobody observed is not billed until a look sees it); an attempt
    that never started costs nothing. Returns the priced USD added (0 when
    nothing was due, as on a repeated call). Where no price is in force the
    GPU-hours are written with an unknown cost (they add nothing to the
    return value). Waits for its locks, in the platform's order: team and cluster rows (key share), job row,
    attempt row, then the totals rows. ``reconstructed``: see ``reconstruct_gap``.
    """
    until = until or timezone.now()
    with transaction.atomic():
        keys = JobAttempt.objects.filter(pk=attempt_id).values_list("job_id", "job__team_id", "cluster_id").first()
        if keys is None:
            return Decimal(0)
        job_id, team_id, cluster_id = keys
        _share_keys([team_id], [cluster_id], skip_locked=False)
        list(Job.objects.select_for_update(of=("self",)).filter(pk=job_id).values_list("pk"))
        rows = _locked_rows(_due(until).filter(pk=attempt_id).select_for_update(of=("self",)))
        if not rows:
            return Decimal(0)
        batch, added = _accrue_rows(rows, until, isolate=False, reconstructed=reconstructed)
        _write(batch)
        return added[attempt_id]


def reconstruct_gap(until: dt.datetime | None = None) -> list[int]:
    """After a restore of the database: write the ledger of the gap for every attempt whose ledger stops before
    ``until`` (default now) and before its end, each entry flagged ``reconstructed`` (ADR 0011).

    The gap's times are the attempts' own, as reconcile set them from the
    cluster after the restore (``jobs.recovery``): ``started_at`` the
    objects' creation (adopted attempts), ``ended_at`` the recorded end
    (attempts ended in the gap). Entries of the restored ledger are never
    extended: the gap starts new entries, so every second of it is in a
    flagged one. Running totals grow in the same transactions, as any
    accrual's. Returns the ids of the attempts accrued.
    """
    until = until or timezone.now()
    done = []
    for attempt_id in list(_due(until).order_by("job_id", "pk").values_list("pk", flat=True)):
        accrue_attempt(attempt_id, until, reconstructed=True)
        done.append(attempt_id)
    return done


def accrue_running(until: dt.datetime | None = None) -> int:
    """Accrue every started attempt whose cost is not yet in the ledger up to ``until`` (default now).

    PostgreSQL: one transaction over all due attempts whose team and cluster
    rows (key share) and job and attempt rows are free (``SKIP LOCKED``: an
    attempt with a row another transaction holds, e.g. an admission of its
    team, is accrued by the next run, from where its ledger stopped), written
    in a few set-based statements; it waits for no lock but the totals rows. If that transaction fails, every due attempt is
    accrued in a transaction of its own, a failing one logged and skipped.
    Returns how many attempts were accrued.
    """
    until = until or timezone.now()
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():
                due = _due(until)
                keys = list(due.order_by().values_list("job__team_id", "cluster_id").distinct())
                teams, clusters = _share_keys({t for t, _ in keys}, {c for _, c in keys}, skip_locked=True)
                rows = _locked_rows(due.filter(job__team_id__in=teams, cluster_id__in=clusters)
                                    .select_for_update(of=("self", "job"), skip_locked=True).order_by("job_id", "pk"))
                batch, added = _accrue_rows(rows, until, isolate=True)
                _write(batch)
                return len(added)
        except SoftTimeLimitExceeded:  # rolled back: the next run accrues from where the ledger stopped
            raise
        except Exception:
            log.exception("set-based accrual failed; accruing attempt by attempt")
    count = 0
    for attempt_id in list(_due(until).order_by("job_id", "pk").values_list("pk", flat=True)):
        try:
            accrue_attempt(attempt_id, until)
            count += 1
        except SoftTimeLimitExceeded:
            raise
        except Exception:
            log.exception("accrual of attempt %s failed; the other attempts accrue", attempt_id)
    return count
