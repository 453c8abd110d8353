"""The fleet's pages: Nodes (every node with what is allocated and free on it, its health and the evidence behind it;
staff cordon, uncordon and drain it) and Utilization (GPU utilization over UTC days by team, job and cluster, with
idle and unobserved GPU-hours and their cost, drawn as inline SVG charts).

The figures are the API's: free resources per node are ``jobs.scheduling.offers.free_on_nodes`` (what admission
counts, ``/api/v1/nodes/``), utilization is ``costs.aggregation.utilization_window`` over the user's teams' rollups
(``/api/v1/utilization/``).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django import forms
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from costs.aggregation import filter_days, utilization_window
from costs.capacity import NODE_UTILIZATION_RULE, capacity_reports, node_utilization, with_rounding
from costs.models import UtilizationRollup
from costs.spend import utc_midnight
from jobs.scheduling.offers import free_on_nodes, unheld_on_nodes, why_no_work
from quotas.models import Team, scope_to_teams
from runners.models import Cluster, Node

MIB_PER_GIB = 1024
MILLI_PER_VCPU = 1000


# --- nodes ----------------------------------------------------------------------------------------------------

#: The health filter of the nodes page: the three health values and "cordoned" (by staff, whatever its health).
HEALTH_CHOICES = [("", "any"), *Node.Health.choices, ("cordoned", "cordoned by staff")]


class NodeFilterForm(forms.Form):
    """The nodes page's filters: ``cluster`` (name; "" any) and ``health`` (``HEALTH_CHOICES``; "" any)."""

    cluster = forms.ChoiceField(required=False, label="Cluster")
    health = forms.ChoiceField(required=False, choices=HEALTH_CHOICES, label="Health")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["cluster"].choices = [("", "any"), *((n, n) for n in
                                                         Cluster.objects.order_by("name").values_list("name", flat=True))]


def gib(mib: int) -> Decimal:
    """MiB as GiB (Decimal, to 0.1 GiB, half-even)."""
    return (Decimal(mib) / MIB_PER_GIB).quantize(Decimal("0.1"))


def vcpus(milli: int) -> Decimal:
    """Millicores as vCPU (Decimal, to 0.1 vCPU, half-even)."""
    return (Decimal(milli) / MILLI_PER_VCPU).quantize(Decimal("0.1"))


def node_rows(nodes: list[Node]) -> list[dict]:
    """Each of ``nodes`` (cluster and pool with its accelerator selected) with what is free on it now: ``node``,
    ``accelerator`` (the pool's accelerator, else the node's GPU product label), ``gpus_free``/``gpus_allocated``
    (GPUs), ``vcpu``/``vcpu_free`` (vCPU), ``memory_gib``/``memory_free_gib`` (GiB), ``no_work`` (why admission
    places nothing there, "" when it takes work: its free figures are then 0) and ``kubernetes`` (its state in
    Kubernetes, in words). Three queries."""
    unheld = unheld_on_nodes(nodes)
    free = free_on_nodes(nodes, unheld)
    rows = []
    for n in nodes:
        gpus, cpu, mem = free[n.pk]
        rows.append({
            "node": n, "accelerator": n.node_pool.accelerator.name if n.node_pool else (n.accelerator_label or "—"),
            "gpus_free": gpus, "gpus_allocated": n.gpus - unheld[n.pk][0], "vcpu": vcpus(n.cpu_milli),
            "vcpu_free": vcpus(cpu), "memory_gib": gib(n.memory_mib), "memory_free_gib": gib(mem),
            "no_work": why_no_work(n),
            "kubernetes": ("schedulable" if n.schedulable else "cordoned" if n.unschedulable
                           else "not schedulable (not Ready or tainted)"),
        })
    return rows


