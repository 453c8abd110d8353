"""Web UI views: dashboard, jobs (list, page, submit, cancel), teams' quotas and budgets, clusters, costs, reports.

Thin views over the same services as the API (``jobs.lifecycle``, ``jobs.spec``,
``jobs.scheduling``, ``costs``); every lookup goes through a ``visible_to(user)``
queryset, so another team's object is a 404, never a 403.
"""

from __future__ import annotations

import csv
import datetime as dt
from decimal import Decimal

import yaml
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import OuterRef, Subquery, Sum
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST
from rest_framework.exceptions import ValidationError

from core.gpus import exact_gpus
from core.money import shown_usd
from costs.aggregation import aggregate_window, utilization_window
from costs.budgets import budget_status
from costs.capacity import capacity_reports, with_rounding
from costs.catalog import NoPrice, Rates, rates_at
from costs.collection import refresh_running
from costs.models import ClusterMetrics, CostEntry, Report, UtilizationRollup
from costs.reports.build import generate_report
from costs.unknown import HAS_UNPRICED, unknown_cost, unpriced_hours
from jobs.cohort_trees import cohort_forest
from jobs.dependencies import DependencyRefused, edges_of
from jobs.filters import JobFilterSet
from jobs.lifecycle import NotCancellable, cancel_job, submit_job
from jobs.models import FINAL_STATES, HELD_GPU_MILLI, Job, JobAttempt, JobEvent, JobState
from jobs.permissions import CANCEL_REFUSED, may_cancel
from jobs.preview import refuse_unaffordable, stored_job_args, submission_preview
from jobs.roles import job_roles
from jobs.scheduling.core import price_text
from jobs.scheduling.offers import pool_offers
from jobs.scheduling.snapshot import cpu_used_milli
from jobs.service import serving_status
from jobs.spec import SpecError, resubmission, team_for_submission, validated_submission
from jobs.states import StaleState
from jobs.throttles import submitter_retry_after, team_retry_after
from jobs.workload import job_efficiency
from quotas import audit, changes
from quotas.audit import AuditFilterSet, reason_of, visible_records
from quotas.models import (
    AuditRecord,
    Budget,
    ChangeRequest,
    Membership,
    Quota,
    Team,
    priority_classes,
    scope_to_teams,
)
from quotas.permissions import REQUEST_REFUSED, STAFF_ONLY, may_change_entitlements, may_request_changes
from runners import health as node_health
from runners.base import ClusterUnreachable, UnknownBackend, backend_for
from runners.models import Cluster, Node

from .fleet_pages import pool_resources
from .forms import (
    BudgetForm,
    BudgetRequestForm,
    CapacityQueryForm,
    CostQueryForm,
    QuotaForm,
    QuotaRequestForm,
    ReportRequestForm,
    SubmitJobForm,
    requested_values,
)
from .readable import queue_facts, short_of_words, utilization_note
from .templatetags.job_terms import number, stored_job_asks

LIVE_STATES = [JobState.QUEUED, JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.RECOVERING,
               JobState.CANCELLING]
JOBS_PER_PAGE = 50
#: The user's own latest jobs the dashboard lists, in every state (a rejected one included).
RECENT_JOBS_SHOWN = 10


def _chart(labels: list, values: list, label: str, kind: str = "bar", *, x_title: str = "", y_title: str = "") -> dict:
    """Chart.js input (``frontend/static/frontend/app.js`` draws it): labels, one dataset, chart type, axis titles."""
    return {"type": kind, "labels": labels, "datasets": [{"label": label, "data": values}],
            "x_title": x_title, "y_title": y_title}


def daily_chart(rows: list[dict], first: dt.date, last: dt.date, label: str = "USD per day") -> dict:
    """A bar per UTC day from ``first`` to ``last`` inclusive (``YYYY-MM-DD`` labels: the date axis spans the
    whole range), each the ``cost_usd`` of that day's row in ``rows`` (from ``aggregate_costs(..., "day")``) or
    0 for a day without cost; a one-day range is one bar, not a lone point."""
    by_day = {str(r["day"]): float(r["cost_usd"] or 0) for r in rows}
    days = [first + dt.timedelta(days=n) for n in range((last - first).days + 1)]
    return _chart([d.isoformat() for d in days], [by_day.get(d.isoformat(), 0.0) for d in days], label, "bar",
                  x_title="Day (UTC)", y_title="USD")


# --- dashboard ----------------------------------------------------------------------------------

def _gpu_usage(teams) -> list[dict]:
    """Per team and accelerator with a quota: GPUs in use (live attempts), nominal and borrowing limit, and the limit
    the team can reach (``Quota.reachable_gpus``: what admission uses), GPUs; for a CPU quota the same in vCPUs (the
    CPU its live CPU-only attempts' pods request: ``jobs.scheduling.snapshot.cpu_used_milli``). ``unit``: ``GPUs``
    or ``vCPUs``."""
    in_use = {  # shares of a GPU counted exactly, as admission counts them (ADR 0040)
        (row["job__team_id"], row["node_pool__accelerator_id"]): exact_gpus(row["n"])
        for row in JobAttempt.objects.filter(ended_at__isnull=True, job__team__in=teams)
        .values("job__team_id", "node_pool__accelerator_id").annotate(n=Sum(HELD_GPU_MILLI))
    }
    quotas = list(Quota.objects.filter(team__in=teams, cluster__isnull=True).select_related("team", "accelerator"))
    cpu_milli = cpu_used_milli({q.team_id for q in quotas if q.is_cpu}) if any(q.is_cpu for q in quotas) else {}
    rows = []
    for quota in quotas:
        if quota.is_cpu:
            milli = cpu_milli.get(quota.team_id, 0)
            used = milli // 1000 if milli % 1000 == 0 else milli / 1000
            nominal, borrowing, limit, unit = (quota.nominal_vcpus, quota.borrowing_limit_vcpus,
                                               quota.reachable_vcpus(), "vCPUs")
        else:
            used = in_use.get((quota.team_id, quota.accelerator_id), 0)
            nominal, borrowing, limit, unit = (quota.nominal_gpus, quota.borrowing_limit_gpus, quota.reachable_gpus(),
                                               "GPUs")
        rows.append({"team": quota.team, "accelerator": quota.accelerator.name, "used": used, "unit": unit,
                     "nominal": nominal, "borrowing": borrowing, "limit": limit, "borrowed": max(used - nominal, 0),
                     "percent": round(used / limit * 100) if limit else 0})
    return rows


