"""Money: the effective-dated price catalog and the append-only cost ledger, its rollups, utilization and reports."""

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce

from core.gpus import MILLI_PER_GPU, exact_gpus


class Price(models.Model):
    """A list price per GPU-hour in USD, in force from ``effective_from`` until the next one.

    Keyed by provider, region, accelerator and capacity type; a row with a
    ``cluster`` overrides the catalog for that cluster only. A new price
    applies from its effective time on and never to the past, because the
    ledger looks up the price in force at each interval's start.
    Seed figures come from the SkyPilot catalog (``costs/data/SOURCES.md``).
    """

    provider = models.CharField(max_length=16)
    region = models.CharField(max_length=64)
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="prices")
    capacity_type = models.CharField(max_length=16, default="on-demand")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, null=True, blank=True, related_name="price_overrides")
    usd_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6)
    # CPU node pools (accelerator CPU, usd_per_gpu_hour 0) are priced by what a job requests: vCPUs and memory.
    # Null on GPU rows: a GPU instance's price includes its host.
    usd_per_vcpu_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    usd_per_gib_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                           help_text="USD per GiB of memory per hour")
    effective_from = models.DateTimeField()
    source = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["provider", "region", "accelerator__name", "capacity_type", "-effective_from"]
        indexes = [models.Index(fields=["provider", "region", "accelerator", "capacity_type", "effective_from"])]

    def __str__(self) -> str:
        scope = self.cluster.name if self.cluster_id else f"{self.provider}/{self.region}"
        return f"{scope} {self.accelerator} {self.capacity_type} ${self.usd_per_gpu_hour}/GPU-h from {self.effective_from:%Y-%m-%d}"


class ElectricityPrice(models.Model):
    """What a kWh of electricity costs a cluster, in USD, in force from ``effective_from`` until the next row.

    Keyed by provider and region; a row with a ``cluster`` overrides them
    for that cluster only (an on-premises cluster's own tariff). The GPUs'
    energy (DCGM) times this price is a separate cost line, never folded into
    the GPU cost: on a cloud the instance price already pays the power. A
    cluster without a row has an unknown energy cost, never $0. ``source``
    names where the figure comes from (a tariff, a utility bill).
    """

    provider = models.CharField(max_length=16, blank=True)
    region = models.CharField(max_length=64, blank=True)
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="electricity_prices")
    usd_per_kwh = models.DecimalField(max_digits=12, decimal_places=6, help_text="USD per kWh")
    effective_from = models.DateTimeField()
    source = models.CharField(max_length=200, help_text="where the figure comes from")

    class Meta:
        ordering = ["provider", "region", "cluster_id", "-effective_from"]
        constraints = [models.CheckConstraint(condition=models.Q(usd_per_kwh__gte=0), name="electricityprice_not_negative")]

    def __str__(self) -> str:
        scope = self.cluster.name if self.cluster_id else f"{self.provider}/{self.region}"
        return f"{scope} ${self.usd_per_kwh}/kWh from {self.effective_from:%Y-%m-%d}"


