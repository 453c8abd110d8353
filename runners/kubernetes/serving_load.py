"""The load of a serving job on Kubernetes: its replicas' own counters, summed into the endpoint's exposition.

On Kubernetes the job's endpoint is a Service (``manifests.inference_service``), which counts nothing; each replica's
server reports its own counters instead, on its serving port at ``GET /metrics`` (``manifests.METRICS_PATH``), in
the Prometheus text exposition (``examples/serve.py`` serves them)::

    controlplane_server_requests_total            counter  requests received
    controlplane_server_in_flight                 gauge    requests being answered now
    controlplane_server_in_flight_seconds_total   counter  requests in flight integrated over time (request-seconds)
    controlplane_server_clock_seconds             gauge    the server's clock: Unix seconds (wall clock)
    controlplane_server_errors_total              counter  answers with a 5xx status
    controlplane_server_generated_tokens_total    counter  tokens generated
    controlplane_server_request_duration_seconds  histogram seconds from a request read to its answer written

The runner reads them through the API server's pod proxy (``KubernetesBackend.endpoint_load``) and sums them here
into the exposition the local runner's endpoint proxy serves (``runners.local.endpoint``:
``controlplane_endpoint_requests_total``, ``..._in_flight``, ``..._in_flight_seconds_total``,
``..._clock_seconds``; for the service's figures ``..._errors_total``, ``..._generated_tokens_total`` and
``..._request_duration_seconds``), so the autoscaler (``serving.autoscaler``, ``serving.hpa.parse_reading``) and
the sample recorder (``serving.figures.parse_totals``) read both alike. A histogram sums bound by bound (a cumulative
count at a bound is the sum of the replicas' at it, as ``sum by (le)`` does in PromQL), over the bounds every replica
reports; the figures' families are shown only when every replica read reports them (a server that does not leaves
the job with its load read, and no figures, rather than figures of a part of its replicas).

The sum is the Service's load: the Service sends requests to ready pods only, so a replica's counters hold only what
it served. The clock is the latest of the replicas' clocks (wall clocks: the nodes' clocks are kept in step by NTP,
so intervals between two readings are the same on each); the autoscaler divides the sums' increase by the clock's.
A replica that joined since the last reading brings what it served since it started, all within the interval; one
that left (or did not answer) makes the sums go back, which the autoscaler takes as a fresh reading
(``serving.hpa.load``: the requests in flight now). For the figures the exposition also shows each replica's
counters labelled ``replica`` (its pod's name), so the sample recorder takes each one's increase on its own
(``serving.figures.interval_sample``) and a replica that leaves or restarts is no reset of the others; what is lost
is in docs/adr/0041-autoscaled-serving.md. No Django here.
"""

from __future__ import annotations

import dataclasses
import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from core.exposition import unlabelled_values

#: The families a replica's server reports, by the field of ``ServerCounters`` they fill.
SERVER_FAMILIES = {"controlplane_server_requests": "requests", "controlplane_server_in_flight": "in_flight",
                   "controlplane_server_in_flight_seconds": "in_flight_seconds",
                   "controlplane_server_clock_seconds": "clock"}
#: The figures' families a replica's server reports, by the field of ``ServerCounters`` they fill.
FIGURE_FAMILIES = {"controlplane_server_errors": "errors", "controlplane_server_generated_tokens": "tokens"}
LATENCY_BUCKET = "controlplane_server_request_duration_seconds_bucket"


@dataclasses.dataclass(frozen=True)
class ServerCounters:
    """One replica's counters: ``requests`` (total), ``in_flight`` (now), ``in_flight_seconds`` (request-seconds,
    total) and ``clock`` (Unix seconds); ``replica``: its name (its pod's); for the figures, None when the server does not report them: ``errors``
    (5xx answers, total), ``tokens`` (generated, total) and ``buckets`` (its latency histogram, ``{le seconds
    (float, ``math.inf`` last): cumulative count}``)."""

    requests: float
    in_flight: float
    in_flight_seconds: float
    clock: float
    errors: float | None = None
    tokens: float | None = None
    buckets: dict[float, float] | None = None
    replica: str = ""

    def figures(self) -> bool:
        """Whether the server reports the figures' counters (all of them, with a ``+Inf`` bucket)."""
        return (self.errors is not None and self.tokens is not None and self.buckets is not None
                and math.inf in self.buckets)