def _budget_rows(teams) -> list[dict]:
    """Budget status (spent, committed, remaining, forecast, USD) of every budget of ``teams`` in force now."""
    rows = []
    for budget in Budget.objects.filter(team__in=teams).select_related("team"):
        status = budget_status(budget)
        if status is not None:
            rows.append({"budget": budget, "status": status, "percent": min(round(status.spent_percent), 100),
                         "unknown": unknown_cost(team=budget.team_id),
                         "spent_usd": shown_usd(status.spent_usd,
                                                status.unpriced_gpu_hours + status.unpriced_vcpu_hours)})
    return rows


def _cpu_only_vcpu_hours(user, since: dt.datetime) -> Decimal:
    """The vCPU-hours of CPU-only work (ledger rows with no GPUs) billed to ``user``'s teams since ``since`` (aware
    UTC): to 0.01 vCPU-hour, below 0.1 to 0.0001 (seconds of one vCPU are not 0); what a cost without GPU-hours
    paid for."""
    rows = scope_to_teams(CostEntry.objects.filter(interval_start__gte=since, gpu_milli=0, cpu_milli__gt=0), user)
    milli_seconds = sum(milli * (end - start).total_seconds()
                        for milli, start, end in rows.values_list("cpu_milli", "interval_start", "interval_end"))
    hours = Decimal(milli_seconds) / 1000 / 3600
    return hours.quantize(Decimal("0.01") if hours >= Decimal("0.1") else Decimal("0.0001"))


def _pool_size(pool, resources: dict | None) -> tuple[str, str]:
    """A node pool's size and capacity as its row shows them: ``("2 × 8 GPUs", "16 GPUs")``, or for a CPU pool
    (no GPUs) its nodes × vCPU per node, ``("2 × 4 vCPU", "8 vCPU")``, from its synced nodes (``resources``, a
    ``pool_resources`` row: ``nodes``, ``vcpu``; None: not synced yet, its node count alone)."""
    if pool.gpus_per_node:
        return f"{pool.nodes} × {pool.gpus_per_node} GPUs", f"{pool.capacity_gpus} GPUs"
    if not resources or not resources["nodes"]:
        return f"{pool.nodes} node{'' if pool.nodes == 1 else 's'}", "not synced"
    per_node = number(Decimal(resources["vcpu"]) / resources["nodes"])
    return f"{resources['nodes']} × {per_node} vCPU", f"{number(resources['vcpu'])} vCPU"


@login_required
def dashboard(request):
    """My teams, running and queued jobs, my recent jobs in every state, GPUs in use against quota, budgets and the
    last 30 days of cost."""
    user = request.user
    teams = Team.objects.visible_to(user)
    jobs = (Job.objects.visible_to(user).filter(state__in=LIVE_STATES)
            .select_related("team", "accelerator", "current_attempt__cluster").order_by("-priority", "created_at"))
    today = timezone.now().astimezone(dt.timezone.utc).date()
    first = today - dt.timedelta(days=29)
    since = dt.datetime.combine(first, dt.time(), tzinfo=dt.timezone.utc)
    by_day, total = aggregate_window("day", since, None, scope=lambda qs: scope_to_teams(qs, user))
    live = list(jobs[:200])
    context = {
        "teams": teams,
        "running": [j for j in live if j.state != JobState.QUEUED],
        "queued": [j for j in live if j.state == JobState.QUEUED],
        "recent": list(Job.objects.filter(submitter=user).select_related("team", "accelerator")[:RECENT_JOBS_SHOWN]),
        "recent_shown": RECENT_JOBS_SHOWN,
        "gpu_usage": _gpu_usage(teams),
        "budgets": _budget_rows(teams),
        "cost_total": total,
        "cost_vcpu_hours": _cpu_only_vcpu_hours(user, since) if total else Decimal(0),
        "cost_chart": daily_chart(by_day, first, today) if by_day else _chart([], [], "USD per day"),
    }
    return render(request, "frontend/dashboard.html", context)


# --- jobs -----------------------------------------------------------------------------------------

def _filtered_jobs(request):
    """``(filterset, page)`` of the user's jobs through ``jobs.filters.JobFilterSet`` (the API's); invalid filters give
    no rows. Each job of the page carries ``shown_cost`` (its accrued USD as the API shows it: None, unknown, when
    none of it is priced) and ``run_seconds`` (from its start to its end, or to now while it runs; None before it
    started)."""
    queryset = Job.objects.visible_to(request.user).select_related(
        "team", "submitter", "accelerator", "current_attempt__cluster").annotate(has_unpriced_cost=HAS_UNPRICED)
    filterset = JobFilterSet(request.GET or None, queryset=queryset)
    jobs = filterset.qs if filterset.is_bound and filterset.is_valid() else (queryset if not filterset.is_bound
                                                                               else queryset.none())
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    now = timezone.now()
    for job in page:
        job.shown_cost = shown_usd(job.accrued_cost_usd, 1 if job.has_unpriced_cost else 0)
        job.run_seconds = None if job.started_at is None else ((job.ended_at or now) - job.started_at).total_seconds()
    return filterset, page


#: The job list's order (its ``ordering`` filter) in words, for the table's caption; unknown or none: the default.
JOB_ORDER_WORDS = {"created_at": "oldest first", "-created_at": "newest first", "priority": "lowest priority first",
                   "-priority": "highest priority first"}


@login_required
def job_list(request):
    """Jobs filtered by team, state, kind, accelerator, cluster, submitter and dates; rows refresh by htmx polling."""
    filterset, page = _filtered_jobs(request)
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "frontend/job_list.html", {"filterset": filterset, "page": page,
                                                      "order_words": JOB_ORDER_WORDS.get(request.GET.get("ordering", ""),
                                                                                         "newest first"),
                                                      "query": query.urlencode(),
                                                      "poll_seconds": settings.UI_POLL_SECONDS})


