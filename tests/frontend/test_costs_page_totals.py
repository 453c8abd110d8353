"""The costs page shows each row and its total as their exact sums rounded once, as the API does, and says by how
much the rows miss the total (the table rule of docs/design.md, Cost ledger)."""

import datetime as dt
from decimal import Decimal

import pytest

from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


def test_the_costs_page_shows_the_apis_figures_and_states_the_rounding_difference(teams, owner, catalog):
    cluster, pool = make_cluster("eks", "aws", "us-east-1", catalog["H100-80GB"])
    start = dt.datetime(2026, 3, 2, tzinfo=dt.timezone.utc)
    for n in range(3):  # $1.005 each: alone each rounds half-even to $1.00, the total to $3.02
        attempt = make_attempt(make_job(teams[0], owner.user, catalog["H100-80GB"], name=f"j{n}"), cluster, pool)
        make_cost_entry(attempt, start + dt.timedelta(minutes=n), dt.timedelta(minutes=1), Decimal("1.005"))
    query = {"group_by": "job", "start": "2026-03-01", "end": "2026-03-31"}
    response = signed_in(owner).get("/costs/", query)
    lines = signed_in(owner).get("/costs.csv", query).content.decode().splitlines()
    rows = [Decimal(line.split(",")[3]) for line in lines[1:4]]
    assert rows == [Decimal("1.00")] * 3 and lines[4].split(",")[3] == "3.02"
    assert lines[5].startswith("rounding_difference") and lines[5].split(",")[3] == "0.02"
    page = response.content.decode()
    assert response.status_code == 200 and "$3.02" in page and "the rows miss the total by $0.02" in page
