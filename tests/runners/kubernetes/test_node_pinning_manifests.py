"""Pods of an attempt are pinned to the nodes admission chose: every node-affinity term also requires
``kubernetes.io/hostname`` in them, and the pods of a multi-node attempt repel each other per node; the manifests
validate against the Kubernetes schema."""

from __future__ import annotations

from runners.kubernetes import manifests as m

from .steps import validate, workload


def _pod_spec(w: m.Workload) -> dict:
    return m.training_job(w)["spec"]["template"]["spec"]


def test_each_term_requires_the_chosen_hostnames_and_gangs_repel_per_node():
    spec = _pod_spec(workload(node_names=("gpu-a", "gpu-b")))
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms and all({"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a", "gpu-b"]}
                         in t["matchExpressions"] for t in terms)
    assert spec["affinity"]["podAntiAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"controlplane.io/attempt": "11"}}, "topologyKey": "kubernetes.io/hostname"}]}
    validate(m.training_job(workload(node_names=("gpu-a", "gpu-b"))))


def test_spot_terms_are_each_pinned_and_a_single_node_needs_no_anti_affinity():
    spec = _pod_spec(workload(nodes=1, spot=True, node_names=("gpu-a",)))
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) > 1 and all(t["matchExpressions"][-1]["values"] == ["gpu-a"] for t in terms)
    assert "podAntiAffinity" not in spec["affinity"]


def test_without_chosen_nodes_nothing_is_pinned():
    spec = _pod_spec(workload())
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(e["key"] != "kubernetes.io/hostname" for t in terms for e in t["matchExpressions"])
