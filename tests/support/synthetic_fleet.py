"""A synthetic GPU fleet for the costs tests: three clusters, 40 GPUs, three days, jobs starting and ending.

The generator is the ground truth: it knows every job's interval, GPUs and
per-sample utilization, writes the DCGM and kube-state-metrics series a
real exporter would (OpenMetrics text for ``promtool tsdb
create-blocks-from openmetrics``), and answers the expected numbers by
plain arithmetic over its own samples, independently of ``costs``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal
from itertools import pairwise

T0 = dt.datetime(2026, 3, 2, tzinfo=UTC)  # a Monday; long before "now", so blocks are immutable history
DAYS = 3
END = T0 + dt.timedelta(days=DAYS)
STEP = 60  # seconds between scrapes
SAMPLE_OFFSET = 7  # scrapes land at :07 of each minute; jobs start and end at :30
IDLE_PERCENT = 5.0
TEAMS = ("nlp", "vision", "speech")


@dataclasses.dataclass
class ClusterSpec:
    name: str
    provider: str
    region: str
    accelerator: str
    capacity_type: str
    nodes: int
    model_name: str
    util_metric: str  # DCGM_FI_DEV_GPU_UTIL (percent) or DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio)
    prices: list  # [(effective_from, Decimal USD per GPU-hour)], first at the catalog epoch
    global_prometheus: bool  # True: in the shared Prometheus under cluster=<name>; False: its own


CLUSTERS = [
    ClusterSpec("aws-east", "aws", "us-east-1", "H100-80GB", "on-demand", 2, "NVIDIA H100 80GB HBM3",
                "DCGM_FI_DEV_GPU_UTIL",
                [(dt.datetime(2025, 1, 1, tzinfo=UTC), Decimal("6.88")), (T0 + dt.timedelta(hours=36, minutes=17), Decimal("5.50"))],
                True),
    ClusterSpec("gcp-central", "gcp", "us-central1", "A100-80GB", "spot", 2, "NVIDIA A100-SXM4-80GB",
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE", [(dt.datetime(2025, 1, 1, tzinfo=UTC), Decimal("1.9035"))], True),
    ClusterSpec("oci-ash", "oci", "us-ashburn-1", "H100-80GB", "on-demand", 1, "NVIDIA H100 80GB HBM3",
                "DCGM_FI_DEV_GPU_UTIL", [(dt.datetime(2025, 1, 1, tzinfo=UTC), Decimal("4.00"))], False),
]
SLOTS = (4, 2, 1, 1)  # a node's 8 GPUs, shared by sequential jobs of these sizes


@dataclasses.dataclass
class JobSpec:
    n: int
    cluster: str
    team: str
    node: int
    first_gpu: int
    gpus: int
    start: dt.datetime
    end: dt.datetime
    idle: bool
    pod: str = ""
    # (unix seconds, utilization percent, memory MiB) per GPU, only scrapes that reached Prometheus
    samples: dict = dataclasses.field(default_factory=dict)

    @property
    def object_name(self) -> str:
        return f"job-{self.n}-1"


@dataclasses.dataclass
class Fleet:
    jobs: list
    rogue: JobSpec  # a pod on gcp-central the ledger never hears of
    dcgm_gaps: dict  # cluster -> [(start, end)] with no DCGM scrapes
    no_data_job: JobSpec

    def price_at(self, cluster: str, at: dt.datetime) -> Decimal:
        spec = next(c for c in CLUSTERS if c.name == cluster)
        return max((p for p in spec.prices if p[0] <= at), key=lambda p: p[0])[1]

    def cost(self, job: JobSpec, lo: dt.datetime, hi: dt.datetime) -> Decimal:
        """Exact USD of ``job`` within ``[lo, hi)``: GPUs x seconds / 3600 x price in force, split at changes."""
        lo, hi = max(lo, job.start), min(hi, job.end)
        if lo >= hi:
            return Decimal(0)
        spec = next(c for c in CLUSTERS if c.name == job.cluster)
        cuts = sorted({lo, hi} | {p[0] for p in spec.prices if lo < p[0] < hi})
        return sum((Decimal(job.gpus) * Decimal((b - a).total_seconds()) * self.price_at(job.cluster, a) / 3600
                    for a, b in pairwise(cuts)), Decimal(0))

    @staticmethod
    def cents(amount: Decimal) -> str:
        return str(amount.quantize(Decimal("0.01"), ROUND_HALF_EVEN))

    @staticmethod
    def gpu_hours(job: JobSpec, lo: dt.datetime, hi: dt.datetime) -> float:
        lo, hi = max(lo, job.start), min(hi, job.end)
        return max(0.0, (hi - lo).total_seconds()) * job.gpus / 3600

    def util_samples(self, job: JobSpec, lo: dt.datetime, hi: dt.datetime) -> list[float]:
        """Utilization samples (percent) of the job's GPUs scraped inside its run and ``[lo, hi)``."""
        a, b = max(lo, job.start).timestamp(), min(hi, job.end).timestamp()
        return [u for series in job.samples.values() for t, u, _ in series if a <= t < b]


def _minute(rng: random.Random, lo_h: float, hi_h: float) -> dt.timedelta:
    return dt.timedelta(minutes=rng.randint(int(lo_h * 60), int(hi_h * 60)))


