"""The ``kubernetes`` backend: creates, observes and deletes an attempt's objects on a cluster's API server.

Dispatch is idempotent (a 409 for an object this attempt owns means it was
created before); observe makes one LIST per kind per cluster, by label
selector, and maps Jobs, Deployments and Pods to attempts through the
``controlplane.io/attempt-uid`` label (the ``controlplane.io/attempt`` id label
for attempts made before uids): a restored database that hands an attempt id
out again never takes another attempt's objects for its own (ADR 0011).
Before it deletes an attempt's objects it writes the attempt's end record
(a ConfigMap, ``manifests.end_record``), so a restored database learns how
the attempt ended.
"""

from __future__ import annotations

import codecs
import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import urllib3
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from core.gpus import gpus_of
from core.namespaces import team_namespace
from jobs.arrays import element_env
from jobs.models import FINAL_STATES, JobState, roles_in_order
from jobs.replica_loss import replica_slots

from ..base import (
    ABSENT,
    SCRAPE_TIMEOUT_SECONDS,
    Backend,
    ClusterUnreachable,
    InvalidCredentials,
    LostReplica,
    Observation,
    Owned,
    PermanentDispatchError,
    PoolCapacity,
    TransientDispatchError,
    attempt_key,
    register,
)
from ..models import Node, installation_uid
from . import manifests as m
from .client import ApiError, ClusterClient, client_for
from .serving_load import endpoint_exposition, parse_server_counters

log = logging.getLogger(__name__)

MULTI_ROLE = "multi-role"  # ``jobs.models.Job.Kind.MULTI_ROLE``: one Job and headless Service per role
# The job states in which a serving job's endpoint goes with its attempt's objects (``jobs.models.FINAL_STATES`` and
# CANCELLING: the job will not run again); in RECOVERING the next attempt's pods come behind the same Service.
ENDPOINT_ENDS = FINAL_STATES | {JobState.CANCELLING}
SELECTOR = m.LABEL_JOB  # "label exists": every object the platform created
# The kinds reconcile lists, and follows by watch between full LISTs (``KubernetesBackend.changes``).
WATCHED_KINDS = ("Job", "Deployment", "Service", "Pod")
# Attempt keys per set-based label selector of ``observe_changed``: 100 uids make a query string of about 4 KB,
# well inside the 8 KB request line that common proxies accept.
KEYS_PER_LIST = 100
# The label the JobSet controller puts on its child Jobs and pods: the JobSet's name (JobSet docs, "JobSet labels").
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
IMAGE_PULL_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})
# Pod status reasons and condition reasons that mean the node or the pod was taken away, not that the work failed
# (Kubernetes docs "Pod disruption conditions": DisruptionTarget with PreemptionByScheduler,
# DeletionByTaintManager, EvictionByEvictionAPI, DeletionByPodGC, TerminationByKubelet).
LOST_POD_REASONS = frozenset({"Evicted", "NodeLost", "Preempting", "Shutdown", "NodeShutdown", "Terminated"})
SPOT_LOST_REASONS = frozenset({"PreemptionByScheduler", "DeletionByTaintManager", "TerminationByKubelet"})
# Pod status reasons of a node shut down or reclaimed by its provider (kubelet graceful node shutdown): spot.
SPOT_STATUS_REASONS = frozenset({"Shutdown", "NodeShutdown", "Terminated"})
# DisruptionTarget reasons that mean the pod's node is gone (the pod garbage collector deletes pods bound to
# a node that no longer exists).
NODE_LOST_REASONS = frozenset({"DeletionByPodGC"})


def workload(attempt) -> m.Workload:
    """The ``manifests.Workload`` of ``attempt`` (reads its job, team, node pool, accelerator and cluster)."""
    job = attempt.job
    spec = job.spec or {}
    resources = spec.get("resources") or {}
    env = spec.get("env") or {}
    if not isinstance(env, dict):
        raise PermanentDispatchError("spec.env must map strings to strings")
    # A serving job reads the checkpoints of the training job it names (spec.checkpoint_from), else its own.
    checkpoint_job = spec.get("checkpoint_from") or job.pk
    gpu_product, gpu_resource = shared_device(attempt)
    return m.Workload(
        name=attempt.object_name, namespace=team_namespace(job.team.slug), team=job.team.slug, job_id=job.pk,
        attempt_id=attempt.pk, attempt_number=attempt.number, kind=job.kind, image=spec.get("image") or "",
        command=tuple(spec.get("command") or ()), args=tuple(spec.get("args") or ()),
        env=tuple(sorted((str(k), str(v)) for k, v in env.items())), nodes=job.nodes, gpus_per_node=job.gpus_per_node,
        cpu=resources.get("cpu"), memory_gib=resources.get("memory_gib"),
        gpu_product=gpu_product, gpu_resource=gpu_resource,
        spot=attempt.node_pool.capacity_type == "spot", max_runtime_seconds=job.max_runtime_seconds,
        replicas=job.replicas, port=int(spec.get("port") or 8000), health_path=spec.get("health_path") or "/healthz",
        master_port=settings.K8S_MASTER_PORT, checkpoint_claim=settings.K8S_CHECKPOINT_CLAIM,
        checkpoint_uri=m.checkpoint_uri(settings.CHECKPOINT_STORE_URI, job.team.slug, checkpoint_job),
        checkpoint_job_id=checkpoint_job,
        peak_tflops=str(attempt.node_pool.accelerator.peak_bf16_tflops or ""),
        node_names=tuple((attempt.placement or {}).get("nodes") or ()),
        attempt_uid="" if attempt.legacy_name else str(attempt.uid),
        installation="" if attempt.legacy_name else installation_uid(),
        record="" if attempt.legacy_name else json.dumps(dispatch_record(attempt), sort_keys=True),
        metrics_port=int(settings.K8S_METRICS_PORT or 0) if job.kind == "training" else 0,
        array_env=tuple(element_env(job).items()),
        share_env=share_env(attempt),
        roles=roles_of(job.spec, attempt.placement) if job.kind == MULTI_ROLE else (),
        service_type=settings.K8S_SERVICE_TYPE,
        replica_slots=(tuple(replica_slots(attempt.placement, job.replicas))
                       if job.kind == "inference" and "slots" in (attempt.placement or {}) else ()),
    )


def share_env(attempt) -> tuple[tuple[str, str], ...]:
    """What the pod of ``attempt``, a job on part of one GPU, is told it holds, as the local runner tells it
    (``runners.local.runner.share_env``): ``CONTROLPLANE_GPU_SHARING`` (its node's sharing mode),
    ``CONTROLPLANE_GPU_SHARE`` (GPUs, ``0.25``), ``CONTROLPLANE_GPU_SHARE_MILLI``, ``CONTROLPLANE_GPU_NODE`` (the
    node it is pinned to) and ``CONTROLPLANE_MIG_PROFILE`` for a MIG device. The device itself (the GPU index, the
    MIG instance) is the device plugin's pick, in ``NVIDIA_VISIBLE_DEVICES``. Empty for whole GPUs."""
    job = attempt.job
    names = (attempt.placement or {}).get("nodes") or ()
    if not job.gpu_share_milli or not names:
        return ()
    node = Node.objects.filter(cluster_id=attempt.cluster_id, name=names[0]).values_list("gpu_sharing", flat=True)
    env = {"CONTROLPLANE_GPU_SHARING": node.first() or "", "CONTROLPLANE_GPU_SHARE": str(gpus_of(job.gpu_share_milli)),
           "CONTROLPLANE_GPU_SHARE_MILLI": str(job.gpu_share_milli), "CONTROLPLANE_GPU_NODE": names[0]}
    if job.mig_profile:
        env["CONTROLPLANE_MIG_PROFILE"] = job.mig_profile
    return tuple(env.items())


def shared_device(attempt) -> tuple[str, str]:
    """``(GPU product label the pods select, GPU resource they ask)`` for ``attempt``: the accelerator's product and
    ``nvidia.com/gpu``; for a job on part of one GPU (ADR 0040), its node's own product label (``...-SHARED``,
    ``...-MIG-<profile>``: the node it is pinned to carries it) and the slice or MIG device that node advertises
    (``manifests.shared_gpu_resource``)."""
    job, product = attempt.job, attempt.node_pool.accelerator.product_label
    names = (attempt.placement or {}).get("nodes") or ()
    if not (job.gpu_share_milli or job.mig_profile) or not names:
        return product, m.GPU_RESOURCE
    node = Node.objects.filter(cluster_id=attempt.cluster_id, name=names[0]).first()
    if node is None:
        return product, m.GPU_RESOURCE
    return (str((node.labels or {}).get(m.GPU_PRODUCT_LABEL) or product),
            m.shared_gpu_resource(node.gpu_sharing, node.slice_resource, job.mig_profile))


def roles_of(spec: dict, placement: dict | None) -> tuple[m.Role, ...]:
    """The ``manifests.Role`` of each role of a multi-role job's ``spec``, in name order, with the nodes
    admission booked for its pods (``placement["roles"][name]["nodes"]``, ``jobs.scheduling.apply
    .multi_role_placement``) when the pool has node rows (``placement["nodes"]``; else any node the selectors
    allow, as for a job of one role). Raises PermanentDispatchError for a role's env that is not str -> str."""
    placed = (placement or {}).get("roles") or {}
    pinned = bool((placement or {}).get("nodes"))
    roles = []
    for name, role in roles_in_order(spec.get("roles")).items():
        env, resources = role.get("env") or {}, role.get("resources") or {}
        if not isinstance(env, dict):
            raise PermanentDispatchError(f"spec.roles.{name}.env must map strings to strings")
        roles.append(m.Role(
            name=name, image=role.get("image") or "", command=tuple(role.get("command") or ()),
            args=tuple(role.get("args") or ()), env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
            pods=int(resources.get("nodes") or 1), gpus_per_node=int(resources.get("gpus_per_node") or 0),
            cpu=resources.get("cpu"), memory_gib=resources.get("memory_gib"),
            port=int(role["port"]) if role.get("port") is not None else None,
            completion=bool(role.get("completion", True)),
            node_names=tuple((placed.get(name) or {}).get("nodes") or ()) if pinned else ()))
    return tuple(roles)


def dispatch_record(attempt) -> dict:
    """What a restored control plane needs to rebuild ``attempt``'s job and attempt rows (``jobs.recovery``):
    team slug, submitter's username, the job's name, kind, spec, resource columns, creation time (ISO 8601) and
    estimate (USD), the attempt's id, number, uid, node pool name, GPUs, price (USD/GPU-h) and placement; for an
    element of a job array, ``array`` (``{"id", "index", "created_at"}``: which array and element it is, the
    array's submission time telling that array from a later one that took the same id)."""
    job = attempt.job
    if job._meta.get_field("submitter").is_cached(job):  # read with the job (``jobs.lifecycle.dispatch_many``)
        submitter = job.submitter.username if job.submitter is not None else None
    else:
        submitter = get_user_model().objects.filter(pk=job.submitter_id).values_list("username", flat=True).first()
    array = None
    if job.array_id is not None:  # an element carries its array's submission time as its own (jobs.arrays)
        array = {"id": job.array_id, "index": job.array_index,
                 "created_at": job.created_at.isoformat() if job.created_at else ""}
    return {"array": array, "team": job.team.slug, "submitter": submitter or "", "job_id": job.pk, "job_name": job.name,
            "kind": job.kind, "spec": job.spec, "accelerator": attempt.node_pool.accelerator.name,
            "gpus_per_node": job.gpus_per_node, "nodes": job.nodes, "replicas": job.replicas,
            "priority": job.priority, "preemptible": job.preemptible, "max_runtime_seconds": job.max_runtime_seconds,
            "max_retries": job.max_retries, "estimated_cost_usd": str(job.estimated_cost_usd),
            "job_created_at": job.created_at.isoformat() if job.created_at else "",
            "attempt_id": attempt.pk, "number": attempt.number, "uid": str(attempt.uid),
            "node_pool": attempt.node_pool.name, "gpus": attempt.gpus,
            "usd_per_gpu_hour": str(attempt.usd_per_gpu_hour), "placement": attempt.placement or {}}


# Collection paths of the kinds dispatch creates, by kind (Kubernetes API reference: "HTTP request" of each create).
_COLLECTIONS = {"Job": "/apis/batch/v1/namespaces/{namespace}/jobs",
                "Deployment": "/apis/apps/v1/namespaces/{namespace}/deployments",
                "Service": "/api/v1/namespaces/{namespace}/services",
                "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
                "JobSet": f"/apis/{m.JOBSET_API_VERSION}/namespaces/{{namespace}}/jobsets"}


def _api(c: ClusterClient, kind: str):
    """``(create, read, delete, list_all)`` client methods for ``kind`` (Job, Deployment, Service, ConfigMap, JobSet:
    created through ``ClusterClient.create``, so no create method)."""
    if kind == "Job":
        return (c.batch.create_namespaced_job, c.batch.read_namespaced_job, c.batch.delete_namespaced_job,
                c.batch.list_job_for_all_namespaces)
    if kind == "Deployment":
        return (c.apps.create_namespaced_deployment, c.apps.read_namespaced_deployment,
                c.apps.delete_namespaced_deployment, c.apps.list_deployment_for_all_namespaces)
    if kind == "Service":
        return (c.core.create_namespaced_service, c.core.read_namespaced_service, c.core.delete_namespaced_service,
                c.core.list_service_for_all_namespaces)
    if kind == "ConfigMap":
        return (c.core.create_namespaced_config_map, c.core.read_namespaced_config_map,
                c.core.delete_namespaced_config_map, c.core.list_config_map_for_all_namespaces)
    if kind == "JobSet":  # a custom resource: the generic client, in the (name, namespace) order of the others
        group, version, plural = m.JOBSET_GROUP, m.JOBSET_VERSION, "jobsets"
        return (None,
                lambda name, namespace, **kw: c.custom.get_namespaced_custom_object(
                    group, version, namespace, plural, name, **kw),
                lambda name, namespace, **kw: c.custom.delete_namespaced_custom_object(
                    group, version, namespace, plural, name, **kw),
                lambda **kw: c.custom.list_cluster_custom_object(group, version, plural, **kw))
    raise ValueError(kind)


