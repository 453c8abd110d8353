"""Admission rules, each written once: quota, per-cluster caps, cohort borrowing, capacity, budgets, cost estimate.

Pure functions over plain numbers (GPUs, USD) returning a ``Verdict``: the
decision loop (``cycle``), the locked re-check of an admission and the
submission preview all ask these, so a job is told the same reason
wherever it is judged. Sources: Kueue's ClusterQueue rule (nominal +
borrowing limit), its cohort lending, and money budgets in the spirit of
Slurm's GrpTRESMins.
"""

from __future__ import annotations

import dataclasses
from decimal import ROUND_CEILING, Decimal

from core.cohorts import CohortTree
from core.gpus import shown_gpus
from core.money import price_per_hour

from .placement import PoolOffer
from .types import OK, BudgetView, QueuedJob, QuotaView, TeamQuota, TeamState, Verdict

ESTIMATE_QUANTUM = Decimal("0.000001")
_3600 = Decimal(3600)


def estimate_cost(total_gpus: int, max_runtime_seconds: int, usd_per_gpu_hour: Decimal) -> Decimal:
    """Worst-case cost of an attempt, USD: GPUs x max_runtime (s) / 3600 x price (USD/GPU-hour), rounded up to 1e-6
    (a worst case: never below what the ledger bills for the same time, which stops at the max runtime)."""
    return (Decimal(total_gpus) * Decimal(max_runtime_seconds) * usd_per_gpu_hour / _3600).quantize(
        ESTIMATE_QUANTUM, ROUND_CEILING
    )


def job_estimate(job: QueuedJob, offer: PoolOffer) -> Decimal:
    """Worst-case cost of ``job`` on ``offer``, USD: ``estimate_cost`` of its GPUs (a share of one GPU counts its
    share, ``QueuedJob.quota_gpus``, as the ledger bills it: ADR 0040), plus on a pool priced by CPU
    (``offer.usd_per_vcpu_hour`` / ``usd_per_gib_hour`` set: a CPU node pool) its CPU (vCPUs) and memory (GiB)
    over all its nodes (a multi-role job: all its roles' pods) x max_runtime / 3600 x those prices, as the ledger
    bills them; rounded up to 1e-6."""
    per_hour = Decimal(job.quota_gpus) * offer.usd_per_gpu_hour
    if offer.usd_per_vcpu_hour is not None:
        per_hour += Decimal(job.total_cpu_milli) / 1000 * offer.usd_per_vcpu_hour
    if offer.usd_per_gib_hour is not None:
        per_hour += Decimal(job.total_memory_mib) / 1024 * offer.usd_per_gib_hour
    return (per_hour * Decimal(job.max_runtime_seconds) / _3600).quantize(ESTIMATE_QUANTUM, ROUND_CEILING)


def price_text(offer: PoolOffer) -> str:
    """``$2.50/GPU-h``, or for a CPU node pool ``$0.031611/vCPU-h + $0.004237/GiB-h``, for messages (each price with
    every digit it has, at least to cents: ``core.money.price_per_hour``)."""
    if offer.usd_per_vcpu_hour is None and offer.usd_per_gib_hour is None:
        return f"${price_per_hour(offer.usd_per_gpu_hour)}/GPU-h"
    parts = [f"${price_per_hour(offer.usd_per_gpu_hour)}/GPU-h"] if offer.usd_per_gpu_hour else []
    parts += [f"${price_per_hour(p)}/{unit}-h" for p, unit in ((offer.usd_per_vcpu_hour, "vCPU"), (offer.usd_per_gib_hour, "GiB"))
              if p is not None]
    return " + ".join(parts)


# --- quota ------------------------------------------------------------------------------------------------

