"""Where work runs: accelerators (resource flavors), clusters and their node pools.

A cluster is served by one backend (``kubernetes`` or ``local``); its node
pools say how many GPUs of which accelerator it offers, on demand or spot.
"""

import datetime as dt
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Greatest
from django.utils import timezone

from core import lookups
from core.gpus import SHARING_MODES

from .credentials import EncryptedTextField, split_userinfo, with_userinfo

#: The resource flavor of CPU-only work: node pools of nodes without GPUs, jobs with ``gpus_per_node: 0``.
CPU_ACCELERATOR = "CPU"


class Accelerator(models.Model):
    """A GPU model, Kueue's *resource flavor*: ``H100-80GB``, ``A100-80GB``, ``L4``; or ``CPU``
    (``CPU_ACCELERATOR``), the flavor of node pools without GPUs where CPU-only jobs run.

    ``peak_bf16_tflops`` is the peak dense BF16 throughput per GPU in TFLOP/s
    from NVIDIA's data sheets (H100 SXM 989, A100 312, L4 121), used for MFU
    (0 for ``CPU``: no MFU).
    """

    name = models.CharField(max_length=64, unique=True)
    memory_gib = models.PositiveIntegerField(help_text="GPU memory, GiB")
    peak_bf16_tflops = models.DecimalField(max_digits=8, decimal_places=1, help_text="Peak dense BF16 TFLOP/s per GPU")
    # The value Kubernetes nodes carry in the nvidia.com/gpu.product label.
    product_label = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_cpu(self) -> bool:
        """Whether this is the CPU flavor (no GPUs; priced per vCPU-hour and GiB-hour)."""
        return self.name == CPU_ACCELERATOR


def cpu_flavor() -> Accelerator:
    """The ``CPU`` accelerator row, created when missing (no GPU memory, no peak, no GPU product label)."""
    flavor, _ = Accelerator.objects.get_or_create(name=CPU_ACCELERATOR, defaults={
        "memory_gib": 0, "peak_bf16_tflops": 0, "product_label": ""})
    return flavor


