"""The HorizontalPodAutoscaler's rule as plain functions: the recommended replica count and its stabilization.

Source: Kubernetes documentation, "Horizontal Pod Autoscaling", section "Algorithm details"
(https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details):
``desiredReplicas = ceil[currentReplicas * (currentMetricValue / desiredMetricValue)]``, skipped while the ratio
is within the tolerance (0.1 by default, ``--horizontal-pod-autoscaler-tolerance``); and section "Stabilization
window" with the controller's ``stabilizeRecommendationWithBehaviors`` (pkg/controller/podautoscaler/
horizontal.go): the count rises to the lowest recommendation of the scale-up window and falls to the highest of
the scale-down window, then is kept within the minimum and maximum. No Django here.
"""

from __future__ import annotations

import dataclasses
import math

from core.exposition import unlabelled_values

#: The HorizontalPodAutoscaler's default tolerance: no change while the metric is within 10% of the target.
TOLERANCE = 0.1


def recommended(current: int, metric_per_replica: float, target: float, tolerance: float = TOLERANCE) -> int:
    """``ceil(current x metric_per_replica / target)``, or ``current`` while ``|ratio - 1| <= tolerance``.

    ``current``: replicas now (>= 1); ``metric_per_replica``: the load per replica (requests in flight, or requests
    per second); ``target``: the load per replica aimed at (> 0). Raises ValueError for a target not above 0.
    """
    if target <= 0:
        raise ValueError("target must be above 0")
    ratio = metric_per_replica / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    return math.ceil(round(current * ratio, 9))  # rounded first: 3 x (2/3) is 2, not 2.0000000000000004 -> 3


def stabilized(current: int, recommendation: int, history: list[tuple[float, int]], now: float,
               up_window: float, down_window: float) -> int:
    """The count after the stabilization windows: ``recommendation`` (made at ``now``) and the earlier ones in
    ``history`` (``(unix seconds, replicas)``) no older than each window; up to the lowest of those within
    ``up_window`` seconds when that is above ``current``, down to the highest of those within ``down_window``
    seconds when that is below (``stabilizeRecommendationWithBehaviors``)."""
    up = down = recommendation
    for at, count in history:
        if at > now - up_window:
            up = min(up, count)
        if at > now - down_window:
            down = max(down, count)
    result = current
    if result < up:
        result = up
    if result > down:
        result = down
    return result


def bounded(count: int, low: int, high: int) -> int:
    """``count`` within ``low`` .. ``high`` (the autoscaler's min_replicas and max_replicas)."""
    return max(low, min(high, count))


@dataclasses.dataclass(frozen=True)
class Reading:
    """One reading of a serving endpoint's counters: ``requests`` received (total), ``in_flight`` now,
    ``in_flight_seconds`` (requests in flight integrated over time, request-seconds, total) and ``clock`` (the
    endpoint's own clock, seconds)."""

    requests: float
    in_flight: float
    in_flight_seconds: float
    clock: float

    def as_sample(self) -> dict:
        """What is kept for the next interval: ``{"requests", "in_flight_seconds", "clock"}``."""
        return {"requests": self.requests, "in_flight_seconds": self.in_flight_seconds, "clock": self.clock}


#: The metric families of ``runners.local.endpoint`` a Reading is made of, by field.
_FAMILIES = {"controlplane_endpoint_requests": "requests", "controlplane_endpoint_in_flight": "in_flight",
             "controlplane_endpoint_in_flight_seconds": "in_flight_seconds",
             "controlplane_endpoint_clock_seconds": "clock"}


def parse_reading(text: str) -> Reading | None:
    """A Reading from a Prometheus exposition of the endpoint's counters; None when one of them is missing or the
    text does not parse."""
    found = unlabelled_values(text, _FAMILIES)
    if found is None:
        return None
    return Reading(**found)


def load(reading: Reading, previous: dict | None, metric: str) -> float | None:
    """The endpoint's whole load over the interval since ``previous`` (a ``Reading.as_sample``): ``in_flight``,
    the mean requests in flight (the increase of their integral over the interval's length); ``rps``, requests per
    second. Without a previous sample (or across a restart of the endpoint: its clock or counters went back), the
    requests in flight now for ``in_flight``, None for ``rps`` (a rate needs two readings)."""
    fresh = (not previous or reading.clock <= previous.get("clock", math.inf)
             or reading.requests < previous.get("requests", 0)
             or reading.in_flight_seconds < previous.get("in_flight_seconds", 0))
    if fresh:
        return reading.in_flight if metric == "in_flight" else None
    elapsed = reading.clock - previous["clock"]
    if metric == "in_flight":
        return (reading.in_flight_seconds - previous["in_flight_seconds"]) / elapsed
    return (reading.requests - previous["requests"]) / elapsed
