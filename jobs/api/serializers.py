"""Read serializers of jobs, their attempts and events, and the query parameters of the logs endpoint.

Job creation is validated by the models of ``jobs.spec`` (``JobSubmission``); these
serializers only present what is stored. Money is shown in USD cents.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.fields import SharedFieldsMixin, UsdCentsField
from core.money import shown_usd
from costs.unknown import unknown_cost, unknown_cost_json, unpriced_hours

from ..dependencies import edges_of
from ..models import PRIORITY_CLASSES, Job, JobAttempt, JobEvent, roles_in_order
from ..roles import job_roles
from ..service import serving_status
from ..workload import job_efficiency

PRIORITY_NAMES = {value: name for name, value in PRIORITY_CLASSES.items()}


class AttemptSummarySerializer(SharedFieldsMixin, serializers.ModelSerializer):
    """The current attempt in a job view: number, where it runs, when, and why it ended."""

    cluster = serializers.CharField(source="cluster.name", read_only=True)
    node_pool = serializers.CharField(source="node_pool.name", read_only=True)
    end_reason = serializers.ChoiceField(choices=JobAttempt.EndReason.choices, allow_blank=True, read_only=True,
                                         help_text='why the attempt ended; "" while it runs')

    class Meta:
        model = JobAttempt
        fields = ["number", "cluster", "node_pool", "started_at", "ended_at", "end_reason"]
        read_only_fields = fields


class JobAttemptSerializer(serializers.ModelSerializer):
    """One dispatch of a job: cluster and node pool, GPUs held, the price at admission (USD/GPU-hour), its end.

    ``accrued_until``: the ledger holds this attempt's cost up to that instant;
    once it equals ``ended_at`` the attempt's cost is final.
    """

    cluster = serializers.CharField(source="cluster.name", read_only=True)
    node_pool = serializers.CharField(source="node_pool.name", read_only=True)
    end_reason = serializers.ChoiceField(choices=JobAttempt.EndReason.choices, allow_blank=True, read_only=True,
                                         help_text='why the attempt ended; "" while it runs')
    nodes = serializers.SerializerMethodField()
    bad_nodes = serializers.ListField(child=serializers.CharField(), read_only=True,
                                      help_text="the nodes whose fault ended it (NodeLost, NodeUnhealthy)")
    deletion_pending_since = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="set while the attempt has ended but its cluster may still run its pods (a cancel sent while the "
                  "cluster did not answer, objects found after the end); null once a look found them gone")

    class Meta:
        model = JobAttempt
        fields = ["id", "number", "cluster", "node_pool", "gpus", "object_name", "usd_per_gpu_hour", "created_at",
                  "started_at", "ended_at", "accrued_until", "end_reason", "exit_code", "message", "nodes", "bad_nodes",
                  "deletion_pending_since"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_nodes(self, attempt: JobAttempt) -> list[str]:
        """The nodes admission placed the attempt on (empty when none was recorded)."""
        return list((attempt.placement or {}).get("nodes") or [])


class JobEventSerializer(serializers.ModelSerializer):
    """A line of the job's timeline: kind (``submitted``, ``state``, ``waiting``...), states, reason, actor."""

    actor = serializers.CharField(source="actor.username", read_only=True, default=None, allow_null=True)
    attempt = serializers.IntegerField(source="attempt.number", read_only=True, default=None, allow_null=True)

    class Meta:
        model = JobEvent
        fields = ["id", "kind", "from_state", "to_state", "reason", "actor", "attempt", "data", "created_at"]
        read_only_fields = fields


@extend_schema_field({"type": "string", "format": "decimal", "example": "12.35", "nullable": True})
class EstimatedCostField(UsdCentsField):
    """``estimated_cost_usd``: null until the job is first placed (the estimate needs the node pool's price) or
    refused for its cost (then the estimate the budget refused)."""

    def __init__(self, **kwargs):
        kwargs["allow_null"] = True
        super().__init__(**kwargs)

    def get_attribute(self, instance):
        if instance.admitted_at is None and instance.current_attempt_id is None and not instance.estimated_cost_usd:
            return None  # never placed nor priced: a stored 0 would read as "free"
        return super().get_attribute(instance)


