"""The costs page's rows add up to the total it shows (rounded by the largest remainder; the ledger stays exact)."""

import datetime as dt
from decimal import Decimal

import pytest

from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


def test_the_costs_page_rows_add_up_to_its_total(teams, owner, catalog):
    cluster, pool = make_cluster("eks", "aws", "us-east-1", catalog["H100-80GB"])
    start = dt.datetime(2026, 3, 2, tzinfo=dt.timezone.utc)
    for n in range(3):  # $1.005 each: alone each rounds half-even to $1.00, the total to $3.02
        attempt = make_attempt(make_job(teams[0], owner.user, catalog["H100-80GB"], name=f"j{n}"), cluster, pool)
        make_cost_entry(attempt, start + dt.timedelta(minutes=n), dt.timedelta(minutes=1), Decimal("1.005"))
    response = signed_in(owner).get("/costs/", {"group_by": "job", "start": "2026-03-01", "end": "2026-03-31"})
    csv = signed_in(owner).get("/costs.csv", {"group_by": "job", "start": "2026-03-01", "end": "2026-03-31"})
    lines = csv.content.decode().splitlines()
    rows = [Decimal(line.split(",")[3]) for line in lines[1:-1]]
    assert lines[-1].endswith(",3.02,0.0,0.0") and sum(rows) == Decimal("3.02") and sorted(rows)[-1] == Decimal("1.01")
    assert response.status_code == 200 and "$3.02" in response.content.decode()
