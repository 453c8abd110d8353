"""The ``local`` backend: runs each node of an attempt as a supervised process group on this machine.

Dispatch starts one supervisor per node (``runners.local.launcher``) with
the torchrun environment; reconcile reads the files the supervisors write
under ``<LOCAL_RUNNER_DIR>/<attempt object name>/`` (see
``runners.local.layout``) and checks their pids against ``/proc``. Nothing
depends on the dispatching worker being the parent of the processes, so a
worker restart loses nothing.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings

from core.gpus import gpus_of
from jobs.arrays import element_env
from jobs.models import roles_in_order

from ..base import (
    ABSENT,
    Backend,
    LostReplica,
    Observation,
    PermanentDispatchError,
    PoolCapacity,
    TransientDispatchError,
    attempt_key,
    register,
)
from .layout import ATTEMPT_FILE, STOP_FILE, create_exclusive, node_path, read_json, write_json_atomic
from .procs import (
    ProcessRef,
    ProcInfo,
    boot_id,
    group_members,
    proc_table,
    ref_of,
    signal_group,
    signal_name,
    signal_process,
)
from .serving import DEFAULT_HEALTH_PATH, clear_replicas, endpoint_url, ensure_endpoint, metrics_url, stop_proxy
from .sharing import Share, place_share

log = logging.getLogger(__name__)

# A node claimed by a dispatch that never recorded its supervisor (the worker died in between) counts as
# lost after this many seconds.
LAUNCH_TIMEOUT_SECONDS = 30.0
# Environment variables of the worker that a job's processes inherit; the rest (database URL, secrets) is not theirs.
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SHELL", "TERM")
PYTHON_WORDS = frozenset({"python", "python3"})


def run_dir() -> Path:
    """The directory holding every attempt directory: ``settings.LOCAL_RUNNER_DIR``, absolute."""
    return Path(settings.LOCAL_RUNNER_DIR).resolve()


def attempt_dir(attempt) -> Path:
    """``<LOCAL_RUNNER_DIR>/<attempt.object_name>/`` (logs, pid and exit files of the attempt)."""
    return run_dir() / attempt.object_name


def checkpoint_dir(job_id: int) -> Path:
    """``<LOCAL_RUNNER_DIR>/job-<job id>/checkpoints``: shared by all attempts of a job, so a new attempt resumes."""
    return run_dir() / f"job-{job_id}" / "checkpoints"


def build_command(spec: dict) -> list[str]:
    """argv of a job: ``spec["command"] + spec.get("args", [])`` with a leading ``python``/``python3`` made ``sys.executable``.

    The executable is resolved on PATH (or, for a path with a slash,
    against the repository root). Raises PermanentDispatchError for an
    empty or non-list command, a non-string word, or a missing executable.
    """
    command, args = spec.get("command"), spec.get("args") or []
    if not isinstance(command, list) or not command or not isinstance(args, list):
        raise PermanentDispatchError("spec.command must be a non-empty list of strings (and spec.args a list)")
    argv = command + args
    if not all(isinstance(word, str) for word in argv) or not argv[0]:
        raise PermanentDispatchError("spec.command and spec.args must hold strings only")
    if argv[0] in PYTHON_WORDS:
        return [sys.executable, *argv[1:]]
    return [_resolve_executable(argv[0]), *argv[1:]]


def _resolve_executable(word: str) -> str:
    if os.sep in word:
        path = Path(word) if os.path.isabs(word) else Path(settings.BASE_DIR) / word
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise PermanentDispatchError(f"executable {word!r} not found or not executable")
    found = shutil.which(word, path=os.environ.get("PATH", os.defpath))
    if found is None:
        raise PermanentDispatchError(f"executable {word!r} not found on PATH")
    return found


def spec_env(spec: dict) -> dict[str, str]:
    """The job's ``spec["env"]`` (a dict str -> str). Raises PermanentDispatchError for any other shape."""
    env = spec.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise PermanentDispatchError("spec.env must map strings to strings")
    return env