def pool_resources(nodes: list[Node]) -> dict[int, dict]:
    """Per node pool id, the vCPU and memory (GiB) of its synced ``nodes`` and what is free of them now:
    ``{"nodes", "gpu_nodes", "vcpu", "vcpu_free", "memory_gib", "memory_free_gib"}`` (nothing is free on a node that
    takes no work: ``free_on_nodes``). Pools without node rows are absent (registered by hand, not synced: their CPU and memory are unknown)."""
    free = free_on_nodes(nodes)
    sums: dict[int, list[int]] = {}
    for n in nodes:
        if n.node_pool_id is None:
            continue
        s = sums.setdefault(n.node_pool_id, [0, 0, 0, 0, 0, 0])
        for i, v in enumerate((1, int(n.gpus > 0), n.cpu_milli, free[n.pk][1], n.memory_mib, free[n.pk][2])):
            s[i] += v
    return {pid: {"nodes": s[0], "gpu_nodes": s[1], "vcpu": vcpus(s[2]), "vcpu_free": vcpus(s[3]),
                  "memory_gib": gib(s[4]), "memory_free_gib": gib(s[5])} for pid, s in sums.items()}


@login_required
def nodes(request):
    """Every node of every cluster (filtered by ``cluster`` and ``health``): cluster, pool, accelerator, GPUs
    allocated and free, vCPU and memory (GiB) allocatable and free, health with its evidence, its state in
    Kubernetes and the staff cordon; staff get Cordon, Uncordon, Drain and Clear health buttons. A bad filter
    value is a 400 with the error next to the field."""
    form = NodeFilterForm(request.GET or None)
    found = Node.objects.select_related("cluster", "node_pool__accelerator").order_by("cluster__name", "name")
    valid = form.is_valid() if form.is_bound else True
    if valid and form.is_bound:
        if form.cleaned_data["cluster"]:
            found = found.filter(cluster__name=form.cleaned_data["cluster"])
        health = form.cleaned_data["health"]
        if health == "cordoned":
            found = found.filter(cordoned=True)
        elif health:
            found = found.filter(health=health)
    rows = node_rows(list(found)) if valid else []
    totals = {key: sum(r[key] for r in rows) for key in ("gpus_allocated", "gpus_free", "vcpu", "vcpu_free",
                                                         "memory_gib", "memory_free_gib")}
    totals["gpus"] = sum(r["node"].gpus for r in rows)
    totals["gpus_no_work"] = totals["gpus"] - totals["gpus_allocated"] - totals["gpus_free"]
    return render(request, "frontend/node_list.html",
                  {"form": form, "rows": rows, "totals": totals, "filtered": form.is_bound and any(
                      form.data.get(k) for k in ("cluster", "health")),
                   "any_node": Node.objects.exists()}, status=200 if valid else 400)


# --- utilization ------------------------------------------------------------------------------------------------

#: The windows of the utilization page: key -> (UTC days up to today's, label). Rollups are per UTC day.
WINDOWS = {"1d": (1, "today (UTC)"), "7d": (7, "last 7 UTC days"), "30d": (30, "last 30 UTC days")}
DEFAULT_WINDOW = "7d"
#: The groups shown, each a table (and the day one a chart over time).
UTILIZATION_GROUPS = ("day", "team", "cluster", "job")
#: Columns a table may be sorted by (largest first), with their headings.
SORTABLE = {"gpu_hours": "GPU-hours", "avg_gpu_util_percent": "Avg util %", "coverage_percent": "Coverage %",
            "idle_gpu_hours": "Idle GPU-h", "idle_cost_usd": "Idle cost", "unobserved_gpu_hours": "Unobserved GPU-h",
            "unobserved_cost_usd": "Unobserved cost"}


class UtilizationForm(forms.Form):
    """The utilization page's query: ``window`` (``WINDOWS``; default ``DEFAULT_WINDOW``) and ``sort`` (a column of
    ``SORTABLE``, largest first; default: by key, numbers in numeric order)."""

    window = forms.ChoiceField(required=False, choices=[(k, v[1]) for k, v in WINDOWS.items()], label="Window")
    sort = forms.ChoiceField(required=False, choices=[("", "by name"), *SORTABLE.items()], label="Sort by")


