"""``/api/v1/accelerators/``, ``clusters/``, ``node-pools/`` and ``nodes/``: the shared GPU fleet, readable by every user.

Clusters, their pools and nodes are platform infrastructure, not team
objects, so every authenticated user sees all of them; only staff create or
update clusters, and cordon, drain, uncordon or clear the health of a node. Each of
those writes appends an audit record in its transaction, with the reason of
the ``X-Audit-Reason`` header (a cordon's note is its reason; ADR 0031).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.response import Response

from core.permissions import IsStaffOrReadOnly
from core.viewsets import ScopedGenericViewSet, ScopedReadOnlyViewSet
from quotas.audit import AuditedWriteMixin, reason_of

from .. import health
from ..models import Accelerator, Cluster, Node, NodePool
from .filtersets import ClusterFilterSet, NodeFilterSet, NodePoolFilterSet
from .serializers import (
    AcceleratorSerializer,
    ClusterSerializer,
    CordonSerializer,
    DrainedNodeSerializer,
    NodePoolSerializer,
    NodeSerializer,
)


@extend_schema(tags=["fleet"])
class AcceleratorViewSet(ScopedReadOnlyViewSet):
    """The accelerator catalog (GPU models); the same for every user."""

    queryset = Accelerator.objects.all()
    serializer_class = AcceleratorSerializer
    ordering_fields = ["name", "memory_gib"]

    def scope_queryset(self, queryset, user):
        return queryset  # a global catalog


@extend_schema(tags=["fleet"])
class ClusterViewSet(AuditedWriteMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
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


@extend_schema(tags=["fleet"])
class NodeViewSet(ScopedReadOnlyViewSet):
    """GPU nodes of every cluster with their health and its evidence; staff cordon, drain, uncordon and clear them."""

    queryset = Node.objects.select_related("cluster", "node_pool")
    serializer_class = NodeSerializer
    permission_classes = [IsStaffOrReadOnly]
    filterset_class = NodeFilterSet
    ordering_fields = ["name", "health"]

    def scope_queryset(self, queryset, user):
        return queryset  # shared infrastructure

    @extend_schema(request=CordonSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"], filter_backends=[])
    def cordon(self, request, pk=None):
        """Cordon the node in the platform: admission keeps off it (Kubernetes is not touched). Staff only."""
        body = CordonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node = health.cordon(self.get_object(), request.user, body.validated_data["note"] or reason_of(request))
        return Response(NodeSerializer(node).data)

    @extend_schema(request=CordonSerializer, responses=DrainedNodeSerializer)
    @action(detail=True, methods=["post"], filter_backends=[])
    def drain(self, request, pk=None):
        """Drain the node: cordon it (audited as a cordon, the note or else ``X-Audit-Reason`` its reason), then end
        the live attempts placed on it as ``Preempted`` (no retry used) and send their jobs back to admission, which
        keeps off the node. Staff only."""
        body = CordonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node, moved = health.drain(self.get_object(), request.user, body.validated_data["note"] or reason_of(request))
        node.preempted_attempts = moved
        return Response(DrainedNodeSerializer(node).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"], filter_backends=[])
    def uncordon(self, request, pk=None):
        """Lift a staff cordon: admission may use the node again. Staff only."""
        return Response(NodeSerializer(health.uncordon(self.get_object(), request.user, reason_of(request))).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"], filter_backends=[])
    def clear(self, request, pk=None):
        """Clear the node's health: healthy again; the evidence seen so far no longer counts (a new XID code, a
        count that grows, a new condition reason or a new lost attempt does). Staff only."""
        node = health.clear(self.get_object(), user=request.user, reason=reason_of(request))
        return Response(NodeSerializer(node).data)
