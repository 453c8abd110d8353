"""The contract every cluster backend implements, and the registry that picks one per cluster.

A backend turns an attempt into objects on its cluster (processes for
``local``, Kubernetes objects for ``kubernetes``), reports what it sees in one
call per cluster, and deletes what it owns. Backends never change job states:
``jobs.reconcile`` does, from their observations.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

log = logging.getLogger(__name__)

#: Seconds to wait for a workload's ``/metrics`` (``Backend.workload_exposition``).
SCRAPE_TIMEOUT_SECONDS = 2.0


class DispatchError(Exception):
    """Creating an attempt's objects failed."""


class TransientDispatchError(DispatchError):
    """A failure worth retrying with backoff: timeout, connection refused, HTTP 429 or 5xx."""


class PermanentDispatchError(DispatchError):
    """A failure that a retry would repeat (HTTP 403, 422, a bad command); fails the attempt."""


class UnknownBackend(LookupError):
    """No backend is registered under the cluster's ``backend`` name (e.g. kubernetes before its runner exists)."""


class ClusterUnreachable(Exception):
    """A failed observation of the cluster: no answer, a timeout, an error status (404, 410, 429, 5xx) or a
    malformed body. Never evidence that objects are gone: callers count it against the cluster's health."""


class InvalidCredentials(ClusterUnreachable):
    """The cluster's stored credentials cannot be used (a kubeconfig the client refuses, a key that does not
    decrypt them): the cluster cannot be reached until staff set new ones; the message says why."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a backend sees of one attempt.

    ``phase`` is one of ``pending`` (objects exist, not all nodes run),
    ``running``, ``succeeded``, ``failed`` (``end_reason`` and ``exit_code``
    say why), ``lost`` (a pod was evicted or deleted, or its node went away:
    the attempt should be recovered; ``end_reason`` names the cause),
    ``unschedulable`` (a pod found no node with room for longer than the
    grace period: the attempt gives its quota and nodes back and the job
    returns to the queue) and
    ``absent`` (the kind is served and the attempt's own object answered 404
    on this look: one piece of evidence, which reconcile confirms by a second
    look before it acts).

    ``created_at``: when the attempt's objects came into existence (the
    earliest creationTimestamp the cluster reports; billing starts there).
    ``ended_at``: for a final phase, when the attempt's pods stopped holding
    their GPUs (their containers' finishedAt, a DisruptionTarget's or the
    Job's final condition's transition time); None when the cluster does not
    tell (the caller uses the time it saw it).
    ``nodes``: for ``lost`` and ``failed``, the nodes the lost or failed pods
    ran on, when the cluster says (a recovery caused by a bad node names it).

    ``ended`` (ADR 0011): the objects are gone and the cluster holds the
    attempt's end record, written before the platform deleted them;
    ``record`` is that record (``job_state``, ``end_reason``, ``ended_at``...),
    ``ended_at`` its end. A restored database learns from it how the attempt
    ended instead of restarting it.

    ``lost_replicas`` (a serving attempt on a backend that ``replaces_replicas``): the replicas that died while
    the others serve (crashed, killed, evicted, their supervisor lost); the phase is then the survivors' (``pending``
    when none survives). Reconcile replaces each within the job's retry budget (``Backend.replace_replica``) or
    ends the attempt with the replica's own failure (``jobs.replica_loss``).
    """

    phase: str
    end_reason: str = ""
    exit_code: int | None = None
    message: str = ""
    created_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    nodes: tuple[str, ...] = ()
    record: dict | None = None
    lost_replicas: tuple[LostReplica, ...] = ()


@dataclasses.dataclass(frozen=True)
class LostReplica:
    """One replica of a serving attempt that died while the others serve. ``key``: the backend's name for the
    replica (what ``Backend.replace_replica`` takes; the local runner's: its pods' node indexes, ``"3"`` or
    ``"3,4"``); ``phase`` ``failed`` or ``lost`` with ``end_reason``, ``exit_code`` and ``message`` as an
    ``Observation`` of the attempt would say them had that replica been the attempt. ``nodes``: set only for a
    replica lost with its node (``end_reason`` ``NodeLost``, on a backend that ``pins_replicas``): the booked nodes
    that are gone, so its slot cannot be started again there; reconcile records the loss and the serving pass
    releases the slot and admits a replacement elsewhere (``jobs.replica_loss``, ``serving.replicas``)."""

    key: str
    phase: str
    end_reason: str
    exit_code: int | None = None
    message: str = ""
    nodes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Owned:
    """What a cluster holds of one attempt (for orphan cleanup): ``holding`` when a pod of it still holds its
    GPUs (not Succeeded/Failed), ``created_at`` the earliest creation time of its objects, ``stopped_at`` when its
    pods stopped holding GPUs as the cluster reports it (None: unknown, or still holding)."""

    holding: bool = True
    created_at: dt.datetime | None = None
    stopped_at: dt.datetime | None = None


