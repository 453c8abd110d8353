"""Credentials never shown: user info in cluster URLs is split out and encrypted or refused, kubeconfigs are checked
on input (400 with the reason), and a cluster whose stored credentials fail answers its logs with 503."""

from __future__ import annotations

import base64

import pytest
import yaml
from django.db import connection

from jobs.models import Job
from jobs.reconcile import reconcile_clusters
from runners.base import InvalidCredentials
from runners.kubernetes.client import client_for
from runners.models import Cluster
from tests.support.factories import make_attempt, make_cluster, make_job

NEW_CLUSTER = {"name": "gcp-usc1", "provider": "gcp", "region": "us-central1", "backend": "kubernetes"}


def kubeconfig(**user) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "main",
        "clusters": [{"name": "c", "cluster": {"server": "https://k8s.example:6443"}}],
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": user or {"token": "abc"}}],
    })


def stored_column(cluster_id: int, column: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM runners_cluster WHERE id = %s", [cluster_id])
        return cursor.fetchone()[0]


def test_a_prometheus_password_in_the_url_is_stored_encrypted_and_never_shown(staff, teammate, outsider, catalog):
    r = staff.client.post("/api/v1/clusters/", {**NEW_CLUSTER, "prometheus_url": "https://metrics:pa55word@prom.example:9090/"},
                          format="json")
    assert r.status_code == 201, r.content
    assert r.json()["prometheus_url"] == "https://prom.example:9090/"
    cluster = Cluster.objects.get(name="gcp-usc1")
    assert stored_column(cluster.pk, "prometheus_url") == "https://prom.example:9090/"
    raw = stored_column(cluster.pk, "prometheus_auth")
    assert raw.startswith("fernet:") and "pa55word" not in raw
    assert cluster.prometheus_query_url == "https://metrics:pa55word@prom.example:9090/"  # what the client uses
    for persona in (staff, teammate, outsider):
        for path in ("/api/v1/clusters/", f"/api/v1/clusters/{cluster.pk}/"):
            body = persona.client.get(path).content.decode()
            assert "pa55word" not in body and "metrics:" not in body, (persona, path)
    # a new URL without credentials drops the old ones
    r = staff.client.patch(f"/api/v1/clusters/{cluster.pk}/", {"prometheus_url": "https://prom2.example/"},
                           format="json")
    assert r.status_code == 200
    cluster.refresh_from_db()
    assert (cluster.prometheus_url, str(cluster.prometheus_auth)) == ("https://prom2.example/", "")


def test_credentials_in_a_url_saved_outside_the_api_are_split_out_too(catalog, h100):
    cluster, _ = make_cluster("c1", "aws", "us-east-1", h100)
    cluster.prometheus_url = "http://u:p%40ss@10.0.0.9:9090"
    cluster.save(update_fields=["prometheus_url"])
    assert stored_column(cluster.pk, "prometheus_url") == "http://10.0.0.9:9090"
    assert Cluster.objects.get(pk=cluster.pk).prometheus_query_url == "http://u:p%40ss@10.0.0.9:9090"


def test_an_api_endpoint_with_user_info_answers_400_and_stores_nothing(staff, catalog):
    r = staff.client.post("/api/v1/clusters/", {**NEW_CLUSTER, "api_endpoint": "https://admin:hunter2@k8s.example:6443"},
                          format="json")
    assert r.status_code == 400
    assert "user:password@" in r.json()["api_endpoint"][0]
    assert not Cluster.objects.filter(name="gcp-usc1").exists()


@pytest.mark.parametrize("text, reason", [
    ("{{{ not yaml", "not YAML"),
    ("just a string", "not a kubeconfig"),
    (yaml.safe_dump({"clusters": [], "contexts": [], "users": []}), "'current-context' is missing"),
    (kubeconfig().replace("current-context: main", "current-context: other"), "no entry named 'other'"),
    (kubeconfig().replace("https://k8s.example:6443", "k8s.example"), "'server' must be an http(s) URL"),
    (kubeconfig(exec={"command": "aws", "args": ["eks", "get-token"], "apiVersion": "client.authentication.k8s.io/v1"}),
     "exec not accepted"),
    (kubeconfig(**{"client-certificate": "/etc/passwd", "client-key": "/etc/shadow"}), "client-certificate"),
    (kubeconfig(**{"client-certificate-data": base64.b64encode(b"not a certificate").decode(),
                   "client-key-data": base64.b64encode(b"nor a key").decode()}), "not a base64-encoded PEM certificate"),
])
def test_a_kubeconfig_that_cannot_be_used_answers_400_with_the_reason(staff, catalog, text, reason):
    r = staff.client.post("/api/v1/clusters/", {**NEW_CLUSTER, "kubeconfig": text}, format="json")
    assert r.status_code == 400, r.content
    assert reason in r.json()["kubeconfig"][0]
    assert not Cluster.objects.filter(name="gcp-usc1").exists()


def test_a_valid_kubeconfig_is_accepted(staff, catalog):
    r = staff.client.post("/api/v1/clusters/", {**NEW_CLUSTER, "kubeconfig": kubeconfig()}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["auth_configured"] is True
    assert client_for(Cluster.objects.get(name="gcp-usc1")).api_client.configuration.host == "https://k8s.example:6443"


def test_stored_credentials_that_fail_make_logs_answer_503_with_the_reason(teammate, teams, h100, catalog):
    cluster, pool = make_cluster("broken", "aws", "us-east-1", h100)
    Cluster.objects.filter(pk=cluster.pk).update(kubeconfig=Cluster._meta.get_field("kubeconfig").get_prep_value(
        "{{{ stored before kubeconfigs were checked"))
    job = make_job(teams[0], teammate.user, h100)
    make_attempt(job, Cluster.objects.get(pk=cluster.pk), pool)
    with pytest.raises(InvalidCredentials):
        client_for(Cluster.objects.get(pk=cluster.pk))
    r = teammate.client.get(f"/api/v1/jobs/{job.pk}/logs/")
    assert r.status_code == 503, r.content
    assert "credentials of cluster broken cannot be used" in r.json()["detail"]
    assert Job.objects.get(pk=job.pk).state == job.state  # nothing changed


def test_a_cluster_whose_stored_credentials_fail_is_degraded_not_healthy(teammate, teams, h100, catalog):
    cluster, pool = make_cluster("broken", "aws", "us-east-1", h100)
    Cluster.objects.filter(pk=cluster.pk).update(kubeconfig=Cluster._meta.get_field("kubeconfig").get_prep_value(
        "users: [not, a, kubeconfig"))
    job = make_job(teams[0], teammate.user, h100)
    make_attempt(job, cluster, pool)
    (result,) = reconcile_clusters([Cluster.objects.get(pk=cluster.pk)])
    assert result["unreachable"] is True
    assert Cluster.objects.get(pk=cluster.pk).health == Cluster.Health.DEGRADED
