"""A dcgm-exporter and kube-state-metrics look-alike for the local runner, so its jobs have utilization like any cluster's.

Serves, on ``LOCAL_METRICS_PORT`` (9400, dcgm-exporter's port), per GPU:

* ``DCGM_FI_DEV_GPU_UTIL`` (percent) and ``DCGM_FI_DEV_FB_USED`` (MiB) with
  dcgm-exporter's labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
  ``modelName``, ``Hostname``, plus ``namespace``, ``pod``, ``container`` on
  the GPUs a live attempt uses. The namespace is the team's
  (``core.namespaces.team_namespace``) and the pod is
  ``<attempt object name>-<node>``, or for a multi-role attempt
  ``<attempt object name>-<role>-<index in the role>``
  (``costs.prometheus.role_pod_name``), so ``costs.collection`` maps the series
  to the attempt, and to the role, exactly as it maps a Kubernetes pod;
* ``kube_pod_container_resource_requests{resource="nvidia_com_gpu",unit="integer"}``,
  ``kube_pod_status_phase{phase=...}`` and ``kube_pod_info{node=...}`` (every
  pod bound to this machine) per node ("pod") of each live attempt, so the
  ledger check (``costs.ledgercheck.check_ledger``) works.

With NVIDIA GPUs the values come from NVML; an attempt's GPUs are the
indices its ``attempt.json`` holds. With **emulated** GPUs (no NVIDIA GPU on
the machine) this is an emulation: the cluster's GPUs are numbered
``0 .. LOCAL_RUNNER_EMULATED_GPUS-1``, the live attempts take them in id order,
and a GPU's utilization is the CPU usage of its node's processes (the
supervisor's process group and the command, from ``utime + stime`` of
``/proc/<pid>/stat``) in percent of one core, capped at 100; its memory used is
their resident memory divided among the node's GPUs. CPU usage is the rate
since the previous scrape, or the process' lifetime average at its first one.

**Shared GPUs** (``LOCAL_RUNNER_SHARED_NODES``, ``runners.local.sharing``; ADR 0040) are reported
as dcgm-exporter reports them, per physical GPU or MIG instance, with ``Hostname`` their node's
name: a time-sliced GPU has one series per pod holding a slice of it, each with the GPU's
value (the CPU use of all of them, capped at 100; their memory summed), or one without pod
labels when none does; a GPU cut into MIG devices has one series per device, labelled
``GPU_I_PROFILE`` and ``GPU_I_ID`` (its GPU instance id), with the pod labels of the pod that
holds it, its value that pod's. Their pods request ``nvidia_com_gpu`` 1 (a slice) or
``nvidia_com_mig_<profile>`` 1 (dots as underscores), as kube-state-metrics names them.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from django.conf import settings
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily

from .layout import ATTEMPT_FILE, read_json
from .procs import PROC, proc_table
from .runner import attempt_dir, read_node, role_of
from .sharing import MachineGpu, MigInstance, Share, machine_gpus

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024
CONTAINER = "main"
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
#: dcgm-exporter's labels of a MIG device's series: its profile and GPU instance id.
MIG_LABELS = ["GPU_I_PROFILE", "GPU_I_ID"]
POD_LABELS = ["namespace", "pod", "container"]


@dataclasses.dataclass
class PodView:
    """One node of a live attempt, as a pod: namespace, pod name, its GPU indices and its live pids."""

    attempt_id: int
    node: int
    namespace: str
    pod: str
    gpus: list[int]
    pids: list[int]
    running: bool
    share: Share | None = None  # where its share sits, for a pod on part of a GPU

    @property
    def gpu_resource(self) -> str:
        """kube-state-metrics' name of the GPU resource it requests: ``nvidia_com_gpu`` (whole GPUs or a slice),
        ``nvidia_com_mig_<profile>`` for a MIG device (``.`` and ``-`` as ``_``)."""
        if self.share is not None and self.share.profile:
            return "nvidia_com_mig_" + self.share.profile.replace(".", "_").replace("-", "_")
        return "nvidia_com_gpu"

    @property
    def uid(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"controlplane-local/{self.namespace}/{self.pod}"))


def cpu_times(pid: int) -> tuple[int, int, int] | None:
    """``(start ticks, utime + stime ticks, rss pages)`` of ``pid`` from ``/proc/<pid>/stat``; None if it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # fields[0] is field 3 of proc(5)
    try:
        return int(fields[19]), int(fields[11]) + int(fields[12]), int(fields[21])
    except (IndexError, ValueError):
        return None


