"""Requests that can never run, refused at submission (400) with the reason: no node of the accelerator is large
enough (GPUs, CPU or memory per node), no pool has enough such nodes, every cluster the job may use caps the team
below it, or it is over the team's per-job cap or limit (the limit it can reach: nominal + what its cohort can lend;
for a CPU-only job the team's CPU quota in vCPUs, when it has one).
A team with no quota at all for the accelerator (no team-wide quota row, or one that reaches no GPU: nominal 0 and
nothing to borrow) is refused on ``accelerator``, the field to change; the scheduling pass still rejects a job whose
quota was removed after it was submitted (``core.rules.check_quota``).

"Never" is judged on the whole fleet as synced (cordoned nodes and unhealthy clusters included: those are fleet
changes a job waits for) and on the quota rows; the scheduler's rules decide everything that depends on what runs
now. Reads are cached per process (``core.lookups``), invalidated when nodes, pools, clusters or quotas change.
"""

from __future__ import annotations

from collections import Counter

from core.lookups import LookupCache
from quotas.models import Quota, Team
from runners.models import Accelerator, Cluster, Node, NodePool

from .core import UNLIMITED, PlacementRequest, holds_share, pods_held
from .snapshot import per_node_request, pods_of

FLEET = LookupCache("never-fleet").invalidate_on(Node, NodePool, Cluster)
QUOTAS = LookupCache("never-quotas").invalidate_on(Quota, Team)


def fleet_shape(accelerator_id: int) -> list[tuple[int, str, str, str, str, list[tuple[int, int, int]]]]:
    """The accelerator's pools with nodes: ``(cluster id, cluster name, provider, region, capacity type, nodes)``,
    each node ``(GPUs, CPU millicores, memory MiB)`` allocatable; a pool without node rows is ``nodes`` nodes of its
    GPUs per node without CPU or memory limits."""
    def load():
        pools = list(NodePool.objects.filter(accelerator_id=accelerator_id, nodes__gt=0).select_related("cluster"))
        by_pool: dict[int, list[tuple[int, int, int]]] = {}
        for pid, g, c, m in Node.objects.filter(node_pool__in=pools).values_list("node_pool_id", "gpus", "cpu_milli",
                                                                                  "memory_mib"):
            by_pool.setdefault(pid, []).append((g, c, m))
        return [(p.cluster_id, p.cluster.name, p.cluster.provider, p.cluster.region, p.capacity_type,
                 by_pool.get(p.pk) or [(p.gpus_per_node, UNLIMITED, UNLIMITED)] * p.nodes) for p in pools]
    return FLEET.get(accelerator_id, load)


def shared_fleet(accelerator_id: int) -> list[tuple[str, str, str, str, int, tuple[tuple[str, int], ...], int, int]]:
    """The accelerator's synced nodes that share their GPUs (ADR 0040), in pools with nodes: ``(cluster name,
    provider, region, capacity type, GPUs shared by time-slicing or MPS (0 on a MIG node), MIG devices by profile,
    CPU millicores, memory MiB)``."""
    def load():
        rows = (Node.objects.filter(node_pool__accelerator_id=accelerator_id, node_pool__nodes__gt=0)
                .exclude(gpu_sharing="none")
                .values_list("cluster__name", "cluster__provider", "cluster__region", "node_pool__capacity_type",
                             "gpu_sharing", "gpus", "mig_devices", "cpu_milli", "memory_mib"))
        return [(c, pr, r, ct, g if mode in ("time-slicing", "mps") else 0,
                 tuple(sorted((k, int(v)) for k, v in (mig or {}).items())), cpu, mem)
                for c, pr, r, ct, mode, g, mig, cpu, mem in rows]
    return FLEET.get(("shared", accelerator_id), load)


def _share_errors(accelerator: Accelerator, request: PlacementRequest, placement: dict,
                  preemptible: bool) -> dict[str, list[str]]:
    """Why a job on part of one GPU (``request.shared``) can never run: no node of the accelerator it may use
    shares GPUs as it asks (time-slicing or MPS for a fraction, a device of its profile for a MIG job) with its CPU
    and memory (``holds_share``, as placement counts it); empty when one could."""
    nodes = [x for x in shared_fleet(accelerator.pk)
             if (preemptible or x[3] != "spot") and (not placement.get("providers") or x[1] in placement["providers"])
             and (not placement.get("regions") or x[2] in placement["regions"])
             and (not placement.get("clusters") or x[0] in placement["clusters"])]
    if any(holds_share(request, x[4], x[5], x[6], x[7]) for x in nodes):
        return {}
    name = accelerator.name
    if request.mig_profile:
        return {"mig_profile": [f"no {name} node the job may use offers MIG devices of profile {request.mig_profile} "
                                f"(with its CPU and memory), so the job could never run"]}
    return {"gpus_per_node": [f"a fraction of a GPU runs on a node that shares its GPUs (time-slicing or MPS), and "
                              f"no {name} node the job may use does (with its CPU and memory), so the job could "
                              f"never run; ask for whole GPUs"]}


