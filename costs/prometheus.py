"""Reading GPU utilization, GPU memory, GPU energy and allocated GPU-hours from Prometheus, aggregation pushed down.

Sources: NVIDIA dcgm-exporter default counters (``DCGM_FI_DEV_GPU_UTIL``,
percent; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ratio 0-1, preferred where present
as OpenCost does; ``DCGM_FI_DEV_FB_USED``, MiB;
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, a counter of mJ) and kube-state-metrics
(``kube_pod_container_resource_requests{resource="nvidia_com_gpu"}`` joined
with ``kube_pod_status_phase`` and ``kube_pod_info``). Each query returns a few
sums per window (``sum_over_time``, ``count_over_time``, ``sum``, subqueries); a
window of at most ``RAW_WINDOW`` (a periodic pass) is read as the raw samples of
its GPU series in one selector and summed in Python by the same rules, which
costs Prometheus a third of the pushed-down sums (docs/adr/0034).

DCGM series reach Prometheus in one of three label shapes (``SHAPES``):
``namespace``/``pod`` of the workload, ``exported_namespace``/``exported_pod``
(scraped by a ServiceMonitor without ``honorLabels``, when ``pod`` names the
exporter itself), or no pod labels at all (``Hostname`` or ``hostname`` and
``UUID`` only). ``detect_shape`` tells which from the series themselves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections import defaultdict

import numpy as np
from django.conf import settings
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from core.namespaces import team_namespace

UTIL_PERCENT = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED_MIB = "DCGM_FI_DEV_FB_USED"
# A counter of millijoules since the driver (re)loaded: it restarts from 0 when the driver or the exporter restarts
# (dcgm-exporter etc/default-counters.csv: "counter, Total energy consumption since boot (in mJ)"; NVML
# nvmlDeviceGetTotalEnergyConsumption: "in millijoules (mJ) since the driver was last reloaded").
ENERGY_MJ = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
MJ_PER_KWH = 3.6e9  # 1 kWh = 3.6 MJ = 3.6e9 mJ
# The GPU devices a pod requests, whole or shared: ``nvidia.com/gpu`` (a whole GPU, or a time-sliced one under the
# device plugin's default names), ``nvidia.com/gpu.shared`` (time-slicing with ``renameByDefault``) and
# ``nvidia.com/mig-<profile>`` (MIG, mixed strategy), as kube-state-metrics names them (dots and dashes as
# underscores); NVIDIA k8s-device-plugin README, "Shared Access to GPUs" and "MIG support". One request is one device.
GPU_REQUESTS = ('kube_pod_container_resource_requests{{resource=~"nvidia_com_gpu|nvidia_com_gpu_shared|'
                'nvidia_com_mig_.+"{extra}}}')
# A pod that has not finished: Pending (pulling its image, running init containers, or not bound yet) or Running.
POD_UNFINISHED = 'kube_pod_status_phase{{phase=~"Pending|Running"{extra}}}'
# A pod not bound to a node yet: kube-state-metrics' kube_pod_info carries ``node`` (spec.nodeName) from binding on.
POD_UNBOUND = 'kube_pod_info{{node=""{extra}}}'
# Prometheus refuses a query_range (and we refuse a subquery) of more than this many points per series.
MAX_POINTS = 11_000
# Prometheus' default --query.lookback-delta, seconds: an instant selector sees a sample at most this old
# (prometheus.io/docs/prometheus/latest/querying/basics/, "Staleness"); COSTS_QUERY_LOOKBACK_DELTA_SECONDS sets ours.
LOOKBACK_DELTA_SECONDS = 300.0
# Range selectors are closed at both ends in Prometheus 2.x and left-open in 3.x: evaluating 1 ms before a
# window's end and reaching back to its start (``range_for``) reads exactly [start, end) at millisecond resolution.
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


def attempt_pod_matchers(team_slug: str, object_name: str, shape: str = "pod") -> str:
    """PromQL label matchers of an attempt's pods: the one place where pods map to attempts.

    Pods are named ``<object_name>-...`` (``job-12-1-0-abcde`` for object
    ``job-12-1``; the trailing dash keeps ``job-12-10`` out) in the team's
    namespace. ``shape`` ``exported_pod`` matches ``exported_namespace`` and
    ``exported_pod`` instead (dcgm-exporter scraped without ``honorLabels``).
    """
    ns_label, pod_label = POD_LABELS.get(shape, ("namespace", "pod"))
    return f'{ns_label}="{team_namespace(team_slug)}",{pod_label}=~"{_regex_literal(object_name)}-.*"'


def pod_of_attempt(namespace: str, pod: str, team_slug: str, object_name: str) -> bool:
    """Whether the series labelled ``namespace``/``pod`` (or ``exported_namespace``/``exported_pod``) belong to the
    attempt of ``team_slug`` and ``object_name``: ``attempt_pod_matchers`` evaluated in Python (the team's
    namespace; a pod name ``<object_name>-...``; PromQL regex matchers are anchored at both ends)."""
    return namespace == team_namespace(team_slug) and pod.startswith(f"{object_name}-")


def role_pod_name(object_name: str, role: str, index: int) -> str:
    """The name of pod ``index`` of role ``role`` of a multi-role attempt: ``<object_name>-<role>-<index>``, the
    prefix of what Kubernetes names it (an Indexed Job ``<object_name>-<role>`` names its pods
    ``<job>-<index>-<suffix>``; docs/adr/0039-multi-role-jobs.md) and the local runner's pod
    (``runners.local.exporter``). ``pod_role`` reads it back."""
    return f"{object_name}-{role}-{index}"


def pod_role(pod: str, object_name: str, roles) -> str:
    """The role of a multi-role attempt's pod named ``pod`` (``role_pod_name``): the longest of ``roles`` (names)
    such that ``pod`` is ``<object_name>-<role>-<digit>...``; ``""`` when none is (a pod of one role, or a name
    this rule does not know). The longest wins so that roles ``a`` and ``a-b`` tell ``job-a-b-0`` apart."""
    found = ""
    for role in roles:
        prefix = f"{object_name}-{role}-"
        if pod.startswith(prefix) and pod[len(prefix):len(prefix) + 1].isdigit() and len(role) > len(found):
            found = role
    return found


def attempts_pod_matchers(attempts: list[tuple[str, str]], shape: str = "pod") -> str:
    """PromQL label matchers selecting the pods of every ``(team_slug, object_name)`` in ``attempts`` (one query
    for many attempts, grouped by the pod labels and told apart with ``pod_of_attempt``). It may also select a pod
    of one team named like another team's attempt; ``pod_of_attempt`` leaves such a pod out."""
    ns_label, pod_label = POD_LABELS.get(shape, ("namespace", "pod"))
    namespaces = "|".join(sorted({_regex_literal(team_namespace(team)) for team, _ in attempts}))
    names = "|".join(sorted({_regex_literal(name) for _, name in attempts}))
    return f'{ns_label}=~"{namespaces}",{pod_label}=~"({names})-.*"'


