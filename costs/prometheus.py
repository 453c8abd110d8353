"""Reading GPU utilization, GPU memory and allocated GPU-hours from Prometheus, aggregation pushed down.

Sources: NVIDIA dcgm-exporter default counters (``DCGM_FI_DEV_GPU_UTIL``,
percent; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ratio 0-1, preferred where present
as OpenCost does; ``DCGM_FI_DEV_FB_USED``, MiB) and kube-state-metrics
(``kube_pod_container_resource_requests{resource="nvidia_com_gpu"}`` joined
with ``kube_pod_status_phase{phase="Running"}``). Each query returns a few
sums per window (``sum_over_time``, ``count_over_time``, ``sum``, subqueries);
raw series are never pulled.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re

from django.conf import settings
from prometheus_api_client import PrometheusConnect

from runners.kubernetes.manifests import namespace_name

UTIL_PERCENT = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED_MIB = "DCGM_FI_DEV_FB_USED"
GPU_REQUESTS = 'kube_pod_container_resource_requests{{resource="nvidia_com_gpu"{extra}}}'
POD_RUNNING = 'kube_pod_status_phase{{phase="Running"{extra}}}'
# Prometheus refuses a query_range (and we refuse a subquery) of more than this many points per series.
MAX_POINTS = 11_000
# Range selectors are closed at both ends in Prometheus 2.x: evaluating 1 ms before a window's end
# and reaching back (length - 1 ms) reads exactly [start, end) at millisecond resolution.
EPSILON = dt.timedelta(milliseconds=1)


class NaiveDatetime(ValueError):
    """A time without a timezone was passed; Prometheus times are absolute."""


def _aware(at: dt.datetime) -> dt.datetime:
    if at.tzinfo is None or at.utcoffset() is None:
        raise NaiveDatetime(f"{at!r} has no timezone")
    return at


def duration(delta: dt.timedelta) -> str:
    """A PromQL duration in whole milliseconds, e.g. ``86399999ms``."""
    return f"{max(1, round(delta.total_seconds() * 1000))}ms"


def split_window(start: dt.datetime, end: dt.datetime, step_seconds: float,
                 max_points: int = MAX_POINTS) -> list[tuple[dt.datetime, dt.datetime]]:
    """Cut ``[start, end)`` into adjacent windows of at most ``max_points`` steps of ``step_seconds`` each."""
    _aware(start), _aware(end)
    longest = dt.timedelta(seconds=step_seconds * max_points)
    windows = []
    while start < end:
        windows.append((start, min(end, start + longest)))
        start = windows[-1][1]
    return windows


def team_namespace(team_slug: str) -> str:
    """The Kubernetes namespace of a team's pods, as the kubernetes runner names it (``cp-<slug>`` by default)."""
    return namespace_name(settings.K8S_NAMESPACE_PREFIX, team_slug)


def attempt_pod_matchers(team_slug: str, object_name: str) -> str:
    """PromQL label matchers of an attempt's pods: the one place where pods map to attempts.

    Pods are named ``<object_name>-...`` (``job-12-1-0-abcde`` for object
    ``job-12-1``; the trailing dash keeps ``job-12-10`` out) in the team's namespace.
    """
    # re.escape also escapes '-', which PromQL strings refuse; a backslash must be doubled inside them.
    pattern = re.escape(object_name).replace("\\-", "-").replace("\\", "\\\\")
    return f'namespace="{team_namespace(team_slug)}",pod=~"{pattern}-.*"'


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a cluster's metrics live: a Prometheus URL and the extra matcher selecting the cluster there."""

    url: str
    cluster_matcher: str  # '' or ',cluster="name"'

    def client(self) -> PrometheusConnect:
        return PrometheusConnect(url=self.url, disable_ssl=True, timeout=settings.COSTS_PROMETHEUS_TIMEOUT_SECONDS)


def source_for(cluster) -> Source | None:
    """The cluster's own ``prometheus_url``, else the global ``COSTS_PROMETHEUS_URL`` filtered on ``cluster``; None if neither."""
    if cluster.prometheus_url:
        return Source(cluster.prometheus_query_url.rstrip("/"), "")  # with its basic auth, if any
    if settings.COSTS_PROMETHEUS_URL:
        return Source(settings.COSTS_PROMETHEUS_URL.rstrip("/"), f',cluster="{cluster.name}"')
    return None


