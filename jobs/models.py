"""Jobs, their attempts on clusters, and the append-only event timeline.

State changes go through ``jobs.states.transition`` only: a compare-and-set
UPDATE on the current state with a JobEvent in the same transaction.
"""

import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models

from core.gpus import MILLI_PER_GPU
from core.sql import as_decimal, fetch, placeholders
from quotas.models import DEFAULT_PRIORITY_CLASSES, scope_to_teams


class JobState(models.TextChoices):
    """The job states (docs/design.md, Job states)."""

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


#: The run time (s) a job without a max runtime (a serving job that runs until cancelled) is estimated and committed
#: against its budgets for: 30 days, a monthly budget's period. The ledger bills what it runs, with no cap.
UNBOUNDED_ESTIMATE_SECONDS = 30 * 24 * 3600


def estimated_runtime(max_runtime_seconds: int | None) -> int:
    """The seconds a job's cost estimate counts: its ``max_runtime_seconds``, or for none (no limit)
    :data:`UNBOUNDED_ESTIMATE_SECONDS`."""
    return max_runtime_seconds if max_runtime_seconds else UNBOUNDED_ESTIMATE_SECONDS


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
        #: Several roles (a learner, rollout workers, a reward server...), each its own pod shape, admitted together
        #: on one cluster (``spec.roles``; docs/adr/0039-multi-role-jobs.md).
        MULTI_ROLE = "multi-role", "Multi-role"

    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="jobs")
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=63)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TRAINING)
    spec = models.JSONField()
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="jobs")
    gpus_per_node = models.PositiveIntegerField()
    # GPU sharing (docs/adr/0040-gpu-sharing.md): the share of one GPU the job's pod holds when it asks less than a
    # whole GPU, in milli-GPUs (1000 = one GPU): a fraction (spec gpus_per_node 0.25: 250) or a MIG profile's share
    # (``core.gpus.MigProfile.share_milli``); gpus_per_node is then 1 (the one device its pod asks). 0: whole GPUs.
    gpu_share_milli = models.PositiveIntegerField(default=0, help_text="share of one GPU, milli-GPU (0: whole GPUs)")
    mig_profile = models.CharField(max_length=32, blank=True, default="", help_text="MIG profile, e.g. 1g.10gb")
    nodes = models.PositiveIntegerField()
    priority = models.IntegerField(default=PRIORITY_CLASSES["normal"])
    preemptible = models.BooleanField(default=False)
    # None: no limit (a serving job runs until cancelled); its estimate then covers UNBOUNDED_ESTIMATE_SECONDS.
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_retries = models.PositiveIntegerField(default=0)
    # Pods per node of the job: serving replicas of an inference job (each a copy of the node), 1 for training.
    replicas = models.PositiveIntegerField(default=1)
    # Preemptions of this job's attempts in a row before one of them ran (reached RUNNING); a preemption of a running
    # attempt sets it back to 0. At PREEMPTION_BEFORE_RUN_LIMIT the next attempt is protected (docs/adr/0015).
    preempted_before_run = models.PositiveIntegerField(default=0)
    # An element of a job array (``JobArray``): the array and its 0-based index there; None for a job of its own.
    # Indexed by the partial indexes below only (most jobs are no element).
    array = models.ForeignKey("JobArray", on_delete=models.PROTECT, null=True, blank=True, related_name="elements",
                              db_index=False)
    array_index = models.PositiveIntegerField(null=True, blank=True)

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
        indexes = [models.Index(fields=["state", "-priority", "created_at"]), models.Index(fields=["team", "state"]),
                   # An array's live elements, counted by every top-up and roll-up.
                   models.Index(fields=["array", "state"], name="job_array_state",
                                condition=models.Q(array__isnull=False))]
        constraints = [
            # One row per index of an array: a second materialization of an index is refused by the database.
            models.UniqueConstraint(fields=["array", "array_index"], name="job_array_unique_index",
                                    condition=models.Q(array__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.state})"

    @property
    def gpu_milli_per_node(self) -> int:
        """Milli-GPUs each pod of the job holds: its share of one GPU (``gpu_share_milli``) when it asks less than a
        whole GPU, else ``gpus_per_node`` x 1000 (``core.gpus.MILLI_PER_GPU``)."""
        return self.gpu_share_milli or self.gpus_per_node * MILLI_PER_GPU

    @property
    def total_gpus(self) -> int:
        """GPUs the whole job holds: nodes x GPUs per node x replicas (an inference job's pods each hold
        ``gpus_per_node``; training jobs have one replica); for a multi-role job the sum over its roles of nodes x
        GPUs per node (``spec.roles``)."""
        if self.kind == self.Kind.MULTI_ROLE:
            return sum(total_gpus(r["resources"]["nodes"], r["resources"]["gpus_per_node"])
                       for r in roles_in_order((self.spec or {}).get("roles")).values())
        return total_gpus(self.nodes, self.gpus_per_node, self.replicas)

    @property
    def pods(self) -> int:
        """Pods an attempt of the job runs, numbered 0 to pods - 1 (the local runner's processes; the logs one reads
        by index, ``GET .../logs/?node=N`` and the job page's picker): an inference job's nodes x replicas (each
        replica its own server; for the logs, those serving now in the order they started), any other job's
        nodes."""
        return self.nodes * max(1, self.replicas) if self.kind == self.Kind.INFERENCE else self.nodes

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def endpoint(self) -> str | None:
        """Where this inference job serves now: its current attempt's ``runner_state["endpoint"]`` (set by the
        cluster's backend at dispatch: ``http://127.0.0.1:<PORT>`` locally, the Service's in-cluster URL on
        Kubernetes) while the job is STARTING or RUNNING; None for training jobs and otherwise. Reads
        ``current_attempt`` (select it with the job)."""
        if self.kind != self.Kind.INFERENCE or self.state not in (JobState.STARTING, JobState.RUNNING):
            return None
        attempt = self.current_attempt
        if attempt is None or attempt.ended_at is not None:
            return None
        return (attempt.runner_state or {}).get("endpoint")


class JobArray(models.Model):
    """A job array (a parameter sweep): ``count`` elements of one validated submission, at most ``parallelism``
    of them queued or running at once (Slurm's ``sbatch --array=0-<count-1>%<parallelism>``).

    One row holds the whole array; its element ``Job`` rows are materialized lazily (docs/adr/0038):
    ``materialized`` elements (indexes ``0 .. materialized-1``) exist, the rest are written by the scheduling
    passes (``jobs.arrays.top_up_arrays``) while the array's live elements stay under ``parallelism``. The
    template's columns (``spec``, ``accelerator``, GPUs, priority...) are copied onto every element. ``grid``:
    for a sweep, ``[[parameter name, [values...]], ...]`` in the submitted order (a list, since a JSON object's
    key order is not kept by PostgreSQL's jsonb); element ``i`` takes the ``i``-th point of the cartesian
    product, the last parameter varying fastest (``jobs.arrays.grid_point``). ``state``: ``open`` (elements
    still to materialize), ``materialized`` (every element row exists), ``cancelled`` (no more are made).
    """

    class State(models.TextChoices):
        OPEN = "open"
        MATERIALIZED = "materialized"
        CANCELLED = "cancelled"

    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="job_arrays")
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays")
    name = models.CharField(max_length=63)
    kind = models.CharField(max_length=16, choices=Job.Kind.choices, default=Job.Kind.TRAINING)
    spec = models.JSONField()
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="job_arrays")
    gpus_per_node = models.PositiveIntegerField()
    gpu_share_milli = models.PositiveIntegerField(default=0, help_text="share of one GPU, milli-GPU (0: whole GPUs)")
    mig_profile = models.CharField(max_length=32, blank=True, default="", help_text="MIG profile, e.g. 1g.10gb")
    nodes = models.PositiveIntegerField()
    priority = models.IntegerField(default=PRIORITY_CLASSES["normal"])
    preemptible = models.BooleanField(default=False)
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_retries = models.PositiveIntegerField(default=0)
    replicas = models.PositiveIntegerField(default=1)

    count = models.PositiveIntegerField()
    parallelism = models.PositiveIntegerField()
    grid = models.JSONField(default=list, blank=True)
    materialized = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN, db_index=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "created_at"], name="jobarray_team_created")]

    def __str__(self) -> str:
        return f"array {self.pk} {self.name} ({self.count} elements)"