# Prometheus gzips an answer when asked to, and requests asks by default: compressing the raw samples of a window
# costs Prometheus more CPU than reading them (a day of 15-minute windows at 64 GPUs: 0.75 s with gzip, 0.30 s
# without; docs/adr/0034). The answers travel uncompressed (a 15-minute window of 1,024 GPUs: about 3 MB per series
# kind).
UNCOMPRESSED = {"Accept-Encoding": "identity"}


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a cluster's metrics live: a Prometheus URL and the extra matcher selecting the cluster there."""

    url: str
    cluster_matcher: str  # '' or ',cluster="name"'

    def client(self, timeout: float | None = None) -> PrometheusConnect:
        """A client of this Prometheus, asking for uncompressed answers (``UNCOMPRESSED``); ``timeout`` (seconds)
        given: that timeout and no retry (a page waiting on it), else ``COSTS_PROMETHEUS_TIMEOUT_SECONDS`` with the
        library's retries."""
        if timeout is not None:
            return PrometheusConnect(url=self.url, disable_ssl=True, timeout=timeout, retry=Retry(total=0),
                                     headers=UNCOMPRESSED)
        return PrometheusConnect(url=self.url, disable_ssl=True, timeout=settings.COSTS_PROMETHEUS_TIMEOUT_SECONDS,
                                 headers=UNCOMPRESSED)


def source_for(cluster) -> Source | None:
    """The cluster's own ``prometheus_url``, else the global ``COSTS_PROMETHEUS_URL`` filtered on ``cluster``; None if neither."""
    if cluster.prometheus_url:
        return Source(cluster.prometheus_query_url.rstrip("/"), "")  # with its basic auth, if any
    if settings.COSTS_PROMETHEUS_URL:
        return Source(settings.COSTS_PROMETHEUS_URL.rstrip("/"), f',cluster="{cluster.name}"')
    return None


# --- label shapes: how a cluster's DCGM series name the pod using a GPU --------------------------------------

SHAPE_POD = "pod"                # dcgm-exporter scraped with honorLabels: namespace/pod are the workload's
SHAPE_EXPORTED = "exported_pod"  # ServiceMonitor without honorLabels: exported_namespace/exported_pod
SHAPE_HOST = "host"              # no pod labels at all: Hostname (or hostname) and the GPU UUID
SHAPES = (SHAPE_POD, SHAPE_EXPORTED, SHAPE_HOST)
POD_LABELS = {SHAPE_POD: ("namespace", "pod"), SHAPE_EXPORTED: ("exported_namespace", "exported_pod")}
HOST_LABELS = ("Hostname", "hostname")
DCGM_UTIL = f"__name__=~\"{GR_ENGINE_ACTIVE}|{UTIL_PERCENT}\""


@dataclasses.dataclass(frozen=True)
class Shape:
    """How one cluster's DCGM series are attributed to pods, and which utilization counter they carry.

    ``kind``: one of ``SHAPES``, or ``""`` when no DCGM series was seen.
    ``host_label``: ``Hostname`` (dcgm-exporter's) or ``hostname`` (some
    relabelings), used by ``SHAPE_HOST``. ``util_metric``: ``GR_ENGINE_ACTIVE``
    where the exporter has profiling metrics, else ``UTIL_PERCENT``, ``""``
    without data. ``series``: DCGM utilization series per candidate, as counted.
    """

    kind: str
    host_label: str = "Hostname"
    util_metric: str = ""
    series: tuple = ()


def _regex_literal(value: str) -> str:
    """``value`` escaped for a PromQL regex matcher (RE2 syntax, inside a string literal)."""
    # re.escape also escapes '-', which PromQL strings refuse; a backslash must be doubled inside them.
    return re.escape(value).replace("\\-", "-").replace("\\", "\\\\")


