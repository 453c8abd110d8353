"""``cpctl costs`` shows the GPUs' energy and its cost beside the GPU cost: n/a where not measured, "unknown" where
no electricity price is in force, never $0, and never added to COST."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest

from costs.models import ElectricityPrice, UtilizationRollup
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job

DAY = dt.datetime(2026, 3, 10, tzinfo=dt.timezone.utc)


def rows(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()[1:] if line.strip()]


@pytest.fixture
def energy(funded_aws_cluster, teams, owner, h100):
    """alpha's jobs on DAY, each 1 GPU-hour for $6.88: "priced" drew 12.5 kWh at $0.2/kWh, "unpriced" 3 kWh on a
    cluster without an electricity price, "unmetered" has no energy series."""
    priced_cluster, pool = funded_aws_cluster["cluster"], funded_aws_cluster["pool"]
    ElectricityPrice.objects.create(cluster=priced_cluster, usd_per_kwh=Decimal("0.2"), effective_from=DAY,
                                    source="tariff")
    other_cluster, other_pool = make_cluster("onprem-1", "onprem", "dc1", h100)
    jobs = {}
    for name, (cluster, node_pool, kwh) in {"priced": (priced_cluster, pool, 12.5),
                                            "unpriced": (other_cluster, other_pool, 3.0),
                                            "unmetered": (priced_cluster, pool, None)}.items():
        job = make_job(teams[0], owner.user, h100, name=name, gpus_per_node=1)
        attempt = make_attempt(job, cluster, node_pool, state="SUCCEEDED", started_at=DAY + dt.timedelta(hours=1))
        make_cost_entry(attempt, DAY + dt.timedelta(hours=1), dt.timedelta(hours=1), "6.88", gpus=1)
        UtilizationRollup.objects.create(
            attempt=attempt, job=job, team=teams[0], cluster=cluster, accelerator=h100, day=DAY.date(),
            gpu_seconds=3600, samples=240, expected_samples=240, util_sum=240 * 50.0, avg_gpu_util_percent=50.0,
            observed_gpu_seconds=3600, idle_gpu_seconds=0, energy_kwh=kwh)
        jobs[name] = job
    return jobs


def test_costs_show_energy_beside_the_gpu_cost(run_cli, owner, energy):
    result = run_cli("costs", "--group-by", "job", persona=owner)
    assert result.code == 0, result.err
    table = rows(result.out)
    assert table[0] == ["JOB", "JOB NAME", "GPU-HOURS", "COST", "ENERGY KWH", "ENERGY COST"]
    by_name = {row[1]: row[2:] for row in table[1:-1]}
    assert by_name == {"priced": ["1.00", "$6.88", "12.50", "$2.50"],
                       "unpriced": ["1.00", "$6.88", "3.00", "unknown"],
                       "unmetered": ["1.00", "$6.88", "n/a", "n/a"]}
    assert table[-1] == ["TOTAL", "3.00", "$20.64", "15.50", "$2.50 + unknown"]
    by_team = rows(run_cli("costs", persona=owner).out)
    assert by_team[1] == ["alpha", "3.00", "$20.64", "15.50", "$2.50 + unknown"]