def node_env(attempt, meta: dict, node: int) -> dict[str, str]:
    """The environment of node ``node`` of ``attempt`` (torchrun's variables, the job's env, the platform's).

    ``meta`` is the attempt's ``attempt.json`` (master port, node ports,
    devices). The job's env may set anything but the rendezvous, rank, device,
    ``PORT``, ``PEAK_TFLOPS`` and ``CONTROLPLANE_*`` variables, which the platform owns.
    ``PEAK_TFLOPS`` (real GPUs only) is the accelerator's catalog peak.
    ``PORT`` is a TCP port on 127.0.0.1 that was free when the attempt was first
    dispatched, one per node, so a server never collides with the control
    plane's own web port or with another attempt.
    """
    job = attempt.job
    env = {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith("LC_")}
    env["PYTHONUNBUFFERED"] = "1"  # so node logs show output as it happens
    devices = meta.get("devices")
    role = role_of(meta, node)
    if devices is None:
        # CPU work: split this machine's cores among the node processes, as torchrun does (OMP_NUM_THREADS).
        # A CPU-only job gets the cores it asked for per node (``cpu_threads``; a role's, for a multi-role job).
        threads = role["cpu_threads"] if role is not None else meta.get("cpu_threads")
        env["OMP_NUM_THREADS"] = str(threads or max(1, (os.cpu_count() or 1) // max(1, meta["nodes"])))
    env.update(spec_env(job.spec if role is None else job.spec["roles"][role["name"]]))
    if devices is not None and meta.get("peak_tflops"):
        # Real GPUs: their peak from the accelerator catalog, so the workload can report MFU. Emulated GPUs run
        # on the CPU, whose peak nobody measured: no PEAK_TFLOPS, and the workload says MFU is n/a.
        env["PEAK_TFLOPS"] = str(meta["peak_tflops"])
    env.update({
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(meta["master_port"]),
        "WORLD_SIZE": str(meta["nodes"]),
        "NODE_RANK": str(node),
        "RANK": str(node),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "CHECKPOINT_DIR": (meta.get("pod_checkpoints") or {}).get(str(node), meta["checkpoint_dir"]),
        "PORT": str(node_port(meta, node)),
        "CONTROLPLANE_JOB_ID": str(job.pk),
        "CONTROLPLANE_ATTEMPT": str(attempt.number),
        "CONTROLPLANE_TEAM": job.team.slug,
        **element_env(job),  # an array's element: CONTROLPLANE_ARRAY_ID, _INDEX, _COUNT and its SWEEP_* values
        "CUDA_VISIBLE_DEVICES": "" if devices is None else ",".join(str(d) for d in devices[node]),
    })
    share = Share.from_json(meta.get("share"))
    if share is not None:
        env.update(share_env(share, meta.get("share_sharing") or ""))
    if node == 0 and meta.get("metrics_port"):
        # The port where rank 0 may serve its workload metrics (jobs.efficiency.protocol); a job that serves
        # none leaves it unused.
        env["CONTROLPLANE_METRICS_PORT"] = str(meta["metrics_port"])
    if role is not None:
        env.update(role_env(meta, node))
    return env


#: The variables that tell a process on part of a GPU what it holds (ADR 0040; ``share_env``).
SHARE_VARIABLES = ("CONTROLPLANE_GPU_SHARING", "CONTROLPLANE_GPU_SHARE", "CONTROLPLANE_GPU_SHARE_MILLI",
                   "CONTROLPLANE_GPU_NODE", "CONTROLPLANE_GPU_INDEX", "CONTROLPLANE_MIG_PROFILE",
                   "CONTROLPLANE_MIG_INSTANCE")


def share_env(share: Share, sharing: str) -> dict[str, str]:
    """What a pod on part of a GPU is told it holds (``SHARE_VARIABLES``): ``CONTROLPLANE_GPU_SHARING`` its node's
    sharing mode (``time-slicing``, ``mps``, ``mig-mixed``), ``CONTROLPLANE_GPU_SHARE`` its share in GPUs
    (``0.25``; a MIG device's memory slices over eight, ``core.gpus.MigProfile.share_milli``) and
    ``CONTROLPLANE_GPU_SHARE_MILLI`` in milli-GPUs, ``CONTROLPLANE_GPU_NODE`` and ``CONTROLPLANE_GPU_INDEX`` the
    node and the physical GPU there (what ``CUDA_VISIBLE_DEVICES`` names on a real node; emulated GPUs leave it
    empty, the process runs on the CPU), and on a MIG device ``CONTROLPLANE_MIG_PROFILE`` and
    ``CONTROLPLANE_MIG_INSTANCE`` (its GPU instance id, dcgm-exporter's ``GPU_I_ID``)."""
    env = {"CONTROLPLANE_GPU_SHARING": sharing, "CONTROLPLANE_GPU_SHARE": str(gpus_of(share.milli)),
           "CONTROLPLANE_GPU_SHARE_MILLI": str(share.milli), "CONTROLPLANE_GPU_NODE": share.node,
           "CONTROLPLANE_GPU_INDEX": str(share.gpu)}
    if share.profile:
        env.update(CONTROLPLANE_MIG_PROFILE=share.profile, CONTROLPLANE_MIG_INSTANCE=str(share.instance))
    return env


def role_of(meta: dict, node: int) -> dict | None:
    """The role (an entry of ``attempt.json``'s ``roles``) whose pod is node ``node`` of a multi-role attempt;
    None for an attempt of one role."""
    for role in meta.get("roles") or ():
        if role["first"] <= node < role["first"] + role["count"]:
            return role
    return None


def role_env(meta: dict, node: int) -> dict[str, str]:
    """The platform's variables of node ``node`` of a multi-role attempt (``meta``: its ``attempt.json``): its role
    (``CONTROLPLANE_ROLE``), its index within the role (``CONTROLPLANE_ROLE_INDEX``), every role's name
    (``CONTROLPLANE_ROLES``, comma-separated, in name order), ``CONTROLPLANE_ROLE_<R>_ADDRESSES`` of every
    role that declares a port (``R``: its name upper-cased, ``-`` as ``_``; ``127.0.0.1:<PORT>`` of each of its
    pods, comma-separated, in index order) and the role's own rendezvous: ``MASTER_PORT`` of its own,
    ``WORLD_SIZE`` its pods, ``RANK`` / ``NODE_RANK`` the index (a role of several pods is one process group)."""
    role = role_of(meta, node)
    index = node - role["first"]
    env = {"CONTROLPLANE_ROLE": role["name"], "CONTROLPLANE_ROLE_INDEX": str(index),
           "CONTROLPLANE_ROLES": ",".join(r["name"] for r in meta["roles"]),
           "MASTER_PORT": str(role["master_port"]), "WORLD_SIZE": str(role["count"]), "RANK": str(index),
           "NODE_RANK": str(index)}
    for other in meta["roles"]:
        if other.get("port") is not None:
            env[role_addresses_variable(other["name"])] = ",".join(
                f"127.0.0.1:{node_port(meta, n)}" for n in range(other["first"], other["first"] + other["count"]))
    return env


def role_addresses_variable(name: str) -> str:
    """``CONTROLPLANE_ROLE_<NAME>_ADDRESSES`` of role ``name`` (upper-cased, ``-`` as ``_``)."""
    return f"CONTROLPLANE_ROLE_{name.upper().replace('-', '_')}_ADDRESSES"


def role_layout(spec: dict) -> list[dict]:
    """A multi-role ``spec``'s roles as the local runner numbers their pods: one entry per role in name
    order (``jobs.models.roles_in_order``), ``{"name", "first" (its first node index), "count" (its pods), "gpus", "port" (declared or None),
    "completion", "cpu_threads"}``."""
    layout, first = [], 0
    for name, role in roles_in_order(spec["roles"]).items():
        resources = role["resources"]
        layout.append({"name": name, "first": first, "count": resources["nodes"], "gpus": resources["gpus_per_node"],
                       "port": role.get("port"), "completion": bool(role.get("completion", True)),
                       "cpu_threads": _cpu_threads(role)})
        first += resources["nodes"]
    return layout


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now (the kernel's picks; all held open until every one is
    chosen, so none is picked twice): the attempt's rendezvous (MASTER_PORT) and each node's PORT."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def node_port(meta: dict, node: int) -> int:
    """The ``PORT`` of node ``node`` in ``attempt.json`` ``meta`` (attempts written before ports existed: the
    master port plus 1 plus the node index)."""
    ports = meta.get("ports") or []
    return ports[node] if node < len(ports) else meta["master_port"] + 1 + node


def live_pods(meta: dict) -> list[int]:
    """The node indexes of ``attempt.json`` ``meta`` that are not retired (a serving attempt's replicas that a
    scale-down stopped are retired: they end nothing)."""
    retired = set(meta.get("retired") or ())
    return [n for n in range(meta["nodes"]) if n not in retired]


def replica_addresses(meta: dict) -> list[str]:
    """``127.0.0.1:<PORT>`` of every live pod of ``meta``: the replicas the job's endpoint balances over."""
    return [f"127.0.0.1:{node_port(meta, n)}" for n in live_pods(meta)]


def health_path(spec: dict) -> str:
    """The path a serving job's replicas answer readiness checks on (``spec.health_path``, default ``/healthz``)."""
    return (spec or {}).get("health_path") or DEFAULT_HEALTH_PATH


def checkpoint_job_id(job) -> int:
    """Whose checkpoint directory the job's CHECKPOINT_DIR is: the training job named by ``spec.checkpoint_from``
    (a serving job), else the job itself."""
    return (job.spec or {}).get("checkpoint_from") or job.pk


@dataclasses.dataclass
class NodeStatus:
    """What the files and ``/proc`` say of one node.

    ``state``: ``waiting`` (supervisor starting), ``running`` (the command
    runs), ``ended`` (``exit`` holds the exit record) or ``lost`` (the
    supervisor died without writing one). ``supervisor``/``child`` are the
    process identities when known.
    """

    node: int
    state: str
    exit: dict | None = None
    supervisor: ProcessRef | None = None
    child: ProcessRef | None = None

    def live_pids(self, table: dict[int, ProcInfo]) -> list[int]:
        """Pids of this node still running: its supervisor's group and the command (even if it left the group)."""
        pids = set(group_members(self.supervisor, table)) if self.supervisor else set()
        if self.child and self.child.alive(table):
            pids.add(self.child.pid)
        return sorted(pids)


def read_node(directory: Path, node: int, table: dict[int, ProcInfo], now: float) -> NodeStatus:
    """The status of node ``node`` in attempt directory ``directory`` against the ``proc_table`` snapshot ``table``."""
    exit_record = read_json(node_path(directory, node, "exit"))
    pid_info = read_json(node_path(directory, node, "pid"))
    claim_path = node_path(directory, node, "claim")
    claim = read_json(claim_path)
    supervisor = ProcessRef.from_json((pid_info or {}).get("supervisor") or (claim or {}).get("supervisor"))
    child = ProcessRef.from_json((pid_info or {}).get("child"))
    if exit_record is not None:
        return NodeStatus(node, "ended", exit_record, supervisor, child)
    if supervisor is not None:
        if supervisor.alive(table):
            return NodeStatus(node, "running" if pid_info else "waiting", None, supervisor, child)
        # It may have written its exit file and ended after we read it.
        exit_record = read_json(node_path(directory, node, "exit"))
        return NodeStatus(node, "ended" if exit_record else "lost", exit_record, supervisor, child)
    # Claimed but the supervisor is not recorded yet, or not even claimed: a dispatch is under way, or died.
    since = now
    for path in (claim_path, directory / ATTEMPT_FILE):
        try:
            since = path.stat().st_mtime
            break
        except OSError:
            continue
    return NodeStatus(node, "lost" if now - since > LAUNCH_TIMEOUT_SECONDS else "waiting")


def summarise(statuses: list[NodeStatus], stop_reason: str | None, roles: list[dict] | None = None) -> Observation:
    """One Observation from the nodes of an attempt (see ``Backend.observe`` for the phases).

    A node's own failure wins over the stop of its siblings that it caused:
    deadline, then a non-zero exit, then death by a signal, then a lost
    supervisor, then a stop.

    A multi-role attempt (``roles``: ``attempt.json``'s) succeeds once every pod of every role with
    ``completion`` exited 0, whatever the others do then (they are stopped); until then any pod's failure is the
    attempt's (named by role and index), and a pod of a role without completion that exits 0 ends nothing.
    """
    if roles:
        done = [s for r in roles if r["completion"] for s in statuses[r["first"]:r["first"] + r["count"]]]
        if all(s.state == "ended" and s.exit.get("reason") == "exited" and s.exit.get("exit_code") == 0
               for s in done):
            return Observation("succeeded", exit_code=0)

    def label(node: int) -> str:
        for r in roles or ():
            if r["first"] <= node < r["first"] + r["count"]:
                return f"role {r['name']} pod {node - r['first']}"
        return f"node {node}"

    ended = sorted((s for s in statuses if s.state == "ended"), key=lambda s: s.exit.get("ended_at") or 0)

    def first(reason: str, test=lambda r: True) -> NodeStatus | None:
        """The earliest ended node whose exit record has ``reason`` and passes ``test``."""
        return next((s for s in ended if s.exit.get("reason") == reason and test(s.exit)), None)

    if (s := first("deadline")) is not None:
        return Observation("failed", "DeadlineExceeded", s.exit.get("exit_code"),
                           f"{label(s.node)} ran past max_runtime_seconds and was stopped")
    if (s := first("exited", lambda r: r.get("exit_code") != 0)) is not None:
        code = s.exit.get("exit_code")
        detail = f": {s.exit['error']}" if s.exit.get("error") else ""
        return Observation("failed", "Failed", code, f"{label(s.node)} exited with code {code}{detail}")
    if (s := first("signal")) is not None:
        sig = s.exit.get("signal")
        if sig == signal.SIGKILL:
            return Observation("failed", "OOMKilled", 128 + sig,
                               f"{label(s.node)} was killed by SIGKILL (the kernel's OOM killer sends it when memory runs out)")
        return Observation("failed", "Failed", 128 + sig if sig else None, f"{label(s.node)} was killed by {signal_name(sig)}")
    if (s := next((s for s in statuses if s.state == "lost"), None)) is not None:
        return Observation("lost", "NodeLost", None, f"the supervisor of {label(s.node)} died without recording an exit")
    if (s := first("cancelled")) is not None:
        if stop_reason:
            return Observation("failed", "Cancelled", s.exit.get("exit_code"), f"stopped by the control plane: {stop_reason}")
        return Observation("lost", "Evicted", s.exit.get("exit_code"),
                           f"{label(s.node)} was stopped by a signal from outside the control plane")
    if all(s.state == "ended" for s in statuses):
        return Observation("succeeded", exit_code=0)
    if all(s.state in ("running", "ended") for s in statuses):
        return Observation("running")
    return Observation("pending")


#: Exit reasons of a serving replica's pod that make the replica lost (replaced while the others serve): a crash, a
#: kill, a stop from outside. A deadline is the attempt's (its max runtime), and an exit 0 is a server that
#: chose to end: those stay the attempt's, as for any job.
REPLICA_LOSS_REASONS = frozenset({"exited", "signal", "cancelled"})


def lost_replicas(statuses: list[NodeStatus], pods_per_replica: int) -> tuple[list[NodeStatus], tuple[LostReplica, ...]]:
    """Split the live pods' ``statuses`` of a serving attempt (in node order; every ``pods_per_replica`` of them
    one replica) into the survivors' statuses and the replicas lost: a replica one of whose pods crashed (a
    non-zero exit), was killed by a signal, was stopped from outside the control plane (``cancelled`` with no
    stop of the attempt) or whose supervisor died (``lost``). Each lost replica is named by its pods' node
    indexes and described as ``summarise`` describes an attempt of those pods alone."""
    survivors: list[NodeStatus] = []
    lost: list[LostReplica] = []
    size = max(1, pods_per_replica)
    for at in range(0, len(statuses), size):
        group = statuses[at:at + size]
        dead = any(s.state == "lost" or (s.state == "ended" and s.exit.get("reason") in REPLICA_LOSS_REASONS and not (
            s.exit.get("reason") == "exited" and s.exit.get("exit_code") == 0)) for s in group)
        if not dead:
            survivors.extend(group)
            continue
        ended = summarise([s for s in group if s.state in ("ended", "lost")], None)
        lost.append(LostReplica(",".join(str(s.node) for s in group), ended.phase, ended.end_reason, ended.exit_code,
                                ended.message))
    return survivors, tuple(lost)


class LocalBackend(Backend):
    """Runs attempts as processes on this machine: one supervised process group per node.

    Files and units are described in ``runners.local.layout`` and
    ``runners.local.launcher``; times are seconds.
    """

    name = "local"
    scales = True
    replaces_replicas = True
    rolls_out = True

    # --- discovery ---------------------------------------------------------------------------------------------

    def discover(self, cluster) -> list[PoolCapacity]:
        """This machine's node pools: NVIDIA GPUs found by NVML, or the emulated pool of the settings; and its CPU
        pool (``capacity.local_cpu_pool``).

        ``cluster.emulated`` selects the emulated pool; a non-emulated cluster
        on a machine where NVML finds no GPU has no pool (an empty list).
        """
        from .capacity import local_pools

        return local_pools(emulated=cluster.emulated)

    # --- dispatch ----------------------------------------------------------------------------------------------

    def dispatch(self, attempt) -> dict:
        """Start one supervisor per node of ``attempt`` unless started already; returns its ``runner_state``.

        Idempotent, also under concurrent calls from several processes: the
        attempt's ``attempt.json`` (master port, GPU devices) is written once
        under a lock, and each node is launched only by the caller that
        creates its ``node-<i>.claim`` with O_CREAT|O_EXCL. Reads
        ``attempt.job`` (and its team), ``attempt.cluster`` and, for real GPUs,
        ``attempt.node_pool``. Returns ``{"attempt_dir", "master_port",
        "ports", "endpoint", "nodes", "pids", "logs", "cuda_visible_devices", "metrics_url"}``
        (``ports``: each node's ``PORT``; ``endpoint``: the URL an inference
        job serves on, its endpoint (``runners.local.serving``: one per job,
        over its replicas, each replica a node of its own), None for training;
        an inference attempt also ``replicas`` (their ``host:port``),
        ``retired`` (node indexes a scale-down stopped) and
        ``endpoint_metrics_url``; a job on part of a GPU also ``gpu_share``
        (its ``sharing.Share``: node, GPU, milli-GPUs, MIG profile and instance); ``metrics_url``:
        where node 0 may serve its workload metrics, the port given to it in
        ``CONTROLPLANE_METRICS_PORT``); a multi-role attempt also ``roles``:
        by role, its node indexes (``pods``) and, for a role with a port, the
        ``addresses`` given to the others (``role_env``).

        Raises PermanentDispatchError for an invalid command or env, a missing
        executable or an attempt already stopped; TransientDispatchError for
        OSError (EAGAIN, ENOMEM, a full disk) and for GPUs still held by
        other processes.
        """
        job = attempt.job
        if job.kind == "multi-role":
            argvs = {name: build_command(role) for name, role in job.spec["roles"].items()}
            for role in job.spec["roles"].values():
                spec_env(role)
        else:
            argv = build_command(job.spec)
            spec_env(job.spec)
        directory = attempt_dir(attempt)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            meta = self._ensure_meta(attempt, directory)
            Path(meta["checkpoint_dir"]).mkdir(parents=True, exist_ok=True)
            if (directory / STOP_FILE).exists():
                raise PermanentDispatchError(f"{attempt.object_name} was stopped; it cannot start again")
            for node in live_pods(meta):
                role = role_of(meta, node)
                self._launch_node(attempt, directory, meta, node, argv if role is None else argvs[role["name"]])
            conf = self._endpoint(attempt, meta)
        except OSError as exc:
            raise TransientDispatchError(f"cannot start {attempt.object_name}: {exc}") from exc
        return self._runner_state(directory, meta, conf)

    def _endpoint(self, attempt, meta: dict) -> dict | None:
        """Point a serving attempt's job endpoint at its live replicas, starting the proxy if needed
        (``runners.local.serving``); its ``endpoint.json``, or None for other kinds. Raises OSError."""
        if attempt.job.kind != "inference":
            return None
        return ensure_endpoint(attempt.job_id, attempt.object_name, replica_addresses(meta),
                               meta.get("health_path") or DEFAULT_HEALTH_PATH, free_ports,
                               meta.get("hold_seconds") or 0.0, meta.get("refusal") or "")

    def scale(self, attempt, replicas: int, *, refusal: str = "") -> dict:
        """Make serving ``attempt`` run ``replicas`` replicas (of ``job.nodes`` pods each; 0 for a job that scales
        to zero): start new pods (fresh ports, appended node indexes) or retire the last ones (taken out of the
        endpoint first, then stopped: SIGTERM, the supervisor's grace, SIGKILL). ``refusal`` is kept for the
        endpoint (``Backend.scale``). Idempotent; returns the attempt's new ``runner_state``.

        Raises PermanentDispatchError for an attempt that is stopped or not a serving one, TransientDispatchError
        for OSError and for GPUs still held by other processes.
        """
        job = attempt.job
        if job.kind != "inference":
            raise PermanentDispatchError(f"{attempt.object_name} is not a serving attempt")
        directory = attempt_dir(attempt)
        if (directory / STOP_FILE).exists():
            raise PermanentDispatchError(f"{attempt.object_name} was stopped; it cannot be scaled")
        argv = build_command(job.spec)
        wanted = job.nodes * max(0, replicas)
        try:
            with open(run_dir() / ".dispatch.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # the same lock as first dispatches: port and GPU picks
                meta = read_json(directory / ATTEMPT_FILE)
                if meta is None:
                    raise TransientDispatchError(f"{attempt.object_name} is not dispatched yet")
                live = live_pods(meta)
                retiring = live[wanted:]
                if len(live) < wanted:
                    added = wanted - len(live)
                    meta["ports"] = [node_port(meta, n) for n in range(meta["nodes"])] + free_ports(added)
                    if meta.get("devices") is not None:
                        meta["devices"] = meta["devices"] + self._free_devices(attempt, [job.gpus_per_node] * added)
                    meta["nodes"] += added
                elif retiring:
                    meta["retired"] = sorted(set(meta.get("retired") or ()) | set(retiring))
                meta["refusal"] = refusal
                write_json_atomic(directory / ATTEMPT_FILE, meta)
            conf = self._endpoint(attempt, meta)  # retired replicas leave rotation before they stop
            for node in live_pods(meta):
                self._launch_node(attempt, directory, meta, node, argv)
            self._retire(directory, retiring)
        except OSError as exc:
            raise TransientDispatchError(f"cannot scale {attempt.object_name}: {exc}") from exc
        return self._runner_state(directory, meta, conf)

    def replace_replica(self, attempt, key: str) -> dict:
        """Start a new replica of serving ``attempt`` in place of the lost one ``key`` (its pods' node indexes,
        comma-separated: ``LostReplica.key``): its pods are retired (taken out of the endpoint; any of them still
        alive stopped) and as many new pods appended on the same GPU devices (the booked slot: nothing is admitted
        or released), each with a fresh ``PORT``. Idempotent: pods retired already are not replaced again.
        Returns the attempt's new ``runner_state``.

        Raises PermanentDispatchError for a bad key, an attempt that is stopped or not a serving one,
        TransientDispatchError for OSError or an attempt not dispatched yet.
        """
        job = attempt.job
        if job.kind != "inference":
            raise PermanentDispatchError(f"{attempt.object_name} is not a serving attempt")
        try:
            pods = sorted({int(word) for word in key.split(",")})
        except ValueError:
            raise PermanentDispatchError(f"{key!r} names no replica of {attempt.object_name}") from None
        directory = attempt_dir(attempt)
        if (directory / STOP_FILE).exists():
            raise PermanentDispatchError(f"{attempt.object_name} was stopped; its replicas are not replaced")
        argv = build_command(job.spec)
        try:
            with open(run_dir() / ".dispatch.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # the same lock as dispatches and scaling: port and device picks
                meta = read_json(directory / ATTEMPT_FILE)
                if meta is None:
                    raise TransientDispatchError(f"{attempt.object_name} is not dispatched yet")
                if any(not 0 <= pod < meta["nodes"] for pod in pods):
                    raise PermanentDispatchError(f"{key!r} names no replica of {attempt.object_name}")
                fresh = [pod for pod in pods if pod not in set(meta.get("retired") or ())]
                if fresh:
                    meta["ports"] = [node_port(meta, n) for n in range(meta["nodes"])] + free_ports(len(fresh))
                    if meta.get("devices") is not None:
                        meta["devices"] = meta["devices"] + [meta["devices"][pod] for pod in fresh]
                    meta["nodes"] += len(fresh)
                    meta["retired"] = sorted(set(meta.get("retired") or ()) | set(fresh))
                    meta["replaced"] = {**(meta.get("replaced") or {}),
                                        **{str(pod): meta["nodes"] - len(fresh) + i for i, pod in enumerate(fresh)}}
                    checkpoints = meta.get("pod_checkpoints") or {}
                    for pod, new in meta["replaced"].items():  # a new pod serves what the lost one served
                        if pod in checkpoints:
                            checkpoints[str(new)] = checkpoints[pod]
                    meta["pod_checkpoints"] = checkpoints
                    write_json_atomic(directory / ATTEMPT_FILE, meta)
            conf = self._endpoint(attempt, meta)  # the lost pods leave rotation, the new ones join once ready
            for node in live_pods(meta):
                self._launch_node(attempt, directory, meta, node, argv)
            self._retire(directory, pods)  # a pod of the lost replica that still runs
        except OSError as exc:
            raise TransientDispatchError(f"cannot replace a replica of {attempt.object_name}: {exc}") from exc
        return self._runner_state(directory, meta, conf)

    # --- rollouts (serving.rollout) ------------------------------------------------------------------------------

    def replica_keys(self, attempt) -> list[str]:
        """The live pods of serving ``attempt``, oldest first, as keys (``"<node index>"``; a serving replica is one
        pod), the rollout's new ones still on probation left out."""
        meta = read_json(attempt_dir(attempt) / ATTEMPT_FILE) or {}
        probation = set(meta.get("rollout_pods") or ())
        return [str(n) for n in live_pods(meta) if n not in probation] if meta else []

    def start_rollout_replica(self, attempt, checkpoint_job_id: int, *, in_place_of: str | None = None) -> str:
        """One new pod of serving ``attempt`` with ``CHECKPOINT_DIR`` the checkpoint directory of job
        ``checkpoint_job_id`` (``Backend.start_rollout_replica``): on GPU devices no live pod holds (a surge the
        caller admitted) or on those of pod ``in_place_of``, retired first. Its node index is its key; it stays on
        probation (``rollout_pods``: observe leaves it to the rollout) until ``settle_rollout_replica`` finds it
        ready. Raises PermanentDispatchError (not a serving attempt, stopped, a bad key), TransientDispatchError
        (OSError, not dispatched, no free devices)."""
        job = attempt.job
        directory = attempt_dir(attempt)
        if job.kind != "inference" or (directory / STOP_FILE).exists():
            raise PermanentDispatchError(f"{attempt.object_name} is not a running serving attempt")
        argv = build_command(job.spec)
        try:
            with open(run_dir() / ".dispatch.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                meta = read_json(directory / ATTEMPT_FILE)
                if meta is None:
                    raise TransientDispatchError(f"{attempt.object_name} is not dispatched yet")
                old = None if in_place_of is None else int(in_place_of)
                if old is not None and old not in live_pods(meta):
                    raise PermanentDispatchError(f"{in_place_of!r} is no live replica of {attempt.object_name}")
                new = meta["nodes"]
                meta["ports"] = [node_port(meta, n) for n in range(new)] + free_ports(1)
                if meta.get("devices") is not None:
                    meta["devices"] = meta["devices"] + ([meta["devices"][old]] if old is not None else
                                                         self._free_devices(attempt, [job.gpus_per_node]))
                meta["nodes"] = new + 1
                if old is not None:
                    meta["retired"] = sorted({*(meta.get("retired") or ()), old})
                meta["rollout_pods"] = sorted({*(meta.get("rollout_pods") or ()), new})
                meta["pod_checkpoints"] = {**(meta.get("pod_checkpoints") or {}),
                                           str(new): str(checkpoint_dir(checkpoint_job_id))}
                write_json_atomic(directory / ATTEMPT_FILE, meta)
            self._endpoint(attempt, meta)  # listed, it gets requests once its health check passes
            self._launch_node(attempt, directory, meta, new, argv)
            if old is not None:
                self._retire(directory, [old])
        except (OSError, ValueError) as exc:
            raise TransientDispatchError(f"cannot start a replica of {attempt.object_name}: {exc}") from exc
        return str(new)

    def settle_rollout_replica(self, attempt, key: str) -> str:
        """``starting``, ``failed`` (its pod ended or its supervisor died) or ``ready`` (its health path answered
        2xx or 3xx within 1 s, as the endpoint counts it; it leaves probation) of the rollout's pod ``key``."""
        directory = attempt_dir(attempt)
        node = int(key)
        status = read_node(directory, node, proc_table(), time.time())
        if status.state in ("ended", "lost"):
            return "failed"
        if status.state != "running":
            return "starting"
        meta = read_json(directory / ATTEMPT_FILE) or {}
        url = f"http://127.0.0.1:{node_port(meta, node)}{meta.get('health_path') or DEFAULT_HEALTH_PATH}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as answer:  # noqa: S310 - our own replica's port
                ready = 200 <= answer.status < 400
        except (OSError, ValueError):
            ready = False
        if not ready:
            return "starting"
        self._change_meta(attempt, lambda meta: meta.update(
            rollout_pods=[n for n in meta.get("rollout_pods") or () if n != node]))
        return "ready"

    def retire_replica(self, attempt, key: str) -> dict:
        """Retire pod ``key`` of serving ``attempt``: out of the endpoint, then stopped (``_retire``)."""
        node = int(key)
        meta = self._change_meta(attempt, lambda meta: meta.update(
            retired=sorted({*(meta.get("retired") or ()), node}),
            rollout_pods=[n for n in meta.get("rollout_pods") or () if n != node]))
        try:
            conf = self._endpoint(attempt, meta)
            self._retire(attempt_dir(attempt), [node])
        except OSError as exc:
            raise TransientDispatchError(f"cannot retire a replica of {attempt.object_name}: {exc}") from exc
        return self._runner_state(attempt_dir(attempt), meta, conf)

    def finish_rollout(self, attempt, checkpoint_job_id: int) -> dict:
        """Point ``attempt.json``'s ``checkpoint_dir`` (what pods started from now on load) at job
        ``checkpoint_job_id``'s checkpoints."""
        meta = self._change_meta(attempt, lambda meta: meta.update(
            checkpoint_dir=str(checkpoint_dir(checkpoint_job_id))))
        try:
            conf = self._endpoint(attempt, meta)
        except OSError as exc:
            raise TransientDispatchError(f"cannot finish the rollout of {attempt.object_name}: {exc}") from exc
        return self._runner_state(attempt_dir(attempt), meta, conf)

    def _change_meta(self, attempt, change) -> dict:
        """Apply ``change(meta)`` to ``attempt``'s ``attempt.json`` under the dispatch lock; the new meta. Raises
        TransientDispatchError for an attempt not dispatched yet and for OSError."""
        path = attempt_dir(attempt) / ATTEMPT_FILE
        try:
            with open(run_dir() / ".dispatch.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                meta = read_json(path)
                if meta is None:
                    raise TransientDispatchError(f"{attempt.object_name} is not dispatched yet")
                change(meta)
                write_json_atomic(path, meta)
        except OSError as exc:
            raise TransientDispatchError(f"cannot change {attempt.object_name}: {exc}") from exc
        return meta

    def _retire(self, directory: Path, nodes: list[int]) -> None:
        """Stop the pods ``nodes`` of the attempt in ``directory`` (SIGTERM to their supervisors' groups, which
        escalate to SIGKILL after their grace); their exit records end nothing (``live_pods``)."""
        table = proc_table()
        for status in (read_node(directory, node, table, time.time()) for node in nodes):
            if status.supervisor is not None:
                signal_group(status.supervisor, signal.SIGTERM, table)
            signal_process(status.child, signal.SIGTERM, table)

    def endpoint_load(self, attempt) -> str | None:
        """The Prometheus exposition of serving ``attempt``'s endpoint counters (``runners.local.endpoint``), or
        None when it does not answer (``Backend.endpoint_load``)."""
        url = (attempt.runner_state or {}).get("endpoint_metrics_url")
        return self.scrape(url) if url else None

    def _ensure_meta(self, attempt, directory: Path) -> dict:
        """Read ``attempt.json``, writing it first if this is the attempt's first dispatch (under a run-dir lock)."""
        path = directory / ATTEMPT_FILE
        meta = read_json(path)
        if meta is not None:
            return meta
        with open(run_dir() / ".dispatch.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # serialises first dispatches: port and GPU picks do not collide
            meta = read_json(path)
            if meta is None:
                nodes = attempt.job.pods
                roles = role_layout(attempt.job.spec) if attempt.job.kind == "multi-role" else None
                master_port, metrics_port, *ports = free_ports(2 + nodes + len(roles or ()))
                for role in roles or ():
                    role["master_port"] = ports.pop()
                meta = {
                    "attempt_id": attempt.pk, "job_id": attempt.job_id, "number": attempt.number,
                    "uid": attempt_key(attempt) if not attempt.legacy_name else None,
                    "object_name": attempt.object_name, "cluster_id": attempt.cluster_id, "nodes": nodes,
                    "master_port": master_port, "ports": ports, "metrics_port": metrics_port,
                    "checkpoint_dir": str(checkpoint_dir(checkpoint_job_id(attempt.job))),
                    # None: no GPU devices (emulated GPUs, or a CPU-only job on the CPU pool)
                    "devices": (None if attempt.cluster.emulated or not attempt.job.gpus_per_node
                                else self._pick_devices(attempt, nodes)),
                    "cpu_threads": None if roles else _cpu_threads(attempt.job.spec),
                    "peak_tflops": None if attempt.cluster.emulated else _peak_tflops(attempt),
                    "created_at": time.time(),
                }
                if roles is not None:
                    meta["roles"] = roles
                if attempt.job.gpu_share_milli and attempt.cluster.emulated:
                    meta["share"], meta["share_sharing"] = self._place_share(attempt)
                if attempt.job.kind == "inference":
                    meta["health_path"] = health_path(attempt.job.spec)  # observe reads no job row
                    scaling = (attempt.job.spec or {}).get("autoscaling") or {}
                    # a job that scales to zero: how long its endpoint holds a request while no replica is ready
                    meta["hold_seconds"] = float(settings.SERVING_HOLD_SECONDS) if scaling.get("scale_to_zero") else 0.0
                write_json_atomic(path, meta)
        return meta

    def _place_share(self, attempt) -> tuple[dict, str]:
        """Where the one pod of ``attempt``, a job on part of a GPU, sits on its node (``placement["nodes"][0]``, a
        shared node of ``LOCAL_RUNNER_SHARED_NODES``): ``(Share as JSON, the node's sharing mode)``, next to the
        shares the other attempts of the cluster hold there (``sharing.place_share``). Call under the dispatch
        lock. Raises PermanentDispatchError when the node is not a shared node of this machine,
        TransientDispatchError when none of its GPUs or devices is free (an attempt there still ending)."""
        from .capacity import shared_nodes

        job = attempt.job
        names = (attempt.placement or {}).get("nodes") or []
        node = next((n for n in shared_nodes(attempt.node_pool.accelerator.name) if names and n.name == names[0]), None)
        if node is None:
            raise PermanentDispatchError(f"{attempt.object_name} asks part of a GPU but its node "
                                         f"{names[0] if names else '(none)'} is no shared node of this machine")
        share = place_share(node, job.gpu_share_milli, job.mig_profile, held_shares(attempt.cluster_id))
        if share is None:
            what = f"MIG device {job.mig_profile}" if job.mig_profile else f"{gpus_of(job.gpu_share_milli)} GPU"
            raise TransientDispatchError(f"no free {what} on {node.name} yet")
        return share.to_json(), node.sharing

    def _pick_devices(self, attempt, nodes: int) -> list[list[int]]:
        """GPU indices per node, from the pool's GPUs that no live attempt holds. Raises TransientDispatchError."""
        job = attempt.job
        counts = ([r["resources"]["gpus_per_node"] for r in roles_in_order(job.spec["roles"]).values()
                   for _ in range(r["resources"]["nodes"])] if job.kind == "multi-role" else [job.gpus_per_node] * nodes)
        return self._free_devices(attempt, counts)

    def _free_devices(self, attempt, counts: list[int]) -> list[list[int]]:
        """``counts[i]`` GPU indices for each new pod ``i``, from the pool's GPUs that no live pod of any attempt
        holds (a retired pod's are free). Raises TransientDispatchError."""
        total = attempt.node_pool.nodes * attempt.node_pool.gpus_per_node
        table = proc_table()
        held: set[int] = set()
        for directory, meta in _attempt_dirs():
            if meta.get("devices") and meta.get("cluster_id") == attempt.cluster_id and \
                    _live_pids(directory, meta["nodes"], table):
                retired = set(meta.get("retired") or ())
                held.update(d for n, node_devices in enumerate(meta["devices"]) if n not in retired for d in node_devices)
        free = [d for d in range(total) if d not in held]
        if len(free) < sum(counts):
            raise TransientDispatchError(f"{sum(counts)} GPUs needed, {len(free)} free on this machine")
        out, at = [], 0
        for count in counts:  # each node (a multi-role job: each pod of each role) its own GPUs
            out.append(free[at:at + count])
            at += count
        return out

    def _launch_node(self, attempt, directory: Path, meta: dict, node: int, argv: list[str]) -> None:
        """Start node ``node``'s supervisor if this call wins its claim file; a lost claim means it started elsewhere."""
        claim = node_path(directory, node, "claim")
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        try:
            with open(node_path(directory, node, "log"), "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "runners.local.launcher", "--attempt-dir", str(directory),
                     "--node", str(node), "--max-runtime", str(attempt.job.max_runtime_seconds or 0),
                     "--grace", str(settings.LOCAL_RUNNER_KILL_GRACE_SECONDS), "--", *argv],
                    cwd=settings.BASE_DIR, env=node_env(attempt, meta, node), stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                )
        except BaseException:
            os.close(fd)
            claim.unlink(missing_ok=True)  # so a retry can launch it
            raise
        # The supervisor outlives us if this worker stops; while we live, reap it so it leaves no zombie.
        threading.Thread(target=proc.wait, name=f"reap-{attempt.object_name}-{node}", daemon=True).start()
        ref = ref_of(proc.pid) or ProcessRef(proc.pid, 0, boot_id())
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps({"supervisor": ref.to_json(), "launched_at": time.time(), "dispatcher_pid": os.getpid()}))

    def _runner_state(self, directory: Path, meta: dict, conf: dict | None = None) -> dict:
        pids = []
        for node in range(meta["nodes"]):
            deadline = time.monotonic() + 2.0  # a concurrent dispatcher may still be writing its claim
            while True:
                ref = ProcessRef.from_json((read_json(node_path(directory, node, "claim")) or {}).get("supervisor"))
                if ref is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            pids.append(ref.pid if ref else None)
        devices = meta.get("devices")
        roles = {r["name"]: {"pods": list(range(r["first"], r["first"] + r["count"])),
                             "addresses": [f"127.0.0.1:{node_port(meta, n)}"
                                           for n in range(r["first"], r["first"] + r["count"])]
                             if r.get("port") is not None else []}
                 for r in meta.get("roles") or ()}
        return {
            **({"roles": roles} if roles else {}),
            "attempt_dir": str(directory), "master_port": meta["master_port"],
            "ports": [node_port(meta, n) for n in range(meta["nodes"])],
            "endpoint": endpoint_url(conf) if conf else None,
            **({"replicas": replica_addresses(meta), "retired": list(meta.get("retired") or ()),
                "endpoint_metrics_url": metrics_url(conf)} if conf else {}),
            "nodes": meta["nodes"], "pids": pids,
            "logs": [str(node_path(directory, n, "log")) for n in range(meta["nodes"])],
            "cuda_visible_devices": None if devices is None else [",".join(map(str, d)) for d in devices],
            **({"gpu_share": meta["share"]} if meta.get("share") else {}),
            "metrics_url": f"http://127.0.0.1:{meta['metrics_port']}/metrics" if meta.get("metrics_port") else None,
        }

    # --- observation -------------------------------------------------------------------------------------------

    def observe(self, cluster, attempts: Iterable) -> dict[int, Observation]:
        """One look at the run directory and ``/proc`` for ``attempts``; an Observation per attempt id.

        Phases: ``absent`` (no attempt directory), ``pending`` (not every
        node's command started), ``running``, ``succeeded`` (every node exited
        0), ``failed`` (a node exited non-zero: ``Failed`` with its code; ran
        past max_runtime: ``DeadlineExceeded``; killed by SIGKILL:
        ``OOMKilled``; by another signal: ``Failed`` with 128 + the signal)
        and ``lost`` (a supervisor died without an exit record: ``NodeLost``;
        terminated from outside the control plane: ``Evicted``). On
        ``failed`` or ``lost`` the attempt's other nodes are stopped at once
        (SIGTERM to their groups; their supervisors escalate to SIGKILL), so a
        half-dead distributed job does not keep running.
        """
        table = proc_table()
        now = time.time()
        result = {}
        for attempt in attempts:
            directory = attempt_dir(attempt)
            if not directory.is_dir():
                result[attempt.pk] = ABSENT
                continue
            meta = read_json(directory / ATTEMPT_FILE) or {}
            nodes = meta.get("nodes") or attempt.job.nodes
            retired = set(meta.get("retired") or ())  # a scale-down's: their end is no end of the attempt
            probation = set(meta.get("rollout_pods") or ())  # a rollout's new replicas: the rollout judges them
            statuses = [read_node(directory, node, table, now) for node in range(nodes)
                        if node not in retired and node not in probation]
            stop = read_json(directory / STOP_FILE)
            lost: tuple[LostReplica, ...] = ()
            if attempt.job.kind == "inference" and stop is None and meta and not meta.get("roles"):
                statuses, lost = lost_replicas(statuses, attempt.job.nodes)
            obs = summarise(statuses, stop.get("reason") if stop else None, meta.get("roles"))
            if attempt.job.kind == "inference" and stop is None and meta and not live_pods(meta):
                obs = Observation("running")  # scaled to zero: it runs on, holding no GPU, until a request comes
            if lost:
                obs = dataclasses.replace(obs if statuses else Observation("pending"), lost_replicas=lost)
            if obs.phase in ("failed", "lost"):
                self._stop_nodes(directory, statuses, table, reason=f"{obs.end_reason}: {obs.message}")
            elif obs.phase == "succeeded" and meta.get("roles"):
                # every role with completion succeeded: the servers (roles without completion) are stopped
                self._stop_nodes(directory, statuses, table, reason="every role with completion succeeded")
            if attempt.job.kind == "inference" and meta:
                self._follow_endpoint(attempt, meta, obs.phase)
            result[attempt.pk] = obs
        return result

    def _follow_endpoint(self, attempt, meta: dict, phase: str) -> None:
        """Keep a serving attempt's endpoint with it: while it starts or runs, its proxy runs (started again if it
        died) over its live replicas; once it ended, the endpoint lists none (``runners.local.serving``)."""
        try:
            if phase in ("pending", "running"):
                self._endpoint(attempt, meta)
            else:
                clear_replicas(attempt.job_id, attempt.object_name)
        except OSError:
            log.warning("endpoint of %s: cannot follow it", attempt.object_name, exc_info=True)

    def _stop_nodes(self, directory: Path, statuses: list[NodeStatus], table: dict[int, ProcInfo], reason: str) -> bool:
        """Write the stop marker and signal every live node: SIGTERM to supervised groups, SIGKILL to unsupervised ones.

        Returns True when some process was signalled.
        """
        create_exclusive(directory / STOP_FILE, {"reason": reason, "at": time.time()})
        sent = False
        for status in statuses:
            if not status.live_pids(table):
                continue
            supervised = status.supervisor is not None and status.supervisor.alive(table)
            sig = signal.SIGTERM if supervised else signal.SIGKILL
            if status.supervisor is not None:
                sent |= signal_group(status.supervisor, sig, table)
            sent |= signal_process(status.child, sig, table)
        return sent

    def owned_attempt_ids(self, cluster) -> set[int | str]:
        """Keys (``attempt_key``: uid, or id of an attempt made before uids) of attempts of ``cluster`` with any
        live process (supervisor, command, or what it forked). Directories are named after the attempt's
        object name, which holds part of its uid, so a restored database's attempts never share one."""
        table = proc_table()
        owned = set()
        for directory, meta in _attempt_dirs():
            if meta.get("cluster_id") not in (None, cluster.pk):
                continue
            if _live_pids(directory, meta.get("nodes") or 0, table):
                owned.add(meta.get("uid") or meta["attempt_id"])
        return owned

    # --- deletion and logs -------------------------------------------------------------------------------------

    def delete(self, attempt) -> bool:
        """Stop every process of ``attempt``; True once none is left (also when nothing existed).

        Sends SIGTERM to each node's group (each supervisor records a cancel,
        waits ``LOCAL_RUNNER_KILL_GRACE_SECONDS`` and kills what is left),
        waits up to that grace + 2 s, then sends SIGKILL to the groups and
        waits up to 2 s more. Blocks at most about grace + 4 seconds.
        """
        directory = attempt_dir(attempt)
        if not directory.is_dir():
            return True
        meta = read_json(directory / ATTEMPT_FILE) or {}
        nodes = meta.get("nodes") or attempt.job.nodes
        create_exclusive(directory / STOP_FILE, {"reason": "deleted", "at": time.time()})
        job = attempt.job
        if job.kind == "inference":
            clear_replicas(attempt.job_id, attempt.object_name)  # the endpoint stops sending it requests first
            if job.is_final or job.state == "CANCELLING":
                stop_proxy(job.pk, signal.SIGTERM)  # no attempt of the job will follow: its endpoint goes too
        grace = float(settings.LOCAL_RUNNER_KILL_GRACE_SECONDS)
        statuses = self._statuses(directory, nodes)
        for status in statuses:
            if status.supervisor is not None:
                signal_group(status.supervisor, signal.SIGTERM)
            signal_process(status.child, signal.SIGTERM)
        if self._wait_gone(directory, nodes, grace + 2.0):
            return True
        for status in self._statuses(directory, nodes):
            if status.supervisor is not None:
                signal_group(status.supervisor, signal.SIGKILL)
            signal_process(status.child, signal.SIGKILL)
        return self._wait_gone(directory, nodes, 2.0)

    def _statuses(self, directory: Path, nodes: int) -> list[NodeStatus]:
        table, now = proc_table(), time.time()
        return [read_node(directory, node, table, now) for node in range(nodes)]

    def _wait_gone(self, directory: Path, nodes: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not _live_pids(directory, nodes, proc_table()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def logs(self, attempt, node: int = 0, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of ``node-<node>.log`` of ``attempt`` ("" when there is no log). A serving
        attempt's ``node`` counts its live pods only (``live_pods``: the replicas serving now, in the order they
        started), so after a rolling update, a replacement or a scale-down node 0 is a replica that serves, not one
        retired; "" past the last."""
        directory = attempt_dir(attempt)
        if attempt.job.kind == "inference":
            meta = read_json(directory / ATTEMPT_FILE)
            live = live_pods(meta) if meta else [node]
            if node >= len(live):
                return ""
            node = live[node]
        return tail(node_path(directory, node, "log"), tail_lines)


def _cpu_threads(spec: dict | None) -> int | None:
    """The threads of a CPU-only job's node (or a role's pod: ``spec`` is then the role): its ``resources.cpu``
    cores rounded up (at least 1), for ``OMP_NUM_THREADS``; None for a job with GPUs or without ``cpu``."""
    resources = (spec or {}).get("resources") or {}
    cpu = resources.get("cpu")
    if resources.get("gpus_per_node") or isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or cpu <= 0:
        return None
    return max(1, math.ceil(cpu))


def _peak_tflops(attempt) -> str | None:
    """The peak dense BF16 TFLOP/s per GPU of the attempt's accelerator (``runners.Accelerator.peak_bf16_tflops``,
    from the catalog), as text; None when the catalog has none."""
    peak = getattr(attempt.node_pool.accelerator, "peak_bf16_tflops", None)
    return str(peak) if peak else None


def _live_pids(directory: Path, nodes: int, table: dict[int, ProcInfo]) -> list[int]:
    """Every live pid of the attempt in ``directory`` (all its nodes)."""
    now = time.time()
    return [pid for node in range(nodes) for pid in read_node(directory, node, table, now).live_pids(table)]


def held_shares(cluster_id: int) -> list[Share]:
    """The shares of GPUs held on cluster ``cluster_id`` by attempts that have not ended: every node of the
    attempt's ``attempt.json`` still starting or running (a share is held from its dispatch, before its process
    runs, so two dispatches never pick the same device)."""
    table, now, held = proc_table(), time.time(), []
    for directory, meta in _attempt_dirs():
        share = Share.from_json(meta.get("share"))
        if share is None or meta.get("cluster_id") != cluster_id:
            continue
        states = [read_node(directory, n, table, now).state for n in range(meta.get("nodes") or 1)]
        if any(state in ("waiting", "running") for state in states):
            held.append(share)
    return held


def _attempt_dirs() -> list[tuple[Path, dict]]:
    """``(directory, attempt.json)`` of every attempt directory under the run directory."""
    root = run_dir()
    if not root.is_dir():
        return []
    found = []
    for entry in os.scandir(root):
        if entry.is_dir():
            meta = read_json(Path(entry.path) / ATTEMPT_FILE)
            if meta is not None and isinstance(meta.get("attempt_id"), int):
                found.append((Path(entry.path), meta))
    return found


def tail(path: Path, lines: int, block: int = 8192) -> str:
    """The last ``lines`` lines of the text file ``path``, read backwards in ``block``-byte steps ("" if missing)."""
    if lines <= 0:
        return ""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return ""
    with fh:
        end = fh.seek(0, os.SEEK_END)
        data = b""
        pos = end
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    text = data.decode("utf-8", "replace")
    keep = text.splitlines(keepends=True)[-lines:]
    return "".join(keep)


register(LocalBackend())
