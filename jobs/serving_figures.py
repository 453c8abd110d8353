"""A serving job's figures over a window: requests per second, latency percentiles, error rate, replicas over time,
and GPU-hours and USD per million requests (and per million tokens), from its ``ServingSample`` rows and the ledger.

Percentiles: Prometheus' ``histogram_quantile`` over the window's summed bucket increases, with its linear
interpolation inside the bucket that holds the rank (prometheus.io, "Query functions", histogram_quantile; the
code is promql/quantile.go, ``bucketQuantile``): a percentile is accurate to the width of its bucket
(``runners.local.endpoint.LATENCY_BUCKETS``), and one that falls in the ``+Inf`` bucket is the highest finite bound.

Money: the ledger's entries of the job (``costs.CostEntry``) that overlap the window, each counted for the part of
it inside the window (GPU-seconds and amount pro rata of its length); the window's end is cut to where the ledger
has accrued the job, so requests and GPU-hours cover the same time. USD is unknown (None) as soon as any GPU-hour
of the window has no price: a rate from a part of the cost would read as a lower price than was paid.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

from django.db.models import Max, Sum

from core.gpus import MILLI_PER_GPU
from core.money import LEDGER_QUANTUM, shown_usd
from costs.models import CostEntry

from .models import Job, ServingSample

#: The window the job's page, its API detail and ``cpctl job`` show: the last hour the job served.
FIGURES_WINDOW = dt.timedelta(hours=1)
MILLION = 1_000_000


def histogram_quantile(q: float, buckets: dict[str, float]) -> float | None:
    """The ``q``-quantile (0 <= q <= 1) of a Prometheus histogram, ``buckets`` ``{"<le>": cumulative count, ...,
    "+Inf": count}``, by ``histogram_quantile``'s rule (module docstring); None without observations or without a
    ``+Inf`` bucket. Seconds when the bounds are. Raises ValueError for ``q`` outside 0..1."""
    if not 0 <= q <= 1:
        raise ValueError("q must be within 0 and 1")
    bounds = sorted((float(le), float(count)) for le, count in buckets.items())
    if len(bounds) < 2 or not math.isinf(bounds[-1][0]) or bounds[-1][1] <= 0:
        return None
    running = 0.0  # buckets made monotonic, as Prometheus does with counts that went down by a scrape's skew
    bounds = [(le, running := max(running, count)) for le, count in bounds]
    rank = q * bounds[-1][1]
    index = next(i for i, (_, count) in enumerate(bounds) if count >= rank)
    if index == len(bounds) - 1:
        return bounds[-2][0]
    upper, count = bounds[index]
    if index == 0 and upper <= 0:
        return upper
    lower, below = (0.0, 0.0) if index == 0 else bounds[index - 1]
    if count == below:
        return upper
    return lower + (upper - lower) * ((rank - below) / (count - below))  # Prometheus' order of operations


def _ledger_end(job: Job) -> dt.datetime | None:
    """Where the ledger has accrued ``job`` up to (the end of its latest entry), None before any entry."""
    return CostEntry.objects.filter(job_id=job.pk).aggregate(end=Max("interval_end"))["end"]


def _cost(job: Job, start: dt.datetime, end: dt.datetime) -> tuple[Decimal, Decimal, Decimal]:
    """``(GPU-hours, priced USD, GPU-hours without a price)`` of ``job``'s ledger entries within ``[start, end)``,
    each entry pro rata of its part inside the window."""
    gpu_seconds, usd, unpriced = Decimal(0), Decimal(0), Decimal(0)
    rows = CostEntry.objects.filter(job_id=job.pk, interval_start__lt=end, interval_end__gt=start).values_list(
        "interval_start", "interval_end", "gpu_milli", "amount_usd")
    for lo, hi, milli, amount in rows:
        gpus = Decimal(milli) / MILLI_PER_GPU  # a share of a GPU counts as its part (ADR 0040)
        length = Decimal(str((hi - lo).total_seconds()))
        inside = Decimal(str((min(hi, end) - max(lo, start)).total_seconds()))
        gpu_seconds += gpus * inside
        if amount is None:
            unpriced += gpus * inside
        else:
            usd += amount * inside / length
    return gpu_seconds / 3600, usd.quantize(LEDGER_QUANTUM), unpriced / 3600


def _per_million(value: Decimal, count: int) -> Decimal | None:
    return value * MILLION / count if count else None


def _replicas_over_time(samples) -> list[list]:
    """``[[ISO time, replicas], ...]``: the first sample's count, then each change."""
    series: list[list] = []
    for at, replicas in samples.values_list("at", "replicas"):
        if not series or series[-1][1] != replicas:
            series.append([at.isoformat(), replicas])
    return series


