"""Spot and on-demand from every provider's node labels: one table (``manifests.SPOT_LABELS``) decides a node's
capacity type for its pool and price, and where spot and on-demand pods may run.

Class of failure: spot capacity priced on-demand (a node whose provider marks it preemptible with a label the
platform did not know was pooled and billed as on-demand: a GKE ``cloud.google.com/gke-preemptible=true`` node's
GPU-hour charged 4.20 USD instead of 2.99). Invariant: a node is spot (its pool's capacity type, hence its price)
exactly when it carries a row of the table, and exactly such nodes take spot pods and refuse on-demand ones.

The tests are generated over the table. Whether a pod may run on a node is judged by the test kube-scheduler
(``tests.support.kube_scheduler``: node affinity and taints as Kubernetes documents them), not by the code that
built the manifests; prices are the cluster's own rows or the catalog's (``costs/data/prices.csv``).
"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal

import pytest
import time_machine
from django.db.models import Sum

from costs.catalog import price_at
from costs.ledger import accrue_attempt
from costs.models import CostEntry, Price
from costs.seed import CATALOG_EFFECTIVE_FROM
from jobs.lifecycle import dispatch
from jobs.models import Job
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import try_admit
from quotas.models import Quota
from runners.kubernetes import manifests as m
from runners.kubernetes.nodepools import capacity_type
from runners.kubernetes.sync import sync_cluster
from runners.models import Cluster, NodePool
from tests.support import kube_scheduler
from tests.support.clusters import H100_LABEL, load, state
from tests.support.factories import make_job_row
from tests.support.kubernetes import ClusterEmulator

from .steps import workload

ROWS = {row.key: row for row in m.SPOT_LABELS}
ON_DEMAND_USD, SPOT_USD = Decimal("4.20"), Decimal("2.99")


def node(name: str, labels: dict, *, spot_taints: bool = True) -> dict:
    """A Ready 8-GPU H100 node with ``labels``; a NoSchedule taint of every spot key whose label has its spot value,
    as providers (AKS, OKE) and operators (GKE's ``--node-taints``) taint spot pools."""
    taints = [{"key": k, "value": v, "effect": "NoSchedule"} for k, v in labels.items()
              if spot_taints and k in ROWS and ROWS[k].value == v]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {m.GPU_PRODUCT_LABEL: H100_LABEL, **labels}},
            "spec": {"taints": taints},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(spot: bool) -> dict:
    """The pod template of a one-node, one-GPU training attempt, spot or on-demand, as dispatch builds it."""
    job = m.training_job(workload(nodes=1, gpus_per_node=1, cpu=None, memory_gib=None, spot=spot))
    return {"metadata": {"name": "p", "labels": job["spec"]["template"]["metadata"]["labels"]},
            "spec": job["spec"]["template"]["spec"]}


def fits(spot: bool, body: dict) -> bool:
    return kube_scheduler.unfit(pod(spot), body) is None


def other_value(row: m.SpotLabel) -> str:
    """A value of ``row``'s key that is not its spot value (what on-demand nodes of that provider carry)."""
    return {"SPOT": "ON_DEMAND", "spot": "on-demand", "true": "false"}.get(row.value, "regular")


@pytest.mark.parametrize("row", m.SPOT_LABELS, ids=lambda row: row.key)
def test_a_node_with_a_spot_label_is_a_spot_pool_priced_at_spot_and_only_spot_pods_run_there(row, catalog):
    """A cluster with three nodes: one labelled (and tainted) as the row says, one with the row's key and another
    value, one without it. Node sync makes a spot pool of the first, priced at the cluster's spot row, and an
    on-demand pool of the others, priced on-demand; spot pods fit only the first, on-demand pods only the others."""
    bodies = {"spot": node("spot", {row.key: row.value}), "other": node("other", {row.key: other_value(row)}),
              "plain": node("plain", {})}
    with ClusterEmulator("c") as emulator:
        for body in bodies.values():
            emulator._create("Node", None, body)
        cluster = Cluster.objects.create(name="c", provider="onprem", region="dc-1", backend="kubernetes",
                                         api_endpoint=emulator.url, api_token="t")
        for ctype, usd in (("on-demand", ON_DEMAND_USD), ("spot", SPOT_USD)):
            Price.objects.create(provider="onprem", region="dc-1", accelerator=catalog["H100-80GB"], cluster=cluster,
                                 capacity_type=ctype, usd_per_gpu_hour=usd, effective_from=CATALOG_EFFECTIVE_FROM)
        sync_cluster(cluster)
    pools = {p.capacity_type: p for p in NodePool.objects.filter(cluster=cluster).select_related("accelerator")}
    assert {ctype: sorted(n.name for n in p.gpu_nodes.all()) for ctype, p in pools.items()} == {
        "spot": ["spot"], "on-demand": ["other", "plain"]}
    at = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
    assert (price_at(pools["spot"], at), price_at(pools["on-demand"], at)) == (SPOT_USD, ON_DEMAND_USD)
    assert {name: (fits(True, body), fits(False, body)) for name, body in bodies.items()} == {
        "spot": (True, False), "other": (False, True), "plain": (False, True)}