class JobAttempt(models.Model):
    """One dispatch of a job to one cluster and node pool. Retries and failover add attempts.

    ``uid`` is the attempt's globally unique identity (ADR 0011): together with
    the installation's id (``runners.models.Installation``) it labels every
    object the attempt creates, and objects are matched to attempts by it,
    never by the row's sequence number alone, which a restored database hands
    out again. ``object_name`` is deterministic
    (``job-<job id>-<attempt number>-<first 8 hex digits of uid>``), so a
    repeated dispatch finds what the first one created and a restored
    database's new attempts never take a name in use; attempts made before
    the uid existed keep ``job-<job id>-<attempt number>`` (``legacy_name``).
    ``adopted_after_restore``: the row was rebuilt after a restore from its
    objects' labels and annotations (``jobs.recovery``). ``runner_state`` is
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
        NODE_UNHEALTHY = "NodeUnhealthy"  # stopped or failed on a node that health marks unhealthy (runners.health)
        PREEMPTED = "Preempted"
        SPOT_RECLAIMED = "SpotReclaimed"  # its spot node was reclaimed by the provider (ADR 0018)
        DISPATCH_ERROR = "DispatchError"
        POD_DELETED = "PodDeleted"  # a pod deleted directly (not through the Eviction API) while it ran
        DELETED = "Deleted"  # the attempt's objects answered 404 on two looks in a row
        NOT_DISPATCHED = "NotDispatched"  # no objects within DISPATCH_DEADLINE_SECONDS: released, placed again

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    adopted_after_restore = models.BooleanField(default=False)
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.PROTECT, related_name="attempts")
    node_pool = models.ForeignKey("runners.NodePool", on_delete=models.PROTECT, related_name="attempts")
    gpus = models.PositiveIntegerField(help_text="GPUs held by this attempt (nodes x GPUs per node x replicas)")
    object_name = models.CharField(max_length=63)
    usd_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6, help_text="Price at admission, for the estimate")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Cost is accrued up to here; the ledger continues from this instant.
    accrued_until = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=32, choices=EndReason.choices, blank=True)
    # The first of consecutive looks at the cluster in which this attempt's objects answered 404 (None: seen, or
    # never looked for); a second look in a row that finds nothing ends the attempt, billed up to this instant.
    absent_since = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    runner_state = models.JSONField(default=dict, blank=True)
    # The nodes admission chose, one per node of the job, and what each holds there:
    # {"nodes": [names], "gpus_per_node": int, "cpu_milli": int, "memory_mib": int} ({}: none recorded).
    placement = models.JSONField(default=dict, blank=True)
    # The nodes whose fault ended this attempt (NodeLost, NodeUnhealthy): named in its recovery and counted in
    # their health (runners.health).
    bad_nodes = models.JSONField(default=list, blank=True)
    # Set while this attempt has ended but its cluster may still run its objects: ended with the cluster
    # unreachable (a cancel whose DELETE could not be sent), or a look found its objects after its end (orphans
    # being deleted). Cleared by the first look that answers without them, or by the verdict that the cluster is
    # lost. While set, what the attempt's pods hold still counts where a limit is on running work (a job array's
    # parallelism).
    deletion_pending_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number")]
        indexes = [models.Index(fields=["cluster", "ended_at"]),
                   models.Index(fields=["cluster"], condition=models.Q(deletion_pending_since__isnull=False),
                                name="attempt_deletion_pending")]

    def __str__(self) -> str:
        return self.object_name

    @property
    def is_active(self) -> bool:
        return self.ended_at is None

    @property
    def legacy_name(self) -> bool:
        """Whether the attempt was made before attempt uids (its objects carry no uid label): named
        ``job-<job id>-<number>``; such objects are matched by the attempt id label, as before."""
        return self.object_name == f"job-{self.job_id}-{self.number}"


def attempt_object_name(job_id: int, number: int, uid: uuid.UUID) -> str:
    """``job-<job id>-<number>-<uid hex[:8]>``: a DNS-1123 label of at most 4 + 20 + 1 + 10 + 1 + 8 = 44
    characters (bigint ids), so a pod name ``<name>-<index>-<5>`` and its hostname stay within 63."""
    return f"job-{job_id}-{number}-{uid.hex[:8]}"


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


class JobDependency(models.Model):
    """One edge of a pipeline: ``job`` waits for ``upstream`` (a job of the same team, older than it) to end in a way
    ``condition`` accepts (docs/adr/0037). ``position`` is the edge's place in the submission's ``after`` list.

    ``succeeded``: the upstream SUCCEEDED (Slurm's ``afterok``); ``ended``: it reached any final state
    (``afterany``); ``failed``: it reached a final state other than SUCCEEDED (``afternotok``: FAILED, CANCELLED or
    REJECTED). Edges only point from a new job to existing ones, and a condition once met stays met (final states
    are final), so the scheduler reads them without locks (``jobs.dependencies``).
    """

    class Condition(models.TextChoices):
        SUCCEEDED = "succeeded"
        ENDED = "ended"
        FAILED = "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    upstream = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependents")
    condition = models.CharField(max_length=16, choices=Condition.choices, default=Condition.SUCCEEDED)
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["job_id", "position"]
        verbose_name_plural = "job dependencies"
        constraints = [
            models.UniqueConstraint(fields=["job", "upstream"], name="dependency_unique_upstream"),
            models.CheckConstraint(condition=~models.Q(job=models.F("upstream")), name="dependency_not_self"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} after {self.condition} of job {self.upstream_id}"


#: End reasons that do not use up a retry: the scheduler's preemption or its unschedulable placement, an attempt
#: that never created objects, one stopped or failed on a node marked unhealthy (the node's fault, and admission
#: keeps off that node from then on, so the retries this gives are bounded by the fleet's bad nodes), and a spot
#: reclaim (the provider took the capacity back, what a preemptible job accepts; SkyPilot counts preemptions
#: apart from its ``max_restarts_on_errors`` too; placement avoids the cluster a while, ADR 0018).
FREE_RETRY_END_REASONS = (JobAttempt.EndReason.PREEMPTED, JobAttempt.EndReason.NOT_DISPATCHED,
                          JobAttempt.EndReason.UNSCHEDULABLE, JobAttempt.EndReason.NODE_UNHEALTHY,
                          JobAttempt.EndReason.SPOT_RECLAIMED)
#: End reasons that count against the node the attempt ran on (``JobAttempt.bad_nodes``) in its health.
NODE_FAULT_END_REASONS = (JobAttempt.EndReason.NODE_LOST, JobAttempt.EndReason.NODE_UNHEALTHY)


def held_gpu_milli(gpus: int, share_milli: int) -> int:
    """Milli-GPUs an attempt holds, as quotas count them and the ledger bills them (ADR 0040): the job's share of
    one GPU (``Job.gpu_share_milli``, a MIG profile's too) when it has one, else its ``gpus`` whole GPUs x 1000."""
    return share_milli or gpus * MILLI_PER_GPU


#: ``held_gpu_milli`` of each row of a ``JobAttempt`` queryset, in SQL (its job joined): sum it for a team's usage.
HELD_GPU_MILLI = models.Case(models.When(job__gpu_share_milli__gt=0, then=models.F("job__gpu_share_milli")),
                             default=models.F("gpus") * MILLI_PER_GPU, output_field=models.BigIntegerField())


def total_gpus(nodes: int, gpus_per_node: int, replicas: int = 1) -> int:
    """GPUs a job holds: ``nodes`` x ``gpus_per_node`` x ``replicas`` (every pod holds ``gpus_per_node``)."""
    return nodes * gpus_per_node * max(1, replicas)


def roles_in_order(roles) -> dict:
    """A multi-role job's roles, name -> role (its stored ``spec["roles"]``, or an attempt's ``placement["roles"]``),
    in name order (code point order): the one order of roles everywhere (``CONTROLPLANE_ROLES``, the runners'
    numbering of pods, placement, the roles table, the API's answer). PostgreSQL's jsonb does not keep an object's
    key order (it orders keys by length, then bytes) and SQLite keeps it as written, so the order a mapping comes
    back in is never read. ``{}`` for anything but a mapping (no roles)."""
    if not isinstance(roles, dict):
        return {}
    return dict(sorted(roles.items()))


def committed_usd(team_id: int) -> Decimal:
    """What the team's active jobs may still spend: ``sum(max(estimated - accrued, 0))``, USD."""
    return committed_by_team([team_id])[team_id]


def committed_by_team(team_ids) -> dict[int, Decimal]:
    """``committed_usd`` of each team in ``team_ids`` in one statement (``core.sql``: admission and budget status
    repeat it): team id -> USD (0 for a team without active jobs)."""
    found = {t: Decimal(0) for t in team_ids}
    if not found:
        return found
    states = sorted(s.value for s in ACTIVE_STATES)
    for team_id, est, acc in fetch(
            f'SELECT team_id, estimated_cost_usd, accrued_cost_usd FROM "{Job._meta.db_table}" '
            f"WHERE state IN ({placeholders(len(states))}) AND team_id IN ({placeholders(len(found))})",
            [*states, *found]):
        found[team_id] += max(as_decimal(est, 6) - as_decimal(acc, 9), Decimal(0))
    return found


class WorkloadMetrics(models.Model):
    """What an attempt's workload reported of its training progress (``jobs.efficiency.protocol``).

    ``stats`` is the ``RunStats`` dict (last report, step-weighted means, the run's own summary, a throughput
    series); ``tokens_per_s`` (the run's throughput: its summary, else the mean), ``flops_per_token`` and
    ``tokens`` (training tokens the attempt processed) are copied to columns for reports. ``source`` is
    ``log`` or ``prometheus``; ``complete`` is set by the first collection after the attempt ended (nothing
    more will come). ``pods``: a multi-role attempt's last throughput per pod, read from each pod's log:
    role name -> pod index within the role (text) -> ``jobs.efficiency.protocol.last_throughput`` with ``at``
    (seconds since the epoch, when it was read); ``{}`` for an attempt of one role.
    """

    class Source(models.TextChoices):
        LOG = "log"
        PROMETHEUS = "prometheus"

    attempt = models.OneToOneField(JobAttempt, on_delete=models.CASCADE, primary_key=True,
                                   related_name="workload_metrics")
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.LOG)
    stats = models.JSONField(default=dict)
    tokens_per_s = models.FloatField(null=True, blank=True, help_text="Run throughput, tokens/s over all GPUs")
    flops_per_token = models.FloatField(null=True, blank=True, help_text="Model FLOPs per training token")
    tokens = models.BigIntegerField(null=True, blank=True, help_text="Training tokens processed")
    complete = models.BooleanField(default=False)
    pods = models.JSONField(default=dict, blank=True, help_text="multi-role: last throughput per role and pod")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "workload metrics"

    def __str__(self) -> str:
        return f"metrics of attempt {self.attempt_id}"


class OutboxTask(models.Model):
    """A task whose publish after commit failed (the broker was unreachable), kept to be sent again.

    ``jobs.enqueue`` writes one when ``apply_async`` raises, so the committed change (a cancel, an attempt's
    end) never answers 500; ``jobs.tasks.send_outbox`` (Celery beat, ``OUTBOX_SWEEP_INTERVAL_SECONDS``) publishes
    the kept tasks in id order and deletes each once the broker took it. Every task so kept is idempotent, so
    a publish repeated after a crash does no harm.
    """

    task = models.CharField(max_length=200)
    args = models.JSONField(default=list)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task}{tuple(self.args)}"


