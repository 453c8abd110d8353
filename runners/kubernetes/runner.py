"""The ``kubernetes`` backend: creates, observes and deletes an attempt's objects on a cluster's API server.

Dispatch is idempotent (a 409 for an object this attempt owns means it was
created before); observe makes one LIST per kind per cluster, by label
selector, and maps Jobs, Deployments and Pods to attempts through the
``controlplane.io/attempt`` label.
"""

from __future__ import annotations

import codecs
import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from urllib.parse import quote

import urllib3

from django.conf import settings
from django.utils import timezone

from ..base import (ABSENT, Backend, ClusterUnreachable, Observation, PermanentDispatchError, PoolCapacity,
                    TransientDispatchError, register)
from . import manifests as m
from .client import ApiError, ClusterClient, client_for

log = logging.getLogger(__name__)

SELECTOR = m.LABEL_JOB  # "label exists": every object the platform created
IMAGE_PULL_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})
# Pod status reasons and condition reasons that mean the node or the pod was taken away, not that the work failed
# (Kubernetes docs "Pod disruption conditions": DisruptionTarget with PreemptionByScheduler,
# DeletionByTaintManager, EvictionByEvictionAPI, DeletionByPodGC, TerminationByKubelet).
LOST_POD_REASONS = frozenset({"Evicted", "NodeLost", "Preempting", "Shutdown", "NodeShutdown", "Terminated"})
SPOT_LOST_REASONS = frozenset({"PreemptionByScheduler", "DeletionByTaintManager", "TerminationByKubelet"})


def team_namespace(team_slug: str) -> str:
    """``settings.K8S_NAMESPACE_PREFIX`` + the team slug (e.g. ``cp-ml-research``)."""
    return m.namespace_name(settings.K8S_NAMESPACE_PREFIX, team_slug)


def workload(attempt) -> m.Workload:
    """The ``manifests.Workload`` of ``attempt`` (reads its job, team, node pool, accelerator and cluster)."""
    job = attempt.job
    spec = job.spec or {}
    resources = spec.get("resources") or {}
    env = spec.get("env") or {}
    if not isinstance(env, dict):
        raise PermanentDispatchError("spec.env must map strings to strings")
    return m.Workload(
        name=attempt.object_name, namespace=team_namespace(job.team.slug), team=job.team.slug, job_id=job.pk,
        attempt_id=attempt.pk, attempt_number=attempt.number, kind=job.kind, image=spec.get("image") or "",
        command=tuple(spec.get("command") or ()), args=tuple(spec.get("args") or ()),
        env=tuple(sorted((str(k), str(v)) for k, v in env.items())), nodes=job.nodes, gpus_per_node=job.gpus_per_node,
        cpu=resources.get("cpu"), memory_gib=resources.get("memory_gib"),
        gpu_product=attempt.node_pool.accelerator.product_label, provider=attempt.cluster.provider,
        spot=attempt.node_pool.capacity_type == "spot", max_runtime_seconds=job.max_runtime_seconds,
        replicas=int(spec.get("replicas") or 1), port=int(spec.get("port") or 8000),
        master_port=settings.K8S_MASTER_PORT, checkpoint_claim=settings.K8S_CHECKPOINT_CLAIM,
        checkpoint_uri=m.checkpoint_uri(settings.CHECKPOINT_STORE_URI, job.team.slug, job.pk),
        node_names=tuple((attempt.placement or {}).get("nodes") or ()),
    )


# Collection paths of the kinds dispatch creates, by kind (Kubernetes API reference: "HTTP request" of each create).
_COLLECTIONS = {"Job": "/apis/batch/v1/namespaces/{namespace}/jobs",
                "Deployment": "/apis/apps/v1/namespaces/{namespace}/deployments",
                "Service": "/api/v1/namespaces/{namespace}/services"}