@dataclasses.dataclass(frozen=True)
class WindowUsage:
    """Sums over one window of one attempt's GPUs. Utilization in percent; memory in MiB.

    ``samples == 0`` means no data; the averages are then None.
    ``idle_points``/``points`` come from a subquery at the scrape interval.
    """

    samples: int
    util_sum: float
    memory_samples: int
    memory_sum: float
    idle_points: int
    points: int

    @property
    def avg_util_percent(self) -> float | None:
        return self.util_sum / self.samples if self.samples else None

    @property
    def avg_memory_mib(self) -> float | None:
        return self.memory_sum / self.memory_samples if self.memory_samples else None

    @property
    def idle_fraction(self) -> float | None:
        return self.idle_points / self.points if self.points else None


USAGE_FIELDS = ("samples", "util_sum", "memory_samples", "memory_sum", "idle_points", "points")


def _stat(name: str, expr: str, by: tuple[str, ...] = ()) -> str:
    grouping = f" by ({', '.join(by)})" if by else ""
    return f'label_replace(sum{grouping}({expr}), "stat", "{name}", "", "")'


def usage_query(matchers: str, window: dt.timedelta, step_seconds: float, idle_percent: float,
                by: tuple[str, ...] = (), fields: tuple[str, ...] | None = None) -> str:
    """One instant query returning labelled sums (grouped ``by`` labels) for the series matching ``matchers``.

    ``fields`` picks among ``USAGE_FIELDS`` (all by default); the idle
    points need a subquery at the scrape interval, the others none.

    Utilization per GPU series is ``GR_ENGINE_ACTIVE x 100`` where the
    profiling counter exists, else ``GPU_UTIL`` (OpenCost's choice); ``or``
    works per series because both sides drop the metric name.
    """
    r = duration(window)
    step = duration(dt.timedelta(seconds=step_seconds))
    util = f"({GR_ENGINE_ACTIVE}{{{matchers}}} * 100 or {UTIL_PERCENT}{{{matchers}}} + 0)"
    parts = {
        "util_sum": _stat("util_sum", f"sum_over_time({GR_ENGINE_ACTIVE}{{{matchers}}}[{r}]) * 100"
                          f" or sum_over_time({UTIL_PERCENT}{{{matchers}}}[{r}])", by),
        "samples": _stat("samples", f"count_over_time({GR_ENGINE_ACTIVE}{{{matchers}}}[{r}])"
                         f" or count_over_time({UTIL_PERCENT}{{{matchers}}}[{r}])", by),
        "memory_sum": _stat("memory_sum", f"sum_over_time({FB_USED_MIB}{{{matchers}}}[{r}])", by),
        "memory_samples": _stat("memory_samples", f"count_over_time({FB_USED_MIB}{{{matchers}}}[{r}])", by),
        "idle_points": _stat("idle_points", f"sum_over_time(({util} < bool {idle_percent})[{r}:{step}])", by),
        "points": _stat("points", f"count_over_time({util}[{r}:{step}])", by),
    }
    return " or ".join(parts[f] for f in (fields or USAGE_FIELDS))


def read_usage_by(source: Source, matchers: str, start: dt.datetime, end: dt.datetime, by: tuple[str, ...] = (), *,
                  step_seconds: float | None = None, idle_percent: float | None = None,
                  fields: tuple[str, ...] | None = None,
                  client: PrometheusConnect | None = None) -> dict[tuple, WindowUsage]:
    """``read_usage`` grouped by the labels ``by`` (e.g. ``("namespace",)``): ``{label values: WindowUsage}``.

    ``fields`` limits the sums computed (see ``usage_query``); the others stay 0.
    Groups without any series are absent (no data).
    """
    step_seconds = step_seconds or settings.COSTS_SCRAPE_INTERVAL_SECONDS
    idle_percent = settings.COSTS_IDLE_UTIL_PERCENT if idle_percent is None else idle_percent
    client = client or source.client()
    totals: dict[tuple, dict[str, float]] = {}
    for w_start, w_end in split_window(start, end, step_seconds):
        query = usage_query(matchers + source.cluster_matcher, w_end - w_start - EPSILON, step_seconds, idle_percent, by, fields)
        for row in client.custom_query(query, params={"time": (w_end - EPSILON).timestamp()}):
            key = tuple(row["metric"].get(label, "") for label in by)
            group = totals.setdefault(key, dict.fromkeys(USAGE_FIELDS, 0.0))
            group[row["metric"]["stat"]] += float(row["value"][1])
    return {
        key: WindowUsage(samples=int(t["samples"]), util_sum=t["util_sum"], memory_samples=int(t["memory_samples"]),
                         memory_sum=t["memory_sum"], idle_points=int(t["idle_points"]), points=int(t["points"]))
        for key, t in totals.items()
    }


