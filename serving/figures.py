"""The endpoint counters a serving job's figures are made of (requests, 5xx answers, generated tokens, the latency
histogram, ready replicas), read from its Prometheus exposition, and their increase over one autoscaling interval.

The increase follows Prometheus' rule for counters (``increase()``, "Functions", prometheus.io): a counter that
went down was reset (the endpoint restarted), so its whole new value is the increase. An endpoint that is a sum
over replicas (the Kubernetes runner's, ``runners.kubernetes.serving_load``) also shows each replica's counters,
labelled ``replica``; then the rule is applied per replica and the increases summed, as ``sum(increase(...))``
over per-replica series is in PromQL: a replica that left takes its counts away from the sum without that reading
as a reset of the others. No Django here: the pass (``serving.autoscaler``) keeps the result as a
``jobs.ServingSample``.
"""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

#: Family names of ``runners.local.endpoint`` (without the ``_total`` of a counter's sample), by ``Totals`` field.
_COUNTERS = {"controlplane_endpoint_requests": "requests", "controlplane_endpoint_errors": "errors",
             "controlplane_endpoint_generated_tokens": "tokens"}
_BUCKET = "controlplane_endpoint_request_duration_seconds_bucket"
_READY = "controlplane_endpoint_ready_replicas"
#: Per-replica families of a summed endpoint (label ``replica``), by the key of ``Totals.replicas`` entries.
_PER_REPLICA = {"controlplane_endpoint_replica_requests": "requests", "controlplane_endpoint_replica_errors": "errors",
                "controlplane_endpoint_replica_generated_tokens": "tokens"}
_REPLICA_BUCKET = "controlplane_endpoint_replica_request_duration_seconds_bucket"
#: How many readings a replica not shown is kept for (20 passes of 15 s: 5 minutes); one gone longer that comes back
#: is counted from 0 again.
UNSEEN_KEPT = 20


@dataclasses.dataclass(frozen=True)
class Totals:
    """An endpoint's counters at one reading: ``requests``, ``errors`` (5xx answers) and ``tokens`` since it started;
    ``buckets``: its latency histogram, ``{"<le seconds>": cumulative count, ..., "+Inf": count}``;
    ``ready_replicas``: replicas it found ready, None when it did not say; ``replicas``: for an endpoint that is a
    sum over replicas, each one's counters, ``{replica name: {"requests", "errors", "tokens", "buckets"}}``, else
    None."""

    requests: float
    errors: float
    tokens: float
    buckets: dict[str, float]
    ready_replicas: int | None
    replicas: dict[str, dict] | None = None

    def as_kept(self, previous: dict | None = None) -> dict:
        """What the pass keeps for the next interval: ``{"requests", "errors", "tokens", "buckets"}``, and
        ``"replicas"`` when the endpoint showed them: those shown now, and those of ``previous`` (what the pass
        before kept) not shown now, each with ``"unseen"`` (readings since it was shown) up to ``UNSEEN_KEPT``, so
        a replica left out of a reading (it did not answer) and back in the next is not counted from 0 again."""
        kept = {"requests": self.requests, "errors": self.errors, "tokens": self.tokens, "buckets": self.buckets}
        if self.replicas is None:
            return kept
        absent = {name: {**one, "unseen": one.get("unseen", 0) + 1}
                  for name, one in ((previous or {}).get("replicas") or {}).items()
                  if name not in self.replicas and one.get("unseen", 0) < UNSEEN_KEPT}
        return {**kept, "replicas": {**absent, **self.replicas}}


def parse_totals(text: str) -> Totals | None:
    """The ``Totals`` in a Prometheus exposition ``text`` of ``runners.local.endpoint``; None when it does not parse
    or lacks the requests counter or the latency histogram (an endpoint that does not count them)."""
    found: dict[str, float] = {}
    buckets: dict[str, float] = {}
    ready = None
    replicas: dict[str, dict] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, labels = sample.name.removesuffix("_total"), sample.labels
                field = _COUNTERS.get(name)
                if field is not None and not labels:
                    found[field] = float(sample.value)
                elif sample.name == _BUCKET and "le" in labels:
                    buckets[labels["le"]] = float(sample.value)
                elif sample.name == _READY:
                    ready = int(sample.value)
                elif "replica" in labels and (name in _PER_REPLICA or sample.name == _REPLICA_BUCKET):
                    one = replicas.setdefault(labels["replica"], {"requests": 0.0, "errors": 0.0, "tokens": 0.0,
                                                                  "buckets": {}})
                    if name in _PER_REPLICA:
                        one[_PER_REPLICA[name]] = float(sample.value)
                    elif "le" in labels:
                        one["buckets"][labels["le"]] = float(sample.value)
    except ValueError:
        return None
    if "requests" not in found or "+Inf" not in buckets:
        return None
    shown = replicas if replicas and all("+Inf" in r["buckets"] for r in replicas.values()) else None
    return Totals(found["requests"], found.get("errors", 0.0), found.get("tokens", 0.0), buckets, ready, shown)


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
    the endpoint restarted, and every counter is taken from 0. With ``totals.replicas`` and the replicas kept in
    ``previous``, that rule is applied to each replica shown now (one not kept: from 0) and the increases summed,
    the histogram over the bounds of ``totals.buckets``; a replica kept but not shown now adds nothing."""
    previous = previous or {}
    if totals.replicas is None or "replicas" not in previous:
        return _increase_since(totals.as_kept(), previous)
    parts = [_increase_since(now, previous["replicas"].get(name)) for name, now in totals.replicas.items()]
    return {"requests": sum(p["requests"] for p in parts), "errors": sum(p["errors"] for p in parts),
            "tokens": sum(p["tokens"] for p in parts),
            "latency_buckets": {le: sum(p["latency_buckets"].get(le, 0) for p in parts) for le in totals.buckets}}


def _increase_since(now: dict, previous: dict | None) -> dict:
    """``interval_sample``'s rule for one set of counters, ``now`` and ``previous`` as ``Totals.as_kept`` is."""
    previous = previous or {}
    if now["requests"] < previous.get("requests", 0):
        previous = {}
    before = previous.get("buckets") or {}
    return {"requests": increase(now["requests"], previous.get("requests")),
            "errors": increase(now["errors"], previous.get("errors")),
            "tokens": increase(now["tokens"], previous.get("tokens")),
            "latency_buckets": {le: increase(count, before.get(le)) for le, count in now["buckets"].items()}}