class Cluster(models.Model):
    """A place that runs jobs: a Kubernetes cluster, or this machine (``local``).

    Credentials are never returned by the API; ``health`` moves between
    ``healthy``, ``degraded`` and ``unreachable`` from the reconcile probe
    (``runners.cluster_health.set_health``): ``health_reason`` says why it is not
    healthy ("" when it is), ``health_since`` since when it has its current
    health (null: healthy since it was created), and each change of health
    is a ``ClusterEvent``.
    """

    class Provider(models.TextChoices):
        AWS = "aws"
        GCP = "gcp"
        AZURE = "azure"
        OCI = "oci"
        ONPREM = "onprem"
        LOCAL = "local"

    class Backend(models.TextChoices):
        KUBERNETES = "kubernetes"
        LOCAL = "local"

    class Health(models.TextChoices):
        HEALTHY = "healthy"
        DEGRADED = "degraded"
        UNREACHABLE = "unreachable"

    name = models.SlugField(max_length=63, unique=True)
    provider = models.CharField(max_length=16, choices=Provider.choices)
    region = models.CharField(max_length=64)
    backend = models.CharField(max_length=16, choices=Backend.choices)
    api_endpoint = models.URLField(blank=True)
    prometheus_url = models.URLField(blank=True)
    # True when the local runner offers emulated GPUs because this machine has
    # none: jobs then run on the CPU. Shown in the UI and the API.
    emulated = models.BooleanField(default=False)
    # Credentials of the kubernetes backend, encrypted at rest (runners.credentials); write-only in
    # the API, never shown in the admin. A kubeconfig, when set, wins over the endpoint, token and CA.
    api_token = EncryptedTextField(blank=True, default="", help_text="Bearer token (encrypted at rest)")
    ca_cert = EncryptedTextField(blank=True, default="", help_text="PEM CA bundle of the API server (encrypted at rest)")
    kubeconfig = EncryptedTextField(blank=True, default="", help_text="kubeconfig YAML (encrypted at rest)")
    # user:password of a Prometheus behind basic auth: split out of prometheus_url on save, so the URL stored and
    # shown never carries it (runners.credentials.split_userinfo); put back only to query it.
    prometheus_auth = EncryptedTextField(blank=True, default="",
                                         help_text="Prometheus basic auth user:password (encrypted at rest)")
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.HEALTHY)
    last_contact_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    # The lost-cluster clock counts only time the control plane watched (jobs.reconcile, docs/adr/0017): when
    # reconcile last looked at the cluster (whatever the answer), and since when it has watched the cluster fail
    # without a gap longer than CLUSTER_LOST_OBSERVED_GAP_SECONDS between two looks (null: the last look answered).
    last_look_at = models.DateTimeField(null=True, blank=True, help_text="when reconcile last looked (UTC)")
    failing_since = models.DateTimeField(null=True, blank=True,
                                         help_text="start of the failed looks watched without a gap (UTC)")
    health_reason = models.TextField(blank=True, default="", help_text="why it is not healthy (the last failure)")
    health_since = models.DateTimeField(null=True, blank=True, help_text="when its current health began")
    # One reconcile of a cluster at a time (jobs.reconcile.reconcile_leased): the holder (a task id) and the end of
    # its lease; empty and null when no reconcile runs.
    reconcile_lease_holder = models.CharField(max_length=64, blank=True, default="")
    reconcile_lease_until = models.DateTimeField(null=True, blank=True)
    # Where reconcile resumes between full LISTs (jobs.reconcile, docs/adr/0042): ``versions`` ({kind:
    # resourceVersion}, opaque strings the API server gave), ``listed_at`` (ISO time of the last full LIST),
    # ``endpoint`` (the API endpoint they came from), ``looked_at`` (ISO time of the last look that answered) and
    # ``recheck`` (ids of the attempts not yet steady at that look). Empty: the next pass LISTs everything.
    reconcile_watch = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Refuse an ``api_endpoint`` with user info: Kubernetes has no basic auth (removed in 1.19)."""
        super().clean()
        if split_userinfo(self.api_endpoint)[1]:
            raise ValidationError({"api_endpoint": "must not carry user:password@; set api_token or kubeconfig"})

    def save(self, *args, **kwargs) -> None:
        """Save with any ``user:password@`` of ``prometheus_url`` moved to the encrypted ``prometheus_auth``
        (and ``api_endpoint``'s dropped): no URL is ever stored with a credential in it."""
        self.prometheus_url, auth = split_userinfo(self.prometheus_url)
        if auth:
            self.prometheus_auth = auth
        self.api_endpoint = split_userinfo(self.api_endpoint)[0]
        if kwargs.get("update_fields") is not None and auth:
            kwargs["update_fields"] = {*kwargs["update_fields"], "prometheus_auth"}
        super().save(*args, **kwargs)

    @property
    def prometheus_query_url(self) -> str:
        """``prometheus_url`` with its basic-auth credentials, for the HTTP client only (never shown or logged)."""
        return with_userinfo(self.prometheus_url, str(self.prometheus_auth))


class ClusterEvent(models.Model):
    """An append-only record of one change of a cluster's health: from, to, why and when (UTC)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="events")
    from_health = models.CharField(max_length=16, choices=Cluster.Health.choices)
    to_health = models.CharField(max_length=16, choices=Cluster.Health.choices)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["cluster", "-created_at"], name="clusterevent_cluster_time")]

    def __str__(self) -> str:
        return f"{self.cluster_id}: {self.from_health} -> {self.to_health}"


class NodePool(models.Model):
    """A group of identical nodes in a cluster: ``nodes`` x ``gpus_per_node`` GPUs.

    Its price per GPU-hour comes from the effective-dated price catalog
    (``costs.Price``) for the cluster's provider and region, the accelerator
    and the capacity type, or from an override for this cluster.
    """

    class CapacityType(models.TextChoices):
        ON_DEMAND = "on-demand"
        SPOT = "spot"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="node_pools")
    name = models.SlugField(max_length=63)
    accelerator = models.ForeignKey(Accelerator, on_delete=models.PROTECT, related_name="node_pools")
    capacity_type = models.CharField(max_length=16, choices=CapacityType.choices, default=CapacityType.ON_DEMAND)
    nodes = models.PositiveIntegerField()
    gpus_per_node = models.PositiveIntegerField()

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="nodepool_unique_name")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    @property
    def capacity_gpus(self) -> int:
        """Total GPUs of the pool (nodes x GPUs per node)."""
        return self.nodes * self.gpus_per_node


class Node(models.Model):
    """One GPU node of a cluster as the last node sync saw it: what it can hold and what is already asked of it.

    ``gpus`` / ``cpu_milli`` (millicores) / ``memory_mib`` (MiB) are the node's
    allocatable resources (``status.allocatable``); ``foreign_*`` the requests
    of pods on it that the platform does not own (no ``controlplane.io/attempt``
    label; the platform's own pods are counted from live attempts). ``zone``
    is ``topology.kubernetes.io/zone``; ``topology_domain`` the finest
    topology label the provider sets (block, then rack, then zone; ""
    without one). ``schedulable`` is False for a cordoned node
    (``spec.unschedulable``), one not Ready, or one with a NoSchedule or
    NoExecute taint that the platform's pods do not tolerate. Admission
    places each node of a job on one Node; node pools remain the unit of
    price and quota reporting.

    Health (``runners.health``): ``health`` is ``healthy``, ``suspect``
    (evidence worth showing, not enough to keep work off it) or
    ``unhealthy`` (admission keeps off it and its running work is recovered
    elsewhere), with ``health_evidence`` the findings behind it (DCGM GPU
    errors, Kubernetes node conditions, attempts that ended on it for
    infrastructure reasons). ``problem_conditions``: node conditions other
    than Ready whose status is True (node-problem-detector's convention:
    True means a problem). Staff may cordon a node in the platform
    (``cordoned``: admission keeps off it; Kubernetes is not touched) and
    clear its health (``health_cleared_at``: evidence seen up to then no
    longer counts).

    GPU sharing (ADR 0040, ``runners.base.NodeInfo``): ``gpus`` are its
    physical GPUs; ``gpu_sharing`` how they are shared (``GPU_SHARING_MODES``),
    ``gpu_replicas`` the slices of each under time-slicing or MPS (advertised
    as ``slice_resource``), ``mig_devices`` ``{profile: count}`` of its MIG
    devices, ``whole_gpus`` the GPUs a pod can hold alone;
    ``foreign_gpu_slices`` and ``foreign_mig_devices`` what pods the platform
    does not own ask of those.
    """

    class Health(models.TextChoices):
        HEALTHY = "healthy"
        SUSPECT = "suspect"
        UNHEALTHY = "unhealthy"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="gpu_nodes")
    node_pool = models.ForeignKey(NodePool, on_delete=models.SET_NULL, null=True, blank=True, related_name="gpu_nodes")
    name = models.CharField(max_length=253)
    accelerator_label = models.CharField(max_length=128, blank=True, help_text="nvidia.com/gpu.product")
    capacity_type = models.CharField(max_length=16, choices=NodePool.CapacityType.choices,
                                     default=NodePool.CapacityType.ON_DEMAND)
    gpus = models.PositiveIntegerField(help_text="physical GPUs")
    cpu_milli = models.PositiveBigIntegerField(help_text="allocatable CPU, millicores")
    memory_mib = models.PositiveBigIntegerField(help_text="allocatable memory, MiB")
    foreign_gpus = models.PositiveIntegerField(default=0, help_text="GPUs requested by pods the platform does not own")
    foreign_cpu_milli = models.PositiveBigIntegerField(default=0)
    foreign_memory_mib = models.PositiveBigIntegerField(default=0)
    zone = models.CharField(max_length=128, blank=True)
    topology_domain = models.CharField(max_length=253, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    unschedulable = models.BooleanField(default=False, help_text="cordoned (spec.unschedulable)")
    schedulable = models.BooleanField(default=True, help_text="the platform's pods may land on it now")
    problem_conditions = models.JSONField(default=list, blank=True,
                                          help_text="conditions other than Ready with status True: type, reason, message")
    seen_at = models.DateTimeField()
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.HEALTHY)
    health_evidence = models.JSONField(default=list, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    health_checked_at = models.DateTimeField(null=True, blank=True)
    health_cleared_at = models.DateTimeField(null=True, blank=True,
                                             help_text="attempts ended up to this time no longer count")
    # What the evidence showed when staff cleared it: {evidence key: value} (runners.health.cleared).
    health_baseline = models.JSONField(default=dict, blank=True)
    cordoned = models.BooleanField(default=False, help_text="cordoned by staff in the platform: admission keeps off it")
    cordon_note = models.CharField(max_length=500, blank=True)
    gpu_sharing = models.CharField(max_length=16, choices=[(m, m) for m in SHARING_MODES], default="none",
                                   help_text="how its GPUs are shared (GPU feature discovery's labels)")
    gpu_replicas = models.PositiveSmallIntegerField(default=1, help_text="slices of each GPU (time-slicing, MPS)")
    slice_resource = models.CharField(max_length=64, blank=True, help_text="the resource its slices are asked as")
    mig_devices = models.JSONField(default=dict, blank=True, help_text="MIG devices: {profile: count}")
    whole_gpus = models.PositiveIntegerField(null=True, blank=True,
                                             help_text="GPUs a pod can hold alone (null: all of them)")
    foreign_gpu_slices = models.PositiveIntegerField(default=0, help_text="slices asked by pods the platform does not own")
    foreign_mig_devices = models.JSONField(default=dict, blank=True,
                                           help_text="MIG devices asked by pods the platform does not own")

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_name")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class NodeSpan(models.Model):
    """One stretch of time in which node sync saw a GPU node in one state: the node inventory over time, from which
    capacity GPU-hours are counted (``costs.capacity``, OpenCost's node "minutes" as the platform observes them).

    ``gpus`` are the node's allocatable GPUs and ``schedulable`` whether the platform's pods could land on it (False:
    cordoned in Kubernetes or by staff in the platform (``Node.cordoned``), not Ready or tainted, shown apart as
    cordoned capacity); a staff cordon or uncordon ends the open span and opens the next one at that instant
    (``cut_node_span``), so cordoned time counts from the cordon itself, not from the next sync; ``start`` is the sync that first saw the node
    in this state and ``end`` the last sync that saw it so (UTC). A sync that sees the same state again within
    ``NODE_INVENTORY_MAX_GAP_SECONDS`` of ``end`` extends the span to now; a changed state ends the span at that sync
    and opens the next one there, so a node's time is counted once and continuously; a node no longer reported, or
    one seen again only after a longer gap (the cluster or the control plane did not look), keeps ``end`` at its
    last sighting: time nobody observed is not capacity. ``open`` marks the span a sync may still extend (at most one
    per node, a partial unique constraint). The pool, accelerator and capacity type are copied in, so capacity and
    its price outlive a pool's deletion.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="node_spans")
    node_name = models.CharField(max_length=253)
    node_pool = models.ForeignKey(NodePool, on_delete=models.SET_NULL, null=True, blank=True, related_name="node_spans")
    pool_name = models.CharField(max_length=63)
    accelerator = models.ForeignKey(Accelerator, on_delete=models.PROTECT, related_name="node_spans")
    capacity_type = models.CharField(max_length=16, choices=NodePool.CapacityType.choices)
    gpus = models.PositiveIntegerField(help_text="allocatable GPUs")
    # False also for a node cordoned by staff (``Node.cordoned``), whatever Kubernetes says (``record_node_spans``).
    schedulable = models.BooleanField(help_text="False: cordoned, not Ready or tainted against the platform's pods")
    start = models.DateTimeField()
    end = models.DateTimeField()
    open = models.BooleanField(default=True)

    class Meta:
        ordering = ["cluster_id", "node_name", "start"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "node_name"], condition=models.Q(open=True),
                                    name="node_span_one_open_per_node"),
            models.CheckConstraint(condition=models.Q(end__gte=models.F("start")), name="node_span_end_after_start"),
        ]
        indexes = [models.Index(fields=["end"]), models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.node_name} {self.start:%Y-%m-%dT%H:%M:%S}..{self.end:%H:%M:%S}"


def record_node_spans(cluster: Cluster, nodes: list, now) -> None:
    """Extend, end or open ``cluster``'s NodeSpan rows for one node sync at ``now`` (aware UTC): ``nodes`` as
    ``store_nodes`` takes them; nodes without GPUs are not capacity and are skipped. A node cordoned by staff
    (``Node.cordoned``) is not schedulable whatever Kubernetes says. Idempotent: a span is never moved
    backwards (``end`` only grows, to ``now``), and an overlapping sync that opened the same node's span first wins
    (the partial unique constraint), so no node-second is counted twice."""
    gap = dt.timedelta(seconds=settings.NODE_INVENTORY_MAX_GAP_SECONDS)
    spans = {s.node_name: s for s in NodeSpan.objects.filter(cluster=cluster, open=True)}
    staff_cordoned = set(Node.objects.filter(cluster=cluster, cordoned=True).values_list("name", flat=True))
    extend, cut, close, fresh = [], [], [], []
    for info, row, _label, ctype in nodes:
        if info.gpus <= 0:
            continue
        span = spans.pop(info.name, None)
        schedulable = bool(info.schedulable) and info.name not in staff_cordoned
        state = (row.pk, row.accelerator_id, ctype, info.gpus, schedulable)
        if span is not None:
            recent = now - span.end <= gap
            if recent and (span.node_pool_id, span.accelerator_id, span.capacity_type, span.gpus,
                           span.schedulable) == state:
                extend.append(span.pk)
                continue
            (cut if recent else close).append(span.pk)
        fresh.append(NodeSpan(cluster=cluster, node_name=info.name[:253], node_pool_id=row.pk, pool_name=row.name,
                              accelerator_id=row.accelerator_id, capacity_type=ctype, gpus=info.gpus,
                              schedulable=schedulable, start=now, end=now))
    close += [s.pk for s in spans.values()]  # no longer reported: its time ends at its last sighting
    if extend:
        NodeSpan.objects.filter(pk__in=extend, open=True).update(end=Greatest("end", models.Value(now)))
    if cut:  # the state changed between two close looks: the old state holds until this sync
        NodeSpan.objects.filter(pk__in=cut, open=True).update(end=Greatest("end", models.Value(now)), open=False)
    if close:
        NodeSpan.objects.filter(pk__in=close, open=True).update(open=False)
    NodeSpan.objects.bulk_create(fresh, ignore_conflicts=True)


def cut_node_span(node: Node, now: dt.datetime) -> None:
    """After a staff cordon or uncordon of ``node`` (a Node row, saved) at ``now`` (aware UTC): end its open NodeSpan
    at ``now`` and open the next one there in the node's new state (schedulable: schedulable in Kubernetes and not
    cordoned by staff), so cordoned capacity counts from the cordon itself. Nothing is done when the span's state is
    already that one, when there is no open span, or when its last sighting is older than
    ``NODE_INVENTORY_MAX_GAP_SECONDS`` (time nobody observed is not capacity; the next sync opens the span). Call it
    in the transaction that writes the cordon."""
    schedulable = node.schedulable and not node.cordoned
    span = NodeSpan.objects.select_for_update().filter(cluster_id=node.cluster_id, node_name=node.name,
                                                       open=True).first()
    if span is None or span.schedulable == schedulable or \
            now - span.end > dt.timedelta(seconds=settings.NODE_INVENTORY_MAX_GAP_SECONDS):
        return
    NodeSpan.objects.filter(pk=span.pk).update(end=Greatest("end", models.Value(now)), open=False)
    NodeSpan.objects.create(cluster_id=span.cluster_id, node_name=span.node_name, node_pool_id=span.node_pool_id,
                            pool_name=span.pool_name, accelerator_id=span.accelerator_id,
                            capacity_type=span.capacity_type, gpus=span.gpus, schedulable=schedulable,
                            start=max(now, span.end), end=max(now, span.end))


#: The Node fields a sync rewrites.
NODE_FIELDS = ["node_pool", "accelerator_label", "capacity_type", "gpus", "cpu_milli", "memory_mib", "foreign_gpus",
               "foreign_cpu_milli", "foreign_memory_mib", "zone", "topology_domain", "labels", "taints",
               "unschedulable", "schedulable", "problem_conditions", "seen_at", "gpu_sharing", "gpu_replicas",
               "slice_resource", "mig_devices", "whole_gpus", "foreign_gpu_slices", "foreign_mig_devices"]


def store_nodes(cluster: Cluster, nodes: list) -> int:
    """Make ``cluster``'s Node rows match ``nodes``: ``(info, pool row, accelerator label, capacity type)`` with
    ``info`` a ``runners.base.NodeInfo``; insert or update each by name, delete those no longer reported. Call it
    inside the transaction that writes the cluster's pools. Returns how many nodes are stored. Idempotent: a node
    inserted by an overlapping call meanwhile is updated (an upsert on ``(cluster, name)``), never a duplicate."""
    now = timezone.now()
    existing = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    fresh, changed = [], []
    for info, row, label, ctype in nodes:
        values = {"node_pool_id": row.pk, "accelerator_label": (label or "")[:128], "capacity_type": ctype,
                  "gpus": info.gpus, "cpu_milli": info.cpu_milli, "memory_mib": info.memory_mib,
                  "foreign_gpus": info.foreign_gpus, "foreign_cpu_milli": info.foreign_cpu_milli,
                  "foreign_memory_mib": info.foreign_memory_mib, "zone": info.zone[:128],
                  "topology_domain": info.topology_domain[:253], "labels": dict(info.labels),
                  "taints": [{"key": k, "value": v, "effect": e} for k, v, e in info.taints],
                  "unschedulable": info.unschedulable, "schedulable": info.schedulable,
                  "problem_conditions": [{"type": t, "reason": r, "message": m} for t, r, m in info.problem_conditions],
                  "seen_at": now, "gpu_sharing": info.sharing, "gpu_replicas": info.gpu_replicas,
                  "slice_resource": info.slice_resource, "mig_devices": dict(info.mig_devices),
                  "whole_gpus": None if info.whole_gpus is None or info.whole_gpus == info.gpus else info.whole_gpus,
                  "foreign_gpu_slices": info.foreign_gpu_slices, "foreign_mig_devices": dict(info.foreign_mig_devices)}
        node = existing.pop(info.name, None)
        if node is None:
            fresh.append(Node(cluster=cluster, name=info.name, **values))
            continue
        if any(getattr(node, k) != v for k, v in values.items() if k != "seen_at"):
            for key, value in values.items():
                setattr(node, key, value)
            changed.append(node)
    # An upsert: a node another writer of this cluster's nodes (an overlapping sync) inserted since ``existing``
    # was read is updated, not a duplicate key that aborts the sync (concurrent writers of one derived row).
    Node.objects.bulk_create(fresh, update_conflicts=True, unique_fields=["cluster", "name"], update_fields=NODE_FIELDS)
    if changed:
        Node.objects.bulk_update(changed, NODE_FIELDS)
    if existing:
        Node.objects.filter(pk__in=[n.pk for n in existing.values()]).delete()
    record_node_spans(cluster, nodes, now)
    if fresh or changed or existing:
        lookups.changed(Node)  # bulk writes send no signal: what submission checks read of the fleet is cached
    return len(nodes)


class Installation(models.Model):
    """This control plane's identity: one row, made by the migration that adds the table (ADR 0011).

    ``uid`` labels every object the platform creates on a cluster, so objects
    of another installation sharing the cluster are never taken for this
    one's. ``restored_at``: set by ``manage.py after_restore`` when the
    database was restored from a backup (None: no recovery in progress);
    while set, reconcile never restarts an attempt made before it whose
    objects are gone without an end record, but waits for a staff decision.
    ``recovery_point``: the latest instant the restored database knew of
    (its newest event or ledger entry), where the gap starts.
    """

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    restored_at = models.DateTimeField(null=True, blank=True)
    recovery_point = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"installation {self.uid}"


def installation() -> Installation:
    """The one Installation row (made on first use where the migration did not run, e.g. a test database)."""
    row = Installation.objects.order_by("pk").first()
    return row if row is not None else Installation.objects.create()


#: The installation's uid, which dispatch labels every object with: read once per process (it never changes; a
#: restored database has the same row).
INSTALLATION_UID = lookups.LookupCache("installation-uid").invalidate_on(Installation)


def installation_uid() -> str:
    """``installation().uid`` as a string, from ``INSTALLATION_UID``."""
    return INSTALLATION_UID.get("uid", lambda: str(installation().uid))
