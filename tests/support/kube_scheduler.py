"""A kube-scheduler for the emulated clusters, over HTTP: binds pending pods to nodes with room, or marks them
Unschedulable, as the real one does.

It needs nothing from the emulator but its API: pods that exist without ``spec.nodeName`` (what a Job
controller creates: ``create_pending_pods`` does it for a batch/v1 Job) and Nodes with ``status.allocatable``.
``KubeScheduler(url).schedule()`` then looks at every such pod, in creation order, and either binds it (sets
``spec.nodeName``, ``PodScheduled=True`` and phase ``Running``: this emulated kubelet starts at once) or sets
``PodScheduled=False`` with reason ``Unschedulable`` and the real scheduler's kind of message
(``0/4 nodes are available: 4 Insufficient nvidia.com/gpu.``).

A node fits a pod when it is not cordoned and Ready, the pod tolerates its NoSchedule/NoExecute taints, the pod's
``nodeSelector`` and required node affinity (``In``/``NotIn``/``Exists``/``DoesNotExist``, terms ORed) match its
labels (``kubernetes.io/hostname`` is the node's name), no pod it must repel (required pod anti-affinity on
``kubernetes.io/hostname``) is bound there, and the requests of every unfinished pod bound to it, plus this
pod's, stay within its allocatable GPUs, CPU and memory, and within its allocatable count of every other extended
resource the pod asks (``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpu.shared``: none advertised, none fits)
(Kubernetes docs: "Resource Management for Pods and Containers", "Assigning Pods to Nodes", "Taints and
Tolerations").
"""

from __future__ import annotations

from kubernetes.utils.quantity import parse_quantity

from .kubernetes import ApiClient, now_iso

HOSTNAME = "kubernetes.io/hostname"
RESOURCES = ("nvidia.com/gpu", "cpu", "memory")


def quantities(values: dict) -> tuple:
    """GPUs, CPU cores and memory bytes of a requests/allocatable mapping (absent: 0), as Decimals."""
    return tuple(parse_quantity(values[r]) if r in values else 0 for r in RESOURCES)


def pod_requests(pod: dict) -> tuple:
    """What the scheduler counts for a pod: per resource the sum of its containers' requests (a limit stands for
    a missing request, as the API server defaults it)."""
    total = [0, 0, 0]
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        asked = quantities({**(res.get("limits") or {}), **(res.get("requests") or {})})
        total = [a + b for a, b in zip(total, asked, strict=True)]
    return tuple(total)


def extended_requests(pod: dict) -> dict[str, object]:
    """The extended resources other than ``nvidia.com/gpu`` a pod asks (``nvidia.com/...``), summed over its
    containers (a limit stands for a missing request), as Decimals."""
    total: dict[str, object] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for key, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            if key.startswith("nvidia.com/") and key not in RESOURCES:
                total[key] = total.get(key, 0) + parse_quantity(value)
    return total


def _matches(expr: dict, labels: dict) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def unfit(pod: dict, node: dict, bound: list[dict] = ()) -> str | None:
    """Why ``node`` cannot take ``pod`` (the real scheduler's words), or None when it fits; ``bound``: the pods
    already bound (their requests count on their nodes)."""
    return KubeScheduler._unfit(pod, pod.get("spec") or {}, pod_requests(pod), node, list(bound))


def bind(pod: dict, nodes: list[dict], pods: list[dict]) -> str | None:
    """A ``ClusterEmulator`` bind hook that schedules as this module's scheduler does: the first node (by name)
    that fits ``pod`` given the unfinished pods bound on ``nodes``; None leaves it Unschedulable."""
    bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")
             and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    return next((n["metadata"]["name"] for n in sorted(nodes, key=lambda n: n["metadata"]["name"])
                 if unfit(pod, n, bound) is None), None)


