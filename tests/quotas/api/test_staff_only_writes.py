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
    # Staff-only writes are refused before any lookup: another team's and a missing team alike are 403, so the
    # answer says nothing about which teams exist.
    assert outsider.client.patch("/api/v1/teams/alpha/", {"weight": "100"}, format="json").status_code == 403
    assert outsider.client.patch("/api/v1/teams/no-such-team/", {"weight": "100"}, format="json").status_code == 403
    assert str(Team.objects.get(slug="alpha").weight) in ("1", "1.000")
    assert not PriorityClass.objects.filter(name="vip").exists()


@pytest.mark.parametrize("body", [{"weight": "0"}, {"weight": "-1"}, {"weight": "NaN"}, {"weight": "1e30"},
                                  {"cohort": "nope"}, {"slug": "renamed"}])
def test_bad_team_patches_by_staff_get_400_and_the_slug_stays(staff, teams, body):
    response = staff.client.patch("/api/v1/teams/alpha/", body, format="json")
    expected = 200 if "slug" in body else 400  # the slug is read-only: ignored, the team keeps its own
    assert response.status_code == expected, response.content
    assert Team.objects.filter(slug="alpha").exists()
    if "weight" in body or "cohort" in body:
        assert response.status_code == 400


@pytest.mark.parametrize("value", [2**31, -(2**31), True, "5", 1.5, None])
def test_bad_priority_class_values_get_400(staff, value):
    response = staff.client.post("/api/v1/priority-classes/", {"name": "vip", "value": value}, format="json")
    assert response.status_code == 400, (value, response.status_code)


def test_a_priority_class_with_the_value_of_another_is_400(staff):
    """Values are unique (they order the queue): a second class at ``normal``'s 500 is refused on ``value``."""
    response = staff.client.post("/api/v1/priority-classes/", {"name": "also-normal", "value": 500}, format="json")
    assert response.status_code == 400, response.content
    assert "value" in response.json()
    assert not PriorityClass.objects.filter(name="also-normal").exists()
    renamed = staff.client.patch(f"/api/v1/priority-classes/{PriorityClass.objects.get(name='low').pk}/",
                                 {"value": 1000}, format="json")  # high's value
    assert renamed.status_code == 400 and "value" in renamed.json()
