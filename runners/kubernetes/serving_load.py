"""The load of a serving job on Kubernetes: its replicas' own counters, summed into the endpoint's exposition.

On Kubernetes the job's endpoint is a Service (``manifests.inference_service``), which counts nothing; each replica's
server reports its own counters instead, on its serving port at ``GET /metrics`` (``manifests.METRICS_PATH``), in
the Prometheus text exposition (``examples/serve.py`` serves them)::

    controlplane_server_requests_total            counter  requests received
    controlplane_server_in_flight                 gauge    requests being answered now
    controlplane_server_in_flight_seconds_total   counter  requests in flight integrated over time (request-seconds)
    controlplane_server_clock_seconds             gauge    the server's clock: Unix seconds (wall clock)

The runner reads them through the API server's pod proxy (``KubernetesBackend.endpoint_load``) and sums them here
into the exposition the local runner's endpoint proxy serves (``runners.local.endpoint``:
``controlplane_endpoint_requests_total``, ``..._in_flight``, ``..._in_flight_seconds_total``,
``..._clock_seconds``), so the autoscaler (``serving.autoscaler``, ``serving.hpa.parse_reading``) reads both alike.

The sum is the Service's load: the Service sends requests to ready pods only, so a replica's counters hold only what
it served. The clock is the latest of the replicas' clocks (wall clocks: the nodes' clocks are kept in step by NTP,
so intervals between two readings are the same on each); the autoscaler divides the sums' increase by the clock's.
A replica that joined since the last reading brings what it served since it started, all within the interval; one
that left (or did not answer) makes the sums go back, which the autoscaler takes as a fresh reading
(``serving.hpa.load``: the requests in flight now). No Django here.
"""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from core.exposition import unlabelled_values

#: The families a replica's server reports, by the field of ``ServerCounters`` they fill.
SERVER_FAMILIES = {"controlplane_server_requests": "requests", "controlplane_server_in_flight": "in_flight",
                   "controlplane_server_in_flight_seconds": "in_flight_seconds",
                   "controlplane_server_clock_seconds": "clock"}


@dataclasses.dataclass(frozen=True)
class ServerCounters:
    """One replica's counters: ``requests`` (total), ``in_flight`` (now), ``in_flight_seconds`` (request-seconds,
    total) and ``clock`` (Unix seconds)."""

    requests: float
    in_flight: float
    in_flight_seconds: float
    clock: float


def parse_server_counters(text: str) -> ServerCounters | None:
    """A replica's ``ServerCounters`` from its ``/metrics`` body; None when one family is missing (a server that
    does not report them) or the text does not parse."""
    found = unlabelled_values(text, SERVER_FAMILIES)
    if found is None:
        return None
    return ServerCounters(**found)


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


def endpoint_exposition(counters: list[ServerCounters], asked: int) -> str | None:
    """The endpoint's exposition (module docstring) summed over ``counters`` (the replicas that answered, of
    ``asked`` ready ones); None when none answered."""
    if not counters:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Sum(counters, asked))
    return generate_latest(registry).decode()