def _text(value) -> str:
    """An NVML string as text: older NVML bindings return bytes, newer ones str."""
    return value.decode() if isinstance(value, bytes) else value


def uptime_seconds() -> float:
    return float((PROC / "uptime").read_text().split()[0])


class CpuMeter:
    """CPU usage of sets of processes, in cores (1.0 = one core busy), between two calls for the same key."""

    def __init__(self):
        self._last: dict[object, tuple[float, dict[tuple[int, int], int]]] = {}
        self._lock = threading.Lock()

    def measure(self, key, pids: list[int]) -> tuple[float, int]:
        """``(cores, rss bytes)`` of ``pids``: per process the rate since the last call for ``key``, or its lifetime
        average when it was not seen then."""
        now, uptime = time.monotonic(), uptime_seconds()
        with self._lock:
            previous = self._last.get(key)
            seen: dict[tuple[int, int], int] = {}
            cores, rss = 0.0, 0
            for pid in pids:
                times = cpu_times(pid)
                if times is None:
                    continue
                start, ticks, pages = times
                seen[(pid, start)] = ticks
                rss += pages * PAGE_SIZE
                if previous is not None and (pid, start) in previous[1] and now > previous[0]:
                    cores += (ticks - previous[1][(pid, start)]) / CLK_TCK / (now - previous[0])
                else:
                    age = uptime - start / CLK_TCK
                    cores += ticks / CLK_TCK / age if age > 0 else 0.0
            self._last[key] = (now, seen)
            return max(0.0, cores), rss

    def forget_except(self, keys: set) -> None:
        with self._lock:
            for key in set(self._last) - keys:
                del self._last[key]


