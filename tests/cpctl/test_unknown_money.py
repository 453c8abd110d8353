"""The CLI never prints $0.00 for a cost nobody knows: its money columns carry the unpriced hours (the class and the
scenario: ``tests/costs/test_unknown_money_everywhere.py``)."""

from __future__ import annotations

import pytest

from tests.costs.test_unknown_money_everywhere import build


@pytest.fixture
def world(server, teams, owner, catalog, budget_factory):
    return build(teams, owner, catalog, budget_factory)


def test_every_cli_money_figure_carries_the_unpriced_hours(run_cli, world, owner):
    moving = world["moving"].pk
    by_job = run_cli("costs", "--group-by", "job", persona=owner)
    (row,) = [line for line in by_job.out.splitlines() if "moving-job" in line]
    assert "$8.00 + 12.00 GPU-h unpriced" in row
    (total,) = [line for line in by_job.out.splitlines() if line.startswith("TOTAL")]
    assert "$35.52 + 12.00 GPU-h unpriced" in total
    assert "+ 12.00 GPU-h unpriced" in run_cli("costs", persona=owner).out
    assert "$8.00 + 12.00 GPU-h unpriced accrued" in run_cli("job", str(moving), persona=owner).out
    (listed,) = [line for line in run_cli("jobs", persona=owner).out.splitlines() if "moving-job" in line]
    assert "$8.00 + 12.00 GPU-h unpriced" in listed
    assert "+ 12.00 GPU-h unpriced" in run_cli("budgets", persona=owner).out
    utilization = run_cli("utilization", "--group-by", "job", persona=owner).out
    (util_row,) = [line for line in utilization.splitlines() if "moving-job" in line]
    assert "GPU-h unpriced" in util_row and "$0.00" not in util_row
    report = run_cli("report", str(world["report"].pk), persona=owner).out
    assert "+ 12.00 GPU-h unpriced" in report
    csv = run_cli("report", str(world["report"].pk), "--csv", persona=owner).out
    assert "total,alpha,unpriced_gpu_hours,12.0" in csv.splitlines()