class _NamespaceMissing(Exception):
    """An object create answered 404 for a namespace the client had cached as existing."""


def _dispatch_error(exc: ApiError, what: str) -> Exception:
    """Transient for 404, 408, 410, 429 and 5xx (a proxy answers 404/410 for a healthy server too); permanent
    for the rest (400/403/422)."""
    text = f"{what}: HTTP {exc.status} {exc.reason}: {exc.message}"
    if exc.status in (404, 408, 410, 429) or exc.status >= 500:
        return TransientDispatchError(text)
    return PermanentDispatchError(text)


def _read_failure(exc: ApiError, what: str) -> ClusterUnreachable:
    """The ClusterUnreachable of a failed LIST: InvalidCredentials for 403 Forbidden (the stored credential may not
    read what the platform needs: a fault of this cluster's credential, with what to do about it)."""
    if exc.status == 403:
        return InvalidCredentials(f"{what} failed: the credential is not allowed to ({exc}); grant it the "
                                  "platform's role or re-enter it")
    return ClusterUnreachable(f"{what} failed: {exc}")


def _labels(obj: dict) -> dict:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _attempt_of(obj: dict) -> int | None:
    value = _labels(obj).get(m.LABEL_ATTEMPT)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _key_of(obj: dict) -> str | int | None:
    """The ``attempt_key`` an object belongs to: its attempt uid label, else (made before uids) its attempt id."""
    return _labels(obj).get(m.LABEL_ATTEMPT_UID) or _attempt_of(obj)


def _selector_of(key: str | int) -> str:
    """The label selector of the pods of the attempt with ``key`` (``attempt_key``)."""
    return f"{m.LABEL_ATTEMPT_UID}={key}" if isinstance(key, str) else f"{m.LABEL_ATTEMPT}={key}"


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


def _serves(pod: dict) -> bool:
    """Whether a serving replica's pod gets the Service's requests: Running, Ready, not being deleted."""
    return ((pod.get("status") or {}).get("phase") == "Running" and not (pod.get("metadata") or {}).get(
        "deletionTimestamp") and "Ready" in _conditions(pod))


def pod_lost(pod: dict) -> Observation | None:
    """``lost`` when ``pod`` was taken away rather than failing, with the cause as end reason; else None.

    DisruptionTarget (Kubernetes docs "Pod disruption conditions"): TerminationByKubelet, DeletionByTaintManager
    and PreemptionByScheduler are a reclaimed (spot) node or a preemption: ``Preempted``; DeletionByPodGC is a
    deleted node: ``NodeLost``; EvictionByEvictionAPI and the rest ``Evicted``. A pod status reason Evicted or
    NodeLost says the same on older clusters, Shutdown/Terminated a node shut down (``Preempted``). A pod
    being deleted (``deletionTimestamp``) with none of these was deleted directly: ``PodDeleted``.
    """
    status = pod.get("status") or {}
    disruption = _conditions(pod).get("DisruptionTarget")
    name = (pod.get("metadata") or {}).get("name", "?")
    if disruption is not None:
        reason = disruption.get("reason") or ""
        end = "Preempted" if reason in SPOT_LOST_REASONS else "NodeLost" if reason in NODE_LOST_REASONS else "Evicted"
        return Observation("lost", end, None, f"pod {name}: {reason}: {disruption.get('message') or ''}".strip(),
                           nodes=pod_node(pod))
    if status.get("reason") in LOST_POD_REASONS:
        reason = status["reason"]
        end = "NodeLost" if reason == "NodeLost" else "Preempted" if reason in SPOT_STATUS_REASONS else "Evicted"
        return Observation("lost", end, None, f"pod {name}: {reason}: {status.get('message') or ''}".strip(),
                           nodes=pod_node(pod))
    return None


def pod_node(pod: dict) -> tuple[str, ...]:
    """The node ``pod`` was bound to (``spec.nodeName``), as a one-name tuple; empty when not bound."""
    node = (pod.get("spec") or {}).get("nodeName")
    return (str(node),) if node else ()


def pod_deleted(pod: dict) -> Observation | None:
    """``lost PodDeleted`` when ``pod`` is being deleted (``deletionTimestamp``) before it succeeded, else None."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") != "Succeeded":
        return Observation("lost", "PodDeleted", None, f"pod {meta.get('name', '?')} was deleted while it ran")
    return None


def stopped_at(obj: dict | None, pods: list[dict]) -> dt.datetime | None:
    """When the attempt's pods stopped holding GPUs, as the cluster reports it: the latest of the pods' stops and
    the Job's Complete/Failed time. A pod whose every container reports ``terminated`` stopped at their latest
    ``finishedAt``; any other pod at the latest of its containers' finishedAt, its deletionTimestamp and its
    DisruptionTarget time. (A pod's deletionTimestamp is the deadline of its termination grace, by which the
    kubelet kills what still runs (Kubernetes API reference, ObjectMeta.deletionTimestamp): containers that
    stopped before it said when.)"""
    times = []
    for pod in pods:
        statuses = _container_statuses(pod)
        finished = [_parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")) for cs in statuses]
        times += finished
        if statuses and all(finished):
            continue  # every container stopped, and said when
        times.append(_parse_time((pod.get("metadata") or {}).get("deletionTimestamp")))
        disruption = _conditions(pod).get("DisruptionTarget")
        if disruption is not None:
            times.append(_parse_time(disruption.get("lastTransitionTime")))
    for kind, condition in _conditions(obj or {}).items():
        if kind in ("Complete", "Failed"):
            times.append(_parse_time(condition.get("lastTransitionTime")))
    times = [t for t in times if t is not None]
    return max(times) if times else None


def deletion_time(obj: dict | None) -> dt.datetime | None:
    """When the API server accepted the deletion of ``obj``: its ``metadata.deletionTimestamp`` (None when it is
    not being deleted). Set by the first DELETE and never moved later by another (Kubernetes API reference,
    ObjectMeta.deletionTimestamp: "may not be unset or be set further into the future")."""
    return _parse_time(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def created_at(obj: dict | None, pods: list[dict]) -> dt.datetime | None:
    """The earliest creationTimestamp of ``obj`` and ``pods`` (None when none carries one)."""
    times = [_parse_time((o.get("metadata") or {}).get("creationTimestamp")) for o in [obj or {}, *pods]]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def _holding(pods: list[dict]) -> bool:
    """Whether a pod of ``pods`` still holds its GPUs: not Succeeded or Failed. A pod being deleted
    (``deletionTimestamp``) holds them while its containers run out their termination grace period (up to
    ``terminationGracePeriodSeconds``, 30 s by default, e.g. a checkpoint on SIGTERM): its GPUs are freed only
    when they stop, so billing goes on until then (class: billing ends at the request, not at the stop)."""
    return any((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
               and not _containers_stopped(p) for p in pods)


def _containers_stopped(pod: dict) -> bool:
    """Whether every container of ``pod`` has a ``terminated`` state (an empty list: not started, not stopped)."""
    statuses = _container_statuses(pod)
    return bool(statuses) and all((cs.get("state") or {}).get("terminated") for cs in statuses)


def pod_failure(pod: dict) -> Observation | None:
    """The failure of a pod's containers: OOMKilled, or a non-zero exit with its code; None when none failed."""
    name = (pod.get("metadata") or {}).get("name", "?")
    for cs in _container_statuses(pod):
        terminated = ((cs.get("state") or {}).get("terminated")) or ((cs.get("lastState") or {}).get("terminated"))
        if not terminated:
            continue
        code = terminated.get("exitCode")
        if terminated.get("reason") == "OOMKilled":
            return Observation("failed", "OOMKilled", code, f"pod {name}: container {cs.get('name')} ran out of memory",
                               nodes=pod_node(pod))
        if code not in (None, 0):
            return Observation("failed", "Failed", code,
                               f"pod {name}: container {cs.get('name')} exited with code {code}"
                               + (f" ({terminated['reason']})" if terminated.get("reason") else ""), nodes=pod_node(pod))
    return None


def serving_crash(pod: dict) -> Observation | None:
    """A serving pod's server that exited: ``pod_failure`` (OOMKilled, a non-zero exit), or a container the
    kubelet restarted after a clean exit (a Deployment's pods restart always, Kubernetes "Container restart
    policy": a server that exits 0 stopped serving too); None while every container runs as first started."""
    if (failure := pod_failure(pod)) is not None:
        return failure
    name = (pod.get("metadata") or {}).get("name", "?")
    for cs in _container_statuses(pod):
        if (cs.get("restartCount") or 0) > 0 and (cs.get("lastState") or {}).get("terminated"):
            return Observation("failed", "Failed", 0, f"pod {name}: container {cs.get('name')} exited with code 0 "
                                                      f"and was restarted {cs['restartCount']} times")
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

    In this order: a disrupted pod (evicted, node lost, spot reclaimed) wins
    over the Job's Failed condition (with backoffLimit 0 a reclaimed node
    fails the Job, but the work was lost, not wrong); then completion; then
    DeadlineExceeded; then a container that failed by itself (OOMKilled, an
    exit code); then a pod deleted directly (``PodDeleted``), or one that
    vanished from a failed Job without a failure of its own; then image pulls.
    """
    if job is None:
        return ABSENT
    return dataclasses.replace(_training_phase(job, pods, nodes, now, grace, unschedulable_grace),
                               created_at=created_at(job, pods),
                               ended_at=stopped_at(job, pods))


def _training_phase(job: dict, pods: list[dict], nodes: int, now: dt.datetime, grace: float,
                    unschedulable_grace: float) -> Observation:
    for pod in pods:
        if (lost := pod_lost(pod)) is not None:
            return lost
    conditions = _conditions(job)
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        return Observation("succeeded", exit_code=0)
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed is not None and failed.get("reason") == "DeadlineExceeded":
        return Observation("failed", "DeadlineExceeded", None,
                           failed.get("message") or "the Job ran past activeDeadlineSeconds (max_runtime_seconds)")
    for pod in pods:
        if not (pod.get("metadata") or {}).get("deletionTimestamp") and (failure := pod_failure(pod)) is not None:
            return failure
    for pod in pods:
        if (deleted := pod_deleted(pod)) is not None:
            return deleted
    if failed is not None:
        for pod in pods:
            if (failure := pod_failure(pod)) is not None:
                return failure
        if len(pods) < nodes:
            return Observation("lost", "PodDeleted", None, f"a pod of the Job vanished: {failed.get('reason') or ''}"
                                                           f" {failed.get('message') or ''}".strip())
        return Observation("failed", "Failed", None, f"{failed.get('reason') or 'Failed'}: {failed.get('message') or ''}")
    for pod in pods:
        if (pull := image_pull_failure(pod, now, grace)) is not None:
            return pull
    running = [p for p in pods if (p.get("status") or {}).get("phase") in ("Running", "Succeeded")]
    if len(running) >= nodes:
        return Observation("running")
    return unschedulable(pods, now, unschedulable_grace) or Observation("pending")


def role_shapes(placement: dict | None) -> list[tuple[str, int]]:
    """``(name, pods)`` of each role of a multi-role attempt, in name order, from its ``placement``
    (``jobs.scheduling.apply.multi_role_placement``: a node per pod of each role)."""
    return [(name, len(role.get("nodes") or ()) or 1)
            for name, role in roles_in_order((placement or {}).get("roles")).items()]


def waits_for(job: dict | None) -> bool:
    """Whether the attempt waits for the role of the Job ``job`` (``manifests.COMPLETION_ANNOTATION``); a Job that
    is missing or does not say counts as one it waits for (nothing succeeds on a role not seen)."""
    annotations = ((job or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(m.COMPLETION_ANNOTATION) != "false"


def _index_of(pod: dict) -> str:
    """A pod's completion index ("?" when it carries none)."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(m.COMPLETION_INDEX_ANNOTATION, "?")


def _role_failure(name: str, pod: dict, failure: Observation) -> Observation:
    """``failure`` of pod ``pod`` of role ``name`` told by role and index: ``role rollout pod 1 exited with code 3``
    (as the local runner says it), then the pod's own words."""
    what = "ran out of memory (OOMKilled)" if failure.end_reason == "OOMKilled" else f"exited with code {failure.exit_code}"
    return dataclasses.replace(failure, message=f"role {name} pod {_index_of(pod)} {what}: {failure.message}")


