"""Which jobs: the one filter set behind the REST job list and the web UI's job list (NetBox's pattern)."""

from __future__ import annotations

import datetime as dt

import django_filters

from .models import Job, JobState


UTC = dt.timezone.utc


def as_utc(value: dt.datetime) -> dt.datetime:
    """``value`` (aware) as the same instant in UTC; an instant before ``datetime.min`` or after ``datetime.max``
    in UTC (year 1 with a positive offset, year 9999 with a negative one) is clamped to that bound.

    A datetime is sent to the database in UTC: PostgreSQL refuses UTC offsets of +/-16:00 and more (its
    ``timestamptz`` input stops at 15:59), which Python's ``datetime`` and ISO 8601 allow (up to 23:59).
    """
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return dt.datetime.min.replace(tzinfo=UTC) if value.year == 1 else dt.datetime.max.replace(tzinfo=UTC)


class UTCIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 datetime filter (``Z`` or any offset up to 23:59) that queries with the instant in UTC."""

    def filter(self, qs, value):
        return super().filter(qs, as_utc(value) if isinstance(value, dt.datetime) and value.tzinfo else value)


class JobFilterSet(django_filters.FilterSet):
    """Job list filters; every value is a name, never a database id.

    ``team`` (slug), ``state`` (repeatable: ``?state=QUEUED&state=RUNNING``),
    ``kind``, ``accelerator`` (name), ``cluster`` (name of the cluster of
    the current attempt), ``submitter`` (username), ``created_after`` /
    ``created_before`` (ISO 8601 datetimes, ``[after, before)``), and
    ``ordering`` by ``created_at`` or ``priority`` (``-`` for descending).
    Scoping to the user's teams happens before this filter set runs.
    """

    team = django_filters.CharFilter(field_name="team__slug")
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    kind = django_filters.ChoiceFilter(choices=Job.Kind.choices)
    accelerator = django_filters.CharFilter(field_name="accelerator__name")
    cluster = django_filters.CharFilter(field_name="current_attempt__cluster__name")
    submitter = django_filters.CharFilter(field_name="submitter__username")
    created_after = UTCIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UTCIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    ordering = django_filters.OrderingFilter(fields=("created_at", "priority"))

    class Meta:
        model = Job
        fields = ["team", "state", "kind", "accelerator", "cluster", "submitter", "created_after", "created_before"]
