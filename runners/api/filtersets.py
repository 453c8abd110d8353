"""Filters of the cluster and node pool lists, by name (never by database id)."""

from __future__ import annotations

import django_filters

from ..models import Cluster, Node, NodePool


class ClusterFilterSet(django_filters.FilterSet):
    """Clusters by ``provider``, ``region``, ``backend`` and ``health``."""

    class Meta:
        model = Cluster
        fields = ["provider", "region", "backend", "health"]


class NodePoolFilterSet(django_filters.FilterSet):
    """Node pools by ``cluster`` (name), ``accelerator`` (name) and ``capacity_type``."""

    cluster = django_filters.CharFilter(field_name="cluster__name")
    accelerator = django_filters.CharFilter(field_name="accelerator__name")

    class Meta:
        model = NodePool
        fields = ["cluster", "accelerator", "capacity_type"]


class NodeFilterSet(django_filters.FilterSet):
    """Nodes by ``cluster`` (name), ``health`` and ``cordoned``."""

    cluster = django_filters.CharFilter(field_name="cluster__name")

    class Meta:
        model = Node
        fields = ["cluster", "health", "cordoned"]
