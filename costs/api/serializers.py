"""Serializers of the price catalog and of cost aggregates read from the ledger.

Aggregates show GPU-hours as floats (6 decimals) and USD as strings rounded
to cents, half to even; the ledger itself keeps exact Decimals.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from core.fields import AwareDateTimeField, ListedChoiceField
from core.gpus import shown_gpus
from core.money import shown_usd

from ..aggregation import GROUP_KEYS
from ..models import Price
from ..unknown import unknown_cost, unknown_cost_json

GROUP_BY_CHOICES = list(GROUP_KEYS)  # team, cluster, accelerator, job, attempt, day
ENERGY_KWH_HELP = ("kWh the GPUs drew per DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION over the UTC days touched, 6 decimals; "
                   "null: not measured (no energy series), never 0")
ENERGY_COST_HELP = ("USD of that energy at the cluster's electricity price, cents half-even; a line of its own, not in "
                    "cost_usd; null: no price known for any of it (unknown, never $0)")
ENERGY_UNPRICED_HELP = "kWh measured on clusters without an electricity price in force (their cost unknown)"


class PriceSerializer(serializers.ModelSerializer):
    """A list price in USD per GPU-hour (a CPU node pool's: 0, with USD per vCPU-hour and per GiB-hour), in force
    from ``effective_from``; ``cluster`` is set for an override."""

    accelerator = serializers.CharField(source="accelerator.name", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True, default=None, allow_null=True)

    class Meta:
        model = Price
        fields = ["id", "provider", "region", "accelerator", "capacity_type", "cluster", "usd_per_gpu_hour",
                  "usd_per_vcpu_hour", "usd_per_gib_hour", "effective_from", "source"]
        read_only_fields = fields


class CostQuerySerializer(serializers.Serializer):
    """Query parameters of ``costs/``.

    ``group_by``: one of team, cluster, accelerator, job, attempt, day (UTC days;
    default team). ``start``/``end``: ISO 8601 datetimes with an offset,
    ``[start, end)``; either may be left out for an open end. ``team``:
    only this team (slug). 400 for a naive or malformed datetime or
    ``end <= start``.
    """

    group_by = ListedChoiceField(choices=GROUP_BY_CHOICES, default="team")
    start = AwareDateTimeField(required=False)
    end = AwareDateTimeField(required=False)
    team = serializers.CharField(required=False)
    job = serializers.IntegerField(required=False, min_value=1,
                                   help_text="utilization/ only: one job; its running attempts are read live from "
                                             "Prometheus (cached COSTS_LIVE_CACHE_SECONDS)")
    with_utilization = serializers.BooleanField(
        default=False, help_text="costs/ only: add avg_gpu_util_percent, idle_gpu_hours and idle_cost_usd per row")

    def validate(self, attrs):
        if "start" in attrs and "end" in attrs and attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["must be after start"]})
        return attrs


class UtilizationQuerySerializer(CostQuerySerializer):
    """Query parameters of ``utilization/``: those of ``costs/`` and ``group_by=node`` (GPU utilization per node,
    ``costs.capacity.node_utilization``; not with ``job``)."""

    group_by = ListedChoiceField(choices=[*GROUP_BY_CHOICES, "node"], default="team")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if attrs["group_by"] == "node" and "job" in attrs:
            raise serializers.ValidationError({"job": ["cannot be combined with group_by=node"]})
        return attrs


class CostRowSerializer(serializers.Serializer):
    """One group of ledger entries: its key (the field named by ``group_by``), GPU-hours and USD."""

    team = serializers.CharField(required=False, help_text="group_by=team: team slug")
    cluster = serializers.CharField(required=False, help_text="group_by=cluster: cluster name")
    accelerator = serializers.CharField(required=False, help_text="group_by=accelerator: accelerator name")
    job = serializers.IntegerField(required=False, help_text="group_by=job: job id")
    job_name = serializers.CharField(required=False, help_text="group_by=job: job name")
    attempt = serializers.IntegerField(required=False, help_text="group_by=attempt: attempt id")
    attempt_number = serializers.IntegerField(required=False, help_text="group_by=attempt: its number in its job")
    day = serializers.DateField(required=False, help_text="group_by=day: UTC date")
    gpu_hours = serializers.FloatField(help_text="GPUs x hours held, 6 decimals")
    cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True,
                                        help_text="priced USD, rounded to cents half-even; null: none of it priced")
    unpriced_gpu_hours = serializers.FloatField(help_text="GPU-hours with no price in force, not in cost_usd")
    unpriced_vcpu_hours = serializers.FloatField(help_text="vCPU-hours (CPU node pools) with no price in force")
    avg_gpu_util_percent = serializers.FloatField(required=False, allow_null=True,
                                                  help_text="with_utilization: over the UTC days touched; null: no data")
    observed_gpu_hours = serializers.FloatField(required=False, allow_null=True)
    idle_gpu_hours = serializers.FloatField(required=False, allow_null=True,
                                            help_text="with_utilization: GPU-hours under the idle threshold")
    unobserved_gpu_hours = serializers.FloatField(required=False, allow_null=True)
    idle_percent = serializers.FloatField(required=False, allow_null=True,
                                          help_text="with_utilization: idle share of the observed GPU time, percent")
    coverage_percent = serializers.FloatField(required=False, allow_null=True,
                                              help_text="with_utilization: observed / allocated GPU time, percent")
    idle_cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, required=False, allow_null=True)
    idle_unpriced_gpu_hours = serializers.FloatField(required=False, allow_null=True,
                                                     help_text="with_utilization: idle GPU-hours with no price")
    idle_unpriced_vcpu_hours = serializers.FloatField(required=False, allow_null=True)
    energy_kwh = serializers.FloatField(allow_null=True, help_text=ENERGY_KWH_HELP)
    energy_cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True,
                                               help_text=ENERGY_COST_HELP)
    energy_unpriced_kwh = serializers.FloatField(allow_null=True, help_text=ENERGY_UNPRICED_HELP)


class CostTotalSerializer(serializers.Serializer):
    """The sum over all rows (from exact ledger amounts, rounded once), and what the rows miss of it by rounding."""

    gpu_hours = serializers.FloatField()
    cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True)
    unpriced_gpu_hours = serializers.FloatField(help_text="GPU-hours with no price in force, not in cost_usd")
    unpriced_vcpu_hours = serializers.FloatField(help_text="vCPU-hours with no price in force, not in cost_usd")
    rounding_difference_usd = serializers.DecimalField(
        max_digits=20, decimal_places=2, help_text="cost_usd minus the sum of the rows' cost_usd: each row and the "
                                                   "total are their exact sums rounded once, so the rows may miss "
                                                   "the total by a few cents; 0.00 when they add up")
    avg_gpu_util_percent = serializers.FloatField(required=False, allow_null=True)
    observed_gpu_hours = serializers.FloatField(required=False, allow_null=True)
    idle_gpu_hours = serializers.FloatField(required=False, allow_null=True)
    unobserved_gpu_hours = serializers.FloatField(required=False, allow_null=True)
    idle_percent = serializers.FloatField(required=False, allow_null=True,
                                          help_text="with_utilization: idle share of the observed GPU time, percent")
    coverage_percent = serializers.FloatField(required=False, allow_null=True,
                                              help_text="with_utilization: observed / allocated GPU time, percent")
    idle_cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, required=False, allow_null=True)
    idle_unpriced_gpu_hours = serializers.FloatField(required=False, allow_null=True)
    idle_unpriced_vcpu_hours = serializers.FloatField(required=False, allow_null=True)
    energy_kwh = serializers.FloatField(allow_null=True, help_text=ENERGY_KWH_HELP)
    energy_cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True,
                                               help_text=ENERGY_COST_HELP)
    energy_unpriced_kwh = serializers.FloatField(allow_null=True, help_text=ENERGY_UNPRICED_HELP)


@extend_schema_serializer(many=False)  # one report object, although served by the list action
class CostReportSerializer(serializers.Serializer):
    """The answer of ``costs/``: the query echoed, one row per group ordered by key, and the total."""

    group_by = serializers.CharField()
    start = serializers.DateTimeField(allow_null=True)
    end = serializers.DateTimeField(allow_null=True)
    results = CostRowSerializer(many=True)
    total = CostTotalSerializer()


class UtilizationRowSerializer(serializers.Serializer):
    """One group of utilization rollups; null averages mean "no data" (no samples), never 0 %."""

    team = serializers.CharField(required=False)
    cluster = serializers.CharField(required=False)
    accelerator = serializers.CharField(required=False)
    job = serializers.IntegerField(required=False)
    job_name = serializers.CharField(required=False)
    attempt = serializers.IntegerField(required=False)
    attempt_number = serializers.IntegerField(required=False)
    day = serializers.DateField(required=False)
    node = serializers.CharField(required=False, help_text="group_by=node: the node's name")
    node_id = serializers.IntegerField(required=False, allow_null=True,
                                       help_text="group_by=node: the node's id in nodes/ (null: not in the inventory)")
    gpu_hours = serializers.FloatField(help_text="GPUs x hours running (allocation)")
    avg_gpu_util_percent = serializers.FloatField(allow_null=True, help_text="sample-weighted mean, percent 0-100")
    coverage = serializers.FloatField(allow_null=True, help_text="observed / allocated GPU time, 0-1")
    coverage_percent = serializers.FloatField(allow_null=True, help_text="observed / allocated GPU time, percent")
    avg_memory_used_mib = serializers.FloatField(allow_null=True, help_text="DCGM_FI_DEV_FB_USED mean, MiB")
    observed_gpu_hours = serializers.FloatField(
        help_text="GPU-hours covered by DCGM samples: each counts until the next one or the Prometheus lookback "
                  "(COSTS_QUERY_LOOKBACK_DELTA_SECONDS), whichever comes first")
    idle_gpu_hours = serializers.FloatField(allow_null=True,
                                            help_text="observed GPU-hours under the idle threshold; null: no data")
    idle_percent = serializers.FloatField(allow_null=True,
                                          help_text="idle share of the observed GPU-hours, percent; null: no data")
    unobserved_gpu_hours = serializers.FloatField(help_text="allocated GPU-hours without samples, never estimated")
    unobserved_cost_usd = serializers.DecimalField(
        max_digits=20, decimal_places=2, allow_null=True,
        help_text="USD of the unobserved GPU-hours: the group's ledger cost times their share of its GPU-hours; "
                  "null: unknown cost, or nothing billed")
    idle_cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True,
                                             help_text="priced USD of the idle GPU-hours; null: no data, or none "
                                                       "of it priced")
    idle_unpriced_gpu_hours = serializers.FloatField(allow_null=True,
                                                     help_text="idle GPU-hours with no price, not in idle_cost_usd")
    idle_unpriced_vcpu_hours = serializers.FloatField(allow_null=True)
    util_metric = serializers.CharField(allow_null=True,
                                        help_text="DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_DEV_GPU_UTIL, mixed; null: no data")


@extend_schema_serializer(many=False)
class UtilizationReportSerializer(serializers.Serializer):
    """The answer of ``utilization/``: the query echoed, one row per group, and the total."""

    group_by = serializers.CharField()
    start = serializers.DateTimeField(allow_null=True)
    end = serializers.DateTimeField(allow_null=True)
    results = UtilizationRowSerializer(many=True)
    total = UtilizationRowSerializer()


class BudgetStatusSerializer(serializers.Serializer):
    """A budget's current period in USD (cents, half-even); see ``costs.budgets.BudgetStatus`` for the forecast."""

    id = serializers.IntegerField(source="budget.pk")
    team = serializers.CharField(source="budget.team.slug")
    period = serializers.CharField(source="budget.period")
    action = serializers.CharField(source="budget.action")
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField()
    amount_usd = serializers.DecimalField(max_digits=20, decimal_places=2)
    spent_usd = serializers.SerializerMethodField(
        help_text="priced USD spent in the period (cents); null when none of it is priced (see unpriced_gpu_hours)")
    unpriced_gpu_hours = serializers.FloatField(help_text="GPU-hours in the period with no price in force: not in "
                                                          "spent_usd, counted at the highest catalog price in "
                                                          "remaining_usd and forecast_usd")
    unpriced_vcpu_hours = serializers.FloatField(help_text="vCPU-hours (CPU node pools) with no price in force")
    committed_usd = serializers.DecimalField(max_digits=20, decimal_places=2)
    remaining_usd = serializers.DecimalField(max_digits=20, decimal_places=2)
    forecast_usd = serializers.DecimalField(max_digits=20, decimal_places=2)
    burn_rate_usd_per_hour = serializers.DecimalField(
        max_digits=20, decimal_places=2, help_text="what the team's running attempts cost per hour now: their GPUs "
                                                   "(and CPU) x the price in force")
    burn_rate_unpriced_gpus = serializers.SerializerMethodField(
        help_text="GPUs running with no price in force, not in burn_rate_usd_per_hour (an integer, or a number with "
                  "decimals where shares of a GPU run: 0.25)")
    forecast_method = serializers.CharField(source="basis.method", help_text="how forecast_usd is computed")
    forecast_rate_usd_per_day = serializers.DecimalField(source="basis.rate_usd_per_day", max_digits=20,
                                                         decimal_places=2)
    forecast_window = serializers.SerializerMethodField(help_text="the UTC days whose median daily spend is the rate")
    cost_unknown = serializers.SerializerMethodField(
        help_text="null, or since when and for how many GPU-hours the team ran without a price (not in spent_usd)")

    @extend_schema_field(serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True))
    def get_spent_usd(self, status) -> str | None:
        return shown_usd(status.spent_usd, status.unpriced_gpu_hours + status.unpriced_vcpu_hours)

    @extend_schema_field(serializers.FloatField())
    def get_burn_rate_unpriced_gpus(self, status) -> int | float:
        return shown_gpus(status.burn_rate_unpriced_gpus)

    def get_forecast_window(self, status) -> dict:
        return {"first_day": status.basis.window_start.isoformat(), "last_day": status.basis.window_end.isoformat()}

    def get_cost_unknown(self, status) -> dict | None:
        return unknown_cost_json(unknown_cost(team=status.budget.team_id))
