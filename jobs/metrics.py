"""The scheduling and dispatch metrics (prometheus_client), exposed at ``/metrics`` with django-prometheus' ones.

Two kinds, so that every number is right across processes:

* **Job states and queue depth** are gauges computed from the database at
  scrape time by ``JobStateCollector`` (one ``GROUP BY state`` query), so the
  web process that answers ``/metrics`` reports them correctly whatever
  process changed the jobs.
* **Counters and histograms of the work itself** (admissions, rejections,
  preemptions, dispatch errors and latency, reconcile duration) are
  incremented where it happens, which is mostly a Celery worker. Each worker
  pool process serves its own on ``CELERY_METRICS_PORT + <pool process
  index>`` (prefork pool, ``worker_process_init``) when ``CELERY_METRICS_PORT``
  is set (``core.metrics``); Prometheus scrapes those ports and sums with ``sum by``/``rate``.
  Off by default (tests, demo). Work done in the web process (an eager task,
  ``try_admit`` from a view) shows in its ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

ADMISSIONS = Counter("controlplane_admissions_total", "Jobs admitted by the scheduler (quota reserved, attempt created)")
REJECTIONS = Counter("controlplane_rejections_total", "Queued jobs rejected by the scheduler", ["reason"])
PREEMPTIONS = Counter("controlplane_preemptions_total", "Running attempts preempted to admit another team's job")
DISPATCH_ERRORS = Counter("controlplane_dispatch_errors_total", "Failed dispatches of attempts to clusters",
                          ["kind"])  # kind: transient (retried), permanent, unknown_backend
DISPATCH_SECONDS = Histogram("controlplane_dispatch_duration_seconds", "Time of a backend dispatch call, seconds",
                             buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
RECONCILE_SECONDS = Histogram("controlplane_reconcile_duration_seconds", "Time of one reconcile pass over a cluster",
                              ["cluster"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))


class JobStateCollector:
    """``controlplane_jobs{state}`` (every state, 0 included) and ``controlplane_queue_depth`` from one query, and
    ``controlplane_cluster_health`` from another."""

    def collect(self):
        from django.db.models import Count

        from jobs.models import Job, JobState

        counts = dict(Job.objects.order_by().values_list("state").annotate(n=Count("pk")))
        jobs = GaugeMetricFamily("controlplane_jobs", "Jobs per state, from the database at scrape time", labels=["state"])
        for state in JobState.values:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        yield GaugeMetricFamily("controlplane_queue_depth", "Jobs waiting for admission (QUEUED and RECOVERING)",
                                value=counts.get(JobState.QUEUED, 0) + counts.get(JobState.RECOVERING, 0))
        yield from self.collect_clusters()

    @staticmethod
    def collect_clusters():
        """``controlplane_cluster_health{cluster,provider,region,health}``: 1 for each cluster's current health, 0
        for the others (the kube-state-metrics style of a state set), from the database at scrape time."""
        from runners.models import Cluster

        health = GaugeMetricFamily("controlplane_cluster_health", "A cluster's health as the control plane sees it "
                                   "(1 on the current one), from the database at scrape time",
                                   labels=["cluster", "provider", "region", "health"])
        for name, provider, region, current in Cluster.objects.values_list("name", "provider", "region", "health"):
            for value in Cluster.Health.values:
                health.add_metric([name, provider, region, value], 1 if value == current else 0)
        yield health

    def describe(self):
        return []  # no describe-time query: the collector registers without touching the database


_job_states: JobStateCollector | None = None


def register_job_state_collector(registry=REGISTRY) -> JobStateCollector:
    """Register ``JobStateCollector`` in ``registry`` once (the web process' URLconf does it); returns it."""
    global _job_states
    if _job_states is None:
        _job_states = JobStateCollector()
        registry.register(_job_states)
    return _job_states