def service_figures(job: Job, start: dt.datetime, end: dt.datetime, *, detail: bool = True) -> dict:
    """Figures of serving ``job`` over ``[start, end)`` (aware UTC; the end cut to the ledger's, module docstring).

    Keys: ``window_start``, ``window_end`` (ISO), ``seconds`` (the time the samples cover), ``requests``,
    ``errors`` (5xx answers), ``tokens`` (generated, as the replicas said; 0 when they say nothing),
    ``requests_per_second``, ``error_rate_percent`` (null without requests), ``gpu_hours``,
    ``unpriced_gpu_hours``, ``usd`` (the priced part as a cents string, beside ``unpriced_gpu_hours``; null when
    none of it is priced), ``gpu_hours_per_million_requests``,
    ``usd_per_million_requests``, ``usd_per_million_tokens`` (null without requests, tokens or a known cost);
    with ``detail``, ``latency_p50_ms`` and ``latency_p99_ms`` (null without requests) and ``replicas``
    (``[[ISO time, count], ...]`` at each change). A sample covers ``(at - seconds, at]``, and counts when it ends
    within ``(start, end]``.
    """
    ledger_end = _ledger_end(job)
    if ledger_end is not None and ledger_end < end:
        end = max(start, ledger_end)
    samples = ServingSample.objects.filter(job_id=job.pk, at__gt=start, at__lte=end)
    sums = samples.aggregate(requests=Sum("requests"), errors=Sum("errors"), tokens=Sum("tokens"),
                             seconds=Sum("seconds"))
    requests, errors, tokens = (int(sums[k] or 0) for k in ("requests", "errors", "tokens"))
    seconds = float(sums["seconds"] or 0)
    gpu_hours, usd, unpriced = _cost(job, start, end)
    known = usd if not unpriced else None
    figures = {
        "window_start": start.isoformat(), "window_end": end.isoformat(), "seconds": round(seconds, 3),
        "requests": requests, "errors": errors, "tokens": tokens,
        "requests_per_second": round(requests / seconds, 3) if seconds else None,
        "error_rate_percent": round(100 * errors / requests, 4) if requests else None,
        "gpu_hours": round(float(gpu_hours), 6), "unpriced_gpu_hours": round(float(unpriced), 6),
        "usd": shown_usd(usd, unpriced),
        "gpu_hours_per_million_requests": _rounded(_per_million(gpu_hours, requests), 6),
        "usd_per_million_requests": shown_usd(_per_million(known, requests)) if known is not None else None,
        "usd_per_million_tokens": shown_usd(_per_million(known, tokens)) if known is not None else None,
    }
    if detail:
        buckets: dict[str, float] = {}
        for row in samples.values_list("latency_buckets", flat=True):
            for le, count in (row or {}).items():
                buckets[le] = buckets.get(le, 0) + count
        figures.update({f"latency_p{p}_ms": _ms(histogram_quantile(p / 100, buckets)) for p in (50, 99)})
        figures["replicas"] = _replicas_over_time(samples.order_by("at"))
    return figures


def _rounded(value: Decimal | None, places: int) -> float | None:
    return None if value is None else round(float(value), places)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def recent_figures(job: Job) -> dict | None:
    """``service_figures`` of ``job`` over the last ``FIGURES_WINDOW`` it served (ending at its latest sample);
    None before its first sample."""
    last = ServingSample.objects.filter(job_id=job.pk).aggregate(at=Max("at"))["at"]
    if last is None:
        return None
    return service_figures(job, last - FIGURES_WINDOW, last)
