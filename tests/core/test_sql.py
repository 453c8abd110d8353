"""Raw reads convert parameters and results as the ORM does, so a raw figure equals the ORM's."""

from __future__ import annotations

import datetime as dt
from datetime import UTC
from decimal import Decimal

import pytest

from core.sql import as_date, as_decimal, fetch, placeholders


def test_placeholders_for_an_in_list():
    assert placeholders(3) == "%s, %s, %s"
    with pytest.raises(ValueError):
        placeholders(0)


def test_numeric_results_become_the_decimals_the_orm_gives():
    assert as_decimal(None, 9) is None
    assert as_decimal(Decimal("1.234567891"), 9) == Decimal("1.234567891")
    assert as_decimal(7, 6) == Decimal(7)
    # SQLite hands back floats: 15 significant digits, quantized to the field's places (Django's converter).
    assert as_decimal(0.1, 9) == Decimal("0.100000000")
    assert as_decimal(2 / 3, 6) == Decimal("0.666667")


def test_date_results_from_text_or_date():
    assert as_date("2026-12-01") == dt.date(2026, 12, 1)
    assert as_date(dt.date(2026, 11, 30)) == dt.date(2026, 11, 30)


@pytest.mark.django_db
def test_a_datetime_bound_selects_the_rows_the_orm_selects(django_user_model):
    """Aware datetimes, in any zone, compare as stored: the same users are newer than the bound either way."""
    base = dt.datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    for i in range(4):
        django_user_model.objects.create(username=f"u{i}", date_joined=base + dt.timedelta(minutes=i))
    bound = (base + dt.timedelta(minutes=2)).astimezone(dt.timezone(dt.timedelta(hours=-5)))
    table = django_user_model._meta.db_table
    raw = {r[0] for r in fetch(f'SELECT username FROM "{table}" WHERE date_joined >= %s', [bound])}
    orm = set(django_user_model.objects.filter(date_joined__gte=bound).values_list("username", flat=True))
    assert raw == orm == {"u2", "u3"}


@pytest.mark.django_db
def test_committed_money_counts_active_jobs_only(alpha, beta, owner, h100):
    from jobs.models import JobState, committed_by_team
    from tests.support.factories import make_job_row

    team = alpha
    figures = [(JobState.RUNNING, "10.500000", "2.123456789"), (JobState.ADMITTED, "1.000000", "3.000000001"),
               (JobState.STARTING, "4.000000", "0"), (JobState.QUEUED, "9.000000", "0"),
               (JobState.SUCCEEDED, "5.000000", "1")]
    for state, est, acc in figures:
        make_job_row(team, owner.user, h100, state=state, estimated_cost_usd=Decimal(est), accrued_cost_usd=Decimal(acc))
    # Running: 8.376543211; admitted: over its estimate, 0; starting: 4; queued and succeeded hold nothing.
    assert committed_by_team([team.pk, beta.pk]) == {team.pk: Decimal("12.376543211"),
                                                               beta.pk: Decimal(0)}
