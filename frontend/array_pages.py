"""The page of a job array (``/arrays/<id>/``): its status, counts by state, cost, grid, elements table and cancel
(docs/adr/0038). The figures are ``jobs.arrays``' roll-ups, the same the API answers."""

from __future__ import annotations

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from jobs.arrays import (
    array_status,
    cancel_array,
    element_costs,
    element_counts,
    grid_object,
    grid_point,
    rolled_up_counts,
)
from jobs.lifecycle import NotCancellable
from jobs.models import Job, JobArray, JobState
from jobs.permissions import may_cancel

#: Elements listed on the page, by index (the API's ``elements/`` pages through all of them).
ELEMENT_ROWS = 200
CANCEL_ARRAY_REFUSED = "only the submitter, a team admin or staff may cancel this array"


def _visible_array(request, pk: int) -> JobArray:
    """Array ``pk`` if ``request.user`` may see it (its team's members, staff), else 404."""
    return get_object_or_404(JobArray.objects.visible_to(request.user).select_related("team", "submitter",
                                                                                       "accelerator"), pk=pk)


@login_required
def array_detail(request, pk: int):
    """An array: status, counts by state (elements not yet made as queued), cost, grid, template spec and its
    first ``ELEMENT_ROWS`` elements with their parameters, state and cost; a Cancel for who may cancel it."""
    array = _visible_array(request, pk)
    counts = rolled_up_counts(array, element_counts([array.pk])[array.pk])
    elements = list(Job.objects.filter(array_id=array.pk).select_related("current_attempt__cluster")
                    .order_by("array_index")[:ELEMENT_ROWS])
    rows = [{"job": job, "params": grid_point(array.grid, job.array_index) if array.grid else {}}
            for job in elements]
    status = array_status(array, counts)
    return render(request, "frontend/array_detail.html", {
        "array": array, "status": status, "counts": [(s.lower(), counts.get(s.lower(), 0)) for s in JobState.values],
        "cost": element_costs([array.pk])[array.pk], "grid": grid_object(array.grid), "rows": rows,
        "more": array.materialized - len(rows), "spec_yaml": yaml.safe_dump(array.spec, sort_keys=False),
        "may_cancel": status not in ("succeeded", "failed", "cancelled", "cancelling")
        and may_cancel(request.user, array)})


@login_required
@require_http_methods(["GET", "POST"])
def array_cancel(request, pk: int):
    """GET: a confirmation page; POST: cancel the array, every element (submitter, team admins and staff; 403
    for others)."""
    array = _visible_array(request, pk)
    if not may_cancel(request.user, array):
        raise PermissionDenied(CANCEL_ARRAY_REFUSED)
    if request.method == "POST":
        try:
            cancel_array(array, actor=request.user)
            messages.success(request, f"Array {array.pk} cancelled: no more elements start, running ones stop.")
        except NotCancellable as exc:
            messages.error(request, f"Array {array.pk} could not be cancelled: {exc}")
        return redirect("frontend:array-detail", pk=array.pk)
    return render(request, "frontend/array_cancel.html", {"array": array})
