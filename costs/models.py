"""Money: the effective-dated price catalog and the append-only cost ledger."""

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