class CostEntry(models.Model):
    """One line of the ledger: an attempt's GPUs held over ``[interval_start, interval_end)`` at one price.

    ``gpu_milli``: the GPUs billed, in milli-GPUs (``core.gpus``: 1000 = one GPU): whole GPUs x 1000, or a job's
    share of one GPU (a quarter: 250; a MIG profile's memory eighths), exactly (ADR 0040).
    ``amount_usd = gpu_milli / 1000 * seconds / 3600 * usd_per_gpu_hour``, plus on a CPU
    node pool ``cpu_milli / 1000 * seconds / 3600 * usd_per_vcpu_hour +
    memory_mib / 1024 * seconds / 3600 * usd_per_gib_hour``, rounded half
    to even to 1e-9 USD (see ``costs.ledger``). An entry never crosses a UTC
    hour boundary, a price change or a change of the attempt's GPUs; the
    latest entry of a running attempt is its open entry, which accrual
    extends (``interval_end`` and ``amount_usd`` grow) until one of those
    happens. Every other entry is closed and never changes, so the ledger
    grows by about one row per attempt-hour, not per accrual run. The unique
    (attempt, interval_start) key makes accrual idempotent.

    An attempt with no price in force accrues entries with a null
    ``usd_per_gpu_hour`` and ``amount_usd``: GPU-hours of unknown cost
    (``costs.spend.unpriced_usage`` reads them).
    """

    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.PROTECT, related_name="cost_entries")
    job = models.ForeignKey("jobs.Job", on_delete=models.PROTECT, related_name="cost_entries")
    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="cost_entries")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.PROTECT, related_name="cost_entries")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="cost_entries")
    interval_start = models.DateTimeField()
    interval_end = models.DateTimeField()
    gpu_milli = models.PositiveBigIntegerField(help_text="GPUs billed, milli-GPU (1000 = one GPU; 250 = a quarter)")
    usd_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                           help_text="null: no price was in force (cost unknown)")
    amount_usd = models.DecimalField(max_digits=20, decimal_places=9, null=True, blank=True)
    # What a CPU node pool bills: the attempt's requested CPU (millicores) and memory (MiB) over all its pods, at
    # the catalog's per-vCPU-hour and per-GiB-hour prices (null: not priced by CPU, as on GPU pools). The new
    # columns have database defaults too, so bulk loaders that write only the GPU columns (COPY) stay valid.
    cpu_milli = models.PositiveBigIntegerField(default=0, db_default=0)
    memory_mib = models.PositiveBigIntegerField(default=0, db_default=0)
    usd_per_vcpu_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    usd_per_gib_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Written after a restore of the database for time the restored ledger had lost (the gap), from the cluster
    # objects' own creation and end times (``costs.ledger.reconstruct_gap``), not from a live accrual.
    reconstructed = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["interval_start"]
        verbose_name_plural = "cost entries"
        constraints = [
            models.UniqueConstraint(fields=["attempt", "interval_start"], name="costentry_unique_interval"),
            models.CheckConstraint(condition=models.Q(interval_end__gt=models.F("interval_start")), name="costentry_positive_interval"),
            models.CheckConstraint(
                condition=models.Q(usd_per_gpu_hour__isnull=True, amount_usd__isnull=True)
                | models.Q(usd_per_gpu_hour__isnull=False, amount_usd__isnull=False),
                name="costentry_priced_or_unknown"),
        ]
        # Edge days of a window: one team's (team, interval_start), every team's (interval_start); the unknown-cost
        # entries have their own small partial index. No index holds interval_end or amount_usd, so extending the
        # open entry is a HOT update that writes no index.
        indexes = [
            models.Index(fields=["team", "interval_start"]),
            models.Index(fields=["interval_start"], name="costentry_start"),
            models.Index(fields=["team", "job", "interval_start"], name="costentry_unpriced",
                         condition=models.Q(usd_per_gpu_hour__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.attempt_id} {self.interval_start:%Y-%m-%d %H:%M}..{self.interval_end:%H:%M} ${self.amount_usd}"

    @property
    def gpus(self) -> int | Decimal:
        """The GPUs billed (``gpu_milli`` / 1000), exactly: an int when whole, ``Decimal("0.25")`` for a quarter of
        one GPU (``core.gpus.exact_gpus``)."""
        return exact_gpus(self.gpu_milli)

    @property
    def gpu_seconds(self) -> float:
        return self.gpu_milli * (self.interval_end - self.interval_start).total_seconds() / MILLI_PER_GPU


class LedgerTotals(models.Model):
    """The sums a totals row keeps of its ledger entries: GPU-seconds (all), USD (priced), GPU-seconds of unknown
    cost (no price in force, not in ``cost_usd``) and the number of entries. GPU-seconds keep 9 decimals: an entry
    adds milli-GPUs x microseconds (``CostEntry.gpu_milli``), exact at 1e-9."""

    gpu_seconds = models.DecimalField(max_digits=27, decimal_places=9)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=9)
    unpriced_gpu_seconds = models.DecimalField(max_digits=27, decimal_places=9, default=0)
    entries = models.PositiveIntegerField()
    rebuilt_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class DailyCostRollup(LedgerTotals):
    """Ledger totals per UTC day, team, cluster and accelerator: GPU-seconds and USD (exact, 1e-9).

    An entry counts on the UTC day of its ``interval_start`` (the rule of the
    costs API and of budgets). Maintained by the accrual in the transaction
    that writes the entries (``costs.ledger``), so the open day is always
    current; ``costs.rollups.rebuild_totals`` / ``manage.py rebuild_rollups``
    recompute them from the ledger. ``unpriced_gpu_seconds`` are GPU-seconds
    accrued with no price in force (not in ``cost_usd``); ``entries`` counts
    the ledger rows. ``JobDailyCost`` holds the same per job.
    """

    day = models.DateField()
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="cost_rollups")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, related_name="cost_rollups")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.CASCADE, related_name="cost_rollups")

    class Meta:
        ordering = ["day", "team__slug"]
        constraints = [models.UniqueConstraint(fields=["day", "team", "cluster", "accelerator"], name="costrollup_unique")]
        indexes = [models.Index(fields=["team", "day"], name="costrollup_team_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.team_id}/{self.cluster_id}/{self.accelerator_id} ${self.cost_usd}"


class JobDailyCost(LedgerTotals):
    """Ledger totals per UTC day and job (with its team): GPU-seconds and USD, kept and rebuilt as the day rollups.

    For costs by job (the API's ``group_by=job``, reports' top jobs) without
    reading a whole window of entries.
    """

    day = models.DateField()
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="job_cost_rollups")
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="cost_rollups")

    class Meta:
        ordering = ["day", "job_id"]
        constraints = [models.UniqueConstraint(fields=["day", "job"], name="jobcost_unique")]
        indexes = [models.Index(fields=["team", "day"], name="jobcost_team_day")]

    def __str__(self) -> str:
        return f"{self.day} job {self.job_id} ${self.cost_usd}"