class JobSerializer(SharedFieldsMixin, serializers.ModelSerializer):
    """A job as the API shows it.

    ``queue_info`` says why a QUEUED job waits (``{"reason": "quota" |
    "budget" | "capacity" | "priority", "message": ..., numbers}``; for
    capacity also ``short_of``: ``gpu``, ``cpu``, ``memory``, ``nodes``,
    ``cordon``, ``health``, ``price`` or ``placement``, and ``pools``: the node
    counts of the pools named; ``overtaken_by`` (job id, team id, GPUs, vCPU)
    and ``overtaken`` (a sentence) once a later job was admitted ahead of it);
    ``position`` is its 1-based place in its team's queue and among all
    waiting jobs (``{"team": n, "overall": m}``) as of the last scheduling
    pass, null before one and once the job no longer waits. ``priority`` is
    the numeric priority (higher first), ``priority_class`` its name. Costs
    are USD strings rounded to cents: ``estimated_cost_usd`` is the worst case
    (GPUs x max runtime x price), null in a list until the job is first placed (or
    refused by a budget: then the refused estimate); the submission's answer and a GET of one QUEUED job not
    yet placed give the preview's estimate (``POST /jobs/preview/``) instead;
    ``accrued_cost_usd`` what the ledger holds; ``cost_unknown`` is null, or
    says since when and for how many GPU-hours the job ran where the catalog
    had no price (those hours are not in ``accrued_cost_usd``). ``array`` and ``array_index``: the job array
    (``/arrays/{id}/``) the job is element ``array_index`` (0-based) of, both null for a job of its own.
    A multi-role job's ``spec.roles`` are in name order.
    ``gpu_share_milli``: for a job on part of one GPU, the share its pod holds in milli-GPUs (250: a quarter;
    ``gpus_per_node`` is then 1, the one device it asks), with ``mig_profile`` for a MIG instance; 0 and "" for a
    job of whole GPUs (docs/adr/0040-gpu-sharing.md).
    ``endpoint`` is the URL an
    inference job serves on while its current attempt runs (see
    :attr:`jobs.models.Job.endpoint`), null otherwise.
    """

    team = serializers.CharField(source="team.slug", read_only=True)
    submitter = serializers.CharField(source="submitter.username", read_only=True)
    accelerator = serializers.CharField(source="accelerator.name", read_only=True)
    priority_class = serializers.SerializerMethodField()
    position = serializers.SerializerMethodField()
    current_attempt = AttemptSummarySerializer(read_only=True, allow_null=True)
    estimated_cost_usd = EstimatedCostField()
    accrued_cost_usd = serializers.SerializerMethodField()
    unpriced_gpu_hours = serializers.SerializerMethodField()
    unpriced_vcpu_hours = serializers.SerializerMethodField()
    total_gpus = serializers.IntegerField(read_only=True)
    cost_unknown = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "team", "submitter", "name", "kind", "spec", "state", "state_reason", "queue_info", "position",
            "current_attempt", "endpoint", "estimated_cost_usd", "accrued_cost_usd", "accelerator", "nodes",
            "gpus_per_node", "gpu_share_milli", "mig_profile", "total_gpus", "priority", "priority_class",
            "preemptible", "max_runtime_seconds", "max_retries", "array", "array_index",
            "created_at", "admitted_at", "started_at", "ended_at", "updated_at", "cost_unknown",
            "unpriced_gpu_hours", "unpriced_vcpu_hours",
        ]
        read_only_fields = fields

    @staticmethod
    def _unpriced(job: Job) -> tuple[float, float]:
        """The job's ``(GPU-hours, vCPU-hours)`` without a price, read once per job (none without the marker)."""
        if "_unpriced_hours" not in job.__dict__:
            known = getattr(job, "has_unpriced_cost", True) is False or job.current_attempt_id is None
            job.__dict__["_unpriced_hours"] = (0.0, 0.0) if known else unpriced_hours(job=job)
        return job.__dict__["_unpriced_hours"]

    @extend_schema_field({"type": "string", "format": "decimal", "example": "12.35", "nullable": True,
                          "description": "priced USD the ledger holds; null when none of it is priced"})
    def get_accrued_cost_usd(self, job: Job) -> str | None:
        return shown_usd(job.accrued_cost_usd, sum(self._unpriced(job)))

    @extend_schema_field(serializers.FloatField(help_text="GPU-hours with no price in force, not in "
                                                          "accrued_cost_usd"))
    def get_unpriced_gpu_hours(self, job: Job) -> float:
        return self._unpriced(job)[0]

    @extend_schema_field(serializers.FloatField(help_text="vCPU-hours (CPU node pools) with no price in force"))
    def get_unpriced_vcpu_hours(self, job: Job) -> float:
        return self._unpriced(job)[1]

    @extend_schema_field({"type": "object", "nullable": True,
                          "properties": {"since": {"type": "string", "format": "date-time"},
                                         "gpu_hours": {"type": "number"}, "message": {"type": "string"}}})
    def get_cost_unknown(self, job: Job) -> dict | None:
        # The viewset's queryset annotates ``has_unpriced_cost`` (``costs.unknown.HAS_UNPRICED``): no query per row;
        # a job never placed has no ledger at all.
        if getattr(job, "has_unpriced_cost", True) is False or job.current_attempt_id is None:
            return None
        return unknown_cost_json(unknown_cost(job=job))

    def to_representation(self, job: Job) -> dict:
        """The job's fields; a multi-role spec's ``roles`` in name order (``jobs.models.roles_in_order``), the
        order the stored spec does not keep on PostgreSQL."""
        data = super().to_representation(job)
        spec = data.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("roles"), dict):
            data["spec"] = {**spec, "roles": roles_in_order(spec["roles"])}
        return data

    @extend_schema_field(serializers.CharField(allow_null=True, help_text=(
        "inference jobs: the URL the server answers on while the current attempt is STARTING or RUNNING "
        "(local runner: http://127.0.0.1:<PORT>; Kubernetes: the Service's in-cluster URL); null otherwise")))
    def get_endpoint(self, job: Job) -> str | None:
        return job.endpoint

    @extend_schema_field(serializers.CharField(allow_null=True, help_text="low, normal or high; null otherwise"))
    def get_priority_class(self, job: Job) -> str | None:
        return PRIORITY_NAMES.get(job.priority)

    @extend_schema_field({"type": "object", "nullable": True,
                          "properties": {"team": {"type": "integer"}, "overall": {"type": "integer"}}})
    def get_position(self, job: Job) -> dict | None:
        if job.state not in ("QUEUED", "RECOVERING"):
            return None
        return (job.queue_info or {}).get("position")


