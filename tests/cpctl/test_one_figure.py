"""The CLI shows a job's cost as the API, the pages and the CSV do, and its tables follow the one table rule (the
classes: ``tests/costs/test_one_figure.py``)."""

from __future__ import annotations

from tests.costs.test_one_figure import three_jobs


def test_a_jobs_cost_in_the_cli_is_the_apis_and_the_table_states_its_rounding(server, run_cli, teams, owner, catalog):
    jobs, _ = three_jobs(teams, owner, catalog)
    table = run_cli("costs", "--group-by", "job", persona=owner).out.splitlines()
    rows = {line.split()[0]: line for line in table if line.split() and line.split()[0].isdigit()}
    for job in jobs:
        api = owner.client.get(f"/api/v1/jobs/{job.pk}/").json()["accrued_cost_usd"]
        assert api == "1.00" and rows[str(job.pk)].split()[3] == f"${api}"  # JOB, NAME, GPU-HOURS, COST, energy
        assert f"${api} accrued" in run_cli("job", str(job.pk), persona=owner).out
    (total,) = [line for line in table if line.startswith("TOTAL")]
    assert total.split()[2] == "$3.02"  # TOTAL, GPU-HOURS, COST, energy
    assert table[-1] == "each row and the TOTAL are their exact sums rounded to cents: the rows miss the total by $0.02"