#: The key of an ``AttemptDailyCost`` row as the ledger writes it: the day and attempt (unique), then what it carries.
ATTEMPT_DAY_KEYS = ("day", "attempt_id", "team_id", "cluster_id", "accelerator_id")


class AttemptDailyCost(LedgerTotals):
    """Ledger totals per UTC day and attempt (with its team, cluster and accelerator): what the fleet's capacity
    figures read as allocation (``costs.capacity``) without summing a month of entries. Kept by the accrual in the
    transaction that writes the entries, as ``DailyCostRollup`` is, and rebuilt with it
    (``costs.rollups.rebuild_totals``)."""

    day = models.DateField()
    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.CASCADE, related_name="cost_days")
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="attempt_cost_rollups")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, related_name="attempt_cost_rollups")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.CASCADE,
                                    related_name="attempt_cost_rollups")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "attempt"], name="attemptdailycost_unique")]
        indexes = [models.Index(fields=["day", "cluster"], name="attemptdailycost_day_cluster")]


class AllocationSeries(models.Model):
    """One series of the ledger's running GPU allocation (``AllocationRunningTotal``): what the capacity figures sum
    per pool and team (``by_node`` False: ``node`` ``''``, ``share`` and ``gpus`` 0) or per node of the placements
    (``by_node`` True: the node's GPUs of each attempt, ``share``, out of the attempt's ``gpus``, as
    ``costs.capacity`` splits them; ``node`` ``''`` where a placement names no nodes). ``first_day`` and
    ``last_day`` bound the UTC days it has rows for, so a window's query reads only the series that reach it.
    Kept by ``costs.running`` in the transaction that writes the entries; rebuilt from the ledger with the other
    totals (``costs.rollups.rebuild_totals``)."""

    by_node = models.BooleanField()
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, related_name="allocation_series")
    # No database constraint on the accelerator and the pool: a new series' foreign-key check would take FOR KEY
    # SHARE on their rows, so accrual (which must wait on no row but the totals, ``costs.ledger.accrue_running``)
    # would wait behind an admission or an edit holding a pool or an accelerator FOR UPDATE. Team and cluster rows
    # are key-shared first, in the platform's lock order, as the ledger's own entries need; deletes still cascade
    # (Django's collector).
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.CASCADE,
                                    related_name="allocation_series", db_constraint=False)
    node_pool = models.ForeignKey("runners.NodePool", on_delete=models.CASCADE, related_name="allocation_series",
                                  db_constraint=False)
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="allocation_series")
    node = models.CharField(max_length=253, blank=True)
    share = models.PositiveIntegerField(help_text="the node's GPUs of each attempt (0 in a pool series)")
    gpus = models.PositiveIntegerField(help_text="the attempts' GPUs (0 in a pool series)")
    first_day = models.DateField()
    last_day = models.DateField()

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["by_node", "cluster", "accelerator", "node_pool", "team", "node", "share", "gpus"],
            name="allocationseries_unique")]
        indexes = [models.Index(fields=["by_node", "last_day"], name="allocationseries_last_day")]
        verbose_name_plural = "allocation series"


