"""``cpctl job`` shows a serving job's figures over the last hour it served, and an unknown price as unknown, never
$0 (the ledger and samples of ``tests/jobs/test_serving_figures.py``)."""

from __future__ import annotations

from tests.jobs.test_serving_figures import served, unpriced_serving_job  # noqa: F401 - a fixture


def test_cpctl_job_shows_the_figures_and_an_unknown_price_as_unknown(run_cli, served, teams, owner, catalog):  # noqa: F811
    out = run_cli("job", str(served.pk), persona=owner).out
    (line,) = [row for row in out.splitlines() if "served (last hour)" in row]
    assert "700 requests" in line and "errors 0.14 %" in line and "p99 500.0 ms" in line
    (cost,) = [row for row in out.splitlines() if "per million requests" in row]
    assert "$24571.43" in cost and "3571.43 GPU-h" in cost  # 2.5 GPU-h x 1e6 / 700
    (replicas,) = [row for row in out.splitlines() if "replicas over time" in row]
    assert "3 from 2026-11-30 10:15:00" in replicas

    dark = unpriced_serving_job(teams, owner, catalog)
    out = run_cli("job", str(dark.pk), persona=owner).out
    (cost,) = [row for row in out.splitlines() if "per million requests" in row]
    assert "unknown, 40000.00 GPU-h (2.00 GPU-h without a price)" in cost and "$0" not in cost
