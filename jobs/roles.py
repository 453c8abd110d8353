"""What each role of a multi-role job holds and costs (docs/adr/0039-multi-role-jobs.md).

A multi-role job's attempt is one ledger line per interval (``costs.models.CostEntry``: the attempt's GPUs, CPU
and memory over all its roles, at the pool's prices). A role's cost is the same formula over the role's own pods:
for each entry of the job, ``seconds / 3600 x (role GPUs x usd_per_gpu_hour + role vCPUs x usd_per_vcpu_hour +
role GiB x usd_per_gib_hour)`` (``costs.ledger.interval_cost``'s formula, the prices the entry recorded), the
role's units read from the attempt's ``placement["roles"]`` (what admission booked for it). The roles' costs add up
to the ledger's, up to rounding (each role is rounded to cents when shown).
"""

from __future__ import annotations

from decimal import Decimal

from core.money import shown_usd
from costs.models import CostEntry
from costs.spend import exact_seconds

from .models import Job

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
