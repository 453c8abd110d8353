"""Money: the effective-dated price catalog and the append-only cost ledger, its rollups, utilization and reports."""

from django.db import models


class Price(models.Model):
    """A list price per GPU-hour in USD, in force from ``effective_from`` until the next one.

    Keyed by provider, region, accelerator and capacity type; a row with a
    ``cluster`` overrides the catalog for that cluster only. A new price
    applies from its effective time on and never to the past, because the
    ledger looks up the price in force at each interval's start.
    Seed figures come from ../shared/reference/prices.md (SkyPilot catalog).
    """

    provider = models.CharField(max_length=16)
    region = models.CharField(max_length=64)
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="prices")
    capacity_type = models.CharField(max_length=16, default="on-demand")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, null=True, blank=True, related_name="price_overrides")
    usd_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6)
    effective_from = models.DateTimeField()
    source = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["provider", "region", "accelerator__name", "capacity_type", "-effective_from"]
        indexes = [models.Index(fields=["provider", "region", "accelerator", "capacity_type", "effective_from"])]

    def __str__(self) -> str:
        scope = self.cluster.name if self.cluster_id else f"{self.provider}/{self.region}"
        return f"{scope} {self.accelerator} {self.capacity_type} ${self.usd_per_gpu_hour}/GPU-h from {self.effective_from:%Y-%m-%d}"


class CostEntry(models.Model):
    """One line of the ledger: an attempt's GPUs held over ``[interval_start, interval_end)`` at one price.

    ``amount_usd = gpus * seconds / 3600 * usd_per_gpu_hour``, rounded half
    to even to 1e-9 USD (see ``costs.ledger``). Entries are only appended;
    the unique (attempt, interval_start) key makes accrual idempotent.
    """

    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.PROTECT, related_name="cost_entries")
    job = models.ForeignKey("jobs.Job", on_delete=models.PROTECT, related_name="cost_entries")
    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="cost_entries")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.PROTECT, related_name="cost_entries")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="cost_entries")
    interval_start = models.DateTimeField()
    interval_end = models.DateTimeField()
    gpus = models.PositiveIntegerField()
    usd_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6)
    amount_usd = models.DecimalField(max_digits=20, decimal_places=9)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["interval_start"]
        verbose_name_plural = "cost entries"
        constraints = [
            models.UniqueConstraint(fields=["attempt", "interval_start"], name="costentry_unique_interval"),
            models.CheckConstraint(condition=models.Q(interval_end__gt=models.F("interval_start")), name="costentry_positive_interval"),
        ]
        indexes = [models.Index(fields=["team", "interval_start"])]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.attempt_id} {self.interval_start:%Y-%m-%d %H:%M}..{self.interval_end:%H:%M} ${self.amount_usd}"

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * (self.interval_end - self.interval_start).total_seconds()


class DailyCostRollup(models.Model):
    """Ledger totals per UTC day, team, cluster and accelerator: GPU-seconds and USD (exact, 1e-9).

    Derived only from CostEntry (an entry counts on the UTC day of its
    ``interval_start``, the rule of the costs API and of budgets) and
    rebuilt by ``costs.rollups.rebuild_rollups`` / ``manage.py rebuild_rollups``.
    """

    day = models.DateField()
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="cost_rollups")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, related_name="cost_rollups")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.CASCADE, related_name="cost_rollups")
    gpu_seconds = models.DecimalField(max_digits=24, decimal_places=6)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=9)
    entries = models.PositiveIntegerField()
    rebuilt_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["day", "team__slug"]
        constraints = [models.UniqueConstraint(fields=["day", "team", "cluster", "accelerator"], name="costrollup_unique")]

    def __str__(self) -> str:
        return f"{self.day} {self.team_id}/{self.cluster_id}/{self.accelerator_id} ${self.cost_usd}"


class UtilizationRollup(models.Model):
    """GPU utilization of one attempt on one UTC day, read from Prometheus (DCGM exporter).

    Only samples inside the attempt's running interval count. Sums are kept
    (not only averages) so that teams, clusters and days aggregate exactly:
    average utilization = ``util_sum / samples`` (percent 0-100, sample
    weighted), coverage = ``samples / expected_samples``. ``samples == 0``
    means "no data": the averages are NULL, never 0 %.
    ``gpu_seconds`` is the allocation (GPUs x seconds running) on that day;
    ``idle_gpu_seconds`` the part of it whose utilization was under the idle
    threshold (NULL without data).
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
    collected_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["day", "attempt_id"]
        constraints = [models.UniqueConstraint(fields=["attempt", "day"], name="utilrollup_unique")]
        indexes = [models.Index(fields=["team", "day"])]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} {self.day}: {self.avg_gpu_util_percent}%"


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

    ``kind`` is the schedule that made it (``daily``, ``weekly``) or ``custom``.
    ``data`` holds the numbers (money as strings of USD cents, GPU-hours as
    floats, utilization in percent or null for "no data"); ``html`` and
    ``csv`` are its renderings, kept as generated (``costs.reports.build``).
    The table is named ``frontend_report``: existing databases hold the
    reports under that name.
    """

    class Kind(models.TextChoices):
        DAILY = "daily"
        WEEKLY = "weekly"
        CUSTOM = "custom"

    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, null=True, blank=True, related_name="reports")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CUSTOM)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    generated_at = models.DateTimeField(auto_now_add=True)
    data = models.JSONField(default=dict)
    html = models.TextField(blank=True)
    csv = models.TextField(blank=True)

    objects = ReportQuerySet.as_manager()

    class Meta:
        db_table = "frontend_report"
        ordering = ["-period_end", "-generated_at", "-id"]
        indexes = [models.Index(fields=["team", "-period_end"])]

    def __str__(self) -> str:
        return f"{self.scope_name} {self.kind} {self.period_start:%Y-%m-%d}..{self.period_end:%Y-%m-%d}"

    @property
    def scope_name(self) -> str:
        """The team's slug, or ``platform`` for a platform-wide report."""
        return self.team.slug if self.team_id else "platform"
