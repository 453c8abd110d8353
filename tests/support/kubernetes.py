"""Emulated Kubernetes clusters for the tests and benchmarks.

``Emulators``: several kmock KubernetesEmulator servers on real TCP ports (with resource versions and watches
resumed from one, ``Namespaces``, and set-based label selectors, ``SelectingEmulator``),
run by a background event loop, each inside ``async with`` (errors come back
as real Status objects); they store objects, and ``Kubelet`` plays the
cluster's controllers over HTTP by hand (creates a Job's pods, moves their
status, garbage-collects pods of deleted Jobs).

``ClusterEmulator``: a cluster that behaves like one on its own, for the
tests of what the control plane believes: an API server with a Job and a
Deployment controller (and, when asked, the JobSet API and its controller),
nodes with a pluggable binding hook, pod phases and
reasons, the Eviction API, plain deletion, node loss and spot reclaims, and
faults injected on any call for a count or a time window; it counts pod
GPU-seconds itself, to check billing against.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import http.server
import json
import random
import socket
import socketserver
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from urllib.parse import parse_qs, unquote, urlsplit

import aiohttp.test_utils
import aiohttp.web
import kmock
import urllib3

RESOURCES = ["v1/namespaces", "v1/services", "v1/pods", "v1/nodes", "batch/v1/jobs", "apps/v1/deployments"]


class SelectingEmulator(kmock.KubernetesEmulator):
    """kmock's emulator, whose LISTs apply a set-based label selector (``key in (a,b)``) before the answer is
    made, as an API server filters its cache: kmock 0.8 ignores label selectors (the platform filters what it
    lists anyway), and a selector that picks a few objects must not cost a serialization of all of them."""

    async def _serve_list(self, request):
        answer = await super()._serve_list(request)
        selector = (request.params or {}).get("labelSelector", "")
        if " in (" in selector:
            answer["items"] = [o for o in answer["items"]
                               if _selector_matches(selector, (o.get("metadata") or {}).get("labels") or {})]
        return answer


class Emulators:
    """``names`` emulated clusters; ``url(name)``, ``stop(name)``/``start(name)`` (an outage on the same port).

    ``forget_requests``: drop each emulator's request history whenever no
    request is in flight (tests keep it for assertions). kmock matches every
    new request by filtering its whole history once per built-in reaction, so
    an emulator that serves thousands of requests (a benchmark) slows with
    each one unless it forgets them.
    """

    def __init__(self, names: list[str], forget_requests: bool = False):
        self.names = names
        self.forget_requests = forget_requests
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.handlers: dict[str, kmock.KubernetesEmulator] = {}
        self.servers: dict[str, kmock.Server] = {}
        self.ports: dict[str, int] = {}
        self.fronts: dict[str, Namespaces] = {}

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def __enter__(self) -> "Emulators":
        self.thread.start()
        for name in self.names:
            self.run(self._open(name))
        return self

    def __exit__(self, *exc) -> None:
        for name in self.names:
            self.run(self._close(name))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    async def _open(self, name: str) -> None:
        handler = SelectingEmulator()
        for resource in RESOURCES:
            handler.resources[resource] = {}
        await handler.__aenter__()
        self.handlers[name] = handler
        self.fronts[name] = Namespaces(handler, self.forget_requests)
        await self._serve(name)

    async def _serve(self, name: str) -> None:
        server = aiohttp.test_utils.RawTestServer(self.fronts[name], host="127.0.0.1",
                                                  port=self.ports.get(name))
        await server.__aenter__()
        self.servers[name] = server
        self.ports[name] = server.port

    async def _unserve(self, name: str) -> None:
        server = self.servers.pop(name, None)
        if server is not None:
            await server.__aexit__(None, None, None)

    async def _close(self, name: str) -> None:
        await self._unserve(name)
        await self.handlers[name].__aexit__(None, None, None)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def stop(self, name: str) -> None:
        """Close the cluster's port: connections are refused until ``start``; its objects are kept."""
        self.run(self._unserve(name))

    def start(self, name: str) -> None:
        self.run(self._serve(name))

    def requests(self, name: str) -> list:
        return list(self.handlers[name])  # the handler iterates over the requests it served

    def hold(self, name: str) -> "Gate":
        """From now on, hold every request to ``name`` unanswered until the returned gate's ``release()``."""
        gate = Gate(self.loop)
        self.fronts[name].gate = gate
        return gate


class Gate:
    """A slow API server: requests wait (on the emulators' loop) until ``release()``; ``waiting`` counts them."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.event = asyncio.Event()
        self.waiting = 0

    async def wait(self) -> None:
        self.waiting += 1
        try:
            await self.event.wait()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)


class Namespaces:
    """Serves the cluster-scoped ``/api/v1/namespaces`` collection in front of the emulator.

    kmock 0.8 parses any path starting ``/api/v1/namespaces`` as a namespaced
    prefix and answers 500 for the collection itself, so namespaces are kept
    here with the API's semantics (201 Created, 409 AlreadyExists Status,
    GET of one or all, DELETE); every other request goes to the
    KubernetesEmulator, except a create in a namespace that does not exist,
    which is a 404 NotFound Status as on a real API server.
    """

    def __init__(self, emulator: kmock.KubernetesEmulator, forget_requests: bool = False):
        self.emulator = emulator
        self.forget_requests = forget_requests
        self.in_flight = 0
        self.namespaces: dict[str, dict] = {}
        self.namespace_creates = 0  # POSTs to the namespaces collection, answered 201 or 409
        self.gate: Gate | None = None  # set by ``Emulators.hold``
        # Resource versions, which kmock 0.8 does not keep: one counter for the cluster (etcd's revision), each
        # write through the API one more; objects stored straight into the emulator count as written at 1. The
        # changes since are logged for watches as (version, resource, ADDED/MODIFIED/DELETED, object); those up
        # to ``compacted`` are no longer kept (``compact``): a watch from before answers 410 Gone.
        self.version = 1
        self.changes: list[tuple[int, str, str, dict]] = []
        self.compacted = 0
        self.keep_changes = 100000

    async def __call__(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if self.gate is not None:
            await self.gate.wait()
        parts = request.path.strip("/").split("/")
        if request.method == "POST" and (missing := self._missing_namespace(parts)):
            return aiohttp.web.json_response(
                {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound",
                 "message": f'namespaces "{missing}" not found', "details": {"name": missing, "kind": "namespaces"}},
                status=404)
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) > 4:
            resource = _resource_of(parts)
            if request.method == "GET" and resource and resource[2] is None and request.query.get("watch", "").lower() in (
                    "true", "1"):
                return self._watch(resource[0], resource[1], request.query)
            self.in_flight += 1
            try:
                answer = await self.emulator(request)
                if resource and request.method != "GET" and answer.status < 300:
                    self._record(request.method, resource[0], answer)
                elif resource and resource[2] is None and request.method == "GET" and answer.status == 200:
                    # the list's own version: the counter now (kmock answers "...")
                    answer.body = answer.body.replace(b'"resourceVersion": "..."', b'"resourceVersion": "%d"'
                                                      % self.version, 1)
                return answer
            finally:
                self.in_flight -= 1
                if self.forget_requests and not self.in_flight:
                    self.emulator._requests.clear()  # none is being matched: nothing still needs its history
        if request.method == "POST" and len(parts) == 3:
            self.namespace_creates += 1
            body = await request.json()
            name = body["metadata"]["name"]
            if name in self.namespaces:
                return aiohttp.web.json_response(
                    {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 409, "reason": "AlreadyExists",
                     "message": f'namespaces "{name}" already exists',
                     "details": {"name": name, "kind": "namespaces"}}, status=409)
            self.namespaces[name] = {**body, "status": {"phase": "Active"}}
            return aiohttp.web.json_response(self.namespaces[name], status=201)
        if request.method == "GET" and len(parts) == 3:
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {},
                                              "items": list(self.namespaces.values())})
        if request.method == "GET" and parts[3] in self.namespaces:
            return aiohttp.web.json_response(self.namespaces[parts[3]])
        if request.method == "DELETE" and parts[3] in self.namespaces:
            return aiohttp.web.json_response(self.namespaces.pop(parts[3]))
        return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound", "message": "not found"},
                                         status=404)


    def _record(self, method: str, resource: str, answer: aiohttp.web.Response) -> None:
        """Log the write ``method`` to ``resource`` kmock answered with the object ``answer`` holds: one more
        version, which the object in the answer carries."""
        try:
            obj = json.loads(answer.body)
        except (TypeError, ValueError):
            return
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            return
        change = {"POST": "ADDED", "DELETE": "DELETED"}.get(method, "MODIFIED")
        if change == "DELETED" and obj["metadata"].get("finalizers"):
            change = "MODIFIED"  # marked for deletion; it goes when its finalizers do
        self.log_change(resource, change, obj)
        answer.body = json.dumps(obj).encode()

    def log_change(self, resource: str, change: str, obj: dict) -> None:
        """Log a write of ``obj`` (``change``: ADDED, MODIFIED or DELETED) to ``resource`` (``v1/pods``...): one
        more version, which ``obj`` carries from now on. For writes through the API (``_record``) and for objects
        a benchmark changes in the emulator's store directly."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.changes.append((self.version, resource, change, obj))
        if len(self.changes) > self.keep_changes:
            self.compact(len(self.changes) - self.keep_changes)

    def compact(self, changes: int | None = None) -> None:
        """Forget the oldest ``changes`` logged changes (default all), as etcd compaction does."""
        drop = len(self.changes) if changes is None else min(changes, len(self.changes))
        if drop:
            self.compacted = self.changes[drop - 1][0]
            del self.changes[:drop]
        else:
            self.compacted = self.version

    def _watch(self, resource: str, namespace: str | None, query) -> aiohttp.web.Response:
        """A watch resumed from ``resourceVersion``: the logged changes of ``resource`` since, matching the label
        selector, one JSON event a line, then a BOOKMARK at the newest version (with ``allowWatchBookmarks``),
        and the end of the stream (a server may end a watch at any time). A version no longer kept: an ERROR
        event holding a 410 Gone Status, reason Expired; one newer than any: 504 "Too large resource version"; none
        given: 400 (this emulator resumes watches only)."""
        version = query.get("resourceVersion", "")
        labels = query.get("labelSelector", "")

        def line(change: str, obj: dict) -> str:
            return json.dumps({"type": change, "object": obj}) + "\n"

        if not version.isdigit():
            return aiohttp.web.json_response(status(400, "BadRequest", "a watch needs a resourceVersion here"),
                                             status=400)
        if int(version) < self.compacted:
            body = line("ERROR", status(410, "Expired", f"too old resource version: {version} ({self.compacted})"))
        elif int(version) > self.version:
            body = line("ERROR", status(504, "Timeout", f"Too large resource version: {version}, current: "
                                                        f"{self.version}"))
        else:
            body = "".join(line(change, obj) for at, kind, change, obj in self.changes
                           if kind == resource and at > int(version)
                           and (namespace is None or obj["metadata"].get("namespace") == namespace)
                           and _selector_matches(labels, obj["metadata"].get("labels") or {}))
            if query.get("allowWatchBookmarks", "").lower() in ("true", "1"):
                body += line("BOOKMARK", {"metadata": {"resourceVersion": str(self.version)}})
        return aiohttp.web.Response(body=body.encode(), content_type="application/json")

    def _missing_namespace(self, parts: list[str]) -> str:
        """The namespace of a namespaced collection path (``/api/v1/namespaces/<ns>/<kind>``,
        ``/apis/<group>/<version>/namespaces/<ns>/<kind>``) when it does not exist, else ""."""
        index = 2 if parts[:1] == ["api"] else 3 if parts[:1] == ["apis"] else None
        if index is None or len(parts) != index + 3 or parts[index] != "namespaces":
            return ""
        return "" if parts[index + 1] in self.namespaces else parts[index + 1]


