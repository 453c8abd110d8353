"""Staff creating priority classes with the same value at the same moment: one is stored, the others answer 400 on
``value``, none a 500 (the uniqueness check and the insert race on PostgreSQL)."""

import pytest
from django.db import connection
from rest_framework.test import APIClient

from quotas.models import PriorityClass
from tests.support.racing import run_concurrently

RACERS = 6


@pytest.mark.django_db(transaction=True)
def test_concurrent_priority_classes_with_one_value_store_one_and_answer_400_to_the_rest(staff):
    connection.close()

    def post(i):
        def run():
            client = APIClient()
            client.force_authenticate(staff.user)
            return client.post("/api/v1/priority-classes/", {"name": f"vip-{i}", "value": 777}, format="json")
        return run

    answers, errors = run_concurrently(*[post(i) for i in range(RACERS)])
    assert errors == []
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] + [400] * (RACERS - 1), [a.content for a in answers]
    assert all("value" in a.json() for a in answers if a.status_code == 400)
    assert PriorityClass.objects.filter(value=777).count() == 1
