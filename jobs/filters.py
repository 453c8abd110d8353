"""Which jobs: the one filter set behind the REST job list and the web UI's job list (NetBox's pattern)."""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import django_filters
from django import forms
from django.core.exceptions import ValidationError

from core.fields import DATETIME_FORMAT_HINT, plus_sign_hint

from .models import Job, JobState


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


class CommaMultipleChoiceField(forms.MultipleChoiceField):
    """A multiple choice that also takes comma-separated values (``?state=SUCCEEDED,CANCELLED``, as the CLI
    does), matched without regard to case; an unknown value's error lists the valid ones."""

    def to_python(self, value):
        values = super().to_python(value)
        by_folded = {str(choice).casefold(): choice for choice, _ in self.choices}
        split = [part.strip() for item in values for part in str(item).split(",") if part.strip()]
        return [by_folded.get(part.casefold(), part) for part in split]

    def validate(self, value):
        if self.required and not value:
            raise ValidationError(self.error_messages["required"], code="required")
        valid = [str(choice) for choice, _ in self.choices]
        unknown = [v for v in value if v not in valid]
        if unknown:
            raise ValidationError("unknown %(unknown)s; one of %(valid)s (repeat the parameter or separate values "
                                  "by commas)", code="invalid_choice",
                                  params={"unknown": ", ".join(unknown), "valid": ", ".join(valid)})


class CommaMultipleChoiceFilter(django_filters.MultipleChoiceFilter):
    field_class = CommaMultipleChoiceField


class ListedChoiceField(forms.ChoiceField):
    """A choice whose error for an unknown value lists the valid ones."""

    def validate(self, value):
        try:
            super().validate(value)
        except ValidationError as exc:
            if exc.code != "invalid_choice":
                raise
            valid = ", ".join(str(choice) for choice, _ in self.choices if choice != "")
            raise ValidationError('unknown value "%(value)s"; one of %(valid)s', code="invalid_choice",
                                  params={"value": value, "valid": valid}) from None


class ListedChoiceFilter(django_filters.ChoiceFilter):
    field_class = ListedChoiceField


class AwareDateTimeFormField(forms.DateTimeField):
    """An ISO 8601 datetime (a date alone means its midnight UTC); an error gives the format, and for an offset
    whose ``+`` arrived as a space, the hint to percent-encode it."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local", "step": 1}, format="%Y-%m-%dT%H:%M:%S")

    def to_python(self, value):
        try:
            return super().to_python(value)
        except ValidationError:
            hint = plus_sign_hint(value) if isinstance(value, str) else ""
            # Passed as params: the filter backend and the form both %-format the message.
            raise ValidationError("Enter a date/time as %(format)s%(hint)s", code="invalid",
                                  params={"format": DATETIME_FORMAT_HINT, "hint": hint}) from None


class AwareDateTimeFilter(UTCIsoDateTimeFilter):
    """``UTCIsoDateTimeFilter`` whose errors give the format (``AwareDateTimeFormField``)."""

    field_class = AwareDateTimeFormField


#: The job list's ``kind`` that keeps every kind (the web form's default, so filtering by state keeps every job).
ANY_KIND = "any"


#: The largest id a filter takes: PostgreSQL's bigint (a larger number would be an error from the database).
MAX_ID = 2 ** 63 - 1


class IdFilter(django_filters.NumberFilter):
    """An object's id: a whole number from 1 to ``MAX_ID`` (a fraction or a number past the database's integers is
    refused with the bounds, not queried)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


class JobFilterSet(django_filters.FilterSet):
    """Job list filters; every value is a name, never a database id.

    ``team`` (slug), ``state`` (repeatable or comma-separated:
    ``?state=QUEUED&state=RUNNING`` or ``?state=QUEUED,RUNNING``), ``kind``
    (training, inference, multi-role, or ``any``: every kind, as without it),
    ``accelerator`` (name), ``cluster`` (name of the cluster of the current
    attempt), ``submitter`` (username), ``array`` (an array's id: its elements),
    ``created_after`` / ``created_before``
    (ISO 8601 datetimes, ``[after, before)``; without an offset: UTC), and
    ``ordering`` by ``created_at`` or ``priority`` (``-`` for descending).
    Unknown choices are refused with the valid ones listed. Scoping to the
    user's teams happens before this filter set runs.
    """

    team = django_filters.CharFilter(field_name="team__slug", label="Team (slug)")
    state = CommaMultipleChoiceFilter(choices=JobState.choices, label="State")
    kind = ListedChoiceFilter(choices=[(ANY_KIND, "Any"), *Job.Kind.choices], label="Kind", method="filter_kind")
    accelerator = django_filters.CharFilter(field_name="accelerator__name", label="Accelerator")
    cluster = django_filters.CharFilter(field_name="current_attempt__cluster__name", label="Cluster")
    submitter = django_filters.CharFilter(field_name="submitter__username", label="Submitted by (username)")
    array = IdFilter(field_name="array_id", label="Array (id)")
    created_after = AwareDateTimeFilter(field_name="created_at", lookup_expr="gte", label="Submitted from (UTC)")
    created_before = AwareDateTimeFilter(field_name="created_at", lookup_expr="lt", label="Submitted before (UTC)")
    ordering = django_filters.OrderingFilter(fields=("created_at", "priority"), label="Order by")

    def filter_kind(self, queryset, name, value):
        """``kind``: one kind; ``any`` (the form's first choice) or empty keeps every kind."""
        return queryset if value in ("", ANY_KIND) else queryset.filter(kind=value)

    class Meta:
        model = Job
        fields = ["team", "state", "kind", "accelerator", "cluster", "submitter", "array", "created_after", "created_before"]