def _limit_phrase(quota: QuotaView) -> str:
    limit = quota.limit_gpus
    if limit < quota.nominal_gpus + quota.borrowing_limit_gpus:
        return (f"the {limit} GPUs the team can reach (nominal {quota.nominal_gpus} + {limit - quota.nominal_gpus} "
                f"its cohort can lend; its borrowing limit of {quota.borrowing_limit_gpus} is more than that)")
    return (f"the team's limit of {limit} GPUs (nominal {quota.nominal_gpus} + borrowing limit "
            f"{quota.borrowing_limit_gpus})")


def check_quota(request_gpus: int | Decimal, used_gpus: int | Decimal, quota: QuotaView | None) -> Verdict:
    """Admit when ``used_gpus + request_gpus`` is within the team's limit: nominal + borrowing limit (Kueue's
    ClusterQueue rule), capped by what its cohort can lend (``core.cohorts.reachable``). GPUs are ints, or exact
    Decimals where shares of a GPU are counted (``QueuedJob.quota_gpus``): the sum is exact, so a request equal to
    what is left is admitted; messages and ``detail`` show them as numbers (``core.gpus.shown_gpus``).

    A job larger than the per-job cap or than the whole limit can never run. A job that asks no GPUs (a CPU-only
    job) needs no GPU quota: it is always within it.
    """
    if request_gpus == 0:
        return OK
    if quota is None:
        asks = shown_gpus(request_gpus)
        return Verdict(False, "quota", f"The team has no quota for this accelerator, so a job of {asks} GPUs "
                                       f"can never run.", {"request_gpus": asks}, never=True)
    limit = quota.limit_gpus
    if used_gpus + request_gpus <= limit and not (quota.max_gpus_per_job and request_gpus > quota.max_gpus_per_job):
        return OK
    shown_request, shown_used = shown_gpus(request_gpus), shown_gpus(used_gpus)
    # The per-job cap is in every verdict: a scheduling pass that skips jobs at least as large as one that
    # waited must still try (and reject) those over the cap.
    detail = {"request_gpus": shown_request, "used_gpus": shown_used, "nominal_gpus": quota.nominal_gpus,
              "borrowing_limit_gpus": quota.borrowing_limit_gpus, "max_gpus_per_job": quota.max_gpus_per_job,
              "limit_gpus": limit}
    if quota.max_gpus_per_job and request_gpus > quota.max_gpus_per_job:
        return Verdict(False, "quota", f"job asks {shown_request} GPUs, over the per-job cap of {quota.max_gpus_per_job}",
                       detail, never=True)
    if request_gpus > limit:
        return Verdict(False, "quota", f"job asks {shown_request} GPUs, over {_limit_phrase(quota)}", detail, never=True)
    if used_gpus + request_gpus > limit:
        return Verdict(False, "quota", f"{shown_used} of {limit} GPUs in use; {shown_request} more would exceed "
                                       f"{_limit_phrase(quota)}", detail)
    return OK


def _vcpus(milli: int) -> int | float:
    """CPU millicores as vCPUs: an int when whole (``4000`` -> 4), else a float (``500`` -> 0.5)."""
    return milli // 1000 if milli % 1000 == 0 else milli / 1000


def _cpu_limit_phrase(quota: QuotaView) -> str:
    limit, nominal, borrowing = quota.limit_gpus, quota.nominal_gpus, quota.borrowing_limit_gpus
    if limit < nominal + borrowing:
        return (f"the {_vcpus(limit)} vCPUs the team can reach (nominal {_vcpus(nominal)} + "
                f"{_vcpus(limit - nominal)} its cohort can lend; its borrowing limit of {_vcpus(borrowing)} is more "
                f"than that)")
    return (f"the team's CPU limit of {_vcpus(limit)} vCPUs (nominal {_vcpus(nominal)} + borrowing limit "
            f"{_vcpus(borrowing)})")


