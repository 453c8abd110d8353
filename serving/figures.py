"""The endpoint counters a serving job's figures are made of (requests, 5xx answers, generated tokens, the latency
histogram, ready replicas), read from its Prometheus exposition, and their increase over one autoscaling interval.

The increase follows Prometheus' rule for counters (``increase()``, "Functions", prometheus.io): a counter that
went down was reset (the endpoint restarted), so its whole new value is the increase. No Django here: the pass
(``serving.autoscaler``) keeps the result as a ``jobs.ServingSample``.
"""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

#: Family names of ``runners.local.endpoint`` (without the ``_total`` of a counter's sample), by ``Totals`` field.
_COUNTERS = {"controlplane_endpoint_requests": "requests", "controlplane_endpoint_errors": "errors",
             "controlplane_endpoint_generated_tokens": "tokens"}
_BUCKET = "controlplane_endpoint_request_duration_seconds_bucket"
_READY = "controlplane_endpoint_ready_replicas"


@dataclasses.dataclass(frozen=True)
class Totals:
    """An endpoint's counters at one reading: ``requests``, ``errors`` (5xx answers) and ``tokens`` since it started;
    ``buckets``: its latency histogram, ``{"<le seconds>": cumulative count, ..., "+Inf": count}``;
    ``ready_replicas``: replicas it found ready, None when it did not say."""

    requests: float
    errors: float
    tokens: float
    buckets: dict[str, float]
    ready_replicas: int | None

    def as_kept(self) -> dict:
        """What the pass keeps for the next interval: ``{"requests", "errors", "tokens", "buckets"}``."""
        return {"requests": self.requests, "errors": self.errors, "tokens": self.tokens, "buckets": self.buckets}


def parse_totals(text: str) -> Totals | None:
    """The ``Totals`` in a Prometheus exposition ``text`` of ``runners.local.endpoint``; None when it does not parse
    or lacks the requests counter or the latency histogram (an endpoint that does not count them)."""
    found: dict[str, float] = {}
    buckets: dict[str, float] = {}
    ready = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                field = _COUNTERS.get(sample.name.removesuffix("_total"))
                if field is not None and not sample.labels:
                    found[field] = float(sample.value)
                elif sample.name == _BUCKET and "le" in sample.labels:
                    buckets[sample.labels["le"]] = float(sample.value)
                elif sample.name == _READY:
                    ready = int(sample.value)
    except ValueError:
        return None
    if "requests" not in found or "+Inf" not in buckets:
        return None
    return Totals(found["requests"], found.get("errors", 0.0), found.get("tokens", 0.0), buckets, ready)


def increase(current: float, previous: float | None) -> int:
    """A counter's increase from ``previous`` (None: none kept, the counter counted from 0) to ``current``; a
    counter that went down was reset, so ``current`` is the increase (Prometheus' ``increase()``). An int: the
    counters count whole events."""
    if previous is None or current < previous:
        return round(current)
    return round(current - previous)


def interval_sample(totals: Totals, previous: dict | None) -> dict:
    """What the endpoint served since ``previous`` (a ``Totals.as_kept``; None or {}: since it started):
    ``{"requests", "errors", "tokens", "latency_buckets"}``, each an increase. When the requests counter went down
    the endpoint restarted, and every counter is taken from 0."""
    previous = previous or {}
    if totals.requests < previous.get("requests", 0):
        previous = {}
    before = previous.get("buckets") or {}
    return {"requests": increase(totals.requests, previous.get("requests")),
            "errors": increase(totals.errors, previous.get("errors")),
            "tokens": increase(totals.tokens, previous.get("tokens")),
            "latency_buckets": {le: increase(count, before.get(le)) for le, count in totals.buckets.items()}}