EFFICIENCY_SCHEMA = {
    "type": "object",
    "properties": {
        "tokens_per_s": {"type": "number", "nullable": True, "description": "the latest attempt's run throughput, "
                                                                            "tokens/s over all its GPUs"},
        "mfu_percent": {"type": "number", "nullable": True, "description": "model FLOPs utilization, percent"},
        "mfu_reason": {"type": "string", "description": "why mfu_percent is null; empty when it is not"},
        "flops_per_token": {"type": "number", "nullable": True},
        "tokens": {"type": "integer", "nullable": True, "description": "training tokens of every attempt"},
        "cost_usd": {"type": "string", "format": "decimal", "nullable": True,
                     "description": "the ledger's priced USD, cents; null when none of it is priced"},
        "usd_per_million_tokens": {"type": "string", "format": "decimal", "nullable": True,
                                   "description": "null without tokens, or while some of the job's hours has no "
                                                  "price"},
        "unpriced_gpu_hours": {"type": "number", "description": "GPU-hours with no price in force, not in cost_usd"},
        "unpriced_vcpu_hours": {"type": "number", "description": "vCPU-hours with no price in force"},
        "attempts": {"type": "array", "items": {"type": "object"}},
    },
}


AFTER_SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "job": {"type": "integer", "description": "the id of the job waited for"},
    "name": {"type": "string"},
    "condition": {"type": "string", "enum": ["succeeded", "ended", "failed"]},
    "state": {"type": "string", "description": "the state of the job waited for"},
    "met": {"type": "boolean", "description": "whether the condition holds"}}}}