def _api(c: ClusterClient, kind: str):
    """``(create, read, delete, list_all)`` client methods for ``kind`` (Job, Deployment, Service)."""
    if kind == "Job":
        return (c.batch.create_namespaced_job, c.batch.read_namespaced_job, c.batch.delete_namespaced_job,
                c.batch.list_job_for_all_namespaces)
    if kind == "Deployment":
        return (c.apps.create_namespaced_deployment, c.apps.read_namespaced_deployment,
                c.apps.delete_namespaced_deployment, c.apps.list_deployment_for_all_namespaces)
    if kind == "Service":
        return (c.core.create_namespaced_service, c.core.read_namespaced_service, c.core.delete_namespaced_service,
                c.core.list_service_for_all_namespaces)
    raise ValueError(kind)


class _NamespaceMissing(Exception):
    """An object create answered 404 for a namespace the client had cached as existing."""


def _dispatch_error(exc: ApiError, what: str) -> Exception:
    """Transient for 408, 429 and 5xx (and 409 conflicts of a concurrent change); permanent for the rest (400/403/404/422)."""
    text = f"{what}: HTTP {exc.status} {exc.reason}: {exc.message}"
    if exc.status in (408, 429) or exc.status >= 500:
        return TransientDispatchError(text)
    return PermanentDispatchError(text)


def _labels(obj: dict) -> dict:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _attempt_of(obj: dict) -> int | None:
    value = _labels(obj).get(m.LABEL_ATTEMPT)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _parse_time(value) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _conditions(obj: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in ((obj.get("status") or {}).get("conditions") or []) if c.get("status") == "True"}


def _container_statuses(pod: dict) -> list[dict]:
    status = pod.get("status") or {}
    return (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])


def pod_lost(pod: dict) -> Observation | None:
    """``lost`` when ``pod`` was evicted, preempted or lost its node (DisruptionTarget, reason Evicted...), else None."""
    status = pod.get("status") or {}
    disruption = _conditions(pod).get("DisruptionTarget")
    name = (pod.get("metadata") or {}).get("name", "?")
    if disruption is not None:
        reason = disruption.get("reason") or ""
        end = "Preempted" if reason in SPOT_LOST_REASONS else "Evicted"
        return Observation("lost", end, None, f"pod {name}: {reason}: {disruption.get('message') or ''}".strip())
    if status.get("reason") in LOST_POD_REASONS:
        end = "NodeLost" if status["reason"] == "NodeLost" else "Evicted"
        return Observation("lost", end, None, f"pod {name}: {status['reason']}: {status.get('message') or ''}".strip())
    return None


def pod_failure(pod: dict) -> Observation | None:
    """The failure of a pod's containers: OOMKilled, or a non-zero exit with its code; None when none failed."""
    name = (pod.get("metadata") or {}).get("name", "?")
    for cs in _container_statuses(pod):
        terminated = ((cs.get("state") or {}).get("terminated")) or ((cs.get("lastState") or {}).get("terminated"))
        if not terminated:
            continue
        code = terminated.get("exitCode")
        if terminated.get("reason") == "OOMKilled":
            return Observation("failed", "OOMKilled", code, f"pod {name}: container {cs.get('name')} ran out of memory")
        if code not in (None, 0):
            return Observation("failed", "Failed", code,
                               f"pod {name}: container {cs.get('name')} exited with code {code}"
                               + (f" ({terminated['reason']})" if terminated.get("reason") else ""))
    return None