class AllocationRunningTotal(models.Model):
    """The ledger's GPU allocation of one series (``AllocationSeries``) on one UTC day (``gpu_seconds``,
    ``cost_usd``, ``unpriced_gpu_seconds``: the entries billing GPUs, ``gpu_milli`` > 0, starting that day) and
    through it (``through_*``: every day of the series up to and including this one), exact to 1e-9.

    A window's whole days ``[first, last)`` are ``through`` of the series' last row before ``last`` less that of
    its last row before ``first``: two rows per series whatever the length of the ledger's history. A row exists
    for each day the series was billed (a day with no row adds nothing)."""

    series = models.ForeignKey(AllocationSeries, on_delete=models.CASCADE, related_name="days")
    day = models.DateField()
    gpu_seconds = models.DecimalField(max_digits=31, decimal_places=9, default=0)
    cost_usd = models.DecimalField(max_digits=24, decimal_places=9, default=0)
    unpriced_gpu_seconds = models.DecimalField(max_digits=31, decimal_places=9, default=0)
    through_gpu_seconds = models.DecimalField(max_digits=31, decimal_places=9, default=0)
    through_cost_usd = models.DecimalField(max_digits=24, decimal_places=9, default=0)
    through_unpriced_gpu_seconds = models.DecimalField(max_digits=31, decimal_places=9, default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["series", "day"], name="allocationrunningtotal_unique")]


class TeamSpend(models.Model):
    """A team's running ledger totals since its first entry, and the row that serialises its spend.

    Updated by the accrual in the transaction that writes the ledger, after
    the job and attempt rows and before the rollups and entries (the lock
    order of ``jobs.scheduling``). Admission's locked re-check locks this row
    before it reads the team's spend (``costs.spend.lock_team_spend``), so an
    accrual of the team commits wholly before or after the check. USD exact
    to 1e-9; unpriced GPU-seconds are those accrued without a price.
    """

    team = models.OneToOneField("quotas.Team", on_delete=models.CASCADE, primary_key=True, related_name="spend")
    cost_usd = models.DecimalField(max_digits=24, decimal_places=9, default=0)
    gpu_seconds = models.DecimalField(max_digits=31, decimal_places=9, default=0)
    unpriced_gpu_seconds = models.DecimalField(max_digits=31, decimal_places=9, default=0)
    entries = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"team {self.team_id}: ${self.cost_usd} over {self.entries} entries"