def _resource_of(parts: list[str]) -> tuple[str, str | None, str | None] | None:
    """``(resource, namespace, name)`` of an API path split at "/" (``v1/pods``, ``batch/v1/jobs``: kmock's
    resource names); None for a path that names no resource."""
    base = 2 if parts[:1] == ["api"] else 3 if parts[:1] == ["apis"] else None
    if base is None or len(parts) <= base:
        return None
    rest, namespace = parts[base:], None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    return "/".join(parts[1:base]) + "/" + rest[0], namespace, rest[1] if len(rest) > 1 else None


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class ApiClient:
    """A bare HTTP client of one emulated API server (its URL): JSON in and out, an AssertionError on any 4xx/5xx."""

    def __init__(self, url: str):
        self.url = url
        self.http = urllib3.PoolManager()

    def _req(self, method: str, path: str, body=None) -> dict:
        answer = self.http.request(method, self.url + path, body=None if body is None else json.dumps(body),
                                   headers={"Content-Type": "application/merge-patch+json" if method == "PATCH"
                                            else "application/json"})
        data = json.loads(answer.data or b"{}")
        if answer.status >= 400:
            raise AssertionError(f"{method} {path}: {answer.status} {data}")
        return data


class Kubelet(ApiClient):
    """The cluster side of one emulator, over HTTP: Job controller, kubelet and pod garbage collector, by hand."""

    def jobs(self) -> list[dict]:
        return self._req("GET", "/apis/batch/v1/jobs")["items"]

    def deployments(self) -> list[dict]:
        return self._req("GET", "/apis/apps/v1/deployments")["items"]

    def services(self) -> list[dict]:
        return self._req("GET", "/api/v1/services")["items"]

    def pods(self, attempt_id: int | None = None) -> list[dict]:
        items = self._req("GET", "/api/v1/pods")["items"]
        if attempt_id is None:
            return items
        return [p for p in items if p["metadata"]["labels"].get("controlplane.io/attempt") == str(attempt_id)]

    def job(self, attempt_id: int) -> dict | None:
        return next((j for j in self.jobs()
                     if j["metadata"]["labels"].get("controlplane.io/attempt") == str(attempt_id)), None)

    def start_pods(self, obj: dict, phase: str = "Running", count: int | None = None) -> list[dict]:
        """Create the pods of a Job (one per completion index) or Deployment (one per replica) in ``phase``."""
        meta, spec = obj["metadata"], obj["spec"]
        count = count if count is not None else spec.get("completions") or spec.get("replicas") or 1
        pods = []
        for index in range(count):
            name = f"{meta['name']}-{index}-x{index}"
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": meta["namespace"], "labels": dict(meta["labels"]),
                                "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                                "creationTimestamp": now_iso()},
                   "spec": {**spec["template"]["spec"], "nodeName": f"node-{index}"},
                   "status": {"phase": phase, "containerStatuses": [
                       {"name": "main", "ready": phase == "Running", "restartCount": 0, "image": "x", "imageID": "",
                        "state": {"running": {"startedAt": now_iso()}} if phase == "Running" else {"waiting": {}}}]}}
            pods.append(self._req("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", pod))
        if obj["kind"] == "Job":
            self.patch_job(obj, {"status": {"active": count, "startTime": now_iso()}})
        else:
            self._req("PATCH", f"/apis/apps/v1/namespaces/{meta['namespace']}/deployments/{meta['name']}",
                      {"status": {"readyReplicas": count, "replicas": count}})
        return pods

    def patch_pod(self, pod: dict, status: dict) -> None:
        meta = pod["metadata"]
        self._req("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", {"status": status})

    def patch_job(self, job: dict, body: dict) -> None:
        meta = job["metadata"]
        self._req("PATCH", f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}", body)

    def terminate(self, pod: dict, exit_code: int, reason: str = "") -> None:
        terminated = {"exitCode": exit_code, "startedAt": now_iso(), "finishedAt": now_iso()}
        if reason:
            terminated["reason"] = reason
        self.patch_pod(pod, {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [
            {"name": "main", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": terminated}}]})

    def finish_job(self, job: dict, condition: str, reason: str = "", message: str = "") -> None:
        """Set the Job's terminal condition (``Complete`` or ``Failed``) as the Job controller does."""
        self.patch_job(job, {"status": {"active": 0, "conditions": [
            {"type": condition, "status": "True", "reason": reason or condition, "message": message,
             "lastTransitionTime": now_iso(), "lastProbeTime": now_iso()}]}})

    def gc(self) -> int:
        """Delete pods whose Job or Deployment is gone (the garbage collector); returns how many."""
        owners = {o["metadata"]["labels"].get("controlplane.io/attempt") for o in self.jobs() + self.deployments()}
        removed = 0
        for pod in self.pods():
            if pod["metadata"]["labels"].get("controlplane.io/attempt") not in owners:
                meta = pod["metadata"]
                self._req("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
                removed += 1
        return removed


# ==================================================================================================================
# A cluster that behaves like one: an API server with controllers, nodes, pods, disruptions and injected faults.
# ==================================================================================================================

#: Kinds the emulated API server serves: (group/version path prefix, plural) -> (kind, namespaced).
KINDS = {
    ("api/v1", "namespaces"): ("Namespace", False), ("api/v1", "nodes"): ("Node", False),
    ("api/v1", "pods"): ("Pod", True), ("api/v1", "services"): ("Service", True),
    ("apis/batch/v1", "jobs"): ("Job", True), ("apis/apps/v1", "deployments"): ("Deployment", True),
    ("api/v1", "configmaps"): ("ConfigMap", True),
    ("apis/jobset.x-k8s.io/v1alpha2", "jobsets"): ("JobSet", True),
}
#: The API groups ``GET /apis`` lists (an APIGroupList), by name: their versions; JobSet's only where it is served.
API_GROUPS = {"batch": ["v1"], "apps": ["v1"]}
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
# Labels the JobSet controller sets on its child Jobs and their pods (JobSet docs, "JobSet labels").
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
GPU = "nvidia.com/gpu"
ATTEMPT_LABEL = "controlplane.io/attempt"
JOB_LABEL = "controlplane.io/job"


def micro_time(t: float) -> str:
    """RFC 3339 with microseconds (Kubernetes' MicroTime format), UTC: exact, so billing can be checked to the second."""
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def status(code: int, reason: str, message: str, **details) -> dict:
    """A ``v1 Status`` failure body, as the API server answers errors."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details, "code": code}


_FAULT_REASONS = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Gone",
                  429: "TooManyRequests",
                  500: "InternalError",
                  502: "BadGateway", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclasses.dataclass
class Fault:
    """One injected failure: ``kind`` is an HTTP status (401 and 403: a refused credential; 404, 410, 429, 5xx),
    ``"timeout"`` (no answer for
    ``delay`` seconds, then the connection is closed), ``"truncated"`` (a 200 whose JSON body is cut short) or
    ``"empty"`` (a 200 list with no items, whatever exists).

    It applies to requests whose method is ``method`` (None: any) and whose path contains ``path`` (None: any),
    ``count`` times (None: unlimited) and, with ``seconds``, only during that window from its injection.
    """

    kind: int | str
    method: str | None = None
    path: str | None = None
    count: int | None = 1
    seconds: float | None = None
    delay: float = 2.0
    since: float = dataclasses.field(default_factory=time.monotonic)

    def matches(self, method: str, path: str) -> bool:
        if self.count is not None and self.count <= 0:
            return False
        if self.seconds is not None and time.monotonic() - self.since > self.seconds:
            return False
        return (self.method is None or self.method == method) and (self.path is None or self.path in path)


def default_bind(pod: dict, nodes: list[dict], pods: list[dict]) -> str | None:
    """Bind ``pod`` to the first Ready node whose labels match its nodeSelector and that has its GPUs free;
    without any node registered, to a node of its own (``node-<pod name>``). None leaves it Pending (Unschedulable).

    The hook ``ClusterEmulator.bind`` replaces this (a scheduler of its own, e.g. node-exact admission).
    """
    if not nodes:
        return f"node-{pod['metadata']['name']}"
    want = pod_gpus(pod)
    selector = pod["spec"].get("nodeSelector") or {}
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (node.get("status") or {}).get("conditions") or [{"type": "Ready", "status": "True"}])
        allocatable = int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        used = sum(pod_gpus(p) for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"]
                   and p["status"].get("phase") in ("Pending", "Running"))
        if ready and allocatable - used >= want:
            return node["metadata"]["name"]
    return None


def pod_gpus(pod: dict) -> int:
    """GPUs a pod requests (``nvidia.com/gpu`` limits of its containers)."""
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0))
               for c in (pod.get("spec") or {}).get("containers") or [])


def _selector_terms(selector: str) -> list[str]:
    """The comma-separated terms of a label selector, commas inside a set's parentheses kept."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    return [t for t in [*terms, current.strip()] if t]


def _selector_matches(selector: str, labels: dict) -> bool:
    """Whether ``labels`` match a label selector: equality (``=``, ``==``, ``!=``), existence (``key``, ``!key``)
    and set-based (``key in (a,b)``, ``key notin (a,b)``) terms (Kubernetes "Labels and Selectors")."""
    for term in _selector_terms(selector):
        words = term.split(None, 1)
        if len(words) == 2 and words[1].split("(", 1)[0].strip() in ("in", "notin"):
            operator, values = words[1].split("(", 1)
            wanted = {v.strip() for v in values.rstrip(")").split(",")}
            if (labels.get(words[0]) in wanted) != (operator.strip() == "in"):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def _field_matches(selector: str, obj: dict) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        key, value = term.split("!=" if negate else "=", 1)
        current: object = obj
        for part in key.split("."):
            current = (current or {}).get(part) if isinstance(current, dict) else None
        if (str(current or "") == value) == negate:
            return False
    return True


class ClusterEmulator:
    """One emulated Kubernetes cluster: the API server (HTTP on a real port) and its controllers, in memory.

    - the API server serves Namespaces, Nodes, Pods (with ``log``, the ``eviction`` subresource and the pod
      ``proxy`` to what a test makes the pod serve, ``serve_metrics``), Services,
      ConfigMaps, batch/v1 Jobs and apps/v1 Deployments: create (201, 409 AlreadyExists, 404 for a missing namespace), get,
      list with label and field selectors, merge patch and replace (PUT) with ``resourceVersion`` preconditions
      (409 Conflict when stale), delete (cascading to owned objects, Foreground or
      Background), errors as ``v1 Status`` bodies;
    - the Job controller creates one pod per completion index (Indexed Jobs), counts a pod that failed or was
      deleted before it finished as failed, recreates it while failures stay within ``backoffLimit`` (after
      ``backoff_seconds``), then fails the Job (BackoffLimitExceeded); Complete once every index succeeded;
      ``activeDeadlineSeconds`` fails it DeadlineExceeded;
    - with ``jobset``, the ``jobset.x-k8s.io/v1alpha2`` API (listed by ``GET /apis``) and a JobSet controller: a
      child Job ``<jobset>-<replicated job>-<i>`` per replica of each replicated Job (the template's labels and
      annotations, plus the JobSet labels on it and its pods, the pods' subdomain the network's), the headless
      Service named by ``spec.network.subdomain`` (default the JobSet's name) selecting every pod of the JobSet;
      a failed child Job fails the JobSet (``failurePolicy.maxRestarts`` 0: no restart), its ``successPolicy``
      (``All``/``Any`` of ``targetReplicatedJobs``, default all) completes it, and a finished JobSet's active
      child Jobs are deleted; deleting a JobSet deletes its child Jobs and Service;
    - the Deployment controller keeps ``replicas`` pods (a deleted or evicted one is replaced), ``readyReplicas``
      counting the Ready ones; ``crash_pod`` makes a server exit by itself as the kubelet shows it under
      ``restartPolicy: Always`` (lastState, restartCount, CrashLoopBackOff, restarted after ``backoff_seconds``);
    - pods are bound by ``bind(pod, nodes, pods) -> node name | None`` (``default_bind``; None: Pending,
      Unschedulable), then run; ``lifetime(pod) -> seconds | None`` ends them (Succeeded) after that long;
      ``pull_failures`` holds images that stay in ImagePullBackOff;
    - disruptions: the Eviction API and a plain delete of a pod leave it Terminating (``deletionTimestamp``; its
      containers stopped) until the next ``step()``; ``delete_node`` takes the node's pods with it (pod GC:
      DisruptionTarget DeletionByPodGC), ``interrupt_spot`` as a provider's spot reclaim does (DisruptionTarget
      TerminationByKubelet, then the node goes);
    - ``inject(Fault(...))`` makes calls fail (404/410/429/5xx, timeouts, truncated bodies) for a count or a
      time window; ``random_faults(rate)`` fails that fraction of all calls with a random one of them.

    Time-driven changes (lifetimes, deadlines, backoff, end of termination) happen in ``step()``; a test calls
    it, a soak runs ``ticking()``. ``pod_gpu_seconds()`` is the cluster's own count of GPU time: each pod's
    GPUs from its creation (its objects exist) until it stopped (finished, was killed, or deleted).
    """

    def __init__(self, name: str = "cluster", *, bind: Callable | None = None,
                 lifetime: Callable[[dict], float | None] | None = None, backoff_seconds: float = 0.0,
                 jobset: bool = False):
        self.name = name
        self.jobset = jobset  # serve jobset.x-k8s.io/v1alpha2 and run its controller
        self.bind = bind or default_bind
        self.lifetime = lifetime or (lambda pod: None)
        self.backoff_seconds = backoff_seconds
        self.pull_failures: set[str] = set()
        self.lock = threading.RLock()
        self.store: dict[str, dict[tuple[str, str], dict]] = {kind: {} for kind, _ in KINDS.values()}
        self.faults: list[Fault] = []
        self.fault_rate = 0.0
        # Seconds a pod whose Job or Deployment a client deleted keeps running (and holding its GPUs) while
        # Terminating, as a container given terminationGracePeriodSeconds does; 0: it stops at once.
        self.termination_grace = 0.0
        self.rng = random.Random(0)
        self.faults_injected = 0
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request served
        self.deletions: list[tuple[float, str, str, dict]] = []  # (time, kind, name, labels) of client DELETEs
        self.pod_times: dict[str, list] = {}  # pod uid -> [gpus, labels, created at, stopped at | None]
        # Pod uid -> [the last instant an answer to a client showed it holding its GPUs (listed or read not
        # finished), the latest end an answer evidenced (its own finish read, its owner's deletion accepted or
        # read)]; either None until an answer showed it (``_note_shown``). What the platform could know of it.
        self.pod_shown: dict[str, list] = {}
        self._version = 0
        # The change log the watch serves (Kubernetes API concepts, "Efficient detection of changes"): (resource
        # version, kind, ADDED/MODIFIED/DELETED, the object then), oldest first; ``_seen``: (kind, key) -> (uid, the
        # object as last logged). Versions up to ``_compacted`` are no longer kept: a watch from one is 410 Gone.
        self._log: list[tuple[int, str, str, dict]] = []
        self._seen: dict[tuple[str, tuple[str, str]], tuple[str, str, dict]] = {}  # -> (uid, body, snapshot)
        self._compacted = 0
        self.keep_changes = 10000  # changes kept for watches; older ones are compacted away
        self.lists = self.watches = 0  # collection GETs served: LISTs, and watches
        self._failed_indexes: dict[str, dict[int, int]] = {}  # Job uid -> index -> failures counted
        self._retry_at: dict[tuple[str, int], float] = {}
        self._crashed: dict[str, float] = {}  # pod uid -> when its containers crashed (CrashLoopBackOff since)
        self._server: socketserver.ThreadingTCPServer | None = None
        self._sockets: set[socket.socket] = set()
        self.holds: list[tuple[str, str, threading.Event]] = []
        self.held = 0  # requests waiting on a hold now
        self.port = 0
        self._delivering = True  # whether the answer being made reaches its client whole (``handle``)

    # --- serving ---------------------------------------------------------------------------------------------

    def __enter__(self) -> "ClusterEmulator":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again, on the same port after ``stop``)."""
        emulator = self

        class Handler(_Handler):
            cluster = emulator

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address) -> None:  # a client that hung up: nothing to report
                pass

        self._server = Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop answering: the port is closed and open connections are cut; the objects are kept."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._sockets.clear()

    # --- faults ------------------------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> Fault:
        """Fail matching calls as ``fault`` says (see ``Fault``); returns it (its ``count`` counts down)."""
        with self.lock:
            fault.since = time.monotonic()
            self.faults.append(fault)
        return fault

    def hold(self, method: str, path: str) -> threading.Event:
        """Hold requests of ``method`` whose path contains ``path`` unanswered until the returned event is set
        (a slow API server; ``held`` counts those waiting). They are then served as usual."""
        event = threading.Event()
        with self.lock:
            self.holds.append((method, path, event))
        return event

    def _wait_on_holds(self, method: str, path: str) -> None:
        for hold_method, hold_path, event in list(self.holds):
            if hold_method == method and hold_path in path and not event.is_set():
                with self.lock:
                    self.held += 1
                event.wait(60)
                with self.lock:
                    self.held -= 1

    def random_faults(self, rate: float, seed: int = 0, delay: float = 2.0) -> None:
        """Fail ``rate`` (0..1) of every call with a random fault: 404, 410, 429, 500, 503, timeout, truncated,
        empty (an empty list answers a GET of one object too: not even a well-formed object)."""
        self.fault_rate, self.rng, self.random_delay = rate, random.Random(seed), delay

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    if fault.count is not None:
                        fault.count -= 1
                    self.faults_injected += 1
                    return fault
            if self.fault_rate and self.rng.random() < self.fault_rate:
                self.faults_injected += 1
                kind = self.rng.choice([404, 410, 429, 500, 503, "timeout", "truncated", "empty"])
                return Fault(kind, delay=getattr(self, "random_delay", 2.0))
        return None

    # --- the API server ----------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: dict | None, *, delivered: bool = True) -> tuple[int, object]:
        """Answer one request: ``(HTTP status, JSON body or text)``; runs the controllers after every change.
        ``delivered``: the client gets the answer whole (False: a fault cuts it), so what it shows of pods counts
        as shown (``pod_shown``)."""
        split = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        parts = split.path.strip("/").split("/")
        with self.lock:
            self.requests.append((method, split.path))
            self._delivering = delivered
            answer = self._route(method, parts, query, body)
            if delivered and answer[0] < 300:
                self._note_shown(answer[1])
            if method != "GET":
                self._control()
            return answer

    def _note_shown(self, answer: object, now: float | None = None) -> None:
        """Record in ``pod_shown`` what ``answer`` (a JSON body given to a client) shows of pods holding their
        GPUs: a pod not finished held them at ``now``; a finished one until it stopped (its containers'
        ``finishedAt``); the pods of an owner shown being deleted until its ``deletionTimestamp`` at least."""
        if not isinstance(answer, dict):
            return
        now = now if now is not None else time.time()
        for obj in answer.get("items") if isinstance(answer.get("items"), list) else [answer]:
            kind, meta = obj.get("kind") or answer.get("kind", "").removesuffix("List"), obj.get("metadata") or {}
            record = self.pod_times.get(meta.get("uid", ""))
            if kind == "Pod" and record is not None:
                shown = self.pod_shown.setdefault(meta["uid"], [None, None])
                if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    shown[1] = max(shown[1] or 0.0, record[3] if record[3] is not None else now)
                else:
                    shown[0] = now
            elif kind in ("Job", "Deployment") and meta.get("deletionTimestamp"):
                self._note_owner_deleted(meta["uid"], _parse_micro(meta["deletionTimestamp"]))

    def _note_owner_deleted(self, owner_uid: str, at: float) -> None:
        """The pods of owner ``owner_uid`` held their GPUs until ``at`` (its deletion accepted then), or their stop."""
        for pod in self.store["Pod"].values():
            if any(r.get("uid") == owner_uid for r in pod["metadata"].get("ownerReferences") or []):
                record = self.pod_times[pod["metadata"]["uid"]]
                shown = self.pod_shown.setdefault(pod["metadata"]["uid"], [None, None])
                shown[1] = max(shown[1] or 0.0, min(at, record[3]) if record[3] is not None else at)

    def _discovery(self) -> dict:
        """``GET /apis``: the APIGroupList of the groups served (JobSet's only with ``jobset``)."""
        groups = {**API_GROUPS, **({JOBSET_GROUP: [JOBSET_VERSION]} if self.jobset else {})}
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": name, "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
             "preferredVersion": {"groupVersion": f"{name}/{versions[0]}", "version": versions[0]}}
            for name, versions in groups.items()]}

    def _route(self, method: str, parts: list[str], query: dict, body) -> tuple[int, object]:
        if parts == ["apis"] and method == "GET":
            return 200, self._discovery()
        if parts[:2] == ["apis", JOBSET_GROUP] and not self.jobset:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        prefix_len = 2 if parts[:1] == ["api"] else 3 if parts[:1] == ["apis"] else None
        if prefix_len is None or len(parts) <= prefix_len:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        prefix, rest = "/".join(parts[:prefix_len]), parts[prefix_len:]
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if (prefix, rest[0]) not in KINDS:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        kind, namespaced = KINDS[(prefix, rest[0])]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if kind == "Pod" and sub == "proxy" and namespace is not None and method == "GET":
            return self._proxy(namespace, unquote(name), "/" + "/".join(rest[3:]))
        if namespaced and namespace is None and (name is not None or method != "GET"):
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        key = (namespace or "", name or "")
        if name is None:
            if method == "GET":
                self._log_changes()
                if query.get("watch", "").lower() in ("true", "1"):
                    self.watches += 1
                    return 200, self._watch(kind, namespace, query)
                self.lists += 1
                return 200, self._list(kind, namespace, query)
            if method == "POST":
                return self._create(kind, namespace, body or {})
            return 405, status(405, "MethodNotAllowed", "method not allowed")
        obj = self.store[kind].get(key)
        if obj is None:
            return 404, status(404, "NotFound", f'{rest[0]} "{name}" not found', name=name, kind=rest[0])
        if sub == "log" and kind == "Pod":
            return 200, obj.get("_log", "")
        if sub == "eviction" and kind == "Pod" and method == "POST":
            self._disrupt(obj, "EvictionByEvictionAPI", "Eviction API: evicting")
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        if sub is not None:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            return 200, self._public(obj)
        if method in ("PATCH", "PUT"):
            return self._update(kind, key, obj, method, body or {})
        if method == "DELETE":
            self.deletions.append((time.time(), kind, name, dict(obj["metadata"].get("labels") or {})))
            if kind in ("Job", "Deployment") and self._delivering and not obj["metadata"].get("deletionTimestamp"):
                # The first DELETE accepted: its pods held them until now (a later one shows the first's time).
                self._note_owner_deleted(obj["metadata"]["uid"], time.time())
            self._delete(kind, key, cascade=True)
            return 200, self._public(obj)
        return 405, status(405, "MethodNotAllowed", "method not allowed")

    def _update(self, kind: str, key: tuple[str, str], obj: dict, method: str, body: dict) -> tuple[int, object]:
        """A merge PATCH (RFC 7386) or a PUT (replace) of ``obj``, as the API server does: a
        ``metadata.resourceVersion`` in the body is a precondition, and a stale one answers 409 Conflict ("the
        object has been modified"); a PUT without one replaces unconditionally (Kubernetes API concepts,
        "Resource versions" and "Updates to existing resources"). A PUT keeps what only the server sets (uid,
        creationTimestamp, a pod's status and controller fields) and must name the object it replaces (400). Every
        change gives the object a new resourceVersion."""
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        wanted = meta.get("resourceVersion")
        if wanted is not None and str(wanted) != obj["metadata"].get("resourceVersion"):
            name = obj["metadata"]["name"]
            return 409, status(409, "Conflict", f'Operation cannot be fulfilled on {kind.lower()}s "{name}": the '
                                                "object has been modified; please apply your changes to the latest "
                                                "version and try again", name=name, kind=kind.lower() + "s")
        if method == "PATCH":
            _merge(obj, {k: v for k, v in body.items() if k != "metadata"}
                   | {"metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}})
        else:
            if meta.get("name") not in (None, obj["metadata"]["name"]):
                return 400, status(400, "BadRequest", "the name of the object does not match the name on the URL")
            kept = {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "creationTimestamp",
                                                    "deletionTimestamp", "ownerReferences") if k in obj["metadata"]}
            private = {k: v for k, v in obj.items() if k.startswith("_")}
            replaced = json.loads(json.dumps(body))
            replaced["kind"] = kind
            replaced["metadata"] = {**{k: v for k, v in meta.items() if k != "resourceVersion"}, **kept}
            if kind == "Pod":  # a pod's status is the kubelet's: a PUT of the object does not change it
                replaced["status"] = obj.get("status", {})
            obj.clear()
            obj.update(replaced, **private)
        self._touch(obj)
        self.store[kind][key] = obj
        return 200, self._public(obj)

    def _proxy(self, namespace: str, target: str, path: str) -> tuple[int, object]:
        """The API server's pod proxy (``GET .../pods/<[scheme:]name[:port]>/proxy/<path>``): what the pod's
        workload answers on that port and path (``serve_metrics``). As a real API server: a pod that does not
        exist answers 404; one that is not running, is terminating, or listens on no such port answers 503
        (the server cannot reach it); a port left out is the pod's first declared container port."""
        pieces = target.split(":")
        if len(pieces) == 3:
            pieces = pieces[1:]  # scheme:name:port
        name, port = pieces[0], (pieces[1] if len(pieces) > 1 else "")
        pod = self.store["Pod"].get((namespace, name))
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        if not port:
            declared = [p for c in pod["spec"].get("containers") or [] for p in c.get("ports") or []]
            port = str(declared[0]["containerPort"]) if declared else ""
        if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            return 503, status(503, "ServiceUnavailable", f'error trying to reach service: pod "{name}" is not running')
        served = pod.get("_serving")
        if served is None or str(served["port"]) != port:
            return 503, status(503, "ServiceUnavailable", f"error trying to reach service: dial tcp {name}:{port}: "
                                                          "connect: connection refused")
        if path != served["path"]:
            return 404, "404 page not found\n"
        return served["status"], served["body"]

    def serve_metrics(self, pod_name: str, body: str, *, port: int | None = None, path: str = "/metrics",
                      status_code: int = 200) -> None:
        """Make pod ``pod_name``'s workload answer ``status_code`` with ``body`` (text) on ``port`` (default: its
        container port named ``metrics``) and ``path``, as seen through the API server's pod proxy; called again,
        it replaces what the pod serves. ``stop_serving`` makes the port refuse connections again."""
        with self.lock:
            pod = self._pod(pod_name)
            if port is None:
                declared = {p.get("name"): p["containerPort"] for c in pod["spec"].get("containers") or []
                            for p in c.get("ports") or []}
                port = declared["metrics"]
            pod["_serving"] = {"port": int(port), "path": path, "status": status_code, "body": body}

    def write_log(self, pod_name: str, text: str) -> None:
        """Make ``text`` pod ``pod_name``'s log (what ``GET .../pods/<name>/log`` answers)."""
        with self.lock:
            self._pod(pod_name)["_log"] = text

    def stop_serving(self, pod_name: str) -> None:
        """Pod ``pod_name``'s workload stops listening (its proxied port answers 503)."""
        with self.lock:
            self._pod(pod_name).pop("_serving", None)

    def _public(self, obj: dict) -> dict:
        return {k: v for k, v in obj.items() if not k.startswith("_")}

    def _log_changes(self) -> None:
        """Log every object added, changed or deleted since the last call (what any controller or test changed in
        place too, as the API server's storage sees every write): a change keeps the resourceVersion ``_touch``
        gave it, and one made without is given a new one. Changes past ``keep_changes`` are compacted away."""
        current, batch = set(), []
        for kind, objects in self.store.items():
            for key, obj in objects.items():
                current.add((kind, key))
                meta = obj["metadata"]
                body = json.dumps(self._public(obj), sort_keys=True, default=str).replace(
                    f'"resourceVersion": "{meta.get("resourceVersion")}"', "")
                seen = self._seen.get((kind, key))
                if seen is not None and seen[0] == meta.get("uid") and seen[1] == body:
                    continue
                if seen is not None and seen[0] != meta.get("uid"):
                    self._record_change(kind, "DELETED", seen[2])
                if not meta.get("resourceVersion") or (
                        seen is not None and meta["resourceVersion"] == seen[2]["metadata"].get("resourceVersion")):
                    self._version += 1  # changed in place, without a version of its own
                    meta["resourceVersion"] = str(self._version)
                snapshot = json.loads(json.dumps(self._public(obj), default=str))
                batch.append((int(meta["resourceVersion"]), kind, "ADDED" if seen is None or seen[0] != meta.get(
                    "uid") else "MODIFIED", snapshot))
                self._seen[(kind, key)] = (meta.get("uid"), body, snapshot)
        self._log.extend(sorted(batch, key=lambda change: change[0]))
        for gone in [k for k in self._seen if k not in current]:
            self._record_change(gone[0], "DELETED", self._seen.pop(gone)[2])
        if len(self._log) > self.keep_changes:
            self.compact(len(self._log) - self.keep_changes)

    def _record_change(self, kind: str, change: str, snapshot: dict) -> None:
        self._version += 1
        snapshot = {**snapshot, "metadata": {**snapshot["metadata"], "resourceVersion": str(self._version)}}
        self._log.append((self._version, kind, change, snapshot))

    def compact(self, changes: int | None = None) -> None:
        """Forget the oldest ``changes`` logged changes (default all), as etcd compaction does: a watch from a
        version before what is kept answers 410 Gone."""
        with self.lock:
            self._log_changes()
            drop = len(self._log) if changes is None else min(changes, len(self._log))
            if drop:
                self._compacted = self._log[drop - 1][0]
                del self._log[:drop]

    def _watch(self, kind: str, namespace: str | None, query: dict) -> str:
        """A watch (``?watch=true``): the events since ``resourceVersion`` of ``kind`` matching the selectors, one
        JSON object a line, then a BOOKMARK at the newest version when ``allowWatchBookmarks`` is set; the stream
        ends there (a server may end a watch at any time; the client resumes from the last version it got). No
        version (or "0"): every matching object as ADDED first. A version no longer kept: one ERROR event, a 410
        Gone Status with reason Expired; a version newer than any: 504 "Too large resource version"."""
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        version = query.get("resourceVersion", "")
        api_version = "v1" if kind in ("Pod", "Service", "Namespace", "Node", "ConfigMap") else ""

        def line(change: str, obj: dict) -> str:
            return json.dumps({"type": change, "object": obj}) + "\n"

        def matches(obj: dict) -> bool:
            meta = obj.get("metadata") or {}
            return ((namespace is None or meta.get("namespace") == namespace)
                    and _selector_matches(labels, meta.get("labels") or {}) and _field_matches(fields, obj))

        if version in ("", "0"):
            out = [line("ADDED", self._public(o)) for o in self.store[kind].values() if matches(o)]
        elif not version.isdigit():
            return line("ERROR", status(400, "BadRequest", f"invalid resource version: {version}"))
        elif int(version) < self._compacted:
            return line("ERROR", status(410, "Expired", f"too old resource version: {version} ({self._compacted})"))
        elif int(version) > self._version:
            return line("ERROR", status(504, "Timeout", f"Too large resource version: {version}, current: "
                                                        f"{self._version}"))
        else:
            out = [line(change, obj) for at, k, change, obj in self._log
                   if k == kind and at > int(version) and matches(obj)]
        if query.get("allowWatchBookmarks", "").lower() in ("true", "1"):
            out.append(line("BOOKMARK", {"kind": kind, "apiVersion": api_version or "v1",
                                         "metadata": {"resourceVersion": str(self._version)}}))
        return "".join(out)

    def _list(self, kind: str, namespace: str | None, query: dict) -> dict:
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        items = [self._public(o) for (ns, _), o in self.store[kind].items()
                 if (namespace is None or ns == namespace)
                 and _selector_matches(labels, o["metadata"].get("labels") or {}) and _field_matches(fields, o)]
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)},
                "items": items}

    def _touch(self, obj: dict) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    def _create(self, kind: str, namespace: str | None, body: dict, now: float | None = None) -> tuple[int, dict]:
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            return 422, status(422, "Invalid", f"{kind}: metadata.name: Required value")
        if namespace is not None and kind != "Namespace" and ("", namespace) not in self.store["Namespace"]:
            return 404, status(404, "NotFound", f'namespaces "{namespace}" not found', name=namespace,
                               kind="namespaces")
        key = (namespace or "", name)
        if key in self.store[kind]:
            return 409, status(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists', name=name,
                               kind=kind.lower() + "s")
        now = now if now is not None else time.time()
        obj = json.loads(json.dumps(body))
        obj["kind"] = kind
        obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=micro_time(now), generation=1)
        if namespace is not None:
            obj["metadata"]["namespace"] = namespace
        obj.setdefault("status", {})
        if kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        if kind == "Pod":
            obj["status"] = {"phase": "Pending"}
            self.pod_times[obj["metadata"]["uid"]] = [pod_gpus(obj), dict(meta.get("labels") or {}), now, None]
        self._touch(obj)
        self.store[kind][key] = obj
        return 201, self._public(obj)

    def _delete(self, kind: str, key: tuple[str, str], cascade: bool, now: float | None = None) -> None:
        obj = self.store[kind].pop(key, None)
        if obj is None:
            return
        now = now if now is not None else time.time()
        if kind == "Pod":
            self._stop_pod(obj, now)
        if cascade and kind in ("Job", "Deployment"):
            uid = obj["metadata"]["uid"]
            lingering = False
            for pkey, pod in list(self.store["Pod"].items()):
                if any(r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or []):
                    if self.termination_grace > 0 and pod["status"].get("phase") == "Running":
                        # Terminating, still running until its grace ends (``step``): slow to go. As the API
                        # server does, its deletionTimestamp is the deadline (now + the grace period), set once.
                        pod["_grace_until"] = pod.get("_grace_until", now + self.termination_grace)
                        pod["metadata"].setdefault("deletionTimestamp", micro_time(pod["_grace_until"]))
                        pod["metadata"].setdefault("deletionGracePeriodSeconds", int(self.termination_grace))
                        self._touch(pod)
                        lingering = True
                        continue
                    self._delete("Pod", pkey, cascade=False, now=now)
            if lingering:  # Foreground deletion: the owner stays, being deleted, until its pods are gone (``step``)
                obj["metadata"].setdefault("deletionTimestamp", micro_time(now))
                self.store[kind][key] = obj
                self._touch(obj)
        if cascade and kind == "JobSet":  # its child Jobs (and their pods) and its Service go with it
            uid = obj["metadata"]["uid"]
            for other in ("Job", "Service"):
                for okey, owned in list(self.store[other].items()):
                    if any(r.get("uid") == uid for r in owned["metadata"].get("ownerReferences") or []):
                        self._delete(other, okey, cascade=True, now=now)
        if kind == "Namespace":
            for other in ("Pod", "Service", "Job", "Deployment", "ConfigMap", "JobSet"):
                for okey in [k for k in self.store[other] if k[0] == key[1]]:
                    self._delete(other, okey, cascade=True, now=now)

    # --- pods: binding, running, stopping ----------------------------------------------------------------------

    def _stop_pod(self, pod: dict, now: float) -> None:
        record = self.pod_times.get(pod["metadata"]["uid"])
        if record is not None and record[3] is None:
            record[3] = now

    def _bind_and_run(self, pod: dict, now: float) -> None:
        if pod["spec"].get("nodeName") or pod["status"].get("phase") != "Pending":
            return
        node = self.bind(pod, [self._public(n) for n in self.store["Node"].values()],
                         [self._public(p) for p in self.store["Pod"].values()])
        if node is None:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": "0/0 nodes are available", "lastTransitionTime": micro_time(now)}]
            return
        pod["spec"]["nodeName"] = node
        images = {c.get("image") for c in pod["spec"]["containers"]}
        if images & self.pull_failures:
            pod["status"]["containerStatuses"] = [
                {"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""), "imageID": "",
                 "state": {"waiting": {"reason": "ImagePullBackOff", "message": f"pull of {c.get('image')} failed"}}}
                for c in pod["spec"]["containers"]]
            return
        pod["status"].update(phase="Running", startTime=micro_time(now), conditions=[
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": micro_time(now)},
            {"type": "Ready", "status": "True", "lastTransitionTime": micro_time(now)}])
        pod["status"]["containerStatuses"] = [
            {"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""), "imageID": "",
             "state": {"running": {"startedAt": micro_time(now)}}} for c in pod["spec"]["containers"]]
        self._touch(pod)

    def finish_pod(self, pod_name: str, exit_code: int = 0, reason: str = "", now: float | None = None) -> None:
        """End a pod's containers with ``exit_code`` (0: Succeeded; else Failed; ``reason`` e.g. OOMKilled)."""
        with self.lock:
            pod = self._pod(pod_name)
            self._terminate(pod, exit_code, reason or ("Completed" if exit_code == 0 else "Error"),
                            now if now is not None else time.time())
            self._control()

    def crash_pod(self, pod_name: str, exit_code: int = 1, reason: str = "Error", now: float | None = None) -> None:
        """A pod's server exits by itself under ``restartPolicy: Always`` (a Deployment's pods), as the kubelet
        shows it: the pod stays Running and holds its GPUs, its containers' exit is in ``lastState.terminated``
        (``reason`` e.g. OOMKilled), ``restartCount`` grows, they wait in CrashLoopBackOff (not Ready) and start
        again at the first ``step()`` ``backoff_seconds`` later."""
        with self.lock:
            pod, now = self._pod(pod_name), now if now is not None else time.time()
            for cs in pod["status"].get("containerStatuses") or []:
                started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", micro_time(now))
                cs.update(ready=False, restartCount=int(cs.get("restartCount") or 0) + 1,
                          lastState={"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started,
                                                    "finishedAt": micro_time(now)}},
                          state={"waiting": {"reason": "CrashLoopBackOff",
                                             "message": f"back-off restarting failed container {cs['name']}"}})
            for condition in pod["status"].get("conditions") or []:
                if condition["type"] == "Ready":
                    condition.update(status="False", lastTransitionTime=micro_time(now))
            self._crashed[pod["metadata"]["uid"]] = now
            self._touch(pod)
            self._control(now)

    def _restart_crashed(self, pod: dict, now: float) -> None:
        """Start a crashed pod's containers again once its back-off is over (see ``crash_pod``)."""
        crashed = self._crashed.get(pod["metadata"]["uid"])
        if crashed is None or now - crashed < self.backoff_seconds:
            return
        del self._crashed[pod["metadata"]["uid"]]
        for cs in pod["status"].get("containerStatuses") or []:
            cs.update(ready=True, state={"running": {"startedAt": micro_time(now)}})
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] == "Ready":
                condition.update(status="True", lastTransitionTime=micro_time(now))
        self._touch(pod)

    def _terminate(self, pod: dict, exit_code: int, reason: str, now: float) -> None:
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            return
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        pod["status"]["containerStatuses"] = [
            {"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""), "imageID": "",
             "state": {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": pod["status"].get(
                 "startTime", micro_time(now)), "finishedAt": micro_time(now)}}} for c in pod["spec"]["containers"]]
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] == "Ready":
                condition.update(status="False", lastTransitionTime=micro_time(now))
        self._stop_pod(pod, now)
        self._touch(pod)

    def _disrupt(self, pod: dict, reason: str, message: str, now: float | None = None, status_reason: str = "") -> None:
        """Kill ``pod``'s containers and mark it Terminating with a DisruptionTarget condition (``reason``)."""
        now = now if now is not None else time.time()
        conditions = [c for c in pod["status"].get("conditions") or [] if c.get("type") != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
                           "lastTransitionTime": micro_time(now)})
        self._terminate(pod, 143, "Error", now)
        pod["status"]["phase"] = "Failed"
        pod["status"]["conditions"] = conditions
        if status_reason:
            pod["status"]["reason"] = status_reason
        pod["metadata"]["deletionTimestamp"] = micro_time(now)
        self._touch(pod)

    def evict(self, pod_name: str) -> None:
        """What ``POST .../pods/<name>/eviction`` does (e.g. a node drain)."""
        with self.lock:
            self._disrupt(self._pod(pod_name), "EvictionByEvictionAPI", "Eviction API: evicting")
            self._control()

    def delete_pod(self, pod_name: str) -> None:
        """A plain ``kubectl delete pod`` by someone else: Terminating (no DisruptionTarget) until ``step()``."""
        with self.lock:
            pod, now = self._pod(pod_name), time.time()
            self._terminate(pod, 143, "Error", now)
            pod["metadata"]["deletionTimestamp"] = micro_time(now)
            self._control()

    def add_node(self, name: str, gpus: int = 8, labels: dict | None = None, taints: list[dict] = ()) -> dict:
        """Register a Ready node with ``gpus`` allocatable GPUs, ``labels`` and ``taints`` (``spec.taints``)."""
        with self.lock:
            _, node = self._create("Node", None, {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "labels": dict(labels or {})}, "spec": {"taints": list(taints)}, "status": {}})
            stored = self.store["Node"][("", name)]
            stored["status"] = {"allocatable": {GPU: str(gpus), "cpu": "64", "memory": "512Gi"},
                                "capacity": {GPU: str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]}
            self._control()
            return self._public(stored)

    def delete_node(self, name: str, reason: str = "DeletionByPodGC", status_reason: str = "") -> None:
        """The node goes (scale-down, hardware loss): its pods fail with DisruptionTarget ``reason`` and terminate."""
        with self.lock:
            now = time.time()
            self.store["Node"].pop(("", name), None)
            for pod in list(self.store["Pod"].values()):
                if pod["spec"].get("nodeName") == name and not pod["metadata"].get("deletionTimestamp"):
                    self._disrupt(pod, reason, f"node {name} is gone", now, status_reason)
            self._control()

    def interrupt_spot(self, name: str) -> None:
        """A spot reclaim: the provider shuts the node down (pods: TerminationByKubelet, reason Terminated), it goes."""
        self.delete_node(name, reason="TerminationByKubelet", status_reason="Terminated")

    def _pod(self, name: str) -> dict:
        for (_, pod_name), pod in self.store["Pod"].items():
            if pod_name == name:
                return pod
        raise KeyError(name)

    # --- controllers -------------------------------------------------------------------------------------------

    def step(self, now: float | None = None) -> None:
        """Let time-driven changes happen: pods end after their lifetime, Terminating pods go, deadlines, backoff."""
        with self.lock:
            now = now if now is not None else time.time()
            for key, pod in list(self.store["Pod"].items()):
                if pod["metadata"].get("deletionTimestamp"):
                    if now < pod.get("_grace_until", now):
                        continue  # still running out its termination grace, its GPUs held
                    self._delete("Pod", key, cascade=False, now=now)
                    continue
                if pod["status"].get("phase") == "Running":
                    self._restart_crashed(pod, now)
                    lifetime = self.lifetime(self._public(pod))
                    if lifetime is not None and now - self.pod_times[pod["metadata"]["uid"]][2] >= lifetime:
                        self._terminate(pod, 0, "Completed", now)
            for kind in ("Job", "Deployment"):  # a Foreground deletion ends once the owner's pods are gone
                for key, owner in list(self.store[kind].items()):
                    if owner["metadata"].get("deletionTimestamp") and not self._owned_pods(owner):
                        self.store[kind].pop(key, None)
            self._control(now)

    def ticking(self, every: float = 0.1) -> "Ticker":
        """A thread calling ``step()`` every ``every`` seconds until its ``stop()``."""
        return Ticker(self, every)

    def _control(self, now: float | None = None) -> None:
        now = now if now is not None else time.time()
        for _ in range(2):  # the second round records the status of the pods the first created and bound
            for jobset in list(self.store["JobSet"].values()):
                if not jobset["metadata"].get("deletionTimestamp"):
                    self._control_jobset(jobset, now)
            for job in list(self.store["Job"].values()):
                if not job["metadata"].get("deletionTimestamp"):  # being deleted: no new pods
                    self._control_job(job, now)
            for deployment in list(self.store["Deployment"].values()):
                if not deployment["metadata"].get("deletionTimestamp"):
                    self._control_deployment(deployment, now)
            for pod in list(self.store["Pod"].values()):
                if not pod["metadata"].get("deletionTimestamp"):
                    self._bind_and_run(pod, now)

    def _owned_pods(self, owner: dict) -> list[dict]:
        uid = owner["metadata"]["uid"]
        return [p for p in self.store["Pod"].values()
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

    def _new_pod(self, owner: dict, name: str, template: dict, now: float, annotations: dict | None = None,
                 extra_labels: dict | None = None) -> dict:
        meta = owner["metadata"]
        labels = {**((template.get("metadata") or {}).get("labels") or {}), **(extra_labels or {})}
        # A controller's pods carry the template's annotations, then its own (the Job's completion index).
        annotations = {**((template.get("metadata") or {}).get("annotations") or {}), **(annotations or {})}
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels, "annotations": annotations,
                             "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                                  "name": meta["name"], "uid": meta["uid"], "controller": True}]},
                "spec": json.loads(json.dumps(template["spec"]))}
        self._create("Pod", meta["namespace"], body, now)
        return self.store["Pod"][(meta["namespace"], name)]

    def _control_job(self, job: dict, now: float) -> None:
        spec, st = job["spec"], job.setdefault("status", {})
        if any(c.get("status") == "True" and c.get("type") in ("Complete", "Failed") for c in st.get("conditions") or []):
            return
        st.setdefault("startTime", job["metadata"]["creationTimestamp"])
        uid, completions = job["metadata"]["uid"], int(spec.get("completions") or 1)
        failures = self._failed_indexes.setdefault(uid, {})
        pods = self._owned_pods(job)
        by_index: dict[int, list[dict]] = defaultdict(list)
        for pod in pods:
            by_index[int(pod["metadata"]["annotations"][COMPLETION_INDEX])].append(pod)
        counted = job.setdefault("_counted", set())
        for pod in pods:  # a failed pod, or one deleted before it succeeded, counts once as a failure
            if pod["metadata"]["uid"] not in counted and (pod["status"].get("phase") == "Failed"
                                                          or pod["metadata"].get("deletionTimestamp")) \
                    and pod["status"].get("phase") != "Succeeded":
                counted.add(pod["metadata"]["uid"])
                index = int(pod["metadata"]["annotations"][COMPLETION_INDEX])
                failures[index] = failures.get(index, 0) + 1
        for index in range(completions):
            seen = {p["metadata"]["uid"] for p in by_index.get(index, [])}
            for lost_uid in job.setdefault("_index_pods", {}).get(index, set()) - seen - counted:
                counted.add(lost_uid)  # vanished without a trace (force-deleted): a failure as well
                failures[index] = failures.get(index, 0) + 1
        failed, succeeded = sum(failures.values()), set()
        for index, index_pods in by_index.items():
            if any(p["status"].get("phase") == "Succeeded" for p in index_pods):
                succeeded.add(index)
        active = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")
                  and not p["metadata"].get("deletionTimestamp")]
        deadline = spec.get("activeDeadlineSeconds")
        started = _parse_micro(st["startTime"])
        if failed > int(spec.get("backoffLimit", 6)):
            active = self._fail_job(job, active, "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                                    now)
        elif deadline is not None and now - started >= float(deadline):
            active = self._fail_job(job, active, "DeadlineExceeded", "Job was active longer than specified deadline",
                                    now)
        elif len(succeeded) >= completions:
            st["conditions"] = [{"type": t, "status": "True", "reason": "CompletionsReached",
                                 "message": "Reached expected number of succeeded pods",
                                 "lastTransitionTime": micro_time(now), "lastProbeTime": micro_time(now)}
                                for t in ("SuccessCriteriaMet", "Complete")]
            st["completionTime"] = micro_time(now)
        else:
            for index in range(completions):
                if index in succeeded or any(p in active for p in by_index.get(index, [])):
                    continue
                if failures.get(index) and now < self._retry_at.setdefault((uid, index), now + self.backoff_seconds):
                    continue
                self._retry_at.pop((uid, index), None)
                name = f"{job['metadata']['name']}-{index}-{uuid.uuid4().hex[:5]}"
                pod = self._new_pod(job, name, spec["template"], now, {COMPLETION_INDEX: str(index)},
                                    {COMPLETION_INDEX: str(index), "batch.kubernetes.io/controller-uid": uid})
                pod["spec"].setdefault("hostname", f"{job['metadata']['name']}-{index}")
                job["_index_pods"].setdefault(index, set()).add(pod["metadata"]["uid"])
                active.append(pod)
        st.update(active=len(active), failed=failed, succeeded=len(succeeded))
        self._touch(job)

    def _control_jobset(self, jobset: dict, now: float) -> None:
        """The JobSet controller's one round for ``jobset`` (see the class docstring)."""
        meta, spec, st = jobset["metadata"], jobset["spec"], jobset.setdefault("status", {})
        if any(c.get("status") == "True" and c.get("type") in ("Completed", "Failed") for c in st.get("conditions") or []):
            return
        owner = [{"apiVersion": jobset["apiVersion"], "kind": "JobSet", "name": meta["name"], "uid": meta["uid"],
                  "controller": True}]
        network = spec.get("network") or {}
        subdomain = network.get("subdomain") or meta["name"]
        made = jobset.setdefault("_made", set())
        if "service" not in made:
            made.add("service")
            self._create("Service", meta["namespace"], {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": subdomain, "ownerReferences": owner, "labels": {JOBSET_NAME_LABEL: meta["name"]}},
                "spec": {"clusterIP": "None", "selector": {JOBSET_NAME_LABEL: meta["name"]},
                         "publishNotReadyAddresses": network.get("publishNotReadyAddresses", True)}}, now)
        children: dict[str, list[dict]] = defaultdict(list)
        for rjob in spec.get("replicatedJobs") or []:
            for index in range(int(rjob.get("replicas", 1))):
                name = f"{meta['name']}-{rjob['name']}-{index}"
                key = (meta["namespace"], name)
                if name not in made:  # created once: with maxRestarts 0 a child Job is never made again
                    made.add(name)
                    template = json.loads(json.dumps(rjob["template"]))
                    ours = {JOBSET_NAME_LABEL: meta["name"], REPLICATED_JOB_LABEL: rjob["name"],
                            JOB_INDEX_LABEL: str(index)}
                    job_meta = template.get("metadata") or {}
                    pod_template = template["spec"]["template"]
                    pod_template.setdefault("metadata", {})["labels"] = {
                        **((pod_template.get("metadata") or {}).get("labels") or {}), **ours}
                    if network.get("enableDNSHostnames"):
                        pod_template["spec"]["subdomain"] = subdomain
                    self._create("Job", meta["namespace"], {
                        "apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": name, "labels": {**(job_meta.get("labels") or {}), **ours},
                                     "annotations": dict(job_meta.get("annotations") or {}), "ownerReferences": owner},
                        "spec": template["spec"]}, now)
                if key in self.store["Job"]:
                    children[rjob["name"]].append(self.store["Job"][key])

        def has(job: dict, kind: str) -> bool:
            return any(c.get("type") == kind and c.get("status") == "True"
                       for c in (job.get("status") or {}).get("conditions") or [])

        policy = spec.get("successPolicy") or {}
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in spec.get("replicatedJobs") or []]
        done = [all(has(j, "Complete") for j in children.get(t, [])) and bool(children.get(t)) for t in targets]
        failed = next((j for jobs in children.values() for j in jobs if has(j, "Failed")), None)
        if failed is not None:
            condition = ("Failed", "FailedJobs", f"jobset failed due to reaching max number of restarts: "
                                                 f"{failed['metadata']['name']} failed")
        elif (all(done) if policy.get("operator", "All") == "All" else any(done)):
            condition = ("Completed", "AllJobsCompleted", "jobset completed successfully")
        else:
            return
        st["conditions"] = [{"type": condition[0], "status": "True", "reason": condition[1], "message": condition[2],
                             "lastTransitionTime": micro_time(now)}]
        self._touch(jobset)
        for jobs in children.values():  # a finished JobSet's active child Jobs are deleted
            for job in jobs:
                if not (has(job, "Complete") or has(job, "Failed")):
                    self._delete("Job", (meta["namespace"], job["metadata"]["name"]), cascade=True, now=now)

    def _fail_job(self, job: dict, active: list[dict], reason: str, message: str, now: float) -> list:
        job["status"]["conditions"] = [{"type": t, "status": "True", "reason": reason, "message": message,
                                        "lastTransitionTime": micro_time(now), "lastProbeTime": micro_time(now)}
                                       for t in ("FailureTarget", "Failed")]
        for pod in active:  # the Job controller terminates what still runs
            self._terminate(pod, 143, "Error", now)
            pod["metadata"]["deletionTimestamp"] = micro_time(now)
        return []

    def _control_deployment(self, deployment: dict, now: float) -> None:
        want = int(deployment["spec"].get("replicas", 1))
        # The pod-template-hash: of the template, so a changed template is told from the pods made before it.
        template_hash = hashlib.sha256(json.dumps(deployment["spec"]["template"], sort_keys=True).encode()
                                       ).hexdigest()[:10]
        owned = self._owned_pods(deployment)
        stale = [p for p in owned if (p["metadata"].get("labels") or {}).get("pod-template-hash") != template_hash]
        if stale:  # strategy Recreate (what the platform uses): the old pods go before a new one is made
            for pod in stale:
                if not pod["metadata"].get("deletionTimestamp"):
                    self._retire_pod(pod, now)
            if any((p["metadata"].get("labels") or {}).get("pod-template-hash") != template_hash
                   for p in self._owned_pods(deployment)):
                deployment["status"] = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0,
                                        "updatedReplicas": 0, "observedGeneration": 1}
                self._touch(deployment)
                return
        pods = [p for p in self._owned_pods(deployment) if not p["metadata"].get("deletionTimestamp")
                and p["status"].get("phase") in ("Pending", "Running")]
        for pod in pods[want:]:
            self._delete("Pod", (pod["metadata"]["namespace"], pod["metadata"]["name"]), cascade=False, now=now)
        for _ in range(want - len(pods)):
            name = f"{deployment['metadata']['name']}-{template_hash}-{uuid.uuid4().hex[:5]}"
            pods.append(self._new_pod(deployment, name, deployment["spec"]["template"], now,
                                      extra_labels={"pod-template-hash": template_hash}))
        ready = sum(1 for p in pods if p["status"].get("phase") == "Running" and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions") or []))
        deployment["status"] = {"replicas": len(pods[:want]), "readyReplicas": ready, "availableReplicas": ready,
                                "updatedReplicas": len(pods[:want]), "observedGeneration": 1}
        self._touch(deployment)

    def _retire_pod(self, pod: dict, now: float) -> None:
        """A controller deletes ``pod``: Terminating for ``termination_grace`` while it runs (its GPUs held until
        ``step`` ends it), else gone at once."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if self.termination_grace > 0 and pod["status"].get("phase") == "Running":
            pod["_grace_until"] = pod.get("_grace_until", now + self.termination_grace)
            pod["metadata"].setdefault("deletionTimestamp", micro_time(pod["_grace_until"]))
            pod["metadata"].setdefault("deletionGracePeriodSeconds", int(self.termination_grace))
            self._touch(pod)
            return
        self._delete("Pod", key, cascade=False, now=now)

    # --- what the cluster saw ---------------------------------------------------------------------------------

    def pods(self, attempt_id: int | None = None) -> list[dict]:
        """The pods (Terminating ones too), all or those of attempt ``attempt_id``."""
        with self.lock:
            return [self._public(p) for p in self.store["Pod"].values()
                    if attempt_id is None or (p["metadata"].get("labels") or {}).get(ATTEMPT_LABEL) == str(attempt_id)]

    def objects(self, kind: str, attempt_id: int | None = None) -> list[dict]:
        """The stored objects of ``kind`` (Job, Deployment, Service...), all or those of one attempt."""
        with self.lock:
            return [self._public(o) for o in self.store[kind].values()
                    if attempt_id is None or (o["metadata"].get("labels") or {}).get(ATTEMPT_LABEL) == str(attempt_id)]

    def pod_gpu_seconds(self, attempt_id: int | None = None, now: float | None = None) -> float:
        """GPU-seconds of the pods (of one attempt): GPUs x (stopped, or ``now``, - created), summed."""
        now = now if now is not None else time.time()
        with self.lock:
            return sum(gpus * ((stopped or now) - bound) for gpus, labels, bound, stopped in self.pod_times.values()
                       if attempt_id is None or labels.get(ATTEMPT_LABEL) == str(attempt_id))


COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def _parse_micro(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _merge(target: dict, patch: dict) -> None:
    """JSON merge patch (RFC 7386) of ``patch`` into ``target``."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


class Ticker:
    """A background thread that calls ``cluster.step()`` every ``every`` seconds; ``stop()`` ends it."""

    def __init__(self, cluster: ClusterEmulator, every: float):
        self.cluster, self.every = cluster, every
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.every):
            self.cluster.step()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)