class KubeScheduler(ApiClient):
    """Binds the pending pods of one emulated cluster (its API URL) to nodes by resources; see the module docstring."""

    def schedule(self) -> dict[str, str | None]:
        """One scheduling round: pod name -> the node it was bound to, or None (left Unschedulable)."""
        nodes = self._req("GET", "/api/v1/nodes")["items"]
        pods = sorted(self._req("GET", "/api/v1/pods")["items"],
                      key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        bound = [p for p in live if (p.get("spec") or {}).get("nodeName")]
        out = {}
        for pod in live:
            if (pod.get("spec") or {}).get("nodeName"):
                continue
            name, why = self._choose(pod, nodes, bound)
            meta = pod["metadata"]
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            if name is None:
                self._req("PATCH", path, {"status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why,
                     "lastTransitionTime": now_iso()}]}})
            else:
                pod["spec"]["nodeName"] = name
                self._req("PATCH", path, {"spec": {"nodeName": name}})
                self._req("PATCH", path, {"status": {"phase": "Running", "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso()}],
                    "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "x",
                                           "imageID": "", "state": {"running": {"startedAt": now_iso()}}}]}})
                bound.append(pod)
            out[meta["name"]] = name
        return out

    def _choose(self, pod: dict, nodes: list[dict], bound: list[dict]) -> tuple[str | None, str]:
        """The first node (by name) that fits ``pod``, or None and the reasons, counted as the real scheduler does."""
        spec = pod.get("spec") or {}
        want = pod_requests(pod)
        reasons: dict[str, int] = {}
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            why = self._unfit(pod, spec, want, node, bound)
            if why is None:
                return node["metadata"]["name"], ""
            reasons[why] = reasons.get(why, 0) + 1
        listed = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
        return None, f"0/{len(nodes)} nodes are available: {listed}."

    @staticmethod
    def _unfit(pod: dict, spec: dict, want: tuple, node: dict, bound: list[dict]) -> str | None:
        meta, nspec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
        labels = {**(meta.get("labels") or {}), HOSTNAME: meta["name"]}
        if nspec.get("unschedulable"):
            return "node(s) were unschedulable"
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            return "node(s) were not ready"
        for taint in nspec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(spec.get("tolerations") or [],
                                                                                      taint):
                return "node(s) had untolerated taint"
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        affinity = spec.get("affinity") or {}
        required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = required.get("nodeSelectorTerms") or []
        if terms and not any(all(_matches(e, labels) for e in t.get("matchExpressions") or []) for t in terms):
            return "node(s) didn't match Pod's node affinity/selector"
        on_node = [p for p in bound if p["spec"].get("nodeName") == meta["name"]]
        for rule in (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            selector = (rule.get("labelSelector") or {}).get("matchLabels") or {}
            if rule.get("topologyKey") == HOSTNAME and any(
                    all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items()) for p in on_node):
                return "node(s) didn't match pod anti-affinity rules"
        alloc = status.get("allocatable") or {}
        have = quantities(alloc)
        used = [sum(pod_requests(p)[i] for p in on_node) for i in range(3)]
        for i, resource in enumerate(RESOURCES):
            if resource not in alloc and resource != "nvidia.com/gpu":
                continue  # an emulated node that states no CPU or memory limits neither
            if want[i] and used[i] + want[i] > have[i]:
                return f"Insufficient {resource}"
        for resource, asked in sorted(extended_requests(pod).items()):
            taken = sum(extended_requests(p).get(resource, 0) for p in on_node)
            if asked and taken + asked > parse_quantity(alloc.get(resource, "0")):
                return f"Insufficient {resource}"
        return None


def create_pending_pods(url: str, job: dict) -> list[dict]:
    """What the Job controller does for a batch/v1 Job ``job``: one pod per completion index from its template,
    without a node (``Pending``), for ``KubeScheduler`` to bind."""
    api = ApiClient(url)
    meta, spec = job["metadata"], job["spec"]
    pods = []
    for index in range(spec.get("completions") or 1):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{meta['name']}-{index}-p", "namespace": meta["namespace"],
                            "labels": dict(spec["template"]["metadata"]["labels"]),
                            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                            "creationTimestamp": now_iso()},
               "spec": dict(spec["template"]["spec"]), "status": {"phase": "Pending"}}
        pods.append(api._req("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", pod))
    return pods
