"""Filters of the quota and budget lists, by team slug and accelerator name."""

from __future__ import annotations

import django_filters

from ..models import Budget, ChangeRequest, Quota


class QuotaFilterSet(django_filters.FilterSet):
    """Quotas by ``team`` (slug), ``accelerator`` (name) and ``cluster`` (name)."""

    team = django_filters.CharFilter(field_name="team__slug")
    accelerator = django_filters.CharFilter(field_name="accelerator__name")
    cluster = django_filters.CharFilter(field_name="cluster__name")

    class Meta:
        model = Quota
        fields = ["team", "accelerator", "cluster"]


class BudgetFilterSet(django_filters.FilterSet):
    """Budgets by ``team`` (slug), ``period`` and ``action``."""

    team = django_filters.CharFilter(field_name="team__slug")

    class Meta:
        model = Budget
        fields = ["team", "period", "action"]


class ChangeRequestFilterSet(django_filters.FilterSet):
    """Change requests by ``team`` (slug), ``state`` and ``kind``."""

    team = django_filters.CharFilter(field_name="team__slug")

    class Meta:
        model = ChangeRequest
        fields = ["team", "state", "kind"]