def read_usage(source: Source, matchers: str, start: dt.datetime, end: dt.datetime, *,
               step_seconds: float | None = None, idle_percent: float | None = None,
               client: PrometheusConnect | None = None) -> WindowUsage:
    """Sums of utilization, memory and idle points for the series matching ``matchers`` in ``[start, end)``.

    ``matchers`` is a PromQL matcher list without braces (see
    ``attempt_pod_matchers``); the source's cluster matcher is added. The
    window is cut so that no subquery exceeds ``MAX_POINTS`` steps.
    Raises ``prometheus_api_client.PrometheusApiClientException`` on an
    HTTP error and ``requests.RequestException`` when Prometheus is unreachable.
    """
    groups = read_usage_by(source, matchers, start, end, step_seconds=step_seconds, idle_percent=idle_percent,
                           client=client)
    return groups.get((), WindowUsage(0, 0.0, 0, 0.0, 0, 0))


def allocated_gpu_hours_by(source: Source, start: dt.datetime, end: dt.datetime, by: tuple[str, ...] = (), *,
                           step_seconds: float | None = None, matchers: str = "",
                           client: PrometheusConnect | None = None) -> dict[tuple, float]:
    """GPU-hours requested by Running pods in ``[start, end)`` per kube-state-metrics, grouped ``by`` labels.

    Per pod: the number of ``kube_pod_status_phase{phase="Running"}``
    samples equal to 1 (``sum_over_time`` of a 0/1 series), each standing
    for one scrape interval, times the pod's GPU requests summed over its
    containers (``max_over_time``: requests of a pod are immutable in
    Kubernetes). Request series outlive the running time, hence the join.
    No subquery, so it stays cheap over a month of a large fleet. A scrape
    gap in kube-state-metrics shows as fewer GPU-hours (and so as a ledger
    discrepancy). ``by`` may name only ``namespace`` and ``pod``. Groups
    without samples are absent.
    """
    step_seconds = step_seconds or settings.COSTS_SCRAPE_INTERVAL_SECONDS
    client = client or source.client()
    extra = (f",{matchers}" if matchers else "") + source.cluster_matcher
    grouping = f" by ({', '.join(by)})" if by else ""
    totals: dict[tuple, float] = {}
    for w_start, w_end in split_window(start, end, step_seconds):
        r = duration(w_end - w_start - EPSILON)
        query = (
            f"sum{grouping}("
            f"max by (namespace, pod) (sum_over_time({POD_RUNNING.format(extra=extra)}[{r}]))"
            f" * on (namespace, pod) group_left()"
            f" sum by (namespace, pod) (max_over_time({GPU_REQUESTS.format(extra=extra)}[{r}])))"
        )
        for row in client.custom_query(query, params={"time": (w_end - EPSILON).timestamp()}):
            value = float(row["value"][1])
            if not math.isnan(value):
                key = tuple(row["metric"].get(label, "") for label in by)
                totals[key] = totals.get(key, 0.0) + value
    return {key: samples * step_seconds / 3600 for key, samples in totals.items()}


def allocated_gpu_hours(source: Source, start: dt.datetime, end: dt.datetime, *, step_seconds: float | None = None,
                        client: PrometheusConnect | None = None) -> float | None:
    """GPU-hours requested by Running pods of the source's cluster in ``[start, end)``; None without samples.

    See ``allocated_gpu_hours_by``.
    """
    return allocated_gpu_hours_by(source, start, end, step_seconds=step_seconds, client=client).get(())
