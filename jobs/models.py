"""Jobs, their attempts on clusters, and the append-only event timeline.

State changes go through ``jobs.states.transition`` only: a compare-and-set
UPDATE on the current state with a JobEvent in the same transaction.
"""

from decimal import Decimal

from django.conf import settings
from django.db import models

from quotas.models import DEFAULT_PRIORITY_CLASSES, scope_to_teams


class JobState(models.TextChoices):
    """The job states of DESIGN.md."""

    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED})
# States in which a job holds quota and cluster capacity.
ACTIVE_STATES = frozenset({JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.CANCELLING})

# The default priority classes (name -> value), defined with the PriorityClass model; the table's rows, read by
# ``quotas.models.priority_classes()``, are the ones in force.
PRIORITY_CLASSES = DEFAULT_PRIORITY_CLASSES


class JobQuerySet(models.QuerySet):
    def visible_to(self, user) -> "JobQuerySet":
        """Jobs of the teams ``user`` belongs to; all jobs for staff."""
        return scope_to_teams(self, user)


class Job(models.Model):
    """A training or inference job submitted by a team member.

    ``spec`` is the validated job spec (image, command, args, env, resources,
    priority, max_runtime_seconds, preemptible, placement, max_retries,
    replicas). The resource fields used by admission are copied to columns.
    Costs are USD; ``estimated_cost_usd`` is total GPUs x max_runtime x the
    price of the node pool it was placed on.
    """

    class Kind(models.TextChoices):
        TRAINING = "training"
        INFERENCE = "inference"

    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="jobs")
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=63)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TRAINING)
    spec = models.JSONField()
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="jobs")
    gpus_per_node = models.PositiveIntegerField()
    nodes = models.PositiveIntegerField()
    priority = models.IntegerField(default=PRIORITY_CLASSES["normal"])
    preemptible = models.BooleanField(default=False)
    max_runtime_seconds = models.PositiveIntegerField()
    max_retries = models.PositiveIntegerField(default=0)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED, db_index=True)
    state_reason = models.CharField(max_length=500, blank=True)
    # Why a QUEUED job waits: {"reason": "quota"|"budget"|"capacity", ...numbers}.
    queue_info = models.JSONField(default=dict, blank=True)
    current_attempt = models.ForeignKey("JobAttempt", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    estimated_cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    accrued_cost_usd = models.DecimalField(max_digits=20, decimal_places=9, default=Decimal("0"))

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "-priority", "created_at"]), models.Index(fields=["team", "state"])]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.state})"

    @property
    def total_gpus(self) -> int:
        """GPUs the whole job holds: nodes x GPUs per node."""
        return self.nodes * self.gpus_per_node

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES


class JobAttempt(models.Model):
    """One dispatch of a job to one cluster and node pool. Retries and failover add attempts.

    ``object_name`` is deterministic (``job-<job id>-<attempt number>``), so a
    repeated dispatch finds what the first one created. ``runner_state`` is
    the backend's own bookkeeping (process ids, ports, log paths).
    """

    class EndReason(models.TextChoices):
        SUCCEEDED = "Succeeded"
        FAILED = "Failed"
        CANCELLED = "Cancelled"
        DEADLINE_EXCEEDED = "DeadlineExceeded"
        OOM_KILLED = "OOMKilled"
        IMAGE_PULL = "ImagePullBackOff"
        UNSCHEDULABLE = "Unschedulable"
        EVICTED = "Evicted"
        NODE_LOST = "NodeLost"
        PREEMPTED = "Preempted"
        DISPATCH_ERROR = "DispatchError"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.PROTECT, related_name="attempts")
    node_pool = models.ForeignKey("runners.NodePool", on_delete=models.PROTECT, related_name="attempts")
    gpus = models.PositiveIntegerField(help_text="GPUs held by this attempt (nodes x GPUs per node)")
    object_name = models.CharField(max_length=63)
    usd_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6, help_text="Price at admission, for the estimate")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Cost is accrued up to here; the ledger continues from this instant.
    accrued_until = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=32, choices=EndReason.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    runner_state = models.JSONField(default=dict, blank=True)
    # The nodes admission chose, one per node of the job, and what each holds there:
    # {"nodes": [names], "gpus_per_node": int, "cpu_milli": int, "memory_mib": int} ({}: none recorded).
    placement = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number")]
        indexes = [models.Index(fields=["cluster", "ended_at"])]

    def __str__(self) -> str:
        return self.object_name

    @property
    def is_active(self) -> bool:
        return self.ended_at is None


class JobEvent(models.Model):
    """An append-only line of a job's timeline: a state change, a reason, who did it."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(JobAttempt, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    kind = models.CharField(max_length=32, default="state")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state}->{self.to_state} {self.reason}"


def committed_usd(team_id: int) -> Decimal:
    """What the team's active jobs may still spend: ``sum(max(estimated - accrued, 0))``, USD."""
    rows = Job.objects.filter(team_id=team_id, state__in=ACTIVE_STATES).values_list("estimated_cost_usd", "accrued_cost_usd")
    return sum((max(est - acc, Decimal(0)) for est, acc in rows), Decimal(0))