def parse_server_counters(text: str, replica: str = "") -> ServerCounters | None:
    """Replica ``replica``'s ``ServerCounters`` from its ``/metrics`` body; None when one of the load's families is
    missing (a server that does not report them) or the text does not parse."""
    found = unlabelled_values(text, SERVER_FAMILIES)
    if found is None:
        return None
    figures: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):  # it parsed above
        for sample in family.samples:
            field = FIGURE_FAMILIES.get(sample.name.removesuffix("_total"))
            if field is not None and not sample.labels:
                figures[field] = float(sample.value)
            elif sample.name == LATENCY_BUCKET and "le" in sample.labels:
                try:
                    buckets[float(sample.labels["le"])] = float(sample.value)
                except ValueError:
                    return None
    return ServerCounters(**found, **figures, buckets=buckets or None, replica=replica)


def summed_buckets(counters: list[ServerCounters]) -> list[tuple[str, float]]:
    """The latency histograms of ``counters`` (each with ``buckets``) summed bound by bound over the bounds all of
    them report: ``[(le as Prometheus shows it, cumulative count), ..., ("+Inf", count)]`` in ascending bounds."""
    shared = set.intersection(*(set(c.buckets) for c in counters))
    return [("+Inf" if math.isinf(le) else repr(le), sum(c.buckets[le] for c in counters)) for le in sorted(shared)]


class _Sum:
    """A prometheus_client collector of the summed counters, named as the local runner's endpoint names its own."""

    def __init__(self, counters: list[ServerCounters], asked: int):
        self.counters, self.asked = counters, asked

    def collect(self):
        total = CounterMetricFamily("controlplane_endpoint_requests", "Requests received by the ready replicas.")
        total.add_metric([], sum(c.requests for c in self.counters))
        yield total
        flight = GaugeMetricFamily("controlplane_endpoint_in_flight", "Requests the ready replicas answer now.")
        flight.add_metric([], sum(c.in_flight for c in self.counters))
        yield flight
        integral = CounterMetricFamily("controlplane_endpoint_in_flight_seconds",
                                       "Requests in flight integrated over time (request-seconds).")
        integral.add_metric([], sum(c.in_flight_seconds for c in self.counters))
        yield integral
        yield GaugeMetricFamily("controlplane_endpoint_clock_seconds", "The latest clock of the replicas read, "
                                "Unix seconds.", value=max(c.clock for c in self.counters))
        yield GaugeMetricFamily("controlplane_endpoint_ready_replicas", "Ready replicas whose counters were read.",
                                value=len(self.counters))
        yield GaugeMetricFamily("controlplane_endpoint_replicas", "Ready replicas asked for their counters.",
                                value=self.asked)
        if not all(c.figures() for c in self.counters):
            return
        yield CounterMetricFamily("controlplane_endpoint_errors", "Answers of the ready replicas with a 5xx status.",
                                  value=sum(c.errors for c in self.counters))
        yield CounterMetricFamily("controlplane_endpoint_generated_tokens", "Tokens the ready replicas generated.",
                                  value=sum(c.tokens for c in self.counters))
        shared = summed_buckets(self.counters)
        yield HistogramMetricFamily("controlplane_endpoint_request_duration_seconds",
                                    "Seconds from a request read to its answer written, summed over the ready "
                                    "replicas by bound.", buckets=shared, sum_value=None)
        yield from _per_replica(self.counters, [le for le, _ in shared])


def _per_replica(counters: list[ServerCounters], bounds: list[str]):
    """Each replica's figures' counters, labelled ``replica``, over the shared ``bounds``: the sample recorder
    takes each one's increase on its own (``serving.figures.interval_sample``), so one that leaves or restarts
    does not read as a reset of the others."""
    served = CounterMetricFamily("controlplane_endpoint_replica_requests", "Requests each replica received.",
                                 labels=["replica"])
    errors = CounterMetricFamily("controlplane_endpoint_replica_errors", "Answers of each replica with a 5xx status.",
                                 labels=["replica"])
    tokens = CounterMetricFamily("controlplane_endpoint_replica_generated_tokens", "Tokens each replica generated.",
                                 labels=["replica"])
    histogram = HistogramMetricFamily("controlplane_endpoint_replica_request_duration_seconds",
                                      "Each replica's latency histogram.", labels=["replica"])
    for c in counters:
        served.add_metric([c.replica], c.requests)
        errors.add_metric([c.replica], c.errors)
        tokens.add_metric([c.replica], c.tokens)
        histogram.add_metric([c.replica], [(le, c.buckets[math.inf if le == "+Inf" else float(le)]) for le in bounds],
                             None)
    yield from (served, errors, tokens, histogram)


def endpoint_exposition(counters: list[ServerCounters], asked: int) -> str | None:
    """The endpoint's exposition (module docstring) summed over ``counters`` (the replicas that answered, of
    ``asked`` ready ones); None when none answered."""
    if not counters:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Sum(counters, asked))
    return generate_latest(registry).decode()
