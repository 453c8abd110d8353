"""A cluster says why it is not healthy and since when: each change of health is stored on the cluster with its
reason and time and recorded as an event; the API, the clusters page and ``cpctl clusters`` show them.

Failures are real ones: answers of an emulated cluster with injected faults (``tests/support/clusters.py``) and
stored credentials that the Kubernetes client refuses.
"""

from __future__ import annotations

from django.utils import timezone

from jobs.reconcile import reconcile_clusters
from runners.cluster_health import REASON_MAX_CHARS, clean_reason, set_health
from runners.models import Cluster, ClusterEvent
from tests.support.factories import make_attempt, make_cluster, make_job
from tests.support.kubernetes import Fault
from tests.support.personas import signed_in


def transitions(cluster_name: str) -> list[tuple[str, str]]:
    """The cluster's health changes, oldest first."""
    return [(e.from_health, e.to_health) for e in ClusterEvent.objects.filter(cluster__name=cluster_name)
            .order_by("created_at", "id")]


def test_failed_probes_store_the_reason_and_since_when_with_an_event_per_change(live_clusters):
    """Three failed looks (404 on the Job LIST) then one that answers: degraded after the first, unreachable after
    the third (``CLUSTER_UNREACHABLE_AFTER_FAILURES`` = 3), healthy again; three events, each change's time is the
    cluster's ``health_since``, and the reason of each failure names the answer and the count."""
    world = live_clusters
    gcp = world.emulators["gcp-usc1"]
    gcp.inject(Fault(404, method="GET", path="/apis/batch/v1/jobs", count=3))

    before = timezone.now()
    world.reconcile("gcp-usc1")
    first = Cluster.objects.get(name="gcp-usc1")
    assert first.health == Cluster.Health.DEGRADED
    assert first.health_reason.startswith("1 failed probe(s) in a row, the last: ") and "404" in first.health_reason
    assert first.health_since >= before
    assert transitions("gcp-usc1") == [("healthy", "degraded")]

    world.reconcile("gcp-usc1")
    second = Cluster.objects.get(name="gcp-usc1")
    assert second.health == Cluster.Health.DEGRADED
    assert second.health_since == first.health_since  # still degraded since the first failure
    assert second.health_reason.startswith("2 failed probe(s) in a row")  # the reason follows the newest failure
    assert len(transitions("gcp-usc1")) == 1  # no new event without a change of health

    world.reconcile("gcp-usc1")
    third = Cluster.objects.get(name="gcp-usc1")
    assert third.health == Cluster.Health.UNREACHABLE and third.health_since > first.health_since
    assert third.health_reason.startswith("3 failed probe(s) in a row")

    world.reconcile("gcp-usc1")
    healed = Cluster.objects.get(name="gcp-usc1")
    assert (healed.health, healed.health_reason) == (Cluster.Health.HEALTHY, "")
    assert healed.health_since > third.health_since
    assert transitions("gcp-usc1") == [("healthy", "degraded"), ("degraded", "unreachable"),
                                       ("unreachable", "healthy")]
    events = list(ClusterEvent.objects.filter(cluster=healed).order_by("created_at", "id"))
    assert [e.created_at for e in events] == [first.health_since, third.health_since, healed.health_since]
    assert events[0].reason == first.health_reason and events[2].reason == ""
    assert Cluster.objects.get(name="aws-use1").health == Cluster.Health.HEALTHY  # the other cluster untouched
    assert transitions("aws-use1") == []


def test_a_health_change_that_lost_a_race_writes_nothing(catalog, h100):
    """Compare-and-set: a writer holding a stale read (healthy) does not overwrite a change made since."""
    cluster, _ = make_cluster("aws-use1", "aws", "us-east-1", h100)
    stale = Cluster.objects.get(pk=cluster.pk)
    assert set_health(cluster, Cluster.Health.UNREACHABLE, "3 failed probe(s) in a row")
    assert not set_health(stale, Cluster.Health.DEGRADED, "1 failed probe(s) in a row")
    stored = Cluster.objects.get(pk=cluster.pk)
    assert (stored.health, stored.health_reason) == (Cluster.Health.UNREACHABLE, "3 failed probe(s) in a row")
    assert transitions("aws-use1") == [("healthy", "unreachable")]


def test_a_reason_never_carries_url_credentials_and_is_bounded():
    reason = clean_reason("GET https://ops:s3cret@k8s.example:6443/apis failed:\n  " + "x" * 2000)
    assert "s3cret" not in reason and "ops:" not in reason and "https://k8s.example:6443/apis" in reason
    assert "\n" not in reason and len(reason) == REASON_MAX_CHARS


def broken_cluster(teams, user, h100) -> Cluster:
    """A cluster whose stored kubeconfig the client refuses, with a running attempt, after one reconcile pass."""
    cluster, pool = make_cluster("broken", "aws", "us-east-1", h100)
    Cluster.objects.filter(pk=cluster.pk).update(kubeconfig=Cluster._meta.get_field("kubeconfig").get_prep_value(
        "users: [not, a, kubeconfig"))
    make_attempt(make_job(teams[0], user, h100), cluster, pool)
    reconcile_clusters([Cluster.objects.get(pk=cluster.pk)])
    return Cluster.objects.get(pk=cluster.pk)


def test_the_api_and_the_clusters_page_say_why_a_cluster_is_degraded(teammate, teams, h100, catalog):
    cluster = broken_cluster(teams, teammate.user, h100)
    assert cluster.health == Cluster.Health.DEGRADED
    assert "credentials of cluster broken cannot be used" in cluster.health_reason

    body = teammate.client.get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert body["health"] == "degraded"
    assert body["health_reason"] == cluster.health_reason
    assert body["health_since"] == cluster.health_since.isoformat().replace("+00:00", "Z")

    page = signed_in(teammate).get("/clusters/").content.decode()
    shown = page.split(f'id="health-reason-{cluster.pk}"', 1)[1].split("</p>", 1)[0]
    assert "Degraded" in shown and cluster.health_since.strftime("%Y-%m-%d %H:%M:%S") + " UTC" in shown
    assert "credentials of cluster broken cannot be used" in shown
    assert "healthy → degraded" in page  # the health change is listed


def test_a_healthy_cluster_shows_no_reason(teammate, catalog, h100):
    cluster, _ = make_cluster("aws-use1", "aws", "us-east-1", h100)
    body = teammate.client.get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert (body["health"], body["health_reason"], body["health_since"]) == ("healthy", "", None)
    assert f'id="health-reason-{cluster.pk}"' not in signed_in(teammate).get("/clusters/").content.decode()