def check_cpu_quota(request_milli: int, used_milli: int, quota: QuotaView | None) -> Verdict:
    """The CPU quota rule for a CPU-only job, in CPU millicores (all its pods' requests): with no CPU quota the job is
    quota-free (OK); otherwise admit when ``used_milli + request_milli`` is within nominal + borrowing limit, capped
    by what the cohort can lend (Kueue's ClusterQueue rule on its ``cpu`` resource). ``quota``: the team's CPU quota
    in millicores (``TeamQuota.cpu``). Over the per-job cap or the whole limit it can never run. Messages and
    ``detail`` say vCPUs (``request_vcpus``, ``used_vcpus``, ``nominal_vcpus``, ``borrowing_limit_vcpus``,
    ``max_vcpus_per_job``, ``limit_vcpus``)."""
    if quota is None or request_milli == 0:
        return OK
    limit = quota.limit_gpus
    asks = _vcpus(request_milli)
    detail = {"request_vcpus": asks, "used_vcpus": _vcpus(used_milli), "nominal_vcpus": _vcpus(quota.nominal_gpus),
              "borrowing_limit_vcpus": _vcpus(quota.borrowing_limit_gpus),
              "max_vcpus_per_job": _vcpus(quota.max_gpus_per_job), "limit_vcpus": _vcpus(limit)}
    if quota.max_gpus_per_job and request_milli > quota.max_gpus_per_job:
        return Verdict(False, "quota", f"Over CPU quota: the job asks {asks} vCPUs, over the per-job cap of "
                                       f"{_vcpus(quota.max_gpus_per_job)} vCPUs", detail, never=True)
    if request_milli > limit:
        return Verdict(False, "quota", f"Over CPU quota: the job asks {asks} vCPUs, over {_cpu_limit_phrase(quota)}",
                       detail, never=True)
    if used_milli + request_milli > limit:
        return Verdict(False, "quota", f"Over CPU quota: {_vcpus(used_milli)} of {_vcpus(limit)} vCPUs in use; "
                                       f"{asks} more would exceed {_cpu_limit_phrase(quota)}", detail)
    return OK


def quota_verdict(job: QueuedJob, amount: int, used: int, quota: QuotaView | None) -> Verdict:
    """``check_cpu_quota`` for a CPU-only job, else ``check_quota``; ``amount`` and ``used`` in the quota's unit (GPUs,
    or CPU millicores: ``TeamQuota.cpu``)."""
    if job.cpu_only:
        return check_cpu_quota(amount, used, quota)
    return check_quota(amount, used, quota)


def cluster_room(team: TeamState, accelerator_id: int, cluster_id: int, gpus: int) -> bool:
    """Whether ``gpus`` more fit under the team's cap on ``cluster_id`` (no cap: yes)."""
    cap = team.cluster_caps.get((accelerator_id, cluster_id))
    return cap is None or team.cluster_used.get((accelerator_id, cluster_id), 0) + gpus <= cap


def within_cluster_caps(team: TeamState, job: QueuedJob, pools: list[PoolOffer],
                        accelerator_id: int | None = None) -> tuple[list[PoolOffer], Verdict]:
    """The pools of ``pools`` whose cluster has room for ``job`` (on ``accelerator_id``, default the job's) under the
    team's per-cluster caps, and OK; or no pools and the verdict that says so (reason ``quota``, with each capped
    cluster's cap and usage)."""
    acc, gpus = job.accelerator_id if accelerator_id is None else accelerator_id, job.quota_gpus
    allowed = [o for o in pools if cluster_room(team, acc, o.cluster_id, gpus)]
    if allowed:
        return allowed, OK
    capped = sorted({o.cluster_name for o in pools})
    return [], Verdict(False, "quota", f"the team's per-cluster quota leaves no room for {shown_gpus(gpus)} GPUs on "
                                       f"{', '.join(capped)}",
                       {"request_gpus": shown_gpus(gpus), "clusters": capped,
                        "cluster_quota_gpus": {o.cluster_name: team.cluster_caps[(acc, o.cluster_id)]
                                               for o in pools if (acc, o.cluster_id) in team.cluster_caps},
                        "cluster_used_gpus": {o.cluster_name: shown_gpus(team.cluster_used.get((acc, o.cluster_id), 0))
                                              for o in pools if (acc, o.cluster_id) in team.cluster_caps}})