def observe_multi_role(jobs: dict[str, dict], pods: list[dict], roles: list[tuple[str, int]], now: dt.datetime,
                       grace: float, unschedulable_grace: float = float("inf"), *,
                       jobset: dict | None = None) -> Observation:
    """The phase of a multi-role attempt (docs/adr/0039-multi-role-jobs.md) from its Jobs by role name (``jobs``),
    all its pods (``pods``, labelled with their role), its roles (``role_shapes``: name, pods; whether the
    attempt waits for a role its Job says, ``waits_for``) and, when it runs as one, its JobSet (``jobset``).

    In this order: a pod taken away (evicted, node lost, spot reclaimed) makes the whole attempt ``lost``; the
    attempt succeeds once every role with ``completion`` has its Job Complete (every pod exited 0), or its JobSet
    says Completed, whatever the others do (they are then deleted; a server role whose pods exited 0 early ends
    nothing); a role past its deadline fails it; then a pod whose container failed (``role rollout pod 1 exited
    with code 3``); then a JobSet that says Failed; then any role's other end (a pod deleted, a Job failed
    without a pod's failure, image pulls), named by its role. A role's Job missing while another's exists was
    deleted from outside (``lost PodDeleted``), unless a JobSet runs the attempt (its controller has yet to make
    it: pending). It runs once every role's pods run (or a server role's exited 0), is ``unschedulable`` when a
    role's pod is, else pending. No Job and no JobSet: ``absent``.

    ``created_at``: the earliest creation of its JobSet, Jobs and pods (billing starts with the first role);
    ``ended_at``: when the last pod stopped, None while any still holds its GPUs (the platform deletes them
    and bills until the deletion is accepted or the pods are seen gone, as for a crashed server)."""
    if not jobs and jobset is None:
        return ABSENT
    by_role: dict[str, list[dict]] = defaultdict(list)
    for pod in pods:
        by_role[_labels(pod).get(m.LABEL_ROLE, "")].append(pod)
    for name in by_role:
        by_role[name].sort(key=lambda p: (int(_index_of(p)) if _index_of(p).isdigit() else -1,
                                          (p.get("metadata") or {}).get("name", "")))
    phase = _multi_role_phase(jobs, by_role, roles, now, grace, unschedulable_grace, _conditions(jobset or {}),
                              jobset is not None)
    ended = None
    if not _holding(pods):
        stops = [stopped_at(jobs.get(name), by_role.get(name, [])) for name, _ in roles]
        ended = max((t for t in stops if t is not None), default=None)
    made = created_at(None, [*([jobset] if jobset else []), *jobs.values(), *pods])
    return dataclasses.replace(phase, created_at=made, ended_at=ended)


def _multi_role_phase(jobs: dict[str, dict], by_role: dict[str, list[dict]], roles: list[tuple[str, int]],
                      now: dt.datetime, grace: float, unschedulable_grace: float, jobset: dict[str, dict],
                      in_jobset: bool) -> Observation:
    for name, _ in roles:
        for pod in by_role.get(name, []):
            if (lost := pod_lost(pod)) is not None:
                return dataclasses.replace(lost, message=f"role {name} pod {_index_of(pod)}: {lost.message}")
    complete = {name for name, job in jobs.items() if {"Complete", "SuccessCriteriaMet"} & set(_conditions(job))}
    if "Completed" in jobset or all(name in complete for name, _ in roles if waits_for(jobs.get(name))):
        return Observation("succeeded", exit_code=0)
    for name, _ in roles:
        failed = _conditions(jobs.get(name) or {})
        failed = failed.get("Failed") or failed.get("FailureTarget")
        if failed is not None and failed.get("reason") == "DeadlineExceeded":
            return Observation("failed", "DeadlineExceeded", None, f"role {name}: " + (
                failed.get("message") or "the Job ran past activeDeadlineSeconds (max_runtime_seconds)"))
    for name, _ in roles:
        for pod in by_role.get(name, []):
            if not (pod.get("metadata") or {}).get("deletionTimestamp") and (failure := pod_failure(pod)) is not None:
                return _role_failure(name, pod, failure)
    if (failed := jobset.get("Failed")) is not None:
        return Observation("failed", "Failed", None, f"the JobSet failed: {failed.get('reason') or ''}: "
                                                     f"{failed.get('message') or ''}".strip(": "))
    phases = {}
    for name, count in roles:
        job = jobs.get(name)
        if job is None and in_jobset:
            phases[name] = "pending"  # its controller has not made it yet
            continue
        if job is None:
            return Observation("lost", "PodDeleted", None, f"role {name}: its Job is gone while the other roles' "
                                                           f"exist")
        phase = _training_phase(job, by_role.get(name, []), count, now, grace, unschedulable_grace)
        if phase.phase in ("failed", "lost"):
            return dataclasses.replace(phase, message=f"role {name}: {phase.message}")
        phases[name] = phase.phase
    if all(p in ("running", "succeeded") for p in phases.values()):
        return Observation("running")
    for name, _ in roles:
        if (stuck := unschedulable(by_role.get(name, []), now, unschedulable_grace)) is not None:
            return dataclasses.replace(stuck, message=f"role {name}: {stuck.message}")
    return Observation("pending")


def serving_replicas(deployments: list[dict]) -> list[dict]:
    """The replica Deployments of a serving attempt that serve on: those not being deleted (a scale-down deletes
    the released replicas' ones, Foreground, their pods first) nor on a rollout's probation (``_on_probation``:
    the rollout judges its pod)."""
    return [d for d in deployments if not (d.get("metadata") or {}).get("deletionTimestamp")
            and not _on_probation(d)]


def _on_probation(deployment: dict) -> bool:
    """Whether a serving replica's Deployment was started by a rollout and is not ready yet
    (``manifests.PROBATION_ANNOTATION``): its pod's end is the rollout's to judge, no loss of the attempt."""
    return m.PROBATION_ANNOTATION in ((deployment.get("metadata") or {}).get("annotations") or {})


def _replica_of(obj: dict) -> str | None:
    """The replica index label of a serving attempt's Deployment or pod (None: an attempt made with one
    Deployment of all its replicas)."""
    return _labels(obj).get(m.LABEL_REPLICA)


def observe_inference(deployments: list[dict], pods: list[dict], now: dt.datetime, grace: float,
                      unschedulable_grace: float = float("inf"), *, started_at: dt.datetime | None = None,
                      max_runtime_seconds: float | None = None,
                      gone_nodes: frozenset[str] | set[str] = frozenset()) -> Observation:
    """The phase of an inference attempt from its Deployments (one per replica, ``manifests.inference_deployment``;
    one of all its replicas for an attempt made before) and pods: running once the ready replicas of the
    Deployments not being deleted reach what they ask; image pull failures fail it, and so does a server that
    exited 0 (it chose to end: the attempt's end, as on the local runner).

    A replica that died while the others serve (``lost_replicas``: its server crashed or ran out of memory, the
    kubelet restarting it in place; its pod evicted, deleted from outside or disrupted) does not end the attempt:
    it is reported apart (``Observation.lost_replicas``), the phase being the survivors', and reconcile replaces
    it in its booked slot within the job's retry budget or ends the attempt with its failure
    (``jobs.replica_loss``; docs/adr/0041).

    A replica lost with its node (its pod's DisruptionTarget DeletionByPodGC, or its Deployment pinned to one of
    ``gone_nodes``: nodes the cluster no longer has, which the caller lists) is reported apart too, ``lost
    NodeLost`` with ``LostReplica.nodes`` naming them, and left out of the phase: its slot cannot start again
    there, so reconcile records the loss and the serving pass releases the slot and admits a replacement elsewhere
    while the others serve. Only when every replica is lost with its node (or the attempt runs one Deployment of
    all its replicas) is the attempt itself ``lost NodeLost``, naming the nodes.

    The pods of a replica a scale-down released (their Deployment being deleted, or gone) are no part of the
    attempt: their end, whatever their exit code, is no end of it.

    A Deployment has no ``activeDeadlineSeconds``: past ``max_runtime_seconds`` after ``started_at`` (the
    attempt's start, default the objects' creation; None: no limit) the attempt fails ``DeadlineExceeded``,
    ended at that deadline, as a Job's ``activeDeadlineSeconds`` fails a training attempt; reconcile then
    deletes its objects. Class: a limit enforced on one runner and not another (a server ran and was billed
    past the max runtime its worst-case estimate counted). Invariant: every attempt, whatever its kind and
    runner, ends at its max runtime (docs/adr/0024)."""
    if not deployments:
        return ABSENT
    made = created_at(None, [*deployments, *pods])
    live = serving_replicas(deployments)
    with_node = node_lost_replicas(live, pods, gone_nodes)
    if with_node and (None in with_node or len(with_node) >= len(live)):
        gone = tuple(sorted({n for nodes in with_node.values() for n in nodes[0]}))
        why = "; ".join(message for _, message in with_node.values())
        return Observation("lost", "NodeLost", None, f"every replica lost its node: {', '.join(gone)} gone from "
                           f"the cluster ({why})"[:4000],
                           created_at=made, nodes=gone)
    live = [d for d in live if _replica_of(d) not in with_node]
    replicas = {_replica_of(d) for d in live}
    serving = [p for p in pods if _replica_of(p) in replicas]
    for pod in serving:
        if (pull := image_pull_failure(pod, now, grace)) is not None:
            return dataclasses.replace(pull, created_at=made, ended_at=stopped_at(None, serving))
    for pod in serving:
        if (not (pod.get("metadata") or {}).get("deletionTimestamp") and pod_lost(pod) is None
                and (crash := serving_crash(pod)) is not None and crash.exit_code == 0):
            return dataclasses.replace(crash, created_at=made)  # a server that chose to end: the attempt's end
    start = started_at or made
    if max_runtime_seconds is not None and start is not None:
        deadline = start + dt.timedelta(seconds=max_runtime_seconds)
        if now >= deadline:
            return Observation("failed", "DeadlineExceeded", None,
                               f"the server ran its max runtime ({max_runtime_seconds:g} s, until "
                               f"{deadline.isoformat()}); its Deployment is deleted", created_at=made,
                               ended_at=deadline)
    lost = lost_replicas(serving) + tuple(
        LostReplica(str(replica), "lost", "NodeLost", None, message, nodes=nodes)
        for replica, (nodes, message) in sorted(with_node.items(), key=lambda kv: int(kv[0])))
    wanted = sum((d.get("spec") or {}).get("replicas") or 1 for d in live)
    ready = sum((d.get("status") or {}).get("readyReplicas") or 0 for d in live)
    if live and ready >= wanted:  # the survivors' phase: a lost replica's new pod may be ready already
        return Observation("running", created_at=made, lost_replicas=lost)
    return dataclasses.replace(unschedulable(serving, now, unschedulable_grace) or Observation("pending"),
                               created_at=made, lost_replicas=lost)


def node_lost_replicas(live: list[dict], pods: list[dict], gone_nodes: frozenset[str] | set[str]
                       ) -> dict[str | None, tuple[tuple[str, ...], str]]:
    """The replicas of a serving attempt lost with their node, by replica index label (None: the one Deployment
    of all replicas of an attempt made before replicas had their own): ``(gone nodes, message)`` for each whose
    Deployment among ``live`` is pinned to one of ``gone_nodes`` (``pinned_nodes``) or whose pod was deleted with
    its node (``pod_lost`` ``NodeLost``: DisruptionTarget DeletionByPodGC, or the status reason NodeLost)."""
    indexes = {_replica_of(d) for d in live}
    out: dict[str | None, tuple[tuple[str, ...], str]] = {}
    for d in live:
        if gone := sorted(pinned_nodes(d) & set(gone_nodes)):
            out[_replica_of(d)] = (tuple(gone), f"replica {_replica_of(d)} is pinned to node {', '.join(gone)}, "
                                                f"which is gone from the cluster")
    for pod in pods:
        replica = _replica_of(pod)
        if replica in indexes and replica not in out and (lost := pod_lost(pod)) is not None \
                and lost.end_reason == "NodeLost":
            nodes = lost.nodes or tuple(sorted(pinned_nodes(next(d for d in live if _replica_of(d) == replica))))
            if nodes or replica is None:  # a replica's pod with no node named: an ordinary loss (``lost_replicas``)
                out[replica] = (nodes, f"replica {replica}: {lost.message}")
    return out


def lost_replicas(pods: list[dict]) -> tuple[LostReplica, ...]:
    """The replicas of a serving attempt lost while the others serve, one per pod of ``pods`` (the pods of its
    replicas that serve on, ``observe_inference``) that died (``docs/adr/0041``): taken away (evicted, deleted from
    outside, disrupted: ``pod_lost``, ``pod_deleted``) or whose server crashed (``serving_crash`` with a non-zero
    exit or OOMKilled: the kubelet restarts it in place, in CrashLoopBackOff). Key: ``<replica>/<pod name>``, a pod's
    own, so a replica lost again later (its new pod) is a new loss; ``replace_replica`` takes it. A pod of the
    platform's own replacement (deleted by ``replace_replica``) keeps its key: the same loss, seen again."""
    lost = []
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        seen = pod_lost(pod) or pod_deleted(pod) or serving_crash(pod)
        if seen is None or (seen.phase == "failed" and seen.exit_code == 0):
            continue
        key = f"{_replica_of(pod) if _replica_of(pod) is not None else '-'}/{name}"
        lost.append(LostReplica(key, seen.phase, seen.end_reason, seen.exit_code, seen.message))
    return tuple(lost)


def pinned_nodes(deployment: dict) -> set[str]:
    """The nodes a Deployment's pods are pinned to (``kubernetes.io/hostname`` In of its required node affinity,
    ``manifests._scheduling``); empty when they are not pinned."""
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    return {v for term in required.get("nodeSelectorTerms") or () for e in term.get("matchExpressions") or ()
            if e.get("key") == m.HOSTNAME_LABEL and e.get("operator") == "In" for v in e.get("values") or ()}


def owned_objects(attempt) -> list[tuple[str, str, str]]:
    """``(kind, name, deletion propagation policy)`` of every object dispatch may have made for ``attempt``: its
    Job, Deployment and Service, all named ``attempt.object_name``; for a multi-role attempt each role's Job
    and headless Service (``manifests.role_object_name``), named from its placement's roles, or its JobSet (named
    as the attempt; deleting it deletes the child Jobs and the Service its controller made), so a restart of
    the control plane finds them without the dispatch's ``runner_state``. Owners go Foreground (their pods
    first). A kind the cluster does not serve answers 404, as an object that is gone."""
    if attempt.job.kind == MULTI_ROLE:
        names = [m.role_object_name(attempt.object_name, name) for name, _ in role_shapes(attempt.placement)]
        return ([("JobSet", attempt.object_name, "Foreground")] + [("Job", n, "Foreground") for n in names]
                + [("Service", n, "Background") for n in names])
    name = attempt.object_name
    return [("Job", name, "Foreground"), ("Deployment", name, "Foreground"), ("Service", name, "Background")]


