"""Filters of the price catalog list, by provider, region, accelerator name and capacity type."""

from __future__ import annotations

import django_filters

from ..models import Price


class PriceFilterSet(django_filters.FilterSet):
    """Prices by ``provider``, ``region``, ``accelerator`` (name), ``capacity_type`` and ``cluster`` (name)."""

    accelerator = django_filters.CharFilter(field_name="accelerator__name")
    cluster = django_filters.CharFilter(field_name="cluster__name")

    class Meta:
        model = Price
        fields = ["provider", "region", "accelerator", "capacity_type", "cluster"]
