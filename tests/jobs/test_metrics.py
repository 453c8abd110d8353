"""``/metrics``: Prometheus text format with the job-state gauges from the database, and the scheduler's, dispatch's
and reconcile's counters and histograms moving when the work happens."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import schedule_pending
from jobs.tasks import dispatch_attempt
from runners.models import Cluster
from tests.support.factories import make_cluster, make_job_row

pytestmark = pytest.mark.django_db


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_exports_job_states_from_the_database(client, teams, h100, user):
    wanted = [JobState.QUEUED] * 3 + [JobState.RUNNING] * 2 + [JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED]
    for i, state in enumerate(wanted):
        make_job_row(teams[i % 2], user, h100, state=state)
    expected = Counter(wanted)

    samples = scrape(client)

    for state in JobState.values:
        assert samples[("controlplane_jobs", (("state", state),))] == expected.get(state, 0), state
    assert samples[("controlplane_queue_depth", ())] == expected[JobState.QUEUED] + expected[JobState.RECOVERING]
    # django-prometheus' request metrics are there too.
    assert any(name.startswith("django_http_requests") for name, _ in samples)


def test_metrics_exports_each_clusters_health_as_a_state_set(client, h100):
    east, _ = make_cluster("aws-east", "aws", "us-east-1", h100)
    central, _ = make_cluster("gcp-central", "gcp", "us-central1", h100)
    Cluster.objects.filter(pk=central.pk).update(health=Cluster.Health.UNREACHABLE)

    samples = scrape(client)

    def health(cluster, provider, region, state):
        key = (("cluster", cluster), ("health", state), ("provider", provider), ("region", region))
        return samples[("controlplane_cluster_health", key)]

    assert [health("aws-east", "aws", "us-east-1", h) for h in ("healthy", "degraded", "unreachable")] == [1, 0, 0]
    assert [health("gcp-central", "gcp", "us-central1", h) for h in ("healthy", "degraded", "unreachable")] == [0, 0, 1]


def test_admission_and_rejection_counters(client, teams, h100, user, quota_factory):
    make_cluster("aws-east", "aws", "us-east-1", h100, price="3.00")
    quota_factory(teams[0], h100, nominal=8, max_per_job=8)
    admitted = make_job_row(teams[0], user, h100, gpus_per_node=4)
    too_big = make_job_row(teams[0], user, h100, gpus_per_node=8, nodes=2)  # over max_gpus_per_job: can never run
    before = scrape(client).get(("controlplane_admissions_total", ()), 0.0)
    rejected_before = sum(v for (name, _), v in scrape(client).items() if name == "controlplane_rejections_total")

    result = schedule_pending()

    assert result.admitted == [admitted.pk] and result.rejected == 1
    admitted.refresh_from_db()
    too_big.refresh_from_db()
    assert (admitted.state, too_big.state) == (JobState.ADMITTED, JobState.REJECTED)
    samples = scrape(client)
    assert samples[("controlplane_admissions_total", ())] == before + 1
    assert sum(v for (name, _), v in samples.items() if name == "controlplane_rejections_total") == rejected_before + 1


def test_dispatch_error_and_latency(teams, h100, user, quota_factory):
    cluster, _ = make_cluster("misconfigured", "aws", "us-east-1", h100, price="3.00")
    Cluster.objects.filter(pk=cluster.pk).update(backend="no-such-backend")
    quota_factory(teams[0], h100, nominal=8)
    job = make_job_row(teams[0], user, h100, gpus_per_node=1)
    schedule_pending()
    job.refresh_from_db()
    errors, latency = value("controlplane_dispatch_errors_total", kind="unknown_backend"), \
        value("controlplane_dispatch_duration_seconds_count")

    assert dispatch_attempt(job.current_attempt_id) == "failed"

    assert value("controlplane_dispatch_errors_total", kind="unknown_backend") == errors + 1
    assert value("controlplane_dispatch_duration_seconds_count") == latency + 1


def test_reconcile_duration_histogram(client, emulated_local_cluster):
    cluster, _ = emulated_local_cluster
    key = ("controlplane_reconcile_duration_seconds_count", (("cluster", cluster.name),))
    before = scrape(client).get(key, 0.0)

    reconcile_cluster(cluster)
    reconcile_cluster(cluster)

    samples = scrape(client)
    assert samples[key] == before + 2
    assert samples[("controlplane_reconcile_duration_seconds_sum", (("cluster", cluster.name),))] > 0