@login_required
def job_rows(request):
    """The job list's table body alone (the htmx polling target)."""
    _, page = _filtered_jobs(request)
    return render(request, "frontend/partials/job_rows.html", {"page": page})


def _visible_job(request, pk: int) -> Job:
    """The job ``pk`` if ``request.user`` may see it (else 404), with ``last_event_id``: its newest event's id read in
    the same statement, so its page shows the timeline up to the state it shows (one snapshot, never a state and a
    newer timeline)."""
    last_event = JobEvent.objects.filter(job=OuterRef("pk")).order_by("-id").values("id")[:1]
    return get_object_or_404(Job.objects.visible_to(request.user).select_related(
        "team", "submitter", "accelerator", "current_attempt__cluster", "current_attempt__node_pool")
        .annotate(last_event_id=Subquery(last_event)), pk=pk)


def job_estimate(job: Job) -> dict:
    """The estimated cost (USD) a job page shows, worded as the submission preview words it.

    Once placed: the stored estimate (GPUs x max runtime x the placed pool's price), ``{"usd", "pool": None,
    "placed": True}``. Before: the preview's (``jobs.preview.submission_preview``, what the API's answer for the
    job and ``cpctl job`` show: the pool the scheduler would pick now, over the job's alternatives too, and its
    price), ``{"usd", "pool": <offer or None>, "placed": False, "unplaced",
    "unknown_why"}`` (``estimate_caveats``); ``usd`` is None when no pool with a price could hold it. ``asks``:
    what the worst case counts (``job_asks``: GPUs, or vCPUs and GiB).
    """
    asks = stored_job_asks(job)
    if job.admitted_at or job.current_attempt_id or job.estimated_cost_usd:
        return {"usd": job.estimated_cost_usd, "pool": None, "placed": True, "asks": asks}
    # The API's answer for this job and ``cpctl job`` read the same preview (``jobs.preview``): one figure.
    preview = submission_preview(stored_job_args(job))
    assessment = preview["assessment"]
    return {"usd": preview["estimate_usd"], "pool": assessment.offer or assessment.estimate_offer, "placed": False,
            "asks": asks, **estimate_caveats(assessment, preview["accelerator"])}


def estimate_caveats(assessment, accelerator: str) -> dict:
    """Why an estimate is not at a pool that could take the job now (``jobs.scheduling.core.Assessment``):
    ``unplaced``, a sentence when no pool can hold it as the fleet is now (a cordoned or unhealthy node, an
    unhealthy cluster: the estimate is then at the price of the pool it would run on once they are back), and
    ``unknown_why`` when there is no estimate: no priced pool offers the accelerator, or none its rules allow
    could ever hold it. Both "" when they do not apply."""
    verdict = assessment.unplaced
    detail = verdict.detail if verdict is not None else {}
    unplaced = (f"no node pool can hold it as the fleet is now; it waits for {short_of_words(detail)}"
                if verdict is not None and detail.get("short_of") != "price" else "")
    unknown = ""
    if assessment.estimate_usd is None:
        unknown = (f"no node pool with a price offers {accelerator}" if verdict is None or
                   detail.get("short_of") == "price" else
                   f"no node pool its placement rules allow could hold it: {verdict.message}")
    return {"unplaced": unplaced, "unknown_why": unknown}


def _attempt_rates(attempt: JobAttempt):
    """The prices an attempt is charged at (``costs.catalog.Rates``: USD per GPU-hour, per vCPU-hour and per
    GiB-hour), from the catalog at its start (its admission when it has not started); for a GPU attempt the price
    stored at admission. None: no price in force."""
    if attempt.gpus:
        return Rates(attempt.usd_per_gpu_hour)
    try:
        return rates_at(attempt.node_pool, attempt.started_at or attempt.created_at)
    except NoPrice:
        return None


def _events_up_to(job: Job):
    """``job``'s timeline, oldest first, up to the event that brought it to the state it was read in: events are
    written with the state change in one transaction and a job's changes are compare-and-set on its row, so its
    events commit in id order and those up to ``last_event_id`` (``_visible_job``) are the ones the read state has."""
    events = job.events.select_related("actor", "attempt").order_by("created_at", "id")
    last = getattr(job, "last_event_id", None)
    return events.filter(id__lte=last) if last is not None else events


def _job_status_context(job: Job, user) -> dict:
    """What the live part of a job page shows: state, why it waits, the jobs it runs after (``after``, with
    whether each condition holds), timeline, attempts, cost (USD: so far while the job lives, final once it
    ended), and the cancel link while ``user`` may still cancel."""
    ledger = job.cost_entries.aggregate(s=Sum("amount_usd"))["s"] or Decimal(0)
    gpu_unpriced, vcpu_unpriced = unpriced_hours(job=job)
    queue_info = job.queue_info if job.state in (JobState.QUEUED, JobState.RECOVERING) else {}
    attempts = list(job.attempts.select_related("cluster", "node_pool").order_by("number"))
    for attempt in attempts:
        attempt.rates = _attempt_rates(attempt)  # its price column: per GPU-hour, or per vCPU-hour and GiB-hour
    return {
        "job": job,
        "live": job.state not in FINAL_STATES,
        "may_cancel": job.state not in FINAL_STATES and may_cancel(user, job),
        "events": _events_up_to(job),
        "attempts": attempts,
        "cost": {"usd": shown_usd(max(ledger, job.accrued_cost_usd), gpu_unpriced + vcpu_unpriced),
                 "unpriced_gpu_hours": gpu_unpriced, "unpriced_vcpu_hours": vcpu_unpriced},
        "cost_unknown": unknown_cost(job=job),
        "final": job.state in FINAL_STATES,
        "queue_info": queue_info,
        "queue_facts": queue_facts(queue_info),
        "waits_for": short_of_words(queue_info) if queue_info else "",
        "after": edges_of(job),
        "serving": serving_status(job),
        "poll_seconds": settings.UI_POLL_SECONDS,
    }


