"""``POST /api/v1/jobs/<id>/rollout/``: move a serving job to the checkpoint of another training job, replica by
replica (``serving.rollout``). The job's state shows the rollout under ``serving.rollout`` (``GET /jobs/<id>/``)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from core.viewsets import ScopedGenericViewSet
from jobs.models import Job, ServingRollout
from jobs.permissions import CANCEL_REFUSED, may_cancel

from ..rollout import RolloutError, start_rollout


class RolloutRequestSerializer(serializers.Serializer):
    """``{"checkpoint_from_job": <id>}``: the SUCCEEDED training job of the same team whose checkpoint to serve."""

    checkpoint_from_job = serializers.IntegerField(min_value=1)


class RolloutSerializer(serializers.ModelSerializer):
    """A rollout's state: ``state`` (rolling, done, rolled_back), ``from`` and ``to`` (training job ids),
    ``replicas_updated``, ``reason`` (why it ended), ``note`` (why a step waits), ``trigger`` (the followed training
    job whose success started it, null for a request)."""

    note = serializers.SerializerMethodField()

    class Meta:
        model = ServingRollout
        fields = ["id", "job", "state", "from_job_id", "to_job_id", "trigger_job_id", "replicas_updated", "reason",
                  "note", "created_at"]

    def get_note(self, rollout: ServingRollout) -> str:
        return (rollout.progress or {}).get("note", "")

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["from"], data["to"], data["trigger"] = (data.pop("from_job_id"), data.pop("to_job_id"),
                                                     data.pop("trigger_job_id"))
        return data


class RolloutViewSet(ScopedGenericViewSet):
    """Rolling updates of the user's teams' serving jobs; another team's job is a 404. One action on a job, as
    ``cancel`` is (mounted under the ``jobs`` prefix beside the jobs' own viewset)."""

    queryset = Job.objects.all()
    serializer_class = RolloutRequestSerializer
    schema_summaries = {"rollout": "Roll a serving job out to another checkpoint"}

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)

    @extend_schema(request=RolloutRequestSerializer,
                   responses={202: RolloutSerializer, 400: OpenApiResponse(description="field and reason"),
                              403: OpenApiResponse(description="not the submitter, a team admin or staff")})
    @action(detail=True, methods=["post"])
    def rollout(self, request, pk=None):
        """Start moving the serving job to the checkpoint of training job ``checkpoint_from_job``, one replica
        at a time (202 with the rollout's state). Allowed to whoever may cancel the job (403 otherwise); 400 names
        the field and the reason (not a RUNNING serving job, not a SUCCEEDED training job of the team, the
        checkpoint served already, a rollout under way)."""
        job = self.get_object()
        if not may_cancel(request.user, job):
            raise PermissionDenied(CANCEL_REFUSED)
        body = RolloutRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            rollout = start_rollout(job.pk, checkpoint_from_job_id=body.validated_data["checkpoint_from_job"],
                                    actor=request.user)
        except RolloutError as exc:
            raise ValidationError({exc.field: [exc.reason]}) from None
        return Response(RolloutSerializer(rollout).data, status=status.HTTP_202_ACCEPTED)