ROLES_SCHEMA = {
    "type": "object", "nullable": True,
    "description": "multi-role jobs: each role by name (jobs.roles.job_roles); null for other kinds",
    "additionalProperties": {"type": "object", "properties": {
        "pods": {"type": "integer"}, "gpus_per_pod": {"type": "integer"}, "gpus": {"type": "integer"},
        "completion": {"type": "boolean"},
        "gpu_hours": {"type": "number", "description": "GPU-hours its pods held, every attempt"},
        "vcpu_hours": {"type": "number", "description": "vCPU-hours its pods requested, every attempt"},
        "cost_usd": {"type": "string", "format": "decimal", "nullable": True,
                     "description": "its share of the ledger: its GPU-hours, vCPU-hours and GiB-hours at the prices "
                                    "of each ledger entry, cents; null while none of it is priced"},
        "unpriced_hours": {"type": "number", "description": "hours without a price in force, not in cost_usd"},
        "gpu_utilization_percent": {"type": "number", "nullable": True,
                                    "description": "its GPUs' average DCGM utilization (sample weighted), every "
                                                   "attempt; null when never observed"},
        "observed_gpu_hours": {"type": "number", "description": "its GPU-hours covered by DCGM samples"},
        "idle_gpu_hours": {"type": "number", "nullable": True,
                           "description": "observed GPU-hours under the idle threshold; null when never observed"},
        "attribution": {"type": "string", "nullable": True, "enum": ["pod", "node", "gpu-share", None],
                        "description": "how its samples were told from the other roles' (the least exact rule any "
                                       "needed): pod (the series' pod label), node (a node only it holds), "
                                       "gpu-share (a node shared without pod labels, split by the GPUs each role "
                                       "holds there); null when never observed"},
        "tokens_per_s": {"type": "number", "nullable": True,
                         "description": "the sum of its pods' last reported tokens/s; null when none reported"},
        "pod_tokens_per_s": {"type": "array", "items": {"type": "number", "nullable": True},
                             "description": "each pod's last reported tokens/s, by index in the role"},
        "throughput_attempt": {"type": "integer", "nullable": True,
                               "description": "the attempt the throughput is from (the latest that reported)"},
    }},
}

SERVING_SCHEMA = {
    "type": "object", "nullable": True,
    "description": "serving (inference) jobs: the endpoint, replicas and autoscaling (jobs.service.serving_status); "
                   "null for other kinds",
    "properties": {
        "endpoint": {"type": "string", "nullable": True, "description": "the job's one address while it serves"},
        "replicas": {"type": "integer", "description": "replicas now (each admitted, booked and billed)"},
        "replica_addresses": {"type": "array", "items": {"type": "string"}},
        "autoscaling": {"type": "object", "nullable": True, "properties": {
            "min_replicas": {"type": "integer"}, "max_replicas": {"type": "integer"},
            "metric": {"type": "string", "enum": ["in_flight", "rps"]},
            "target_per_replica": {"type": "number"},
            "scale_up_delay_seconds": {"type": "integer"}, "scale_down_delay_seconds": {"type": "integer"},
            "metric_per_replica": {"type": "number", "nullable": True, "description": "the load last read"},
            "desired": {"type": "integer", "nullable": True, "description": "the count last decided"},
            "decided_at": {"type": "string", "format": "date-time", "nullable": True},
            "refusal": {"type": "object", "description": "why the last scale-up was refused ({} if it was not): "
                                                         "reason (quota, budget, capacity), message, replicas, "
                                                         "desired, at, and the numbers"},
            "note": {"type": "string", "description": "why the last pass could not decide; empty when it could"},
        }},
        "rollout": {"type": "object", "nullable": True,
                    "description": "the latest rolling update to another checkpoint (serving.rollout); null if none",
                    "properties": {
                        "state": {"type": "string", "enum": ["rolling", "done", "rolled_back"]},
                        "from": {"type": "integer", "description": "the training job whose checkpoint was served"},
                        "to": {"type": "integer", "description": "the training job whose checkpoint is rolled out"},
                        "replicas_updated": {"type": "integer"},
                        "reason": {"type": "string", "description": "why it ended; empty while rolling"},
                        "note": {"type": "string", "description": "why a step waits; empty when it does not"},
                        "started_at": {"type": "string", "format": "date-time"},
                        "trigger": {"type": "integer", "nullable": True,
                                    "description": "the followed training job whose success started it "
                                                   "(spec.follow); null: started by request"},
                    }},
        "follow": {"type": "object", "nullable": True,
                   "description": "the training job the server follows (spec.follow); null if none",
                   "properties": {
                       "job": {"oneOf": [{"type": "integer"}, {"type": "string"}],
                               "description": "the followed job's id, or its name (every run of that name)"},
                       "newest_run": {"type": "integer", "nullable": True,
                                      "description": "its newest SUCCEEDED run; null while none succeeded"},
                   }},
        "figures": {"type": "object", "nullable": True, "description": (
            "the service's figures over the last hour it served (jobs.serving_figures), null before the first "
            "sample: requests, errors (5xx), tokens, requests_per_second, error_rate_percent, latency_p50_ms and "
            "latency_p99_ms (Prometheus' histogram_quantile over the endpoint's latency buckets), replicas "
            "([[time, count], ...] at each change), gpu_hours, unpriced_gpu_hours, usd, "
            "gpu_hours_per_million_requests, usd_per_million_requests and usd_per_million_tokens (null when "
            "unknown: no requests or tokens, or GPU-hours without a price), window_start, window_end, seconds"),
            "properties": {
                "window_start": {"type": "string", "format": "date-time"},
                "window_end": {"type": "string", "format": "date-time"},
                "seconds": {"type": "number"}, "requests": {"type": "integer"}, "errors": {"type": "integer"},
                "tokens": {"type": "integer"},
                "requests_per_second": {"type": "number", "nullable": True},
                "error_rate_percent": {"type": "number", "nullable": True},
                "latency_p50_ms": {"type": "number", "nullable": True},
                "latency_p99_ms": {"type": "number", "nullable": True},
                "replicas": {"type": "array", "items": {"type": "array"}},
                "gpu_hours": {"type": "number"}, "unpriced_gpu_hours": {"type": "number"},
                "usd": {"type": "string", "nullable": True},
                "gpu_hours_per_million_requests": {"type": "number", "nullable": True},
                "usd_per_million_requests": {"type": "string", "nullable": True},
                "usd_per_million_tokens": {"type": "string", "nullable": True},
            }},
    },
}


