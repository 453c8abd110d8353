"""GET /api/v1/costs/: ledger aggregates by team, day and job, checked against sums of the rows inserted here;
Decimal sums exact to the cent, windows given with any UTC offset, bad queries answered 400 on their field."""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal

import pytest

from costs.models import CostEntry
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job

COSTS = "/api/v1/costs/"
NO_ENERGY = {"energy_kwh": None, "energy_cost_usd": None, "energy_unpriced_kwh": None}  # not measured, never 0
T0 = dt.datetime(2025, 3, 1, 22, 0, tzinfo=UTC)


def cents(amount: Decimal) -> str:
    return str(amount.quantize(Decimal("0.01"), ROUND_HALF_EVEN))


def entry(attempt, start: dt.datetime, minutes: int, gpus: int, amount: str) -> CostEntry:
    """A ledger row written by hand: ``gpus`` GPUs for ``minutes`` from ``start``, costing ``amount`` USD."""
    return make_cost_entry(attempt, start, dt.timedelta(minutes=minutes), amount, gpus=gpus, usd_per_gpu_hour="6.88")


@pytest.fixture
def ledger(teams, owner, teammate, outsider, catalog):
    """Entries of two alpha jobs (one spanning midnight UTC) and one beta job, on two clusters."""
    h100 = catalog["H100-80GB"]
    c1, p1 = make_cluster("aws-use1", "aws", "us-east-1", h100)
    c2, p2 = make_cluster("gcp-usc1", "gcp", "us-central1", h100)
    job_a = make_job(teams[0], teammate.user, h100, name="a", gpus_per_node=8, nodes=1)
    job_b = make_job(teams[0], owner.user, h100, name="b", gpus_per_node=2, nodes=1)
    job_c = make_job(teams[1], outsider.user, h100, name="c", gpus_per_node=4, nodes=1)
    att_a, att_b, att_c = make_attempt(job_a, c1, p1), make_attempt(job_b, c2, p2), make_attempt(job_c, c1, p1)
    rows = [
        # (attempt, start, minutes, gpus, amount USD)
        (att_a, T0, 60, 8, "55.040000005"),
        (att_a, T0 + dt.timedelta(hours=1), 90, 8, "82.560000000"),  # 2025-03-01 23:00 -> next day 00:30
        (att_a, T0 + dt.timedelta(hours=2, minutes=30), 30, 8, "27.520000000"),  # 2025-03-02 00:30
        (att_b, T0 + dt.timedelta(hours=3), 45, 2, "10.325000000"),  # 2025-03-02 01:00; half-cent
        (att_c, T0, 60, 4, "27.520000000"),
    ]
    entries = [entry(*row) for row in rows]
    return {"jobs": (job_a, job_b, job_c), "entries": entries}


def expected(entries, key) -> dict:
    """``{group key: (gpu_hours, cost_usd)}`` computed here from the inserted rows."""
    sums: dict = {}
    for e in entries:
        hours, usd = sums.get(key(e), (0.0, Decimal(0)))
        sums[key(e)] = (hours + e.gpus * (e.interval_end - e.interval_start).total_seconds() / 3600, usd + e.amount_usd)
    return {k: (round(h, 6), cents(usd)) for k, (h, usd) in sums.items()}


def test_it_groups_by_team_within_the_users_teams(teammate, ledger):
    body = teammate.client.get(COSTS, {"group_by": "team"}).json()
    alpha_entries = [e for e in ledger["entries"] if e.team.slug == "alpha"]
    assert {r["team"]: (r["gpu_hours"], r["cost_usd"]) for r in body["results"]} == expected(alpha_entries,
                                                                                               lambda e: "alpha")
    assert body["total"]["cost_usd"] == cents(sum(e.amount_usd for e in alpha_entries))
    assert body["results"][0]["cost_usd"] == "175.45"  # 175.445000005 -> .45 (not a half: exact sum first)


def test_staff_see_every_teams_costs(staff, ledger):
    body = staff.client.get(COSTS, {"group_by": "team"}).json()
    assert [r["team"] for r in body["results"]] == ["alpha", "beta"]
    assert body["results"][1]["cost_usd"] == "27.52"


