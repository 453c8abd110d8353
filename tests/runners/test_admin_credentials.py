"""The Django admin never shows a stored credential, and leaving a credential field empty keeps it.

Class: a secret the model stores encrypted is rendered back by a form field (the admin's change page of a
cluster showed the Prometheus ``user:password`` in plain text). Invariant: no stored credential of a cluster
appears in any admin page that shows the cluster, and a save that leaves the credential inputs empty changes
no credential.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from runners.models import Cluster

CANARIES = {
    "api_token": "canary-token-7f3a9c",
    "ca_cert": "-----BEGIN CERTIFICATE-----canary-ca-51e2-----END CERTIFICATE-----",
    "kubeconfig": "apiVersion: v1\nkind: Config\n# canary-kubeconfig-0d4b\n",
}
PROMETHEUS_USER, PROMETHEUS_PASSWORD = "canary-user-4411", "canary-password-9c2e"


@pytest.fixture
def admin_client(db):
    """A client signed in as a platform superuser (the admin requires model permissions)."""
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def cluster(db):
    return Cluster.objects.create(
        name="secretive", provider="gcp", region="us-central1", backend="kubernetes",
        prometheus_url=f"https://{PROMETHEUS_USER}:{PROMETHEUS_PASSWORD}@prom.example.com:9090", **CANARIES)


def planted(cluster: Cluster) -> list[str]:
    """Every secret string stored for ``cluster``, as planted."""
    return [*CANARIES.values(), PROMETHEUS_PASSWORD, f"{PROMETHEUS_USER}:{PROMETHEUS_PASSWORD}"]


def test_the_prometheus_password_is_split_out_of_the_url_on_save(cluster):
    stored = Cluster.objects.get(pk=cluster.pk)
    assert PROMETHEUS_PASSWORD not in stored.prometheus_url
    assert str(stored.prometheus_auth) == f"{PROMETHEUS_USER}:{PROMETHEUS_PASSWORD}"


@pytest.mark.parametrize("page", ["changelist", "change", "history"])
def test_no_admin_page_of_a_cluster_shows_a_stored_credential(admin_client, cluster, page):
    url = f"/admin/runners/cluster/{cluster.pk}/{page}/" if page != "changelist" else "/admin/runners/cluster/"
    answer = admin_client.get(url)
    assert answer.status_code == 200
    body = answer.content.decode()
    assert "secretive" in body  # the page is the cluster's, not an empty one
    shown = [secret for secret in planted(cluster) if secret in body]
    # The CA and kubeconfig canaries are multi-line: look for their distinctive parts too.
    shown += [part for part in ("canary-ca-51e2", "canary-kubeconfig-0d4b", PROMETHEUS_USER) if part in body]
    assert shown == []


def test_saving_the_change_form_with_empty_credentials_keeps_them(admin_client, cluster):
    form = admin_client.get(f"/admin/runners/cluster/{cluster.pk}/change/").context["adminform"].form
    data = {name: ("" if value is None else value) for name, value in form.initial.items()
            if not isinstance(value, (list, dict))}
    data.update({name: "" for name in (*CANARIES, "prometheus_auth")})
    data.update({"prometheus_url": "https://prom.example.com:9090", "region": "us-east1"})
    for prefix in ("node_pools", "events"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    answer = admin_client.post(f"/admin/runners/cluster/{cluster.pk}/change/", data)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    stored = Cluster.objects.get(pk=cluster.pk)
    assert stored.region == "us-east1"
    assert {name: str(getattr(stored, name)) for name in CANARIES} == CANARIES
    assert str(stored.prometheus_auth) == f"{PROMETHEUS_USER}:{PROMETHEUS_PASSWORD}"


def test_a_new_prometheus_password_typed_in_the_admin_replaces_the_old(admin_client, cluster):
    form = admin_client.get(f"/admin/runners/cluster/{cluster.pk}/change/").context["adminform"].form
    data = {name: ("" if value is None else value) for name, value in form.initial.items()
            if not isinstance(value, (list, dict))}
    data.update({name: "" for name in CANARIES})
    data.update({"prometheus_auth": "reader:new-secret", "prometheus_url": "https://prom.example.com:9090"})
    for prefix in ("node_pools", "events"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    assert admin_client.post(f"/admin/runners/cluster/{cluster.pk}/change/", data).status_code == 302
    assert str(Cluster.objects.get(pk=cluster.pk).prometheus_auth) == "reader:new-secret"