ABSENT = Observation("absent")


def attempt_key(attempt) -> str | int:
    """What the cluster's objects of ``attempt`` (a ``jobs.JobAttempt``) are matched by: its uid (a string),
    or its id for an attempt made before uids (``legacy_name``), whose objects carry no uid label. The keys of
    ``owned_attempt_ids`` are these."""
    return attempt.pk if attempt.legacy_name else str(attempt.uid)


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """One GPU node as the backend discovers it: allocatable GPUs, CPU (millicores) and memory (MiB); the requests of
    pods on it that the platform does not own (same units); zone and finest topology domain (block, rack or zone;
    "" when unknown); labels; taints (``[{"key", "value", "effect"}]``); cordoned (``unschedulable``); and whether
    the platform's pods may land on it now (``schedulable``); its conditions other than Ready whose status is True
    (``problem_conditions``: ``(type, reason, message)``).

    GPU sharing (ADR 0040, read from GPU feature discovery's labels by ``runners.kubernetes.nodepools``): ``gpus``
    counts physical GPUs, never time-slicing replicas or MIG devices. ``sharing`` is one of ``core.gpus.SHARING_MODES``:
    ``none``, ``time-slicing`` or ``mps`` (each physical GPU advertised as ``gpu_replicas`` slices of
    ``slice_resource``), ``mig-single`` or ``mig-mixed`` (``mig_devices``: ``(profile, count)`` of the MIG devices
    the node offers). ``whole_gpus``: the GPUs a pod can hold alone by asking ``nvidia.com/gpu`` (all of them
    unshared, those without MIG under the mixed strategy, none on a time-sliced or MIG single node).
    ``foreign_gpu_slices`` and ``foreign_mig_devices``: the slices and MIG devices pods the platform does not own
    ask there."""

    name: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    foreign_gpus: int = 0
    foreign_cpu_milli: int = 0
    foreign_memory_mib: int = 0
    zone: str = ""
    topology_domain: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[tuple[str, str, str], ...] = ()
    unschedulable: bool = False
    schedulable: bool = True
    problem_conditions: tuple[tuple[str, str, str], ...] = ()
    sharing: str = "none"
    gpu_replicas: int = 1
    slice_resource: str = ""
    mig_devices: tuple[tuple[str, int], ...] = ()
    whole_gpus: int | None = None
    foreign_gpu_slices: int = 0
    foreign_mig_devices: tuple[tuple[str, int], ...] = ()

    @property
    def exclusive_gpus(self) -> int:
        """``whole_gpus``, or ``gpus`` when the backend does not say (an unshared node: every GPU is whole)."""
        return self.gpus if self.whole_gpus is None else self.whole_gpus


@dataclasses.dataclass(frozen=True)
class PoolCapacity:
    """A node pool as the backend discovers it: accelerator name, capacity type, nodes, GPUs per node.

    ``free_gpus``: GPUs not requested by running pods now, when the backend
    can tell (None: unknown). ``node_list``: its nodes one by one (empty: the
    backend does not report nodes).
    """

    name: str
    accelerator: str
    capacity_type: str
    nodes: int
    gpus_per_node: int
    free_gpus: int | None = None
    node_list: tuple[NodeInfo, ...] = ()


