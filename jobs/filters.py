"""Which jobs: the one filter set behind the REST job list and the web UI's job list (NetBox's pattern)."""

from __future__ import annotations

import django_filters

from .models import Job, JobState


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
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    ordering = django_filters.OrderingFilter(fields=("created_at", "priority"))

    class Meta:
        model = Job
        fields = ["team", "state", "kind", "accelerator", "cluster", "submitter", "created_after", "created_before"]
