"""``/api/v1/utilization/`` (GPU utilization from the rollups) and ``/api/v1/budget-status/`` (budgets' money now).

Utilization rows come from ``costs.aggregation`` (exact, sample weighted;
rollups are per UTC day, so ``start``/``end`` select whole days).
"""

from __future__ import annotations

import datetime as dt

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from core.viewsets import ScopedGenericViewSet
from jobs.models import Job
from quotas.models import Budget, Team, scope_to_teams

from ..aggregation import filter_days, utilization_window
from ..budgets import budget_status
from ..capacity import node_utilization
from ..collection import refresh_running
from ..models import AttemptDailyCost, NodeUtilizationRollup, UtilizationRollup
from ..spend import utc_midnight
from .serializers import BudgetStatusSerializer, UtilizationQuerySerializer, UtilizationReportSerializer

#: What a node row has no figure for (money and memory are per attempt): null, "no data".
NODE_ROW_NULLS = ("avg_memory_used_mib", "unobserved_cost_usd", "idle_cost_usd", "idle_unpriced_gpu_hours",
                  "idle_unpriced_vcpu_hours", "util_metric")


@extend_schema(tags=["costs"])
class UtilizationViewSet(ScopedGenericViewSet):
    """GPU utilization of the user's teams (all for staff), from Prometheus rollups per attempt and day."""

    queryset = UtilizationRollup.objects.all()
    filter_backends = []
    pagination_class = None
    serializer_class = UtilizationReportSerializer
    schema_summaries = {"list": "GPU utilization by team, cluster, accelerator, job, UTC day or node"}

    def scope_queryset(self, queryset, user):
        return scope_to_teams(queryset, user)

    @extend_schema(parameters=[UtilizationQuerySerializer], responses=UtilizationReportSerializer)
    def list(self, request):
        """Allocated (billed, from the ledger: also without Prometheus), observed, idle and unobserved GPU-hours, average utilization (%), coverage, memory and idle USD
        per group over UTC days. With ``job``, that job only, its running attempts read live. ``group_by=node``:
        per node (``costs.capacity.node_utilization``: allocated GPU-hours split over each placement's nodes,
        observed and idle GPU-hours and the average utilization of the GPUs the attempts held there, from
        dcgm-exporter's host label), the money and memory figures null.

        400 with field errors for a bad ``group_by``, a naive or malformed datetime, ``end <= start``, or ``job``
        with ``group_by=node``.
        """
        query = UtilizationQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        if params["group_by"] == "node":
            return self._by_node(request, params)
        rollups = filter_days(self.get_queryset(), params.get("start"), params.get("end"))
        if "team" in params:
            rollups = rollups.filter(team__slug=params["team"])
        job = None
        if "job" in params:
            job = Job.objects.visible_to(request.user).filter(pk=params["job"]).first()
            if job is None:
                raise NotFound("no such job")
            refresh_running(job.attempts.filter(ended_at__isnull=True, started_at__isnull=False)
                            .select_related("job__team", "node_pool", "cluster"))
            rollups = rollups.filter(job_id=job.pk)
        user = request.user
        rows, total = utilization_window(rollups, params["group_by"], params.get("start"), params.get("end"),
                                         scope=lambda qs: scope_to_teams(qs, user), team_slug=params.get("team"),
                                         job_id=job.pk if job is not None else None)
        return Response({
            "group_by": params["group_by"],
            "start": params["start"].isoformat() if "start" in params else None,
            "end": params["end"].isoformat() if "end" in params else None,
            "results": rows,
            "total": total,
        })


    def _by_node(self, request, params) -> Response:
        """The ``group_by=node`` answer: the user's teams' attempts (every team's for staff; ``team`` keeps one)
        over the UTC days of ``[start, end)``; an open start is the first day of the ledger or the node rollups,
        an open end now."""
        teams = None if request.user.is_staff else set(Team.objects.visible_to(request.user)
                                                       .values_list("pk", flat=True))
        if "team" in params:
            wanted = set(Team.objects.filter(slug=params["team"]).values_list("pk", flat=True))
            teams = wanted if teams is None else teams & wanted
        end = params.get("end") or timezone.now()
        start = params.get("start")
        if start is None:
            days = [d for d in (AttemptDailyCost.objects.order_by("day").values_list("day", flat=True).first(),
                                NodeUtilizationRollup.objects.order_by("day").values_list("day", flat=True).first())
                    if d is not None]
            start = utc_midnight(min(days)) if days else end - dt.timedelta(days=1)
        start = min(start, end - dt.timedelta(microseconds=1))
        rows, total = node_utilization(start, end, team_ids=teams)
        for row in (*rows, total):
            row.update(dict.fromkeys(NODE_ROW_NULLS))
        return Response({"group_by": "node", "start": params["start"].isoformat() if "start" in params else None,
                         "end": params["end"].isoformat() if "end" in params else None, "results": rows,
                         "total": total})


@extend_schema(tags=["costs"])
class BudgetStatusViewSet(ScopedGenericViewSet):
    """Read-only money of each budget in its current period: spent, committed, remaining, forecast (USD).

    A custom budget whose dates do not contain now has no current period and is left out (404 alone).
    """

    queryset = Budget.objects.select_related("team").order_by("pk")
    serializer_class = BudgetStatusSerializer
    filter_backends = []
    pagination_class = None
    schema_summaries = {"list": "Budgets in their current period", "retrieve": "One budget in its current period"}

    def scope_queryset(self, queryset, user):
        return scope_to_teams(queryset, user).distinct()

    def list(self, request):
        now = timezone.now()
        statuses = [s for s in (budget_status(b, now) for b in self.get_queryset()) if s is not None]
        return Response(BudgetStatusSerializer(statuses, many=True).data)

    def retrieve(self, request, pk=None):
        status = budget_status(self.get_object())
        if status is None:
            raise NotFound("this budget has no current period")
        return Response(BudgetStatusSerializer(status).data)