def test_it_groups_by_utc_day(owner, ledger):
    body = owner.client.get(COSTS, {"group_by": "day"}).json()
    alpha_entries = [e for e in ledger["entries"] if e.team.slug == "alpha"]
    want = expected(alpha_entries, lambda e: e.interval_start.astimezone(dt.timezone.utc).date().isoformat())
    assert {r["day"]: (r["gpu_hours"], r["cost_usd"]) for r in body["results"]} == want
    assert [r["day"] for r in body["results"]] == ["2025-03-01", "2025-03-02"]


def test_it_groups_by_job(teammate, ledger):
    job_a, job_b, _ = ledger["jobs"]
    body = teammate.client.get(COSTS, {"group_by": "job"}).json()
    want = expected([e for e in ledger["entries"] if e.team.slug == "alpha"], lambda e: e.job_id)
    assert {r["job"]: (r["gpu_hours"], r["cost_usd"]) for r in body["results"]} == want
    assert {r["job"]: r["job_name"] for r in body["results"]} == {job_a.pk: "a", job_b.pk: "b"}
    assert want[job_b.pk] == (1.5, "10.32")  # 10.325 rounds half to even


def test_it_groups_by_cluster_and_accelerator(teammate, ledger):
    clusters = teammate.client.get(COSTS, {"group_by": "cluster"}).json()["results"]
    assert [r["cluster"] for r in clusters] == ["aws-use1", "gcp-usc1"]
    accelerators = teammate.client.get(COSTS, {"group_by": "accelerator"}).json()["results"]
    assert [(r["accelerator"], r["gpu_hours"]) for r in accelerators] == [("H100-80GB", 25.5)]


def test_it_counts_entries_that_start_inside_the_window(teammate, ledger):
    params = {"group_by": "team", "start": "2025-03-02T00:00:00Z", "end": "2025-03-03T00:00:00+00:00"}
    body = teammate.client.get(COSTS, params).json()
    inside = [e for e in ledger["entries"] if e.team.slug == "alpha"
              and dt.datetime(2025, 3, 2, tzinfo=UTC) <= e.interval_start < dt.datetime(2025, 3, 3, tzinfo=UTC)]
    assert body["results"] == [{"team": "alpha", **dict(zip(("gpu_hours", "cost_usd"), expected(
        inside, lambda e: "alpha")["alpha"], strict=True)), "unpriced_gpu_hours": 0.0, "unpriced_vcpu_hours": 0.0,
        **NO_ENERGY}]
    assert body["start"] == "2025-03-02T00:00:00+00:00"


def test_an_outsider_sees_only_their_team(outsider, ledger):
    body = outsider.client.get(COSTS, {"group_by": "job"}).json()
    assert [r["job_name"] for r in body["results"]] == ["c"]
    assert outsider.client.get(COSTS, {"team": "alpha"}).json()["results"] == []


@pytest.mark.parametrize("params, field", [
    ({"group_by": "week"}, "group_by"),
    ({"start": "2025-03-01T00:00:00"}, "start"),
    ({"end": "2025-02-30"}, "end"),  # a plain date is midnight UTC; an impossible one is refused
    ({"start": "yesterday"}, "start"),
    ({"start": "2025-03-02T00:00:00Z", "end": "2025-03-01T00:00:00Z"}, "end"),
    ({"start": "2025-03-02T00:00:00Z", "end": "2025-03-02T00:00:00Z"}, "end"),
])
def test_it_validates_the_query(teammate, params, field):
    r = teammate.client.get(COSTS, params)
    assert r.status_code == 400
    assert field in r.json()


def test_an_empty_ledger_answers_zero(teammate):
    body = teammate.client.get(COSTS).json()
    assert body == {"group_by": "team", "start": None, "end": None, "results": [],
                    "total": {"gpu_hours": 0.0, "cost_usd": "0.00", "unpriced_gpu_hours": 0.0,
                              "unpriced_vcpu_hours": 0.0, "rounding_difference_usd": "0.00", **NO_ENERGY}}


# --- exact sums and windows at the edges ---------------------------------------------------------------------------