def _team_quotas(team_id: int, accelerator_id: int) -> tuple[Quota | None, int | None, dict[int, int]]:
    """(team-wide quota row or None, its reachable GPUs, caps by cluster id: nominal + borrowing of each cluster row)."""
    def load():
        rows = list(Quota.objects.filter(team_id=team_id, accelerator_id=accelerator_id).select_related("accelerator"))
        wide = next((q for q in rows if q.cluster_id is None), None)
        return wide, (wide.reachable_gpus() if wide else None), {q.cluster_id: q.limit_gpus for q in rows if q.cluster_id}
    return QUOTAS.get((team_id, accelerator_id), load)


def never_fits(team: Team, accelerator: Accelerator, resources: dict, placement: dict | None,
               preemptible: bool, replicas: int = 1, kind: str = "training") -> dict[str, list[str]]:
    """Why a job can never run on ``accelerator``, by ``spec.resources`` field (``""``: the resources as a whole;
    ``"replicas"``: the serving replicas, ``spec.replicas``; ``"preemptible"``: ``spec.preemptible``, when every pool
    it may use is spot and the job is not preemptible); empty when it could. ``resources``: validated
    ``gpus_per_node``, ``nodes``, optional ``cpu`` (cores) and ``memory_gib`` (GiB) per node; ``placement``:
    allowed ``providers``, ``regions``, ``clusters`` (empty: any); ``replicas``: the serving replicas (each
    ``nodes`` pods); ``kind``: ``training`` or ``inference``.

    Class of failure: "accepted but never placeable". Invariant: a job accepted here is placeable on some pool
    of the fleet as it stands when empty, and one no pool could ever hold is refused here. The pods are counted
    as placement counts them (``snapshot.pods_of``: an inference job's replicas may share a node) and a pool's
    room for them with placement's own function (``core.pods_held``), so the two cannot disagree (ADR 0019)."""
    g, n = resources["gpus_per_node"], resources["nodes"]
    cpu, memory = per_node_request(resources)
    pods, share = pods_of(kind, n, replicas)
    request = PlacementRequest(pods, g, preemptible, cpu_milli=cpu, memory_mib=memory, share_nodes=share,
                               share_milli=int(resources.get("share_milli") or 0),
                               mig_profile=resources.get("mig_profile") or "")
    placement = placement or {}
    pools = [p for p in fleet_shape(accelerator.pk)
             if (preemptible or p[4] != "spot") and (not placement.get("providers") or p[2] in placement["providers"])
             and (not placement.get("regions") or p[3] in placement["regions"])
             and (not placement.get("clusters") or p[1] in placement["clusters"])]
    errors: dict[str, list[str]] = {}
    name = accelerator.name
    no_quota = _no_quota_error(team, accelerator, n, g)
    if no_quota:
        return {"accelerator": [no_quota]}
    nodes = [node for p in pools for node in p[5]]
    if request.shared and pools:
        errors = _share_errors(accelerator, request, placement, preemptible)
        nodes = []  # a share is placed on shared nodes only: the whole-GPU counts below do not apply
    if not pools and not preemptible:
        constrained = [p for p in fleet_shape(accelerator.pk)
                       if (not placement.get("providers") or p[2] in placement["providers"])
                       and (not placement.get("regions") or p[3] in placement["regions"])
                       and (not placement.get("clusters") or p[1] in placement["clusters"])]
        if constrained:  # the fleet has pools for it, all of them spot: it would wait for ever
            return {"preemptible": [f"every {name} node pool the job may use is spot capacity, which takes preemptible "
                                    f"jobs only; set preemptible to true (it may then be reclaimed and resumed) or "
                                    f"ask for an accelerator with on-demand capacity"]}
    if nodes:  # no allowed pool at all: it waits for one (a fleet change), not a refusal
        big = [x for x in nodes if x[0] >= g]
        with_gpus = f" with {g} GPUs" if g else ""  # a CPU-only job: any node of a CPU pool
        if not big:  # the pools say more GPUs per node than their synced nodes have allocatable
            errors["gpus_per_node"] = [f"{g} GPUs per node is more than any {name} node has allocatable; the most "
                                       f"is {max(x[0] for x in nodes)}"]
        elif not any(x[1] >= cpu for x in big):
            errors["cpu"] = [f"{cpu / 1000:g} CPU cores per node is more than any {name} node{with_gpus} has; "
                             f"the most is {max(x[1] for x in big) / 1000:g}"]
        elif big and not any(x[1] >= cpu and x[2] >= memory for x in big):
            most = max(x[2] for x in big if x[1] >= cpu)
            errors["memory_gib"] = [f"{memory / 1024:g} GiB per node is more than any {name} node{with_gpus} "
                                    f"and {cpu / 1000:g} CPU cores has; the most is {most / 1024:g} GiB"]
        elif big:
            counts = [pods_held(request, [(*shape, k) for shape, k in Counter(p[5]).items()]) for p in pools]
            if max(counts) < pods and share and replicas > 1:
                errors["replicas"] = [f"{replicas} replicas of {n} x {g} GPUs ({pods} pods) is more than any {name} "
                                      f"node pool can hold, with replicas sharing nodes; the largest holds "
                                      f"{max(counts)} such pods"]
            elif max(counts) < pods:
                errors["nodes"] = [f"{n} nodes is more than any {name} node pool has that can hold a node of this "
                                   f"job; the largest has {max(counts)}"]
            else:
                capped = _capped_everywhere(team, accelerator, pools, counts, pods * g, pods)
                if capped:
                    errors[""] = [capped]
    if not errors:
        limit = (_cpu_limit_error(team, accelerator, pods, cpu) if g == 0
                 else _limit_error(team, accelerator, pods * g, pods, g))
        if limit:
            errors[""] = [limit]
    return errors


