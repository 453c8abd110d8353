"""The reports' training-efficiency section: GPU-hours and cost by MFU band, the cost of idle and of low-MFU
GPU-hours, MFU per team, and the most expensive jobs with their tokens and USD per million tokens.

An attempt's MFU is the one the job detail shows (``jobs.workload.attempt_efficiency``: the run's throughput
over the attempt's GPUs at the catalog peak; null on emulated GPUs, without a peak or without reports), and
all of its GPU-hours in the period fall in that band. Tokens are the attempt's reported training tokens pro
rata of its billed GPU-time that falls in the period (a run billed 24 GPU-hours, 16 of them in the period,
counts two thirds of its tokens there); USD per million tokens is the period's cost over those tokens.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from core.gpus import MILLI_PER_GPU
from jobs.efficiency.flops import LOW_MFU_PERCENT, MFU_BANDS, UNKNOWN_BAND, band_label, mfu_band
from jobs.models import JobAttempt, WorkloadMetrics
from jobs.workload import attempt_efficiency

from ..aggregation import money
from ..models import CostEntry

TOP_JOBS = 10


def _hours(entry: dict) -> Decimal:
    """GPU-hours of a ledger row (``gpu_milli``: milli-GPUs billed, a share of one GPU exactly)."""
    seconds = Decimal(str((entry["interval_end"] - entry["interval_start"]).total_seconds()))
    return entry["gpu_milli"] * seconds / MILLI_PER_GPU / Decimal(3600)


def _zero_money() -> dict:
    return {"cost": Decimal(0), "unpriced": Decimal(0), "vunpriced": Decimal(0)}


def _add_money(into: dict, item: dict) -> None:
    for key in ("cost", "unpriced", "vunpriced"):
        into[key] += item[key]


def _shown(figures: dict) -> dict:
    """``cost_usd`` (cents; null when none of it priced) with its ``unpriced_gpu_hours``/``unpriced_vcpu_hours``."""
    return money(figures["cost"], figures["unpriced"] * 3600, figures["vunpriced"] * 3600)


def training_efficiency(entries, utilization: dict) -> dict:
    """The section for ledger ``entries`` (the report's CostEntry queryset) and the report's ``utilization``
    section (its idle GPU-hours and cost). JSON-ready: GPU-hours as floats (6 decimals), USD as cent strings,
    USD per million tokens with 6 decimals, MFU in percent (4 decimals).

    Keys: ``by_mfu_band`` (every band of ``jobs.efficiency.flops.MFU_BANDS`` and ``unknown``, in order:
    ``band``, ``gpu_hours``, ``cost_usd``, ``attempts``), ``mfu_percent`` (GPU-hour weighted over the attempts
    with an MFU; null without any), ``low_mfu`` (``below_percent``, ``gpu_hours``, ``cost_usd``), ``idle``
    (``gpu_hours``, ``cost_usd`` from the utilization section; null when metrics are missing), ``by_team``
    (``team``, ``gpu_hours``, ``mfu_percent``), ``top_jobs`` (the ``TOP_JOBS`` costliest: ``job``, ``job_name``,
    ``team``, ``gpu_hours``, ``cost_usd``, ``tokens``, ``usd_per_million_tokens``, ``mfu_percent``) and
    ``lowest_mfu_jobs`` (the same rows for the ``TOP_JOBS`` jobs with an MFU, lowest MFU first, then costliest:
    where the money bought the least model FLOPs).
    """
    rows = list(entries.values("attempt_id", "job_id", "job__name", "team__slug", "gpu_milli", "interval_start",
                               "interval_end", "amount_usd", "cpu_milli"))
    per_attempt: dict[int, dict] = {}
    for row in rows:
        item = per_attempt.setdefault(row["attempt_id"], {"job": row["job_id"], "job_name": row["job__name"],
                                                          "team": row["team__slug"], "hours": Decimal(0),
                                                          "cost": Decimal(0), "unpriced": Decimal(0),
                                                          "vunpriced": Decimal(0)})
        item["hours"] += _hours(row)
        item["cost"] += row["amount_usd"] or Decimal(0)
        if row["amount_usd"] is None:  # unpriced hours: cost unknown, shown beside the cost
            item["unpriced"] += _hours(row)
            item["vunpriced"] += _hours({**row, "gpu_milli": row["cpu_milli"]})  # millicores: vCPU-hours
    billed = defaultdict(Decimal)  # all of each attempt's billed GPU-hours, in and out of the period
    for row in CostEntry.objects.filter(attempt_id__in=per_attempt).values("attempt_id", "gpu_milli", "interval_start",
                                                                          "interval_end"):
        billed[row["attempt_id"]] += _hours(row)
    attempts = JobAttempt.objects.filter(pk__in=per_attempt).select_related(
        "job", "cluster", "node_pool__accelerator")
    metrics = {m.attempt_id: m for m in WorkloadMetrics.objects.filter(attempt_id__in=per_attempt)}
    for attempt in attempts:
        item = per_attempt[attempt.pk]
        figures = attempt_efficiency(attempt, metrics.get(attempt.pk))
        item["mfu"] = figures["mfu_percent"]
        share = item["hours"] / billed[attempt.pk] if billed[attempt.pk] else Decimal(0)
        item["tokens"] = None if figures["tokens"] is None else Decimal(figures["tokens"]) * share

    labels = [band_label(low, high) for low, high in MFU_BANDS] + [UNKNOWN_BAND]
    bands = {label: {"band": label, "hours": Decimal(0), **_zero_money(), "attempts": 0} for label in labels}
    low = {"hours": Decimal(0), **_zero_money()}
    teams: dict[str, dict] = {}
    weighted = [Decimal(0), Decimal(0)]  # sum of hours x MFU, sum of hours with an MFU
    jobs: dict[int, dict] = {}
    for item in per_attempt.values():
        mfu = item.get("mfu")
        band = bands[mfu_band(mfu)]
        band["hours"] += item["hours"]
        _add_money(band, item)
        band["attempts"] += 1
        team = teams.setdefault(item["team"], {"team": item["team"], "hours": Decimal(0), "known": Decimal(0),
                                               "weighted": Decimal(0)})
        team["hours"] += item["hours"]
        if mfu is not None:
            weighted[0] += item["hours"] * Decimal(str(mfu))
            weighted[1] += item["hours"]
            team["weighted"] += item["hours"] * Decimal(str(mfu))
            team["known"] += item["hours"]
            if mfu < LOW_MFU_PERCENT:
                low["hours"] += item["hours"]
                _add_money(low, item)
        job = jobs.setdefault(item["job"], {"job": item["job"], "job_name": item["job_name"], "team": item["team"],
                                            "hours": Decimal(0), **_zero_money(), "tokens": None,
                                            "known": Decimal(0), "weighted": Decimal(0)})
        job["hours"] += item["hours"]
        _add_money(job, item)
        if item.get("tokens") is not None:
            job["tokens"] = (job["tokens"] or Decimal(0)) + item["tokens"]
        if mfu is not None:
            job["weighted"] += item["hours"] * Decimal(str(mfu))
            job["known"] += item["hours"]

    def hours(value: Decimal) -> float:
        return round(float(value), 6)

    def mean_mfu(total: Decimal, known: Decimal) -> float | None:
        return round(float(total / known), 4) if known else None

    def job_row(j: dict) -> dict:
        return {"job": j["job"], "job_name": j["job_name"], "team": j["team"], "gpu_hours": hours(j["hours"]),
                **_shown(j), "tokens": None if j["tokens"] is None else int(j["tokens"]),
                "usd_per_million_tokens": None if not j["tokens"] or j["unpriced"] or j["vunpriced"] else
                str((j["cost"] * Decimal(1_000_000) / j["tokens"]).quantize(Decimal("0.000001"))),
                "mfu_percent": mean_mfu(j["weighted"], j["known"])}

    ranked = sorted(jobs.values(), key=lambda j: (-j["cost"], j["job"]))[:TOP_JOBS]
    lowest = sorted((j for j in jobs.values() if j["known"]),
                    key=lambda j: (j["weighted"] / j["known"], -j["cost"], j["job"]))[:TOP_JOBS]
    return {
        "by_mfu_band": [{"band": b["band"], "gpu_hours": hours(b["hours"]), **_shown(b),
                         "attempts": b["attempts"]} for b in bands.values()],
        "mfu_percent": mean_mfu(weighted[0], weighted[1]),
        "low_mfu": {"below_percent": LOW_MFU_PERCENT, "gpu_hours": hours(low["hours"]),
                    **_shown(low)},
        "idle": {"gpu_hours": utilization["idle_gpu_hours"], "cost_usd": utilization["idle_cost_usd"],
                 "unpriced_gpu_hours": utilization.get("idle_unpriced_gpu_hours"),
                 "unpriced_vcpu_hours": utilization.get("idle_unpriced_vcpu_hours")},
        "by_team": [{"team": t["team"], "gpu_hours": hours(t["hours"]), "mfu_percent": mean_mfu(t["weighted"], t["known"])}
                    for t in sorted(teams.values(), key=lambda t: t["team"])],
        "top_jobs": [job_row(j) for j in ranked],
        "lowest_mfu_jobs": [job_row(j) for j in lowest],
    }