def image_pull_failure(pod: dict, now: dt.datetime, grace_seconds: float) -> Observation | None:
    """``failed ImagePullBackOff`` when a container has waited on its image longer than ``grace_seconds`` since the pod's creation."""
    created = _parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    for cs in _container_statuses(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            if created is None or (now - created).total_seconds() >= grace_seconds:
                return Observation("failed", "ImagePullBackOff", None,
                                   f"pod {pod['metadata'].get('name')}: {waiting['reason']}: {waiting.get('message') or ''}".strip())
    return None


def unschedulable(pods: list[dict], now: dt.datetime, grace_seconds: float) -> Observation | None:
    """``unschedulable`` when a pod's ``PodScheduled`` condition has said ``Unschedulable`` for ``grace_seconds`` since
    the pod's creation (the kube-scheduler found no node with room), with the scheduler's message; else None."""
    for pod in pods:
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
                    None)
        if cond is None or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
            continue
        created = _parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
        if created is not None and (now - created).total_seconds() >= grace_seconds:
            name = (pod.get("metadata") or {}).get("name", "?")
            return Observation("unschedulable", "Unschedulable", None,
                               f"pod {name} unschedulable for {(now - created).total_seconds():.0f} s: "
                               f"{cond.get('message') or ''}".strip())
    return None


def observe_training(job: dict | None, pods: list[dict], nodes: int, now: dt.datetime, grace: float,
                     unschedulable_grace: float = float("inf")) -> Observation:
    """The phase of a training attempt from its batch/v1 Job and pods (see ``Backend.observe``).

    A disrupted pod wins over the Job's Failed condition (with backoffLimit 0
    a reclaimed spot node fails the Job, but the work was lost, not wrong).
    """
    if job is None:
        return ABSENT
    for pod in pods:
        if (lost := pod_lost(pod)) is not None:
            return lost
    conditions = _conditions(job)
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        return Observation("succeeded", exit_code=0)
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed is not None:
        if failed.get("reason") == "DeadlineExceeded":
            return Observation("failed", "DeadlineExceeded", None,
                               failed.get("message") or "the Job ran past activeDeadlineSeconds (max_runtime_seconds)")
        for pod in pods:
            if (failure := pod_failure(pod)) is not None:
                return failure
        return Observation("failed", "Failed", None, f"{failed.get('reason') or 'Failed'}: {failed.get('message') or ''}")
    for pod in pods:
        if (pull := image_pull_failure(pod, now, grace)) is not None:
            return pull
    running = [p for p in pods if (p.get("status") or {}).get("phase") in ("Running", "Succeeded")]
    if len(running) >= nodes:
        return Observation("running")
    return unschedulable(pods, now, unschedulable_grace) or Observation("pending")


def observe_inference(deployment: dict | None, pods: list[dict], now: dt.datetime, grace: float,
                      unschedulable_grace: float = float("inf")) -> Observation:
    """The phase of an inference attempt: running once ``readyReplicas`` reaches ``replicas``; image pull failures fail it."""
    if deployment is None:
        return ABSENT
    for pod in pods:
        if (pull := image_pull_failure(pod, now, grace)) is not None:
            return pull
    wanted = (deployment.get("spec") or {}).get("replicas") or 1
    ready = (deployment.get("status") or {}).get("readyReplicas") or 0
    if ready >= wanted:
        return Observation("running")
    return unschedulable(pods, now, unschedulable_grace) or Observation("pending")


