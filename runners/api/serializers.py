"""Serializers of accelerators, clusters and node pools, with each pool's free GPUs and price now.

Cluster serializers list their fields explicitly: a credential column added
to the model later is never returned by accident.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.fields import StrictCharField
from costs.catalog import NoPrice, Rates, prices_by_pool, rates_at
from costs.models import Price
from jobs.models import JobAttempt
from jobs.scheduling.offers import free_on_nodes, takes_work, unheld_on_nodes

from ..credentials import InvalidKubeconfig, split_userinfo, validate_kubeconfig, without_userinfo
from ..models import Accelerator, Cluster, Node, NodePool


@dataclasses.dataclass(frozen=True)
class PoolStatus:
    """A node pool now: free GPUs (capacity minus live attempts' GPUs) and USD per GPU-hour (None if unpriced)."""

    free_gpus: int
    usd_per_gpu_hour: Decimal | None
    #: A CPU node pool's USD per vCPU-hour and per GiB-hour of memory (None: not priced by CPU, or unpriced).
    usd_per_vcpu_hour: Decimal | None = None
    usd_per_gib_hour: Decimal | None = None


def pool_statuses(pools: list[NodePool], at: dt.datetime | None = None) -> dict[int, PoolStatus]:
    """Free GPUs and price in force at ``at`` (default now) for each pool, keyed by pool id; three queries in all.

    Free GPUs count attempts that have not ended, as admission does
    (``jobs.scheduling.offers.pool_offers``); prices follow ``costs.catalog.rates_at``.
    """
    at = at or timezone.now()
    if not pools:
        return {}
    in_use = dict(
        JobAttempt.objects.filter(node_pool__in=pools, ended_at__isnull=True)
        .values_list("node_pool_id")
        .annotate(n=Sum("gpus"))
    )
    prices = prices_by_pool(pools, Price.objects.filter(accelerator_id__in={p.accelerator_id for p in pools},
                                                        effective_from__lte=at))
    statuses = {}
    for pool in pools:
        try:
            rates = rates_at(pool, at, prices[pool.pk])
        except NoPrice:
            rates = Rates(None)
        statuses[pool.pk] = PoolStatus(max(pool.capacity_gpus - in_use.get(pool.pk, 0), 0), *rates)
    return statuses


def node_health_summary(rows: list[tuple[str, str, bool]]) -> dict:
    """``{"nodes", "healthy", "suspect", "unhealthy", "unhealthy_nodes", "suspect_nodes", "cordoned_nodes"}`` of
    ``(name, health, cordoned)`` rows."""
    out = {"nodes": len(rows), **{h: sum(1 for _, x, _ in rows if x == h) for h in Node.Health.values}}
    out["unhealthy_nodes"] = sorted(n for n, h, _ in rows if h == Node.Health.UNHEALTHY)
    out["suspect_nodes"] = sorted(n for n, h, _ in rows if h == Node.Health.SUSPECT)
    out["cordoned_nodes"] = sorted(n for n, _, c in rows if c)
    return out


def node_health_by_cluster() -> dict[int, dict]:
    """``node_health_summary`` of every cluster's nodes, by cluster id (one query)."""
    rows: dict[int, list] = {}
    for cluster_id, name, health, cordoned in Node.objects.values_list("cluster_id", "name", "health", "cordoned"):
        rows.setdefault(cluster_id, []).append((name, health, cordoned))
    return {pk: node_health_summary(lst) for pk, lst in rows.items()}


class AcceleratorSerializer(serializers.ModelSerializer):
    """A GPU model: name, memory (GiB), peak dense BF16 TFLOP/s per GPU, Kubernetes product label."""

    class Meta:
        model = Accelerator
        fields = ["id", "name", "memory_gib", "peak_bf16_tflops", "product_label"]
        read_only_fields = fields


class NodePoolSerializer(serializers.ModelSerializer):
    """A node pool with its capacity, GPUs free now and the USD per GPU-hour in force now (null when unpriced).

    The statuses of all pools are computed once per request, on first use,
    and kept in the serializer context (three queries, whatever the page size).
    """

    cluster = serializers.CharField(source="cluster.name", read_only=True)
    accelerator = serializers.CharField(source="accelerator.name", read_only=True)
    capacity_gpus = serializers.IntegerField(read_only=True)
    free_gpus = serializers.SerializerMethodField()
    usd_per_gpu_hour = serializers.SerializerMethodField()
    usd_per_vcpu_hour = serializers.SerializerMethodField()
    usd_per_gib_hour = serializers.SerializerMethodField()

    class Meta:
        model = NodePool
        fields = ["id", "cluster", "name", "accelerator", "capacity_type", "nodes", "gpus_per_node", "capacity_gpus",
                  "free_gpus", "usd_per_gpu_hour", "usd_per_vcpu_hour", "usd_per_gib_hour"]
        read_only_fields = fields

    def _status(self, pool: NodePool) -> PoolStatus:
        statuses = self.context.get("pool_statuses")
        if statuses is None or pool.pk not in statuses:
            statuses = pool_statuses(list(NodePool.objects.select_related("cluster")))
            self.context["pool_statuses"] = statuses
        return statuses[pool.pk]

    @extend_schema_field(serializers.IntegerField())
    def get_free_gpus(self, pool: NodePool) -> int:
        return self._status(pool).free_gpus

    @extend_schema_field(serializers.DecimalField(max_digits=12, decimal_places=6, allow_null=True))
    def get_usd_per_gpu_hour(self, pool: NodePool) -> str | None:
        price = self._status(pool).usd_per_gpu_hour
        return None if price is None else str(price)

    @extend_schema_field(serializers.DecimalField(max_digits=12, decimal_places=6, allow_null=True))
    def get_usd_per_vcpu_hour(self, pool: NodePool) -> str | None:
        """A CPU node pool's price per vCPU-hour (null elsewhere)."""
        price = self._status(pool).usd_per_vcpu_hour
        return None if price is None else str(price)

    @extend_schema_field(serializers.DecimalField(max_digits=12, decimal_places=6, allow_null=True))
    def get_usd_per_gib_hour(self, pool: NodePool) -> str | None:
        """A CPU node pool's price per GiB of memory per hour (null elsewhere)."""
        price = self._status(pool).usd_per_gib_hour
        return None if price is None else str(price)


class ClusterSerializer(serializers.ModelSerializer):
    """A cluster as users see it: where it is, its backend, health, whether its GPUs are emulated, its node pools.

    Staff may create and update the descriptive fields; health, why it is not
    healthy (``health_reason``, "" when healthy), since when (``health_since``,
    UTC; null: healthy since creation), contact time and node pools are
    maintained by the reconcile loop. No credential is ever part of this
    serializer.
    """

    node_pools = NodePoolSerializer(many=True, read_only=True)
    # Write-only: staff set or rotate credentials; no response ever carries them (stored encrypted).
    api_token = serializers.CharField(write_only=True, required=False, allow_blank=True, trim_whitespace=True,
                                      style={"input_type": "password"})
    ca_cert = serializers.CharField(write_only=True, required=False, allow_blank=True, trim_whitespace=False)
    kubeconfig = serializers.CharField(write_only=True, required=False, allow_blank=True, trim_whitespace=False)
    auth_configured = serializers.SerializerMethodField()
    node_health = serializers.SerializerMethodField(
        help_text="its GPU nodes by health, and the names of the unhealthy and cordoned ones (details: nodes/)")

    class Meta:
        model = Cluster
        fields = ["id", "name", "provider", "region", "backend", "api_endpoint", "prometheus_url", "emulated", "health",
                  "health_reason", "health_since", "last_contact_at", "created_at", "node_pools", "node_health",
                  "api_token", "ca_cert", "kubeconfig", "auth_configured"]
        read_only_fields = ["id", "health", "health_reason", "health_since", "last_contact_at", "created_at",
                            "node_pools", "node_health", "auth_configured"]

    @extend_schema_field({"type": "object", "properties": {
        "nodes": {"type": "integer"}, "healthy": {"type": "integer"}, "suspect": {"type": "integer"},
        "unhealthy": {"type": "integer"}, "unhealthy_nodes": {"type": "array", "items": {"type": "string"}},
        "suspect_nodes": {"type": "array", "items": {"type": "string"}},
        "cordoned_nodes": {"type": "array", "items": {"type": "string"}}}})
    def get_node_health(self, cluster: Cluster) -> dict:
        """Counted for every cluster in one query on first use, kept in the serializer context."""
        summary = self.context.get("node_health")
        if summary is None:
            summary = self.context["node_health"] = node_health_by_cluster()
        return summary.get(cluster.pk) or node_health_summary([])

    @extend_schema_field(serializers.BooleanField())
    def get_auth_configured(self, cluster: Cluster) -> bool:
        """Whether a token or kubeconfig is stored (never the credential itself)."""
        return bool(cluster.api_token or cluster.kubeconfig)

    def validate_api_endpoint(self, value: str) -> str:
        """400 for ``user:password@`` in the endpoint: Kubernetes has no basic auth; credentials go in
        ``api_token`` or ``kubeconfig`` (stored encrypted)."""
        if split_userinfo(value)[1]:
            raise serializers.ValidationError("must not carry user:password@; set api_token or kubeconfig instead")
        return value

    def validate_prometheus_url(self, value: str) -> str:
        """The URL without user info; a ``user:password@`` in it is kept apart, encrypted (``prometheus_auth``)."""
        url, auth = split_userinfo(value)
        self._prometheus_auth = auth
        return url

    def validate_kubeconfig(self, value: str) -> str:
        """400 with the reason when the kubeconfig cannot be used (``runners.credentials.validate_kubeconfig``)."""
        if value:
            try:
                validate_kubeconfig(value)
            except InvalidKubeconfig as exc:
                raise serializers.ValidationError(str(exc)) from None
        return value

    def validate(self, attrs: dict) -> dict:
        auth = getattr(self, "_prometheus_auth", "")
        if auth:
            attrs["prometheus_auth"] = auth
        elif "prometheus_url" in attrs:
            attrs["prometheus_auth"] = ""  # a new URL without credentials drops the old ones
        return attrs

    def to_representation(self, cluster: Cluster) -> dict:
        data = super().to_representation(cluster)
        for field in ("api_endpoint", "prometheus_url"):
            if data.get(field):
                data[field] = without_userinfo(data[field])
        return data


class NodeSerializer(serializers.ModelSerializer):
    """One GPU node as the last sync saw it, with its health and the evidence behind it (``runners.health``).

    ``health``: ``healthy``, ``suspect`` (shown, still takes work) or
    ``unhealthy`` (admission keeps off it; its running work was recovered
    elsewhere). ``health_evidence``: ``[{source, signal, severity, message,
    value}]``. ``takes_work``: whether admission may place work on it now
    (schedulable in Kubernetes, not cordoned by staff, not unhealthy).
    ``free_gpus``, ``free_cpu_milli`` (millicores) and ``free_memory_mib``
    (MiB): what is free on it now as admission counts it (allocatable minus
    the live attempts placed on it and the pods the platform does not own;
    ``jobs.scheduling.offers.free_on_nodes``), 0 on a node that does not take
    work; ``allocated_gpus``: its allocatable GPUs held by those attempts and
    pods, whether or not it takes work. ``gpus`` counts physical GPUs;
    ``gpu_sharing``, ``gpu_replicas``, ``mig_devices`` and ``whole_gpus`` say
    how they are shared (ADR 0040).
    """

    cluster = serializers.CharField(source="cluster.name", read_only=True)
    node_pool = serializers.CharField(source="node_pool.name", read_only=True, default=None, allow_null=True)
    takes_work = serializers.SerializerMethodField()
    allocated_gpus = serializers.SerializerMethodField()
    free_gpus = serializers.SerializerMethodField()
    free_cpu_milli = serializers.SerializerMethodField()
    free_memory_mib = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["id", "cluster", "node_pool", "name", "accelerator_label", "capacity_type", "gpus", "cpu_milli",
                  "memory_mib", "allocated_gpus", "free_gpus", "free_cpu_milli", "free_memory_mib", "zone",
                  "topology_domain", "taints", "unschedulable", "schedulable",
                  "problem_conditions", "cordoned", "cordon_note", "health", "health_evidence", "health_changed_at",
                  "health_checked_at", "health_cleared_at", "takes_work", "seen_at", "gpu_sharing", "gpu_replicas",
                  "mig_devices", "whole_gpus"]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_takes_work(self, node: Node) -> bool:
        return takes_work(node)

    def _unheld(self, node: Node) -> tuple[int, int, int]:
        """``(GPUs, millicores, MiB)`` not held on ``node`` (``unheld_on_nodes``); counted for the serialized nodes
        at once on first use (for a list page, its nodes; three queries), kept in the serializer context."""
        unheld = self.context.get("unheld_on_nodes")
        if unheld is None or node.pk not in unheld:
            nodes = list(self.parent.instance) if self.parent is not None and self.parent.instance is not None \
                else [node]
            unheld = self.context["unheld_on_nodes"] = {**(unheld or {}), **unheld_on_nodes(nodes)}
        return unheld[node.pk]

    def _free(self, node: Node) -> tuple[int, int, int]:
        """``(GPUs, millicores, MiB)`` free on ``node`` as admission counts it (``free_on_nodes``)."""
        return free_on_nodes([node], {node.pk: self._unheld(node)})[node.pk]

    @extend_schema_field(serializers.IntegerField())
    def get_allocated_gpus(self, node: Node) -> int:
        """Allocatable GPUs held now (by live attempts or by pods the platform does not own)."""
        return node.gpus - self._unheld(node)[0]

    @extend_schema_field(serializers.IntegerField())
    def get_free_gpus(self, node: Node) -> int:
        return self._free(node)[0]

    @extend_schema_field(serializers.IntegerField())
    def get_free_cpu_milli(self, node: Node) -> int:
        return self._free(node)[1]

    @extend_schema_field(serializers.IntegerField())
    def get_free_memory_mib(self, node: Node) -> int:
        return self._free(node)[2]


class CordonSerializer(serializers.Serializer):
    """A staff cordon: why (shown next to the node)."""

    note = StrictCharField(required=False, allow_blank=True, max_length=400, default="")


class DrainedNodeSerializer(NodeSerializer):
    """The node after a staff drain, with ``preempted_attempts``: how many live attempts placed on it ended as
    ``Preempted`` (no retry used) and went back to admission."""

    preempted_attempts = serializers.IntegerField(read_only=True)

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "preempted_attempts"]
        read_only_fields = fields
