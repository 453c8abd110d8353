"""Node pools as admission sees them: each node's free GPUs, CPU and memory now, and the price in force.

The one ``pool_offers``: a pass's snapshot, the locked re-check of an
admission, the submission preview and the clusters page all read offers
from here; which price rows apply to a pool is ``costs.catalog``'s.

A node's free resources are its allocatable ones (the last node sync)
minus the requests of pods the platform does not own on it (same sync)
minus what the live attempts placed on it hold (``JobAttempt.placement``),
so an admission counts at once, before any pod exists. A pool without
node rows (registered by hand, not synced yet) is ``nodes`` identical
nodes without CPU or memory limits, its live attempts packed onto the
first ones.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db.models import Sum

from core.gpus import MILLI_PER_GPU
from costs.catalog import NoPrice, prices_by_pool, rates_at
from costs.models import Price
from runners.base import MULTI_ROLE_BACKENDS
from runners.models import Cluster, Node, NodePool

from ..models import JobAttempt
from .core import NodeRoom, PoolOffer

log = logging.getLogger(__name__)


def pool_offers(accelerator_id: int, now: dt.datetime, lock: bool,
                unpriced: list[PoolOffer] | None = None) -> list[PoolOffer]:
    """Every node pool of the accelerator with its free GPUs and the price in force at ``now`` (USD/GPU-hour),
    in pool id order; the pool rows are locked FOR UPDATE (in that order) if ``lock``.

    A pool without a price in force is left out (logged): admission never
    places a job at an unknown price. Given a list as ``unpriced``, those
    pools are appended to it (``usd_per_gpu_hour`` None), for wait reasons.
    """
    pools = NodePool.objects.filter(accelerator_id=accelerator_id).select_related("cluster").order_by("pk")
    if lock:
        pools = pools.select_for_update(of=("self",))
    pools = list(pools)
    in_use = dict(
        JobAttempt.objects.filter(node_pool__in=pools, ended_at__isnull=True)
        .values_list("node_pool_id")
        .annotate(n=Sum("gpus"))
    )
    rooms = node_rooms(pools)
    prices = prices_by_pool(pools, Price.objects.filter(accelerator_id=accelerator_id, effective_from__lte=now))
    offers = []
    for pool in pools:
        try:
            price, per_vcpu, per_gib = rates_at(pool, now, prices[pool.pk])
        except NoPrice:
            log.warning("node pool %s has no price in force; not offered", pool)
            price = per_vcpu = per_gib = None
        (offers if price is not None else unpriced if unpriced is not None else []).append(kept_offer(
            PoolOffer(
                node_pool_id=pool.pk, cluster_id=pool.cluster_id, cluster_name=pool.cluster.name,
                provider=pool.cluster.provider, region=pool.cluster.region, capacity_type=pool.capacity_type,
                nodes=pool.nodes, gpus_per_node=pool.gpus_per_node,
                free_gpus=(sum(r.free_gpus for r in rooms[pool.pk] if r.takes_work) if pool.pk in rooms
                           else pool.capacity_gpus - in_use.get(pool.pk, 0)),
                usd_per_gpu_hour=price, healthy=pool.cluster.health == Cluster.Health.HEALTHY,
                node_rooms=rooms.get(pool.pk, ()), name=pool.name, usd_per_vcpu_hour=per_vcpu,
                usd_per_gib_hour=per_gib, multi_role=pool.cluster.backend in MULTI_ROLE_BACKENDS,
            )
        ))
    return offers


#: Per process: node pool id -> the offer ``pool_offers`` last made of it (``kept_offer``).
KEPT_OFFERS: dict[int, PoolOffer] = {}


def kept_offer(offer: PoolOffer) -> PoolOffer:
    """The offer last made of ``offer``'s pool when it is equal to ``offer`` in every field (each node's free and
    allocatable resources, health and cordon, the cluster's health, prices to the digit), else ``offer``, kept for
    the next read. A pool whose nodes, live attempts, cluster and prices did not change since the last read is thus
    the same object, with what earlier passes kept with it (``PoolOffer.derived``: its nodes' layout, its room for a
    shape, the pools matching a request): a pass over an unchanged fleet lays out and matches nothing again. An
    offer is frozen and equal in every field read, so what was kept with it is what would be computed afresh;
    ``tests/jobs/scheduling/core/test_kept_offers.py`` compares the decisions of both through inventory changes.
    The comparison reads every node once (about 0.3 us each), far below the query that read them."""
    kept = KEPT_OFFERS.get(offer.node_pool_id)
    if kept is not None and kept == offer and list(map(str, kept.prices)) == list(map(str, offer.prices)):
        return kept  # equal prices of other digits (4.2, 4.20) would print otherwise: kept only when alike
    KEPT_OFFERS[offer.node_pool_id] = offer
    return offer


def node_rooms(pools: list[NodePool]) -> dict[int, tuple[NodeRoom, ...]]:
    """By pool id, the nodes of each of ``pools`` that has Node rows, with what is free on each now (see the module
    docstring); two queries. A live attempt without recorded nodes is packed onto the pool's fullest nodes. A node
    cordoned by staff is not schedulable; an unhealthy one (``runners.health``) is not healthy: neither takes work.
    A suspect one takes work, tried after the pool's other nodes (``NodeRoom.suspect``)."""
    nodes: dict[int, list[Node]] = {}
    for n in Node.objects.filter(node_pool__in=pools).order_by("node_pool_id", "name"):
        nodes.setdefault(n.node_pool_id, []).append(n)
    if not nodes:
        return {}
    free = {pid: {n.name: [whole_gpus(n) - (n.foreign_gpus if whole_gpus(n) else 0),
                           n.cpu_milli - n.foreign_cpu_milli, n.memory_mib - n.foreign_memory_mib] for n in lst}
            for pid, lst in nodes.items()}
    shared = {pid: {n.name: shared_room(n) for n in lst if n.gpu_sharing != "none"} for pid, lst in nodes.items()}
    for pid, gpus, placement in (JobAttempt.objects.filter(node_pool_id__in=list(nodes), ended_at__isnull=True)
                                 .order_by("pk").values_list("node_pool_id", "gpus", "placement")):
        on = free[pid]
        names = (placement or {}).get("nodes") or []
        if names and (placement.get("share_milli") or placement.get("mig_profile")):  # part of one GPU
            for name in names:
                if name in on:
                    on[name][1] -= int(placement.get("cpu_milli") or 0)
                    on[name][2] -= int(placement.get("memory_mib") or 0)
                if name in shared[pid]:
                    book_share(shared[pid][name], int(placement.get("share_milli") or 0),
                               str(placement.get("mig_profile") or ""), placement.get("gpu"))
            continue
        if names and placement.get("roles"):  # a multi-role attempt: each role's pods with their own shape
            for role in placement["roles"].values():
                for name in role.get("nodes") or ():
                    if name in on:
                        on[name][0] -= int(role.get("gpus_per_node") or 0)
                        on[name][1] -= int(role.get("cpu_milli") or 0)
                        on[name][2] -= int(role.get("memory_mib") or 0)
            continue
        if names:
            for name in names:
                if name in on:
                    on[name][0] -= int(placement.get("gpus_per_node") or 0)
                    on[name][1] -= int(placement.get("cpu_milli") or 0)
                    on[name][2] -= int(placement.get("memory_mib") or 0)
            continue
        for left in on.values():  # not recorded: its GPUs fill the first nodes
            take = min(gpus, max(left[0], 0))
            left[0] -= take
            gpus -= take
    return {pid: tuple(NodeRoom(n.name, whole_gpus(n), free[pid][n.name][0], n.cpu_milli, free[pid][n.name][1],
                                n.memory_mib, free[pid][n.name][2], n.topology_domain, n.schedulable and not n.cordoned,
                                n.health != Node.Health.UNHEALTHY, n.health == Node.Health.SUSPECT,
                                *_shared_fields(shared[pid].get(n.name))) for n in lst)
            for pid, lst in nodes.items()}


