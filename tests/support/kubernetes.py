"""Several kmock KubernetesEmulator servers on real TCP ports, run by a background event loop, and a test kubelet.

The backend under test is synchronous (the official client over urllib3),
so the emulators live in a thread with their own asyncio loop, each inside
``async with`` (errors come back as real Status objects). ``Kubelet`` plays
the cluster's controllers over HTTP: it creates a Job's pods and moves their
status, and garbage-collects the pods of deleted Jobs.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading

import aiohttp.test_utils
import aiohttp.web
import kmock
import urllib3

RESOURCES = ["v1/namespaces", "v1/services", "v1/pods", "v1/nodes", "batch/v1/jobs", "apps/v1/deployments"]


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
        handler = kmock.KubernetesEmulator()
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
            self.in_flight += 1
            try:
                return await self.emulator(request)
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


    def _missing_namespace(self, parts: list[str]) -> str:
        """The namespace of a namespaced collection path (``/api/v1/namespaces/<ns>/<kind>``,
        ``/apis/<group>/<version>/namespaces/<ns>/<kind>``) when it does not exist, else ""."""
        index = 2 if parts[:1] == ["api"] else 3 if parts[:1] == ["apis"] else None
        if index is None or len(parts) != index + 3 or parts[index] != "namespaces":
            return ""
        return "" if parts[index + 1] in self.namespaces else parts[index + 1]


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class Kubelet:
    """The cluster side of one emulator, over HTTP: Job controller, kubelet and pod garbage collector, by hand."""

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