@login_required
def job_detail(request, pk: int):
    """A job: spec, live status (timeline, attempts, queue position, cost), log tail, GPU-utilization chart and
    training efficiency (throughput, MFU, USD per million tokens, a throughput chart by step)."""
    job = _visible_job(request, pk)
    refresh_running(job.attempts.filter(ended_at__isnull=True, started_at__isnull=False)
                    .select_related("job__team", "node_pool", "cluster"))  # a running job: live, briefly cached
    rollups = list(UtilizationRollup.objects.filter(job=job).order_by("day", "attempt_id")
                   .values("day", "attempt__number", "avg_gpu_util_percent"))
    usage, _ = utilization_window(UtilizationRollup.objects.filter(job=job), "attempt", None, None, job_id=job.pk)
    context = _job_status_context(job, request.user)
    context.update(
        usage=usage,
        estimate=job_estimate(job),
        spec_yaml=yaml.safe_dump(job.spec, sort_keys=False, default_flow_style=False),
        utilization_chart=_chart([f"{r['day']} #{r['attempt__number']}" for r in rollups],
                                 [r["avg_gpu_util_percent"] for r in rollups], "Average GPU utilization (%)"),
        has_utilization=any(r["avg_gpu_util_percent"] is not None for r in rollups),
        # shown whenever collected (emulated GPUs too, as the API answers it); else the true reason
        utilization=utilization_note(job, usage, any(r["avg_gpu_util_percent"] is not None for r in rollups)),
        may_resubmit=_may_submit_for(request.user, job.team.slug),
    )
    efficiency = job_efficiency(job, series=True)
    series = next((a["series"] for a in reversed(efficiency["attempts"]) if a["series"]), [])
    # A training job's section; a CPU-only one (data preparation) gets it only once its workload reported throughput.
    reported = any(a["tokens_per_s"] is not None or a.get("series") for a in efficiency["attempts"])
    context.update(roles=job_roles(job), efficiency=efficiency,
                   show_efficiency=job.kind == "training" and (job.gpus_per_node or reported),
                   throughput_chart=_chart(
        [point[1] for point in series], [point[2] for point in series], "Training throughput (tokens/s)", "line"))
    return render(request, "frontend/job_detail.html", context)


@login_required
def job_status(request, pk: int):
    """The live part of a job page (polled while the job is not final)."""
    return render(request, "frontend/partials/job_status.html", _job_status_context(_visible_job(request, pk), request.user))


def _log_node(request, job: Job) -> int:
    """The node whose log to show: ``?node=N`` (0-based) when the job has that node, else 0."""
    try:
        node = int(request.GET.get("node", "0"))
    except ValueError:
        return 0
    return node if 0 <= node < job.pods else 0


@login_required
def job_logs(request, pk: int):
    """The tail of one node's log of the current attempt (``?node=N``, default 0; polled while the job is not
    final), with a picker of the job's nodes."""
    job = _visible_job(request, pk)
    node = _log_node(request, job)
    attempt, text, error = job.current_attempt, "", ""
    if attempt is not None:
        try:
            text = backend_for(attempt.cluster).logs(attempt, node, settings.UI_LOG_TAIL_LINES)
        except (ClusterUnreachable, UnknownBackend) as exc:
            error = f"cluster {attempt.cluster.name} is unreachable: {exc}"
    return render(request, "frontend/partials/job_logs.html", {
        "job": job, "attempt": attempt, "text": text, "error": error, "node": node, "nodes": range(job.pods),
        "live": job.state not in FINAL_STATES, "poll_seconds": settings.UI_POLL_SECONDS})


@login_required
@require_http_methods(["GET", "POST"])
def job_cancel(request, pk: int):
    """GET: a confirmation page; POST: cancel the job (submitter, team admins and staff; 403 for others)."""
    job = _visible_job(request, pk)
    if not may_cancel(request.user, job):
        raise PermissionDenied(CANCEL_REFUSED)
    if request.method == "POST":
        try:
            cancel_job(job, actor=request.user)
            messages.success(request, f"Cancellation of job {job.pk} requested.")
        except (NotCancellable, StaleState) as exc:
            messages.error(request, f"Job {job.pk} could not be cancelled: {exc}")
        return redirect("frontend:job-detail", pk=job.pk)
    return render(request, "frontend/job_cancel.html", {"job": job})


# --- submit ------------------------------------------------------------------------------------------

def _submit_teams(user):
    """Teams where ``user`` may submit (admin or member; every team for staff)."""
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user,
                               memberships__role__in=[Membership.Role.ADMIN, Membership.Role.MEMBER])


def _submit_form(request, data=None, initial=None) -> SubmitJobForm:
    return SubmitJobForm(data, initial=initial, teams=_submit_teams(request.user), priorities=list(priority_classes()))


def _may_submit_for(user, slug: str) -> bool:
    """Whether ``user`` may submit jobs for team ``slug`` (its admin or member, or staff)."""
    try:
        team_for_submission(user, slug)
    except SpecError:
        return False
    return True


def _resubmission_initial(request) -> dict | None:
    """The submit form's initial values for ``?from=<job id>``: the job's team and its whole submission as YAML
    (``jobs.spec.resubmission``), to edit and submit as a new job; None without ``from``. Http404 for a job the
    user cannot see or an id that is not a number."""
    ref = request.GET.get("from")
    if ref is None:
        return None
    if not ref.isdigit():
        raise Http404(f"no job {ref!r}")
    job = _visible_job(request, int(ref))
    return {"team": job.team.slug,
            "spec_yaml": yaml.safe_dump(resubmission(job), sort_keys=False, default_flow_style=False)}


def _validate_submission(request, form: SubmitJobForm) -> dict | None:
    """``submit_job``'s keyword arguments for the form's submission, validated as the API validates it
    (``jobs.spec.validated_submission``); None, with the errors on the form, when it is refused."""
    if not form.is_valid():
        return None
    submission = form.submission()
    if submission is None:
        return None
    try:
        return validated_submission(submission, request.user)
    except ValidationError as exc:
        form.add_serializer_errors(exc.detail)
        return None


def form_preview(args: dict) -> dict:
    """The submit form's preview of ``args`` (``submit_job``'s keyword arguments): ``jobs.preview.submission_preview``
    with what the form words from it: ``unplaced`` (``estimate_caveats``: why no pool can hold it as the fleet is now, or "")
    and ``waits_for`` (what it would wait for while no pool has room now, ``short_of_words``, or "")."""
    preview = submission_preview(args)
    preview["unplaced"] = estimate_caveats(preview["assessment"], preview["accelerator"])["unplaced"]
    preview["waits_for"] = short_of_words(preview["capacity"].detail) if preview["capacity"] else ""
    return preview


