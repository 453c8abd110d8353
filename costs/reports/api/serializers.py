"""Serializer of a stored report (its data as JSON; the CSV rendering has its own action)."""

from __future__ import annotations

from rest_framework import serializers

from costs.models import Report


class ReportSerializer(serializers.ModelSerializer):
    """A report: scope (team slug, null for platform-wide), kind, period ``[start, end)``, when generated, its data."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Report
        fields = ["id", "team", "kind", "period_start", "period_end", "generated_at", "data"]
        read_only_fields = fields