class KubernetesBackend(Backend):
    """Runs attempts as Kubernetes objects (``runners.kubernetes.manifests``) on each cluster's API server."""

    name = "kubernetes"

    # --- discovery ---------------------------------------------------------------------------------------------

    def discover(self, cluster) -> list[PoolCapacity]:
        """GPU node pools from the cluster's Nodes (see ``runners.kubernetes.nodepools.pools_from_nodes``). Raises ClusterUnreachable."""
        from .nodepools import pools_from_nodes

        c = client_for(cluster)
        try:
            nodes = c.call(c.core.list_node, _preload_content=False)
            pods = c.call(c.core.list_pod_for_all_namespaces,
                          field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False)
        except ApiError as exc:
            raise ClusterUnreachable(f"listing nodes failed: {exc}") from exc
        return pools_from_nodes(_items(nodes), _items(pods), cluster.provider)

    # --- dispatch ----------------------------------------------------------------------------------------------

    def dispatch(self, attempt) -> dict:
        """Create the team namespace (when missing) and the attempt's objects; idempotent.

        A 409 AlreadyExists whose object carries this attempt's label counts
        as created; one owned by another attempt is a PermanentDispatchError.
        Raises TransientDispatchError for timeouts, 408, 429, 5xx and an
        unreachable cluster; PermanentDispatchError for 400/403/404/422 with
        the server's message. Returns ``{"namespace", "objects": [[kind, name]...]}``.
        """
        w = workload(attempt)
        if not w.image or not w.command:
            raise PermanentDispatchError("spec.image and spec.command are required on a Kubernetes cluster")
        c = client_for(attempt.cluster)
        try:
            try:
                return self._dispatch(c, w)
            except _NamespaceMissing:  # deleted since this client saw it: create it again, once
                return self._dispatch(c, w)
        except _NamespaceMissing as exc:
            raise TransientDispatchError(f"namespace {w.namespace} vanished twice while creating {w.name}") from exc
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc

    def _dispatch(self, c: ClusterClient, w: m.Workload) -> dict:
        self._ensure_namespace(c, w)
        created = []
        for manifest in m.manifests(w):
            self._create(c, w, manifest)
            created.append([manifest["kind"], manifest["metadata"]["name"]])
        return {"namespace": w.namespace, "objects": created}

    def _ensure_namespace(self, c: ClusterClient, w: m.Workload) -> None:
        """Create the team namespace unless this cluster's client saw it exist before (``ClusterClient.namespaces``).

        The cache only skips a create that would answer 409; a namespace
        deleted behind our back makes the object create answer 404, which
        drops it from the cache and dispatches again (``_NamespaceMissing``).
        """
        if w.namespace in c.namespaces:
            return
        try:
            c.create("/api/v1/namespaces", m.namespace(w.namespace, w.team))
        except ApiError as exc:
            if exc.status != 409:
                raise _dispatch_error(exc, f"creating namespace {w.namespace}") from exc
        c.namespaces.add(w.namespace)

    def _create(self, c: ClusterClient, w: m.Workload, manifest: dict) -> None:
        _, read, _, _ = _api(c, manifest["kind"])
        what = f"creating {manifest['kind']} {w.namespace}/{w.name}"
        try:
            c.create(_COLLECTIONS[manifest["kind"]].format(namespace=quote(w.namespace, safe="")), manifest)
            return
        except ApiError as exc:
            if exc.status == 404 and w.namespace in c.namespaces:
                c.namespaces.discard(w.namespace)
                raise _NamespaceMissing(w.namespace) from exc
            if exc.status != 409:
                raise _dispatch_error(exc, what) from exc
        try:
            existing = _json(c.call(read, w.name, w.namespace, _preload_content=False))
        except ApiError as exc:
            raise _dispatch_error(exc, f"{what} (reading the existing one)") from exc
        if _attempt_of(existing) != w.attempt_id:
            raise PermanentDispatchError(f"{what}: an object of that name exists and belongs to attempt "
                                         f"{_labels(existing).get(m.LABEL_ATTEMPT)!r}, not {w.attempt_id}")

    # --- observation -------------------------------------------------------------------------------------------

    def _list(self, c: ClusterClient, kind: str) -> list[dict]:
        """Every object of ``kind`` carrying the platform's labels, in one LIST over all namespaces."""
        list_all = c.core.list_pod_for_all_namespaces if kind == "Pod" else _api(c, kind)[3]
        try:
            answer = c.call(list_all, label_selector=SELECTOR, _preload_content=False)
        except ApiError as exc:
            if exc.status == 404:
                return []  # the API server does not serve the kind (yet): nothing of ours exists
            raise ClusterUnreachable(f"listing {kind}s failed: {exc}") from exc
        # Filter here too: the selector is a request, and a proxy or an old server may ignore it.
        return [obj for obj in _items(answer) if m.LABEL_JOB in _labels(obj)]

    def observe(self, cluster, attempts: Iterable) -> dict[int, Observation]:
        """One LIST of Jobs, Deployments and Pods on ``cluster``; an Observation per attempt id.

        Phases as in ``observe_training`` and ``observe_inference``. Raises
        ClusterUnreachable when the cluster does not answer (or answers an
        error to a LIST).
        """
        attempts = list(attempts)
        c = client_for(cluster)
        kinds = {a.job.kind for a in attempts}
        # With no attempt to look at, the Job LIST alone is the cluster's health probe.
        jobs = self._list(c, "Job") if "training" in kinds or not attempts else []
        deployments = self._list(c, "Deployment") if "inference" in kinds else []
        pods = self._list(c, "Pod") if attempts else []
        return _observations(attempts, jobs, deployments, pods)

    def owned_attempt_ids(self, cluster) -> set[int]:
        """Attempt ids labelled on any Job, Deployment or Service of the platform on ``cluster`` (three LISTs)."""
        c = client_for(cluster)
        return _owned(*(self._list(c, kind) for kind in ("Job", "Deployment", "Service")))

    def observe_all(self, cluster, attempts: Iterable) -> tuple[dict[int, Observation], set[int]]:
        """``observe`` and ``owned_attempt_ids`` from one LIST per kind (Job, Deployment, Service, and Pod when
        there are attempts): four LISTs instead of up to six, each kind parsed once."""
        attempts = list(attempts)
        c = client_for(cluster)
        jobs, deployments, services = (self._list(c, kind) for kind in ("Job", "Deployment", "Service"))
        pods = self._list(c, "Pod") if attempts else []
        return _observations(attempts, jobs, deployments, pods), _owned(jobs, deployments, services)

    # --- deletion and logs -------------------------------------------------------------------------------------

    def delete(self, attempt) -> bool:
        """Delete the attempt's Job or Deployment (Foreground: pods first) and Service; True once all answer 404 and no pod is left.

        Raises ClusterUnreachable when the cluster cannot be reached (the
        caller retries on reconnection).
        """
        c = client_for(attempt.cluster)
        namespace, name = team_namespace(attempt.job.team.slug), attempt.object_name
        gone = True
        for kind, policy in (("Job", "Foreground"), ("Deployment", "Foreground"), ("Service", "Background")):
            _, read, delete, _ = _api(c, kind)
            try:
                existing = _json(c.call(read, name, namespace, _preload_content=False))
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise ClusterUnreachable(f"reading {kind} {namespace}/{name}: {exc}") from exc
            if _attempt_of(existing) != attempt.pk:
                continue  # same name, another owner: never ours to delete
            gone = False
            try:
                c.call(delete, name, namespace, propagation_policy=policy, _preload_content=False)
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise ClusterUnreachable(f"deleting {kind} {namespace}/{name}: {exc}") from exc
        if not gone:
            return self._all_gone(c, attempt, namespace, name)
        return not self._pods(c, namespace, attempt.pk)

    def _all_gone(self, c: ClusterClient, attempt, namespace: str, name: str) -> bool:
        for kind in ("Job", "Deployment", "Service"):
            try:
                obj = _json(c.call(_api(c, kind)[1], name, namespace, _preload_content=False))
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise ClusterUnreachable(f"reading {kind} {namespace}/{name}: {exc}") from exc
            if _attempt_of(obj) == attempt.pk:
                return False
        return not self._pods(c, namespace, attempt.pk)

    def _pods(self, c: ClusterClient, namespace: str, attempt_id: int) -> list[dict]:
        """The pods of attempt ``attempt_id`` in ``namespace`` (one LIST by label)."""
        try:
            answer = c.call(c.core.list_namespaced_pod, namespace, label_selector=f"{m.LABEL_ATTEMPT}={attempt_id}",
                            _preload_content=False)
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise ClusterUnreachable(f"listing pods in {namespace}: {exc}") from exc
        return [p for p in _items(answer) if _attempt_of(p) == attempt_id]

    def logs(self, attempt, node: int = 0, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of the ``main`` container of node ``node``'s pod ("" when it has no pod yet).

        Node = the pod's completion index (training) or its position by name (inference replicas).
        """
        c = client_for(attempt.cluster)
        namespace = team_namespace(attempt.job.team.slug)
        pod = pod_of_node(self._pods(c, namespace, attempt.pk), node)
        if pod is None:
            return ""
        try:
            answer = c.call(c.core.read_namespaced_pod_log, pod["metadata"]["name"], namespace, container=m.CONTAINER,
                            tail_lines=tail_lines, _preload_content=False)
        except ApiError as exc:
            if exc.status in (400, 404):
                return ""  # the container has not started, or the pod just went away
            raise ClusterUnreachable(f"reading the log of {pod['metadata']['name']}: {exc}") from exc
        return answer.data.decode("utf-8", "replace")


    def follow_logs(self, attempt, node: int = 0, tail_lines: int = 200, *, max_seconds: float | None = None,
                    poll_seconds: float | None = None) -> Iterator[str]:
        """Stream node ``node``'s log: one ``follow=true`` read of the ``main`` container (tail, then each new line).

        Yields ``""`` once the pod lookup answered (raises ClusterUnreachable
        before that), then chunks of complete lines as the API server sends
        them, and the last partial line at the end. Ends when the API server
        ends the stream (the container exited, the pod went away), after
        ``max_seconds`` (default ``settings.LOG_FOLLOW_MAX_SECONDS``; a timer
        shuts the socket down, so a quiet container cannot hold it longer), or
        when the cluster stops answering. While the pod or its container does
        not exist yet (HTTP 404/400) it looks again every ``poll_seconds``
        (default ``LOG_FOLLOW_POLL_SECONDS``) until the attempt ends.
        """
        max_seconds = float(settings.LOG_FOLLOW_MAX_SECONDS if max_seconds is None else max_seconds)
        poll = float(settings.LOG_FOLLOW_POLL_SECONDS if poll_seconds is None else poll_seconds)
        deadline = time.monotonic() + max_seconds
        c = client_for(attempt.cluster)
        namespace = team_namespace(attempt.job.team.slug)
        pod = pod_of_node(self._pods(c, namespace, attempt.pk), node)  # ClusterUnreachable here is the caller's 503
        yield ""
        while True:
            try:
                if pod is not None:
                    stream = self._open_log_stream(c, namespace, pod["metadata"]["name"], tail_lines,
                                                   deadline - time.monotonic())
                    if stream is not None:
                        yield from _stream_lines(stream, deadline)
                        return
                if time.monotonic() + poll >= deadline or self.attempt_finished(attempt):
                    return
                time.sleep(poll)
                pod = pod_of_node(self._pods(c, namespace, attempt.pk), node)
            except ClusterUnreachable as exc:
                log.info("log follow of %s ended: %s", attempt.object_name, exc)
                return

    def _open_log_stream(self, c: ClusterClient, namespace: str, pod: str, tail_lines: int,
                         seconds: float) -> urllib3.BaseHTTPResponse | None:
        """The raw ``follow=true`` log answer of ``pod``'s main container, reading for at most ``seconds``;
        None while the container has not started (400) or the pod is gone (404). Raises ClusterUnreachable."""
        if seconds <= 0:
            return None
        try:
            return c.call(c.core.read_namespaced_pod_log, pod, namespace, container=m.CONTAINER, follow=True,
                          tail_lines=max(0, tail_lines), _preload_content=False,
                          _request_timeout=(c.timeouts[0], seconds))
        except ApiError as exc:
            if exc.status in (400, 404):
                return None
            raise ClusterUnreachable(f"following the log of {pod}: {exc}") from exc


    def attempt_finished(self, attempt) -> bool:
        """Whether ``attempt`` ended in the database, or every pod of it finished (one pod LIST by label, not a full observe).

        Used by the polling ``follow_logs``; an unreachable cluster counts as not finished.
        """
        from jobs.models import JobAttempt

        if JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=False).exists():
            return True
        try:
            pods = self._pods(client_for(attempt.cluster), team_namespace(attempt.job.team.slug), attempt.pk)
        except ClusterUnreachable:
            return False
        return bool(pods) and all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods)


def _observations(attempts: list, jobs: list[dict], deployments: list[dict], pods: list[dict]) -> dict[int, Observation]:
    """An Observation per attempt id from the listed Jobs, Deployments and Pods (see ``KubernetesBackend.observe``)."""
    by_attempt = {_attempt_of(o): o for o in jobs + deployments}
    pods_of: dict[int | None, list[dict]] = defaultdict(list)
    for pod in pods:
        pods_of[_attempt_of(pod)].append(pod)
    now = timezone.now()
    grace = float(settings.K8S_IMAGE_PULL_GRACE_SECONDS)
    unschedulable_grace = float(settings.K8S_UNSCHEDULABLE_GRACE_SECONDS)
    result = {}
    for attempt in attempts:
        obj, attempt_pods = by_attempt.get(attempt.pk), pods_of.get(attempt.pk, [])
        if attempt.job.kind == "inference":
            result[attempt.pk] = observe_inference(obj, attempt_pods, now, grace, unschedulable_grace)
        else:
            result[attempt.pk] = observe_training(obj, attempt_pods, attempt.job.nodes, now, grace, unschedulable_grace)
    return result


def _owned(*listed: list[dict]) -> set[int]:
    """Attempt ids labelled on the listed objects."""
    return {i for objects in listed for i in (_attempt_of(o) for o in objects) if i is not None}


def pod_of_node(pods: list[dict], node: int) -> dict | None:
    """The pod whose completion index annotation is ``node``; without indexes, the ``node``-th pod by name."""
    indexed = {((p.get("metadata") or {}).get("annotations") or {}).get(m.COMPLETION_INDEX_ANNOTATION): p for p in pods}
    if str(node) in indexed:
        return indexed[str(node)]
    ordered = sorted(pods, key=lambda p: p["metadata"].get("name", ""))
    return ordered[node] if 0 <= node < len(ordered) and None in indexed else None


def _stream_lines(answer: urllib3.BaseHTTPResponse, deadline: float) -> Iterator[str]:
    """Text of a streamed answer as it arrives, cut after its last newline (the rest waits for its end); ends at EOF,
    on a read error or at ``deadline`` (``time.monotonic()``), when a timer shuts the socket down. Releases it."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    timer = threading.Timer(max(deadline - time.monotonic(), 0), _shutdown, args=(answer,))
    timer.daemon = True
    timer.start()
    pending = ""
    try:
        while time.monotonic() < deadline:
            try:
                data = answer.read1(65536)
            except (urllib3.exceptions.HTTPError, OSError, ValueError):
                break  # timed out, shut down at the deadline, or the connection dropped
            if not data:
                break
            pending += decoder.decode(data)
            cut = pending.rfind("\n") + 1
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
        pending += decoder.decode(b"", final=True)
        if pending:
            yield pending
    finally:
        timer.cancel()
        answer.close()  # a follow stream is never reused: close its connection instead of returning it to the pool


def _shutdown(answer: urllib3.BaseHTTPResponse) -> None:
    """Unblock a read of ``answer`` waiting in another thread (urllib3 ``HTTPResponse.shutdown``)."""
    try:
        answer.shutdown()
    except (ValueError, RuntimeError, OSError):
        pass  # already closed or released: nothing is blocked on it


def _json(answer) -> dict:
    """The JSON body of a raw (``_preload_content=False``) client answer."""
    import json

    return json.loads(answer.data or b"{}")


def _items(answer) -> list[dict]:
    return list(_json(answer).get("items") or [])


register(KubernetesBackend())
