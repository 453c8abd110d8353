"""Seed the accelerator list and the price catalog from the CSV files in ``costs/data/``.

Figures come from the public SkyPilot catalog (scraped from the clouds'
pricing APIs) and NVIDIA data sheets, as ``costs/data/SOURCES.md`` details; the
CPU prices (``cpu_prices.csv``, which that reference has none of) from the
clouds' own published per-vCPU and per-GiB on-demand figures, each row
naming its page. A cloud that publishes no such split (AWS and Azure price
whole instances) has no CPU row: its CPU pools cost "unknown", never $0.
Seeding is idempotent: a row already present for the same key and
effective time is left as it is.
"""

import csv
import datetime as dt
from decimal import Decimal
from pathlib import Path

from runners.models import Accelerator, cpu_flavor

from .models import Price

DATA_DIR = Path(__file__).resolve().parent / "data"
# Catalog prices are in force from the start of the seed's epoch, so a job of any date finds one.
CATALOG_EFFECTIVE_FROM = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


def seed_accelerators() -> int:
    """Create missing accelerators from ``accelerators.csv``; returns how many were created."""
    created = 0
    with open(DATA_DIR / "accelerators.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            _, new = Accelerator.objects.get_or_create(
                name=row["name"],
                defaults={"memory_gib": int(row["memory_gib"]), "peak_bf16_tflops": Decimal(row["peak_bf16_tflops"]),
                          "product_label": row["product_label"]},
            )
            created += new
    return created


def seed_prices(effective_from: dt.datetime = CATALOG_EFFECTIVE_FROM) -> int:
    """Create missing catalog prices from ``prices.csv`` effective from ``effective_from``; returns how many."""
    accelerators = {a.name: a for a in Accelerator.objects.all()}
    created = 0
    with open(DATA_DIR / "prices.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            _, new = Price.objects.get_or_create(
                provider=row["provider"], region=row["region"], accelerator=accelerators[row["accelerator"]],
                capacity_type=row["capacity_type"], cluster=None, effective_from=effective_from,
                defaults={"usd_per_gpu_hour": Decimal(row["usd_per_gpu_hour"]), "source": row["source"]},
            )
            created += new
    return created


def seed_cpu_prices(effective_from: dt.datetime = CATALOG_EFFECTIVE_FROM) -> int:
    """Create the CPU flavor (``runners.models.cpu_flavor``) and its missing catalog prices from ``cpu_prices.csv``
    (USD per vCPU-hour and per GiB-hour; ``usd_per_gpu_hour`` 0) effective from ``effective_from``; returns how
    many prices were created."""
    flavor = cpu_flavor()
    created = 0
    with open(DATA_DIR / "cpu_prices.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            _, new = Price.objects.get_or_create(
                provider=row["provider"], region=row["region"], accelerator=flavor,
                capacity_type=row["capacity_type"], cluster=None, effective_from=effective_from,
                defaults={"usd_per_gpu_hour": Decimal(0), "usd_per_vcpu_hour": Decimal(row["usd_per_vcpu_hour"]),
                          "usd_per_gib_hour": Decimal(row["usd_per_gib_hour"]), "source": row["source"]},
            )
            created += new
    return created