def whole_gpus(node: Node) -> int:
    """GPUs of ``node`` (a Node row) a pod can hold alone: ``Node.whole_gpus``, or all of them when null."""
    return node.gpus if node.whole_gpus is None else node.whole_gpus


def shared_room(node: Node) -> dict:
    """What a node that shares its GPUs offers shares of before the platform's attempts (ADR 0040): ``shares``,
    free milli-GPUs of each physical GPU, and ``slices``, free replicas of each, on a time-sliced or MPS node
    (each of ``gpu_replicas`` replicas of a GPU worth ``1000 // replicas``), less the slices pods the platform
    does not own ask, laid on the GPUs in order (the device plugin does not say which it gave); ``mig``, free
    devices by profile on a MIG node, less the devices those pods ask."""
    if node.gpu_sharing in ("time-slicing", "mps"):
        replicas = max(node.gpu_replicas, 1)
        shares, slices = [MILLI_PER_GPU] * node.gpus, [replicas] * node.gpus
        left = node.foreign_gpu_slices
        for k in range(node.gpus):
            taken = min(left, slices[k])
            slices[k] -= taken
            shares[k] -= taken * (MILLI_PER_GPU // replicas)
            left -= taken
        return {"shares": shares, "slices": slices, "mig": {}}
    foreign = node.foreign_mig_devices or {}
    return {"shares": [], "slices": [], "mig": {k: int(v) - int(foreign.get(k, 0))
                                                for k, v in (node.mig_devices or {}).items()}}


def book_share(room: dict, share_milli: int, mig_profile: str, gpu: int | None = None) -> None:
    """Book a live attempt's share (milli-GPUs, one slice) on the GPU of ``room`` (``shared_room``) its admission
    chose (``gpu``, the index its placement records) while that GPU still holds it, else on the one with the least
    free share that holds it; or its MIG device of ``mig_profile``. Positions of shares on GPUs are the platform's
    own model, re-derived on every read by booking live attempts in admission order (the device plugin chooses
    the replica); a share that no GPU holds any more is booked on the GPU with the most free, never lost."""
    if mig_profile:
        room["mig"][mig_profile] = room["mig"].get(mig_profile, 0) - 1
        return
    shares, slices = room["shares"], room["slices"]
    if not shares:
        return
    fits = [k for k in range(len(shares)) if shares[k] >= share_milli and slices[k] > 0]
    if isinstance(gpu, int) and gpu in fits:
        fits = [gpu]
    k = min(fits, key=lambda k: (shares[k], k)) if fits else max(range(len(shares)), key=lambda k: (shares[k], -k))
    shares[k] -= share_milli
    slices[k] -= 1


def _shared_fields(room: dict | None) -> tuple:
    """``NodeRoom``'s ``shares``, ``slices`` and ``mig_free`` of a ``shared_room`` (empty for a node that does not
    share its GPUs)."""
    if room is None:
        return (), (), ()
    return (tuple(max(v, 0) for v in room["shares"]), tuple(max(v, 0) for v in room["slices"]),
            tuple(sorted((k, max(v, 0)) for k, v in room["mig"].items())))


def lock_pools(*accelerator_ids: int) -> None:
    """Lock every node pool row of the accelerators FOR UPDATE, in id order (the admission's lock order), in one
    query."""
    list(NodePool.objects.filter(accelerator_id__in=accelerator_ids).order_by("pk").select_for_update()
         .values_list("pk", flat=True))


def takes_work(node: Node) -> bool:
    """Whether admission may place work on ``node`` (a Node row) now: Kubernetes may schedule on it, staff have not
    cordoned it and its health is not unhealthy (as ``node_rooms`` counts it)."""
    return node.schedulable and not node.cordoned and node.health != Node.Health.UNHEALTHY


def why_no_work(node: Node) -> str:
    """Why admission places nothing on ``node`` (a Node row), in words: "cordoned" (by staff), "unhealthy" or "not
    schedulable" (in Kubernetes: cordoned there, not Ready or tainted); "" when it takes work (``takes_work``)."""
    if node.cordoned:
        return "cordoned"
    if node.health == Node.Health.UNHEALTHY:
        return "unhealthy"
    return "" if node.schedulable else "not schedulable"


def unheld_on_nodes(nodes: list[Node]) -> dict[int, tuple[int, int, int]]:
    """What is not held on each of ``nodes`` (Node rows) now, counted as ``node_rooms`` counts it, whether or not the
    node takes work: by node id, ``(GPUs, CPU millicores, memory MiB)``, each never below 0. A node outside any pool
    has its allocatable resources minus the requests of pods the platform does not own (no attempt is placed on it).
    Its allocatable resources less these are what is allocated on it. Three queries."""
    pools = list(NodePool.objects.filter(pk__in={n.node_pool_id for n in nodes if n.node_pool_id}))
    rooms = {(pid, r.name): r for pid, lst in node_rooms(pools).items() for r in lst}
    unheld = {}
    for n in nodes:
        room = rooms.get((n.node_pool_id, n.name))
        left = ((room.free_gpus, room.free_cpu_milli, room.free_memory_mib) if room is not None else
                (n.gpus - n.foreign_gpus, n.cpu_milli - n.foreign_cpu_milli, n.memory_mib - n.foreign_memory_mib))
        unheld[n.pk] = tuple(max(0, int(x)) for x in left)
    return unheld


def free_on_nodes(nodes: list[Node], unheld: dict[int, tuple[int, int, int]] | None = None
                  ) -> dict[int, tuple[int, int, int]]:
    """What is free on each of ``nodes`` (Node rows) now, as admission counts it: by node id, ``(GPUs, CPU
    millicores, memory MiB)``, what is not held there (``unheld_on_nodes``, or ``unheld`` when given) on a node that
    takes work (``takes_work``), ``(0, 0, 0)`` on one that does not (cordoned, not schedulable or unhealthy), as on
    the clusters page and in admission. Three queries unless ``unheld`` is given."""
    unheld = unheld_on_nodes(nodes) if unheld is None else unheld
    return {n.pk: unheld[n.pk] if takes_work(n) else (0, 0, 0) for n in nodes}