def generate(seed: int = 5) -> Fleet:
    """Jobs back to back on every slot of every node, 3-14 h long, with gaps of 0-2 h; a fifth are idle."""
    rng = random.Random(seed)
    jobs: list[JobSpec] = []
    for spec in CLUSTERS:
        for node in range(spec.nodes):
            first_gpu = 0
            for slot_gpus in SLOTS:
                t = T0 + _minute(rng, 0, 2) + dt.timedelta(seconds=30)
                while True:
                    length = _minute(rng, 3, 14)
                    if spec.name == "oci-ash" and first_gpu == 0 and not any(j.cluster == "oci-ash" for j in jobs):
                        length = dt.timedelta(hours=2)  # the job the DCGM outage will hide entirely
                    if t + length > END - dt.timedelta(minutes=30):
                        break
                    jobs.append(JobSpec(len(jobs) + 1, spec.name, rng.choice(TEAMS), node, first_gpu, slot_gpus,
                                        t, t + length, idle=rng.random() < 0.2))
                    t += length + _minute(rng, 0, 2)
                first_gpu += slot_gpus
    no_data = next(j for j in jobs if j.cluster == "oci-ash")
    gaps = {
        "gcp-central": [(T0 + dt.timedelta(hours=20), T0 + dt.timedelta(hours=20, minutes=30))],
        "oci-ash": [(no_data.start - dt.timedelta(minutes=10), no_data.end + dt.timedelta(minutes=10))],
        "aws-east": [(T0 + dt.timedelta(hours=50, minutes=3), T0 + dt.timedelta(hours=50, minutes=9))],
    }
    rogue = JobSpec(0, "gcp-central", "nlp", 1, 0, 8, T0 + dt.timedelta(hours=30, seconds=30),
                    T0 + dt.timedelta(hours=40, seconds=30), idle=False)
    rogue.pod = "rogue-notebook-0-zzzzz"
    for job in jobs:
        job.pod = f"{job.object_name}-0-{rng.randrange(16**5):05x}"
        mean = rng.uniform(0.5, 2.5) if job.idle else rng.uniform(25, 95)
        mem = rng.uniform(2000, 70000)
        for g in range(job.first_gpu, job.first_gpu + job.gpus):
            series = []
            t = _first_scrape(job.start - dt.timedelta(seconds=STEP))
            while t < (job.end + dt.timedelta(seconds=2 * STEP)).timestamp():
                if not any(a.timestamp() <= t < b.timestamp() for a, b in gaps[job.cluster]):
                    running = job.start.timestamp() <= t < job.end.timestamp() or t < job.start.timestamp()
                    if not running:  # after the end the pod still holds the GPU for a moment, idle
                        util = 0.0
                    elif job.idle:
                        util = min(4.0, max(0.0, round(rng.gauss(mean, 1.0))))
                    else:
                        util = min(100.0, max(10.0, round(rng.gauss(mean, 12))))
                    series.append((t, util, round(mem + rng.uniform(-500, 500))))
                t += STEP
            job.samples[g] = series
    return Fleet(jobs, rogue, gaps, no_data)


def _first_scrape(at: dt.datetime) -> int:
    base = int(at.timestamp()) // STEP * STEP + SAMPLE_OFFSET
    return base if base >= at.timestamp() else base + STEP


def _labels(**kv) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kv.items()) + "}"


def openmetrics(fleet: Fleet, clusters: list[str], with_cluster_label: bool) -> str:
    """The scrapes of ``clusters`` as OpenMetrics text (timestamps in seconds), ending with ``# EOF``."""
    families: dict[str, list[str]] = {
        "DCGM_FI_DEV_GPU_UTIL": [], "DCGM_FI_PROF_GR_ENGINE_ACTIVE": [], "DCGM_FI_DEV_FB_USED": [],
        "kube_pod_container_resource_requests": [], "kube_pod_status_phase": [],
    }
    specs = {c.name: c for c in CLUSTERS}
    for job in fleet.jobs + [fleet.rogue]:
        if job.cluster not in clusters:
            continue
        spec = specs[job.cluster]
        extra = {"cluster": job.cluster} if with_cluster_label else {}
        ns = f"cp-{job.team}"
        host = f"{job.cluster}-gpu-{job.node}"
        for g, series in job.samples.items():
            labels = _labels(gpu=g, UUID=f"GPU-{job.cluster}-{job.node}-{g}", Hostname=host, modelName=spec.model_name,
                             container="main", namespace=ns, pod=job.pod, **extra)
            for t, util, mem in series:
                if spec.util_metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
                    families[spec.util_metric].append(f"{spec.util_metric}{labels} {util / 100:.4f} {t}")
                else:
                    families[spec.util_metric].append(f"{spec.util_metric}{labels} {util:g} {t}")
                families["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{labels} {mem} {t}")
        # kube-state-metrics: the pod exists from 2 min before its start to 3 min after its end.
        req = _labels(namespace=ns, pod=job.pod, container="main", node=host, resource="nvidia_com_gpu",
                      unit="integer", **extra)
        phase = _labels(namespace=ns, pod=job.pod, phase="Running", **extra)
        t = _first_scrape(job.start - dt.timedelta(minutes=2))
        while t < (job.end + dt.timedelta(minutes=3)).timestamp():
            families["kube_pod_container_resource_requests"].append(f"kube_pod_container_resource_requests{req} {job.gpus} {t}")
            running = 1 if job.start.timestamp() <= t < job.end.timestamp() else 0
            families["kube_pod_status_phase"].append(f"kube_pod_status_phase{phase} {running} {t}")
            t += STEP
    out = []
    for name, lines in families.items():
        if lines:
            out.append(f"# TYPE {name} gauge")
            out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"