def live_pods(cluster_id: int | None = None) -> list[PodView]:
    """A PodView per node of every started, not ended attempt holding GPUs on a local cluster (``cluster_id``: only
    that one); CPU-only attempts hold no GPU and are left out. A multi-role attempt's pod is named by its role
    and holds its role's GPUs (``attempt.json``'s ``roles``)."""
    from core.namespaces import team_namespace
    from costs.prometheus import role_pod_name
    from jobs.models import JobAttempt
    from runners.models import Cluster

    qs = JobAttempt.objects.filter(cluster__backend=Cluster.Backend.LOCAL, started_at__isnull=False,
                                   ended_at__isnull=True, gpus__gt=0).select_related("job__team", "cluster").order_by("pk")
    if cluster_id is not None:
        qs = qs.filter(cluster_id=cluster_id)
    table, now = proc_table(), time.time()
    pods, next_emulated = [], 0
    shared = {(g.node, g.on_node): g.index for g in emulated_layout() if g.node}
    for attempt in qs:
        directory = attempt_dir(attempt)
        meta = read_json(directory / ATTEMPT_FILE) or {}
        nodes = meta.get("nodes") or attempt.job.nodes
        share = Share.from_json(meta.get("share"))
        if share is not None:  # a pod on part of a GPU: the physical GPU of its node that holds its share
            status = read_node(directory, 0, table, now)
            gpu = shared.get((share.node, share.gpu))
            pods.append(PodView(attempt.pk, 0, team_namespace(attempt.job.team.slug), f"{attempt.object_name}-0",
                                [] if gpu is None else [gpu], status.live_pids(table), status.state == "running",
                                share))
            continue
        per_node = max(1, attempt.gpus // max(1, nodes))
        for node in range(nodes):
            role = role_of(meta, node)
            count = per_node if role is None else int(role["gpus"])
            devices = meta.get("devices")
            if devices and node < len(devices):
                gpus = list(devices[node])
            else:  # emulated: consecutive GPU numbers in attempt order
                gpus = list(range(next_emulated, next_emulated + count))
                next_emulated += count
            status = read_node(directory, node, table, now)
            pod = (f"{attempt.object_name}-{node}" if role is None
                   else role_pod_name(attempt.object_name, role["name"], node - role["first"]))
            pods.append(PodView(attempt.pk, node, team_namespace(attempt.job.team.slug), pod, gpus,
                                status.live_pids(table), status.state == "running"))
    return pods


def emulated_layout() -> list[MachineGpu]:
    """The emulated cluster's GPUs on this machine: ``LOCAL_RUNNER_EMULATED_GPUS`` whole ones, then the shared nodes'
    (``sharing.machine_gpus``); none of the shared nodes when their configuration cannot be read."""
    from .capacity import shared_nodes
    from .sharing import SharedNodesError

    try:
        nodes = shared_nodes()
    except SharedNodesError:
        nodes = []
    return machine_gpus(int(settings.LOCAL_RUNNER_EMULATED_GPUS), nodes)


@dataclasses.dataclass
class GpuReading:
    """One GPU as the exporter reports it: index on this machine, UUID, PCI bus id, model, utilization (percent) and
    memory used (MiB), None when read from the processes (emulated); for an emulated shared GPU its ``node`` (its
    ``Hostname``), its node's ``sharing`` mode and its MIG ``instances``."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str
    util_percent: float | None  # None: read from the processes (emulated)
    fb_used_mib: float | None
    node: str = ""
    sharing: str = "none"
    instances: tuple[MigInstance, ...] = ()


def nvml_gpus() -> list[GpuReading]:
    """Every NVIDIA GPU's utilization and memory used now through NVML; [] without driver or GPU."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 (ImportError, NVMLError: no driver, no library)
        return []
    try:
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            readings.append(GpuReading(
                index, _text(pynvml.nvmlDeviceGetUUID(handle)), _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                _text(pynvml.nvmlDeviceGetName(handle)), float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                pynvml.nvmlDeviceGetMemoryInfo(handle).used / MIB,
            ))
        return readings
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def emulated_gpus(hostname: str) -> list[GpuReading]:
    """The emulated GPUs (``LOCAL_RUNNER_EMULATED_GPUS`` of ``LOCAL_RUNNER_ACCELERATOR``, then the shared nodes':
    ``emulated_layout``); values come from processes."""
    model = f"{settings.LOCAL_RUNNER_ACCELERATOR} (emulated)"
    return [GpuReading(g.index, f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{hostname}.emulated-gpu-{g.index}')}",
                       f"00000000:{g.index:02X}:00.0", model, None, None, g.node, g.sharing, g.instances)
            for g in emulated_layout()]


class LocalGpuCollector:
    """The prometheus_client collector of the exporter (see the module docstring)."""

    def __init__(self, hostname: str | None = None, gpus=None, pods=None):
        self.hostname = hostname or socket.gethostname()
        self._gpus = gpus or (lambda: nvml_gpus() or emulated_gpus(self.hostname))
        self._pods = pods or live_pods
        self.meter = CpuMeter()

    def describe(self):
        return []

    def collect(self):
        gpus = self._gpus()
        pods = self._pods()
        by_gpu: dict[int, list[PodView]] = {}
        for pod in pods:
            for g in pod.gpus:
                by_gpu.setdefault(g, []).append(pod)
        usage = {}
        for pod in pods:
            usage[pod.pod] = self.meter.measure(pod.pod, pod.pids)
        self.meter.forget_except(set(usage))

        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=GPU_LABELS + POD_LABELS)
        fb = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=GPU_LABELS + POD_LABELS)
        other_util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=GPU_LABELS)
        other_fb = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=GPU_LABELS)

        def emit(labels: list[str], extra: dict[str, str], holders: list[PodView], u: float, m: float) -> None:
            """One series per pod in ``holders`` (none: one without pod labels, as dcgm-exporter), ``extra`` labels
            (a MIG device's) after the GPU's."""
            for pod in holders or [None]:
                names = GPU_LABELS + list(extra) + (POD_LABELS if pod else [])
                values = labels + list(extra.values()) + ([pod.namespace, pod.pod, CONTAINER] if pod else [])
                (util if pod else other_util).samples.append(_sample("DCGM_FI_DEV_GPU_UTIL", names, values, u))
                (fb if pod else other_fb).samples.append(_sample("DCGM_FI_DEV_FB_USED", names, values, m))

        for gpu in gpus:
            labels = [str(gpu.index), gpu.uuid, gpu.pci_bus_id, f"nvidia{gpu.index}", gpu.model,
                      gpu.node or self.hostname]
            holders = by_gpu.get(gpu.index, [])
            if gpu.instances:  # cut into MIG devices: one series per device, its holder's
                for device in gpu.instances:
                    mine = [p for p in holders if p.share and p.share.instance == device.instance]
                    cores, rss = usage[mine[0].pod] if mine else (0.0, 0)
                    emit(labels, {"GPU_I_PROFILE": device.profile, "GPU_I_ID": str(device.instance)}, mine,
                         min(100.0, 100.0 * cores), rss / MIB)
                continue
            u, m = gpu.util_percent, gpu.fb_used_mib
            if u is None:  # emulated: its pods' CPU usage, percent of one core, capped at 100
                cores = sum(usage[p.pod][0] for p in holders)
                u = min(100.0, 100.0 * cores)
                m = sum(usage[p.pod][1] / MIB / len(p.gpus) for p in holders)
            emit(labels, {}, holders, u, m)
        # The text format allows one family per name: merge the samples with and without pod labels.
        util.samples += other_util.samples
        fb.samples += other_fb.samples
        yield util
        yield fb

        requests = GaugeMetricFamily("kube_pod_container_resource_requests",
                                     "The number of requested request resource by a container.",
                                     labels=["namespace", "pod", "uid", "container", "node", "resource", "unit"])
        phase = GaugeMetricFamily("kube_pod_status_phase", "The pods current phase.",
                                  labels=["namespace", "pod", "uid", "phase"])
        info = GaugeMetricFamily("kube_pod_info", "Information about pod.", labels=["namespace", "pod", "uid", "node"])
        for pod in pods:
            requests.add_metric([pod.namespace, pod.pod, pod.uid, CONTAINER, pod.share.node if pod.share else self.hostname,
                                 pod.gpu_resource, "integer"], len(pod.gpus))
            for name in ("Pending", "Running"):
                phase.add_metric([pod.namespace, pod.pod, pod.uid, name], float((name == "Running") == pod.running))
            info.add_metric([pod.namespace, pod.pod, pod.uid, pod.share.node if pod.share else self.hostname], 1.0)
        yield requests
        yield phase
        yield info