@login_required
@require_http_methods(["GET", "POST"])
def job_submit(request):
    """The submission form; POST validates as the API does, stores the job and opens its page."""
    if request.method == "POST":
        form = _submit_form(request, request.POST)
        if (wait := submitter_retry_after(request.user)) is not None:
            return _submission_throttled(request, form, wait, "you sent")
        args = _validate_submission(request, form)
        if args is not None:
            if (wait := team_retry_after(args["team"])) is not None:
                return _submission_throttled(request, form, wait, f"team {args['team'].slug} received")
            args = _affordable(form, args)
        if args is not None:
            try:
                job = submit_job(**args)
            except DependencyRefused as exc:  # an upstream ended meanwhile: refused as at validation, on its field
                form.add_serializer_errors({exc.path: [str(exc)]})
            else:
                messages.success(request, f"Job {job.pk} ({job.name}) submitted.")
                return redirect("frontend:job-detail", pk=job.pk)
    else:
        form = _submit_form(request, initial=_resubmission_initial(request))
    return render(request, "frontend/job_submit.html", {"form": form, "resubmitting": request.GET.get("from")})


def _affordable(form: SubmitJobForm, args: dict) -> dict | None:
    """``args`` when the job's budget can cover it; None, with the refusal on the form, when it never can
    (``jobs.preview.refuse_unaffordable``, ADR 0036: refused at submission like a job over its quota)."""
    try:
        refuse_unaffordable(submission_preview(args))
    except ValidationError as exc:
        form.add_serializer_errors(exc.detail)
        return None
    return args


def _submission_throttled(request, form: SubmitJobForm, wait: int, who: str) -> HttpResponse:
    """The form again, answered 429 with ``Retry-After: wait`` (seconds) and the reason above the fields (the
    submission rates of ``jobs.throttles``); the form keeps what was typed."""
    form.is_valid()
    form.add_error(None, f"Too many submissions: {who} more than the rate allows. Try again in {wait} s.")
    response = render(request, "frontend/job_submit.html", {"form": form}, status=429)
    response["Retry-After"] = str(wait)
    return response


@login_required
@require_POST
def job_preview(request):
    """The submission preview partial (htmx): field errors, or placement, estimated cost, quota and budget."""
    form = _submit_form(request, request.POST)
    args = _validate_submission(request, form)
    preview = form_preview(args) if args is not None else None
    return render(request, "frontend/partials/job_preview.html", {"form": form, "preview": preview})


# --- teams: quotas and budgets --------------------------------------------------------------------------

def _visible_team(request, slug: str) -> Team:
    return get_object_or_404(Team.objects.visible_to(request.user), slug=slug)


@login_required
def team_list(request):
    """The user's teams (every team for staff), each linking to its quotas and budgets."""
    return render(request, "frontend/team_list.html", {"teams": Team.objects.visible_to(request.user)})


@login_required
def cohort_tree(request):
    """Every tree of cohorts (organisation > department > team, ADR 0046): per level and accelerator its own nominal
    quota, the nominal inside its subtree, its borrowing and lending limits and the GPUs its subtree holds; a
    team's usage and room now only for its members and staff (``jobs.cohort_trees.cohort_forest``). Staff change
    the tree in the admin or the API."""
    return render(request, "frontend/cohort_tree.html", {"trees": cohort_forest(request.user)})


#: The team's latest audit records on its page; the audit page has them all.
TEAM_CHANGES_SHOWN = 20
AUDIT_PER_PAGE = 50


@login_required
def team_detail(request, slug: str):
    """A team's quotas (with GPUs in use) and budgets (with spent, committed, forecast), edit links for staff,
    request links for the team's admins (ADR 0029), and its latest audited changes (ADR 0031)."""
    team = _visible_team(request, slug)
    teams = Team.objects.filter(pk=team.pk)
    members = team.memberships.select_related("user").order_by("role", "user__username")
    budgets = _budget_rows(teams)
    return render(request, "frontend/team_detail.html", {
        "team": team, "gpu_usage": _gpu_usage(teams), "budgets": budgets,
        "quotas": team.quotas.select_related("accelerator", "cluster"),
        "members": members, "may_edit": may_change_entitlements(request.user),
        "may_request": not request.user.is_staff and may_request_changes(request.user, team.pk),
        "other_budgets": team.budgets.exclude(pk__in=[r["budget"].pk for r in budgets]),
        "changes": visible_records(request.user).filter(team=team)[:TEAM_CHANGES_SHOWN],
    })


def _require_staff(request) -> None:
    """403 unless the user may change quotas and budgets (staff); called once the object is known visible, so
    another team's object stays a 404."""
    if not may_change_entitlements(request.user):
        raise PermissionDenied(STAFF_ONLY)


def _request_instead(request, slug: str, name: str, model=None, pk: int | None = None):
    """For a team admin who is not staff, GET of an edit page of the team's ``model`` row ``pk`` (None: a new
    one): a redirect to the request form of the same object (the edit form is staff's; ADR 0029); 404 when the
    team or the row is not visible. None otherwise (the edit view refuses or serves it)."""
    if request.method == "GET" and not request.user.is_staff:
        team = _visible_team(request, slug)
        if may_request_changes(request.user, team.pk):
            if pk is None:
                return redirect(name, slug=team.slug)
            get_object_or_404(model, team=team, pk=pk)
            return redirect(name, slug=team.slug, pk=pk)
    return None