def detect_shape(source: Source, at: dt.datetime, lookback: dt.timedelta = dt.timedelta(days=1), *,
                 client: PrometheusConnect | None = None) -> Shape:
    """The label shape of the DCGM utilization series of ``source``'s cluster seen in ``[at - lookback, at]``.

    One instant query counting series per candidate: with ``exported_pod`` in
    a team namespace (``K8S_NAMESPACE_PREFIX``), with ``pod`` in a team
    namespace, with ``Hostname``, with ``hostname``, and with each counter.
    The exported shape wins when it names team pods (the ``pod`` label then
    names the exporter), then the pod shape, then hosts. Raises what ``read_usage`` raises.
    """
    client = client or source.client()
    prefix = _regex_literal(settings.K8S_NAMESPACE_PREFIX)
    r = duration(lookback)
    candidates = {
        "exported": f'exported_pod!="",exported_namespace=~"{prefix}.*"',
        "pod": f'pod!="",namespace=~"{prefix}.*"',
        "Hostname": 'Hostname!=""',
        "hostname": 'hostname!=""',
    }
    parts = [_stat(name, f"count(last_over_time({{{DCGM_UTIL},{m}{source.cluster_matcher}}}[{r}]))")
             for name, m in candidates.items()]
    parts += [_stat(metric, f"count(last_over_time({metric}{{{source.cluster_matcher.lstrip(',')}}}[{r}]))")
              for metric in (GR_ENGINE_ACTIVE, UTIL_PERCENT)]
    counts = {name: 0 for name in [*candidates, GR_ENGINE_ACTIVE, UTIL_PERCENT]}
    for row in client.custom_query(" or ".join(parts), params={"time": at.timestamp()}):
        counts[row["metric"]["stat"]] = int(float(row["value"][1]))
    host_label = "hostname" if counts["hostname"] > counts["Hostname"] else "Hostname"
    if counts["exported"]:
        kind = SHAPE_EXPORTED
    elif counts["pod"]:
        kind = SHAPE_POD
    elif counts[host_label]:
        kind = SHAPE_HOST
    else:
        kind = ""
    metric = GR_ENGINE_ACTIVE if counts[GR_ENGINE_ACTIVE] else UTIL_PERCENT if counts[UTIL_PERCENT] else ""
    return Shape(kind, host_label, metric, tuple(sorted(counts.items())))


def shape_matchers(shape: Shape, team_slug: str, object_name: str, hosts: tuple[str, ...] = (),
                   uuids: tuple[str, ...] = ()) -> str | None:
    """PromQL matchers of an attempt's GPU series under ``shape``; None when the series cannot be told apart.

    Pod shapes: the pod labels (``attempt_pod_matchers``). Host shape: the
    attempt's ``hosts`` and, unless the attempt holds those hosts whole,
    the ``uuids`` of its GPUs; without hosts it is None (not attributable:
    its GPU-hours count as unobserved, never guessed).
    """
    if shape.kind in POD_LABELS:
        return attempt_pod_matchers(team_slug, object_name, shape.kind)
    if shape.kind == SHAPE_HOST and hosts:
        matchers = f'{shape.host_label}=~"{"|".join(_regex_literal(h) for h in sorted(hosts))}"'
        if uuids:
            matchers += f',UUID=~"{"|".join(_regex_literal(u) for u in sorted(uuids))}"'
        return matchers
    return None


def attempt_hosts(source: Source, team_slug: str, object_name: str, start: dt.datetime, end: dt.datetime, *,
                  client: PrometheusConnect | None = None) -> dict[str, float]:
    """``{node: GPUs requested there}`` of an attempt's pods in ``[start, end)``, from kube-state-metrics'
    ``kube_pod_container_resource_requests`` (its ``node`` label); empty when none was seen."""
    client = client or source.client()
    extra = "," + attempt_pod_matchers(team_slug, object_name) + source.cluster_matcher
    r = duration(end - start + dt.timedelta(seconds=settings.COSTS_SCRAPE_INTERVAL_SECONDS))
    query = f"sum by (node) (max by (node, pod) (max_over_time({GPU_REQUESTS.format(extra=extra)}[{r}])))"
    return {row["metric"].get("node", ""): float(row["value"][1])
            for row in client.custom_query(query, params={"time": end.timestamp()}) if row["metric"].get("node")}


def host_gpus(source: Source, shape: Shape, hosts: tuple[str, ...], at: dt.datetime, lookback: dt.timedelta, *,
              client: PrometheusConnect | None = None) -> int:
    """How many distinct GPUs (``UUID``) the DCGM series of ``hosts`` show in ``[at - lookback, at]``."""
    client = client or source.client()
    matchers = shape_matchers(Shape(SHAPE_HOST, shape.host_label), "", "", hosts)
    query = (f"count(count by (UUID) (last_over_time({{{DCGM_UTIL},{matchers}{source.cluster_matcher}}}"
             f"[{duration(lookback)}])))")
    rows = client.custom_query(query, params={"time": at.timestamp()})
    return int(float(rows[0]["value"][1])) if rows else 0


# --- range-selector semantics ---------------------------------------------------------------------------------

_LEFT_OPEN: dict[str, bool] = {}


def range_left_open(source: Source, *, client: PrometheusConnect | None = None) -> bool:
    """Whether ``source`` reads range selectors left-open, ``(t - r, t]`` (Prometheus 3.x), or closed,
    ``[t - r, t]`` (2.x). Probed once per URL, not taken from a version string (Thanos and others report
    their own): ``count_over_time(vector(1)[2m:1m])`` at a whole minute counts 3 points closed, 2 left-open.
    Sources: Prometheus 3.0 made range selectors, the lookback and subqueries left-open (its migration guide,
    prometheus.io/docs/prometheus/latest/migration/, "Intervals return a predictable number of points";
    prometheus/prometheus#13213 and #15431)."""
    if source.url not in _LEFT_OPEN:
        client = client or source.client()
        at = int(dt.datetime.now(dt.timezone.utc).timestamp()) // 60 * 60
        rows = client.custom_query("count_over_time(vector(1)[2m:1m])", params={"time": at})
        _LEFT_OPEN[source.url] = bool(rows) and float(rows[0]["value"][1]) < 3
    return _LEFT_OPEN[source.url]


def range_for(start: dt.datetime, end: dt.datetime, left_open: bool) -> tuple[float, str]:
    """``(evaluation time in unix seconds, range duration)`` whose range selector reads exactly ``[start, end)``
    at millisecond resolution: evaluated 1 ms before ``end``, reaching back to ``start`` inclusive."""
    at = end - EPSILON
    length = end - start if left_open else end - start - EPSILON
    return at.timestamp(), duration(length)


