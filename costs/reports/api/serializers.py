"""Serializers of a stored report (its data as JSON; the CSV rendering has its own action) and of a request for
one on demand."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.fields import AwareDateTimeField
from costs.models import Report
from quotas.models import Team

from ..build import period_errors

SLUG_MAX_LENGTH = Team._meta.get_field("slug").max_length


class ReportSerializer(serializers.ModelSerializer):
    """A report: scope (team slug, null for platform-wide), kind, period ``[start, end)``, when generated, what
    built it (``source``: ``schedule``, ``catch-up`` or ``request``; ``requested_by``: the user who asked), when it
    was mailed (null: not yet; never for ``custom``), its data."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = Report
        fields = ["id", "team", "kind", "period_start", "period_end", "generated_at", "source", "requested_by",
                  "mailed_at", "data"]
        read_only_fields = fields


@extend_schema_field({"type": "string", "example": "ml-research"})
class MemberTeamField(serializers.Field):
    """A team by slug, among the requesting user's teams (every team for staff): an unknown team and one the user
    is not a member of get the same answer, so the field tells nothing about other teams."""

    default_error_messages = {
        "invalid": "Expected a team slug (text of at most {max_length} characters).",
        "does_not_exist": 'unknown team "{value}", or you are not a member of it',
    }

    def to_internal_value(self, data) -> Team:
        if not isinstance(data, str) or "\x00" in data or len(data) > SLUG_MAX_LENGTH:
            self.fail("invalid", max_length=SLUG_MAX_LENGTH)
        team = Team.objects.visible_to(self.context["request"].user).filter(slug=data).first()
        if team is None:
            self.fail("does_not_exist", value=data)
        return team

    def to_representation(self, value: Team) -> str:
        return value.slug


class ReportRequestSerializer(serializers.Serializer):
    """A report asked for on demand: ``team`` (slug; left out: platform-wide, for staff only), ``start`` and
    ``end``, ISO 8601 datetimes with an offset: the period ``[start, end)``, at most ``REPORTS_MAX_PERIOD_DAYS``
    days. 400 naming the field: an unknown team or one of another team's, a platform-wide report asked for by
    someone not staff, a naive or malformed datetime, ``end`` at or before ``start``, a longer period."""

    team = MemberTeamField(required=False, help_text="team slug; leave out for a platform-wide report (staff)")
    start = AwareDateTimeField(help_text="start of the period, inclusive (e.g. 2026-11-01T00:00:00Z)")
    end = AwareDateTimeField(help_text="end of the period, exclusive")

    def validate(self, attrs):
        if "team" not in attrs and not self.context["request"].user.is_staff:
            raise serializers.ValidationError(
                {"team": ["required: a platform-wide report covers every team and is for staff only"]})
        errors = period_errors(attrs["start"], attrs["end"])
        if errors:
            raise serializers.ValidationError({name: [reason] for name, reason in errors.items()})
        return attrs