class UtilizationRollup(models.Model):
    """GPU utilization of one attempt on one UTC day, read from Prometheus (DCGM exporter).

    Only samples inside the attempt's running interval count. Sums are kept
    (not only averages) so that teams, clusters and days aggregate exactly:
    average utilization = ``util_sum / samples`` (percent 0-100, sample
    weighted), coverage = ``samples / expected_samples``. ``samples == 0``
    means "no data": the averages are NULL, never 0 %.
    ``gpu_seconds`` is the allocation (GPUs x seconds running) on that day;
    ``observed_gpu_seconds`` the part covered by DCGM samples (samples x
    scrape interval, at most the allocation); ``idle_gpu_seconds`` the
    observed part whose utilization was under the idle threshold (NULL
    without samples); the rest of the allocation is unobserved, never
    estimated. Every quantity is a count of samples inside the day, so days
    add up to the attempt whatever the hour of midnight.
    ``util_metric`` names the counter read, ``label_shape`` how series were
    attributed (``costs.prometheus.SHAPES``). ``energy_kwh``: what the GPUs
    drew on that day per the exporter's energy counter (Prometheus'
    ``increase``, resets counted from zero); null where the exporter reports
    no energy (not measured, never 0).

    ``covered_until`` (aware UTC) is the row's watermark: its sums are those
    of ``[max(day start, attempt start), covered_until)``, so a periodic
    collection adds only what came after (``costs.collection.periodic_pass``);
    null on a row whose coverage is not known (then read whole again).
    ``sealed``: the day's part of the run was re-read whole once it had
    settled (``COSTS_SEAL_AFTER_SECONDS``): late scrapes are counted and the
    energy is the day's exact ``increase``. ``memory_sum`` and
    ``prof_samples`` keep the averages and the counter name additive.
    """

    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.CASCADE, related_name="utilization_rollups")
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="utilization_rollups")
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="utilization_rollups")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, related_name="utilization_rollups")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.CASCADE, related_name="utilization_rollups")
    day = models.DateField()
    gpu_seconds = models.FloatField(help_text="GPUs x seconds running on this day")
    samples = models.PositiveIntegerField(help_text="DCGM utilization samples found")
    expected_samples = models.FloatField(help_text="GPUs x seconds / scrape interval")
    util_sum = models.FloatField(help_text="sum of utilization samples, percent")
    avg_gpu_util_percent = models.FloatField(null=True, blank=True)
    memory_samples = models.PositiveIntegerField(default=0)
    avg_memory_used_mib = models.FloatField(null=True, blank=True)
    idle_gpu_seconds = models.FloatField(null=True, blank=True)
    observed_gpu_seconds = models.FloatField(default=0.0, help_text="GPU-seconds covered by DCGM samples")
    util_metric = models.CharField(max_length=64, blank=True, help_text="DCGM counter read; blank: no data")
    energy_kwh = models.FloatField(null=True, blank=True,
                                   help_text="kWh the GPUs drew (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION); null: not measured")
    label_shape = models.CharField(max_length=16, blank=True, help_text="how series were attributed to the attempt")
    memory_sum = models.FloatField(default=0.0, help_text="sum of GPU memory samples, MiB")
    prof_samples = models.PositiveIntegerField(default=0, help_text="samples read from DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    covered_until = models.DateTimeField(null=True, blank=True,
                                         help_text="the sums hold the day's part of the run up to here; null: unknown")
    sealed = models.BooleanField(default=False, help_text="re-read whole once the day's part had settled")
    collected_at = models.DateTimeField(auto_now=True)

    @property
    def unobserved_gpu_seconds(self) -> float:
        """Allocated GPU-seconds without any DCGM sample."""
        return max(0.0, self.gpu_seconds - self.observed_gpu_seconds)

    class Meta:
        ordering = ["day", "attempt_id"]
        constraints = [models.UniqueConstraint(fields=["attempt", "day"], name="utilrollup_unique")]
        indexes = [models.Index(fields=["team", "day"])]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} {self.day}: {self.avg_gpu_util_percent}%"