def endpoint_owned(service: dict, job_id: int, installation: str) -> bool:
    """Whether ``service`` is the endpoint Service of serving job ``job_id`` of this installation
    (``installation``: its uid; "" for a job whose attempts predate uids): a Service of that name made by another
    installation's namesake job is never this job's to keep or delete."""
    labels = _labels(service)
    return (labels.get(m.LABEL_ENDPOINT) == "true" and labels.get(m.LABEL_JOB) == str(job_id)
            and labels.get(m.LABEL_INSTALLATION, "") == installation)


class KubernetesBackend(Backend):
    """Runs attempts as Kubernetes objects (``runners.kubernetes.manifests``) on each cluster's API server."""

    name = "kubernetes"

    # --- discovery ---------------------------------------------------------------------------------------------

    def discover(self, cluster) -> list[PoolCapacity]:
        """GPU node pools from the cluster's Nodes (see ``runners.kubernetes.nodepools.pools_from_nodes``). Raises ClusterUnreachable."""
        from .nodepools import pools_from_nodes

        c = client_for(cluster)
        nodes = self._nodes(c)
        try:
            pods = c.call(c.core.list_pod_for_all_namespaces,
                          field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False)
        except ApiError as exc:
            raise _read_failure(exc, "listing pods") from exc
        return pools_from_nodes(nodes, _list_items(pods, "listing pods"))

    def _nodes(self, c: ClusterClient) -> list[dict]:
        """The cluster's Nodes now (one LIST). Raises ClusterUnreachable."""
        try:
            nodes = c.call(c.core.list_node, _preload_content=False)
        except ApiError as exc:
            raise _read_failure(exc, "listing nodes") from exc
        return _list_items(nodes, "listing nodes")

    # --- dispatch ----------------------------------------------------------------------------------------------

    def dispatch(self, attempt) -> dict:
        """Create the team namespace (when missing) and the attempt's objects; idempotent.

        A 409 AlreadyExists whose object carries this attempt's label counts
        as created; one owned by another attempt is a PermanentDispatchError.
        Raises TransientDispatchError for timeouts, 408, 429, 5xx and an
        unreachable cluster; PermanentDispatchError for 400/403/404/422 with
        the server's message (a 404 or 410 is transient: a proxy in front of a
        healthy API server answers them too). Returns ``{"namespace",
        "objects": [[kind, name]...], "endpoint", "created_at", "metrics_port"}``: ``endpoint``
        is the serving job's Service's in-cluster URL
        ``http://job-<job id>.<namespace>.svc:<port>`` (``manifests.serving_endpoint``; the
        Service is the job's, made by its first attempt and found by the next, so the address does not change
        when an attempt is replaced; None for training), and for a serving
        attempt ``replicas`` its replicas' Deployments, by index;
        ``metrics_port`` the workload-metrics port the training pods declare
        (absent when none: ``K8S_METRICS_PORT`` 0, or a serving job);
        ``created_at`` (ISO 8601) is the creationTimestamp of the Job or
        Deployment, where billing starts (absent when the server reports none).
        A multi-role attempt is a Job and a headless Service per role, or one
        JobSet where the cluster serves ``jobset.x-k8s.io/v1alpha2``
        (``ClusterClient.serves``; ``"jobset": true`` in the answer), billed
        from the first role's Job's (the JobSet's) creation.
        """
        w = workload(attempt)
        if w.kind == MULTI_ROLE:
            for role in w.roles:
                if not role.image or not (role.command or role.args):
                    raise PermanentDispatchError(f"spec.roles.{role.name}: image and command or args are required on "
                                                 f"a Kubernetes cluster")
        elif not w.image or not (w.command or w.args):
            raise PermanentDispatchError("spec.image and spec.command or spec.args are required on a Kubernetes cluster")
        try:
            c = client_for(attempt.cluster)  # an unreadable credential is this cluster's failure: retried like one
            try:
                return self._dispatch(c, w)
            except _NamespaceMissing:  # deleted since this client saw it: create it again, once
                return self._dispatch(c, w)
        except _NamespaceMissing as exc:
            raise TransientDispatchError(f"namespace {w.namespace} vanished twice while creating {w.name}") from exc
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc

    def _dispatch(self, c: ClusterClient, w: m.Workload) -> dict:
        if w.kind == MULTI_ROLE and not w.jobset and c.serves(m.JOBSET_API_VERSION):
            w = dataclasses.replace(w, jobset=True)  # one JobSet, which the cluster's JobSet controller runs
        self._ensure_namespace(c, w)
        created, times = [], []
        for manifest in m.manifests(w):
            made = self._create(c, w, manifest)
            if manifest["kind"] != "Service":  # a Service holds no GPU: billing starts with the Job or Deployment
                times.append(made)
            created.append([manifest["kind"], manifest["metadata"]["name"]])
        times = [t for t in times if t is not None]
        endpoint = m.serving_endpoint(w) if w.kind == "inference" else None
        state = {"namespace": w.namespace, "objects": created, "endpoint": endpoint}
        if w.kind == "inference":
            state["replicas"] = [m.replica_name(w.name, i) for i in w.slots]
        if w.jobset:
            state["jobset"] = True
        if w.metrics_port:
            state["metrics_port"] = w.metrics_port
        if times:  # a server that reports no creationTimestamp: billing starts when dispatch records the start
            state["created_at"] = min(times).isoformat()
        return state

    # --- scaling a serving attempt ----------------------------------------------------------------------------

    scales = True

    def scale(self, attempt, replicas: int, *, refusal: str = "") -> dict:
        """Make serving ``attempt`` run ``replicas`` replicas (``Backend.scale``); idempotent; returns its new
        ``runner_state`` (``replicas``: its replicas' Deployments, by index). Zero is refused: no endpoint of the
        platform's stands in front of the Service to hold a request while a replica starts (``refusal`` is then
        unused), and with no Deployment left the attempt would read as gone.

        Each replica is a Deployment of its own (``manifests.inference_deployment``) pinned to the node admission
        booked for it: replica ``i`` to ``placement["nodes"][i]``, which ``serving.replicas.add_replica`` appends
        and ``release_replicas`` takes from the end. A scale-down deletes the Deployments of the replicas past
        ``replicas`` (Foreground: their pods first, taken out of the Service as they terminate); a scale-up
        creates the missing ones on their booked nodes. A replica's Deployment still being deleted, or pinned to
        another node than its booking says (a scale-down whose deletion had not gone through when the slot was
        booked again), is deleted and the call raises TransientDispatchError: the autoscaler's next pass makes
        it anew. Raises PermanentDispatchError for an attempt that is not a serving one or was made with one
        Deployment of all its replicas (it keeps its count until replaced), TransientDispatchError when the
        cluster does not answer.
        """
        if attempt.job.kind != "inference":
            raise PermanentDispatchError(f"{attempt.object_name} is not a serving attempt")
        if replicas < 1:
            raise PermanentDispatchError(f"{attempt.object_name}: a Kubernetes cluster does not scale a serving job "
                                         f"to zero")
        w = dataclasses.replace(workload(attempt), replicas=replicas)
        try:
            return self._scale(client_for(attempt.cluster), attempt, w)
        except _NamespaceMissing as exc:
            raise TransientDispatchError(f"namespace {w.namespace} is gone; {w.name} cannot be scaled") from exc
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc

    def _scale(self, c: ClusterClient, attempt, w: m.Workload) -> dict:
        key = attempt_key(attempt)
        try:
            answer = c.call(c.apps.list_namespaced_deployment, w.namespace, label_selector=_selector_of(key),
                            _preload_content=False)
        except ApiError as exc:
            raise _dispatch_error(exc, f"listing the Deployments of {w.name}") from exc
        listed = {d["metadata"]["name"]: d for d in _list_items(answer, "listing Deployments")
                  if _key_of(d) == key and (d.get("metadata") or {}).get("name")}
        if any(_replica_of(d) is None for d in listed.values()):
            raise PermanentDispatchError(f"{w.name} runs one Deployment of all its replicas; it keeps "
                                         f"{attempt.job.replicas} until an attempt replaces it")
        slots = w.slots
        stale = [name for name, d in listed.items() if not d["metadata"].get("deletionTimestamp")
                 and (int(_replica_of(d)) not in slots
                      or pinned_nodes(d) != set(m.replica_workload(w, int(_replica_of(d))).node_names))]
        for name in stale:  # released replicas, and any whose pinning is not its booking's
            self._delete_deployment(c, w.namespace, name)
        waiting = sorted(name for name, d in listed.items() if int(_replica_of(d)) in slots
                         and (name in stale or d["metadata"].get("deletionTimestamp")))
        for index in slots:
            if m.replica_name(w.name, index) not in listed:
                self._create(c, w, m.inference_deployment(w, index))
        if waiting:
            raise TransientDispatchError(f"the Deployments {', '.join(waiting)} of {w.name} are being deleted; "
                                         f"they are made anew on their booked nodes once gone")
        names = [m.replica_name(w.name, i) for i in slots]
        state = dict(attempt.runner_state or {})
        state["replicas"] = names
        if w.replica_slots:
            state["slots"] = list(w.replica_slots)  # the booking's indexes it follows (``serving.autoscaler``)
        state["objects"] = ([o for o in state.get("objects") or () if o[0] != "Deployment"]
                            + [["Deployment", name] for name in names])
        return state

    replaces_replicas = True

    def replace_replica(self, attempt, key: str) -> dict:
        """Replace the lost replica ``key`` of serving ``attempt`` (``LostReplica.key``: ``<replica>/<pod name>``,
        ``lost_replicas``) in its booked slot: its pod, when it still exists and is not being deleted (a crashed
        server the kubelet keeps restarting in place, or a pod Failed by a kubelet's eviction), is deleted, and
        the replica's Deployment makes a new one pinned to the same node; a pod taken away already is being
        replaced by it. Nothing is admitted or released. Idempotent: a pod gone or going changes nothing.
        Returns the attempt's ``runner_state`` as it is. Raises PermanentDispatchError for a key that names no pod
        of this attempt's shape, TransientDispatchError when the cluster does not answer."""
        _, _, pod_name = key.partition("/")
        if attempt.job.kind != "inference" or not pod_name:
            raise PermanentDispatchError(f"{key!r} names no replica of {attempt.object_name}")
        namespace = team_namespace(attempt.job.team.slug)
        try:
            c = client_for(attempt.cluster)
            pod = next((p for p in self._pods(c, namespace, attempt_key(attempt))
                        if p["metadata"].get("name") == pod_name), None)
            if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                try:
                    c.call(c.core.delete_namespaced_pod, pod_name, namespace, _preload_content=False)
                except ApiError as exc:
                    if exc.status != 404:
                        raise _dispatch_error(exc, f"deleting pod {namespace}/{pod_name}") from exc
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc
        return dict(attempt.runner_state or {})

    # --- rollouts (serving.rollout) ------------------------------------------------------------------------------

    rolls_out = True
    pins_replicas = True

    def replica_keys(self, attempt) -> list[str]:
        """The replica indexes of serving ``attempt`` whose Deployments serve on (not being deleted, not on a
        rollout's probation: ``PROBATION_ANNOTATION``), in index order (the slot booked first first), as strings.
        Raises TransientDispatchError when the cluster does not answer."""
        return [str(i) for i, d in sorted(self._replica_deployments(attempt).items())
                if not d["metadata"].get("deletionTimestamp") and not _on_probation(d)]

    def start_rollout_replica(self, attempt, checkpoint_job_id: int, *, in_place_of: str | None = None) -> str:
        """A replica of serving ``attempt`` on the checkpoint of job ``checkpoint_job_id``
        (``Backend.start_rollout_replica``; ``manifests.inference_deployment`` with that job's claim subPath,
        CHECKPOINT_URI and ``CHECKPOINT_ANNOTATION``). Without ``in_place_of``: the Deployment of the last booked
        slot (the surge ``serving.replicas.add_replica`` appended to ``placement["nodes"]``), created. With it: the
        Deployment of slot ``in_place_of`` gets the new pod template (PUT at the version read, so a concurrent
        change answers 409 and the step is tried again); ``strategy: Recreate`` stops its pod, then starts the new
        one on the same booked node. A replica on another checkpoint than the job's own
        (``spec.checkpoint_from``, else the job) is on probation (``PROBATION_ANNOTATION``: observe leaves its
        end to the rollout) until ``settle_rollout_replica`` finds it ready; one back on the job's own (a roll
        back) is not. Returns the slot's index. Raises PermanentDispatchError (not a serving attempt, a slot
        that is not live), TransientDispatchError (the cluster does not answer, a conflict)."""
        job = attempt.job
        if job.kind != "inference":
            raise PermanentDispatchError(f"{attempt.object_name} is not a serving attempt")
        attempt.refresh_from_db(fields=["placement", "gpus"])  # the surge's booking is newer than the caller's copy
        job.refresh_from_db(fields=["replicas", "spec"])
        w = workload(attempt)
        w = dataclasses.replace(
            w, checkpoint_job_id=checkpoint_job_id,
            checkpoint_uri=m.checkpoint_uri(settings.CHECKPOINT_STORE_URI, job.team.slug, checkpoint_job_id))
        index = w.slots[-1] if in_place_of is None else int(in_place_of)
        manifest = m.inference_deployment(w, index)
        if checkpoint_job_id != ((job.spec or {}).get("checkpoint_from") or job.pk):
            manifest["metadata"].setdefault("annotations", {})[m.PROBATION_ANNOTATION] = "true"
        name = manifest["metadata"]["name"]
        try:
            c = client_for(attempt.cluster)
            if in_place_of is None:
                self._create(c, w, manifest)
                return str(index)
            existing = self._read(c, "Deployment", name, w.namespace)
            if existing is None or existing["metadata"].get("deletionTimestamp") or _key_of(existing) != _key_of(
                    manifest):
                raise PermanentDispatchError(f"{in_place_of!r} is no live replica of {attempt.object_name}")
            manifest["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion")
            c.replace(f"/apis/apps/v1/namespaces/{quote(w.namespace, safe='')}/deployments/{quote(name, safe='')}",
                      manifest)
        except _NamespaceMissing as exc:
            raise TransientDispatchError(f"namespace {w.namespace} is gone; {name} cannot be made") from exc
        except ApiError as exc:
            raise _dispatch_error(exc, f"updating Deployment {w.namespace}/{name}") from exc
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc
        return str(index)

    def settle_rollout_replica(self, attempt, key: str) -> str:
        """Where slot ``key`` of serving ``attempt`` stands (``Backend.settle_rollout_replica``), from the pod of
        its Deployment's current template (the same ``CHECKPOINT_ANNOTATION``; a pod of the template before, still
        terminating, is not it): ``ready`` (Running and Ready, not being deleted: the Service routes to it; it
        leaves probation), ``failed`` (its Deployment gone or being deleted; its pod ended, taken away, crashed or
        in CrashLoopBackOff, or its image not pulled), else ``starting``. Raises TransientDispatchError when the
        cluster does not answer."""
        deployment = self._replica_deployments(attempt).get(int(key))
        if deployment is None or deployment["metadata"].get("deletionTimestamp"):
            return "failed"
        template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
        wanted = (template.get("annotations") or {}).get(m.CHECKPOINT_ANNOTATION)
        namespace = deployment["metadata"]["namespace"]
        try:
            c = client_for(attempt.cluster)
            pods = [p for p in self._pods(c, namespace, attempt_key(attempt)) if _replica_of(p) == key
                    and ((p["metadata"].get("annotations") or {}).get(m.CHECKPOINT_ANNOTATION) == wanted)]
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc
        now = timezone.now()
        for pod in pods:
            if (pod_lost(pod) or pod_deleted(pod) or serving_crash(pod) or pod_failure(pod)
                    or image_pull_failure(pod, now, 0.0)) is not None:
                return "failed"
        if not any(_serves(p) for p in pods):
            return "starting"
        if _on_probation(deployment):
            body = json.loads(json.dumps(deployment))
            del body["metadata"]["annotations"][m.PROBATION_ANNOTATION]
            body.pop("status", None)
            name = deployment["metadata"]["name"]
            try:
                c.replace(f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/deployments/{quote(name, safe='')}",
                          body)
            except ApiError as exc:
                raise _dispatch_error(exc, f"taking Deployment {namespace}/{name} off probation") from exc
            except ClusterUnreachable as exc:
                raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc
        return "ready"

    def retire_replica(self, attempt, key: str) -> dict:
        """Delete the Deployment of slot ``key`` of serving ``attempt`` (Foreground: its pod first, out of the
        Service as it terminates); idempotent; its new ``runner_state`` without it. Its booking is the caller's
        to release (``serving.replicas.release_replicas``: the last slot's). Raises TransientDispatchError when
        the cluster does not answer."""
        name = m.replica_name(attempt.object_name, int(key))
        namespace = team_namespace(attempt.job.team.slug)
        try:
            self._delete_deployment(client_for(attempt.cluster), namespace, name)
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc
        state = dict(attempt.runner_state or {})
        state["replicas"] = [n for n in state.get("replicas") or () if n != name]
        state["objects"] = [o for o in state.get("objects") or () if list(o) != ["Deployment", name]]
        return state

    def finish_rollout(self, attempt, checkpoint_job_id: int) -> dict:
        """Nothing to change on the cluster: each replica's Deployment names its checkpoint, and replicas made
        from now on (scale-ups, the next attempt) take theirs from the job's ``spec.checkpoint_from``, which
        ``serving.rollout`` sets when the rollout is done; ``runner_state`` records the checkpoint job."""
        return {**(attempt.runner_state or {}), "checkpoint_job": checkpoint_job_id}

    def _replica_deployments(self, attempt) -> dict[int, dict]:
        """The replica Deployments of serving ``attempt``, by index (one LIST by label in its namespace). Raises
        PermanentDispatchError for an attempt made with one Deployment of all its replicas, TransientDispatchError
        when the cluster does not answer."""
        namespace = team_namespace(attempt.job.team.slug)
        key = attempt_key(attempt)
        try:
            c = client_for(attempt.cluster)
            answer = c.call(c.apps.list_namespaced_deployment, namespace, label_selector=_selector_of(key),
                            _preload_content=False)
            listed = [d for d in _list_items(answer, "listing Deployments") if _key_of(d) == key]
        except ApiError as exc:
            raise _dispatch_error(exc, f"listing the Deployments of {attempt.object_name}") from exc
        except ClusterUnreachable as exc:
            raise TransientDispatchError(f"cluster {attempt.cluster.name} unreachable: {exc}") from exc
        if any(_replica_of(d) is None for d in listed):
            raise PermanentDispatchError(f"{attempt.object_name} runs one Deployment of all its replicas; it is not "
                                         f"rolled out replica by replica")
        return {int(_replica_of(d)): d for d in listed}

    def _delete_deployment(self, c: ClusterClient, namespace: str, name: str) -> None:
        """DELETE the Deployment ``namespace/name``, Foreground (its pods first); one gone already is left."""
        try:
            c.call(c.apps.delete_namespaced_deployment, name, namespace, propagation_policy="Foreground",
                   _preload_content=False)
        except ApiError as exc:
            if exc.status != 404:
                raise _dispatch_error(exc, f"deleting Deployment {namespace}/{name}") from exc

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

    def _create(self, c: ClusterClient, w: m.Workload, manifest: dict) -> dt.datetime | None:
        """Create ``manifest`` (or find it created before by this attempt); returns its creationTimestamp."""
        _, read, _, _ = _api(c, manifest["kind"])
        name = manifest["metadata"]["name"]
        what = f"creating {manifest['kind']} {w.namespace}/{name}"
        try:
            body = c.create(_COLLECTIONS[manifest["kind"]].format(namespace=quote(w.namespace, safe="")), manifest)
            made = _parse(body, what)
            meta = (made.get("metadata") if isinstance(made, dict) else None) or {}
            if meta.get("name") != name:  # a 2xx that is not the object: nothing says it exists
                raise ClusterUnreachable(f"{what}: the answer is not the created object")
            return _parse_time(meta.get("creationTimestamp"))
        except ApiError as exc:
            if exc.status == 404 and w.namespace in c.namespaces:
                c.namespaces.discard(w.namespace)
                raise _NamespaceMissing(w.namespace) from exc
            if exc.status != 409:
                raise _dispatch_error(exc, what) from exc
        try:
            existing = _object(c.call(read, name, w.namespace, _preload_content=False), name, what)
        except ApiError as exc:
            raise _dispatch_error(exc, f"{what} (reading the existing one)") from exc
        if m.LABEL_ENDPOINT in _labels(manifest):  # the job's Service, made by an earlier attempt: kept as it is
            if endpoint_owned(existing, w.job_id, w.installation):
                return _parse_time((existing.get("metadata") or {}).get("creationTimestamp"))
            raise PermanentDispatchError(f"{what}: a Service of that name exists and is not this job's endpoint; "
                                         f"refused")
        mine = w.attempt_uid or w.attempt_id
        if _key_of(existing) != mine:  # a namesake: refused, never taken for this attempt's own
            raise PermanentDispatchError(f"{what}: an object of that name exists and belongs to another attempt "
                                         f"({_key_of(existing)!r}, not {mine!r}); refused")
        return _parse_time((existing.get("metadata") or {}).get("creationTimestamp"))

    # --- observation -------------------------------------------------------------------------------------------

    def _list(self, c: ClusterClient, kind: str, *, selector: str = SELECTOR,
              versions: dict[str, str] | None = None) -> list[dict]:
        """Every object of ``kind`` carrying the platform's labels (and matching ``selector``, a label selector),
        in one LIST over all namespaces; the list's ``metadata.resourceVersion`` goes into ``versions[kind]``
        when given (left out when the server sends none).

        Raises ClusterUnreachable for any answer that is not a well-formed
        list: an error status (a 404 too: behind a load balancer during an
        upgrade a healthy API server answers 404 for a kind it serves), a
        timeout, a body that is not JSON or has no ``items`` list. Such an
        answer says nothing about which objects exist.
        """
        list_all = c.core.list_pod_for_all_namespaces if kind == "Pod" else _api(c, kind)[3]
        try:
            answer = c.call(list_all, label_selector=selector, _preload_content=False)
        except ApiError as exc:
            raise _read_failure(exc, f"listing {kind}s") from exc
        items = _list_items(answer, f"listing {kind}s", versions, kind)
        # Filter here too: the selector is a request, and a proxy or an old server may ignore it.
        return [obj for obj in items if m.LABEL_JOB in _labels(obj)]

    def _read(self, c: ClusterClient, kind: str, name: str, namespace: str) -> dict | None:
        """The object ``kind`` ``namespace/name``; None only when its own GET answers 404 NotFound.

        Raises ClusterUnreachable for every other failure (an error status, a timeout, a malformed body).
        """
        try:
            answer = c.call(_api(c, kind)[1], name, namespace, _preload_content=False)
        except ApiError as exc:
            if exc.status == 404:  # one look; reconcile acts only on a second in a row (a proxy may answer 404)
                return None
            raise ClusterUnreachable(f"reading {kind} {namespace}/{name}: {exc}") from exc
        return _object(answer, name, f"reading {kind} {namespace}/{name}")

    def observe(self, cluster, attempts: Iterable) -> dict[int, Observation]:
        """One LIST of Jobs, Deployments and Pods on ``cluster``; an Observation per attempt id.

        Phases as in ``observe_training`` and ``observe_inference``; an attempt
        missing from the LIST is read by its own GET, and is ``absent`` only
        when that answers 404. Raises ClusterUnreachable when the cluster does
        not answer, or answers an error or a malformed body to any call.
        """
        attempts = list(attempts)
        c = client_for(cluster)
        kinds = {a.job.kind for a in attempts}
        # With no attempt to look at, the Job LIST alone is the cluster's health probe.
        jobs = self._list(c, "Job") if kinds & {"training", MULTI_ROLE} or not attempts else []
        deployments = self._list(c, "Deployment") if "inference" in kinds else []
        pods = self._list(c, "Pod") if attempts else []
        if attempts:
            _check_pods_listed(jobs + deployments, pods)
        return self._observations(c, attempts, jobs, deployments, pods, self._jobsets(c, attempts))

    def owned_attempt_ids(self, cluster) -> dict[int, Owned]:
        """Attempt ids labelled on any Job, Deployment or Service of the platform on ``cluster`` (four LISTs),
        each with whether its pods still hold GPUs and when its objects were created."""
        c = client_for(cluster)
        jobs, deployments, services = (self._list(c, kind) for kind in ("Job", "Deployment", "Service"))
        return _owned(jobs + deployments + services, self._list(c, "Pod"))

    def observe_all(self, cluster, attempts: Iterable, versions: dict[str, str] | None = None,
                    ) -> tuple[dict[int, Observation], dict[int, Owned]]:
        """``observe`` and ``owned_attempt_ids`` from one LIST per kind (Job, Deployment, Service, Pod, and
        JobSet while a multi-role attempt is looked at on a cluster that serves it): four LISTs instead of up to
        seven, each kind parsed once; GETs only for attempts missing from the LISTs. ``versions``: filled with
        each watched kind's list resourceVersion (``WATCHED_KINDS``), where ``changes`` resumes from."""
        attempts = list(attempts)
        c = client_for(cluster)
        jobs, deployments, services, pods = (self._list(c, kind, versions=versions) for kind in WATCHED_KINDS)
        _check_pods_listed(jobs + deployments, pods)
        jobsets = self._jobsets(c, attempts)
        return (self._observations(c, attempts, jobs, deployments, pods, jobsets),
                _owned(jobs + deployments + services + jobsets, pods))

    def changes(self, cluster, versions: dict[str, str]) -> tuple[set, dict[str, str]] | None:
        """The attempt keys (``attempt_key``) whose objects of a watched kind (``WATCHED_KINDS``) were added,
        changed or deleted on ``cluster`` since ``versions`` (``{kind: resourceVersion}``, from ``observe_all`` or
        an earlier call), and the versions to resume from next; None when a version is missing or the server no
        longer keeps the changes since it (410 Gone, reason Expired) or has none that new (504 "Too large resource
        version"): only a full LIST can say what exists.

        One watch per kind, concurrent, resumed from its version with bookmarks and a server-side timeout of
        ``K8S_WATCH_SECONDS``; the events the server has kept since that version come first, and what the
        stream held when the server closed it is taken (Kubernetes API concepts, "Efficient detection of
        changes", "Watch bookmarks", "410 Gone responses"). Resource versions are opaque: they are only sent
        back, never compared. Raises ClusterUnreachable for any other error answer, a timeout or a malformed
        event; a stream cut inside an event keeps the events before it (the next call resumes after them).
        """
        if any(not versions.get(kind) for kind in WATCHED_KINDS):
            return None
        c = client_for(cluster)
        with ThreadPoolExecutor(max_workers=len(WATCHED_KINDS), thread_name_prefix="reconcile-watch") as pool:
            answers = list(pool.map(lambda kind: self._watch(c, kind, versions[kind]), WATCHED_KINDS))
        if any(answer is None for answer in answers):
            return None
        keys: set = set().union(*(found for found, _ in answers))
        return keys, {kind: version for kind, (_, version) in zip(WATCHED_KINDS, answers, strict=True)}

    def _watch(self, c: ClusterClient, kind: str, version: str) -> tuple[set, str] | None:
        """One watch of ``kind`` from ``version``: ``(attempt keys of the changed objects, the version to resume
        from)``, or None for 410 Gone (see ``changes``)."""
        list_all = c.core.list_pod_for_all_namespaces if kind == "Pod" else _api(c, kind)[3]
        what = f"watching {kind}s"
        try:
            answer = c.call(list_all, label_selector=SELECTOR, watch=True, resource_version=version,
                            allow_watch_bookmarks=True, timeout_seconds=int(settings.K8S_WATCH_SECONDS),
                            _preload_content=False)
            data = answer.data
        except ApiError as exc:
            if exc.status == 410 or _too_large(exc.status, exc.message):
                return None
            raise _read_failure(exc, what) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnreachable(f"{what}: {type(exc).__name__}: {exc}") from exc
        keys: set = set()
        lines = (data or b"").split(b"\n")
        for line in lines[:-1] if not (data or b"").endswith(b"\n") else lines:  # a cut last event: not received
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                kind_of, obj = event["type"], event["object"]
                if not isinstance(obj, dict):
                    raise TypeError("object is not a JSON object")
            except (ValueError, TypeError, KeyError) as exc:
                raise ClusterUnreachable(f"{what}: malformed event: {exc}") from exc
            if kind_of == "ERROR":
                if obj.get("code") == 410 or _too_large(obj.get("code"), obj.get("message")):
                    return None
                raise ClusterUnreachable(f"{what}: HTTP {obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
            resumed = (obj.get("metadata") or {}).get("resourceVersion")
            if not isinstance(resumed, str) or not resumed:
                raise ClusterUnreachable(f"{what}: an event without a resourceVersion")
            version = resumed
            if kind_of in ("ADDED", "MODIFIED", "DELETED") and m.LABEL_JOB in _labels(obj):
                if (key := _key_of(obj)) is not None:
                    keys.add(key)
        return keys, version

    def observe_changed(self, cluster, attempts: Iterable, keys: Iterable) -> tuple[dict[int, Observation],
                                                                                   dict[int, Owned]]:
        """``observe_all`` for ``attempts`` only, and what the cluster holds of them and of the attempt keys
        ``keys`` (objects changed since the last look, of attempts live or not): one LIST per watched kind and
        chunk of ``KEYS_PER_LIST`` keys, selected by a set-based label selector (``attempt-uid in (...)``; the
        attempt id for attempts made before uids), each answer filtered again here (a server may ignore the
        selector). GETs only for attempts missing from the LISTs. Raises like ``observe_all``."""
        attempts = list(attempts)
        c = client_for(cluster)
        wanted = {attempt_key(a) for a in attempts} | set(keys)
        listed: dict[str, list[dict]] = {kind: [] for kind in WATCHED_KINDS}
        ordered = sorted(wanted, key=str)
        for start in range(0, len(ordered), KEYS_PER_LIST):
            chunk = ordered[start:start + KEYS_PER_LIST]
            uids = sorted(k for k in chunk if isinstance(k, str))
            ids = sorted(str(k) for k in chunk if not isinstance(k, str))
            selectors = ([f"{SELECTOR},{m.LABEL_ATTEMPT_UID} in ({','.join(uids)})"] if uids else []) + (
                [f"{SELECTOR},{m.LABEL_ATTEMPT} in ({','.join(ids)})"] if ids else [])
            for selector in selectors:
                for kind in WATCHED_KINDS:
                    listed[kind] += [o for o in self._list(c, kind, selector=selector) if _key_of(o) in wanted]
        jobs, deployments, services, pods = (listed[kind] for kind in WATCHED_KINDS)
        _check_pods_listed(jobs + deployments, pods)
        jobsets = [o for o in self._jobsets(c, attempts) if _key_of(o) in wanted]
        return (self._observations(c, attempts, jobs, deployments, pods, jobsets),
                _owned(jobs + deployments + services + jobsets, pods))

    def _jobsets(self, c: ClusterClient, attempts: list) -> list[dict]:
        """The platform's JobSets on the cluster (one LIST) when ``attempts`` hold a multi-role one and the cluster
        serves JobSets (``ClusterClient.serves``, its API group list remembered a while); else none, no call."""
        if not any(a.job.kind == MULTI_ROLE for a in attempts) or not c.serves(m.JOBSET_API_VERSION):
            return []
        return self._list(c, "JobSet")

    def _observations(self, c: ClusterClient, attempts: list, jobs: list[dict], deployments: list[dict],
                      pods: list[dict], jobsets: list[dict] = ()) -> dict[int, Observation]:
        """An Observation per attempt id from the listed objects (see ``observe``).

        Evidence that outlives the pod: a training pod that vanished without a cause of its own (``PodDeleted``:
        garbage-collected with its node before any look saw its DisruptionTarget, e.g. while the control plane was
        down) from a node of the attempt's placement that is no longer among the cluster's Nodes was lost with its
        node: ``NodeLost`` naming it (on a spot pool, ``jobs.lifecycle.spot_cause`` makes that ``SpotReclaimed``),
        never a ``PodDeleted`` charged to the job's retries. Class: a verdict on missing evidence; invariant
        ``loss_counted_by_cause`` of the simulator."""
        by_attempt: dict[str | int | None, list[dict]] = defaultdict(list)  # a Job, or a serving attempt's Deployments
        for obj in jobs + deployments:
            if m.LABEL_ROLE not in _labels(obj):
                by_attempt[_key_of(obj)].append(obj)
        jobset_of = {_key_of(o): o for o in jobsets}
        role_jobs: dict[str | int | None, dict[str, dict]] = defaultdict(dict)
        for job in jobs:
            if m.LABEL_ROLE in _labels(job):
                role_jobs[_key_of(job)][_labels(job)[m.LABEL_ROLE]] = job
        pods_of: dict[str | int | None, list[dict]] = defaultdict(list)
        for pod in pods:
            pods_of[_key_of(pod)].append(pod)
        now = timezone.now()
        grace = float(settings.K8S_IMAGE_PULL_GRACE_SECONDS)
        unschedulable_grace = float(settings.K8S_UNSCHEDULABLE_GRACE_SECONDS)
        result = {}
        node_names: set[str] | None = None  # listed once, only if a pod vanished without a cause of its own
        for attempt in attempts:
            key = attempt_key(attempt)
            if attempt.job.kind == MULTI_ROLE:
                observed = self._observe_roles(c, attempt, role_jobs.get(key, {}), pods_of.get(key, []),
                                               jobset_of.get(key), now, grace, unschedulable_grace)
            else:
                observed = self._observe_one(c, attempt, by_attempt.get(key, []), pods_of.get(key, []), now, grace,
                                             unschedulable_grace)
            result[attempt.pk] = observed
            if attempt.job.kind == "inference" and (observed.phase in ("pending", "unschedulable")
                                                    or observed.lost_replicas):
                # A replica not ready, or one lost (a spot node's shutdown reads as a preemption), may be one whose
                # node is gone: the Nodes are listed once per look, only then.
                pinned = set().union(*(pinned_nodes(d) for d in serving_replicas(by_attempt.get(key, []))))
                if pinned and node_names is None:
                    node_names = {(n.get("metadata") or {}).get("name") for n in self._nodes(c)}
                if gone := pinned - (node_names or set()):
                    # A replica pinned to a node that is gone never starts again there: lost with its node, the
                    # others serving on (``observe_inference``; every replica so lost: the attempt is).
                    result[attempt.pk] = self._observe_one(c, attempt, by_attempt.get(key, []), pods_of.get(key, []),
                                                           now, grace, unschedulable_grace, frozenset(gone))
                continue
            if observed.phase == "lost" and observed.end_reason == "PodDeleted" and not observed.nodes:
                if node_names is None:
                    node_names = {(n.get("metadata") or {}).get("name") for n in self._nodes(c)}
                gone = tuple(n for n in (attempt.placement or {}).get("nodes") or () if n not in node_names)
                if gone:
                    result[attempt.pk] = dataclasses.replace(
                        observed, end_reason="NodeLost", nodes=gone,
                        message=f"{observed.message}; its node {', '.join(gone)} is gone from the cluster".strip("; "))
        return result

    def _observe_one(self, c: ClusterClient, attempt, listed: list[dict], pods: list[dict], now: dt.datetime,
                     grace: float, unschedulable_grace: float, gone_nodes: frozenset[str] = frozenset()
                     ) -> Observation:
        """The Observation of a training or inference ``attempt`` from its listed Job or Deployments ``listed``
        (none listed: only the object's own GET can say it is gone, and an end record how it ended: a serving
        attempt's first booked replica's Deployment, or the one Deployment of an attempt made before replicas had
        their own) and its pods; ``gone_nodes``: nodes the cluster no longer has (``observe_inference``)."""
        kind = "Deployment" if attempt.job.kind == "inference" else "Job"
        if not listed:
            namespace = team_namespace(attempt.job.team.slug)
            first = replica_slots(attempt.placement, attempt.job.replicas)[:1] or [0]
            names = ([m.replica_name(attempt.object_name, first[0]), attempt.object_name] if kind == "Deployment"
                     else [attempt.object_name])
            for name in names:
                obj = self._read(c, kind, name, namespace)
                if obj is not None and _key_of(obj) == attempt_key(attempt):  # never a namesake of another attempt
                    listed = [obj]
                    break
            if not listed and (ended := self._end_record(c, attempt, namespace)) is not None:
                return ended
        if kind == "Deployment":
            return observe_inference(listed, pods, now, grace, unschedulable_grace, started_at=attempt.started_at,
                                     max_runtime_seconds=attempt.job.max_runtime_seconds, gone_nodes=gone_nodes)
        return observe_training(listed[0] if listed else None, pods, attempt.job.nodes, now, grace,
                                unschedulable_grace)

    def _observe_roles(self, c: ClusterClient, attempt, listed: dict[str, dict], pods: list[dict],
                       jobset: dict | None, now: dt.datetime, grace: float, unschedulable_grace: float) -> Observation:
        """The Observation of a multi-role ``attempt`` (``observe_multi_role``) from its listed Jobs by role and its
        listed JobSet (None: none listed); when the LISTs have none of them, its JobSet (where served) and each
        role's Job are read by their own GETs, and the attempt is ``absent`` only when every one answers 404 and
        no end record of it exists (``ended`` when one does)."""
        if not listed and jobset is None:
            namespace, key = team_namespace(attempt.job.team.slug), attempt_key(attempt)
            for kind, name, _ in owned_objects(attempt):
                if kind == "Service" or (kind == "JobSet" and not c.serves(m.JOBSET_API_VERSION)):
                    continue
                obj = self._read(c, kind, name, namespace)
                if obj is None or _key_of(obj) != key:
                    continue
                if kind == "JobSet":
                    jobset = obj
                else:
                    listed[_labels(obj).get(m.LABEL_ROLE, "")] = obj
            if not listed and jobset is None and (ended := self._end_record(c, attempt, namespace)) is not None:
                return ended
        return observe_multi_role(listed, pods, role_shapes(attempt.placement), now, grace, unschedulable_grace,
                                  jobset=jobset)

    # --- deletion and logs -------------------------------------------------------------------------------------

    def delete(self, attempt) -> bool:
        """Delete the attempt's objects (``owned_objects``: its Job or Deployment, Foreground: pods first, and
        Service; every role's Job and Service for a multi-role attempt; a serving attempt's replica Deployments,
        ``_objects_of``); True once all answer 404 and no pod is left. A serving job's Service (its endpoint) is
        the job's: it is deleted only when the job will not run again (``ENDPOINT_ENDS``), and is kept for the
        attempt that follows a recovery.

        Before the first DELETE of an object it owns, writes the attempt's end
        record (``write_end_record``; a failure to write it raises
        ClusterUnreachable and deletes nothing), so the end stays visible in the
        cluster after the objects are gone. Sets ``attempt.deletion_accepted_at``
        to when the API server accepted the first DELETE of the Job or
        Deployment (its pods stop from then; of several Jobs, the latest): the owner's own
        ``metadata.deletionTimestamp``, which a repeated DELETE leaves as it
        was, so every delivery of a deletion tells the same time; now only when
        the answer carries none (the owner went at once, and a later call finds
        nothing to accept). Sets ``attempt.holding_seen_at`` to now when its
        pods were seen still holding their GPUs (``_no_pods``).

        Raises ClusterUnreachable when the cluster cannot be reached (the
        caller retries on reconnection).
        """
        c = client_for(attempt.cluster)
        namespace, key = team_namespace(attempt.job.team.slug), attempt_key(attempt)
        gone, recorded, accepted = True, False, []
        for kind, name, policy in self._objects_of(c, attempt, namespace):
            _, read, delete, _ = _api(c, kind)
            try:
                existing = _object(c.call(read, name, namespace, _preload_content=False), name,
                                   f"reading {kind} {namespace}/{name}")
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise ClusterUnreachable(f"reading {kind} {namespace}/{name}: {exc}") from exc
            if _key_of(existing) != key:
                continue  # same name, another owner: never ours to delete
            gone = False
            if not recorded and isinstance(key, str):
                self.write_end_record(c, attempt, namespace, existing)
                recorded = True
            try:
                answer = c.call(delete, name, namespace, propagation_policy=policy, _preload_content=False)
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise ClusterUnreachable(f"deleting {kind} {namespace}/{name}: {exc}") from exc
            if kind != "Service":  # the pods are being stopped from then on: billing may end there
                accepted.append(deletion_time(existing) or deletion_time(_parse_or_none(answer)) or timezone.now())
        if accepted:  # several Jobs (a multi-role attempt): every pod was being stopped once the last was accepted
            attempt.deletion_accepted_at = max(accepted)
        if attempt.job.kind == "inference" and attempt.job.state in ENDPOINT_ENDS:
            self._delete_endpoint(c, attempt, namespace)
        if not gone:
            return self._all_gone(c, attempt, namespace)
        return self._no_pods(c, attempt, namespace, key)

    def write_end_record(self, c: ClusterClient, attempt, namespace: str, owner: dict) -> None:
        """Create the ConfigMap ``end-<object name>`` saying how ``attempt`` ended (``manifests.end_record``).

        ``job_state``: the job's final state, CANCELLED for a cancel in
        progress, else RECOVERING (the attempt ended and the job was to run
        again); ``ended_at``: the attempt's end, or now for a cancel (its DELETE
        follows); ``started_at``: its start or its objects' creation. A record
        there already (409) is kept. Raises ClusterUnreachable on any other failure.
        """
        from jobs.models import FINAL_STATES, JobState  # the record names job states; jobs sits above this layer

        job = attempt.job
        cancelling = attempt.ended_at is None and job.state == JobState.CANCELLING
        state = job.state if job.state in FINAL_STATES else JobState.CANCELLED if cancelling else JobState.RECOVERING
        started = attempt.started_at or created_at(owner, [])
        record = {"uid": str(attempt.uid), "attempt_id": attempt.pk, "job_id": job.pk, "job_state": str(state),
                  "end_reason": attempt.end_reason or ("Cancelled" if cancelling else "Deleted"),
                  "exit_code": "" if attempt.exit_code is None else attempt.exit_code,
                  "started_at": started.isoformat() if started else "",
                  "ended_at": (attempt.ended_at or timezone.now()).isoformat(),
                  "dispatch_record": ((owner.get("metadata") or {}).get("annotations") or {}).get(
                      m.RECORD_ANNOTATION, "")}
        body = m.end_record(namespace, attempt.object_name, _labels(owner), record)
        try:
            c.create(_COLLECTIONS["ConfigMap"].format(namespace=quote(namespace, safe="")), body)
        except ApiError as exc:
            if exc.status != 409:
                raise ClusterUnreachable(f"writing the end record of {attempt.object_name}: {exc}") from exc

    def record_end(self, attempt, tries: int = 3) -> bool:
        """Move the ``ended_at`` of ``attempt``'s end record forward to the attempt's end (``Backend.record_end``).

        Class of failure: an end recorded on the cluster before the pods' real stop. The record is written
        before the first DELETE, with the end known then (a preemption's, or now for a cancel), and the
        attempt's end moves later on the cluster's evidence (the owner's deletion accepted, pods seen running
        out their termination grace, a cancel finished once its pods were gone, ``lifecycle.bill_objects``);
        a database restored from a backup ended the attempt at the record's earlier end and billed less than
        its pods held. Invariant: the record's end is the attempt's latest end, and moves only forward
        (docs/adr/0021): the same end however often this runs, never earlier than what the record says.

        One GET of ``end-<object name>``, then a PUT carrying the read ``resourceVersion`` (a compare-and-set:
        another writer in between answers 409 Conflict, and the record is read again, ``tries`` times in all).
        False when there is nothing to move: the attempt has no end, no record of its uid (a legacy attempt,
        or a record expired or never written), or the record's end is as late already. Raises
        ClusterUnreachable for any other failure, and when every try met a conflict.
        """
        ended = attempt.ended_at
        if ended is None or attempt.legacy_name:
            return False
        c = client_for(attempt.cluster)
        namespace = team_namespace(attempt.job.team.slug)
        name = f"{m.END_RECORD_PREFIX}{attempt.object_name}"
        for _ in range(tries):
            found = self._read(c, "ConfigMap", name, namespace)
            if found is None or _labels(found).get(m.END_RECORD_LABEL) != str(attempt.uid):
                return False
            moved = _move_end_record(c, found, ended)
            if moved is not None:
                return moved
        raise ClusterUnreachable(f"updating the end record of {attempt.object_name}: changed under {tries} tries")

    def _end_record(self, c: ClusterClient, attempt, namespace: str) -> Observation | None:
        """``ended`` with the attempt's end record when the cluster keeps one for its uid (one GET), else None."""
        if attempt.legacy_name:
            return None
        name = f"{m.END_RECORD_PREFIX}{attempt.object_name}"
        found = self._read(c, "ConfigMap", name, namespace)
        if found is None or _labels(found).get(m.END_RECORD_LABEL) != str(attempt.uid):
            return None
        return end_observation(found.get("data") or {})

    def expire_end_records(self, cluster, older_than: dt.datetime) -> int:
        """Delete this installation's end records on ``cluster`` created before ``older_than``; returns how many
        (``sweep_end_records`` without moving any). Raises ClusterUnreachable."""
        return self.sweep_end_records(cluster, older_than)["deleted"]

    def sweep_end_records(self, cluster, older_than: dt.datetime,
                          latest_ends: Callable[[list[str]], dict[str, dt.datetime]] | None = None) -> dict[str, int]:
        """One pass over this installation's end records on ``cluster`` (one ConfigMap LIST by label): delete
        those created before ``older_than`` (aware UTC), and move forward the ``ended_at`` of the others whose
        attempt ended later than they say; returns ``{"deleted": n, "moved": n}``.

        ``latest_ends(uids)`` (attempt uids as strings) gives ``{uid: end}`` for the attempts that have ended
        (the database's ends); None moves nothing. Class of failure: an end record left behind its attempt's
        end because the cluster did not answer ``record_end`` through all its retries; a database restored
        later ends the attempt at the stale, earlier end and bills less than its pods held. Invariant: within
        one sweep interval of the cluster answering again, every record's end is its attempt's end
        (docs/adr/0021). A move is the same compare-and-set PUT as ``record_end``'s; one that meets a
        conflict (written meanwhile) is left to the next sweep. Raises ClusterUnreachable for a failed LIST,
        DELETE or PUT.
        """
        c = client_for(cluster)
        mine = installation_uid()
        try:
            answer = c.call(_api(c, "ConfigMap")[3], label_selector=m.END_RECORD_LABEL, _preload_content=False)
        except ApiError as exc:
            raise ClusterUnreachable(f"listing ConfigMaps failed: {exc}") from exc
        kept, deleted = [], 0
        for record in _list_items(answer, "listing ConfigMaps"):
            meta = record.get("metadata") or {}
            made = _parse_time(meta.get("creationTimestamp"))
            if _labels(record).get(m.LABEL_INSTALLATION) != mine or made is None:
                continue
            if made >= older_than:
                kept.append(record)
                continue
            try:
                c.call(_api(c, "ConfigMap")[2], meta.get("name"), meta.get("namespace"), _preload_content=False)
            except ApiError as exc:
                if exc.status != 404:
                    raise ClusterUnreachable(f"deleting ConfigMap {meta.get('name')}: {exc}") from exc
            deleted += 1
        moved = 0
        ends = latest_ends([_labels(r).get(m.END_RECORD_LABEL, "") for r in kept]) if latest_ends and kept else {}
        for record in kept:
            ended = ends.get(_labels(record).get(m.END_RECORD_LABEL, ""))
            if ended is not None and _move_end_record(c, record, ended):
                moved += 1
        return {"deleted": deleted, "moved": moved}

    def _objects_of(self, c: ClusterClient, attempt, namespace: str) -> list[tuple[str, str, str]]:
        """``owned_objects`` of ``attempt`` and, for a serving attempt, the Deployments of its replicas, found by
        one LIST of its labels in ``namespace`` (a scale changes how many there are), first, so the end record
        is written from a replica's (it carries the dispatch record). Raises ClusterUnreachable."""
        objects = owned_objects(attempt)
        if attempt.job.kind != "inference":
            return objects
        try:
            answer = c.call(c.apps.list_namespaced_deployment, namespace,
                            label_selector=_selector_of(attempt_key(attempt)), _preload_content=False)
        except ApiError as exc:
            raise ClusterUnreachable(f"listing Deployments in {namespace}: {exc}") from exc
        names = sorted({(d.get("metadata") or {}).get("name") for d in _list_items(answer, "listing Deployments")
                        if _key_of(d) == attempt_key(attempt)} - {None, attempt.object_name})
        return [("Deployment", name, "Foreground") for name in names] + objects

    def _delete_endpoint(self, c: ClusterClient, attempt, namespace: str) -> None:
        """Delete the Service of ``attempt``'s serving job (its endpoint, ``manifests.inference_service``) when it
        is that job's (``endpoint_owned``); one that is gone is left. Raises ClusterUnreachable."""
        job = attempt.job
        name = m.serving_service_name(job.pk)
        found = self._read(c, "Service", name, namespace)
        if found is None or not endpoint_owned(found, job.pk, "" if attempt.legacy_name else installation_uid()):
            return
        try:
            c.call(c.core.delete_namespaced_service, name, namespace, _preload_content=False)
        except ApiError as exc:
            if exc.status != 404:
                raise ClusterUnreachable(f"deleting Service {namespace}/{name}: {exc}") from exc

    def sweep_endpoints(self, cluster) -> int:
        """Delete this installation's serving Services (``manifests.inference_service``) on ``cluster`` whose job
        will not run there again: the job has no row, has ended (its last attempt's deletion normally takes the
        Service with it; a job that ended while waiting in the queue has no attempt to do so), or runs on another
        cluster now. One LIST of Services by label, one query, a DELETE each; returns how many were deleted.
        Raises ClusterUnreachable."""
        from jobs.models import Job

        c = client_for(cluster)
        mine = installation_uid()
        try:
            answer = c.call(_api(c, "Service")[3], label_selector=f"{m.LABEL_ENDPOINT}=true", _preload_content=False)
        except ApiError as exc:
            raise ClusterUnreachable(f"listing Services failed: {exc}") from exc
        found = {}
        for svc in _list_items(answer, "listing Services"):
            job_id = _labels(svc).get(m.LABEL_JOB, "")
            if job_id.isdigit() and endpoint_owned(svc, int(job_id), mine):
                found[int(job_id)] = svc
        rows = Job.objects.filter(pk__in=found).exclude(state__in=FINAL_STATES).values_list(
            "pk", "current_attempt__cluster_id", "current_attempt__ended_at")
        kept = {pk for pk, where, ended in rows if where in (None, cluster.pk) or ended is not None}
        deleted = 0
        for job_id, svc in found.items():
            if job_id in kept:
                continue
            meta = svc.get("metadata") or {}
            try:
                c.call(c.core.delete_namespaced_service, meta.get("name"), meta.get("namespace"),
                       _preload_content=False)
            except ApiError as exc:
                if exc.status != 404:
                    raise ClusterUnreachable(f"deleting Service {meta.get('name')}: {exc}") from exc
            deleted += 1
        return deleted

    def _all_gone(self, c: ClusterClient, attempt, namespace: str) -> bool:
        owner = False
        for kind, name, _ in self._objects_of(c, attempt, namespace):
            try:
                obj = _object(c.call(_api(c, kind)[1], name, namespace, _preload_content=False), name,
                              f"reading {kind} {namespace}/{name}")
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise ClusterUnreachable(f"reading {kind} {namespace}/{name}: {exc}") from exc
            if _key_of(obj) == attempt_key(attempt):
                owner = True
                break
        return self._no_pods(c, attempt, namespace, attempt_key(attempt)) and not owner

    def _no_pods(self, c: ClusterClient, attempt, namespace: str, key: str | int) -> bool:
        """Whether no pod of ``attempt`` is left (one LIST by label); when one still holds its GPUs (``_holding``:
        Terminating pods running out their grace count), sets ``attempt.holding_seen_at`` to now, this look's
        time: the last instant its pods are known to have held them (docs/adr/0021)."""
        pods = self._pods(c, namespace, key)
        if _holding(pods):
            attempt.holding_seen_at = timezone.now()
        return not pods

    def still_holding(self, attempt) -> bool:
        """Whether a pod of ``attempt`` still holds its GPUs (``_holding``: Terminating pods whose containers run
        out their grace count); one LIST by label. Raises ClusterUnreachable."""
        return _holding(self._pods(client_for(attempt.cluster), team_namespace(attempt.job.team.slug),
                                   attempt_key(attempt)))

    def _pods(self, c: ClusterClient, namespace: str, key: str | int) -> list[dict]:
        """The pods of the attempt with ``key`` (``attempt_key``) in ``namespace`` (one LIST by label)."""
        try:
            answer = c.call(c.core.list_namespaced_pod, namespace, label_selector=_selector_of(key),
                            _preload_content=False)
        except ApiError as exc:  # a namespace without pods answers an empty list, never 404
            raise ClusterUnreachable(f"listing pods in {namespace}: {exc}") from exc
        return [p for p in _list_items(answer, f"listing pods in {namespace}") if _key_of(p) == key]

    # --- recovery after a restore ------------------------------------------------------------------------------

    def inventory(self, cluster) -> list[dict]:
        """Every attempt of this installation on ``cluster``, from one LIST of Jobs, Deployments, Pods and
        ConfigMaps (see ``Backend.inventory``); ``observation`` is its phase now (``ended`` for an end record
        alone). Raises ClusterUnreachable."""
        c = client_for(cluster)
        mine = installation_uid()
        jobs, deployments, pods = (self._list(c, kind) for kind in ("Job", "Deployment", "Pod"))
        _check_pods_listed(jobs + deployments, pods)
        try:
            answer = c.call(_api(c, "ConfigMap")[3], label_selector=m.END_RECORD_LABEL, _preload_content=False)
        except ApiError as exc:
            raise ClusterUnreachable(f"listing ConfigMaps failed: {exc}") from exc
        ends = {_labels(o).get(m.END_RECORD_LABEL): o for o in _list_items(answer, "listing ConfigMaps")
                if _labels(o).get(m.LABEL_INSTALLATION) == mine}
        pods_of: dict[str | int | None, list[dict]] = defaultdict(list)
        for pod in pods:
            pods_of[_key_of(pod)].append(pod)
        role_jobs: dict[str, dict[str, dict]] = defaultdict(dict)
        for job in jobs:
            if m.LABEL_ROLE in _labels(job):
                role_jobs[_key_of(job)][_labels(job)[m.LABEL_ROLE]] = job
        replicas_of: dict[str | int | None, list[dict]] = defaultdict(list)
        for deployment in deployments:
            replicas_of[_key_of(deployment)].append(deployment)
        now, found = timezone.now(), {}
        for obj in jobs + deployments:
            labels, meta = _labels(obj), obj.get("metadata") or {}
            uid = labels.get(m.LABEL_ATTEMPT_UID)
            if not uid or labels.get(m.LABEL_INSTALLATION) != mine or uid in found:
                continue
            try:
                record = json.loads((meta.get("annotations") or {}).get(m.RECORD_ANNOTATION) or "{}")
            except ValueError:
                record = {}
            attempt_pods, name = pods_of.get(uid, []), meta.get("name", "")
            if obj.get("kind") == "Deployment":  # a serving attempt is all its replicas' Deployments
                obs = observe_inference(replicas_of[uid], attempt_pods, now, float("inf"))
                name = name if m.LABEL_REPLICA not in labels else name.removesuffix(f"-{labels[m.LABEL_REPLICA]}")
            elif m.LABEL_ROLE in labels:  # one of a multi-role attempt's Jobs: the attempt is all of them
                obs = observe_multi_role(role_jobs[uid], attempt_pods, role_shapes(record.get("placement")), now,
                                         float("inf"))
                name = labels.get(JOBSET_NAME_LABEL) or name.removesuffix(f"-{labels[m.LABEL_ROLE]}")
            else:
                obs = observe_training(obj, attempt_pods, int(record.get("nodes") or 1), now, float("inf"))
            found[uid] = {"uid": uid, "record": record, "name": name, "namespace": meta.get("namespace", ""),
                          "created_at": obs.created_at or created_at(obj, attempt_pods), "observation": obs}
        for uid, end in ends.items():
            if uid in found:
                continue
            data = end.get("data") or {}
            try:
                record = json.loads(data.get("dispatch_record") or "{}")
            except ValueError:
                record = {}
            meta = end.get("metadata") or {}
            name = meta.get("name", "")[len(m.END_RECORD_PREFIX):]
            found[uid] = {"uid": uid, "record": record, "name": name, "namespace": meta.get("namespace", ""),
                          "created_at": _parse_time(data.get("started_at")), "observation": end_observation(data)}
        return list(found.values())

    def logs(self, attempt, node: int = 0, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of the ``main`` container of node ``node``'s pod ("" when it has no pod yet).

        Node = the pod's completion index (training) or its position by name (inference replicas).
        """
        c = client_for(attempt.cluster)
        namespace = team_namespace(attempt.job.team.slug)
        pod = pod_of_node(self._pods(c, namespace, attempt_key(attempt)), node, _layout(attempt))
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


    def workload_exposition(self, attempt, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> str | None:
        """The body of node 0's pod's ``/metrics`` on the port dispatch declared (``runner_state["metrics_port"]``),
        read through the API server's pod proxy (``GET /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics``,
        the client's ``connect_get_namespaced_pod_proxy_with_path``), so the platform needs no route to pod IPs:
        the same credentials as every other call. None (a failed observation, never an error) when the attempt
        declared no port, has no pod yet or its pod is not Running (not asked), the pod does not answer (the API
        server's 503 for a pod it cannot reach), the workload answers anything but 200, or the cluster does not
        answer within ``timeout`` seconds of reading. Two calls: the attempt's pods by label, then the proxy."""
        port = int((attempt.runner_state or {}).get("metrics_port") or 0)
        if not port:
            return None
        c = client_for(attempt.cluster)
        namespace = team_namespace(attempt.job.team.slug)
        try:
            pod = pod_of_node(self._pods(c, namespace, attempt_key(attempt)), 0)
            if pod is None or (pod.get("status") or {}).get("phase") != "Running":
                return None  # none yet, or its containers ended (the pod proxy would answer 503): not asked
            answer = c.call(c.core.connect_get_namespaced_pod_proxy_with_path, f"{pod['metadata']['name']}:{port}",
                            namespace, m.METRICS_PATH.lstrip("/"), _preload_content=False,
                            _request_timeout=(c.timeouts[0], min(timeout, c.timeouts[1])))
            if answer.status != 200:
                return None
            return answer.data.decode("utf-8", "replace")
        except (ApiError, ClusterUnreachable, urllib3.exceptions.HTTPError, OSError) as exc:
            log.info("workload metrics of %s not scraped: %s", attempt.object_name, exc)
            return None

    def endpoint_load(self, attempt, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> str | None:
        """The exposition of serving ``attempt``'s endpoint counters (``Backend.endpoint_load``): each ready replica's
        server counters (``serving_load``: ``GET /metrics`` on its serving port, ``spec.port``) read through the
        API server's pod proxy as ``workload_exposition`` reads a training pod's, and summed
        (``serving_load.endpoint_exposition``). Ready: Running, its Ready condition True, not being deleted (the
        pods the Service sends requests to). Bounded: one LIST of the attempt's pods, then one proxy call per
        ready replica within the client's connect timeout and ``timeout`` seconds of reading. A replica that does
        not answer, answers anything but 200, or reports no counters is left out of the sum and logged (the
        exposition's ``controlplane_endpoint_ready_replicas`` counts those read, ``..._replicas`` those asked).
        None when the attempt is not a serving one, no replica is ready, none answered or the cluster does not
        answer."""
        if attempt.job.kind != "inference":
            return None
        c = client_for(attempt.cluster)
        namespace = team_namespace(attempt.job.team.slug)
        port = int((attempt.job.spec or {}).get("port") or 8000)
        try:
            pods = [p for p in self._pods(c, namespace, attempt_key(attempt)) if _serves(p)]
        except ClusterUnreachable as exc:
            log.info("endpoint load of %s not read: %s", attempt.object_name, exc)
            return None
        read, missed = [], []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            name = pod["metadata"]["name"]
            try:
                answer = c.call(c.core.connect_get_namespaced_pod_proxy_with_path, f"{name}:{port}", namespace,
                                m.METRICS_PATH.lstrip("/"), _preload_content=False,
                                _request_timeout=(c.timeouts[0], min(timeout, c.timeouts[1])))
                counters = (parse_server_counters(answer.data.decode("utf-8", "replace"), name)
                            if answer.status == 200 else None)
            except (ApiError, ClusterUnreachable, urllib3.exceptions.HTTPError, OSError) as exc:
                counters = None
                log.info("replica pod %s of %s did not answer for its counters: %s", name, attempt.object_name, exc)
            if counters is None:
                missed.append(name)
            else:
                read.append(counters)
        if missed:
            log.warning("endpoint load of %s: %d of %d ready replicas left out of the sum (no counters): %s",
                        attempt.object_name, len(missed), len(pods), ", ".join(missed))
        return endpoint_exposition(read, len(pods))

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
        pod = pod_of_node(self._pods(c, namespace, attempt_key(attempt)), node, _layout(attempt))  # ClusterUnreachable here is the caller's 503
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
                pod = pod_of_node(self._pods(c, namespace, attempt_key(attempt)), node, _layout(attempt))
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
            pods = self._pods(client_for(attempt.cluster), team_namespace(attempt.job.team.slug), attempt_key(attempt))
        except ClusterUnreachable:
            return False
        return bool(pods) and all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods)


def _move_end_record(c: ClusterClient, record: dict, ended: dt.datetime) -> bool | None:
    """PUT ``record`` (an end record as read, with its ``metadata.resourceVersion``) with ``ended_at`` =
    ``ended``, when it says earlier: True when it moved, False when it needed no move or is gone (404), None
    when it was written meanwhile (409 Conflict: read it again). The PUT carries the read resourceVersion, so it
    is a compare-and-set. Raises ClusterUnreachable for any other failure."""
    data = dict(record.get("data") or {})
    recorded = _parse_time(data.get("ended_at"))
    if recorded is not None and recorded >= ended:
        return False
    meta = record.get("metadata") or {}
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    data["ended_at"] = ended.isoformat()
    path = f"{_COLLECTIONS['ConfigMap'].format(namespace=quote(namespace, safe=''))}/{quote(name, safe='')}"
    try:
        c.replace(path, {**record, "data": data})
    except ApiError as exc:
        if exc.status == 409:
            return None
        if exc.status == 404:
            return False
        raise ClusterUnreachable(f"updating the end record {namespace}/{name}: {exc}") from exc
    return True


def end_observation(data: dict) -> Observation:
    """The ``ended`` Observation of an end record's ``data`` (``write_end_record``): its reason, exit code,
    start and end, and the record itself."""
    code = data.get("exit_code")
    return Observation("ended", data.get("end_reason") or "", int(code) if str(code or "").lstrip("-").isdigit()
                       else None, f"ended {data.get('ended_at') or '?'} ({data.get('end_reason') or '?'}), "
                                  f"as the cluster's end record says", created_at=_parse_time(data.get("started_at")),
                       ended_at=_parse_time(data.get("ended_at")), record=dict(data))


def _check_pods_listed(owners: list[dict], pods: list[dict]) -> None:
    """Raise ClusterUnreachable when the Pod LIST lacks every pod of a Job or Deployment whose own status counts
    pods (``status.active``, ``status.replicas``): an empty or cut answer, not evidence that the pods are gone
    (their absence would read as pods deleted, and leave running pods unbilled)."""
    listed = {_key_of(p) for p in pods}
    for owner in owners:
        status = owner.get("status") or {}
        counted = status.get("active") if owner.get("kind") == "Job" else status.get("replicas")
        if isinstance(counted, int) and counted > 0 and _key_of(owner) not in listed:
            name = (owner.get("metadata") or {}).get("name", "?")
            raise ClusterUnreachable(f"the Pod LIST lacks the {counted} pod(s) {owner.get('kind')} {name} counts: "
                                     f"an incomplete answer")


def _owned(objects: list[dict], pods: list[dict]) -> dict[str | int, Owned]:
    """Attempt keys (``attempt_key``) labelled on the listed objects or on pods left without them, with whether
    their pods hold GPUs, their creation time and, when they hold none, when they stopped."""
    pods_of: dict[str | int | None, list[dict]] = defaultdict(list)
    for pod in pods:
        pods_of[_key_of(pod)].append(pod)
    owned: dict[str | int, Owned] = {}
    for obj in objects:
        attempt_id = _key_of(obj)
        if attempt_id is None:
            continue
        # A Service holds no GPU: the creation that counts is its Job's or Deployment's (or its pods').
        made = created_at(None if obj.get("kind") == "Service" else obj, pods_of.get(attempt_id, []))
        before = owned.get(attempt_id)
        if before is not None and before.created_at is not None and (made is None or before.created_at < made):
            made = before.created_at
        holding = _holding(pods_of.get(attempt_id, []))
        stopped = None if holding or obj.get("kind") == "Service" else stopped_at(obj, pods_of.get(attempt_id, []))
        if before is not None and before.stopped_at is not None and (stopped is None or before.stopped_at > stopped):
            stopped = before.stopped_at
        owned[attempt_id] = Owned(holding, made, stopped)
    # Pods whose owner is gone already (deleted, the garbage collector not yet through its dependents): the cluster
    # still holds them, and while they run their GPUs.
    for attempt_id, left in pods_of.items():
        if attempt_id is not None and attempt_id not in owned:
            holding = _holding(left)
            owned[attempt_id] = Owned(holding, created_at(None, left), None if holding else stopped_at(None, left))
    return owned


def _layout(attempt) -> list[tuple[str, int, bool]] | None:
    """The roles of a multi-role ``attempt`` (``role_shapes``), None for an attempt of one role."""
    return role_shapes(attempt.placement) if attempt.job.kind == MULTI_ROLE else None


def pod_of_node(pods: list[dict], node: int, roles: list[tuple[str, int]] | None = None) -> dict | None:
    """The pod whose completion index annotation is ``node``; without indexes, the ``node``-th pod by name. With
    ``roles`` (a multi-role attempt's ``role_shapes``) nodes are numbered over the roles in name order, as
    the local runner numbers them: node ``n`` is the pod of the role it falls in, at its index within that role."""
    if roles is not None:
        first = 0
        for name, count in roles:
            if node < first + count:
                return pod_of_node([p for p in pods if _labels(p).get(m.LABEL_ROLE) == name], node - first)
            first += count
        return None
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


def _parse(answer, what: str):
    """The JSON of a raw answer; ClusterUnreachable for a body cut short or not JSON (a malformed answer)."""
    try:
        data = answer.data if hasattr(answer, "data") else answer
        return json.loads(data or b"")
    except (ValueError, TypeError, urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterUnreachable(f"{what}: malformed answer: {exc}") from exc


def _parse_or_none(answer) -> dict | None:
    """The JSON object of a raw answer whose body is only informative (a DELETE's); None when it is not one."""
    try:
        body = _parse(answer, "")
    except ClusterUnreachable:
        return None
    return body if isinstance(body, dict) else None


def _object(answer, name: str, what: str) -> dict:
    """The object ``name`` of a GET's raw answer; ClusterUnreachable for a body that is not that object."""
    obj = _parse(answer, what)
    if not isinstance(obj, dict) or (obj.get("metadata") or {}).get("name") != name:
        raise ClusterUnreachable(f"{what}: the answer is not that object")
    return obj


def _too_large(code, message) -> bool:
    """Whether an error is the API server's "Too large resource version" (504, a version newer than it has: the
    cluster behind the endpoint was rebuilt, or the version came from elsewhere): only a full LIST helps."""
    return code == 504 and "too large resource version" in str(message or "").lower()


def _list_items(answer, what: str, versions: dict[str, str] | None = None, kind: str = "") -> list[dict]:
    """The ``items`` of a LIST answer; ClusterUnreachable unless the body is an object with a list of objects.
    With ``versions``: the list's ``metadata.resourceVersion`` (a non-empty string) is stored under ``kind``."""
    body = _parse(answer, what)
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ClusterUnreachable(f"{what}: the answer is not a list of objects")
    if versions is not None:
        version = (body.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str) and version:
            versions[kind] = version
    return items


register(KubernetesBackend())
