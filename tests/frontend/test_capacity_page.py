"""The capacity page: the fleet's capacity, allocation and unallocated cost over UTC days, an unpriced cluster's
cost shown as unknown (never $0.00), team rows only of the user's teams, and bad days refused next to the field."""

import pytest

from runners.models import Cluster
from tests.costs.test_capacity import allocate, sync_fleet
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db
DAYS = {"start": "2026-03-02", "end": "2026-03-03"}


@pytest.fixture
def fleet(catalog, teams, user, h100):
    aws = Cluster.objects.create(name="aws-use1", provider="aws", region="us-east-1", backend="kubernetes")
    sync_fleet(aws, {i: {"node-a": ("on-demand", 8, True), "node-b": ("on-demand", 8, True)} for i in range(241)})
    allocate(aws, teams, user, h100, [(0, ["node-a"], 8, 60, 120), (1, ["node-b"], 8, 60, 90)])
    lab = Cluster.objects.create(name="lab", provider="onprem", region="lab", backend="kubernetes")
    sync_fleet(lab, {i: {"node-z": ("on-demand", 4, True)} for i in range(61)})  # 4 GPU-h, no price
    return aws, lab


def test_the_capacity_page_shows_capacity_unallocated_and_unknown_cost(owner, fleet):
    page = signed_in(owner).get("/capacity/", {"group_by": "cluster", **DAYS})
    text = page.content.decode()
    assert page.status_code == 200
    assert "<td>aws-use1</td><td>64.00</td><td>0.00</td><td>12.00</td><td>52.00</td><td>$357.76</td>" in text
    assert "<td>lab</td><td>4.00</td><td>0.00</td><td>0.00</td><td>4.00</td><td>unknown</td><td>4.00</td>" in text
    assert "$0.00" not in text
    assert "(4.00 GPU-hours without a price)" in text


def test_team_rows_are_the_users_own(owner, fleet):
    text = signed_in(owner).get("/capacity/", {"group_by": "team", **DAYS}).content.decode()
    assert "<td>alpha</td>" in text and "<td>beta</td>" not in text


def test_bad_days_are_refused_next_to_the_field(owner, db):
    page = signed_in(owner).get("/capacity/", {"start": "2026-03-05", "end": "2026-03-01"})
    assert page.status_code == 200 and "is before the start day" in page.content.decode()
    page = signed_in(owner).get("/capacity/", {"start": "2025-01-01", "end": "2026-03-01"})
    assert "the page covers at most 93 days" in page.content.decode()