class NodeUtilizationRollup(models.Model):
    """The GPU utilization of one attempt on one node on one UTC day: its ``UtilizationRollup`` split by the node
    whose DCGM series carried the samples (dcgm-exporter's ``Hostname``, or ``hostname``, label; the platform's
    ``runners.Node`` of that name in the attempt's cluster).

    Written by the same read and in the same transaction as the attempt's
    row, and only when that row's compare-and-set applies, so a node's sums
    over the attempts that ran on it count each GPU at each scrape instant
    once (an attempt's windows never overlap, and a GPU series belongs to
    one attempt). ``observed_gpu_seconds``: scrape instants at which a GPU
    had a sample within the lookback, each standing for one scrape interval
    (seconds); ``idle_gpu_seconds``: those under the idle threshold;
    ``util_sum``/``samples``: the utilization samples (percent) whose
    average is the node's. GPUs no attempt held are not read here: the
    capacity figures count them as unallocated, never also as idle.

    ``role``: for a multi-role attempt whose series carry the pod labels, the
    role of the pod that held the GPUs (``costs.prometheus.pod_role``), one
    row per node and role; blank where the series name no pod (host shape) or
    the attempt has one role. Per node the rows of its roles add up to the
    node's (``jobs.roles.role_utilization`` attributes the blank ones).
    """

    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.CASCADE, related_name="node_utilization_rollups")
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="node_utilization_rollups")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, related_name="node_utilization_rollups")
    day = models.DateField()
    node = models.CharField(max_length=253, help_text="the node's name, from the DCGM series' host label")
    role = models.CharField(max_length=12, blank=True, default="", db_default="",
                            help_text="the role of the pod the series named (a multi-role attempt); blank: not named")
    samples = models.PositiveIntegerField(default=0, help_text="DCGM utilization samples found")
    util_sum = models.FloatField(default=0.0, help_text="sum of utilization samples, percent")
    observed_gpu_seconds = models.FloatField(default=0.0, help_text="GPU-seconds covered by DCGM samples")
    idle_gpu_seconds = models.FloatField(default=0.0, help_text="observed GPU-seconds under the idle threshold")

    class Meta:
        ordering = ["day", "node", "role", "attempt_id"]
        constraints = [models.UniqueConstraint(fields=["attempt", "day", "node", "role"],
                                               name="nodeutilrollup_role_unique")]
        indexes = [models.Index(fields=["cluster", "day"])]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} on {self.node} {self.day}" + (f" ({self.role})" if self.role else "")


class ClusterMetrics(models.Model):
    """How a cluster's DCGM series are read: their label shape (detected, or set by an operator) and counter.

    ``detected_shape``/``host_label``/``util_metric`` come from
    ``costs.prometheus.detect_shape``; ``shape_override`` (blank: none) wins
    over the detection. ``shape`` is the one in force.
    """

    class Shape(models.TextChoices):
        POD = "pod", "namespace/pod"
        EXPORTED = "exported_pod", "exported_namespace/exported_pod"
        HOST = "host", "Hostname + GPU UUID"

    cluster = models.OneToOneField("runners.Cluster", on_delete=models.CASCADE, related_name="dcgm_metrics")
    detected_shape = models.CharField(max_length=16, choices=Shape.choices, blank=True)
    shape_override = models.CharField(max_length=16, choices=Shape.choices, blank=True,
                                      help_text="set to force a label shape; blank: use the detected one")
    host_label = models.CharField(max_length=16, default="Hostname")
    util_metric = models.CharField(max_length=64, blank=True)
    series = models.JSONField(default=dict, blank=True, help_text="DCGM series counted per candidate at detection")
    detected_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "cluster metrics"

    def __str__(self) -> str:
        return f"{self.cluster_id}: {self.shape or 'unknown'} ({self.util_metric or 'no counter'})"

    @property
    def shape(self) -> str:
        """The label shape in force: the override, else the detected one (blank: unknown)."""
        return self.shape_override or self.detected_shape


class UnknownCostAlert(models.Model):
    """An attempt accruing GPU-hours without a price, alerted once (the unique attempt key decides)."""

    attempt = models.OneToOneField("jobs.JobAttempt", on_delete=models.CASCADE, related_name="unknown_cost_alert")
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="unknown_cost_alerts")
    since = models.DateTimeField()
    fired_at = models.DateTimeField()
    gpu_hours = models.FloatField()
    message = models.TextField()

    class Meta:
        ordering = ["-fired_at"]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id}: cost unknown since {self.since:%Y-%m-%d %H:%M}"


class BudgetAlert(models.Model):
    """A budget threshold crossed in one period; the unique key makes each fire exactly once per period."""

    budget = models.ForeignKey("quotas.Budget", on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateTimeField()
    threshold_percent = models.PositiveIntegerField()
    fired_at = models.DateTimeField()
    spent_usd = models.DecimalField(max_digits=20, decimal_places=9)
    amount_usd = models.DecimalField(max_digits=14, decimal_places=2)

    class Meta:
        ordering = ["-fired_at"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "period_start", "threshold_percent"], name="budgetalert_once")
        ]

    def __str__(self) -> str:
        return f"budget {self.budget_id} {self.threshold_percent}% at {self.fired_at:%Y-%m-%d %H:%M}"