# --- cohort borrowing -------------------------------------------------------------------------------------

def cohort_has_room(pool_gpus: int, borrowed_gpus: int, team_used: int, team_guaranteed: int, request: int) -> bool:
    """Whether ``request`` more GPUs for a team keep the cohort's borrowed GPUs within its lendable pool.

    ``borrowed_gpus`` = sum over the cohort of max(0, used - guaranteed); the
    team's own share of it changes from max(0, used - g) to max(0, used + request - g).
    """
    after = borrowed_gpus - max(0, team_used - team_guaranteed) + max(0, team_used + request - team_guaranteed)
    return after <= pool_gpus


def cohort_full(job: QueuedJob, used: int, q: TeamQuota, lendable: int, borrowed: int) -> Verdict:
    """The verdict for a job the cohort's lendable pool cannot take (``cohort_has_room`` said no): reason ``quota``.
    The message says "in use", not "borrowed": with no lending limit a team's own nominal is in the pool too, so
    a team within its nominal draws from it while the quota tables show it borrowing nothing."""
    gpus, borrowed = shown_gpus(job.quota_gpus), shown_gpus(borrowed)
    return Verdict(False, "quota", f"the cohort's shared pool holds {lendable} GPUs and {borrowed} of them are in use; "
                                   f"{gpus} more do not fit",
                   {"request_gpus": gpus, "used_gpus": shown_gpus(used), "nominal_gpus": q.nominal_gpus,
                    "borrowing_limit_gpus": q.borrowing_limit_gpus, "lending_limit_gpus": q.lending_limit_gpus,
                    "cohort_lendable_gpus": lendable, "cohort_borrowed_gpus": borrowed})


def tree_full(job: QueuedJob, used, q: TeamQuota, tree: CohortTree, key, acc: int, amount) -> Verdict:
    """The verdict for a job a level of its team's tree of cohorts cannot take (``CohortTree.fits`` said no):
    reason ``quota``, naming the level with the least room (``CohortTree.short_level``) and giving, per level of
    the path (the team first, the root last), its subtree quota, usage, guaranteed part and room (``levels``;
    GPUs, or vCPUs for a CPU-only job: ``amount``, ``used`` and ``q`` in millicores then). ADR 0046."""
    show = _vcpus if job.cpu_only else shown_gpus
    unit = "vCPUs" if job.cpu_only else "GPUs"
    short = tree.short_level(key, acc, amount)
    levels = []
    for k in tree.path(key):
        room = tree.room(k, acc)
        levels.append({"level": tree.levels[k].name, "subtree_quota": show(tree.subtree_quota(k, acc)),
                       "usage": show(tree.usage(k, acc)), "guaranteed": show(tree.guaranteed(k, acc)),
                       "room": None if room is None else show(max(0, room))})
    name = tree.levels[short].name if short is not None else tree.levels[key].name
    room = tree.room(short, acc) if short is not None else None
    held = f" (room for {show(max(0, room))} more {unit} there)" if room is not None else ""
    return Verdict(False, "quota", f"{'Over CPU quota: ' if job.cpu_only else ''}{show(amount)} more {unit} would "
                                   f"exceed what level {name} of the team's tree of cohorts allows{held}; "
                                   f"{show(tree.available(key, acc))} {unit} can be had now",
                   {"request_gpus" if not job.cpu_only else "request_vcpus": show(amount),
                    "used_gpus" if not job.cpu_only else "used_vcpus": show(used),
                    "short_level": name, "available": show(tree.available(key, acc)), "levels": levels,
                    "cohort_tree": True})


