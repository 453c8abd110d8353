"""Job list filters by creation time accept any ISO 8601 UTC offset (up to +/-23:59) and select by the instant, in
the API and the web UI alike; instants beyond the calendar's ends select everything or nothing, never a 500."""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import pytest

from jobs.models import Job
from tests.support.factories import make_job
from tests.support.personas import signed_in

# created_at of each job, UTC
CREATED = {"early": dt.datetime(2025, 12, 31, 7, 0, tzinfo=UTC), "late": dt.datetime(2025, 12, 31, 9, 0, tzinfo=UTC)}


@pytest.fixture
def dated_jobs(teams, teammate, h100):
    for name, created in CREATED.items():
        job = make_job(teams[0], teammate.user, h100, name=name)
        Job.objects.filter(pk=job.pk).update(created_at=created)


@pytest.mark.parametrize("value, expected", [
    # 2026-01-01T00:00+16:00 is 2025-12-31T08:00Z: between the two jobs
    ("2026-01-01T00:00:00+16:00", ["late"]),
    ("2026-01-01T00:00:00+23:59", ["early", "late"]),  # 2025-12-31T00:01Z
    ("2025-12-30T15:30:00-16:00", ["late"]),  # 2025-12-31T07:30Z
    ("2025-12-31T08:00:00Z", ["late"]),
    ("0001-01-01T00:00:00+18:00", ["early", "late"]),  # before the first instant in UTC: everything
    ("9999-12-31T23:59:59-20:00", []),  # after the last: nothing
])
def test_created_after_with_any_offset_selects_by_the_instant(teammate, dated_jobs, value, expected):
    r = teammate.client.get("/api/v1/jobs/", {"created_after": value})
    assert r.status_code == 200, r.content
    assert sorted(j["name"] for j in r.json()["results"]) == expected


def test_created_before_with_a_large_offset(teammate, dated_jobs):
    r = teammate.client.get("/api/v1/jobs/", {"created_before": "2026-01-01T00:00:00+16:00"})
    assert r.status_code == 200, r.content
    assert [j["name"] for j in r.json()["results"]] == ["early"]


def test_the_web_job_filter_accepts_a_large_offset(teammate, dated_jobs):
    r = signed_in(teammate).get("/jobs/", {"created_after": "2026-01-01T00:00:00+16:00"})
    assert r.status_code == 200
    page = r.content.decode()
    assert "2025-12-31 09:00:00" in page and "2025-12-31 07:00:00" not in page  # late's row, not early's
