"""Staff writing cohorts at the same moment (ADR 0046): two parent changes, each alone fine, together a loop (a's
parent b, b's parent a) store one and answer 400 on ``parent`` to the other, so the stored links never loop; cohorts
of one name, and quotas of one cohort and accelerator, store one and answer 400 to the rest, none a 500.

In the loop race a third connection holds the cohort rows while both requests are sent, and lets go only once both
wait on it, so both requests have started before either can commit."""

import threading

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from quotas.models import Cohort, CohortQuota
from tests.support.racing import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_on_locks() -> int:
    """How many other connections to this database wait for a lock now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def race_past_held_cohort_rows(racers: list[threading.Thread]) -> None:
    """Hold every cohort row locked in a connection of its own (as a cohort write does), start ``racers``, let go
    once all wait on that lock (or one has ended), then join them all; each racer closes its own connection."""
    held, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                list(Cohort.objects.select_for_update().values_list("pk", flat=True))
                held.set()
                release.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(60)
    for racer in racers:
        racer.start()
    try:
        while waiting_on_locks() < len(racers) and all(racer.is_alive() for racer in racers):
            threading.Event().wait(0.05)
    finally:
        release.set()
        for thread in (holder, *racers):
            thread.join(60)
        connection.close()


def test_two_parent_changes_that_together_close_a_loop_store_one(staff):
    a, b = Cohort.objects.create(name="a"), Cohort.objects.create(name="b")
    connection.close()
    answers = {}

    def patch(cohort, parent):
        def run():
            try:
                client = APIClient()
                client.force_authenticate(staff.user)
                answers[cohort.name] = client.patch(f"/api/v1/cohorts/{cohort.pk}/", {"parent": parent},
                                                    format="json")
            finally:
                connection.close()
        return threading.Thread(target=run)

    race_past_held_cohort_rows([patch(a, "b"), patch(b, "a")])
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [200, 400], [r.content for r in answers.values()]
    refused = next(r for r in answers.values() if r.status_code == 400)
    assert "loop back" in refused.json()["parent"][0]
    links = dict(Cohort.objects.values_list("name", "parent__name"))
    assert links in ({"a": "b", "b": None}, {"a": None, "b": "a"})


RACERS = 6


def staff_posts(staff, url, body):
    def run():
        client = APIClient()
        client.force_authenticate(staff.user)
        return client.post(url, body, format="json")
    return run


def test_concurrent_cohorts_of_one_name_store_one_and_answer_400_to_the_rest(staff):
    connection.close()
    answers, errors = run_concurrently(*[staff_posts(staff, "/api/v1/cohorts/", {"name": "research"})] * RACERS)
    assert errors == []
    assert sorted(a.status_code for a in answers) == [201] + [400] * (RACERS - 1), [a.content for a in answers]
    assert all(a.json() == {"name": ["cohort with this name already exists."]}
               for a in answers if a.status_code == 400)
    assert Cohort.objects.filter(name="research").count() == 1


def test_concurrent_quotas_of_one_cohort_and_accelerator_store_one_and_answer_400_to_the_rest(staff, h100):
    Cohort.objects.create(name="research")
    connection.close()
    body = {"cohort": "research", "accelerator": h100.name, "nominal_gpus": 8}
    answers, errors = run_concurrently(*[staff_posts(staff, "/api/v1/cohort-quotas/", body)] * RACERS)
    assert errors == []
    assert sorted(a.status_code for a in answers) == [201] + [400] * (RACERS - 1), [a.content for a in answers]
    assert all(a.json() == {"accelerator": [f"cohort research already has a quota of {h100.name}: change that one"]}
               for a in answers if a.status_code == 400)
    assert CohortQuota.objects.filter(cohort__name="research").count() == 1