@dataclasses.dataclass(frozen=True)
class WindowUsage:
    """Sums over one window of one attempt's (or one group's) GPU series. Utilization in percent; memory in MiB.

    ``samples``: utilization samples found (one per GPU per scrape), whose
    mean is the average utilization; ``prof_samples``: those read from
    ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (the rest are ``DCGM_FI_DEV_GPU_UTIL``).
    ``observed_seconds``: GPU-seconds at which the GPU's latest sample is at
    most the lookback delta old, so that an instant query sees it: a sample
    counts until the next one or until the lookback runs out, whichever
    comes first, measured at the instants of ``lookback_instants`` (one per
    scrape interval); ``idle_seconds``: the part of it whose sample is under
    the idle threshold. ``observed_seconds == 0`` means no data: ``idle``
    is then None, never 0; ``samples == 0`` makes the averages None.
    ``energy_mj``: millijoules the GPUs drew, from
    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``: at each multiple ``p`` of the
    scrape interval in the window, the counter's value seen at ``p`` less
    the one seen at ``p - step`` (each the latest sample within the
    lookback, as for observed time; both must be seen), a drop being a
    reset that counts from zero (the value seen at ``p``). Each rise
    belongs to exactly one instant, so windows cut anywhere add up exactly
    (docs/adr/0034). None where no instant of the window saw the counter
    twice (not measured, never 0).
    """

    samples: int
    util_sum: float
    memory_samples: int
    memory_sum: float
    observed_seconds: float
    idle_seconds: float
    prof_samples: int = 0
    energy_mj: float | None = None

    def __add__(self, other: WindowUsage) -> WindowUsage:
        """The sums of two disjoint sets of series (or of two adjacent windows); energy stays None only where
        neither was measured."""
        energy = None if self.energy_mj is None and other.energy_mj is None else \
            (self.energy_mj or 0.0) + (other.energy_mj or 0.0)
        return WindowUsage(self.samples + other.samples, self.util_sum + other.util_sum,
                           self.memory_samples + other.memory_samples, self.memory_sum + other.memory_sum,
                           self.observed_seconds + other.observed_seconds, self.idle_seconds + other.idle_seconds,
                           self.prof_samples + other.prof_samples, energy)

    def share(self, fraction: float) -> WindowUsage:
        """These sums as a pod holding ``fraction`` of the GPUs read (0-1: its share of each) is given them: observed
        and idle GPU-seconds and energy times ``fraction``; the samples, their sums and memory as they are (the
        device's utilization is what the pod saw). Docs/design.md, "Shared GPUs"."""
        return dataclasses.replace(self, observed_seconds=self.observed_seconds * fraction,
                                   idle_seconds=self.idle_seconds * fraction,
                                   energy_mj=None if self.energy_mj is None else self.energy_mj * fraction)

    @property
    def energy_kwh(self) -> float | None:
        """``energy_mj`` in kWh; None: not measured."""
        return None if self.energy_mj is None else self.energy_mj / MJ_PER_KWH

    @property
    def avg_util_percent(self) -> float | None:
        return self.util_sum / self.samples if self.samples else None

    @property
    def avg_memory_mib(self) -> float | None:
        return self.memory_sum / self.memory_samples if self.memory_samples else None

    @property
    def util_metric(self) -> str:
        """The counter the utilization came from: ``GR_ENGINE_ACTIVE``, ``UTIL_PERCENT``, ``mixed`` or ``""`` (no data)."""
        if not self.samples:
            return ""
        return GR_ENGINE_ACTIVE if self.prof_samples == self.samples else UTIL_PERCENT if not self.prof_samples \
            else "mixed"

    @property
    def idle(self) -> float | None:
        """Idle GPU-seconds; None when nothing was observed (no data, never 0)."""
        return self.idle_seconds if self.observed_seconds else None


NO_USAGE = WindowUsage(0, 0.0, 0, 0.0, 0.0, 0.0, 0)
USAGE_FIELDS = ("samples", "util_sum", "memory_samples", "memory_sum", "observed_seconds", "idle_seconds",
                "prof_samples", "energy_mj")


def _stat(name: str, expr: str, by: tuple[str, ...] = ()) -> str:
    grouping = f" by ({', '.join(by)})" if by else ""
    return f'label_replace(sum{grouping}({expr}), "stat", "{name}", "", "")'


def _ms(at: dt.datetime) -> int:
    return round(at.timestamp() * 1000)


def _at_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


# Points per subquery: Prometheus (2.x) holds a subquery's inner result whole, series x points, before counting it;
# at 8,192 GPU series a day at 15 s is 47 M points (1.1 GB, close to --query.max-samples' 50 M) and costs 2.6x the
# CPU of the same day cut in 4 (measured on 2.42; 12 or 48 pieces cost more again).
SUBQUERY_POINTS = 1440