class _Handler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive) front of a ClusterEmulator: reads JSON bodies, applies injected faults, answers JSON."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: without this each answer waits ~40 ms
    cluster: ClusterEmulator

    def log_message(self, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.cluster._sockets.add(self.connection)

    def finish(self) -> None:
        self.cluster._sockets.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.cluster._wait_on_holds(self.command, self.path)
        fault = self.cluster._fault_for(self.command, self.path)
        if fault is not None and fault.kind == "empty":
            self._answer(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
            return
        if fault is not None and fault.kind == "timeout":
            time.sleep(fault.delay)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault is not None and fault.kind != "truncated":
            code = int(fault.kind)
            self._answer(code, status(code, _FAULT_REASONS.get(code, "InternalError"), f"injected {code}"))
            return
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            self._answer(400, status(400, "BadRequest", "the body is not JSON"))
            return
        if self.command == "DELETE" and isinstance(body, dict) and body.get("kind") == "DeleteOptions":
            body = None
        code, answer = self.cluster.handle(self.command, self.path, body, delivered=fault is None)
        if fault is not None:  # truncated: the answer is cut in the middle
            data = json.dumps(answer).encode()
            self._answer(200, data[: max(1, len(data) // 2)])
            return
        self._answer(code, answer)

    def _answer(self, code: int, answer) -> None:
        if isinstance(answer, bytes):
            data, kind = answer, "application/json"
        elif isinstance(answer, str):
            data, kind = answer.encode(), "text/plain"
        else:
            data, kind = json.dumps(answer).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve
