"""``/api/v1/cohort-trees/``: trees of cohorts with their quota and usage per level (ADR 0046), read by everyone.

The list is every tree (each root with its children, teams and usage); a detail is the subtree of one cohort (by
id; 404 for an unknown one). Writes go to ``cohorts/`` (``parent``, ``weight``) and ``cohort-quotas/``, staff only.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import permissions, serializers, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from core.schema import DescribedAutoSchema

from ..cohort_trees import cohort_forest


def _tree_fields() -> dict:
    return {"id": serializers.IntegerField(), "name": serializers.CharField(),
            "parent": serializers.CharField(allow_null=True), "weight": serializers.FloatField(),
            "accelerators": serializers.ListField(child=serializers.DictField()),
            "children": serializers.ListField(child=serializers.DictField()),
            "teams": serializers.ListField(child=serializers.DictField())}


@extend_schema(tags=["teams"])
class CohortTreeViewSet(viewsets.ViewSet):
    """Trees of cohorts: per level and GPU accelerator its own quota, the nominal quota inside its subtree, the GPUs
    its subtree's teams hold and what it borrows (``jobs.cohort_trees.cohort_forest``)."""

    permission_classes = [permissions.IsAuthenticated]
    schema = DescribedAutoSchema()
    lookup_value_regex = r"[0-9]+"
    schema_summaries = {"list": "List trees of cohorts with usage per level",
                        "retrieve": "Show one cohort's subtree with usage per level"}

    @extend_schema(responses=inline_serializer("CohortTreeList", fields=_tree_fields(), many=True),
                   operation_id="v1_cohort_trees_list")
    def list(self, request):
        """Every tree of cohorts, roots by name."""
        return Response(cohort_forest(request.user))

    @extend_schema(responses=inline_serializer("CohortTree", fields=_tree_fields()))
    def retrieve(self, request, pk=None):
        """The subtree of cohort ``pk``; 404 for an unknown cohort."""
        found = cohort_forest(request.user, int(pk))
        if not found:
            raise NotFound(f"no cohort {pk}")
        return Response(found[0])