def test_decimal_sums_are_exact(owner, alpha_ledger):
    response = owner.client.get("/api/v1/costs/", {"group_by": "day"})
    assert response.status_code == 200
    body = response.json()
    # A day of half a cent: cents would read 0.00, so it shows two significant digits, never a zero.
    assert [r["cost_usd"] for r in body["results"]] == ["3.00", "0.005"]
    assert body["total"]["cost_usd"] == "3.00"  # 3.005 rounded half-even once
    for group_by in ("team", "cluster", "accelerator", "job"):
        assert owner.client.get("/api/v1/costs/", {"group_by": group_by}).json()["total"]["cost_usd"] == "3.00"


@pytest.mark.parametrize("start,end", [
    ("2026-03-10T17:30:00+05:30", "2026-03-10T18:00:00+05:30"),  # 12:00-12:30 UTC
    ("2026-03-10T07:00:00-05:00", "2026-03-10T07:30:00-05:00"),
    ("2026-03-10T12:00:00Z", "2026-03-10T12:30:00Z"),
])
def test_offsets_select_the_same_utc_window(owner, alpha_ledger, start, end):
    body = owner.client.get("/api/v1/costs/", {"start": start, "end": end}).json()
    assert body["total"]["cost_usd"] == "3.00", body


@pytest.mark.parametrize("params,field", [
    ({"start": "2026-03-10T12:00:00"}, "start"),  # naive
    ({"end": "2026-02-29"}, "end"),  # not a leap year
    ({"start": "2026-03-10", "end": "2026-03-10T00:00:00Z"}, "end"),  # the same instant: a date is midnight UTC
    ({"start": "2026-03-10T12:00:00Z", "end": "2026-03-10T12:00:00Z"}, "end"),
    ({"start": "2026-03-10T12:00:00Z", "end": "2026-03-10T11:00:00Z"}, "end"),
    ({"start": "2026-03-10T17:30:00+05:30", "end": "2026-03-10T12:00:00Z"}, "end"),  # the same instant
    ({"group_by": "user"}, "group_by"),
    ({"group_by": "team__slug"}, "group_by"),
    ({"start": "not a date"}, "start"),
    ({"start": "2026-02-30T00:00:00Z"}, "start"),
    ({"start": "0001-01-01T00:00:00+05:30"}, "start"),  # before datetime.min in UTC
    ({"end": "9999-12-31T23:59:59-05:00"}, "end"),  # after datetime.max in UTC
    ({"start": "2026-03-10T12:00:00+25:00"}, "start"),
    ({"with_utilization": "maybe"}, "with_utilization"),
])
def test_bad_cost_queries_are_400(owner, alpha_ledger, params, field):
    for url in ("/api/v1/costs/", "/api/v1/utilization/"):
        response = owner.client.get(url, params)
        assert response.status_code == 400, (url, params, response.status_code)
        assert field in response.json(), response.json()


@pytest.mark.parametrize("params", [
    {"start": "0001-01-01T00:00:00Z"}, {"end": "9999-12-31T23:59:59Z"},
    {"start": "1970-01-01T00:00:00+14:00", "end": "2999-01-01T00:00:00-12:00"},
    {"start": "0001-01-02T00:00:00Z", "end": "9999-12-30T00:00:00Z", "group_by": "day", "with_utilization": "1"},
])
def test_far_past_and_far_future_windows_answer_200(owner, alpha_ledger, params):
    for url in ("/api/v1/costs/", "/api/v1/utilization/"):
        response = owner.client.get(url, params)
        assert response.status_code == 200, (url, params, response.content[:300])


def test_a_plain_date_is_midnight_utc_as_the_cli_reads_it(teammate, ledger):
    dated = teammate.client.get(COSTS, {"group_by": "day", "start": "2025-03-02", "end": "2025-03-03"})
    timed = teammate.client.get(COSTS, {"group_by": "day", "start": "2025-03-02T00:00:00Z",
                                        "end": "2025-03-03T00:00:00Z"})
    assert dated.status_code == 200, dated.content
    assert dated.json() == timed.json()
    assert dated.json()["start"] == "2025-03-02T00:00:00+00:00"