def gang_never_fits(team: Team, accelerator: Accelerator, roles: list[tuple[str, dict]],
                    placement: dict | None) -> str:
    """Why a multi-role job's ``roles`` (``(name, resources)`` pairs, each validated ``resources`` as
    ``never_fits`` reads them, each of which passed ``never_fits`` alone) can never run together on
    ``accelerator``, or "". Admission takes every role at once on one pool and counts their sum against the
    team's quota (ADR 0039), so the roles are refused together when:

    - their GPUs together are over the team's per-job cap or over what it can ever reach of its quota
      (``Quota.reachable_gpus``: nominal + what its cohort can lend), or
    - their GPUs, CPU or memory together are more than any pool the job may use (non-spot: a multi-role job is
      not preemptible) has allocatable in all its nodes, so no pool could hold them even empty.

    The second is a necessary condition only: roles within every total that no packing of their pods onto
    distinct nodes fits still wait, as placement's greedy fit decides, their queue reason naming the role."""
    total_gpus = sum(r["gpus_per_node"] * r["nodes"] for _, r in roles)
    asks = (f"the roles ask {total_gpus} {accelerator.name} GPUs together ("
            + ", ".join(f"{name} {r['nodes']} x {r['gpus_per_node']}" for name, r in roles) + ")")
    wide, reachable, _ = _team_quotas(team.pk, accelerator.pk)
    if total_gpus and wide is not None:
        if wide.max_gpus_per_job and total_gpus > wide.max_gpus_per_job:
            return f"{asks}, over team {team.slug}'s per-job cap of {wide.max_gpus_per_job}"
        if total_gpus > reachable:
            return (f"{asks}, over the {reachable} team {team.slug} can reach of its quota: admitted together or "
                    f"not at all, they could never run")
    placement = placement or {}
    pools = [p for p in fleet_shape(accelerator.pk) if p[4] != "spot"
             and (not placement.get("providers") or p[2] in placement["providers"])
             and (not placement.get("regions") or p[3] in placement["regions"])
             and (not placement.get("clusters") or p[1] in placement["clusters"])]
    if not pools:
        return ""  # no pool it may use: it waits for one (a fleet change), as a single-role job does
    demand = [0, 0, 0]
    for _, r in roles:
        cpu, memory = per_node_request(r)
        for i, amount in enumerate((r["gpus_per_node"], cpu, memory)):
            demand[i] += amount * r["nodes"]
    room = [[sum(node[i] for node in p[5]) for i in range(3)] for p in pools]
    if any(all(demand[i] <= r[i] for i in range(3)) for r in room):
        return ""
    if not any(demand[0] <= r[0] for r in room):
        return (f"{asks}, more than any node pool the job may use has (the largest has {max(r[0] for r in room)}): "
                f"admitted together or not at all, they could never run")
    return (f"the roles ask {demand[1] / 1000:g} CPU cores and {demand[2] / 1024:g} GiB together, more than any "
            f"{accelerator.name} node pool the job may use with room for their GPUs has: admitted together or not "
            f"at all, they could never run")


