"""Node health: GPU errors from DCGM in Prometheus, Kubernetes node conditions and the attempts that ended on a node
by its fault, judged into healthy, suspect or unhealthy with the evidence; unhealthy nodes lose their running work.

Admission keeps off unhealthy and staff-cordoned nodes (``jobs.scheduling.offers``
passes both to the scheduling core as nodes that take no work); a suspect node
is shown with its evidence and still takes work and counts as capacity (one
application-level fault or one lost attempt is not enough to take capacity
away), but admission keeps away from it while it can: the packing policies try
it after every other node of its pool (``NodeRoom.suspect``), so a job lands
on it only when the pool's healthy nodes cannot hold the job, and between
pools of one price the one needing fewer suspect nodes wins.

Signals (``docs/reference/gpu-health.md``, from NVIDIA's XID documentation and
dcgm-exporter's fields; ``docs/reference/metrics.md`` for the labels):

* ``DCGM_FI_DEV_XID_ERRORS`` is the last XID code seen on a GPU (0: none),
  not a count. XIDs 48 (double-bit ECC), 63/64 (row remapping), 74 (NVLink),
  79 (fallen off the bus), 94/95 (contained/uncontained ECC) point at the
  hardware: unhealthy. 13, 31 and 43 are usually the application's fault: not
  evidence against the node. Any other XID: suspect.
* ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` (a row could not be remapped) and
  ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` (double-bit ECC errors since the driver
  loaded) above zero: unhealthy.
* A Kubernetes node condition other than Ready with status True
  (node-problem-detector's convention): suspect. Not Ready, cordoned and
  tainted nodes are already kept out by the node sync (``schedulable``).
* Attempts that ended on the node by its fault (``jobs.models.NODE_FAULT_END_REASONS``)
  within ``NODE_HEALTH_HISTORY_SECONDS``: ``NODE_HEALTH_UNHEALTHY_AFTER_FAILURES``
  of them make it unhealthy, fewer suspect.

A GPU's series carry the node's name in ``Hostname`` (dcgm-exporter's label;
``hostname`` where the cluster's label shape says so, ``costs.models.ClusterMetrics``).
The node, not the GPU, is the unit: the device plugin, not the platform,
chooses which of a node's GPUs a pod gets. Staff clearing a node records the
values seen then (``Node.health_baseline``): a gauge that still shows the same
code, a counter that did not grow, a condition with the same reason and the
attempts ended before no longer count. A Prometheus that does not answer is a
failed observation: the node keeps its DCGM evidence until it answers again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from costs import prometheus
from costs.models import ClusterMetrics
from jobs.lifecycle import preempt_attempt
from jobs.models import NODE_FAULT_END_REASONS, Job, JobAttempt, JobState
from jobs.states import InvalidTransition, StaleState
from quotas import audit

from .base import each_cluster
from .credentials import CredentialUnreadable
from .models import Cluster, Node, cut_node_span

log = logging.getLogger(__name__)

XID = "DCGM_FI_DEV_XID_ERRORS"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
ECC_DBE_VOLATILE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
#: XIDs that point at the hardware, with NVIDIA's meaning (NVIDIA XID documentation; docs/reference/gpu-health.md).
HARDWARE_XIDS = {48: "double-bit ECC error", 63: "row remapping event", 64: "row remapping failure",
                 74: "NVLink error", 79: "GPU has fallen off the bus", 94: "contained ECC error",
                 95: "uncontained ECC error"}
#: XIDs that are usually the application's fault: not evidence against the node.
APPLICATION_XIDS = frozenset({13, 31, 43})
HEALTHY, SUSPECT, UNHEALTHY = Node.Health.HEALTHY, Node.Health.SUSPECT, Node.Health.UNHEALTHY
_RANK = {HEALTHY: 0, SUSPECT: 1, UNHEALTHY: 2}
#: Job states whose attempt holds a node: recovered when the node turns unhealthy.
LIVE_STATES = (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING)


@dataclasses.dataclass(frozen=True)
class GpuReading:
    """One nonzero DCGM health value of one GPU: ``signal`` (``xid``, ``row_remap_failure``, ``ecc_dbe``), the
    node's name, the GPU's index and UUID, and the value (an XID code, a count)."""

    signal: str
    node: str
    gpu: str
    uuid: str
    value: float

    @property
    def key(self) -> str:
        """What identifies the reading across passes (for the baseline staff clear to)."""
        return f"dcgm:{self.signal}:{self.uuid or self.gpu}"


# --- judging (pure) ---------------------------------------------------------------------------------------------

def finding(source: str, signal: str, severity: str, message: str, *, key: str = "", value=None, **extra) -> dict:
    """One piece of evidence as stored in ``Node.health_evidence``: where it came from (``dcgm``, ``kubernetes``,
    ``history``), what (``signal``), its severity (``suspect`` or ``unhealthy``), a sentence, and the value."""
    return {"source": source, "signal": signal, "severity": severity, "message": message, "key": key,
            "value": value, **extra}


def gpu_finding(r: GpuReading) -> dict | None:
    """The evidence of one DCGM reading, or None when it is no evidence against the node (an application XID)."""
    where = f"GPU {r.gpu}" + (f" ({r.uuid})" if r.uuid else "")
    if r.signal == "xid":
        code = int(r.value)
        if code in APPLICATION_XIDS or code == 0:
            return None
        severity = UNHEALTHY if code in HARDWARE_XIDS else SUSPECT
        meaning = HARDWARE_XIDS.get(code, "not a known hardware XID")
        return finding("dcgm", "xid", severity, f"{where}: XID {code} ({meaning})", key=r.key, value=code,
                       gpu=r.gpu, uuid=r.uuid)
    words = {"row_remap_failure": "row remapping failed", "ecc_dbe": "double-bit ECC errors"}[r.signal]
    return finding("dcgm", r.signal, UNHEALTHY, f"{where}: {words} ({r.value:g})", key=r.key, value=r.value,
                   gpu=r.gpu, uuid=r.uuid)


def cleared(item: dict, baseline: dict) -> bool:
    """Whether staff cleared ``item`` already: the same XID code or condition reason, or a count not above the
    one seen at the clear."""
    if item["key"] not in baseline:
        return False
    before = baseline[item["key"]]
    if item["signal"] in ("xid", "condition"):
        return item["value"] == before
    return float(item["value"]) <= float(before)


def judge(findings: list[dict]) -> str:
    """The node's health from its evidence: the worst severity, ``healthy`` without any."""
    return max((f["severity"] for f in findings), key=_RANK.__getitem__, default=HEALTHY)