def label_sets():
    """Every node label set over the table's keys: each key absent, with its spot value, or with another value."""
    choices = [(None, row.value, other_value(row)) for row in m.SPOT_LABELS]
    for values in itertools.product(*choices):
        yield {row.key: v for row, v in zip(m.SPOT_LABELS, values, strict=True) if v is not None}


@pytest.mark.parametrize("spot_taints", [True, False])
def test_capacity_type_agrees_with_where_spot_and_on_demand_pods_may_run_for_every_label_set(spot_taints):
    """Over every combination of the table's labels (3^rows nodes), tainted or not: the node's capacity type is
    spot exactly when a spot pod fits it, and on-demand exactly when an on-demand pod fits it."""
    spot_pod, od_pod = pod(True), pod(False)
    for labels in label_sets():
        body = node("n", labels, spot_taints=spot_taints)
        spot_fits = kube_scheduler.unfit(spot_pod, body) is None
        od_fits = kube_scheduler.unfit(od_pod, body) is None
        expected_spot = any(labels.get(row.key) == row.value for row in m.SPOT_LABELS)
        assert (capacity_type(body["metadata"]["labels"]) == "spot", spot_fits, od_fits) == \
            (expected_spot, expected_spot, not expected_spot), labels


def test_a_preemptible_gke_nodes_gpu_hour_is_billed_at_the_spot_price(settings, catalog, teams, user):
    """End to end on an emulated GKE cluster (gcp, us-central1: the catalog's H100 at 4.20 on-demand, 2.99 spot)
    with a preemptible node (``cloud.google.com/gke-preemptible=true``; GKE taints it only when asked to) and a
    standard one: node sync,
    admission of a preemptible one-GPU job, dispatch, the kube-scheduler's binding, an hour of running, the
    ledger. The job runs on the preemptible node and its GPU-hour costs 2.99 USD."""
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 0
    settings.K8S_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.K8S_READ_TIMEOUT_SECONDS = 1.0
    h100 = catalog["H100-80GB"]
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=8)
    start = dt.datetime(2026, 5, 4, 9, 0, tzinfo=dt.UTC)
    with time_machine.travel(start, tick=False) as clock, ClusterEmulator("gke", bind=kube_scheduler.bind) as gke:
        for body in (node("gke-preemptible-0", {"cloud.google.com/gke-preemptible": "true"}, spot_taints=False),
                     node("gke-standard-0", {})):
            gke._create("Node", None, body)
        cluster = Cluster.objects.create(name="gke-usc1", provider="gcp", region="us-central1", backend="kubernetes",
                                         api_endpoint=gke.url, api_token="t")
        sync_cluster(cluster)
        spec = {"image": "registry.example/t:1", "command": ["python", "train.py"], "args": [], "env": {},
                "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "placement": {},
                "max_runtime_seconds": 7200, "preemptible": True}
        job = make_job_row(teams[0], user, h100, name="t", spec=spec, gpus_per_node=1, preemptible=True,
                           max_runtime=7200)
        assert try_admit(job.pk) == "admitted"
        attempt = load(Job.objects.get(pk=job.pk).current_attempt_id)
        assert dispatch(attempt.pk) == "dispatched"
        reconcile_cluster(cluster)
        (running,) = gke.pods(attempt.pk)
        assert running["spec"]["nodeName"] == "gke-preemptible-0" and state(attempt) == "RUNNING"
        clock.shift(3600)
        gke.finish_pod(running["metadata"]["name"], 0)
        reconcile_cluster(cluster)
    assert state(attempt) == "SUCCEEDED"
    accrue_attempt(attempt.pk)
    billed = CostEntry.objects.filter(attempt_id=attempt.pk).aggregate(usd=Sum("amount_usd"))["usd"]
    assert billed == Decimal(1) * SPOT_USD * Decimal(3600) / Decimal(3600)