def _cpu_limit_error(team: Team, accelerator: Accelerator, pods: int, cpu_milli: int) -> str:
    """The reason when a CPU-only job of ``pods`` pods of ``cpu_milli`` millicores each asks more vCPUs than the
    team's CPU quota lets it ever hold (its per-job cap, or nominal + what it can borrow from its cohort:
    ``Quota.reachable_vcpus``), else "". Without a CPU quota the team runs CPU-only jobs quota-free: ""."""
    wide, _, _ = _team_quotas(team.pk, accelerator.pk)
    if wide is None or not wide.is_cpu:
        return ""
    asks = pods * cpu_milli / 1000
    if wide.max_vcpus_per_job and asks > wide.max_vcpus_per_job:
        return (f"the job asks {asks:g} vCPUs ({pods} pods x {cpu_milli / 1000:g}), over team {team.slug}'s per-job "
                f"cap of {wide.max_vcpus_per_job} vCPUs")
    reachable = _reachable_vcpus(team.pk, accelerator.pk)
    if asks > reachable:
        how = (f"nominal {wide.nominal_vcpus} + {reachable - wide.nominal_vcpus} its cohort can lend; its borrowing "
               f"limit is {wide.borrowing_limit_vcpus}" if reachable < wide.limit_vcpus
               else f"nominal {wide.nominal_vcpus} + borrowing limit {wide.borrowing_limit_vcpus}")
        return (f"the job asks {asks:g} vCPUs ({pods} pods x {cpu_milli / 1000:g}), over the {reachable} vCPUs of "
                f"CPU quota team {team.slug} can reach ({how})")
    return ""


def _reachable_vcpus(team_id: int, accelerator_id: int) -> int:
    """The team-wide CPU quota's ``reachable_vcpus`` (cached with the quota rows)."""
    def load():
        wide = Quota.objects.filter(team_id=team_id, accelerator_id=accelerator_id, cluster__isnull=True).first()
        return wide.reachable_vcpus() if wide is not None else 0
    return QUOTAS.get(("vcpus", team_id, accelerator_id), load)


def _capped_everywhere(team: Team, accelerator: Accelerator, pools, counts, total: int, pods: int) -> str:
    """The reason when every cluster with a pool that could hold the job's ``pods`` pods (``counts``: pods each of
    ``pools`` holds) caps the team below ``total`` GPUs, else ""."""
    _, _, caps = _team_quotas(team.pk, accelerator.pk)
    if not caps:
        return ""
    usable = {p[0]: p[1] for p, c in zip(pools, counts, strict=True) if c >= pods}
    if not usable or any(caps.get(cid, total) >= total for cid in usable):
        return ""
    listed = ", ".join(f"{usable[cid]} {caps[cid]}" for cid in sorted(usable, key=usable.get))
    return (f"the job asks {total} {accelerator.name} GPUs, over the team's per-cluster quota on every cluster "
            f"that could hold it ({listed})")


def _no_quota_error(team: Team, accelerator: Accelerator, n: int, g: int) -> str:
    """The reason when the team can never hold any GPU of ``accelerator`` (no team-wide quota row, which admission
    needs, or one whose reachable GPUs are 0: no nominal and nothing it may borrow), else "". A CPU-only job
    (``g`` 0) needs no GPU quota."""
    if g == 0:
        return ""
    wide, reachable, caps = _team_quotas(team.pk, accelerator.pk)
    asks = f"so a job of {n * g} GPUs ({n} x {g}) could never run"
    if wide is None:
        only = " (its per-cluster quotas need a team-wide one)" if caps else ""
        return (f"team {team.slug} has no quota for {accelerator.name} GPUs{only}: no nominal quota and nothing to "
                f"borrow, {asks}")
    if reachable <= 0:
        why = (f"its borrowing limit is {wide.borrowing_limit_gpus} but its cohort lends none"
               if wide.borrowing_limit_gpus else "borrowing limit 0")
        return f"team {team.slug} can reach no {accelerator.name} GPUs (nominal {wide.nominal_gpus}, {why}), {asks}"
    return ""


def _limit_error(team: Team, accelerator: Accelerator, total: int, n: int, g: int) -> str:
    """The reason when ``total`` GPUs are over what the team can ever hold of ``accelerator`` (which it has a
    quota of: ``_no_quota_error``), else ""."""
    wide, reachable, _ = _team_quotas(team.pk, accelerator.pk)
    if wide is None:
        return ""
    if wide.max_gpus_per_job and total > wide.max_gpus_per_job:
        return (f"the job asks {total} GPUs ({n} x {g}), over team {team.slug}'s per-job cap of "
                f"{wide.max_gpus_per_job} {accelerator.name} GPUs")
    if total > reachable:
        lent = reachable - wide.nominal_gpus
        how = (f"nominal {wide.nominal_gpus} + {lent} its cohort can lend; its borrowing limit is "
               f"{wide.borrowing_limit_gpus}" if reachable < wide.limit_gpus
               else f"nominal {wide.nominal_gpus} + borrowing limit {wide.borrowing_limit_gpus}")
        return (f"the job asks {total} GPUs ({n} x {g}), over the {reachable} {accelerator.name} GPUs team "
                f"{team.slug} can reach ({how})")
    return ""
