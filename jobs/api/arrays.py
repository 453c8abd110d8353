"""``/api/v1/arrays/``: submit a job array or parameter sweep, list and follow arrays, list their elements, cancel.

Thin views over ``jobs.arrays``: the template is validated once as a job submission (``jobs.spec``), the
``array`` field by ``jobs.arrays.validated_array``; every lookup goes through the team-scoped queryset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import django_filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from pydantic import Field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from core.money import usd_cents
from core.parsers import JSONParser, TextYAMLParser, YAMLParser
from core.viewsets import ScopedGenericViewSet
from costs.unknown import HAS_UNPRICED

from ..arrays import (
    ArrayError,
    array_status,
    cancel_array,
    element_costs,
    element_counts,
    grid_object,
    rolled_up_counts,
    submit_array,
    validated_array,
)
from ..filters import AwareDateTimeFilter, CommaMultipleChoiceFilter, ListedChoiceFilter
from ..lifecycle import NotCancellable
from ..models import Job, JobArray, JobState
from ..permissions import may_cancel
from ..preview import refuse_unaffordable, submission_preview
from ..spec import JobSubmission, SpecModel, validated_submission
from ..throttles import SubmitterThrottle, refuse_team_flood
from .serializers import JobSerializer

CANCEL_ARRAY_REFUSED = "only the submitter, a team admin or staff may cancel this array"
COUNT_KEYS = [s.lower() for s in JobState.values]


def _absent_default(schema: dict) -> None:
    schema.pop("default", None)


class ArrayField(SpecModel):
    """The ``array`` field of an array submission (documentation of the schema; ``jobs.arrays.validated_array``
    checks it): ``count`` or ``grid``, and ``parallelism``."""

    count: Annotated[int, Field(ge=1)] = Field(
        None, json_schema_extra=_absent_default,
        description="number of elements (1 to ARRAY_MAX_ELEMENTS, 10000 by default); with a grid, optional, and then "
                    "equal to its size")
    parallelism: Annotated[int, Field(ge=1)] = Field(
        None, json_schema_extra=_absent_default, description="most elements queued or running at once (default: "
                                                             "count)")
    grid: dict[str, list[str | int | float | bool]] = Field(
        None, json_schema_extra=_absent_default,
        description="parameters to sweep, each a list of values: the cartesian product gives the elements, the last "
                    "parameter varying fastest; each element gets SWEEP_<NAME upper-cased>=<value>")


class ArraySubmission(JobSubmission):
    """A job submission (``team``, ``name``, ``kind``, ``spec``) plus ``array``."""

    array: ArrayField


class ArrayFilterSet(django_filters.FilterSet):
    """Array list filters, as the job list's: ``team`` (slug), ``kind``, ``accelerator`` (name), ``submitter``
    (username), ``state`` (``open``, ``materialized``, ``cancelled``: whether elements are still to be made),
    ``created_after`` / ``created_before`` (ISO 8601, ``[after, before)``) and ``ordering`` by ``created_at``."""

    team = django_filters.CharFilter(field_name="team__slug", label="Team (slug)")
    kind = ListedChoiceFilter(choices=Job.Kind.choices, label="Kind")
    accelerator = django_filters.CharFilter(field_name="accelerator__name", label="Accelerator")
    submitter = django_filters.CharFilter(field_name="submitter__username", label="Submitted by (username)")
    state = CommaMultipleChoiceFilter(choices=JobArray.State.choices, label="State")
    created_after = AwareDateTimeFilter(field_name="created_at", lookup_expr="gte", label="Submitted from (UTC)")
    created_before = AwareDateTimeFilter(field_name="created_at", lookup_expr="lt", label="Submitted before (UTC)")
    ordering = django_filters.OrderingFilter(fields=("created_at",), label="Order by")

    class Meta:
        model = JobArray
        fields = ["team", "kind", "accelerator", "submitter", "state", "created_after", "created_before"]


COUNTS_SCHEMA = {"type": "object", "properties": {k: {"type": "integer"} for k in COUNT_KEYS},
                 "description": "elements by state (lower case); those not yet materialized count as queued, or "
                                "as cancelled once the array is cancelled"}


class JobArraySerializer(serializers.ModelSerializer):
    """An array as the API shows it: its template (``spec``), ``count``, ``parallelism``, ``grid`` (``{name:
    values}`` in the submitted order, ``{}`` for a plain array), ``materialized`` (element rows made so far),
    ``status`` (``queued``, ``running``, ``succeeded``, ``failed``, ``cancelling``, ``cancelled``), ``counts``
    by element state and ``cost_usd`` (the elements' ledger cost, USD rounded to cents). The roll-ups come from
    the serializer context's ``counts`` and ``costs`` (by array id, read for a whole page at once)."""

    team = serializers.CharField(source="team.slug", read_only=True)
    submitter = serializers.CharField(source="submitter.username", read_only=True)
    accelerator = serializers.CharField(source="accelerator.name", read_only=True)
    grid = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()
    counts = serializers.SerializerMethodField()
    cost_usd = serializers.SerializerMethodField()

    class Meta:
        model = JobArray
        fields = ["id", "name", "team", "submitter", "kind", "accelerator", "spec", "count", "parallelism", "grid",
                  "materialized", "state", "status", "counts", "cost_usd", "created_at", "cancelled_at"]
        read_only_fields = fields

    def _counts(self, array: JobArray) -> dict[str, int]:
        found = self.context.get("counts")
        raw = found[array.pk] if found and array.pk in found else element_counts([array.pk])[array.pk]
        return rolled_up_counts(array, raw)

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "array", "items": {}}})
    def get_grid(self, array: JobArray) -> dict:
        return grid_object(array.grid)

    @extend_schema_field(serializers.ChoiceField(choices=["queued", "running", "succeeded", "failed", "cancelling",
                                                          "cancelled"]))
    def get_status(self, array: JobArray) -> str:
        return array_status(array, self._counts(array))

    @extend_schema_field(COUNTS_SCHEMA)
    def get_counts(self, array: JobArray) -> dict[str, int]:
        return self._counts(array)

    @extend_schema_field({"type": "string", "format": "decimal", "example": "12.35"})
    def get_cost_usd(self, array: JobArray) -> str:
        found = self.context.get("costs")
        usd = found[array.pk] if found and array.pk in found else element_costs([array.pk])[array.pk]
        return usd_cents(usd)


