"""What each role of a multi-role job holds, costs, uses of its GPUs and processes (docs/adr/0039-multi-role-jobs.md).

A multi-role job's attempt is one ledger line per interval (``costs.models.CostEntry``: the attempt's GPUs, CPU
and memory over all its roles, at the pool's prices). A role's cost is the same formula over the role's own pods:
for each entry of the job, ``seconds / 3600 x (role GPUs x usd_per_gpu_hour + role vCPUs x usd_per_vcpu_hour +
role GiB x usd_per_gib_hour)`` (``costs.ledger.interval_cost``'s formula, the prices the entry recorded), the
role's units read from the attempt's ``placement["roles"]`` (what admission booked for it). The roles' costs add up
to the ledger's, up to rounding (each role is rounded to cents when shown).

A role's GPU utilization is read from the stored rollups (``role_utilization``): each attempt's per-node rows
(``costs.models.NodeUtilizationRollup``) go to a role by the most exact of three rules, named in the role's
``attribution``: ``pod`` (the DCGM series carried the pod's labels, and the pod's name its role,
``costs.prometheus.pod_role``), ``node`` (only the node is known, and one role of the attempt holds it),
``gpu-share`` (only the node is known and several roles hold GPUs there, or the series named no node: split by
the GPUs each role holds there, or in the attempt). Each row goes to the roles whole, in shares that add up to 1,
so no GPU's idle time counts twice and the roles add up to the attempt's rollups. A role's throughput is the last
``tokens_per_s`` each of its pods reported (``jobs.models.WorkloadMetrics.pods``).
"""

from __future__ import annotations

from decimal import Decimal

from core.money import shown_usd
from costs.models import CostEntry, NodeUtilizationRollup, UtilizationRollup
from costs.spend import exact_seconds

from .models import Job, WorkloadMetrics

_HOUR = Decimal(3600)


def role_units(placement: dict | None) -> dict[str, tuple[int, int, int, int]]:
    """By role name, ``(pods, GPUs, CPU millicores, memory MiB)`` over all its pods, from an attempt's
    ``placement`` (``jobs.scheduling.apply.multi_role_placement``); empty for an attempt of one role."""
    roles = (placement or {}).get("roles") or {}
    out = {}
    for name, role in roles.items():
        pods = len(role.get("nodes") or ())
        out[name] = (pods, pods * int(role.get("gpus_per_node") or 0), pods * int(role.get("cpu_milli") or 0),
                     pods * int(role.get("memory_mib") or 0))
    return out


def role_costs(job: Job) -> dict[str, dict] | None:
    """The roles of a multi-role ``job`` as its API answer shows them, by name in the spec's order: ``pods``,
    ``gpus_per_pod``, ``completion``, ``gpus`` (all its pods), ``gpu_hours``, ``vcpu_hours`` and ``cost_usd`` (USD
    string to cents, over every attempt's ledger entries; null while none of its time is priced) and
    ``unpriced_hours`` (hours of entries without a price, not in ``cost_usd``). None for a job of one role. One
    query."""
    if job.kind != Job.Kind.MULTI_ROLE:
        return None
    spec_roles = (job.spec or {}).get("roles") or {}
    totals = {name: {"gpu_hours": Decimal(0), "vcpu_hours": Decimal(0), "cost": Decimal(0), "unpriced": Decimal(0)}
              for name in spec_roles}
    rows = CostEntry.objects.filter(job=job).values_list(
        "attempt__placement", "interval_start", "interval_end", "usd_per_gpu_hour", "usd_per_vcpu_hour",
        "usd_per_gib_hour")
    for placement, start, end, per_gpu, per_vcpu, per_gib in rows:
        hours = exact_seconds(end - start) / _HOUR
        for name, (_pods, gpus, cpu_milli, memory_mib) in role_units(placement).items():
            total = totals.setdefault(name, {"gpu_hours": Decimal(0), "vcpu_hours": Decimal(0),
                                             "cost": Decimal(0), "unpriced": Decimal(0)})
            total["gpu_hours"] += gpus * hours
            total["vcpu_hours"] += Decimal(cpu_milli) / 1000 * hours
            if per_gpu is None:
                total["unpriced"] += hours
                continue
            per_hour = gpus * per_gpu
            if per_vcpu is not None:
                per_hour += Decimal(cpu_milli) / 1000 * per_vcpu
            if per_gib is not None:
                per_hour += Decimal(memory_mib) / 1024 * per_gib
            total["cost"] += per_hour * hours
    out = {}
    for name, total in totals.items():
        resources = (spec_roles.get(name) or {}).get("resources") or {}
        pods, per_pod = int(resources.get("nodes") or 0), int(resources.get("gpus_per_node") or 0)
        out[name] = {
            "pods": pods, "gpus_per_pod": per_pod, "gpus": pods * per_pod,
            "completion": bool((spec_roles.get(name) or {}).get("completion", True)),
            "gpu_hours": round(float(total["gpu_hours"]), 6), "vcpu_hours": round(float(total["vcpu_hours"]), 6),
            "cost_usd": shown_usd(total["cost"], float(total["unpriced"])),
            "unpriced_hours": round(float(total["unpriced"]), 6),
        }
    return out


