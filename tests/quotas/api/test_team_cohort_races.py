"""A team moved into a cohort while staff delete that cohort: the move answers 400 on ``cohort`` (the cohort is gone)
and the team keeps its cohort, never a 500 from the database's foreign key. A connection deletes the cohort and
holds its transaction open until the team's PATCH waits on it, so the PATCH starts before the delete commits."""

import threading

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from quotas.models import Cohort, Team

from .test_cohort_parent_races import waiting_on_locks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_team_moved_into_a_cohort_being_deleted_answers_400_and_keeps_its_cohort(staff, teams):
    home, doomed = Cohort.objects.create(name="home"), Cohort.objects.create(name="doomed")
    team = teams[0]
    Team.objects.filter(pk=team.pk).update(cohort=home)
    connection.close()
    deleted, release = threading.Event(), threading.Event()

    def delete():
        try:
            with transaction.atomic():  # what the cohort's DELETE does: the cohort rows locked, then the row gone
                list(Cohort.objects.select_for_update().order_by("pk").values_list("pk", flat=True))
                Cohort.objects.filter(pk=doomed.pk).delete()
                deleted.set()
                release.wait(60)
        finally:
            connection.close()

    answer = {}

    def patch():
        try:
            client = APIClient()
            client.force_authenticate(staff.user)
            answer["r"] = client.patch(f"/api/v1/teams/{team.slug}/", {"cohort": "doomed"}, format="json")
        except Exception as exc:  # the test client raises what the view let through (a 500)
            answer["error"] = exc
        finally:
            connection.close()

    deleter = threading.Thread(target=delete)
    deleter.start()
    assert deleted.wait(60)
    mover = threading.Thread(target=patch)
    mover.start()
    try:
        while waiting_on_locks() < 1 and mover.is_alive():
            threading.Event().wait(0.05)
    finally:
        release.set()
        for thread in (deleter, mover):
            thread.join(60)
        connection.close()
    assert "error" not in answer, answer.get("error")
    response = answer["r"]
    assert response.status_code == 400, response.content
    assert "cohort" in response.json()
    assert Team.objects.get(pk=team.pk).cohort_id == home.pk
    assert not Cohort.objects.filter(pk=doomed.pk).exists()
