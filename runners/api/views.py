"""``/api/v1/accelerators/``, ``clusters/`` and ``node-pools/``: the shared GPU fleet, readable by every user.

Clusters and their pools are platform infrastructure, not team objects, so
every authenticated user sees all of them; only staff create or update
clusters.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins

from core.permissions import IsStaffOrReadOnly
from core.viewsets import ScopedGenericViewSet, ScopedReadOnlyViewSet

from ..models import Accelerator, Cluster, NodePool
from .filtersets import ClusterFilterSet, NodePoolFilterSet
from .serializers import AcceleratorSerializer, ClusterSerializer, NodePoolSerializer


@extend_schema(tags=["fleet"])
class AcceleratorViewSet(ScopedReadOnlyViewSet):
    """The accelerator catalog (GPU models); the same for every user."""

    queryset = Accelerator.objects.all()
    serializer_class = AcceleratorSerializer
    ordering_fields = ["name", "memory_gib"]

    def scope_queryset(self, queryset, user):
        return queryset  # a global catalog


@extend_schema(tags=["fleet"])
class ClusterViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     mixins.UpdateModelMixin, ScopedGenericViewSet):
    """Clusters with their node pools, free GPUs and prices now; staff create and update, others read."""

    queryset = Cluster.objects.prefetch_related("node_pools__accelerator", "node_pools__cluster")
    serializer_class = ClusterSerializer
    permission_classes = [IsStaffOrReadOnly]
    filterset_class = ClusterFilterSet
    ordering_fields = ["name", "provider", "region"]

    def scope_queryset(self, queryset, user):
        return queryset  # shared infrastructure: every user may see where jobs can run


@extend_schema(tags=["fleet"])
class NodePoolViewSet(ScopedReadOnlyViewSet):
    """Node pools of every cluster with capacity, free GPUs and price per GPU-hour now."""

    queryset = NodePool.objects.select_related("cluster", "accelerator")
    serializer_class = NodePoolSerializer
    filterset_class = NodePoolFilterSet
    ordering_fields = ["name", "gpus_per_node"]

    def scope_queryset(self, queryset, user):
        return queryset  # shared infrastructure
