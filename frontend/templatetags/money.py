"""``{% load money %}``: ``{{ amount|usd }}``, a Decimal USD amount as every page shows it; ``{{ offer|rate }}``, a
node pool's price; ``{{ asks|worst_case }}``, what a worst-case estimate counts.

The one rounding of money for display is ``core.money.usd_cents`` (half to even, to cents; an amount above 0 below
half a cent to two significant digits), the API's; Django's ``floatformat`` rounds half up, so a page using it
could show another cent than the API for the same amount.
"""

from __future__ import annotations

from decimal import Decimal

from django import template

from core.money import price_per_hour, usd_cents
from costs.catalog import Rates

from .job_terms import number

register = template.Library()


@register.filter
def usd(amount) -> str:
    """``amount`` (Decimal USD, or a cents string) rounded to cents half to even, without the ``$`` (an amount
    above 0 below half a cent to two significant digits: ``core.money.usd_cents``); None: ``unknown``."""
    shown = usd_cents(amount) if amount is not None and amount != "" else None
    return "unknown" if shown is None else shown


@register.filter
def rounding_gap(difference) -> str:
    """What a table's rows, each rounded to cents once, are off its total by, as words: ``difference`` is a
    ``rounding_difference_usd`` (total minus the rows' sum, a cents string): ``"0.01"`` -> ``miss the total by
    $0.01``, ``"-0.01"`` -> ``exceed the total by $0.01`` (never a ``$-0.01``)."""
    amount = Decimal(str(difference))
    return f"{'exceed' if amount < 0 else 'miss'} the total by ${abs(amount)}"


@register.filter
def hourly(price) -> str:
    """A price per hour (Decimal USD, or its string) as ``$6.88`` (``core.money.price_per_hour``); None: ``no
    price``."""
    return "no price" if price is None or price == "" else f"${price_per_hour(price)}"


@register.filter
def rate(prices) -> str:
    """A node pool's price now as a person reads it: ``$2.50/GPU-hour``, or for a CPU node pool
    ``$0.031611/vCPU-hour + $0.004237/GiB-hour`` (its GPU price too when it has one above 0). ``prices``: an object
    with ``usd_per_gpu_hour`` and optional ``usd_per_vcpu_hour`` and ``usd_per_gib_hour`` (Decimal USD or None),
    such as a ``PoolOffer``, or a ``costs.catalog.Rates``; ``no price`` when it has none (or is None)."""
    if prices is None:
        return "no price"
    if isinstance(prices, Rates):
        gpu, vcpu, gib = prices
    else:
        gpu = getattr(prices, "usd_per_gpu_hour", None)
        vcpu, gib = getattr(prices, "usd_per_vcpu_hour", None), getattr(prices, "usd_per_gib_hour", None)
    parts = [] if gpu is None or (not gpu and (vcpu is not None or gib is not None)) else \
        [f"${price_per_hour(gpu)}/GPU-hour"]
    parts += [f"${price_per_hour(p)}/{unit}-hour" for p, unit in ((vcpu, "vCPU"), (gib, "GiB")) if p is not None]
    return " + ".join(parts) or "no price"


@register.filter
def worst_case(asks: dict, max_runtime_seconds="given") -> str:
    """What a worst-case estimate counts, for its label: ``2 GPUs × max runtime``, or for a job without GPUs
    ``4 vCPUs and 8 GiB × max runtime``. ``asks``: ``{"gpus": int, "vcpus": number, "gib": number}``, the whole
    job's GPUs, vCPUs (cores) and memory (GiB), as ``job_asks`` gives them. ``max_runtime_seconds``: the job's
    (seconds); when given as None or 0 (a serving job without one), the span is the 30 days its estimate counts
    (``jobs.models.estimated_runtime``)."""
    span = "max runtime" if max_runtime_seconds else "30 days (no max runtime: it runs until cancelled)"
    if asks.get("gpus"):
        count = asks["gpus"]
        if count < 1:  # a share of one GPU, billed as that share
            return f"{number(count)} of 1 GPU × {span}"
        return f"{count} GPU{'' if count == 1 else 's'} × {span}"
    vcpus, gib = number(asks.get("vcpus") or 0), number(asks.get("gib") or 0)
    return f"{vcpus} vCPU{'' if vcpus == '1' else 's'} and {gib} GiB × {span}"
