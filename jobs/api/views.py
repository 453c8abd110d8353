"""``/api/v1/jobs/``: submit (JSON or YAML), list and follow jobs, cancel them, read their events, attempts and logs.

Thin views: validation lives in ``jobs.spec``, state changes in
``jobs.lifecycle``; every lookup goes through the team-scoped queryset.
"""

from __future__ import annotations

import itertools

from django.http import StreamingHttpResponse
from django.urls import reverse
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from core.money import usd_cents
from core.parsers import JSONParser, TextYAMLParser, YAMLParser
from core.viewsets import ScopedGenericViewSet
from costs.unknown import HAS_UNPRICED
from runners.base import ClusterUnreachable, UnknownBackend, backend_for

from ..dependencies import DependencyRefused
from ..filters import JobFilterSet
from ..lifecycle import NotCancellable, cancel_job, submit_job
from ..models import Job, JobState
from ..permissions import CANCEL_REFUSED, may_cancel
from ..preview import preview_json, refuse_unaffordable, stored_job_args, submission_preview
from ..spec import JobSubmission, SpecError, resubmission, team_for_submission, validated_submission
from ..states import StaleState
from ..throttles import SubmitterThrottle, refuse_team_flood
from ..workload import job_efficiency
from .serializers import (
    EFFICIENCY_SCHEMA,
    JobAttemptSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobLogsSerializer,
    JobSerializer,
    LogQuerySerializer,
)

DETAIL_RESPONSE = inline_serializer("Detail", fields={"detail": serializers.CharField()})