def condition_findings(conditions: list[dict]) -> list[dict]:
    """Suspect evidence from the node's problem conditions (``Node.problem_conditions``)."""
    return [finding("kubernetes", "condition", SUSPECT,
                    f"condition {c['type']} is True" + (f": {c['reason']}" if c.get("reason") else "")
                    + (f" ({c['message']})" if c.get("message") else ""),
                    key=f"condition:{c['type']}", value=c.get("reason", ""))
            for c in conditions]


def history_finding(failures: list[tuple[str, str, dt.datetime]], threshold: int, window_s: float) -> list[dict]:
    """The evidence of attempts that ended on the node by its fault: ``(object name, end reason, ended at)`` each;
    ``threshold`` or more make it unhealthy, fewer suspect; none: no evidence."""
    if not failures:
        return []
    names = ", ".join(f"{name} ({reason})" for name, reason, _ in sorted(failures, key=lambda f: f[2]))
    severity = UNHEALTHY if len(failures) >= threshold else SUSPECT
    return [finding("history", "infrastructure_failures", severity,
                    f"{len(failures)} attempt{'s' if len(failures) != 1 else ''} ended on it by its fault in the "
                    f"last {window_s / 3600:g} h: {names}", key="history", value=len(failures))]


# --- reading ---------------------------------------------------------------------------------------------------

def _host_label(cluster: Cluster) -> str:
    row = ClusterMetrics.objects.filter(cluster=cluster).first()
    return row.host_label if row is not None and row.host_label else "Hostname"


def read_gpu_health(source: prometheus.Source, host_label: str, at: dt.datetime, lookback: dt.timedelta, *,
                    client=None) -> list[GpuReading]:
    """The nonzero DCGM health values of ``source``'s cluster at ``at`` (the last sample within ``lookback``):
    one instant query for the three signals. Raises what ``prometheus_api_client`` raises (the caller keeps what
    it knew)."""
    client = client or source.client()
    r = prometheus.duration(lookback)
    matcher = source.cluster_matcher.lstrip(",")
    parts = [f'label_replace(last_over_time({metric}{{{matcher}}}[{r}]) > 0, "signal", "{signal}", "", "")'
             for metric, signal in ((XID, "xid"), (ROW_REMAP_FAILURE, "row_remap_failure"),
                                    (ECC_DBE_VOLATILE, "ecc_dbe"))]
    rows = client.custom_query(" or ".join(parts), params={"time": at.timestamp()})
    return [GpuReading(row["metric"]["signal"], row["metric"].get(host_label, ""), row["metric"].get("gpu", ""),
                       row["metric"].get("UUID", ""), float(row["value"][1]))
            for row in rows if row["metric"].get(host_label)]


