"""Staff changing cohorts' parents in the Django admin at the same moment: two changes, each alone fine, together a
loop (a's parent b, b's parent a) save one and show the other its form again with the loop's reason, so the stored
links never loop (the API's writes hold the same lock: ADR 0046). A third connection holds the cohort rows while both
forms are posted, and lets go only once both wait on it, so both have started before either can commit."""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from quotas.models import Cohort

from .api.test_cohort_parent_races import race_past_held_cohort_rows

pytestmark = pytest.mark.django_db(transaction=True)

INLINE = {"quotas-TOTAL_FORMS": "0", "quotas-INITIAL_FORMS": "0", "quotas-MIN_NUM_FORMS": "0",
          "quotas-MAX_NUM_FORMS": "1000"}


def test_two_admin_parent_changes_that_together_close_a_loop_save_one():
    a, b = Cohort.objects.create(name="a"), Cohort.objects.create(name="b")
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")
    connection.close()
    answers, errors = {}, []

    def post(cohort, parent):
        def run():
            try:
                client = Client()
                client.login(username="root", password="pw-root")
                answers[cohort.name] = client.post(f"/admin/quotas/cohort/{cohort.pk}/change/",
                                                   {"name": cohort.name, "parent": parent.pk, "weight": "1",
                                                    "audit_reason": "", **INLINE})
            except Exception as exc:  # the test client raises what the view let through
                errors.append(exc)
            finally:
                connection.close()
        return threading.Thread(target=run)

    race_past_held_cohort_rows([post(a, b), post(b, a)])
    assert not errors, errors
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [200, 302], statuses  # 200: the form again, with its error
    refused = next(r for r in answers.values() if r.status_code == 200)
    assert "loop back" in refused.content.decode()
    links = dict(Cohort.objects.values_list("name", "parent__name"))
    assert links in ({"a": "b", "b": None}, {"a": None, "b": "a"})