class LedgerDiscrepancy(models.Model):
    """One check of a cluster's ledger GPU-hours against kube-state-metrics GPU-hours over a window.

    ``flagged`` when ``|metrics - ledger| / ledger`` exceeds the tolerance
    (1 % by default); the cluster's latest check is its flag.
    """

    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, related_name="ledger_discrepancies")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    ledger_gpu_hours = models.FloatField()
    metrics_gpu_hours = models.FloatField(null=True, blank=True)
    difference_percent = models.FloatField(null=True, blank=True)
    flagged = models.BooleanField(default=False)
    checked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-checked_at"]
        verbose_name_plural = "ledger discrepancies"

    def __str__(self) -> str:
        return f"{self.cluster_id} {self.window_start:%Y-%m-%d}..{self.window_end:%Y-%m-%d} {self.difference_percent}%"


# --- reports (built, rendered and sent by ``costs.reports``) ---------------------------------------------------

class ReportQuerySet(models.QuerySet):
    """Report queries, with the scoping every reader (API, web UI) goes through."""

    def visible_to(self, user) -> "ReportQuerySet":
        """Reports of the teams ``user`` belongs to; everything (platform-wide reports too) for staff.

        Platform-wide reports name other teams' jobs and spend, so only staff see them.
        """
        if user.is_staff:
            return self
        return self.filter(team__memberships__user=user).distinct()


class Report(models.Model):
    """A utilization and cost report over ``[period_start, period_end)`` for ``team`` (null: platform-wide).

    ``kind`` is the schedule's period that made it (``daily``, ``weekly``) or
    ``custom`` (asked for on demand, any period). ``data`` holds the numbers
    (money as strings of USD cents, GPU-hours as floats, utilization in
    percent or null for "no data"); ``html`` and ``csv`` are its renderings,
    kept as generated (``costs.reports.build``). ``source`` says what built it
    (its schedule, the catch-up of a missed period, or a request by
    ``requested_by``); ``mailed_at`` when it was mailed, set by compare-and-set
    so a report is mailed once (null: not yet, or never for ``custom``).

    One report per scope, kind and period start (``report_one_per_scope_period``)
    and one ``custom`` report per scope and window: duplicate or concurrent
    builds of a period find the row that won (``costs.reports.catchup``). A
    platform-wide report's team is null, so the constraints index
    ``COALESCE(team_id, 0)``: PostgreSQL and SQLite treat NULLs as distinct
    in a unique index. The table is named ``frontend_report``: existing
    databases hold the reports under that name.
    """

    class Kind(models.TextChoices):
        DAILY = "daily"
        WEEKLY = "weekly"
        CUSTOM = "custom"

    class Source(models.TextChoices):
        SCHEDULE = "schedule"
        CATCH_UP = "catch-up"
        REQUEST = "request"

    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, null=True, blank=True, related_name="reports")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CUSTOM)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    generated_at = models.DateTimeField(auto_now_add=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.REQUEST)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    mailed_at = models.DateTimeField(null=True, blank=True)
    data = models.JSONField(default=dict)
    html = models.TextField(blank=True)
    csv = models.TextField(blank=True)

    objects = ReportQuerySet.as_manager()

    class Meta:
        db_table = "frontend_report"
        ordering = ["-period_end", "-generated_at", "-id"]
        indexes = [models.Index(fields=["team", "-period_end"])]
        constraints = [
            models.UniqueConstraint(Coalesce("team", models.Value(0)), "kind", "period_start",
                                    condition=~models.Q(kind="custom"), name="report_one_per_scope_period"),
            models.UniqueConstraint(Coalesce("team", models.Value(0)), "period_start", "period_end",
                                    condition=models.Q(kind="custom"), name="report_one_custom_per_scope_window"),
        ]

    def __str__(self) -> str:
        return f"{self.scope_name} {self.kind} {self.period_start:%Y-%m-%d}..{self.period_end:%Y-%m-%d}"

    @property
    def scope_name(self) -> str:
        """The team's slug, or ``platform`` for a platform-wide report."""
        return self.team.slug if self.team_id else "platform"