def cpu_cohort_full(job: QueuedJob, used_milli: int, q: TeamQuota, lendable_milli: int,
                    borrowed_milli: int) -> Verdict:
    """``cohort_full`` of a CPU-only job on its team's CPU quota (all numbers CPU millicores; the message and the
    detail say vCPUs): the cohort's unused CPU nominal cannot lend it what it needs above its own."""
    asks = _vcpus(job.total_cpu_milli)
    return Verdict(False, "quota", f"Over CPU quota: the cohort's shared pool holds {_vcpus(lendable_milli)} vCPUs "
                                   f"and {_vcpus(borrowed_milli)} of them are in use; {asks} more do not fit",
                   {"request_vcpus": asks, "used_vcpus": _vcpus(used_milli), "nominal_vcpus": _vcpus(q.nominal_gpus),
                    "borrowing_limit_vcpus": _vcpus(q.borrowing_limit_gpus),
                    "lending_limit_vcpus": None if q.lending_limit_gpus is None else _vcpus(q.lending_limit_gpus),
                    "cohort_lendable_vcpus": _vcpus(lendable_milli), "cohort_borrowed_vcpus": _vcpus(borrowed_milli)})


# --- capacity ---------------------------------------------------------------------------------------------

def _shape(job: QueuedJob) -> str:
    """``2 nodes x 8 GPUs (16 vCPU, 64 GiB per node)``, ``1 node x 1 GPU``, for messages."""
    per = []
    if job.cpu_milli:
        per.append(f"{job.cpu_milli / 1000:g} vCPU")
    if job.memory_mib:
        per.append(f"{job.memory_mib / 1024:g} GiB")
    nodes = f"{job.nodes} node{'s' if job.nodes != 1 else ''}"
    if job.cpu_only:  # no GPU to name: vCPU and GiB per node
        return f"{nodes} x " + (" + ".join(per) or "no resources")
    return f"{nodes} x {_plural(job.gpus_per_node, 'GPU')}" + (f" ({', '.join(per)} per node)" if per else "")


def no_price(job: QueuedJob, unpriced: list[PoolOffer]) -> Verdict:
    """The only node pools that could hold ``job`` have no price in the catalog: it waits for one, without blocking
    its team, and the message names the pools (cluster, provider, region, capacity type)."""
    names = ", ".join(f"{o.cluster_name} ({o.provider} {o.region}, {o.capacity_type})" for o in unpriced)
    return Verdict(False, "capacity", f"no price for node pool {names}: the price catalog has none in force",
                   {"request_gpus": job.total_gpus, "free_gpus_by_pool": {}, "never_placeable": True,
                    "unpriced_pools": [o.node_pool_id for o in unpriced], "short_of": "price"})


def never_placeable(job: QueuedJob, why: str = "", short_of: str = "nodes") -> Verdict:
    """No node pool can hold ``job`` as the fleet is now, even once its work ends: it waits for the fleet to change (a
    cordoned node back, an unreachable cluster healthy again, a new pool), without blocking its team. ``short_of``:
    what keeps it out (``room.Room.fleet_reason``: placement, health, cordon or nodes), in the detail."""
    message = (f"Asks {_shape(job)}, which no node pool can hold as the fleet is now"
               + (f": {why}" if why else "") + ". It waits for the fleet to change and does not hold up the team's "
               "other jobs.")
    return Verdict(False, "capacity", message,
                   {"request_gpus": job.total_gpus, "free_gpus_by_pool": {}, "never_placeable": True,
                    "fleet_change": True, "short_of": short_of})


def unhealthy_nodes(request, pools: list[PoolOffer], shown: int = 5) -> str:
    """A sentence naming the nodes of ``pools`` large enough for one node of ``request`` (a ``PlacementRequest``)
    that are left out because they are unhealthy (``NodeRoom.healthy``), "" when none is."""
    names = [f"{o.label}/{n.name}" for o in pools for n in o.node_rooms if not n.healthy and request.holds(n)]
    if not names:
        return ""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (f"{len(names)} large enough node{'s are' if len(names) != 1 else ' is'} unhealthy and left out "
            f"(GPU errors or attempts lost there): {', '.join(names[:shown])}{more}")