def role_pods(spec: dict | None) -> list[tuple[str, int]]:
    """The pods of a multi-role ``spec`` in the order runners number them (node indexes): ``[(role, index in the
    role)]``, the roles in the spec's order, each role's pods in index order (``runners.local.runner.role_layout``
    numbers them the same); empty for a spec without roles."""
    roles = (spec or {}).get("roles") or {}
    return [(name, index) for name, role in roles.items()
            for index in range(int(((role or {}).get("resources") or {}).get("nodes") or 0))]


#: The attribution rules, from the most exact; a role shows the least exact rule that any of its time needed.
ATTRIBUTIONS = ("pod", "node", "gpu-share")
_SUMS = ("samples", "util_sum", "observed", "idle")
#: Differences below this share of a sum (GPU-seconds, samples, percent) are float noise of sums taken in another
#: order, not time.
_NOISE = 1e-6


def _node_gpus(placement: dict | None) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """``({node: {role: GPUs it holds there}}, {role: GPUs in the attempt})`` from a multi-role ``placement``."""
    by_node: dict[str, dict[str, int]] = {}
    total: dict[str, int] = {}
    for name, role in ((placement or {}).get("roles") or {}).items():
        per_pod = int(role.get("gpus_per_node") or 0)
        total[name] = per_pod * len(role.get("nodes") or ())
        for node in role.get("nodes") or ():
            by_node.setdefault(node, {})[name] = by_node.get(node, {}).get(name, 0) + per_pod
    return by_node, total


def attribute_attempt(placement: dict | None, total: dict[str, float],
                      rows: list[tuple[str, str, dict[str, float]]]) -> dict[str, dict]:
    """One multi-role attempt's utilization by role: ``{role: {"samples", "util_sum", "observed", "idle" (sums:
    samples, percent, GPU-seconds), "rules": {attribution}}}`` for each role of ``placement``.

    ``total``: the sums of the attempt's ``UtilizationRollup`` rows (the same keys); ``rows``: its
    ``NodeUtilizationRollup`` rows as ``(node, role, sums)``. A row with a role goes to it (``pod``); a row
    without one to the role that alone holds its node (``node``), else in shares of the GPUs each role holds on
    the node, or in the attempt where no role holds that node name (``gpu-share``). What the attempt's rows hold
    beyond its node rows (series without a host label) is split by the roles' GPUs in the attempt (``gpu-share``).
    The shares of a row add up to 1, so the roles' sums add up to ``total`` (up to float rounding). Pure."""
    by_node, gpus = _node_gpus(placement)
    out = {name: {**dict.fromkeys(_SUMS, 0.0), "rules": set()} for name in gpus}

    def credit(shares: dict[str, float], sums: dict[str, float], rule: str) -> None:
        whole = sum(shares.values())
        if not whole:
            return
        for name, weight in shares.items():
            if not weight:
                continue
            target = out.setdefault(name, {**dict.fromkeys(_SUMS, 0.0), "rules": set()})
            for key in _SUMS:
                target[key] += sums[key] * weight / whole
            target["rules"].add(rule)

    left = dict(total)
    for node, role, sums in rows:
        for key in _SUMS:
            left[key] -= sums[key]
        if role:
            credit({role: 1}, sums, "pod")
        elif len(holders := by_node.get(node, {})) == 1:
            credit(holders, sums, "node")
        else:
            credit(holders or gpus, sums, "gpu-share")
    if any(abs(left[key]) > _NOISE * max(1.0, abs(total[key])) for key in _SUMS):
        credit(gpus, left, "gpu-share")
    return out


