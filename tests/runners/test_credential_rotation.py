"""Cluster credentials under several keys, and rotation to a new one (docs/adr/0030-secrets.md).

Class of failure: changing the encryption key loses every stored credential (the clusters stop answering), or a
rotation that meets a credential it cannot read drops it. Invariant: with a new key put first and ``manage.py
rotate_credentials`` run, dropping the old key leaves every credential readable (the emulated clusters still
answer reconcile and node pool sync with them); a credential that no configured key reads is listed by the command
(cluster, field) and kept byte for byte, its cluster marked with the reason while the others go on; a second run
writes nothing.
"""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection

from jobs import reconcile
from jobs.models import JobState
from runners.credentials import PREFIX, UNREADABLE_REASON, UnreadableSecret
from runners.kubernetes.sync import sync_cluster
from runners.models import Cluster
from tests.support.clusters import state

HEALTHY_ONE, BROKEN_ONE = "gcp-usc1", "aws-use1"
FIELDS = ("api_token", "ca_cert", "kubeconfig", "prometheus_auth")


def stored(cluster_name: str) -> dict[str, str]:
    """The stored (encrypted) value of each credential column of cluster ``cluster_name``, read by SQL."""
    columns = ", ".join(f'"{Cluster._meta.get_field(f).column}"' for f in FIELDS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {Cluster._meta.db_table} WHERE name = %s", [cluster_name])
        return dict(zip(FIELDS, cursor.fetchone(), strict=True))


def under(key: bytes, value: str) -> bool:
    """Whether the stored ``value`` is a ``fernet:`` token that ``key`` alone decrypts."""
    try:
        Fernet(key).decrypt(value.removeprefix(PREFIX).encode())
        return value.startswith(PREFIX)
    except Exception:
        return False


def rotate() -> str:
    out = io.StringIO()
    call_command("rotate_credentials", stdout=out)
    return out.getvalue()


@pytest.fixture
def old_key(settings):
    """The install's key before rotation: FIELD_ENCRYPTION_KEYS holds it alone."""
    key = Fernet.generate_key()
    settings.FIELD_ENCRYPTION_KEYS, settings.FIELD_ENCRYPTION_KEY = [key.decode()], ""
    return key


def test_rotating_the_key_keeps_every_cluster_answering(live_clusters, old_key, settings):
    world = live_clusters
    for cluster in Cluster.objects.filter(name__in=world.clusters):  # written under the old key
        cluster.api_token = f"token-of-{cluster.name}"
        cluster.prometheus_url = "http://reader:pw-of-prometheus@127.0.0.1:1/"
        cluster.save()
    attempt = world.running(HEALTHY_ONE, gpus=8)
    before = {name: stored(name) for name in world.clusters}
    assert all(under(old_key, before[name]["api_token"]) for name in world.clusters)

    new_key = Fernet.generate_key()
    settings.FIELD_ENCRYPTION_KEYS = [new_key.decode(), old_key.decode()]
    first = rotate()
    # Each cluster has two credentials (api_token, prometheus_auth) and two empty columns (ca_cert, kubeconfig).
    assert "rotated 4, already current 0, empty 4, changed meanwhile 0, unreadable 0" in first, first
    after = {name: stored(name) for name in world.clusters}
    for name in world.clusters:
        for field in ("api_token", "prometheus_auth"):
            assert under(new_key, after[name][field]) and not under(old_key, after[name][field]), (name, field)
            assert after[name][field] != before[name][field]
    assert "rotated 0, already current 4, empty 4, changed meanwhile 0, unreadable 0" in rotate()
    assert {name: stored(name) for name in world.clusters} == after  # the second run wrote nothing

    settings.FIELD_ENCRYPTION_KEYS = [new_key.decode()]  # the old key dropped
    for name in world.clusters:
        cluster = Cluster.objects.get(name=name)
        assert (str(cluster.api_token), str(cluster.prometheus_auth)) == (f"token-of-{name}", "reader:pw-of-prometheus")
        assert "error" not in sync_cluster(cluster)  # the cluster answers, asked with the rotated token
    emulator = world.emulators[HEALTHY_ONE]
    for pod in emulator.pods(attempt.pk):
        emulator.finish_pod(pod["metadata"]["name"], 0)
    results = {r["cluster"]: r for r in reconcile.reconcile_all()}
    assert not any(r.get("unreachable") for r in results.values()), results
    assert state(attempt) == JobState.SUCCEEDED
    assert set(Cluster.objects.values_list("health", flat=True)) == {Cluster.Health.HEALTHY}


def test_a_credential_no_key_reads_is_listed_kept_and_its_cluster_alone_marked(live_clusters, old_key, settings):
    world = live_clusters
    for cluster in Cluster.objects.filter(name__in=world.clusters):
        cluster.api_token = f"token-of-{cluster.name}"
        cluster.save()
    foreign = PREFIX + Fernet(Fernet.generate_key()).encrypt(b"token-under-a-lost-key").decode()
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Cluster._meta.db_table} SET api_token = %s WHERE name = %s", [foreign, BROKEN_ONE])
    attempt = world.admit(cluster=HEALTHY_ONE, gpus=8)

    new_key = Fernet.generate_key()
    settings.FIELD_ENCRYPTION_KEYS = [new_key.decode(), old_key.decode()]
    report = rotate()
    assert "rotated 1, already current 0, empty 6, changed meanwhile 0, unreadable 1" in report, report
    assert f"unreadable: cluster {BROKEN_ONE}, field api_token: {UNREADABLE_REASON}" in report
    assert stored(BROKEN_ONE)["api_token"] == foreign  # never lost: the lost key, configured again, reads it
    settings.FIELD_ENCRYPTION_KEYS = [new_key.decode()]

    from jobs.lifecycle import dispatch

    assert dispatch(attempt.pk) == "dispatched"  # the other cluster takes work
    reconcile.reconcile_all()
    assert state(attempt) == JobState.RUNNING
    broken, healthy = Cluster.objects.get(name=BROKEN_ONE), Cluster.objects.get(name=HEALTHY_ONE)
    assert isinstance(broken.api_token, UnreadableSecret)
    assert broken.health == Cluster.Health.DEGRADED and UNREADABLE_REASON in broken.health_reason
    assert healthy.health == Cluster.Health.HEALTHY
    assert "unreadable 1" in rotate() and stored(BROKEN_ONE)["api_token"] == foreign


def test_the_single_key_of_earlier_installs_is_read_after_the_list(catalog, h100, settings):
    """An install that had FIELD_ENCRYPTION_KEY keeps reading it when FIELD_ENCRYPTION_KEYS names a new key."""
    from tests.support.factories import make_cluster

    single = Fernet.generate_key()
    settings.FIELD_ENCRYPTION_KEYS, settings.FIELD_ENCRYPTION_KEY = [], single.decode()
    cluster, _ = make_cluster("aws-use1", "aws", "us-east-1", h100)
    cluster.api_token = "token-under-the-single-key"
    cluster.save()
    assert under(single, stored("aws-use1")["api_token"])
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    assert str(Cluster.objects.get(pk=cluster.pk).api_token) == "token-under-the-single-key"
    assert "rotated 1," in rotate()
    settings.FIELD_ENCRYPTION_KEY = ""
    assert str(Cluster.objects.get(pk=cluster.pk).api_token) == "token-under-the-single-key"