def _sample(name: str, labels: list[str], values: list[str], value: float):
    """A prometheus_client sample of ``name`` with its own label set (a family's samples may differ in labels)."""
    from prometheus_client.samples import Sample

    return Sample(name, dict(zip(labels, values, strict=True)), value)


class _ClosingCollector:
    """Runs the inner collector, then closes this thread's database connections (the HTTP server's threads)."""

    def __init__(self, inner):
        self.inner = inner

    def describe(self):
        return []

    def collect(self):
        from django.db import connections

        try:
            yield from self.inner.collect()
        finally:
            connections.close_all()


def render(collector: LocalGpuCollector) -> str:
    """The exposition text of ``collector`` now (what a scrape returns)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


class Exporter:
    """The exporter's HTTP server in a thread of this process: ``start()``, ``url``, ``stop()``."""

    def __init__(self, port: int | None = None, addr: str | None = None, collector: LocalGpuCollector | None = None):
        self.port = settings.LOCAL_METRICS_PORT if port is None else port
        self.addr = addr or settings.LOCAL_METRICS_ADDR
        self.collector = collector or LocalGpuCollector()
        self._server = None

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def start(self) -> Exporter:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_ClosingCollector(self.collector))
        self._server, _thread = start_http_server(self.port, addr=self.addr, registry=registry)
        self.port = self._server.server_address[1]  # the kernel's pick when port was 0
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


PROMETHEUS_CONFIG = """\
global:
  scrape_interval: {interval}s
  evaluation_interval: {interval}s
scrape_configs:
  - job_name: local-gpu
    static_configs:
      - targets: ["{exporter}"]
{extra}"""