def window_of(key: str, today: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """``[start, end)`` of the window ``key`` (``WINDOWS``) ending with the UTC day ``today``: whole UTC days."""
    days = WINDOWS[key][0]
    return utc_midnight(today - dt.timedelta(days=days - 1)), utc_midnight(today + dt.timedelta(days=1))


def sorted_rows(rows: list[dict], column: str) -> list[dict]:
    """``rows`` by ``column`` largest first, compared as numbers (money strings too); rows without a figure last.
    An empty ``column`` keeps the given order."""
    if not column:
        return rows
    return sorted(rows, key=lambda r: (r.get(column) is None, -float(r.get(column) or 0)))


def stacked_bars(bars: list[tuple[str, list[float]]], series: list[tuple[str, str]], unit: str, title: str
                 ) -> SafeString:
    """An inline SVG of one stacked bar per ``(label, values)`` of ``bars``, ``values`` in the order of
    ``series`` (``(name, CSS colour)``), with a legend, the largest total on the axis and each bar's parts in its
    tooltip (``<title>``). ``unit`` names the figures (e.g. "GPU-hours")."""
    width, height, left, bottom, top = 860, 260, 56, 44, 28
    biggest = max((sum(v) for _, v in bars), default=0) or 1
    slot = (width - left - 8) / max(len(bars), 1)
    bar = max(min(slot * 0.7, 60), 2)
    parts = []
    for i, (label, values) in enumerate(bars):
        x, y = left + i * slot + (slot - bar) / 2, height - bottom
        tip = f"{label}: " + ", ".join(f"{name} {v:,.2f}" for (name, _), v in zip(series, values, strict=True))
        rects = []
        for (_, colour), v in zip(series, values, strict=True):
            h = (height - bottom - top) * v / biggest
            y -= h
            rects.append(format_html('<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>',
                                     f"{x:.1f}", f"{y:.1f}", f"{bar:.1f}", f"{h:.1f}", colour))
        parts.append(format_html('<g class="bar"><title>{}</title>{}</g>', tip, SafeString("".join(rects))))
        if len(bars) <= 16 or i % max(len(bars) // 10, 1) == 0:
            parts.append(format_html('<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>',
                                     f"{x + bar / 2:.1f}", height - bottom + 14,
                                     label if len(label) <= 16 else label[:15] + "…"))
    legend = format_html_join("", '<rect x="{}" y="4" width="12" height="12" fill="{}"/>'
                              '<text x="{}" y="14" font-size="12">{}</text>',
                              ((left + 170 * i, c, left + 170 * i + 16, n) for i, (n, c) in enumerate(series)))
    axis = format_html('<line x1="{l}" y1="{b}" x2="{w}" y2="{b}" stroke="#767676"/>'
                       '<line x1="{l}" y1="{t}" x2="{l}" y2="{b}" stroke="#767676"/>'
                       '<text x="{x}" y="{ty}" font-size="11" text-anchor="end">{big}</text>'
                       '<text x="{x}" y="{b}" font-size="11" text-anchor="end">0</text>'
                       '<text x="4" y="{u}" font-size="11">{unit}</text>',
                       l=left, b=height - bottom, w=width - 8, t=top, x=left - 4, ty=top + 4, big=f"{biggest:,.1f}",
                       u=height - 8, unit=unit)
    return format_html('<svg role="img" aria-label="{}" viewBox="0 0 {} {}" width="100%" class="svg-chart">'
                       '<title>{}</title>{}{}{}</svg>', title, width, height, title, legend, axis,
                       SafeString("".join(parts)))


#: The parts of each bar: busy (observed, not idle), idle, unobserved GPU-hours.
GPU_HOUR_SERIES = [("busy GPU-hours", "#1f5fa8"), ("idle GPU-hours", "#e8a200"), ("unobserved GPU-hours", "#9a9a9a")]


def gpu_hour_parts(row: dict) -> list[float]:
    """A utilization row's GPU-hours split as ``GPU_HOUR_SERIES``: observed minus idle, idle, unobserved."""
    idle = row["idle_gpu_hours"] or 0.0
    return [max(row["observed_gpu_hours"] - idle, 0.0), idle, row["unobserved_gpu_hours"]]


#: The parts of each node's bar: its capacity allocated to jobs, unallocated while it took work, and cordoned.
NODE_SERIES = [("allocated GPU-hours", "#1f5fa8"), ("unallocated GPU-hours", "#e8a200"),
               ("cordoned GPU-hours", "#9a9a9a")]


def node_parts(row: dict) -> list[float]:
    """A capacity row of one node split as ``NODE_SERIES``: allocated, unallocated less cordoned, cordoned."""
    cordoned = float(row["cordoned_gpu_hours"] or 0)
    return [float(row["allocated_gpu_hours"] or 0), max(float(row["unallocated_gpu_hours"] or 0) - cordoned, 0.0),
            cordoned]


def row_label(row: dict, group_by: str) -> str:
    """A utilization row's name: the day, team, cluster, or ``#id name`` of a job."""
    return f"#{row['job']} {row['job_name']}" if group_by == "job" else str(row[group_by])


@login_required
def utilization(request):
    """GPU utilization of the user's teams (all for staff) over a window of whole UTC days (``WINDOWS``): per UTC
    day as a chart and a table, and per team, cluster and job, each with GPU-hours, average utilization, coverage,
    idle and unobserved GPU-hours and their cost (the figures of ``/api/v1/utilization/`` for the same days); per
    node, the fleet's capacity, allocated, unallocated and cordoned GPU-hours and the unallocated cost (those of
    ``/api/v1/capacity/?group_by=node``) beside the observed and idle GPU-hours and the average utilization of the
    GPUs the user's teams' attempts held there (all teams' for staff; those of
    ``/api/v1/utilization/?group_by=node``). A bad ``window`` or ``sort`` is a 400 with the error next to the
    field."""
    query = request.GET.copy()
    query.setdefault("window", DEFAULT_WINDOW)
    form = UtilizationForm(query)
    if not form.is_valid():
        return render(request, "frontend/utilization.html", {"form": form, "tables": []}, status=400)
    key, column = form.cleaned_data["window"] or DEFAULT_WINDOW, form.cleaned_data["sort"]
    start, end = window_of(key, timezone.now().astimezone(dt.UTC).date())
    user = request.user
    rollups = filter_days(scope_to_teams(UtilizationRollup.objects.all(), user), start, end)
    tables, total, chart = [], None, None
    for group_by in UTILIZATION_GROUPS:
        rows, total = utilization_window(rollups, group_by, start, end, scope=lambda qs: scope_to_teams(qs, user))
        if group_by == "day":
            by_day = {r["day"]: r for r in rows}
            days = [(start + dt.timedelta(days=n)).date().isoformat() for n in range(WINDOWS[key][0])]
            chart = stacked_bars([(d, gpu_hour_parts(by_day[d]) if d in by_day else [0.0, 0.0, 0.0]) for d in days],
                                 GPU_HOUR_SERIES, "GPU-hours", "GPU-hours per UTC day: busy, idle and unobserved")
        shown = sorted_rows(rows, column)
        tables.append({"group_by": group_by, "rows": [{**r, "label": row_label(r, group_by)} for r in shown],
                       "chart": None if group_by in ("day", "job") or not rows else stacked_bars(
                           [(row_label(r, group_by), gpu_hour_parts(r)) for r in shown], GPU_HOUR_SERIES, "GPU-hours",
                           f"GPU-hours by {group_by}: busy, idle and unobserved")})
    nodes, node_total = with_rounding(*capacity_reports({"node": None}, start, end)["node"])
    nodes = [r for r in nodes if r["capacity_gpu_hours"] is not None]
    teams = None if user.is_staff else set(Team.objects.visible_to(user).values_list("pk", flat=True))
    used = {(r["cluster"], r["node"]): r for r in node_utilization(start, end, team_ids=teams)[0]}
    for r in nodes:
        r["use"] = used.get((r["cluster"], r["node"]))
    return render(request, "frontend/utilization.html", {
        "form": form, "window": key, "window_label": WINDOWS[key][1], "sort": column, "start": start,
        "last_day": (end - dt.timedelta(days=1)).date(), "tables": tables, "total": total, "chart": chart,
        "windows": [(k, v[1]) for k, v in WINDOWS.items()], "columns": list(SORTABLE.items()),
        "nodes": nodes, "node_total": node_total, "node_rule": NODE_UTILIZATION_RULE, "node_chart": stacked_bars(
            [(f"{r['cluster']}/{r['node']}", node_parts(r)) for r in nodes], NODE_SERIES, "GPU-hours",
            "GPU-hours per node: allocated, unallocated and cordoned") if nodes else None})