def _gib(mib: int) -> str:
    """Memory MiB as GiB for messages: ``131072`` -> ``128``, ``1536`` -> ``1.5``."""
    return f"{mib / 1024:g}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _of_needed(count: int, need: int) -> str:
    """``1 of the 2 nodes needed has`` / ``0 of the 2 nodes needed have``, for messages."""
    return f"{count} of the {need} nodes needed {'has' if count == 1 else 'have'}"


def needs_phrase(job: QueuedJob) -> str:
    """What one node of ``job`` needs free, for messages: ``2 nodes with 8 GPUs, 32 vCPU and 128 GiB free`` (a
    CPU-only job names only vCPU and GiB; a job whose pods may share a node says pods)."""
    asks = [_plural(job.gpus_per_node, "GPU")] if job.gpus_per_node else []
    if job.cpu_milli:
        asks.append(f"{_vcpus(job.cpu_milli)} vCPU")
    if job.memory_mib:
        asks.append(f"{_gib(job.memory_mib)} GiB")
    what = " and ".join([", ".join(asks[:-1]), asks[-1]] if len(asks) > 1 else asks) or "room"
    unit = "pod" if job.share_nodes else "node"
    return f"{_plural(job.nodes, unit)} with {what} free" + (" each" if job.share_nodes and job.nodes > 1 else "")


def short_resource(job: QueuedJob, with_gpus: int, with_cpu: int, with_room: int, most_cpu_milli: int,
                   most_memory_mib: int) -> tuple[str, str]:
    """Which resource of one pool keeps ``job`` waiting, and a sentence with the numbers: ``("gpu" | "cpu" |
    "memory" | "nodes", text)``. The counts are the pool's schedulable nodes with room now for one node of the job
    (``NodeBook.room_by_resource``): ``with_gpus`` with its GPUs free, ``with_cpu`` of those also its CPU,
    ``with_room`` of those also its memory; ``most_cpu_milli`` / ``most_memory_mib``: the most CPU (millicores) /
    memory (MiB) free on a node short of it only. A CPU-only job is told in vCPU and GiB alone."""
    need = job.nodes
    gpu = job.gpus_per_node > 0
    if gpu and with_gpus < need:
        return "gpu", f"{_of_needed(with_gpus, need)} {_plural(job.gpus_per_node, 'GPU')} free"
    have = f"{_plural(with_gpus, 'node')} {'has' if with_gpus == 1 else 'have'} the GPUs" if gpu else \
        f"{_plural(with_gpus, 'schedulable node')}"
    if with_cpu < need:
        tail = (f" but only {with_cpu} of them {'has' if with_cpu == 1 else 'have'} {_vcpus(job.cpu_milli)} vCPU free "
                f"(the others at most {_vcpus(most_cpu_milli)} vCPU)" if with_cpu else
                f" but only {_vcpus(most_cpu_milli)} vCPU free at most")
        return "cpu", have + tail
    if with_room < need:
        tail = (f" and CPU but only {with_room} of them {'has' if with_room == 1 else 'have'} "
                f"{_gib(job.memory_mib)} GiB free (the others at most {_gib(most_memory_mib)} GiB)" if with_room else
                f" and CPU but only {_gib(most_memory_mib)} GiB memory free at most")
        if not gpu:
            tail = tail.replace(" and CPU", " with the vCPU", 1)
        return "memory", have + tail
    return "nodes", f"{_of_needed(with_room, need)} room"