@extend_schema(tags=["arrays"])
class JobArrayViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedGenericViewSet):
    """Job arrays of the user's teams (all for staff); another team's array is a 404.

    ``POST /arrays/`` takes a job submission plus ``array`` (JSON or ``application/yaml``) and answers 201 with
    the array, or 400 with dotted field paths (``array.count``, ``array.grid.<NAME>``, ``spec.resources...``).
    """

    queryset = JobArray.objects.select_related("team", "submitter", "accelerator", "cancelled_by")
    serializer_class = JobArraySerializer
    filter_backends = [DjangoFilterBackend]
    filterset_class = ArrayFilterSet
    parser_classes = [JSONParser, YAMLParser, TextYAMLParser]
    throttle_classes = [SubmitterThrottle]
    schema_summaries = {"create": "Submit a job array or parameter sweep", "cancel": "Cancel an array",
                        "elements": "List an array's element jobs"}

    def scope_queryset(self, queryset, user):
        return queryset.visible_to(user)

    def _context_for(self, arrays: list[JobArray]) -> dict:
        ids = [a.pk for a in arrays]
        return {**self.get_serializer_context(), "counts": element_counts(ids), "costs": element_costs(ids)}

    def list(self, request, *args, **kwargs):
        """The arrays, newest first (paginated), each with its status, counts and cost (read for the page at
        once)."""
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        data = JobArraySerializer(page, many=True, context=self._context_for(page)).data
        return self.get_paginated_response(data)

    @extend_schema(
        request={"application/json": ArraySubmission, "application/yaml": ArraySubmission},
        responses={201: JobArraySerializer, 400: OpenApiResponse(description="Field errors keyed by dotted path")},
    )
    def create(self, request, *args, **kwargs):
        """Validate the template once as a job submission (team, quota, placement, budget: the refusals of one
        job) and the ``array`` field, store the array with its first elements QUEUED, and answer 201."""
        data = request.data
        if not isinstance(data, Mapping):
            raise ValidationError({"non_field_errors": ["Expected an object: a job submission with an array "
                                                        "field."]})
        template = {k: v for k, v in data.items() if k != "array"}
        errors: dict[str, list[str]] = {}
        if "array" not in data:
            errors["array"] = ['This field is required: {"count": n, "parallelism": p} or {"grid": {NAME: '
                               '[values...]}, "parallelism": p}.']
        else:
            try:
                name = data.get("name") if isinstance(data.get("name"), str) else None
                shape = validated_array(data["array"], name=name.strip() if name else None)
            except ArrayError as exc:
                errors.update(exc.errors)
        try:
            fields = validated_submission(template, request.user)
        except ValidationError as exc:
            raise ValidationError({**exc.detail, **errors}) from None
        if fields["kind"] == Job.Kind.MULTI_ROLE:  # an element's env names its array, not its roles' peers
            errors["kind"] = ["a job array's runs are training or inference jobs; submit a multi-role job on its own"]
        if fields["after"]:  # elements are made by the passes, outside the dependency check's transaction
            errors["after"] = ["a job array cannot wait for other jobs: submit the array once they have ended, or "
                               "make each of its runs a job with after"]
        if errors:
            raise ValidationError(errors)
        refuse_team_flood(fields["team"])
        refuse_unaffordable(submission_preview(fields))
        array = submit_array(**fields, **shape)
        location = request.build_absolute_uri(f"{request.path.rstrip('/')}/{array.pk}/")
        array = self.get_queryset().get(pk=array.pk)
        return Response(self.get_serializer(array).data, status=status.HTTP_201_CREATED,
                        headers={"Location": location})

    @extend_schema(request=None, responses={200: JobArraySerializer, 403: OpenApiResponse(description="Not "
                   "allowed"), 409: OpenApiResponse(description="Already cancelled or ended")})
    @action(detail=True, methods=["post"], filter_backends=[])
    def cancel(self, request, pk=None):
        """Cancel the array: no more elements are made, queued ones end CANCELLED, running ones are cancelled
        (CANCELLING until their cluster confirms). Allowed to the submitter, team admins and staff (403
        otherwise); 409 when the array was cancelled already or every element has ended."""
        array = self.get_object()
        if not may_cancel(request.user, array):
            raise PermissionDenied(CANCEL_ARRAY_REFUSED)
        try:
            cancel_array(array, actor=request.user)
        except NotCancellable as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(self.get_queryset().get(pk=array.pk)).data)

    @extend_schema(responses=JobSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def elements(self, request, pk=None):
        """The array's materialized element jobs by index (paginated), as the job list shows jobs; ``?state=``
        (repeatable or comma-separated) keeps those in the states named."""
        array = self.get_object()
        jobs = (Job.objects.filter(array_id=array.pk)
                .select_related("team", "submitter", "accelerator", "current_attempt__cluster",
                                "current_attempt__node_pool")
                .annotate(has_unpriced_cost=HAS_UNPRICED).order_by("array_index"))
        states = request.query_params.getlist("state")
        if states:
            wanted = [part.strip().upper() for item in states for part in item.split(",") if part.strip()]
            unknown = sorted(set(wanted) - set(JobState.values))
            if unknown:
                raise ValidationError({"state": [f"unknown {', '.join(unknown)}; one of "
                                                 f"{', '.join(JobState.values)}"]})
            jobs = jobs.filter(state__in=wanted)
        page = self.paginate_queryset(jobs)
        return self.get_paginated_response(JobSerializer(page, many=True, context=self.get_serializer_context()).data)