class ServingScale(models.Model):
    """The autoscaler's memory of one serving job with ``spec.autoscaling`` (``jobs.serving``).

    ``sample``: the last reading of the job's endpoint counters (``{"requests", "in_flight_seconds", "clock"}``:
    totals and the endpoint's own clock, seconds), from which the next pass takes the load over the interval.
    ``recommendations``: ``[[unix seconds, replicas], ...]``, the counts the formula recommended within the longer
    stabilization window. ``metric``: the load per replica last read (requests in flight, or requests per second);
    ``desired``: the count the last pass decided (stabilized, within min and max). ``refusal``: why the last
    scale-up was refused (``{"reason", "message", "at", "replicas", ...numbers}``; {} when the last one was
    admitted or none was tried); ``note``: why the last pass could not decide (no reading), "" when it could.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="serving_scale")
    sample = models.JSONField(default=dict, blank=True)
    recommendations = models.JSONField(default=list, blank=True)
    metric = models.FloatField(null=True, blank=True)
    desired = models.PositiveIntegerField(null=True, blank=True)
    refusal = models.JSONField(default=dict, blank=True)
    note = models.CharField(max_length=500, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"autoscaling of job {self.job_id}"


class ServingRollout(models.Model):
    """A serving job's move to the checkpoint of another training job, replica by replica (``serving.rollout``).

    ``from_job_id`` / ``to_job_id``: the training jobs whose checkpoints the replicas served before and serve
    after (``from_job_id`` None: the serving job loaded a checkpoint of its own arguments). ``state``:
    ``rolling`` until every old replica was replaced, then ``done``; ``rolled_back`` when a new replica failed
    readiness within the deadline or the attempt ended (``reason`` says why). ``replicas_updated``: new replicas
    ready and in the endpoint with an old one retired. ``progress``: the step's bookkeeping: the attempt,
    ``old`` and ``new`` replica keys (``runners.base.LostReplica.key``'s), ``pending`` (the new replica waiting
    for readiness, with ``since`` and whether it was admitted as a ``surge``), ``note`` (why a step waits).
    ``trigger_job_id``: the training job whose success started it through the serving job's ``spec.follow``
    (``serving.follow``); None for a rollout started by request.
    """

    class State(models.TextChoices):
        ROLLING = "rolling"
        DONE = "done"
        ROLLED_BACK = "rolled_back"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="rollouts")
    from_job_id = models.BigIntegerField(null=True, blank=True)
    to_job_id = models.BigIntegerField()
    trigger_job_id = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ROLLING, db_index=True)
    replicas_updated = models.PositiveIntegerField(default=0)
    reason = models.CharField(max_length=500, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job_id", "-id"]
        constraints = [models.UniqueConstraint(fields=["job"], condition=models.Q(state="rolling"),
                                               name="rollout_one_rolling_per_job")]

    def __str__(self) -> str:
        return f"rollout of job {self.job_id} to the checkpoint of job {self.to_job_id} ({self.state})"


class ServingSample(models.Model):
    """What a serving job's endpoint served over one interval of the autoscaling pass (``serving.autoscaler``):
    the increase of its counters since the pass before (``serving.figures.interval_sample``), from which the
    service's figures are computed (``jobs.serving_figures``).

    ``at``: the end of the interval (the pass's time, UTC); ``seconds``: its length. ``requests``, ``errors``
    (answers with a 5xx status) and ``tokens`` (generated, as the replicas reported them) over the interval;
    ``latency_buckets``: the increase of the endpoint's latency histogram, ``{"<le seconds>": count, ..., "+Inf":
    count}``, cumulative as Prometheus' buckets are; ``replicas``: the job's replicas at the pass (admitted and
    billed); ``ready_replicas``: those the endpoint found ready, None when it did not say.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="serving_samples")
    at = models.DateTimeField()
    seconds = models.FloatField()
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0)
    latency_buckets = models.JSONField(default=dict, blank=True)
    replicas = models.PositiveIntegerField()
    ready_replicas = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["job", "at"]
        indexes = [models.Index(fields=["job", "at"], name="servingsample_job_at")]

    def __str__(self) -> str:
        return f"job {self.job_id} at {self.at:%Y-%m-%d %H:%M:%S}: {self.requests} requests"