def role_utilization(job: Job) -> dict[str, dict]:
    """GPU utilization of each role of the multi-role ``job`` over every attempt, from the stored rollups
    (``attribute_attempt`` per attempt): role -> ``gpu_utilization_percent`` (sample-weighted, percent; null
    when never observed), ``observed_gpu_hours``, ``idle_gpu_hours`` (observed hours under the idle threshold,
    ``COSTS_IDLE_UTIL_PERCENT``; null when never observed) and ``attribution`` (the least exact of
    ``ATTRIBUTIONS`` any of its time needed; null when never observed). Two queries (three when an attempt has
    figures but no node row)."""
    totals: dict[int, dict[str, float]] = {}
    for attempt_id, samples, util_sum, observed, idle in UtilizationRollup.objects.filter(job=job).values_list(
            "attempt_id", "samples", "util_sum", "observed_gpu_seconds", "idle_gpu_seconds"):
        t = totals.setdefault(attempt_id, dict.fromkeys(_SUMS, 0.0))
        for key, value in zip(_SUMS, (samples, util_sum, observed, idle or 0.0), strict=True):
            t[key] += value
    rows: dict[int, list] = {}
    placements: dict[int, dict] = {}
    for attempt_id, placement, node, role, *values in NodeUtilizationRollup.objects.filter(
            attempt__job=job).values_list("attempt_id", "attempt__placement", "node", "role", "samples", "util_sum",
                                          "observed_gpu_seconds", "idle_gpu_seconds").order_by("attempt_id", "day",
                                                                                               "node", "role"):
        placements[attempt_id] = placement
        rows.setdefault(attempt_id, []).append((node, role, dict(zip(_SUMS, values, strict=True))))
    if set(totals) - set(placements):  # attempts observed without any node row: their placements
        placements.update(job.attempts.filter(pk__in=set(totals) - set(placements)).values_list("pk", "placement"))
    sums: dict[str, dict] = {}
    for attempt_id, total in totals.items():
        for name, got in attribute_attempt(placements.get(attempt_id), total, rows.get(attempt_id, [])).items():
            s = sums.setdefault(name, {**dict.fromkeys(_SUMS, 0.0), "rules": set()})
            for key in _SUMS:
                s[key] += got[key]
            s["rules"] |= got["rules"]
    return {name: _utilization_figures(s) for name, s in sums.items()}


def _utilization_figures(s: dict) -> dict:
    """A role's shown utilization from its sums (``attribute_attempt``)."""
    observed = s["observed"] > _NOISE
    return {
        "gpu_utilization_percent": round(s["util_sum"] / s["samples"], 2) if s["samples"] > _NOISE else None,
        "observed_gpu_hours": round(max(0.0, s["observed"]) / 3600, 6),
        "idle_gpu_hours": round(max(0.0, s["idle"]) / 3600, 6) if observed else None,
        "attribution": next((r for r in reversed(ATTRIBUTIONS) if r in s["rules"]), None) if observed else None,
    }


def role_throughput(job: Job) -> tuple[int | None, dict[str, dict]]:
    """``(attempt number, {role: {"tokens_per_s", "pod_tokens_per_s"}})`` of the multi-role ``job``'s latest
    attempt whose pods reported throughput (``WorkloadMetrics.pods``); ``(None, {})`` when none did.
    ``pod_tokens_per_s``: each pod's last reported tokens/s, by index in the role (null: it reported none);
    ``tokens_per_s``: their sum (each pod reports for itself; by the protocol only rank 0 of a process group
    reports, so a role that is one process group shows its rank 0's figure, a role of independent servers the
    sum of theirs), null when none of its pods reported. One query."""
    row = (WorkloadMetrics.objects.filter(attempt__job=job).exclude(pods={})
           .order_by("-attempt__number").values_list("attempt__number", "pods").first())
    if row is None:
        return None, {}
    number, pods = row
    spec_roles = (job.spec or {}).get("roles") or {}
    out = {}
    for name, role in spec_roles.items():
        count = int(((role or {}).get("resources") or {}).get("nodes") or 0)
        figures = [((pods.get(name) or {}).get(str(i)) or {}).get("tokens_per_s") for i in range(count)]
        reported = [f for f in figures if f is not None]
        out[name] = {"tokens_per_s": round(sum(reported), 1) if reported else None, "pod_tokens_per_s": figures}
    return number, out


def job_roles(job: Job) -> dict[str, dict] | None:
    """The ``roles`` of the multi-role ``job``'s API answer and page: ``role_costs`` with, per role, its
    ``role_utilization`` figures (null ones for a role never observed) and ``role_throughput``'s ``tokens_per_s``
    and ``pod_tokens_per_s`` with ``throughput_attempt`` (the attempt number they are from). None for a job of one
    role."""
    roles = role_costs(job)
    if roles is None:
        return None
    utilization = role_utilization(job)
    number, throughput = role_throughput(job)
    never = {"gpu_utilization_percent": None, "observed_gpu_hours": 0.0, "idle_gpu_hours": None,
             "attribution": None}
    for name, role in roles.items():
        count = role["pods"]
        role.update(utilization.get(name, never))
        role.update(throughput.get(name, {"tokens_per_s": None, "pod_tokens_per_s": [None] * count}),
                    throughput_attempt=number)
    return roles