def node_failures(cluster: Cluster, nodes: list[Node], now: dt.datetime,
                  window: dt.timedelta) -> dict[str, list[tuple[str, str, dt.datetime]]]:
    """By node name, the attempts of ``cluster`` that ended by that node's fault within ``window`` of ``now`` and
    after the node was last cleared: ``(object name, end reason, ended at)``."""
    since = {n.name: max(now - window, n.health_cleared_at or now - window) for n in nodes}
    out: dict[str, list] = {n.name: [] for n in nodes}
    rows = (JobAttempt.objects.filter(cluster=cluster, end_reason__in=NODE_FAULT_END_REASONS,
                                      ended_at__gt=now - window).exclude(bad_nodes=[])
            .values_list("object_name", "end_reason", "ended_at", "bad_nodes"))
    for name, reason, ended, bad in rows:
        for node in bad or []:
            if node in out and ended > since[node]:
                out[node].append((name, reason, ended))
    return out


# --- the pass ----------------------------------------------------------------------------------------------------

def check_cluster(cluster: Cluster, now: dt.datetime | None = None, client=None) -> dict:
    """Judge every Node of ``cluster`` now, store its health and evidence, and recover the live attempts on the
    nodes that are unhealthy. Returns ``{"cluster", "nodes", "suspect", "unhealthy", "recovered", "dcgm"}``
    (``dcgm``: ``read``, ``none`` without a Prometheus, or the error of a failed read)."""
    now = now or timezone.now()
    nodes = list(Node.objects.filter(cluster=cluster).select_related("cluster").order_by("name"))
    result = {"cluster": cluster.name, "nodes": len(nodes), "suspect": 0, "unhealthy": 0, "recovered": 0,
              "dcgm": "none"}
    if not nodes:
        return result
    readings: list[GpuReading] | None = []
    try:  # its Prometheus basic auth may not decrypt (CredentialUnreadable): DCGM unread, the nodes still judged
        source = prometheus.source_for(cluster)
    except CredentialUnreadable as exc:
        log.warning("cluster %s: DCGM health not read: Prometheus %s", cluster.name, exc)
        source, readings, result["dcgm"] = None, None, f"Prometheus {exc}"[:200]
    if source is not None:
        lookback = dt.timedelta(seconds=settings.NODE_HEALTH_LOOKBACK_SECONDS)
        try:
            readings = read_gpu_health(source, _host_label(cluster), now, lookback, client=client)
            result["dcgm"] = "read"
        except SoftTimeLimitExceeded:  # the task's time is up: judge no node without its readings
            raise
        except Exception as exc:  # noqa: BLE001 (a failed observation: keep the DCGM evidence known)
            log.warning("cluster %s: DCGM health not read: %s", cluster.name, exc)
            readings, result["dcgm"] = None, str(exc)[:200]
    window = dt.timedelta(seconds=settings.NODE_HEALTH_HISTORY_SECONDS)
    failures = node_failures(cluster, nodes, now, window)
    by_node: dict[str, list[GpuReading]] = {}
    for r in readings or []:
        by_node.setdefault(r.node, []).append(r)
    for node in nodes:
        if readings is None:
            gpu = [f for f in node.health_evidence if f.get("source") == "dcgm"]
        else:
            gpu = [f for r in sorted(by_node.get(node.name, []), key=lambda r: (r.gpu, r.signal))
                   if (f := gpu_finding(r)) is not None]
        evidence = [f for f in gpu + condition_findings(node.problem_conditions)
                    if not cleared(f, node.health_baseline)]
        evidence += history_finding(failures[node.name], settings.NODE_HEALTH_UNHEALTHY_AFTER_FAILURES,
                                    window.total_seconds())
        store_health(node, judge(evidence), evidence, now)
        if node.health != HEALTHY:
            result[node.health] += 1
        if node.health == UNHEALTHY:
            result["recovered"] += recover_attempts_on(node)
    Node.objects.filter(cluster=cluster).update(health_checked_at=now)  # one write for the nodes that did not change
    return result


def store_health(node: Node, health: str, evidence: list[dict], now: dt.datetime) -> bool:
    """Write ``node``'s judged health and evidence when either differs from what is stored (a steady fleet writes
    nothing); ``health_changed_at`` moves only when the health does (a conditional update on the health read, so
    two passes agree on when it changed). Returns True on a change of health."""
    changed = health != node.health
    if not changed and evidence == node.health_evidence:
        return False
    fields = {"health_evidence": evidence, "health_checked_at": now}
    if changed:
        fields.update(health=health, health_changed_at=now)
        if Node.objects.filter(pk=node.pk, health=node.health).update(**fields):
            log.info("node %s: %s -> %s: %s", node, node.health, health, "; ".join(f["message"] for f in evidence))
        else:
            node.refresh_from_db()
            return False
    else:
        Node.objects.filter(pk=node.pk).update(**fields)
    for key, value in fields.items():
        setattr(node, key, value)
    return changed