@extend_schema(tags=["jobs"])
class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedGenericViewSet):
    """Jobs of the user's teams (all jobs for staff); another team's job is a 404.

    ``POST /jobs/`` takes a submission as JSON or ``application/yaml`` (the
    shape of ``examples/jobs/*.yaml``) and answers 201 with the QUEUED job,
    or 400 with dotted field paths (see ``jobs.spec``).
    """

    queryset = Job.objects.select_related(
        "team", "submitter", "accelerator", "current_attempt__cluster", "current_attempt__node_pool"
    ).annotate(has_unpriced_cost=HAS_UNPRICED)
    serializer_class = JobSerializer
    filter_backends = [DjangoFilterBackend]
    filterset_class = JobFilterSet
    parser_classes = [JSONParser, YAMLParser, TextYAMLParser]
    throttle_classes = [SubmitterThrottle]  # submissions per user, before the body is parsed
    schema_summaries = {"create": "Submit a job", "attempts": "List a job's attempts", "cancel": "Cancel a job",
                        "preview": "Preview a submission (dry run)",
                        "events": "List a job's events (its timeline)", "logs": "Read or follow a node's log",
                        "resubmit": "Submit a job's submission again"}

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)

    def get_serializer_class(self):
        # One job (a GET, the answer to a submission or a cancel) carries its efficiency; a list does not.
        return super().get_serializer_class() if self.action == "list" else JobDetailSerializer

    def retrieve(self, request, *args, **kwargs):
        """One job; a QUEUED job not yet placed carries the preview's estimate as ``estimated_cost_usd`` (what
        submitting it answered), the list null."""
        job = self.get_object()
        data = self.get_serializer(job).data
        if data.get("estimated_cost_usd") is None and job.state == JobState.QUEUED:
            data["estimated_cost_usd"] = usd_cents(submission_preview(stored_job_args(job))["estimate_usd"])
        return Response(data)

    @extend_schema(
        request={"application/json": JobSubmission, "application/yaml": JobSubmission},
        responses={201: JobDetailSerializer, 400: OpenApiResponse(description="Field errors keyed by dotted path")},
    )
    def create(self, request, *args, **kwargs):
        """Validate a submission and store it as a QUEUED job (nothing is stored when it is rejected).

        A job its block budget can never cover is refused like one over its quota: 400 on
        ``spec.max_runtime_seconds`` naming the budget and the numbers (ADR 0036). The answer's
        ``estimated_cost_usd`` is the preview's estimate (``POST /jobs/preview/``) until the job is placed.
        """
        return self._submitted(request, request.data, request.path)

    @extend_schema(
        request=inline_serializer("Resubmission", fields={"name": serializers.CharField(required=False)}),
        responses={201: JobDetailSerializer, 400: OpenApiResponse(description="Field errors keyed by dotted path"),
                   403: DETAIL_RESPONSE},
    )
    @action(detail=True, methods=["post"], filter_backends=[])
    def resubmit(self, request, pk=None):
        """Submit the job's stored submission again as a new QUEUED job of its team, by the caller (optionally
        under a new ``name``): validated like any submission against today's quotas, pools and rules (400 with
        dotted field paths when it no longer passes), throttled like one; 403 for a viewer of its team. The job
        itself is not changed."""
        document = resubmission(self.get_object())
        try:  # a viewer sees the job but may not submit for its team: refused like a cancel, before the body
            team_for_submission(request.user, document["team"])
        except SpecError as exc:
            raise PermissionDenied(str(exc)) from None
        name = request.data.get("name") if isinstance(request.data, dict) else None
        if name is not None:
            document["name"] = name
        return self._submitted(request, document, reverse("job-list"))

    def _submitted(self, request, document, list_path: str):
        """Validate ``document`` (a submission) as ``request.user``'s, store it and answer 201 with the new job and
        its ``Location`` (under ``list_path``, the jobs list's path)."""
        fields = validated_submission(document, request.user)
        refuse_team_flood(fields["team"])  # counted once the team is known to accept this user's submissions
        preview = submission_preview(fields)
        refuse_unaffordable(preview)
        # The new job carries its team, submitter and accelerator instances: no need to read it back.
        try:
            job = submit_job(**fields)
        except DependencyRefused as exc:  # an upstream ended meanwhile: refused like at validation
            raise serializers.ValidationError({exc.path: [str(exc)]}) from None
        # The router's detail route is the list route plus "<pk>/" (what reverse_action("detail") answers,
        # without resolving the URLconf on every submission).
        location = request.build_absolute_uri(f"{list_path.rstrip('/')}/{job.pk}/")
        data = self.get_serializer(job).data
        if data.get("estimated_cost_usd") is None:
            data["estimated_cost_usd"] = usd_cents(preview["estimate_usd"])
        return Response(data, status=status.HTTP_201_CREATED, headers={"Location": location})

    @extend_schema(
        request={"application/json": JobSubmission, "application/yaml": JobSubmission},
        responses={200: OpenApiResponse(description="The dry run: placement with every candidate pool and its price "
                                                    "(why each other one was not chosen), the estimate (USD), the "
                                                    "quota and budget verdicts, the refusal if any, the short "
                                                    "resource with numbers while no pool has room now "
                                                    "(capacity), and the outcome (admit, wait or refused)"),
                   400: OpenApiResponse(description="Field errors keyed by dotted path")},
    )
    @action(detail=False, methods=["post"], filter_backends=[], pagination_class=None)
    def preview(self, request):
        """Validate a submission as ``POST /jobs/`` does and answer what submitting it now would do, storing
        nothing: what the web form's preview shows (``jobs.preview.submission_preview``)."""
        return Response(preview_json(submission_preview(validated_submission(request.data, request.user))))

    @extend_schema(request=None, responses={200: JobDetailSerializer, 403: DETAIL_RESPONSE, 409: DETAIL_RESPONSE})
    @action(detail=True, methods=["post"], filter_backends=[])
    def cancel(self, request, pk=None):
        """Cancel the job: CANCELLED at once when nothing runs, else CANCELLING until the cluster confirms.

        Allowed to the submitter, team admins and staff (403 otherwise); 409
        when the job is already final or changed meanwhile.
        """
        job = self.get_object()
        if not may_cancel(request.user, job):
            raise PermissionDenied(CANCEL_REFUSED)
        try:
            cancel_job(job, actor=request.user)
        except NotCancellable as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except StaleState:
            return Response({"detail": f"job {job.pk} changed meanwhile; read it again and retry"},
                            status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def events(self, request, pk=None):
        """The job's timeline, oldest first (paginated)."""
        job = self.get_object()
        events = job.events.select_related("actor", "attempt").order_by("created_at", "id")
        page = self.paginate_queryset(events)
        return self.get_paginated_response(JobEventSerializer(page, many=True).data)

    @extend_schema(responses={200: OpenApiResponse(response=EFFICIENCY_SCHEMA)})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def efficiency(self, request, pk=None):
        """The job's training efficiency (the detail's ``efficiency``) with each attempt's throughput series
        (``[unix seconds, step, tokens/s, loss]``) for a chart."""
        return Response(job_efficiency(self.get_object(), series=True))

    @extend_schema(responses=JobAttemptSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def attempts(self, request, pk=None):
        """The job's attempts (one per dispatch, retries and failovers included), by number (paginated)."""
        job = self.get_object()
        attempts = job.attempts.select_related("cluster", "node_pool").order_by("number")
        page = self.paginate_queryset(attempts)
        return self.get_paginated_response(JobAttemptSerializer(page, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("node", int, description="Node index, 0-based (default 0); for an inference job the "
                                                        "pod's among its nodes x replicas serving now"),
            OpenApiParameter("tail", int, description="Trailing lines, 1 to 100000 (default 200)"),
            OpenApiParameter("follow", bool, description="Stream text/plain: the tail, then new lines until the "
                                                         "attempt ends or LOG_FOLLOW_MAX_SECONDS pass"),
        ],
        responses={(200, "application/json"): JobLogsSerializer,
                   (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="follow=1: the log as a stream"),
                   400: OpenApiResponse(description="Bad node or tail"), 503: DETAIL_RESPONSE},
    )
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def logs(self, request, pk=None):
        """The last ``tail`` lines of node ``node``'s log of the current attempt, from the cluster's backend.

        Before any attempt exists ``attempt`` is null and ``text`` empty; 503
        when the cluster cannot be reached. With ``follow=1`` the answer is a
        ``text/plain`` stream: the tail, then each new line while the attempt
        runs, ending when it ends or after ``LOG_FOLLOW_MAX_SECONDS`` seconds
        (empty at once when there is no attempt yet).
        """
        job = self.get_object()
        query = LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        node, tail = query.validated_data["node"], query.validated_data["tail"]
        pods = job.pods
        if node >= pods:
            said = "pod(s) (nodes x replicas)" if job.kind == Job.Kind.INFERENCE else "node(s)"
            return Response({"node": [f"the job has {pods} {said}: 0 to {pods - 1}"]},
                            status=status.HTTP_400_BAD_REQUEST)
        follow = str(request.query_params.get("follow", "")).lower() in ("1", "true", "yes", "on")
        attempt = job.current_attempt
        if attempt is None:
            if follow:
                return StreamingHttpResponse(iter(()), content_type="text/plain; charset=utf-8")
            return Response({"node": node, "attempt": None, "text": ""})
        try:
            if follow:
                stream = backend_for(attempt.cluster).follow_logs(attempt, node, tail)
                first = next(stream, "")  # a cluster that does not answer is a 503, not an empty stream
            else:
                text = backend_for(attempt.cluster).logs(attempt, node, tail)
        except (ClusterUnreachable, UnknownBackend) as exc:
            return Response({"detail": f"cluster {attempt.cluster.name} is unreachable: {exc}"},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
        if follow:
            response = StreamingHttpResponse(itertools.chain([first], stream), content_type="text/plain; charset=utf-8")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # nginx: pass lines on as they come
            response["X-Job-Attempt"] = str(attempt.number)
            return response
        return Response({"node": node, "attempt": attempt.number, "text": text})