def no_room(job: QueuedJob, pools: list[PoolOffer], free: dict[int, int], most_free: dict[int, int] | None = None,
            with_room: dict[int, int] | None = None, unhealthy: str = "",
            resources: dict[int, tuple[int, int, int, int, int]] | None = None) -> Verdict:
    """Pools match ``job`` but none has ``job.nodes`` nodes with room now. ``free``: free GPUs by node pool id;
    ``most_free``: the most free GPUs on one node, ``with_room``: nodes with room for one node of the job, by id
    (for the pools named in the message, the first three: the detail gives ``most_free`` for those only);
    ``resources``: ``NodeBook.room_by_resource`` by id for those pools, which name the resource that is short (GPU,
    CPU, memory or whole nodes: ``short_resource``); ``unhealthy``: the sentence of ``unhealthy_nodes`` over the
    pools allowed to it, added to the message.

    The detail keeps ``free_gpus_by_pool`` and ``most_free_gpus_on_a_node_by_pool`` and adds ``short_of`` (the
    first pool's short resource), ``request_vcpu_per_node``, ``request_gib_per_node`` and ``pools``: per pool named,
    its label, ``short_of``, free GPUs and the node counts."""
    most_free = most_free or {}
    with_room = with_room or {}
    resources = resources or {}
    parts, shown, kinds = [], [], []
    for o in pools[:3]:
        pid = o.node_pool_id
        counts = resources.get(pid)
        if counts is None:  # no per-resource numbers: the nodes with room for one node of the job
            n = with_room.get(pid, 0)
            counts = (n, n, n, 0, 0)
        kind, sentence = short_resource(job, *counts)
        kinds.append(kind)
        gpus = (f"{_plural(free[pid], 'GPU')} free, at most {most_free.get(pid, 0)} on one node; "
                if job.gpus_per_node else "")
        parts.append(f"{o.label}: {gpus}{sentence}")
        shown.append({"pool": o.label, "short_of": kind, "free_gpus": free[pid],
                      "nodes_with_gpus": counts[0], "nodes_with_cpu": counts[1], "nodes_with_room": counts[2],
                      "most_free_vcpu_when_short": _vcpus(counts[3]),
                      "most_free_gib_when_short": float(_gib(counts[4]))})
    more = f" and {len(pools) - 3} more pools" if len(pools) > 3 else ""
    message = (f"Needs {needs_phrase(job)} ({_shape(job)}); no matching node pool has them now "
               f"({'; '.join(parts)}{more}). It waits for running work to end"
               + (f"; {unhealthy}." if unhealthy else "."))
    return Verdict(False, "capacity", message,
                   {"request_gpus": job.total_gpus, "nodes": job.nodes, "gpus_per_node": job.gpus_per_node,
                    "request_vcpu_per_node": _vcpus(job.cpu_milli), "request_gib_per_node": float(_gib(job.memory_mib)),
                    "short_of": kinds[0] if kinds else "nodes", "pools": shown,
                    "free_gpus_by_pool": {str(o.node_pool_id): free[o.node_pool_id] for o in pools},
                    "most_free_gpus_on_a_node_by_pool": {str(pid): n for pid, n in most_free.items()}})


# --- budgets ----------------------------------------------------------------------------------------------

def check_budgets(estimate_usd: Decimal, budgets: list[BudgetView]) -> Verdict:
    """Admit unless a ``block`` budget's remaining money (amount - spent - committed) is below ``estimate_usd``.

    ``alert`` budgets never stop admission. An estimate above a block
    budget's whole amount can never fit: ``never`` is set.
    """
    for b in budgets:
        if b.action != "block" or estimate_usd <= b.remaining_usd:
            continue
        detail = {"budget_id": b.budget_id, "estimate_usd": str(estimate_usd), "amount_usd": str(b.amount_usd),
                  "spent_usd": str(b.spent_usd), "committed_usd": str(b.committed_usd), "remaining_usd": str(b.remaining_usd)}
        never = estimate_usd > b.amount_usd
        msg = (f"estimated ${estimate_usd:.2f} is over the whole budget of ${b.amount_usd:.2f}" if never else
               f"estimated ${estimate_usd:.2f} is over the ${max(b.remaining_usd, Decimal(0)):.2f} left in the budget")
        return Verdict(False, "budget", msg, detail, never=never)
    return OK