@login_required
@require_http_methods(["GET", "POST"])
def quota_edit(request, slug: str, pk: int):
    """Edit one quota of the team (staff only); the change is audited with the form's reason. A team admin's GET goes to
    the request form; any other user's write is a 403 and changes nothing."""
    instead = _request_instead(request, slug, "frontend:quota-request", Quota, pk)
    if instead is not None:
        return instead
    team = _visible_team(request, slug)
    quota = get_object_or_404(Quota.objects.select_related("accelerator"), team=team, pk=pk)
    _require_staff(request)
    before = audit.snapshot(quota)
    form = QuotaForm(request.POST or None, instance=quota)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            form.save()
            audit.record(request.user, "updated", quota, before, audit.snapshot(quota), form.cleaned_data["reason"])
        messages.success(request, f"Quota {quota.accelerator.name} saved.")
        return redirect("frontend:team-detail", slug=team.slug)
    return render(request, "frontend/edit_form.html", {"team": team, "form": form,
                                                       "title": f"Quota {quota.accelerator.name} of {team.slug}"})


@login_required
@require_http_methods(["GET", "POST"])
def budget_edit(request, slug: str, pk: int | None = None):
    """Create (no ``pk``) or edit a budget of the team (staff only), audited with the form's reason. A team
    admin's GET goes to the request form; any other user's write is a 403 and changes nothing."""
    instead = _request_instead(request, slug, "frontend:budget-request", Budget, pk)
    if instead is not None:
        return instead
    team = _visible_team(request, slug)
    budget = get_object_or_404(Budget, team=team, pk=pk) if pk is not None else Budget(team=team)
    _require_staff(request)
    before = audit.snapshot(budget) if pk is not None else {}
    form = BudgetForm(request.POST or None, instance=budget)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            form.save()
            audit.record(request.user, "updated" if pk is not None else "created", budget, before,
                         audit.snapshot(budget), form.cleaned_data["reason"])
        messages.success(request, "Budget saved.")
        return redirect("frontend:team-detail", slug=team.slug)
    title = f"Budget of {team.slug}" if pk is not None else f"New budget for {team.slug}"
    return render(request, "frontend/edit_form.html", {"team": team, "form": form, "title": title})


# --- change requests (ADR 0029) ----------------------------------------------------------------------------

def _requesting_team(request, slug: str) -> Team:
    """The team if visible (else 404) and the user may request its changes (else 403)."""
    team = _visible_team(request, slug)
    if not may_request_changes(request.user, team.pk):
        raise PermissionDenied(REQUEST_REFUSED)
    return team


def _send_request(request, form, team, kind: str, target, before: dict):
    """Store the request of a valid ``form`` (``quotas.changes.request_change``) and go to the requests page; on
    a refusal, put its reasons beside the form's fields and return None."""
    payload = requested_values(form, before)
    if target is not None and not payload:
        form.add_error(None, f"change at least one value of the {kind}")
        return None
    try:
        change = changes.request_change(user=request.user, team=team, kind=kind,
                                        target_id=target.pk if target is not None else None, payload=payload,
                                        reason=form.cleaned_data["reason"])
    except ValidationError as exc:
        for field, reasons in exc.detail.items():
            reasons = reasons.items() if isinstance(reasons, dict) else [(field, reasons)]
            for name, messages_ in reasons:
                for message in messages_ if isinstance(messages_, list) else [messages_]:
                    form.add_error(name if name in form.fields else None, f"{name}: {message}")
        return None
    messages.success(request, f"Request {change.pk} sent: platform staff decide, and you are mailed the decision.")
    return redirect("frontend:request-list")


def _request_page(request, form, team, title: str):
    return render(request, "frontend/edit_form.html", {
        "team": team, "form": form, "title": title, "submit_label": "Send the request",
        "note": "Quotas and budgets are set by platform staff. Say what the team needs and why; staff approve or "
                "decline the request and you are mailed their decision."})


@login_required
@require_http_methods(["GET", "POST"])
def quota_request(request, slug: str, pk: int):
    """Request new numbers for one quota of the team (its admins): the quota's form and a reason (ADR 0029)."""
    team = _requesting_team(request, slug)
    quota = get_object_or_404(Quota.objects.select_related("accelerator"), team=team, pk=pk)
    form = QuotaRequestForm(request.POST or None, instance=quota)
    before = {name: getattr(quota, name) for name in form.fields if name != "reason"}
    if request.method == "POST" and form.is_valid():
        sent = _send_request(request, form, team, ChangeRequest.Kind.QUOTA, quota, before)
        if sent is not None:
            return sent
    return _request_page(request, form, team, f"Request a change of quota {quota.accelerator.name} of {team.slug}")


@login_required
@require_http_methods(["GET", "POST"])
def budget_request(request, slug: str, pk: int | None = None):
    """Request a change of one budget of the team, or a new one (no ``pk``), by its admins (ADR 0029)."""
    team = _requesting_team(request, slug)
    budget = get_object_or_404(Budget, team=team, pk=pk) if pk is not None else Budget(team=team)
    before = {name: getattr(budget, name) for name in BudgetRequestForm.Meta.fields} if pk is not None else {}
    form = BudgetRequestForm(request.POST or None, instance=budget)
    if request.method == "POST" and form.is_valid():
        sent = _send_request(request, form, team, ChangeRequest.Kind.BUDGET, budget if pk is not None else None,
                             before)
        if sent is not None:
            return sent
    title = f"Request a change of the budget of {team.slug}" if pk is not None else f"Request a budget for {team.slug}"
    return _request_page(request, form, team, title)


@login_required
def request_list(request):
    """Change requests: staff see every team's, pending first, with approve and decline; members see their teams'
    and withdraw their own pending ones."""
    visible = scope_to_teams(ChangeRequest.objects.select_related("team", "requested_by", "decided_by"),
                             request.user).distinct()
    pending = list(visible.filter(state=ChangeRequest.State.PENDING).order_by("created_at", "id"))
    decided = list(visible.exclude(state=ChangeRequest.State.PENDING)[:50])
    return render(request, "frontend/request_list.html", {"pending": pending, "decided": decided})


#: The actions on a change request from the requests page: who may take them is checked in ``request_action``.
REQUEST_ACTIONS = {"approve", "decline", "withdraw"}


