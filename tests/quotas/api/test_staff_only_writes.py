"""Platform-wide settings (team weights and cohorts, cohorts, priority classes): only staff write them, with
the same 403 for any other user whatever the team; bad values are 400."""

from __future__ import annotations

import pytest

from quotas.models import PriorityClass, Team


def test_non_staff_cannot_write_platform_objects(owner, teammate, outsider, teams):
    for persona in (owner, teammate, outsider):
        assert persona.client.patch("/api/v1/teams/alpha/", {"weight": "100"}, format="json").status_code == 403
        assert persona.client.post("/api/v1/cohorts/", {"name": "mine"}, format="json").status_code == 403
        assert persona.client.post("/api/v1/priority-classes/", {"name": "vip", "value": 10**6},
                                   format="json").status_code == 403
    assert outsider.client.patch("/api/v1/teams/alpha/", {"weight": "100"}, format="json").status_code in (403, 404)
    assert str(Team.objects.get(slug="alpha").weight) in ("1", "1.000")
    assert not PriorityClass.objects.filter(name="vip").exists()


@pytest.mark.parametrize("body", [{"weight": "0"}, {"weight": "-1"}, {"weight": "NaN"}, {"weight": "1e30"},
                                  {"cohort": "nope"}, {"slug": "renamed"}])
def test_staff_bad_team_patch(staff, teams, body):
    response = staff.client.patch("/api/v1/teams/alpha/", body, format="json")
    assert response.status_code in (200, 400), response.status_code
    assert Team.objects.filter(slug="alpha").exists()
    if "weight" in body or "cohort" in body:
        assert response.status_code == 400


@pytest.mark.parametrize("value", [2**31, -(2**31), True, "5", 1.5, None])
def test_staff_bad_priority_value(staff, value):
    response = staff.client.post("/api/v1/priority-classes/", {"name": "vip", "value": value}, format="json")
    assert response.status_code == 400, (value, response.status_code)