def budget_never(cheapest_estimate_usd: Decimal, budgets: list[BudgetView]) -> Verdict | None:
    """The verdict that rejects a job for good whose cheapest estimate is over a whole ``block`` budget, or None."""
    for b in budgets:
        if b.action == "block" and cheapest_estimate_usd > b.amount_usd:
            return dataclasses.replace(check_budgets(cheapest_estimate_usd, [b]), never=True)
    return None


# --- overtaking -------------------------------------------------------------------------------------------

def size_phrase(job: QueuedJob) -> str:
    """A job's size for messages: ``1 GPU``, ``16 GPUs``, or for a CPU-only job ``4 vCPU`` (all its pods)."""
    if job.cpu_only:
        return f"{_vcpus(job.total_cpu_milli)} vCPU"
    return _plural(shown_gpus(job.quota_gpus), "GPU")


def overtaken_note(job: QueuedJob, reason: str, by: list[QueuedJob]) -> tuple[list[dict], str]:
    """Why jobs ``by`` (admitted by the pass, later than ``job`` in the queue's order) went ahead of ``job``, which
    waits for ``reason`` (``capacity``, ``quota``, ``budget``): ``([{"job_id", "team_id", "gpus", "vcpu"}...],
    "Job 12 (1 GPU) was admitted ahead because it fits now; this job needs 2 nodes with 8 GPUs free.")``. Raises
    ValueError when ``by`` is empty."""
    if not by:
        raise ValueError("no job was admitted ahead")
    rows = [{"job_id": j.job_id, "team_id": j.team_id, "gpus": shown_gpus(j.quota_gpus), "vcpu": _vcpus(j.total_cpu_milli)}
            for j in by]
    names = [f"{j.job_id} ({size_phrase(j)})" for j in by]
    who = (f"Job {names[0]} was" if len(names) == 1 else
           f"Jobs {', '.join(names[:-1])} and {names[-1]} were")
    fits = "it fits" if len(names) == 1 else "they fit"
    needs = {"capacity": f"this job needs {needs_phrase(job)}",
             "quota": "this job waits for its team's quota (or its cohort's) to have room",
             "budget": "this job waits for room in its team's budget"}.get(reason, f"this job waits ({reason})")
    return rows, f"{who} admitted ahead because {fits} now; {needs}."


def budget_refusal(cheapest_estimate_usd: Decimal, budgets: list[BudgetView]) -> Verdict | None:
    """The verdict that refuses a submission its ``block`` budgets can never cover, or None (ADR 0036).

    ``cheapest_estimate_usd``: the job's lowest estimate over every pool that could hold it (USD). Refused when it
    is over a block budget's whole amount, or over what the budget can still give in its period (amount - spent:
    money the ledger has spent does not come back before the period ends). Money committed to running jobs is
    not counted: it comes back when they end, so a job that fits once they end waits (``check_budgets``).
    ``detail``: the budget's id and the numbers (USD strings), with ``can_give_usd`` = amount - spent.
    """
    for b in budgets:
        if b.action != "block":
            continue
        can_give = b.amount_usd - b.spent_usd
        if cheapest_estimate_usd <= can_give and cheapest_estimate_usd <= b.amount_usd:
            continue
        whole = cheapest_estimate_usd > b.amount_usd
        detail = {"budget_id": b.budget_id, "estimate_usd": str(cheapest_estimate_usd),
                  "amount_usd": str(b.amount_usd), "spent_usd": str(b.spent_usd),
                  "can_give_usd": str(max(can_give, Decimal(0)))}
        message = (f"estimated ${cheapest_estimate_usd:.2f} is over the whole budget of ${b.amount_usd:.2f}" if whole
                   else f"estimated ${cheapest_estimate_usd:.2f} is over the ${max(can_give, Decimal(0)):.2f} the "
                        f"budget can still give this period (${b.amount_usd:.2f}, ${b.spent_usd:.2f} spent)")
        return Verdict(False, "budget", message, detail, never=True)
    return None