def lookback_pieces(start: dt.datetime, end: dt.datetime, step_seconds: float, left_open: bool,
                    max_points: int = SUBQUERY_POINTS) -> list[tuple[dt.datetime, dt.datetime, int]]:
    """The evaluation instants of ``[start, end)`` as subqueries: ``[(first, last, outer_ms)]``.

    The instants are the multiples of the step (``step_seconds``, the scrape
    interval; milliseconds since the Unix epoch, where Prometheus aligns a
    subquery's steps) in ``[start, end)``, cut into runs of at most
    ``max_points``: the subquery ``[outer_ms ms:step] @ last`` evaluates
    exactly ``first, first + step, ..., last`` under closed (2.x) and
    left-open (3.x) range selectors alike. Adjacent windows share no instant
    and leave none out, so their counts add up. Empty when the window holds
    no multiple of the step.
    """
    s, e, step = _ms(start), _ms(end), round(step_seconds * 1000)
    first = -(-s // step) * step  # the first multiple of the step at or after start
    last_multiple = (e - 1) // step * step  # the last one before end
    pieces = []
    while first <= last_multiple:
        last = min(last_multiple, first + (max_points - 1) * step)
        outer = last - first + step if left_open else last - first
        pieces.append((_at_ms(first), _at_ms(last), max(1, outer)))
        first = last + step
    return pieces


def lookback_instants(start: dt.datetime, end: dt.datetime, step_seconds: float, left_open: bool,
                     max_points: int = SUBQUERY_POINTS) -> tuple[list[tuple[dt.datetime, dt.datetime, int]],
                                                                 list[tuple[dt.datetime, float]]]:
    """Where ``[start, end)`` is evaluated and for how long each evaluation stands: ``(pieces, edges)``.

    Each multiple ``p`` of the step in the window stands for ``[p, p + step)``
    and the window's start, when it is not a multiple, for the time up to the
    first one: a left Riemann sum of "is a sample within the lookback" with
    the scrape interval as its resolution. ``pieces`` (``lookback_pieces``)
    hold the instants that stand for a whole step; ``edges``
    ``[(instant, seconds)]`` the start and the last multiple when the window
    cuts their step short. Together they stand for exactly ``end - start``,
    and windows cut at multiples of the step (UTC midnights, for steps that
    divide a day) add up to the window they were cut from.
    """
    s, e, step = _ms(start), _ms(end), round(step_seconds * 1000)
    first = -(-s // step) * step
    last = (e - 1) // step * step
    edges = []
    if s < first:
        edges.append((start, (min(first, e) - s) / 1000))
    whole_until = end
    if first <= last and last + step > e:
        edges.append((_at_ms(last), (e - last) / 1000))
        whole_until = _at_ms(last)
    return lookback_pieces(start, whole_until, step_seconds, left_open, max_points), edges


def lookback_range_ms(lookback_seconds: float, left_open: bool) -> int:
    """The range (ms) of ``last_over_time`` that reads ``(t - lookback, t]`` at an instant ``t``: what an instant
    selector sees under Prometheus' ``--query.lookback-delta`` (left-open in 3.x, closed in 2.x)."""
    lookback = round(lookback_seconds * 1000)
    return lookback if left_open else lookback - 1


def _lookback_parts(gr: str, util: str, start: dt.datetime, end: dt.datetime, step_seconds: float,
                    idle_percent: float, lookback_seconds: float, left_open: bool) -> dict[str, list[str]]:
    """PromQL expressions (per GPU series, in GPU-seconds, to be summed) of observed and idle time, one per piece
    and edge of ``lookback_instants``: ``{"observed_seconds": [...], "idle_seconds": [...]}``.

    At each instant the latest sample no older than the lookback
    (``last_over_time`` over ``lookback_range_ms``) is the GPU's value, as an
    instant query sees it. Observed instants are all of them
    (``count_over_time`` of the subquery); the idle subquery keeps only the
    points under the threshold (a filter: Prometheus then stores a point per
    idle instant only). The preferred counter of a GPU is
    ``GR_ENGINE_ACTIVE`` where it has a sample read by the window, else
    ``GPU_UTIL`` (``unless`` that plain range read, which costs one pass over
    the profiling samples, nothing without them).
    """
    step = duration(dt.timedelta(seconds=step_seconds))
    inner = f"{lookback_range_ms(lookback_seconds, left_open)}ms"
    threshold = f"{idle_percent:g}"
    span_at, span = range_for(start - dt.timedelta(seconds=lookback_seconds) + EPSILON, end, left_open)
    not_gr = f"unless last_over_time({gr}[{span}] @ {span_at!r})"

    def preferred(template: str) -> str:
        """``template`` (``{x}``: the counter's selector, ``{percent}``: its scale to percent) for the profiling
        counter, else for ``GPU_UTIL``."""
        return (f"({template.format(x=gr, percent=' * 100')}"
                f" or ({template.format(x=util, percent='')} {not_gr}))")

    parts: dict[str, list[str]] = {"observed_seconds": [], "idle_seconds": []}
    pieces, edges = lookback_instants(start, end, step_seconds, left_open)
    for _, last, outer in pieces:
        sub = f"[{outer}ms:{step}] @ {last.timestamp()!r}"
        parts["observed_seconds"].append(preferred(
            f"count_over_time(last_over_time({{x}}[{inner}]){sub}) * {step_seconds!r}"))
        parts["idle_seconds"].append(preferred(
            f"count_over_time((last_over_time({{x}}[{inner}]){{percent}} < {threshold}){sub}) * {step_seconds!r}"))
    for at, seconds in edges:
        read = f"[{inner}] @ {at.timestamp()!r}"
        parts["observed_seconds"].append(preferred(f"count_over_time({{x}}{read}) * 0 + {seconds!r}"))
        parts["idle_seconds"].append(preferred(
            f"(last_over_time({{x}}{read}){{percent}} < {threshold}) * 0 + {seconds!r}"))
    return parts


def _energy_parts(energy: str, start: dt.datetime, end: dt.datetime, step_seconds: float, lookback_seconds: float,
                  left_open: bool) -> list[str]:
    """PromQL expressions (per GPU series, millijoules, to be summed) of the energy of ``[start, end)`` under
    ``WindowUsage.energy_mj``, one per run of ``lookback_pieces``: at each multiple ``p`` of the step the counter's value
    seen at ``p`` (``last_over_time`` over the lookback) less the one seen at ``p - step`` (the same, ``offset``
    one step); a negative difference is a reset and counts the value seen at ``p`` (from zero)."""
    step_ms = round(step_seconds * 1000)
    step = f"{step_ms}ms"
    inner = f"{lookback_range_ms(lookback_seconds, left_open)}ms"
    seen, before = f"last_over_time({energy}[{inner}])", f"last_over_time({energy}[{inner}] offset {step})"
    # (``last_over_time`` keeps the metric name: the reset's value is taken by arithmetic, which drops it, so that
    # both cases are one series in the subquery.)
    rise = f"({seen} - {before}) >= 0 or ({seen} - {before} < 0) * 0 + {seen}"
    return [f"sum_over_time(({rise})[{outer}ms:{step}] @ {last.timestamp()!r})"
            for _, last, outer in lookback_pieces(start, end, step_seconds, left_open)]


def usage_query(matchers: str, start: dt.datetime, end: dt.datetime, step_seconds: float, idle_percent: float,
                by: tuple[str, ...] = (), fields: tuple[str, ...] | None = None, left_open: bool = False,
                lookback_seconds: float = LOOKBACK_DELTA_SECONDS) -> tuple[str, float]:
    """One instant query of labelled sums over ``[start, end)`` (grouped ``by`` labels); returns ``(query, time)``.

    ``fields`` picks among ``USAGE_FIELDS`` (all by default). Utilization per
    GPU series is ``GR_ENGINE_ACTIVE x 100`` where the profiling counter
    exists, else ``GPU_UTIL`` (OpenCost's choice); ``or`` works per series
    because both sides drop the metric name. Samples, sums and memory are
    plain range functions over exactly ``[start, end)`` (``range_for``, per
    ``left_open``); observed and idle GPU-seconds are subqueries at the
    scrape interval and instant reads at the window's edges, each with
    ``lookback_seconds`` (``_lookback_parts``; stats ``observed_seconds:<n>``
    and ``idle_seconds:<n>``, to be added up). Energy follows the rule of ``WindowUsage.energy_mj``
    (``_energy_parts``; stats ``energy_mj:<n>``).
    """
    at, r = range_for(start, end, left_open)
    gr, util, fb, energy = (f"{m}{{{matchers}}}" for m in (GR_ENGINE_ACTIVE, UTIL_PERCENT, FB_USED_MIB, ENERGY_MJ))
    wanted = fields or USAGE_FIELDS
    steps = (_lookback_parts(gr, util, start, end, step_seconds, idle_percent, lookback_seconds, left_open)
             if {"observed_seconds", "idle_seconds"} & set(wanted) else {})
    parts = {
        "util_sum": [_stat("util_sum", f"sum_over_time({gr}[{r}]) * 100 or sum_over_time({util}[{r}])", by)],
        "samples": [_stat("samples", f"count_over_time({gr}[{r}]) or count_over_time({util}[{r}])", by)],
        "prof_samples": [_stat("prof_samples", f"count_over_time({gr}[{r}])", by)],
        "memory_sum": [_stat("memory_sum", f"sum_over_time({fb}[{r}])", by)],
        "memory_samples": [_stat("memory_samples", f"count_over_time({fb}[{r}])", by)],
        "energy_mj": [_stat(f"energy_mj:{n}", expr, by) for n, expr in enumerate(
            _energy_parts(energy, start, end, step_seconds, lookback_seconds, left_open))],
        **{name: [_stat(f"{name}:{n}", expr, by) for n, expr in enumerate(exprs)] for name, exprs in steps.items()},
    }
    return " or ".join(q for f in wanted for q in parts[f]), at


# A window at most this long is read as the raw samples of its GPU series (one selector, ``raw_query``) and summed
# in Python (``usage_from_series``); a longer one (a catch-up, a whole run, a month) by the pushed-down sums of
# ``usage_query``, which return a few numbers per group whatever the window. Both follow the same rules. At 1,024
# GPUs scraped every 15 s an hour is about 1.2 M samples (some 60 MB of JSON).
RAW_WINDOW = dt.timedelta(hours=1)
GPU_METRICS = (GR_ENGINE_ACTIVE, UTIL_PERCENT, FB_USED_MIB, ENERGY_MJ)


def raw_query(matchers: str, start: dt.datetime, end: dt.datetime, step_seconds: float, left_open: bool,
              lookback_seconds: float = LOOKBACK_DELTA_SECONDS) -> tuple[str, float]:
    """One range selector of every GPU series (``GPU_METRICS``) matching ``matchers``, returning their raw samples
    in ``(start - step - lookback, end)``: the window and what the lookback instants of its first step read
    (``usage_from_series``). Returns ``(query, evaluation time in unix seconds)``."""
    names = "|".join(GPU_METRICS)
    at, r = range_for(start - dt.timedelta(seconds=step_seconds + lookback_seconds) + EPSILON, end, left_open)
    return f'{{__name__=~"{names}",{matchers}}}[{r}]', at


def _window_instants(start: dt.datetime, end: dt.datetime, step_seconds: float):
    """``(instants_ms, seconds)`` arrays of ``lookback_instants`` (each instant and how long it stands for)."""
    pieces, edges = lookback_instants(start, end, step_seconds, False, max_points=1 << 62)
    step = round(step_seconds * 1000)
    instants, seconds = [], []
    for first, last, _ in pieces:
        whole = range(_ms(first), _ms(last) + 1, step)
        instants += whole
        seconds += [step_seconds] * len(whole)
    for at, length in edges:
        instants.append(_ms(at))
        seconds.append(length)
    return np.array(instants, dtype=np.int64), np.array(seconds, dtype=float)


def _seen(times: np.ndarray, values: np.ndarray, instants: np.ndarray, lookback_ms: int):
    """``(present, value)`` at each of ``instants`` (ms): the latest sample at or before it and after
    ``instant - lookback_ms``, as an instant selector under ``--query.lookback-delta`` reads it."""
    idx = np.searchsorted(times, instants, side="right") - 1
    safe = np.maximum(idx, 0)
    present = (idx >= 0) & (times[safe] > instants - lookback_ms)
    return present, values[safe]


def _usage(totals: dict[str, float]) -> WindowUsage:
    """A ``WindowUsage`` of ``{field: sum}`` (fields of ``USAGE_FIELDS``; missing: 0, energy None)."""
    return WindowUsage(samples=int(totals.get("samples", 0)), util_sum=totals.get("util_sum", 0.0),
                       memory_samples=int(totals.get("memory_samples", 0)), memory_sum=totals.get("memory_sum", 0.0),
                       observed_seconds=totals.get("observed_seconds", 0.0),
                       idle_seconds=totals.get("idle_seconds", 0.0), prof_samples=int(totals.get("prof_samples", 0)),
                       energy_mj=totals.get("energy_mj"))


def usage_from_series(series: list[dict], start: dt.datetime, end: dt.datetime, step_seconds: float,
                      idle_percent: float, lookback_seconds: float,
                      by: tuple[str, ...] = ()) -> dict[tuple, WindowUsage]:
    """The sums of ``usage_query`` over ``[start, end)``, grouped ``by`` labels, from raw samples: ``series`` as
    Prometheus' matrix result of ``raw_query`` (``[{"metric": {...}, "values": [[unix s, "value"], ...]}]``).

    Per GPU (a label set without the metric name), by the rules of
    ``usage_query``: the samples with timestamps in ``[start, end)`` make the
    sums (``GR_ENGINE_ACTIVE x 100`` where the profiling counter has one in
    the window, else ``GPU_UTIL``; ``FB_USED``); the value seen at each
    instant of ``lookback_instants`` (the latest sample no older than the
    lookback) makes observed and idle time, from the profiling counter where
    it has a sample within ``(start - lookback, end)``; energy is the rule
    of ``WindowUsage.energy_mj``. Groups without any series are absent.
    """
    lookback_ms = round(lookback_seconds * 1000)
    s, e, step = _ms(start), _ms(end), round(step_seconds * 1000)
    instants, weights = _window_instants(start, end, step_seconds)
    multiples = np.arange(-(-s // step) * step, (e - 1) // step * step + 1, step, dtype=np.int64)
    gpus: dict[tuple, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for row in series:
        labels = dict(row["metric"])
        name = labels.pop("__name__", "")
        points = np.array(row["values"], dtype=float).reshape(-1, 2)
        gpus.setdefault(tuple(sorted(labels.items())), {})[name] = (np.rint(points[:, 0] * 1000).astype(np.int64),
                                                                     points[:, 1])
    totals: dict[tuple, defaultdict[str, float]] = {}
    for key, metrics in gpus.items():
        labels = dict(key)
        t = totals.setdefault(tuple(labels.get(label, "") for label in by), defaultdict(float))

        def window(name, metrics=metrics):
            times, values = metrics[name]
            inside = (times >= s) & (times < e)
            return values[inside]

        gr = window(GR_ENGINE_ACTIVE) if GR_ENGINE_ACTIVE in metrics else np.empty(0)
        if gr.size:
            t["util_sum"] += float(gr.sum()) * 100
            t["samples"] += gr.size
            t["prof_samples"] += gr.size
        elif UTIL_PERCENT in metrics and (util := window(UTIL_PERCENT)).size:
            t["util_sum"] += float(util.sum())
            t["samples"] += util.size
        if FB_USED_MIB in metrics and (fb := window(FB_USED_MIB)).size:
            t["memory_sum"] += float(fb.sum())
            t["memory_samples"] += fb.size
        preferred, scale = None, 1.0
        if GR_ENGINE_ACTIVE in metrics:
            times = metrics[GR_ENGINE_ACTIVE][0]
            if ((times > s - lookback_ms) & (times < e)).any():
                preferred, scale = GR_ENGINE_ACTIVE, 100.0
        if preferred is None and UTIL_PERCENT in metrics:
            preferred = UTIL_PERCENT
        if preferred is not None and instants.size:
            present, values = _seen(*metrics[preferred], instants, lookback_ms)
            if present.any():
                t["observed_seconds"] += float(weights[present].sum())
                idle = present & (values * scale < idle_percent)
                t["idle_seconds"] += float(weights[idle].sum())
        if ENERGY_MJ in metrics and multiples.size:
            now, now_value = _seen(*metrics[ENERGY_MJ], multiples, lookback_ms)
            prev, prev_value = _seen(*metrics[ENERGY_MJ], multiples - step, lookback_ms)
            both = now & prev
            if both.any():
                rise = now_value[both] - prev_value[both]
                t["energy_mj"] += float(np.where(rise >= 0, rise, now_value[both]).sum())  # present: measured
    return {key: _usage(t) for key, t in totals.items() if t}


def read_usage_by(source: Source, matchers: str, start: dt.datetime, end: dt.datetime, by: tuple[str, ...] = (), *,
                  step_seconds: float | None = None, idle_percent: float | None = None,
                  lookback_seconds: float | None = None, fields: tuple[str, ...] | None = None,
                  client: PrometheusConnect | None = None) -> dict[tuple, WindowUsage]:
    """``read_usage`` grouped by the labels ``by`` (e.g. ``("namespace",)``): ``{label values: WindowUsage}``.

    ``fields`` limits the sums computed (see ``usage_query``); the others stay 0.
    Groups without any series are absent (no data). A window of at most
    ``RAW_WINDOW`` (all fields) is read as raw samples in one selector and
    summed in Python (``usage_from_series``), a longer one by the pushed-down
    sums of ``usage_query``; both follow the same rules.
    """
    step_seconds = step_seconds or settings.COSTS_SCRAPE_INTERVAL_SECONDS
    idle_percent = settings.COSTS_IDLE_UTIL_PERCENT if idle_percent is None else idle_percent
    lookback_seconds = lookback_seconds or settings.COSTS_QUERY_LOOKBACK_DELTA_SECONDS
    client = client or source.client()
    left_open = range_left_open(source, client=client)
    if fields is None and end - start <= RAW_WINDOW:
        query, at = raw_query(matchers + source.cluster_matcher, start, end, step_seconds, left_open, lookback_seconds)
        return usage_from_series(client.custom_query(query, params={"time": at}), start, end, step_seconds,
                                 idle_percent, lookback_seconds, by)
    totals: dict[tuple, dict[str, float]] = {}
    for w_start, w_end in split_window(start, end, step_seconds):
        query, at = usage_query(matchers + source.cluster_matcher, w_start, w_end, step_seconds, idle_percent, by,
                                fields, left_open, lookback_seconds)
        for row in client.custom_query(query, params={"time": at}):
            key = tuple(row["metric"].get(label, "") for label in by)
            group = totals.setdefault(key, {})
            stat = row["metric"]["stat"].split(":")[0]
            group[stat] = group.get(stat, 0.0) + float(row["value"][1])
    return {
        key: _usage(t)
        for key, t in totals.items()
    }


def read_usage(source: Source, matchers: str, start: dt.datetime, end: dt.datetime, *,
               step_seconds: float | None = None, idle_percent: float | None = None,
               lookback_seconds: float | None = None, client: PrometheusConnect | None = None) -> WindowUsage:
    """Sums of utilization and memory samples, observed and idle instants of the series matching ``matchers``
    in ``[start, end)``.

    ``matchers`` is a PromQL matcher list without braces (see
    ``shape_matchers``); the source's cluster matcher is added. A sample
    counts in the sums when its own timestamp is in ``[start, end)``, under
    Prometheus 2.x (closed) and 3.x (left-open) range selectors alike.
    Observed and idle time follow Prometheus' lookback: at every multiple of
    ``step_seconds`` (default ``COSTS_SCRAPE_INTERVAL_SECONDS``) in the
    window, the latest sample at most ``lookback_seconds`` old (default
    ``COSTS_QUERY_LOOKBACK_DELTA_SECONDS``, Prometheus' ``--query.lookback-delta``)
    is the GPU's value (``WindowUsage``). The window is cut so that no
    subquery exceeds ``MAX_POINTS`` steps. Raises
    ``prometheus_api_client.PrometheusApiClientException`` on an HTTP error
    and ``requests.RequestException`` when Prometheus is unreachable.
    """
    groups = read_usage_by(source, matchers, start, end, step_seconds=step_seconds, idle_percent=idle_percent,
                           lookback_seconds=lookback_seconds, client=client)
    return groups.get((), NO_USAGE)


def allocated_gpu_hours_by(source: Source, start: dt.datetime, end: dt.datetime, by: tuple[str, ...] = (), *,
                           step_seconds: float | None = None, matchers: str = "",
                           client: PrometheusConnect | None = None) -> dict[tuple, float]:
    """GPU-hours held in ``[start, end)`` per kube-state-metrics, grouped ``by`` labels: the GPUs requested by
    every pod bound to a node that has not finished, whatever it is doing there (Running, or Pending while it
    pulls its image or runs its init containers: the GPUs are its from binding on, and the ledger bills them).

    Per pod: the scrapes at which it was Pending or Running (``sum_over_time``
    of the 0/1 ``kube_pod_status_phase`` series of those two phases) less
    those at which it was not bound yet (``count_over_time`` of its
    ``kube_pod_info{node=""}``: kube-state-metrics fills ``node`` from
    ``spec.nodeName``, so that series exists only before binding, and only
    Pending pods are unbound), each standing for one scrape interval, times
    the pod's GPU requests summed over its containers (``max_over_time``:
    requests of a pod are immutable in Kubernetes; the largest per container
    over its series, as the ``node`` label of its request series appears at
    binding too). Request series outlive the pod, hence the join. Series
    names and labels: kube-state-metrics' pod metrics
    (github.com/kubernetes/kube-state-metrics/blob/main/docs/metrics/workload/pod-metrics.md;
    docs/reference/metrics.md). No subquery, so it stays cheap over a month
    of a large fleet. A scrape gap in kube-state-metrics shows as fewer
    GPU-hours (and so as a ledger discrepancy). ``by`` may name only
    ``namespace`` and ``pod``. Groups that held nothing (no sample, or never
    bound) are absent.
    """
    step_seconds = step_seconds or settings.COSTS_SCRAPE_INTERVAL_SECONDS
    client = client or source.client()
    extra = (f",{matchers}" if matchers else "") + source.cluster_matcher
    grouping = f" by ({', '.join(by)})" if by else ""
    left_open = range_left_open(source, client=client)
    totals: dict[tuple, float] = {}
    for w_start, w_end in split_window(start, end, step_seconds):
        at, r = range_for(w_start, w_end, left_open)
        # Phase samples per (pod, phase), and the unbound samples negated, in one vector (their label sets differ,
        # so ``or`` keeps both): summed per pod, the samples at which the pod was bound and not finished; pods
        # that held nothing are dropped.
        held = (f"(sum by (namespace, pod) ("
                f"max by (namespace, pod, phase) (sum_over_time({POD_UNFINISHED.format(extra=extra)}[{r}]))"
                f" or -max by (namespace, pod) (count_over_time({POD_UNBOUND.format(extra=extra)}[{r}]))) > 0)")
        gpus = (f"sum by (namespace, pod) (max by (namespace, pod, container) "
                f"(max_over_time({GPU_REQUESTS.format(extra=extra)}[{r}])))")
        query = f"sum{grouping}({held} * on (namespace, pod) group_left() {gpus})"
        for row in client.custom_query(query, params={"time": at}):
            value = float(row["value"][1])
            if not math.isnan(value):
                key = tuple(row["metric"].get(label, "") for label in by)
                totals[key] = totals.get(key, 0.0) + value
    return {key: samples * step_seconds / 3600 for key, samples in totals.items()}


def allocated_gpu_hours(source: Source, start: dt.datetime, end: dt.datetime, *, step_seconds: float | None = None,
                        client: PrometheusConnect | None = None) -> float | None:
    """GPU-hours held by the pods of the source's cluster in ``[start, end)`` (bound to a node, not finished);
    None without samples.

    See ``allocated_gpu_hours_by``.
    """
    return allocated_gpu_hours_by(source, start, end, step_seconds=step_seconds, client=client).get(())