class Backend:
    """Base class of cluster backends; subclasses set ``name`` and implement every method."""

    name: ClassVar[str]

    def discover(self, cluster) -> list[PoolCapacity]:
        """The cluster's GPU node pools as seen now. Raises ClusterUnreachable."""
        raise NotImplementedError

    def dispatch(self, attempt) -> dict:
        """Create ``attempt``'s objects; idempotent (what exists already is kept).

        Returns backend state to store in ``attempt.runner_state``. Raises
        TransientDispatchError or PermanentDispatchError.
        """
        raise NotImplementedError

    def observe(self, cluster, attempts) -> dict[int, Observation]:
        """One look at ``cluster``: an Observation for each attempt in ``attempts`` (keyed by attempt id).

        Raises ClusterUnreachable when the cluster does not answer.
        """
        raise NotImplementedError

    def owned_attempt_ids(self, cluster) -> set[int | str] | dict[int | str, Owned]:
        """Keys (``attempt_key``: uid, or id of an attempt made before uids) of every attempt that has live objects
        on ``cluster`` (to find orphans); a backend that can tell more maps each key to an ``Owned``."""
        raise NotImplementedError

    def inventory(self, cluster) -> list[dict]:
        """Every attempt of this installation the cluster holds objects or an end record of, for a recovery
        after a restore (``jobs.recovery``): ``{"uid", "record" (the dispatch record, {} if none), "end" (the end
        record or None), "created_at", "name", "namespace"}``. Raises ClusterUnreachable. A backend that keeps
        no such records answers ``[]``."""
        return []

    def observe_all(self, cluster, attempts) -> tuple[dict[int, Observation], set | dict]:
        """``(observe(cluster, attempts), owned_attempt_ids(cluster))`` for one reconcile pass.

        Backends that can answer both from the same look at the cluster
        (Kubernetes: one LIST per kind) override it. Raises ClusterUnreachable.
        """
        observations = self.observe(cluster, attempts)
        return observations, self.owned_attempt_ids(cluster)

    def delete(self, attempt) -> bool:
        """Delete ``attempt``'s objects (processes, pods); True once nothing of it is left running."""
        raise NotImplementedError

    def logs(self, attempt, node: int = 0, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of the log of node ``node`` of ``attempt``."""
        raise NotImplementedError

    def record_end(self, attempt) -> bool:
        """Move the end that the cluster keeps of the ended ``attempt`` (its end record, written before its
        objects were deleted) forward to ``attempt.ended_at``, so a database restored from a backup learns the
        end the live one billed; True when it was moved. Never moves a recorded end back. This default (a backend
        that keeps no end records): False. Raises ClusterUnreachable."""
        return False

    def still_holding(self, attempt) -> bool:
        """Whether a pod (process) of the ended ``attempt`` still holds its GPUs: being deleted, its containers
        running out their termination grace. This default: False (the backend stops them at once). Raises
        ClusterUnreachable."""
        return False

    def workload_exposition(self, attempt, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> str | None:
        """The Prometheus exposition rank 0 of ``attempt`` serves on the port the runner declared
        (``jobs.efficiency.protocol``), or None: no port declared, or no 200 answer within ``timeout`` seconds
        (a failed observation, never raised). This default reads ``runner_state["metrics_url"]`` (the local
        runner's ``http://127.0.0.1:<port>/metrics``) directly."""
        url = (attempt.runner_state or {}).get("metrics_url")
        return self.scrape(url, timeout) if url else None

    @staticmethod
    def scrape(url: str, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> str | None:
        """The body of a 200 answer to GET ``url`` (a runner-declared http URL) within ``timeout`` seconds, as
        text; None for any other answer or failure (never raised)."""
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a runner-declared http URL
                return response.read().decode("utf-8", "replace") if response.status == 200 else None
        except (OSError, urllib.error.URLError, ValueError):
            return None

    #: Whether the backend changes a running serving attempt's replicas (``scale``); the autoscaler acts only
    #: where it does.
    scales: ClassVar[bool] = False

    def scale(self, attempt, replicas: int, *, refusal: str = "") -> dict:
        """Make serving ``attempt`` run ``replicas`` replicas (0: a job scaled to zero, whose endpoint holds the
        next request); idempotent; returns its new ``runner_state``. ``refusal``: why the scale-up a held request
        asked for was refused ("" for none), which the endpoint answers held requests with (503).
        Raises TransientDispatchError or PermanentDispatchError; NotImplementedError where ``scales`` is False."""
        raise NotImplementedError

    #: Whether the backend reports a serving attempt's dead replicas apart (``Observation.lost_replicas``) and
    #: starts one again in the same booked slot (``replace_replica``) while the others serve. Where it is False,
    #: a replica that dies ends the attempt.
    replaces_replicas: ClassVar[bool] = False

    def replace_replica(self, attempt, key: str) -> dict:
        """Start a new replica of serving ``attempt`` in place of the lost replica ``key`` (a
        ``LostReplica.key``), on the same booked nodes and GPUs, and take the lost one out of the endpoint;
        idempotent (a key replaced already changes nothing); returns the attempt's new ``runner_state``.
        Raises TransientDispatchError or PermanentDispatchError; NotImplementedError where ``replaces_replicas``
        is False."""
        raise NotImplementedError

    #: Whether the backend moves a running serving attempt to another checkpoint replica by replica (the four
    #: methods below, driven by ``serving.rollout``).
    rolls_out: ClassVar[bool] = False
    #: Whether replica ``i`` of a serving attempt runs on the ``i``-th node of its booking
    #: (``placement["nodes"]``), so that only the last replica may be released: a rollout then keeps its surge
    #: and updates each old replica in its own slot (``serving.rollout``).
    pins_replicas: ClassVar[bool] = False

    def replica_keys(self, attempt) -> list[str]:
        """The keys of serving ``attempt``'s live replicas, oldest first (a ``LostReplica.key`` each)."""
        raise NotImplementedError

    def start_rollout_replica(self, attempt, checkpoint_job_id: int, *, in_place_of: str | None = None) -> str:
        """Start one new replica of serving ``attempt`` loading the checkpoint of training job
        ``checkpoint_job_id``: on capacity the caller booked for it already (a surge), or in the slot of the live
        replica ``in_place_of``, which is retired first. The new replica joins the endpoint once ready; until
        ``settle_rollout_replica`` calls it ready, its death is the rollout's to judge, not a lost replica.
        Returns its key. Raises TransientDispatchError or PermanentDispatchError."""
        raise NotImplementedError

    def settle_rollout_replica(self, attempt, key: str) -> str:
        """Where the new replica ``key`` stands: ``starting``, ``failed`` (it ended) or ``ready`` (its health path
        answered 2xx/3xx; from then on it is an ordinary replica)."""
        raise NotImplementedError

    def retire_replica(self, attempt, key: str) -> dict:
        """Take replica ``key`` of serving ``attempt`` out of the endpoint, then stop it; idempotent; returns the
        attempt's new ``runner_state``. Its end is no end of the attempt."""
        raise NotImplementedError

    def finish_rollout(self, attempt, checkpoint_job_id: int) -> dict:
        """Make replicas started from now on (scale-ups, replacements) load the checkpoint of training job
        ``checkpoint_job_id``; returns the attempt's new ``runner_state``."""
        raise NotImplementedError

    def endpoint_load(self, attempt) -> str | None:
        """The Prometheus exposition of the counters of serving ``attempt``'s endpoint (requests, requests in
        flight and their integral over time, the endpoint's clock: ``runners.local.endpoint``), or None when the
        backend has none or it does not answer. This default: None."""
        return None

    # Phases after which an attempt's log grows no more.
    FINAL_PHASES: ClassVar[frozenset[str]] = frozenset({"succeeded", "failed", "lost", "ended"})
    # Lines re-read on each poll of the default ``follow_logs`` to find what is new.
    FOLLOW_WINDOW_LINES: ClassVar[int] = 2000

    def attempt_finished(self, attempt) -> bool:
        """Whether ``attempt`` ended: in the database, or in the backend's own view (``observe``: a final phase).

        ``attempt`` is a ``jobs.JobAttempt``; its row is read again through the attempt's own model, since this
        module sits below the jobs app and does not import it. An unreachable cluster counts as not finished.
        """
        if type(attempt)._default_manager.filter(pk=attempt.pk, ended_at__isnull=False).exists():
            return True
        try:
            obs = self.observe(attempt.cluster, [attempt]).get(attempt.pk)
        except ClusterUnreachable:
            return False
        return obs is not None and obs.phase in self.FINAL_PHASES

    def follow_logs(self, attempt, node: int = 0, tail_lines: int = 200, *, max_seconds: float | None = None,
                    poll_seconds: float | None = None) -> Iterator[str]:
        """Yield the last ``tail_lines`` lines of node ``node``'s log, then each new complete line as it appears.

        Ends when the attempt ends (after a last read) or after
        ``max_seconds`` (default ``settings.LOG_FOLLOW_MAX_SECONDS``); polls
        ``logs()`` every ``poll_seconds`` (default ``LOG_FOLLOW_POLL_SECONDS``),
        reading a window of ``FOLLOW_WINDOW_LINES`` lines and yielding what
        follows the window read before (see ``overlap``). Backends with a native stream
        override it. Raises ClusterUnreachable only before the first chunk;
        afterwards an unreachable cluster ends the stream.
        """
        from django.conf import settings

        max_seconds = float(settings.LOG_FOLLOW_MAX_SECONDS if max_seconds is None else max_seconds)
        poll = float(settings.LOG_FOLLOW_POLL_SECONDS if poll_seconds is None else poll_seconds)
        deadline = time.monotonic() + max_seconds
        window = max(self.FOLLOW_WINDOW_LINES, tail_lines)
        sent = complete_lines(self.logs(attempt, node, window))  # the window as last seen (complete lines)
        yield "".join(sent[-tail_lines:]) if tail_lines > 0 else ""
        while True:
            finished = self.attempt_finished(attempt)  # checked before reading, so the last read sees every line
            try:
                text = self.logs(attempt, node, window)
            except ClusterUnreachable:
                return
            if finished or time.monotonic() >= deadline:
                lines = text.splitlines(keepends=True)
                new = lines[overlap(sent, lines):]
                if new:
                    yield "".join(new)
                return
            complete = complete_lines(text)
            new = complete[overlap(sent, complete):]
            if new:
                yield "".join(new)
            sent = complete
            time.sleep(min(poll, max(deadline - time.monotonic(), 0)))


def complete_lines(text: str) -> list[str]:
    """The lines of ``text`` that end with a newline (a trailing partial line waits for its end)."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines.pop()
    return lines


def overlap(sent: list[str], now: list[str]) -> int:
    """How many leading lines of ``now`` were already sent: the longest suffix of ``sent`` that is a prefix of ``now``.

    Logs only grow, so the window read before (``sent``) and the one read now
    overlap where the older one ends; with no overlap every line is new.
    """
    for k in range(min(len(sent), len(now)), 0, -1):
        if sent[-k:] == now[:k]:
            return k
    return 0


_BACKENDS: dict[str, Backend] = {}

#: The backends whose runner starts a multi-role job's roles (docs/adr/0039-multi-role-jobs.md): admission places such
#: a job only on their clusters' pools, so a backend added without roles makes such a job wait for a cluster of
#: these, saying so, rather than be dispatched where it cannot run. The local runner starts each role's processes;
#: the Kubernetes runner a headless Service and an Indexed Job per role (``runners.kubernetes.manifests.role_job``).
MULTI_ROLE_BACKENDS = frozenset({"local", "kubernetes"})


def register(backend: Backend) -> Backend:
    """Make ``backend`` serve clusters whose ``backend`` field equals ``backend.name``."""
    _BACKENDS[backend.name] = backend
    return backend


def backend_for(cluster) -> Backend:
    """The backend serving ``cluster``. Raises UnknownBackend for a name no backend registered."""
    try:
        return _BACKENDS[cluster.backend]
    except KeyError:
        raise UnknownBackend(f"cluster {cluster.name}: no backend named {cluster.backend!r} is installed") from None


def each_cluster(clusters: Iterable, work: Callable[[Any], dict], what: str) -> list[dict]:
    """``work(cluster)`` for each of ``clusters`` (Cluster rows), one by one; a list with one dict per cluster.

    Class of failure: one cluster's fault stops every cluster. Invariant: the
    failure domain of a periodic per-cluster pass is one cluster: whatever
    ``work`` raises for one cluster (an unreachable API server, a credential
    that cannot be decrypted or that the cluster refuses, a malformed answer,
    a bug met on one cluster's data) is logged with ``what`` (e.g. "node pool
    sync") and gives ``{"cluster": name, "error": "<type>: <message>"}`` for
    that cluster, and the next cluster is worked on. ``work``'s dict is
    returned as it is. Only the task's own soft time limit
    (``SoftTimeLimitExceeded``) and BaseExceptions stop the loop.
    """
    from celery.exceptions import SoftTimeLimitExceeded

    results = []
    for cluster in clusters:
        try:
            results.append(work(cluster))
        except SoftTimeLimitExceeded:  # the task's time is up: no verdict on this cluster or the rest
            raise
        except Exception as exc:  # noqa: BLE001 - one cluster's fault must not stop the others
            log.exception("cluster %s: %s failed", cluster.name, what)
            results.append({"cluster": cluster.name, "error": f"{type(exc).__name__}: {exc}"})
    return results
