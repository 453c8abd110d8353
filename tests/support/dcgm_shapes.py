"""Small DCGM scenarios for the accounting tests: every label shape, gaps across midnight, boundary samples.

Each scenario is one attempt on its own cluster (a ``cluster`` label in one
shared Prometheus) with its scrapes listed explicitly, so tests compute the
expected samples, observed, idle and unobserved GPU-hours from them
(``tests.support.lookback``).
The OpenMetrics text is what dcgm-exporter and kube-state-metrics would
have written (``docs/reference/metrics.md``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from datetime import UTC

DAY0 = dt.datetime(2026, 4, 6, tzinfo=UTC)
STEP = 60
IDLE_PERCENT = 5.0
LOOKBACK = 300  # Prometheus' default --query.lookback-delta, seconds
H = dt.timedelta(hours=1)


@dataclasses.dataclass
class Scenario:
    name: str  # also the cluster and the team slug
    shape: str  # pod | exported_pod | host
    metric: str  # DCGM_FI_DEV_GPU_UTIL (percent) or DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio)
    start: dt.datetime
    end: dt.datetime
    gpus: int
    # per GPU index: [(unix seconds, utilization percent)], including scrapes outside the run
    scrapes: dict
    host: str = "node-a"
    host_gpus: int = 8  # GPUs on the host; the attempt holds GPUs 0..gpus-1
    gpu_uuids: tuple = ()  # recorded by the runner (host shape with a partial node)
    host_label: str = "Hostname"

    @property
    def pod(self) -> str:
        return f"{self.object_name}-0-7b9be"

    @property
    def object_name(self) -> str:
        return f"job-{self.name}-1"

    def uuid(self, gpu: int) -> str:
        return f"GPU-{self.name}-{gpu}"

    def instants(self) -> tuple[float, float]:
        """(observed, idle) GPU-seconds of the attempt's GPUs inside its run, measured at instants
        (``lookback.instants``)."""
        from .lookback import instants

        counts = [instants(series, self.start.timestamp(), self.end.timestamp(), STEP, LOOKBACK, IDLE_PERCENT)
                  for series in self.scrapes.values()]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def inside(self, lo: dt.datetime | None = None, hi: dt.datetime | None = None) -> list[float]:
        """Utilization of every scrape of the attempt's GPUs inside its run (and ``[lo, hi)``)."""
        a = max(self.start, lo or self.start).timestamp()
        b = min(self.end, hi or self.end).timestamp()
        return [u for series in self.scrapes.values() for t, u in series if a <= t < b]


def minutes(start: dt.datetime, end: dt.datetime, value: float, offset: int = 7) -> list[tuple[float, float]]:
    """One scrape per minute at second ``offset`` in ``[start, end)``."""
    t = int(start.timestamp()) // STEP * STEP + offset
    if t < start.timestamp():
        t += STEP
    out = []
    while t < end.timestamp():
        out.append((t, value))
        t += STEP
    return out


def gapped(name: str, start: dt.datetime) -> Scenario:
    """1 GPU for 14 h: 1 h at 100 %, 10 h with no samples, 3 h at 0 %; the series lingers 10 min at 0 % after."""
    end = start + 14 * H
    scrapes = minutes(start, start + H, 100.0) + minutes(start + 11 * H, end + dt.timedelta(minutes=10), 0.0)
    return Scenario(name, "pod", "DCGM_FI_DEV_GPU_UTIL", start, end, 1, {0: scrapes})


def scenarios() -> list[Scenario]:
    boundary_start = DAY0 + dt.timedelta(hours=10)  # scrapes at :00 exactly: one on the start, one on the end
    boundary = [(boundary_start.timestamp() + 60 * i, 0.0 if i in (0, 59, 60) else 50.0) for i in range(-1, 62)]
    exported_start = DAY0 + dt.timedelta(hours=3, seconds=30)
    host_start = DAY0 + dt.timedelta(hours=6, seconds=30)
    partial = {g: minutes(host_start, host_start + 2 * H, 2.0 if g == 0 else 40.0 + g) for g in range(8)}
    return [
        gapped("midnight", DAY0 + dt.timedelta(hours=18, seconds=30)),  # crosses UTC midnight
        gapped("daytime", DAY0 + dt.timedelta(hours=5, seconds=30)),  # the same run inside one day
        Scenario("boundary", "pod", "DCGM_FI_DEV_GPU_UTIL", boundary_start, boundary_start + H, 1, {0: boundary}),
        Scenario("exported", "exported_pod", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", exported_start, exported_start + 2 * H, 2,
                 {g: minutes(exported_start - dt.timedelta(minutes=3), exported_start + 2 * H, 60.0 + g * 10)
                  for g in range(2)}),
        Scenario("wholehost", "host", "DCGM_FI_DEV_GPU_UTIL", host_start, host_start + 2 * H, 8,
                 {g: minutes(host_start, host_start + 2 * H + dt.timedelta(minutes=30), 30.0 + g) for g in range(8)},
                 host="node-w", host_label="hostname"),
        Scenario("partialhost", "host", "DCGM_FI_DEV_GPU_UTIL", host_start, host_start + 2 * H, 2,
                 {g: partial[g] for g in (0, 1)}, host="node-p", gpu_uuids=("GPU-partialhost-0", "GPU-partialhost-1")),
    ]


def _labels(**kv) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kv.items()) + "}"


def openmetrics(items: list[Scenario], namespace_prefix: str = "cp-") -> str:
    """The scrapes of ``items`` as OpenMetrics text, one ``cluster`` label per scenario, ending with ``# EOF``."""
    families: dict[str, list[str]] = {"DCGM_FI_DEV_GPU_UTIL": [], "DCGM_FI_PROF_GR_ENGINE_ACTIVE": [],
                                      "kube_pod_container_resource_requests": []}
    for s in items:
        ns = f"{namespace_prefix}{s.name}"
        extra_gpus = {}
        if s.shape == "host" and s.name == "partialhost":  # the other 6 GPUs of the node run someone else's pod
            extra_gpus = {g: minutes(s.start, s.end, 90.0) for g in range(2, s.host_gpus)}
        for g, series in {**s.scrapes, **extra_gpus}.items():
            base = {"gpu": g, "UUID": s.uuid(g), s.host_label: s.host, "modelName": "NVIDIA H100 80GB HBM3"}
            if s.shape == "pod":
                base.update(container="main", namespace=ns, pod=s.pod)
            elif s.shape == "exported_pod":
                base.update(container="nvidia-dcgm-exporter", namespace="gpu-operator", pod="nvidia-dcgm-exporter-x7k2p",
                            exported_container="main", exported_namespace=ns, exported_pod=s.pod)
            labels = _labels(**base, cluster=s.name)
            for t, util in series:
                value = f"{util / 100:.4f}" if s.metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" else f"{util:g}"
                families[s.metric].append(f"{s.metric}{labels} {value} {t:.3f}")
        req = _labels(namespace=ns, pod=s.pod, container="main", node=s.host, resource="nvidia_com_gpu",
                      unit="integer", cluster=s.name)
        for t, _ in minutes(s.start - dt.timedelta(minutes=2), s.end + dt.timedelta(minutes=3), 0):
            families["kube_pod_container_resource_requests"].append(
                f"kube_pod_container_resource_requests{req} {s.gpus} {t:.3f}")
    out = []
    for name, lines in families.items():
        if lines:
            out.append(f"# TYPE {name} gauge")
            out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"