class JobDetailSerializer(JobSerializer):
    """A job with its training ``efficiency`` (``jobs.workload.job_efficiency``): throughput, MFU (null with the
    reason on the CPU or without a catalog peak), tokens and USD per million tokens, and each attempt's last and
    mean reports; ``after``: the jobs it waits for (``jobs.dependencies.edges_of``), empty without any; for a
    multi-role job its ``roles`` with each one's GPU-hours, cost, GPU utilization and throughput (``jobs.roles``);
    for a serving job ``serving``: its endpoint, replicas, autoscaling and figures (``jobs.service.serving_status``),
    null for other kinds."""

    efficiency = serializers.SerializerMethodField()
    after = serializers.SerializerMethodField()
    roles = serializers.SerializerMethodField()
    serving = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "after", "efficiency", "roles", "serving"]
        read_only_fields = fields

    @extend_schema_field(AFTER_SCHEMA)
    def get_after(self, job: Job) -> list[dict]:
        known = job.__dict__.get("after_edges")  # set on a job just submitted: no query
        return known if known is not None else edges_of(job)

    @extend_schema_field(EFFICIENCY_SCHEMA)
    def get_efficiency(self, job: Job) -> dict:
        return job_efficiency(job)

    @extend_schema_field(ROLES_SCHEMA)
    def get_roles(self, job: Job) -> dict | None:
        return job_roles(job)

    @extend_schema_field(SERVING_SCHEMA)
    def get_serving(self, job: Job) -> dict | None:
        return serving_status(job)


class LogQuerySerializer(serializers.Serializer):
    """Query parameters of ``jobs/{id}/logs/``: node index (0-based) and how many trailing lines."""

    node = serializers.IntegerField(min_value=0, default=0)
    tail = serializers.IntegerField(min_value=1, max_value=100_000, default=200)


class JobLogsSerializer(serializers.Serializer):
    """The tail of one node's log of the job's current attempt; ``attempt`` is null and ``text`` empty before one."""

    node = serializers.IntegerField()
    attempt = serializers.IntegerField(allow_null=True)
    text = serializers.CharField(allow_blank=True)
