"""Serializers of the price catalog and of cost aggregates read from the ledger.

Aggregates show GPU-hours as floats (6 decimals) and USD as strings rounded
to cents, half to even; the ledger itself keeps exact Decimals.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from controlplane.api import AwareDateTimeField

from ..models import Price

GROUP_BY_CHOICES = ["team", "cluster", "accelerator", "job", "day"]


class PriceSerializer(serializers.ModelSerializer):
    """A list price in USD per GPU-hour, in force from ``effective_from``; ``cluster`` is set for an override."""

    accelerator = serializers.CharField(source="accelerator.name", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True, default=None)

    class Meta:
        model = Price
        fields = ["id", "provider", "region", "accelerator", "capacity_type", "cluster", "usd_per_gpu_hour",
                  "effective_from", "source"]
        read_only_fields = fields


class CostQuerySerializer(serializers.Serializer):
    """Query parameters of ``costs/``.

    ``group_by``: one of team, cluster, accelerator, job, day (UTC days;
    default team). ``start``/``end``: ISO 8601 datetimes with an offset,
    ``[start, end)``; either may be left out for an open end. ``team``:
    only this team (slug). 400 for a naive or malformed datetime or
    ``end <= start``.
    """

    group_by = serializers.ChoiceField(choices=GROUP_BY_CHOICES, default="team")
    start = AwareDateTimeField(required=False)
    end = AwareDateTimeField(required=False)
    team = serializers.CharField(required=False)

    def validate(self, attrs):
        if "start" in attrs and "end" in attrs and attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["must be after start"]})
        return attrs


class CostRowSerializer(serializers.Serializer):
    """One group of ledger entries: its key (the field named by ``group_by``), GPU-hours and USD."""

    team = serializers.CharField(required=False, help_text="group_by=team: team slug")
    cluster = serializers.CharField(required=False, help_text="group_by=cluster: cluster name")
    accelerator = serializers.CharField(required=False, help_text="group_by=accelerator: accelerator name")
    job = serializers.IntegerField(required=False, help_text="group_by=job: job id")
    job_name = serializers.CharField(required=False, help_text="group_by=job: job name")
    day = serializers.DateField(required=False, help_text="group_by=day: UTC date")
    gpu_hours = serializers.FloatField(help_text="GPUs x hours held, 6 decimals")
    cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2, help_text="USD, rounded to cents half-even")


class CostTotalSerializer(serializers.Serializer):
    """The sum over all rows (from exact ledger amounts, rounded once)."""

    gpu_hours = serializers.FloatField()
    cost_usd = serializers.DecimalField(max_digits=20, decimal_places=2)


@extend_schema_serializer(many=False)  # one report object, although served by the list action
class CostReportSerializer(serializers.Serializer):
    """The answer of ``costs/``: the query echoed, one row per group ordered by key, and the total."""

    group_by = serializers.CharField()
    start = serializers.DateTimeField(allow_null=True)
    end = serializers.DateTimeField(allow_null=True)
    results = CostRowSerializer(many=True)
    total = CostTotalSerializer()