def prometheus_config(exporter_target: str, interval: float, platform_target: str | None = None) -> str:
    """A prometheus.yml scraping the exporter (and the platform's ``/metrics`` if given) every ``interval`` s."""
    extra = ""
    if platform_target:
        extra = (f"  - job_name: controlplane\n    static_configs:\n      - targets: [\"{platform_target}\"]\n")
    interval_text = f"{interval:g}"
    return PROMETHEUS_CONFIG.format(interval=interval_text, exporter=exporter_target, extra=extra)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Monitoring:
    """The exporter plus a Prometheus from PATH scraping it; what ``make demo`` starts when ``prometheus`` exists."""

    def __init__(self, prometheus: str, workdir: Path, interval: float = 5.0, exporter_port: int | None = None,
                 platform_port: int | None = None):
        self.binary, self.workdir, self.interval = prometheus, Path(workdir), interval
        self.exporter = Exporter(port=exporter_port)
        self.platform_port = platform_port
        self.port = free_port()
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout: float = 30.0) -> Monitoring:
        import subprocess
        import urllib.request

        self.exporter.start()
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(prometheus_config(f"{self.exporter.addr}:{self.exporter.port}", self.interval,
                                            self.platform_port and f"127.0.0.1:{self.platform_port}"))
        with open(self.workdir / "prometheus.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=15d"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if urllib.request.urlopen(self.url + "/-/ready", timeout=1).status == 200:
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Prometheus did not become ready; see {self.workdir / 'prometheus.log'}")

    def stop(self) -> None:
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.exporter.stop()


# --- the demo (demo.run) ------------------------------------------------------------------------------

DEMO_SCRAPE_SECONDS = 5.0


def start_demo_monitoring(platform_port: int, out) -> Monitoring | None:
    """When ``prometheus`` is on PATH: start the exporter and a Prometheus (config and TSDB under
    ``var/prometheus``) scraping it every 5 s, and point the local cluster's ``prometheus_url`` at it.

    The readers' scrape interval (``COSTS_SCRAPE_INTERVAL_SECONDS``) is set to 5 s here and for the
    processes started afterwards. Returns None, writing why to ``out``, when it cannot start.
    """
    import shutil

    from .capacity import ensure_local_cluster

    binary = shutil.which("prometheus")
    if binary is None:
        return None
    monitoring = Monitoring(binary, Path(settings.VAR_DIR) / "prometheus", DEMO_SCRAPE_SECONDS,
                            platform_port=platform_port)
    try:
        monitoring.start()
    except (OSError, RuntimeError) as exc:
        where = (f" (the GPU exporter listens on {monitoring.exporter.addr}:{monitoring.exporter.port}: "
                 "LOCAL_METRICS_ADDR and LOCAL_METRICS_PORT; is another demo running?)") if isinstance(exc, OSError) else ""
        out.write(f"GPU metrics off: {exc}{where}\n")
        monitoring.stop()
        return None
    cluster = ensure_local_cluster()
    cluster.prometheus_url = monitoring.url
    cluster.save(update_fields=["prometheus_url"])
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = DEMO_SCRAPE_SECONDS
    os.environ["COSTS_SCRAPE_INTERVAL_SECONDS"] = str(DEMO_SCRAPE_SECONDS)
    out.write(f"Prometheus on {monitoring.url} scrapes the local GPU exporter {monitoring.exporter.url} "
              f"every {DEMO_SCRAPE_SECONDS:g} s.\n")
    return monitoring


def stop_demo_monitoring(monitoring: Monitoring | None) -> None:
    """Stop what ``start_demo_monitoring`` started and clear the local cluster's ``prometheus_url`` it set."""
    if monitoring is None:
        return
    from runners.models import Cluster

    Cluster.objects.filter(prometheus_url=monitoring.url).update(prometheus_url="")
    monitoring.stop()


def job_average_utilization(job_id: int) -> float | None:
    """Average GPU utilization (percent) of ``job_id``'s attempts, collected now into UtilizationRollup; None: no data."""
    from costs.collection import collect_utilization
    from costs.models import UtilizationRollup
    from jobs.models import JobAttempt

    attempts = list(JobAttempt.objects.filter(job_id=job_id, started_at__isnull=False).select_related("cluster"))
    if not attempts:
        return None
    start = min(a.started_at for a in attempts)
    try:
        collect_utilization(start, clusters=list({a.cluster for a in attempts}))
    except Exception:  # noqa: BLE001 (Prometheus unreachable or refusing: no data)
        return None
    samples = util = 0.0
    for rollup in UtilizationRollup.objects.filter(job_id=job_id):
        samples += rollup.samples
        util += rollup.util_sum
    return util / samples if samples else None