def recover_attempts_on(node: Node, drained_by: str = "") -> int:
    """End the live attempts placed on ``node`` (``NodeUnhealthy``, no retry used; ``Preempted`` when staff drain
    it, ``drained_by`` naming who and why) and send their jobs back to admission, whose placement keeps off the
    node; their objects are deleted. Returns how many."""
    why = "; ".join(f["message"] for f in node.health_evidence if f["severity"] == UNHEALTHY)
    end_reason = JobAttempt.EndReason.PREEMPTED if drained_by else JobAttempt.EndReason.NODE_UNHEALTHY
    done = 0
    live = (JobAttempt.objects.filter(cluster_id=node.cluster_id, ended_at__isnull=True,
                                      job__current_attempt_id=F("pk"), job__state__in=LIVE_STATES)
            .select_related("job").order_by("pk"))
    for attempt in live:
        if node.name not in ((attempt.placement or {}).get("nodes") or []):
            continue
        job = Job.objects.get(pk=attempt.job_id)
        try:
            with transaction.atomic():
                cause = (f"Preempted: node {node.name} of {node.cluster.name} drained {drained_by}" if drained_by
                         else f"NodeUnhealthy: node {node.name} of {node.cluster.name} is unhealthy ({why})")
                preempt_attempt(job, attempt, end_reason=end_reason, bad_nodes=(node.name,),
                                reason=(f"{cause}: attempt {attempt.number} stopped and placed again elsewhere, "
                                        "no retry used")[:500])
        except (StaleState, InvalidTransition):
            continue  # the job moved on meanwhile: its new state is the winner's
        done += 1
    return done


def check_all() -> list[dict]:
    """``check_cluster`` over every cluster with nodes, one by one; a cluster whose check fails in any way gives an
    ``error`` result and the others are checked (``each_cluster``)."""
    return each_cluster(Cluster.objects.filter(gpu_nodes__isnull=False).distinct().order_by("name"), check_cluster,
                        "node health check")


# --- staff -------------------------------------------------------------------------------------------------------

def _audited(node: Node, user, action: str, reason: str, **values) -> Node:
    """Write ``values`` on ``node`` and append the audit record of ``action`` by ``user`` with ``reason``, in one
    transaction (ADR 0031); ``node`` refreshed. A change of the staff cordon cuts the node inventory there
    (``runners.models.cut_node_span``): cordoned capacity counts from that instant."""
    with transaction.atomic():
        before = audit.snapshot(Node.objects.select_for_update().get(pk=node.pk))
        Node.objects.filter(pk=node.pk).update(**values)
        node.refresh_from_db()
        if before["cordoned"] != node.cordoned:
            cut_node_span(node, timezone.now())
        audit.record(user, action, node, before, audit.snapshot(node), reason)
    return node


def cordon(node: Node, user, note: str = "", *, action: str = "cordoned") -> Node:
    """Cordon ``node`` in the platform (admission keeps off it; Kubernetes is not touched), noting who and why
    (``note``, also the audit record's reason); ``action``: the audit record's (``drained`` for ``drain``)."""
    who = getattr(user, "username", "") or "staff"
    return _audited(node, user, action, note, cordoned=True, cordon_note=f"by {who}: {note}".strip()[:500])


def drain(node: Node, user, note: str = "") -> tuple[Node, int]:
    """Cordon ``node`` (``cordon``) and move the work placed on it elsewhere: its live attempts end as
    ``Preempted`` (no retry used) and their jobs go back to admission, which keeps off the node. Returns the node
    and how many attempts were moved. The audit record says ``drained``, so the trail tells a drain from a cordon."""
    node = cordon(node, user, note, action="drained")
    who = getattr(user, "username", "") or "staff"
    return node, recover_attempts_on(node, drained_by=f"by {who}" + (f" ({note})" if note else ""))


def uncordon(node: Node, user=None, reason: str = "") -> Node:
    """Let admission use ``node`` again (a staff cordon lifted by ``user``, for ``reason``)."""
    return _audited(node, user, "uncordoned", reason, cordoned=False, cordon_note="")


def clear(node: Node, now: dt.datetime | None = None, user=None, reason: str = "") -> Node:
    """Clear ``node``'s health (by ``user``, for ``reason``: audited): healthy, the values of its evidence kept as
    the baseline (the same XID code, a count not above it, the same condition reason, and the attempts ended
    before now no longer count)."""
    now = now or timezone.now()
    baseline = {**node.health_baseline, **{f["key"]: f["value"] for f in node.health_evidence
                                           if f.get("key") and f["source"] in ("dcgm", "kubernetes")}}
    return _audited(node, user, "cleared", reason, health=HEALTHY, health_evidence=[], health_baseline=baseline,
                    health_cleared_at=now, health_changed_at=now)