@login_required
@require_POST
def request_action(request, pk: int, action: str):
    """Approve or decline (staff; a decline needs a note) or withdraw (the requester) a change request; back to the
    requests page with what happened. Another team's request is a 404; a request no longer pending, or whose
    quota or budget changed since, is refused with the reason and nothing changes."""
    change = get_object_or_404(scope_to_teams(ChangeRequest.objects.all(), request.user).distinct(), pk=pk)
    if action not in REQUEST_ACTIONS:
        raise PermissionDenied(f"unknown action {action!r}")
    if action in ("approve", "decline") and not request.user.is_staff:
        raise PermissionDenied("only platform staff approve or decline change requests")
    if action == "withdraw" and change.requested_by_id != request.user.pk:
        raise PermissionDenied("only the requester withdraws a change request")
    note = request.POST.get("note", "")
    try:
        if action == "approve":
            changes.approve(change.pk, request.user, note.strip())
        elif action == "decline":
            changes.decline(change.pk, request.user, note)
        else:
            changes.withdraw(change.pk, request.user)
    except changes.ChangeConflict as exc:
        messages.error(request, f"Request {change.pk} not {action}d: {exc.detail if isinstance(exc.detail, str) else exc}.")
    except ValidationError as exc:
        messages.error(request, f"Request {change.pk} not {action}d: "
                                + "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in exc.detail.items()) + ".")
    else:
        messages.success(request, f"Request {change.pk} {action}d.")
    return redirect("frontend:request-list")


# --- the audit trail (ADR 0031) ------------------------------------------------------------------------------

@login_required
def audit_list(request):
    """The audit trail, newest first, filtered by ``quotas.audit.AuditFilterSet`` (the API's): every record for
    staff, the records of their own teams for anyone else; invalid filters give no rows."""
    records = visible_records(request.user, AuditRecord.objects.select_related("team"))
    filterset = AuditFilterSet(request.GET or None, queryset=records)
    if filterset.is_bound:
        records = filterset.qs if filterset.is_valid() else records.none()
    page = Paginator(records, AUDIT_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "frontend/audit_list.html", {"filterset": filterset, "page": page,
                                                        "query": query.urlencode()})


# --- clusters ---------------------------------------------------------------------------------------------

#: Health changes shown per cluster on the clusters page, newest first.
CLUSTER_EVENTS_SHOWN = 5


@login_required
def cluster_list(request):
    """Every cluster: health (why it is not healthy, since when, its last health changes), last contact, emulated
    flag, its GPU and CPU nodes counted apart, per node pool capacity, free GPUs, vCPU and memory (GiB) with what
    is free of them, and price now, and its nodes that do not take work or are suspect
    (health with its evidence, cordons; staff cordon and clear them)."""
    now = timezone.now()
    clusters = list(Cluster.objects.prefetch_related("node_pools__accelerator"))
    counted: dict[int, list[int]] = {}
    flagged: dict[int, list] = {}
    all_nodes = list(Node.objects.select_related("node_pool").order_by("cluster_id", "name"))
    for node in all_nodes:
        counted.setdefault(node.cluster_id, [0, 0])[0 if node.gpus else 1] += 1
        if node.health != Node.Health.HEALTHY or node.cordoned or not node.schedulable:
            flagged.setdefault(node.cluster_id, []).append(node)
    resources = pool_resources(all_nodes)
    shapes = {m.cluster_id: m for m in ClusterMetrics.objects.filter(cluster__in=clusters)}
    accelerator_ids = {p.accelerator_id for c in clusters for p in c.node_pools.all()}
    offers = {o.node_pool_id: o for acc in accelerator_ids for o in pool_offers(acc, now, lock=False)}
    rows = []
    for cluster in clusters:
        pools = []
        for pool in cluster.node_pools.all():
            offer = offers.get(pool.pk)
            size, capacity = _pool_size(pool, resources.get(pool.pk))
            pools.append({"pool": pool, "capacity": capacity, "size": size, "cpu_only": not pool.gpus_per_node,
                          "free": offer.free_gpus if offer else None,
                          "price": offer.usd_per_gpu_hour if offer else None,
                          "cpu_price": price_text(offer) if offer and offer.usd_per_vcpu_hour is not None else None,
                          "resources": resources.get(pool.pk)})
        gpu_nodes, cpu_nodes = counted.get(cluster.pk, (0, 0))
        rows.append({"cluster": cluster, "pools": pools, "dcgm": shapes.get(cluster.pk), "gpu_nodes": gpu_nodes,
                     "cpu_nodes": cpu_nodes, "nodes": gpu_nodes + cpu_nodes, "flagged": flagged.get(cluster.pk, []),
                     "events": list(cluster.events.all()[:CLUSTER_EVENTS_SHOWN])})
    return render(request, "frontend/cluster_list.html", {"rows": rows})


@login_required
def capacity(request):
    """The fleet's capacity, cordoned, allocated and unallocated GPU-hours and their cost over UTC days, grouped by
    cluster, node pool, node, accelerator, day or team (each team's allocation and its share of the idle), with a
    chart of capacity against allocation per day (``costs.capacity``)."""
    form = CapacityQueryForm(request.GET or {})
    rows, total, chart, group_by, unpriced = [], None, None, "cluster", False
    if form.is_valid():
        group_by = form.cleaned_data["group_by"]
        start, end = form.window()
        form.data = form.data.copy()
        for name in ("start", "end"):
            form.data[name] = form.data.get(name) or form.cleaned_data[name].isoformat()
        team_ids = None if request.user.is_staff else set(Team.objects.visible_to(request.user).values_list(
            "pk", flat=True))
        reports = capacity_reports(dict.fromkeys((group_by, "day")), start, end, team_ids=team_ids)
        (rows, total), (days, _) = reports[group_by], reports["day"]
        unpriced = total["unpriced_unallocated_gpu_hours"] > 0
        rows, total = with_rounding(rows, total)  # USD to cents as everywhere, the rounding difference stated
        chart = {"type": "bar", "labels": [r["day"] for r in days], "x_title": "Day (UTC)", "y_title": "GPU-hours",
                 "datasets": [{"label": "Allocated", "data": [float(r["allocated_gpu_hours"]) for r in days]},
                              {"label": "Unallocated", "data": [float(r["unallocated_gpu_hours"]) for r in days]}]}
    return render(request, "frontend/capacity.html", {"form": form, "rows": rows, "total": total, "chart": chart,
                                                      "group_by": group_by, "unpriced": unpriced})


#: The staff actions on a node from the clusters and nodes pages, by name.
NODE_ACTIONS = {"cordon": lambda node, user, reason: node_health.cordon(node, user, reason or "from the clusters page"),
                "uncordon": lambda node, user, reason: node_health.uncordon(node, user, reason),
                "drain": lambda node, user, reason: node_health.drain(node, user, reason or "drained from the UI"),
                "clear": lambda node, user, reason: node_health.clear(node, user=user, reason=reason)}


@login_required
@require_POST
def node_action(request, pk: int, action: str):
    """Cordon, uncordon, drain (cordon and move its running work elsewhere) or clear the health of a node (staff
    only: 403 for others); back to the page in ``next`` (a path of this site), else the clusters page."""
    if not request.user.is_staff:
        raise PermissionDenied("only platform staff cordon, uncordon, drain or clear nodes")
    if action not in NODE_ACTIONS:
        raise PermissionDenied(f"unknown node action {action!r}")
    node = get_object_or_404(Node.objects.select_related("cluster"), pk=pk)
    back = request.POST.get("next", "")
    NODE_ACTIONS[action](node, request.user,
                         reason_of(request) or ("from the nodes page" if back.startswith("/nodes/") else ""))
    messages.success(request, f"Node {node}: {action} done.")
    if back and url_has_allowed_host_and_scheme(back, allowed_hosts=None) and back.startswith("/"):
        return redirect(back)
    return redirect("frontend:cluster-list")


# --- costs ----------------------------------------------------------------------------------------------

def _cost_query(request):
    """``(form, rows, total)`` of the costs page's query over the user's ledger (rows empty when the form is invalid)."""
    teams = Team.objects.visible_to(request.user)
    form = CostQueryForm(request.GET or {}, teams=teams)
    if not form.is_valid():
        return form, [], None
    start, end = form.window()
    # Show the days the page covers in the inputs, also when they were left empty (the last 30 days).
    form.data = form.data.copy()
    for name in ("start", "end"):
        form.data[name] = form.data.get(name) or form.cleaned_data[name].isoformat()
    rows, total = aggregate_window(form.cleaned_data["group_by"], start, end,  # the API's figures, to the cent
                                   scope=lambda qs: scope_to_teams(qs, request.user),
                                   team_slug=form.cleaned_data.get("team") or None)
    return form, rows, total


def _row_label(row: dict, group_by: str) -> str:
    if group_by == "job":
        return f"{row['job']} {row['job_name']}"
    return str(row[group_by])


@login_required
def costs(request):
    """GPU-hours and USD by team, cluster, accelerator, job or day over a date range, as a table and a chart."""
    form, rows, total = _cost_query(request)
    group_by = form.cleaned_data.get("group_by", "day") if form.is_valid() else "day"
    if group_by == "day" and form.is_valid():
        chart = daily_chart(rows, form.cleaned_data["start"], form.cleaned_data["end"])
    else:
        chart = _chart([_row_label(r, group_by) for r in rows], [float(r["cost_usd"] or 0) for r in rows], "USD", "bar",
                       x_title=group_by.capitalize(), y_title="USD")
    return render(request, "frontend/costs.html", {"form": form, "rows": rows, "total": total, "group_by": group_by,
                                                   "chart": chart, "query": request.GET.urlencode()})


@login_required
def costs_csv(request):
    """The costs page's rows as CSV: group key(s), GPU-hours, USD."""
    form, rows, total = _cost_query(request)
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="costs.csv"'
    writer = csv.writer(response)
    if not form.is_valid():
        writer.writerow(["error"])
        for errors in form.errors.values():
            writer.writerows([[e] for e in errors])
        response.status_code = 400
        return response
    group_by = form.cleaned_data["group_by"]
    keys = ["job", "job_name"] if group_by == "job" else [group_by]
    figures = ["gpu_hours", "cost_usd", "unpriced_gpu_hours", "unpriced_vcpu_hours"]
    writer.writerow([*keys, *figures])
    for row in [*rows, {**total, **dict.fromkeys(keys, ""), keys[0]: "total"}]:
        writer.writerow([*(row[k] for k in keys), *("unknown" if row[f] is None else row[f] for f in figures)])
    if total["rounding_difference_usd"] != "0.00":  # the table rule of docs/design.md, Cost ledger
        writer.writerow(["rounding_difference", *([""] * len(keys)), total["rounding_difference_usd"], "", ""])
    return response


# --- reports ----------------------------------------------------------------------------------------------

def _report_form(request, data=None) -> ReportRequestForm:
    """The reports page's form for a report on demand: the user's teams, the platform for staff; yesterday by
    default."""
    yesterday = timezone.now().astimezone(dt.timezone.utc).date() - dt.timedelta(days=1)
    return ReportRequestForm(data, teams=Team.objects.visible_to(request.user), staff=request.user.is_staff,
                             initial={"start": yesterday, "end": yesterday})


@login_required
@require_http_methods(["GET", "POST"])
def report_list(request):
    """Stored reports of the user's teams (platform-wide ones for staff), newest period first, and a form that
    builds one on demand (POST: any member of the team, as ``POST /api/v1/reports/``; then its page opens)."""
    form = _report_form(request, request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        report, created = generate_report(form.chosen_team(), *form.window(), Report.Kind.CUSTOM,
                                          source=Report.Source.REQUEST, requested_by=request.user)
        messages.success(request, f"Report {report.pk} {'built' if created else 'rebuilt'}: {report}.")
        return redirect("frontend:report-detail", pk=report.pk)
    reports = Report.objects.visible_to(request.user).select_related("team")[:200]
    status = 400 if request.method == "POST" else 200
    return render(request, "frontend/report_list.html", {"reports": reports, "form": form}, status=status)


@login_required
def report_detail(request, pk: int):
    """One report as a page (its stored HTML)."""
    report = get_object_or_404(Report.objects.visible_to(request.user).select_related("team"), pk=pk)
    return render(request, "frontend/report_detail.html", {"report": report})


@login_required
def report_csv(request, pk: int):
    """One report's CSV (``section,item,metric,value``)."""
    report = get_object_or_404(Report.objects.visible_to(request.user), pk=pk)
    response = HttpResponse(report.csv, content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="report-{report.pk}.csv"'
    return response
